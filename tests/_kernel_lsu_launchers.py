"""Launchers for tests/test_kernels_lsu.py: a masked tile copy out of a strided view (Triton), whose 32-byte sectors
the test counts on its own."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def copy_tile_kernel(X, Y, R, W, stride_x, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Program i copies rows i BLOCK_R .. of the R x W view X (row stride ``stride_x`` elements) to Y (contiguous),
    masked to the view."""
    i = tl.program_id(0)
    rows = i * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    m = (rows[:, None] < R) & (cols[None, :] < W)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=m, other=0.0)
    tl.store(Y + rows[:, None] * W + cols[None, :], x, mask=m)


def launch(R: int = 37, LD: int = 40, offset: int = 3, W: int = 20, BLOCK_R: int = 16, BLOCK_C: int = 32,
           dtype: str = "float16") -> dict:  # fmt: skip
    """Copy the view ``big[:, offset:offset + W]`` of an R x LD buffer: a row stride of LD elements and a first
    element ``offset`` elements into its storage (the buffer is the kernel's X, its storage 64-byte aligned)."""
    big = torch.arange(R * LD, dtype=torch.float64).reshape(R, LD).to(getattr(torch, dtype))
    assert big.data_ptr() % 32 == 0  # the test's sectors are counted from the storage's start
    X = big[:, offset : offset + W]
    Y = torch.empty((R, W), dtype=X.dtype)
    copy_tile_kernel[(triton.cdiv(R, BLOCK_R),)](X, Y, R, W, X.stride(0), BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C)
    assert torch.equal(Y, X)
    return {"X": X, "Y": Y}


@triton.jit
def scatter_add_kernel(Y, R, STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    """Program i adds 1 to Y[r STRIDE] for its rows r < R, atomically."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(Y + rows * STRIDE, tl.full((BLOCK,), 1.0, tl.float32), mask=rows < R)


def launch_atomic(R: int = 37, STRIDE: int = 3, BLOCK: int = 16) -> dict:
    """Atomic adds at a stride of STRIDE float32 words (12 bytes at 3): sectors shared by neighbouring lanes."""
    Y = torch.zeros(R * STRIDE, dtype=torch.float32)
    assert Y.data_ptr() % 32 == 0
    scatter_add_kernel[(triton.cdiv(R, BLOCK),)](Y, R, STRIDE=STRIDE, BLOCK=BLOCK)
    assert float(Y.sum()) == R
    return {"Y": Y}
