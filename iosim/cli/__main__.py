"""``python -m iosim.cli`` is ``iosim``."""

import sys

from iosim.cli import main

sys.exit(main())
