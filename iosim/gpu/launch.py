"""The GPU path: run the numba.cuda kernels of :mod:`iosim.algorithms.cuda` with tiles chosen from M as the
simulator does.

``import iosim`` does not import this module (nor ``numba.cuda``): the choice between a real GPU and the CUDA
simulator (``NUMBA_ENABLE_CUDASIM=1``) is made when ``numba.cuda`` is first imported, so it stays with the caller.

>>> from iosim.gpu import launch as gpu                                                      # doctest: +SKIP
>>> r = gpu.forward("flash2", Q, K, V, M=16384, count=True)                    # doctest: +SKIP
>>> r.counts == gpu.simulated_counts("flash2", N, d, M, batch=B * H)           # doctest: +SKIP
True

Each kernel moves, per (batch, head), exactly the words the simulator counts for the same (N, d, M, tiling,
causal): :func:`simulated_counts` is that count (the simulator's ``count_only`` run, times B * H), and
:func:`forward` / :func:`backward` with ``count=True`` return the kernels' own tally of the copies they made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from iosim.algorithms.cuda import CUDA_HINT, cuda_missing  # noqa: F401 - CUDA_HINT re-exported
from iosim.base.errors import InputError
from iosim.memory_model import ArrayCounts
from iosim.runner import registry
from iosim.theory.tiling import RULES, Tiling

KERNELS = ("flash2", "flash1", "standard", "square-tiling")
BACKWARD_KERNELS = ("flash2",)


def require_cuda() -> None:
    """Raise InputError (exit 2 on the command line) saying which extra to install when numba-cuda is missing."""
    why = cuda_missing()
    if why:
        raise InputError("the cuda extra", f"is needed for the GPU kernels: {why}")


def _kernels():
    require_cuda()
    from iosim.algorithms.cuda import flash, square_tiling, standard

    return flash, standard, square_tiling


def _check(name: str, rule: str, backward: bool = False) -> None:
    names = BACKWARD_KERNELS if backward else KERNELS
    if name not in names:
        what = "a GPU backward kernel" if backward else "a GPU kernel"
        raise InputError("kernel", f"must name {what}: one of {', '.join(names)}", name)
    if rule not in RULES:
        raise InputError("tiling", f"must be one of {', '.join(RULES)}", rule)


def _shape(Q) -> tuple[int, int, int]:
    """(B * H, N, d) of an input shaped (B, H, N, d) or (N, d)."""
    shape = tuple(Q.shape)
    if len(shape) not in (2, 4):
        raise InputError("Q", "must have shape (B, H, N, d) or (N, d)", f"shape {shape}")
    bh = shape[0] * shape[1] if len(shape) == 4 else 1
    return bh, shape[-2], shape[-1]


def tiling_for(name: str, N: int, d: int, M: int, rule: str = "fit", backward: bool = False) -> Tiling:
    """The blocks the simulator runs ``name`` with at (N, d, M): the registry's choice, forward or backward."""
    algo = registry.get(name)
    return algo.backward_tiling(N, d, M, rule) if backward else algo.choose_tiling(N, d, M, rule)


@dataclass
class GpuRun:
    """One kernel run: outputs by name, the kernels' counters (per array, all heads; None unless counting)."""

    kernel: str
    passname: str
    N: int
    d: int
    M: int
    BH: int
    tiling: Tiling
    shared_words: int
    outputs: dict
    counts: dict[str, ArrayCounts] | None


def forward(
    name: str,
    Q,
    K,
    V,
    *,
    M: int,
    causal: bool = False,
    tiling: str = "fit",
    scale: float | None = None,
    count: bool = False,
    threads: int | None = None,
    poison: bool = True,
    out: dict | None = None,
    block_mask=None,
) -> GpuRun:
    """Run GPU kernel ``name`` forward on (B, H, N, d) or (N, d) float32 inputs with fast memory M words per block.

    Outputs: "O" for every kernel; "L" (logsumexp) for flash1, flash2 and square-tiling; flash1 adds "l", "m";
    standard "S", "P"; square-tiling "S" (the exponent). NumPy inputs give NumPy outputs; device inputs give
    device outputs. ``block_mask`` (flash2 only): a boolean (Tr, Tc) block mask on the kernel's own tiles
    (:func:`tiling_for`); empty tiles are skipped (policy ``skip``), as ``iosim.masking.masks.FromBlocks(block_mask,
    (Br, Bc))`` in the simulator.
    """
    kw = dict(M=M, scale=scale, causal=causal, count=count, threads=threads, poison=poison, out=out)
    if block_mask is not None and name != "flash2":
        raise InputError("block_mask", "is only taken by the flash2 kernel", name)

    def launch(t: Tiling):
        flash, standard, square = _kernels()
        if name == "flash2":
            if block_mask is not None:
                shape = (-(-_shape(Q)[1] // t.Br), -(-_shape(Q)[1] // t.Bc))
                bm = np.asarray(block_mask)
                if bm.dtype != np.bool_ or bm.shape != shape:
                    raise InputError("block_mask", f"must be a boolean array of shape {shape} (Tr, Tc)", bm.shape)
            return flash.flash2_forward(Q, K, V, Br=t.Br, Bc=t.Bc, block_mask=block_mask, **kw)
        if name == "flash1":
            return flash.flash1_forward(Q, K, V, Br=t.Br, Bc=t.Bc, **kw)
        if name == "standard":
            return standard.standard_forward(Q, K, V, B=t.B, **kw)
        return square.square_tiling_forward(Q, K, V, B=t.B, **kw)

    return _run(name, Q, M, tiling, False, launch)


def backward(
    name: str,
    Q,
    K,
    V,
    O,
    dO,
    L,
    *,
    M: int,
    causal: bool = False,
    tiling: str = "fit",
    scale: float | None = None,
    count: bool = False,
    threads: int | None = None,
    dq_atomic: bool = True,
    poison: bool = True,
    out: dict | None = None,
) -> GpuRun:
    """Run GPU backward kernel ``name`` (flash2) from the forward's O and L; outputs "dQ", "dK", "dV" (and "D")."""
    kw = dict(M=M, scale=scale, causal=causal, count=count, threads=threads, poison=poison, out=out)

    def launch(t: Tiling):
        return _kernels()[0].flash2_backward(Q, K, V, O, dO, L, Br=t.Br, Bc=t.Bc, dq_atomic=dq_atomic, **kw)

    return _run(name, Q, M, tiling, True, launch)


def _run(name: str, Q, M: int, rule: str, backward: bool, launch: Callable) -> GpuRun:
    """Check the names, choose the simulator's tiling for Q's (N, d) and M, run ``launch(tiling)``: a GpuRun."""
    _check(name, rule, backward)
    BH, N, d = _shape(Q)
    t = tiling_for(name, N, d, M, rule, backward)
    r = launch(t)
    return GpuRun(name, "backward" if backward else "forward", N, d, M, BH, t, r.shared_words, r.outputs, r.counts)


def simulated_counts(
    name: str,
    N: int,
    d: int,
    M: int,
    *,
    causal: bool = False,
    tiling: str = "fit",
    backward: bool = False,
    batch: int = 1,
    mask=None,
    kv_policy: str = "paper",
) -> dict[str, ArrayCounts]:
    """The simulator's per-array counts (count-only run) of ``name`` at (N, d, M), times ``batch`` = B * H."""
    from iosim.runner import api

    r = api.run_keywords(
        name, N=N, d=d, M=M, causal=causal, tiling=tiling, count_only=True, backward=backward, mask=mask,
        kv_policy=kv_policy,
    )  # fmt: skip
    stats = r.passes["backward" if backward else "forward"].stats
    return {
        k: ArrayCounts(v.reads * batch, v.writes * batch, v.init_writes * batch) for k, v in stats.per_array.items()
    }


def default_M(name: str, N: int, d: int, backward: bool = False, parts: int = 3) -> int:
    """A fast memory that splits N into about ``parts`` blocks (the smallest M whose tiling reaches that block).

    For checks on tiny shapes: several blocks per dimension, ragged last blocks, and a small simulator run.
    """
    algo = registry.get(name)
    target = max(1, -(-N // parts))

    def big(M: int) -> int:
        try:
            t = algo.choose_tiling(N, d, M, "fit")
            if backward:
                algo.backward_tiling(N, d, M, "fit")
        except InputError:
            return 0
        return max(x for x in (t.Br, t.Bc, t.B) if x is not None)

    lo, hi = 1, 64
    while big(hi) < target:
        lo, hi = hi + 1, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if big(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def attention(
    name: str, M: int | Callable[[int, int], int] | None = None, *, tiling: str = "fit", threads: int | None = None
):
    """Kernel ``name`` as a callable for :func:`iosim.check`: ``fn(Q, K, V, *, causal, scale) -> (O, L)``.

    ``M`` is the fast memory per block in words, a function (N, d) -> M, or None for :func:`default_M` at each
    shape (capped at the shared memory one block may use on this GPU). The flash2 callable also has
    ``fn.backward(Q, K, V, O, dO, L, *, causal, scale) -> (dQ, dK, dV)``.
    """
    _check(name, tiling)
    has_bwd = name in BACKWARD_KERNELS

    def fast_memory(N: int, d: int) -> int:
        if M is None:  # about 3 blocks along N, but never more than a block may have on this GPU
            from iosim.algorithms.cuda._host import max_shared_words

            top = max_shared_words()
            m = default_M(name, N, d, backward=has_bwd)
            return m if top is None else min(m, top)
        return M(N, d) if callable(M) else M

    def fn(Q, K, V, *, causal: bool = False, scale: float | None = None):
        _, N, d = _shape(Q)
        r = forward(name, Q, K, V, M=fast_memory(N, d), causal=causal, tiling=tiling, scale=scale, threads=threads)
        return r.outputs["O"], r.outputs.get("L")

    def bwd(Q, K, V, O, dO, L, *, causal: bool = False, scale: float | None = None):
        _, N, d = _shape(Q)
        r = backward(
            name, Q, K, V, O, dO, L, M=fast_memory(N, d), causal=causal, tiling=tiling, scale=scale, threads=threads
        )
        return r.outputs["dQ"], r.outputs["dK"], r.outputs["dV"]

    fn.__name__ = fn.__qualname__ = f"gpu_{name.replace('-', '_')}"
    fn.equal_lengths = True  # the kernels take N_q = N_k (iosim.check skips its N_q != N_k cases)
    if has_bwd:
        fn.backward = bwd
    return fn


def _driver_sees_a_gpu() -> bool:
    """Whether the CUDA driver reports a device, asked through libcuda directly (numba.cuda stays unimported)."""
    import ctypes

    for lib in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            cu = ctypes.CDLL(lib)
        except OSError:
            continue
        count = ctypes.c_int(0)
        try:
            return cu.cuInit(0) == 0 and cu.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
        except AttributeError:
            return False
    return False


def select_target() -> str:
    """Pick the real GPU or the CUDA simulator before ``numba.cuda`` is imported; returns "gpu" or "simulator".

    Numba reads ``NUMBA_ENABLE_CUDASIM`` into ``numba.core.config`` when numba is imported (``import iosim``
    already did), and ``numba.cuda`` picks its mode from that config when *it* is first imported. So: if
    ``numba.cuda`` is already imported, its mode stands. Otherwise an explicit ``NUMBA_ENABLE_CUDASIM`` in the
    environment is honoured; if it is unset and the driver reports no GPU, it is set to 1 and numba's config is
    re-read (``numba.core.config.reload_config``), so the kernels run on the simulator in this same process.
    """
    import os
    import sys

    from numba.core import config

    require_cuda()
    if "numba.cuda" not in sys.modules:
        if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _driver_sees_a_gpu():
            os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        config.reload_config()
    if config.ENABLE_CUDASIM:  # its threads' swap of the cuda global, made thread-safe (iosim.gpu.simulator)
        from iosim.gpu import simulator

        simulator.install()
    return "simulator" if config.ENABLE_CUDASIM else "gpu"


def gpu_available() -> bool:
    """Whether numba.cuda (imported now, in the mode :func:`select_target` chose) can run on a real GPU."""
    require_cuda()
    from numba import cuda
    from numba.core import config

    return not config.ENABLE_CUDASIM and cuda.is_available()
