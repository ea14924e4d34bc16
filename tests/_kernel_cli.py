"""The ``cli`` fixture of the kernel tests (import ``cli_fixture``): ``cli(*args)`` runs ``iosim kernel *args`` in
this process and returns (exit code, stdout, stderr)."""

import pytest

from iosim.cli import main


@pytest.fixture(name="cli")
def cli_fixture(capsys):
    def run(*args):
        rc = main(["kernel", *args])
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run
