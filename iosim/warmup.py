"""First-run compilation in parallel: ``iosim compare`` on a cold Numba cache compiles in two processes.

Numba compiles each algorithm's driver the first time it runs and caches the machine code on disk; later runs load
it (about a second for ``iosim compare``). A first run on this 2-core machine spends most of its time compiling.
When the cache is cold, :func:`start` launches one worker process that compiles the algorithms given to it (by
running them once at a tiny size with the same argument types; ``iosim compare`` gives it standard attention and
FlashAttention-1, about half of the compile time) while this process runs the others; both write the shared
cache, and this process then loads what the worker compiled. A marker keyed by a fingerprint of iosim's source
files records that the cache is warm, so later runs start no worker.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import numba

from iosim._numba_cache import source_fingerprint


def _marker(key: str) -> Path:
    base = Path(numba.config.CACHE_DIR) if numba.config.CACHE_DIR else Path.home() / ".cache" / "iosim"
    return base / f"iosim-warm-{key}-{source_fingerprint()}"


def is_warm(key: str) -> bool:
    try:
        return _marker(key).exists()
    except OSError:
        return True


def mark_warm(key: str) -> None:
    try:
        m = _marker(key)
        m.parent.mkdir(parents=True, exist_ok=True)
        m.touch()
    except OSError:
        pass


def _compile(names: list[str], kwargs: dict) -> None:
    import sys

    from iosim import api

    sys.stderr = open(os.devnull, "w")  # the main process prints the one compile notice and reports any error

    small = dict(kwargs, N=min(kwargs["N"], 64), allow_long=True)
    for name in names:
        try:
            api.run(name, **small)
        except Exception:  # the main process reports what fails; here only the compilation matters
            pass


def start(names: list[str], kwargs: dict, key: str):
    """Compile ``names`` in a worker process when the cache for ``key`` is cold; returns the process (or None)."""
    if not names or is_warm(key) or (os.cpu_count() or 1) < 2 or numba.config.DISABLE_JIT:
        return None
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    proc = mp.get_context(method).Process(target=_compile, args=(names, kwargs), daemon=True)
    proc.start()
    return proc


def finish(proc, key: str) -> None:
    """Wait for the worker (if any) and mark the cache warm for ``key``."""
    if proc is not None:
        proc.join()
    mark_warm(key)
