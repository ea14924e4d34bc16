"""FlexAttention-style mask_mod functions for ``--mask mod:experiments/data/flex_masks.py:NAME``.

Each is written as a FlexAttention user writes it: a function of (b, h, q_idx, kv_idx) on index arrays, returning
booleans; ``DOC`` holds the document id of each of 2048 tokens (five documents), captured as FlexAttention's
document masks capture theirs. ``head_window`` differs per head: a causal window of 256 (h + 1) keys at head h."""

import numpy as np

DOC = np.repeat(np.arange(5), [700, 300, 500, 248, 300])  # 2048 tokens


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def document(b, h, q_idx, kv_idx):
    return DOC[q_idx] == DOC[kv_idx]


def causal_document(b, h, q_idx, kv_idx):
    return (DOC[q_idx] == DOC[kv_idx]) & (q_idx >= kv_idx)


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 256)


def head_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 256 * (h + 1))
