"""Launchers for counting, on the CPU, the Triton kernels that experiments/bench/gpu_evidence.py profiles on a GPU.

``fla_hopper``: flash-linear-attention's ``parallel_attn_fwd`` with the block sizes it picks on an H100 (its
``check_shared_mem('hopper')`` branch: BT = 128, BS = 64, num_warps = 8), so that the CPU count and the GPU
measurement describe the same launch. On a CPU fla would take its smallest branch (BS = 32).

    iosim kernel experiments/bench/gpu_kernel_launchers.py:fla_hopper --backend triton --N 4096 --d 64 --H 16 \\
        --dtype float16 --causal --like flash2 --no-numerics --json
"""

from __future__ import annotations


def fla_hopper(N: int, d: int, B: int = 1, H: int = 2, kv_heads: int | None = None, dtype: str = "float32",
               seed: int = 0, causal: bool = True) -> dict:  # fmt: skip
    import fla.ops.attn.parallel as parallel

    from iosim.kernels.examples import fla_parallel_attn

    original = parallel.check_shared_mem
    parallel.check_shared_mem = lambda arch="none", *a, **k: arch == "hopper"
    try:
        return fla_parallel_attn.launch(N, d, B=B, H=H, kv_heads=kv_heads, dtype=dtype, seed=seed)
    finally:
        parallel.check_shared_mem = original
