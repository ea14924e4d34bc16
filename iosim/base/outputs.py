"""Output paths, checked before any work: one rule for every file or folder iosim writes.

A file target must have a suffix the writer supports (listed in the message), must not be an existing directory,
FIFO, device or socket (a FIFO would block the writer forever; a device never ends when it is read back), and its
folder must be a writable directory (or, where the writer creates missing folders, the nearest existing ancestor must
be one, with no file in the way). A folder target must not be a file. The command line's ``-o``, ``--output``,
``--out``, ``--picture`` and ``--cache`` and the API functions that write files all use it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from iosim.base.errors import InputError


def _writable_dir(parameter: str, folder: Path, path, create: bool) -> None:
    probe = folder
    if create:
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
    if not probe.exists():
        raise InputError(parameter, f"must be in an existing folder ({folder} does not exist)", str(path))
    if not probe.is_dir():
        raise InputError(parameter, f"must be in a folder ({probe} is a file, not a folder)", str(path))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(parameter, f"must be in a writable folder ({probe} is not writable)", str(path))
    # os.access answers for the permission bits only: root passes it for /proc and /sys, where no file can be made.
    # Making (and removing) a file there is the test that holds.
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".iosim-probe-"):
            pass
    except OSError as e:
        raise InputError(
            parameter, f"must be in a folder where files can be written ({probe}: {e.strerror})", str(path)
        ) from None


def file(parameter: str, path, suffixes: tuple[str, ...], *, create_parent: bool = False) -> Path:
    """``path`` as a Path, or an InputError on ``parameter``: the suffix one of ``suffixes`` (case-insensitive),
    not an existing directory, in a writable folder (``create_parent``: missing folders will be created)."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)) or not str(path):
        raise InputError(parameter, f"must be a file name ending in {', '.join(suffixes)}", path)
    p = Path(path)
    if p.suffix.lower() not in suffixes:
        raise InputError(parameter, f"must end in {', '.join(suffixes)} (the formats this command writes)", str(path))
    if p.is_dir():
        raise InputError(parameter, "must be a file name, not an existing folder", str(path))
    if p.exists() and not p.is_file():  # a FIFO blocks the open below (and the writer) forever; a device never ends
        raise InputError(parameter, "must be a regular file or a new name (it is a FIFO, device or socket)", str(path))
    _writable_dir(parameter, p.parent, path, create_parent)
    if p.exists():  # an existing file is replaced: it must open for writing (opened to append, nothing changes)
        try:
            with open(p, "ab"):
                pass
        except OSError as e:
            raise InputError(parameter, f"must be a file that can be written ({e.strerror})", str(path)) from None
    return p


def folder(parameter: str, path) -> Path:
    """An output folder (created if missing): not an existing file; the nearest existing ancestor writable."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)) or not str(path):
        raise InputError(parameter, "must be a folder name", path)
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise InputError(parameter, "must be a folder, not an existing file", str(path))
    _writable_dir(parameter, p if p.exists() else p.parent, path, True)
    return p
