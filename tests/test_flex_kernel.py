"""A Triton kernel that consumes a real FlexAttention BlockMask (iosim/kernels/examples/triton_flex_blocksparse.py),
counted in place under the Triton interpreter: its per-array traffic equals the block-sparse schedule's
(iosim.block_sparse) on the same BlockMask and problem, metadata, document ids and bias included, and its output
equals the float64 reference of the masked, biased attention."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from iosim import Problem
from iosim.block_sparse import Buffer, block_sparse

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

FILE = pathlib.Path(__file__).resolve().parents[1] / "iosim" / "kernels" / "examples" / "triton_flex_blocksparse.py"


@pytest.mark.parametrize("N, Br, Bc, H, bias", [(200, 32, 32, 2, True), (160, 16, 32, 1, False)])
def test_kernel_moves_what_the_schedule_counts(N, Br, Bc, H, bias):  # noqa: N803
    from torch.nn.attention.flex_attention import create_block_mask

    from iosim.kernels.counting import count_file
    from iosim.kernels.examples.triton_flex_blocksparse import documents

    d = 16
    params = {"N": N, "d": d, "Br": Br, "Bc": Bc, "H": H, "bias": bias}
    counts, _, arrays = count_file(str(FILE), "launch", backend="triton", params=params)
    doc = documents(N)

    def causal_document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    bm = create_block_mask(causal_document, None, None, N, N, device="cpu", BLOCK_SIZE=(Br, Bc))
    bufs = [Buffer("doc", "q+kv", "mask", "int32")] + ([Buffer("bias", "qkv", "score")] if bias else [])
    model = block_sparse(Problem(H_q=H, N=N, d=d, dtype_q="fp32"), bm, buffers=bufs)
    assert model.exact
    kernel = {k: (a.reads, a.writes) for k, a in counts.per_array.items() if a.reads or a.writes}
    schedule = {k: (a.reads, a.writes) for k, a in model.stats.per_array.items()}
    assert kernel == schedule
    assert {k: a.read_bytes + a.write_bytes for k, a in counts.per_array.items() if a.reads or a.writes} == model.bytes
    # numerics: the masked, biased softmax in float64
    Q, K, V = (arrays[x].astype(np.float64) for x in "QKV")
    dn = doc.numpy()
    allowed = (dn[:, None] == dn[None, :]) & (np.arange(N)[:, None] >= np.arange(N)[None, :])
    S = np.einsum("hnd,hmd->hnm", Q, K) / np.sqrt(d) + (arrays["bias"] if bias else 0.0)
    S = np.where(allowed, S, -np.inf)
    P = np.exp(S - S.max(-1, keepdims=True))
    O = np.einsum("hnm,hmd->hnd", P / P.sum(-1, keepdims=True), V)
    assert np.abs(arrays["O"] - O).max() < 1e-4
