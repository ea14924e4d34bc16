"""Top-k selections for docs/sparse-indices.md (``--indices mod:experiments/data/topk_selections.py:NAME``): each
function takes the iosim.Problem and returns the index array (iosim.masking.topk_sparse), drawn from a fixed seed."""

import numpy as np


def _pick(rng, n, k):
    return rng.permutation(n)[:k]


def dsa(p):
    """DeepSeek's DSA: each query token selects 6 key tokens (block 1), one selection per key/value head."""
    rng = np.random.default_rng(1)
    return np.array([[_pick(rng, p.N_k, 6) for _ in range(p.N_q)] for _ in range(p.H_kv)])[None]


def nsa(p):
    """NSA: each query token selects 3 key blocks of 16 (--index-block 16), shared by its GQA group's heads but
    given per query head here, each head keeping 2 of the group's blocks and adding 1 of its own."""
    rng = np.random.default_rng(2)
    nblk = -(-p.N_k // 16)
    out = np.empty((p.B, p.H_q, p.N_q, 3), dtype=np.int64)
    for b in range(p.B):
        for r in range(p.N_q):
            for hk in range(p.H_kv):
                common = _pick(rng, nblk, 2)
                rest = np.setdiff1d(np.arange(nblk), common)
                for t in range(p.g):
                    out[b, hk * p.g + t, r] = [*common, rng.choice(rest)]
    return out


def decode4(p):
    """Four neighbouring decode tokens (N_q = 4): 14 of their 16 blocks of 16 keys are common, 2 their own."""
    rng = np.random.default_rng(3)
    nblk = -(-p.N_k // 16)
    perm = rng.permutation(nblk)
    return np.array([[*perm[:14], *rng.choice(perm[14:], 2, replace=False)] for _ in range(p.N_q)])


def moba(p):
    """MoBA: each block of 2 query rows (--q-block 2) selects 2 key blocks of 16."""
    rng = np.random.default_rng(4)
    return np.array([_pick(rng, -(-p.N_k // 16), 2) for _ in range(-(-p.N_q // 2))])


def duplicated(p):
    """A selection that lists one block twice (refused)."""
    return np.array([[0, 1, 1]] * p.N_q)
