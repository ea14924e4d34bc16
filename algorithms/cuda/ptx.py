"""Compile every kernel for a real GPU target without a GPU: ``python -m iosim.algorithms.cuda.ptx [--cc 9.0]``.

``numba.cuda.compile_ptx`` (numba-cuda with the ``cu13`` toolchain: NVVM from the ``nvidia-nvvm`` wheel) compiles
a kernel to PTX for a given compute capability with no device present, and so catches what the CUDA simulator
accepts but the compiler rejects (runtime-sized local arrays, float64 leaking into float32 code, untyped
constructs). It must run in a process where the simulator is off (``NUMBA_ENABLE_CUDASIM`` unset or 0).

numba-cuda 0.30 compiles a ``@cuda.jit(device=True)`` helper called from the kernel for the *current device's*
compute capability (``numba.cuda.dispatcher.get_current_device``), which raises without a GPU; when no GPU is
present :func:`compile_all` answers that lookup with the target ``cc``, so helpers and kernel are compiled for the
same target.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import types as pytypes

from numba import types  # numba's own type system: importable without numba-cuda (numba.cuda is imported lazily)

F3 = types.Array(types.float32, 3, "C")
F2 = types.Array(types.float32, 2, "C")
I2 = types.Array(types.int64, 2, "C")
I, F, B = types.int64, types.float32, types.boolean


def signatures() -> dict:
    """Every kernel of iosim.algorithms.cuda with the argument types its host launcher passes."""
    from iosim.algorithms.cuda import flash, square_tiling, standard

    sigs = {
        "flash2_forward_kernel": (flash.flash2_forward_kernel, (F3, F3, F3, F3, F2, I, I, F, B, I2, I2)),
        "flash1_forward_kernel": (flash.flash1_forward_kernel, (F3, F3, F3, F3, F2, F2, I, I, F, B, I2)),
        "logsumexp_kernel": (flash.logsumexp_kernel, (F2, F2, F2)),
        "flash2_backward_prep_kernel": (flash.flash2_backward_prep_kernel, (F3, F3, F2, F3, I, I2)),
        "flash2_backward_kernel": (
            flash.flash2_backward_kernel,
            (F3, F3, F3, F3, F2, F2, F3, F3, F3, I, I, F, B, B, I2),
        ),
        "matmul_kernel": (standard.matmul_kernel, (F3, F3, F3, I, B, F, I2, I, I, I)),
        "softmax_rows_kernel": (standard.softmax_rows_kernel, (F3, F3, I, B, I2)),
        "softmax_chunks_kernel": (standard.softmax_chunks_kernel, (F3, F3, I, B, I2)),
    }
    sigs.update(square_tiling.ptx_signatures())
    return sigs


@contextlib.contextmanager
def _target_cc_for_device_functions(cc):
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda

    if cuda.is_available():
        yield
        return
    original = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=cc)
    try:
        yield
    finally:
        dispatcher.get_current_device = original


def real_target() -> None:
    """Switch the CUDA simulator off before numba.cuda is first imported (compile_ptx needs the real target)."""
    import os

    from numba.core import config

    if "numba.cuda" not in sys.modules:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
        config.reload_config()
    if config.ENABLE_CUDASIM:
        raise RuntimeError("numba.cuda was imported with the CUDA simulator on: compile in a process of its own")


def compile_all(cc=(9, 0)) -> dict[str, str]:
    """PTX of every kernel for compute capability ``cc``; raises on the first kernel that does not compile."""
    from numba import cuda
    from numba.core import config

    if config.ENABLE_CUDASIM:
        raise RuntimeError("compile_ptx needs the real CUDA target: unset NUMBA_ENABLE_CUDASIM")
    out = {}
    with _target_cc_for_device_functions(cc):
        for name, (kernel, sig) in signatures().items():
            ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc)
            out[name] = ptx
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cc", default="9.0", help="compute capability MAJOR.MINOR (default 9.0)")
    args = p.parse_args(argv)
    from iosim.algorithms.cuda import cuda_missing

    missing = cuda_missing()
    if missing:
        print(f"ptx: error: the cuda extra is needed to compile the kernels: {missing}", file=sys.stderr)
        return 2
    try:
        cc = tuple(int(x) for x in args.cc.split("."))
    except ValueError:
        p.error(f"--cc must be MAJOR.MINOR, got {args.cc!r}")
    if len(cc) != 2:
        p.error(f"--cc must be MAJOR.MINOR, got {args.cc!r}")
    try:
        real_target()
    except RuntimeError as e:
        print(f"ptx: error: {e}", file=sys.stderr)
        return 2
    for name, ptx in compile_all(cc).items():
        f64 = sum(ptx.count(op) for op in ("add.f64", "mul.f64", "fma.rn.f64", "div.rn.f64"))
        print(f"{name:32s} sm_{cc[0]}{cc[1]}  {len(ptx):8d} chars of PTX  float64 arithmetic: {f64}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
