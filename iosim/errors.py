"""User-facing errors: each names the parameter, the accepted range and the value given.

:class:`InputError` is defined in the memory model (the lowest layer, whose own checks raise it too) and is the
same class here."""

from __future__ import annotations

from iosim.memory_model.core import InputError

__all__ = ["InputError"]
