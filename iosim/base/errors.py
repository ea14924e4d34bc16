"""User-facing errors: each names the parameter, the accepted range and the value given.

:class:`InputError` is defined in the memory model (the lowest layer, whose own checks raise it too) and is the
same class here. :func:`user_code` runs a user's file or function (a mask file, a mask_mod): what it prints goes to
stderr, where it cannot corrupt a JSON or CSV on stdout, and an exit inside it (``sys.exit``, ``SystemExit``) is one
line naming it, never the program's own exit (which would end a run silently, with the exit code the user's file
chose)."""

from __future__ import annotations

import contextlib
import sys

from iosim.memory_model.core import InputError

__all__ = ["InputError", "install_hint", "user_code"]


@contextlib.contextmanager
def user_code(parameter: str, label: str):
    """Run the user's code inside: its stdout to stderr; a SystemExit an InputError on ``parameter`` naming
    ``label`` and the exit code."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    except SystemExit as e:
        says = "must not exit the program (it called sys.exit or raised SystemExit)"
        raise InputError(parameter, says, f"{label}: exit {e.code!r}") from None


def install_hint(extra: str) -> str:
    """The pip command that installs what iosim's ``extra`` needs, from wherever the user is: the extra's own
    requirements by name, as iosim's installed metadata lists them (iosim itself is not on the package index, so
    asking pip for iosim with the extra fails outside a checkout; inside one, ``pip install -e ".[extra]"`` works)."""
    import importlib.metadata as md
    import shlex

    try:
        reqs = md.requires("iosim") or []
    except md.PackageNotFoundError:  # run from a source tree without installing: the checkout's own spelling
        return f'pip install -e ".[{extra}]"'
    mine = [r.split(";")[0].strip() for r in reqs if f'extra == "{extra}"' in r.replace("'", '"')]
    if not mine:
        return f'pip install -e ".[{extra}]"'
    return "pip install " + " ".join(shlex.quote(r) for r in mine)
