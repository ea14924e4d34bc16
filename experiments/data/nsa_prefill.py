"""The prefill selections of docs/sparse-indices.md's section on fla's NSA kernel (``--indices
mod:experiments/data/nsa_prefill.py:NAME``, blocks of 16 keys), the ones tests/test_kernels_nsa.py launches the
kernel with: one row per query token, the same for every token."""

import numpy as np


def ahead(p):
    """[0, 1]: under causal prefill, tokens 0..15 list block 1, which starts after them."""
    return np.tile(np.array([0, 1], dtype=np.int32), (p.N_q, 1))


def padded(p):
    """[0, -1, 1]: the same with a -1 entry, as fla's top-k pads a token that sees fewer blocks than it selects."""
    return np.tile(np.array([0, -1, 1], dtype=np.int32), (p.N_q, 1))
