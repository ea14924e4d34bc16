"""The one place iosim.kernels imports the theory and the numerical check from."""

import importlib

from iosim.theory import bounds, io_model

check = importlib.import_module("iosim.kernels.check")  # the module (``iosim.check`` the attribute is the function)

__all__ = ["bounds", "check", "io_model"]
