"""Shared host-side helpers of the example launchers (torch tensors for the Triton interpreter)."""

from __future__ import annotations

import math


def next_pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << max(0, (n - 1).bit_length()))


def inputs(names, shape, dtype: str, seed: int):
    """Standard-normal tensors of ``shape`` in ``dtype`` (torch), one per name, from one seed."""
    import torch

    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    return [torch.randn(shape, generator=g, dtype=torch.float64).to(dt) for _ in names]


def default_scale(d: int) -> float:
    return 1.0 / math.sqrt(d)
