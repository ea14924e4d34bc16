"""The one place iosim.kernels imports the theory and the numerical check from (moved by the layout refactor)."""

import importlib

from iosim import bounds, io_model

check = importlib.import_module("iosim.check")  # the module: ``iosim.check`` the attribute is the function

__all__ = ["bounds", "check", "io_model"]
