"""User-facing errors: each names the parameter, the accepted range and the value given."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from a user: reported by the command line as one line and exit code 2, never a traceback."""

    def __init__(self, parameter: str, accepted: str, got=None, exit_code: int = 2) -> None:
        self.parameter, self.accepted, self.got, self.exit_code = parameter, accepted, got, exit_code
        shown = "" if got is None else f", got {got!r}"
        super().__init__(f"{parameter} {accepted}{shown}")
