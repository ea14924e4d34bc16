# ruff: noqa: N999 - numbered experiment scripts, loaded by file or by importlib
"""Experiment 16: is my mask efficient? What FlexAttention's block-sparse kernels load, mask by mask.

Question (asked on the attention-gym tracker; a widely used benchmark divides |Q| + |K| + |V| + |O| by the latency
whatever the mask): how many bytes does a block-sparse attention kernel move for a given mask, against the naive
estimate |Q| + |K| + |V| + |O| and against a dense kernel that loads every K/V block and masks afterwards? What do a
full S x S bias and a 1-D bias read in ``score_mod`` cost, does reordering tokens to cluster documents pay, and
block size 128 against 64?

Grid: one head (every count scales with B H), N tokens, d = 128, bf16 Q/K/V/O, fp32 L, int32 metadata and
document ids, bf16 biases. Masks as FlexAttention ``mask_mod`` functions: document masking (7 documents, fixed
lengths), sliding window (N/8, causal), prefix LM (prefix N/4), causal, causal with document ids, a random block
pattern with the density of the causal-document mask's visited blocks (an iosim ``random-blocks`` mask: every
listed block full), and the causal-document mask with its tokens interleaved (documents in chunks of 16 tokens, the
same pairs allowed up to a permutation). Counted by iosim.masking.block_sparse (the schedule of
iosim/algorithms/block_sparse.py) and checked against its closed form (iosim/theory/block_sparse.py) per array
and in peak. Words are what the kernel's programs issue to global memory; re-reads an L2 may serve are counted.

Run: ``iosim experiments run mask-efficiency``.
"""

from __future__ import annotations

import numpy as np
from iosim.experiments import runner
from iosim.experiments._common import Verdict

from iosim import Problem
from iosim.masking.block_sparse import Buffer, block_sparse

NAME = "mask-efficiency"
TITLE = "Is my mask efficient? Block-sparse bytes vs the naive estimate and the dense kernel"
CLAIM = (
    "A block-sparse kernel's bytes follow the blocks its mask visits (metadata, K/V of partial and full blocks, "
    "mask_mod reads in partial blocks, score_mod reads in every visited block), not |Q|+|K|+|V|+|O|; a dense "
    "kernel that masks after loading moves every block's K/V."
)
FULL = {"N": 16384}
QUICK = {"N": 1024}
D = 128
FRACTIONS = (0.2, 0.05, 0.15, 0.1, 0.3, 0.08)  # the first six documents' shares of N; a seventh takes the rest


def documents(N: int) -> np.ndarray:  # noqa: N803
    lengths = [int(f * N) for f in FRACTIONS]
    lengths.append(N - sum(lengths))
    return np.repeat(np.arange(len(lengths)), lengths).astype(np.int64)


def masks(N: int) -> dict:  # noqa: N803
    doc = documents(N)
    # interleaved: the same tokens in chunks of 16 put in a random order (seed 0); position t holds token order[t]
    chunks = np.random.default_rng(0).permutation(-(-N // 16))
    order = np.concatenate([np.arange(c * 16, min(N, c * 16 + 16)) for c in chunks])
    mixed = doc[order]
    w, prefix = N // 8, N // 4

    def document(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    def sliding_window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < w)

    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx < prefix) | (q_idx >= kv_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def causal_document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    def causal_document_interleaved(b, h, q_idx, kv_idx):
        return (mixed[q_idx] == mixed[kv_idx]) & (order[q_idx] >= order[kv_idx])

    doc_buf = [Buffer("doc_ids", "q+kv", "mask", "int32")]
    return {
        "document": (document, doc_buf),
        "sliding window N/8": (sliding_window, []),
        "prefix LM N/4": (prefix_lm, []),
        "causal": (causal, []),
        "causal + document ids": (causal_document, doc_buf),
        "causal + document ids, interleaved": (
            causal_document_interleaved,
            [*doc_buf, Buffer("pos", "q+kv", "mask", "int32")],
        ),
    }


def _row(name, r, dense, block, score) -> dict:
    b = r.bytes
    meta = sum(v for k, v in b.items() if "kv_" in k)
    mask_bufs = sum(b.get(x, 0) for x in ("doc_ids", "pos"))
    score_bufs = sum(b.get(x, 0) for x in ("bias_1d", "bias_full"))
    visited = r.census["partial"] + r.census["full"]
    return dict(mask=name, block=block, score_mod=score, blocks=r.census["blocks"], partial=r.census["partial"],
                full=r.census["full"], visited_fraction=visited / r.census["blocks"], sparse_bytes=r.bytes_total,
                dense_bytes=dense.bytes_total, naive_bytes=r.naive_bytes, kv_bytes=b["K"] + b["V"],
                metadata_bytes=meta, mask_buffer_bytes=mask_bufs, score_buffer_bytes=score_bufs,
                sparse_over_naive=r.bytes_total / r.naive_bytes, sparse_over_dense=r.bytes_total / dense.bytes_total,
                peak_words=r.stats.peak, exact=r.exact and dense.exact)  # fmt: skip


SCORES = {"none": [], "1-D bias": [Buffer("bias_1d", "kv", "score", "bf16")],
          "S x S bias": [Buffer("bias_full", "qkv", "score", "bf16")]}  # fmt: skip


def measure(g) -> list[dict]:
    N = g.N
    p = Problem(N=N, d=D, dtype_q="bf16")
    rows = []
    cases = masks(N)
    for block in (128, 64):
        density = None
        for name, (fn, bufs) in cases.items():
            scores = SCORES if name == "causal + document ids" else {"none": []}
            for score, sbufs in scores.items():
                r = block_sparse(p, fn, block=block, buffers=bufs + sbufs)
                d = block_sparse(p, fn, block=block, buffers=bufs + sbufs, dense=True)
                rows.append(_row(name, r, d, block, score))
            if name == "causal + document ids":
                density = (r.census["partial"] + r.census["full"]) / r.census["blocks"]
        rb = f"random-blocks:{density:.6f}:{block}x{block}:1"
        r = block_sparse(p, rb, block=block)
        d = block_sparse(p, rb, block=block, dense=True)
        rows.append(_row(f"random blocks at density {density:.3f}", r, d, block, "none"))
        full = block_sparse(p, "none", block=block)
        rows.append(_row("no mask", full, block_sparse(p, "none", block=block, dense=True), block, "none"))
    return rows


def verdict(rows, g) -> runner.Summary:
    headers = ["mask", "block", "score_mod", "partial", "full", "visited", "sparse MB", "dense MB", "naive MB",
               "sparse/naive", "sparse/dense", "metadata KB", "mask_mod KB", "score_mod MB"]  # fmt: skip
    table = [[x["mask"], str(x["block"]), x["score_mod"], str(x["partial"]), str(x["full"]),
              f"{x['visited_fraction']:.3f}", f"{x['sparse_bytes'] / 1e6:.2f}", f"{x['dense_bytes'] / 1e6:.2f}",
              f"{x['naive_bytes'] / 1e6:.2f}", f"{x['sparse_over_naive']:.2f}", f"{x['sparse_over_dense']:.3f}",
              f"{x['metadata_bytes'] / 1e3:.1f}", f"{x['mask_buffer_bytes'] / 1e3:.1f}",
              f"{x['score_buffer_bytes'] / 1e6:.2f}"] for x in rows]  # fmt: skip
    exact = all(x["exact"] for x in rows)
    sparse = [x for x in rows if x["mask"] != "no mask"]
    cd = {(x["block"], x["score_mod"]): x for x in rows if x["mask"] == "causal + document ids"}
    mixed = {x["block"]: x for x in rows if x["mask"] == "causal + document ids, interleaved"}
    spread = f"{min(x['sparse_over_dense'] for x in sparse):.3f}-{max(x['sparse_over_dense'] for x in sparse):.3f}"
    v = Verdict(
        NAME,
        CLAIM,
        measured=(
            f"N = {g.N}, d = {D}, bf16, block 128: causal + document ids moves "
            f"{cd[(128, 'none')]['sparse_bytes'] / 1e6:.2f} MB against {cd[(128, 'none')]['dense_bytes'] / 1e6:.2f} "
            f"MB dense and {cd[(128, 'none')]['naive_bytes'] / 1e6:.2f} MB naive; an S x S bf16 bias adds "
            f"{cd[(128, 'S x S bias')]['score_buffer_bytes'] / 1e6:.2f} MB, a 1-D bias "
            f"{cd[(128, '1-D bias')]['score_buffer_bytes'] / 1e6:.3f} MB; interleaving its documents visits "
            f"{mixed[128]['visited_fraction']:.3f} of the blocks "
            f"(clustered: {cd[(128, 'none')]['visited_fraction']:.3f})"
        ),
        figure=f"sparse/dense {spread}",
        holds=exact and all(x["sparse_bytes"] <= x["dense_bytes"] + x["metadata_bytes"] for x in rows),
    )
    if not exact:
        v.failures.append("a count differs from its closed form")
    v.notes.append(
        "Every count equals its closed form per array and in peak (iosim/theory/block_sparse.py). The naive estimate "
        "counts K and V once; a kernel whose row blocks each load their K/V blocks issues them once per row block that "
        "visits them, so its issued bytes exceed the naive figure even for sparse masks; an L2 may serve some of them."
    )
    return runner.Summary(v, table, headers)


def plot(rows, g):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    sel = [x for x in rows if x["block"] == 128 and x["score_mod"] == "none"]
    xs = np.arange(len(sel))
    ax.bar(xs - 0.27, [x["sparse_bytes"] / 1e6 for x in sel], width=0.27, label="block-sparse kernel")
    ax.bar(xs, [x["dense_bytes"] / 1e6 for x in sel], width=0.27, label="dense kernel (load, then mask)")
    ax.bar(xs + 0.27, [x["naive_bytes"] / 1e6 for x in sel], width=0.27, label="naive |Q|+|K|+|V|+|O|")
    ax.set_xticks(xs, [x["mask"] for x in sel], rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("MB moved (one head)")
    ax.set_title(f"Bytes moved per mask, N = {g.N}, d = {D}, bf16, blocks of 128")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


main = runner.script(globals())  # python experiments/NN_x.py [--quick] [--out DIR]

if __name__ == "__main__":
    raise SystemExit(main())
