"""Numba's on-disk cache, kept honest across source changes.

Numba keys a cached function by its own source file only (path, modification time, size). A driver in
``algorithms/flash.py`` compiled against the memory model's ops in ``memory_model/core.py`` is cached under
flash.py's stamp: after a change to core.py alone (a ``git pull`` touches only the files that changed), the driver
would load from the cache with the old ops compiled into it and count with them, silently. So iosim stamps its
cache directories with a fingerprint of all its source files, and when the fingerprint changes it drops its own
cached functions there; the next run compiles afresh. Checking costs one ``stat`` per source file.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from pathlib import Path

import numba

_STAMP = "iosim-sources"


def source_fingerprint() -> str:
    """A fingerprint of numba's version and every iosim source file (path, modification time, size)."""
    roots = {Path(__file__).resolve().parents[1]}
    for name in ("iosim.algorithms", "iosim.memory_model"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            roots.add(Path(mod.__file__).resolve().parent)
    h = hashlib.sha1(numba.__version__.encode())
    for root in sorted(roots):
        for f in sorted(root.rglob("*.py")):
            st = f.stat()
            h.update(f"{f}:{st.st_mtime_ns}:{st.st_size}".encode())
    return h.hexdigest()[:16]


def _cache_dirs() -> dict[Path, set[str]]:
    """Each directory where Numba caches iosim's functions, with the stems of the source files cached there."""
    from numba.core.caching import FunctionCache

    by_source: dict[Path, object] = {}  # a source directory -> one function defined there
    for name, mod in list(sys.modules.items()):
        if (name == "iosim" or name.startswith("iosim.")) and getattr(mod, "__file__", None):
            fn = next((f for f in vars(mod).values() if inspect.isfunction(f) and f.__module__ == name), None)
            if fn is not None:
                by_source.setdefault(Path(mod.__file__).resolve().parent, fn)
    dirs: dict[Path, set[str]] = {}
    for source, fn in by_source.items():
        try:
            path = Path(FunctionCache(fn)._cache_path)
        except Exception:  # no writable cache location: Numba does not cache there either
            continue
        dirs.setdefault(path, set()).update(f.stem for f in source.glob("*.py"))
    return dirs


def drop_stale() -> None:
    """Remove iosim's cached functions from every cache directory stamped with another source fingerprint."""
    if numba.config.DISABLE_JIT:
        return
    key = source_fingerprint()
    for path, stems in _cache_dirs().items():
        stamp = path / _STAMP
        try:
            if stamp.exists() and stamp.read_text() == key:
                continue
            for f in path.iterdir():
                if f.suffix in (".nbi", ".nbc") and f.name.split(".", 1)[0] in stems:
                    f.unlink(missing_ok=True)
            stamp.write_text(key)
        except OSError:  # a read-only or vanished cache: nothing to drop
            continue


def cold() -> bool:
    """True when the algorithms' cache directory holds no compiled function yet (a first run: Numba will compile
    the drivers). Only that directory is asked: a command that loaded no algorithm yet (the pebble game, whose
    own modules cache nothing) is not a first run for that reason."""
    if numba.config.DISABLE_JIT:
        return False
    from numba.core.caching import FunctionCache

    from iosim.algorithms import flash

    try:
        return not any(Path(FunctionCache(flash.flash1_row_update)._cache_path).glob("*.nbi"))
    except Exception:  # no writable cache location: Numba does not cache there either
        return False
