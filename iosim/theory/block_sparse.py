"""The exact count of the block-sparse schedule (:mod:`iosim.algorithms.block_sparse`), per array and in peak.

For each (b, h) and row block i (r_i = min(BQ, N_q - i BQ) rows) with partial blocks P_i and full blocks F_i
(the BlockMask's classes; the dense kernel: every block partial, no metadata), column block j of c_j keys:

* Q: sum r_i d_qk; O: sum r_i d_v (writes); L: sum r_i (writes);
* kv_num_blocks, full_kv_num_blocks: one word per row block each; kv_indices: |P_i|; full_kv_indices: |F_i|
  (``template``, torch's FlexAttention Triton template: max(1, 2 |P_i|) and max(1, 2 |F_i|): the first index
  before the loop, then each block's own and the next one's but the last's);
* K: sum over visited blocks (P_i and F_i) of c_j d_qk; V: of c_j d_v;
* a buffer: its words per block w(i, j) (``q`` r_i, ``kv`` c_j, ``q+kv`` r_i + c_j, ``qkv`` and ``bhqkv`` r_i c_j,
  ``h`` 1; with ``template`` BQ and BKV in place of r_i and c_j: the template reads a ragged block's padded
  positions too, their indices wrapped) summed over P_i (a mask_mod buffer) or over P_i and F_i (a score_mod
  buffer);
* peak: the largest of r_i (d_qk + d_v + 2) + 3 + c_j (d_qk + d_v) + r_i c_j + sum of the block's buffer words over
  visited blocks (without the 3 metadata words in the dense kernel; 2 with ``template``, which reads the index
  after the block), and r_i (d_qk + d_v + 2) + 2 (a row block before its first block, or with none; + 1 with
  ``template``: the first index, or one of a block's two after its tiles).

Summed with NumPy over the class array (B', H', T_r, T_c), each (b', h') weighted by the heads it stands for.
"""

from __future__ import annotations

import numpy as np

from iosim.memory_model.core import ArrayCounts, Stats

WORDS = {
    "q": lambda r, c: r + 0 * c,
    "kv": lambda r, c: c + 0 * r,
    "q+kv": lambda r, c: r + c,
    "qkv": lambda r, c: r * c,
    "bhqkv": lambda r, c: r * c,
    "h": lambda r, c: 1 + 0 * (r + c),
}


def block_sparse_counts(cls: np.ndarray, dims: tuple, buffers: tuple, dense: bool, M: int | None = None,  # noqa: N803
                        template: bool = False) -> Stats:  # fmt: skip
    """Stats (per array and peak) of the schedule on classes ``cls`` (0 empty, 1 partial, 2 full); ``dims`` =
    (B, H_q, H_kv, N_q, N_k, d_qk, d_v, BQ, BKV); ``buffers`` = ((name, index, scope), ...), scope "mask"/"score"."""
    B, H_q, _, N_q, N_k, d_qk, d_v, BQ, BKV = dims
    Bm, Hm, Tr, Tc = cls.shape
    weight = (B // Bm) * (H_q // Hm)
    r = np.minimum(BQ, N_q - np.arange(Tr) * BQ)[:, None].astype(np.int64)  # T_r x 1
    c = np.minimum(BKV, N_k - np.arange(Tc) * BKV)[None, :].astype(np.int64)  # 1 x T_c
    if dense:
        P = np.ones((Bm, Hm, Tr, Tc), dtype=bool)
        F = np.zeros_like(P)
    else:
        P, F = cls == 1, cls == 2
    Vis = P | F
    heads = B * H_q
    per = {"Q": ArrayCounts(reads=heads * N_q * d_qk)}
    if not dense:
        per["kv_num_blocks"] = ArrayCounts(reads=heads * Tr)
        per["full_kv_num_blocks"] = ArrayCounts(reads=heads * Tr)
        for name, sel in (("kv_indices", P), ("full_kv_indices", F)):
            n = sel.sum(axis=3)  # B' x H' x T_r: the list's length per row block
            per[name] = ArrayCounts(reads=weight * int(np.maximum(1, 2 * n).sum() if template else n.sum()))
    width = np.broadcast_to(c, (Tr, Tc))
    per["K"] = ArrayCounts(reads=weight * int((Vis * width).sum()) * d_qk)
    per["V"] = ArrayCounts(reads=weight * int((Vis * width).sum()) * d_v)
    meta = 0 if dense else 2 if template else 3  # the block counts, and the block's index (read after it: template)
    ws = r * (d_qk + d_v) + r * 2 + meta + c * (d_qk + d_v) + r * c  # a visited block's working set
    ws_p, ws_f = np.broadcast_to(ws, (Tr, Tc)).copy(), np.broadcast_to(ws, (Tr, Tc)).copy()
    for name, index, scope in buffers:  # the template reads them at the whole block, indices wrapped
        w = np.broadcast_to(WORDS[index](np.int64(BQ), np.int64(BKV)) if template else WORDS[index](r, c), (Tr, Tc))
        scope_sel = P if scope == "mask" else Vis
        per[name] = ArrayCounts(reads=weight * int((scope_sel * w).sum()))
        ws_p = ws_p + w
        if scope == "score":
            ws_f = ws_f + w
    per["O"] = ArrayCounts(writes=heads * N_q * d_v)
    per["L"] = ArrayCounts(writes=heads * N_q)
    start = int(r.max()) * (d_qk + d_v + 2) + (0 if dense else 3 if template else 2)
    peak = max(start, int((P * ws_p).max(initial=0)), int((F * ws_f).max(initial=0)))
    per = {k: v for k, v in per.items() if v.reads or v.writes}
    return Stats(M=M if M is not None else peak, peak=peak, overflowed=M is not None and peak > M, per_array=per)
