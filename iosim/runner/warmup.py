"""First-run compilation in parallel: ``iosim compare`` on a cold Numba cache compiles in two processes.

Numba compiles each algorithm's driver the first time it runs and caches the machine code on disk; later runs load
it (about a second for ``iosim compare``). A first run on this 2-core machine spends most of its time compiling.
When the cache is cold, :func:`start` launches one worker process that compiles the algorithms given to it (by
running them once at a tiny size with the same argument types; ``iosim compare`` gives it standard attention,
about half of the compile time) while this process runs the others; both write the shared
cache, and this process then loads what the worker compiled. A marker keyed by a fingerprint of iosim's source
files records that the cache is warm, so later runs start no worker.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import sys
from pathlib import Path

import numba

from iosim.base.numba_cache import source_fingerprint


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
    from iosim.runner import api

    sys.stderr = open(os.devnull, "w")  # the main process prints the one compile notice and reports any error

    small = dict(kwargs, N=min(kwargs["N"], 64), allow_long=True)
    for name in names:
        try:
            api.run_keywords(name, **small)
        except Exception:  # the main process reports what fails; here only the compilation matters
            pass


# Libraries that start threads of their own when imported: a fork after them copies their locks held, and the child
# can wait on one forever (torch's, imported by a mask file that computes with torch, hung iosim compare on an empty
# Numba cache). After any of them the worker is spawned.
THREADED = ("torch", "jax", "triton", "tensorflow")


def start_method() -> str:
    """``fork`` where the platform has it and no threaded library is loaded yet, else ``spawn``."""
    if "fork" not in mp.get_all_start_methods() or any(m in sys.modules for m in THREADED):
        return "spawn"
    return "fork"


def start(names: list[str], kwargs: dict, key: str):
    """Compile ``names`` in a worker process when the cache for ``key`` is cold; returns the process (or None)."""
    if not names or is_warm(key) or (os.cpu_count() or 1) < 2 or numba.config.DISABLE_JIT:
        return None
    method = start_method()
    if method == "spawn":  # the child imports afresh and receives its arguments pickled
        try:
            pickle.dumps(kwargs)
        except Exception:  # noqa: BLE001 (a mask object that does not pickle: this process compiles it all)
            return None
    proc = mp.get_context(method).Process(target=_compile, args=(names, kwargs), daemon=True)
    proc.start()
    return proc


def finish(proc, key: str) -> None:
    """Wait for the worker (if any) and mark the cache warm for ``key``."""
    if proc is not None:
        proc.join()
    mark_warm(key)
