"""A query row whose top-k selection is all -1 (``iosim run topk-sparse --invalid-index -1``): iosim's convention is
O = 0 and L = -inf (a row that sees no key, as FlashAttention >= 2.1 and FlexAttention return it), in the schedule
and in the float64 reference alike, with the row's index words read, its O and L written and no K or V loaded.
fla-core's NSA kernel divides 0 by 0 for such a row (O = NaN, L = -inf): the comparison counts that as an infinite
error, never as equality (docs/sparse-indices.md, "A row with no selected key")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from iosim import Problem
from iosim.masking.topk_sparse import _max_error, topk_sparse

BLOCK = 16
IDX = np.array([[0, 2], [-1, -1], [1, -1], [0, 1]])  # 4 query rows, 2 blocks of 16 keys each; row 1 selects none


def _expected(p: Problem, idx: np.ndarray, seed: int = 0):
    """O and L written here: inputs drawn as topk_sparse's docstring says (Q, then K, then V, standard normal from
    ``seed``); row r attends to the keys of its non-negative blocks, a row with none O = 0, L = -inf."""
    rng = np.random.default_rng(seed)
    Q, K = rng.standard_normal((p.N_q, p.d_qk)), rng.standard_normal((p.N_k, p.d_qk))
    V = rng.standard_normal((p.N_k, p.d_v))
    O, L = np.zeros((p.N_q, p.d_v)), np.full(p.N_q, -np.inf)
    for r, row in enumerate(idx):
        keys = [c for j in row if j >= 0 for c in range(j * BLOCK, min(j * BLOCK + BLOCK, p.N_k))]
        if keys:
            s = K[keys] @ Q[r] / np.sqrt(p.d_qk)
            w = np.exp(s - s.max())
            O[r], L[r] = w @ V[keys] / w.sum(), s.max() + np.log(w.sum())
    return O, L


@pytest.mark.parametrize("policy", ["per-query", "group:2", "gather"])
def test_a_row_with_no_selected_key_is_o_zero_l_minus_inf_in_schedule_and_reference(policy):
    p = Problem(N_q=4, N_k=60, d=8)
    r = topk_sparse(p, IDX, block=BLOCK, policy=policy, invalid=-1, count_only=False)
    O, L = _expected(p, IDX)
    assert np.array_equal(r.outputs["O"][1], np.zeros(8)) and r.outputs["L"][1] == -np.inf
    assert np.abs(r.outputs["O"] - O).max() < 1e-12
    assert np.array_equal(np.isneginf(r.outputs["L"]), np.isneginf(L))
    assert np.abs(r.outputs["L"][np.isfinite(L)] - L[np.isfinite(L)]).max() < 1e-12
    assert r.errors == {"O": pytest.approx(0, abs=1e-12), "L": pytest.approx(0, abs=1e-12)} and r.exact


def test_a_row_with_no_selected_key_reads_its_index_words_and_loads_no_key():
    p = Problem(N_q=4, N_k=60, d=8)
    words = topk_sparse(p, IDX, block=BLOCK, policy="per-query", invalid=-1).words
    # per row: Q 8 words and its 2 index words read, O 8 and L 1 written; keys: row 0 blocks 0 and 2 (16 + 16),
    # row 1 none, row 2 block 1 (16), row 3 blocks 0 and 1 (32): 80 keys of 8 words, of K and of V
    assert words == {"Q": 32, "K": 640, "V": 640, "O": 32, "L": 4, "indices": 8}


def test_a_nan_output_is_an_infinite_error_never_equality():
    ref = np.array([[0.0, 0.0], [1.0, 2.0]])
    assert _max_error(np.array([[np.nan, np.nan], [1.0, 2.0]]), ref) == np.inf
    assert _max_error(np.array([-np.inf, 1.0]), np.array([-np.inf, 1.0])) == 0.0
    assert _max_error(np.array([-np.inf, 1.0]), np.array([0.5, 1.0])) == np.inf


LAUNCHER = Path(__file__).resolve().parents[1] / "iosim" / "kernels" / "examples" / "fla_nsa.py"
SEL = [[[[0, 1], [-1, -1], [1, -1], [0, 1]]]]  # (B, H_kv, T_q, S): token 1 selects no block


@pytest.mark.slow
def test_fla_nsa_gives_nan_where_iosim_gives_zero_and_the_comparison_says_so():
    if any(importlib.util.find_spec(m) is None for m in ("triton", "torch", "fla")):
        pytest.skip("triton, torch and fla-core are needed (pip install -e '.[triton,kernel-libs]')")
    from iosim.kernels import count_batch

    params = dict(N=32, N_q=4, d=16, H=16, kv_heads=1, indices=SEL)
    ((counts, _, arrays),) = count_batch([(str(LAUNCHER), None, params)], "triton",
                                         config="num_warps=1,num_ctas=1,num_stages=1")  # fmt: skip
    O_fla, L_fla = np.asarray(arrays["O"], dtype=np.float64), np.asarray(arrays["L"], dtype=np.float64)
    assert np.isnan(O_fla[0, 1]).all() and np.isneginf(L_fla[0, 1]).all()  # 0 / 0 (parallel.py's b_o / b_acc)
    assert np.isfinite(O_fla[0, [0, 2, 3]]).all()
    p = Problem(H_q=16, H_kv=1, N_q=4, N_k=32, d=16, causal=True)
    r = topk_sparse(p, np.array(SEL), policy="gqa", block=BLOCK, invalid=-1, count_only=False)
    assert {k: (a.reads, a.writes) for k, a in counts.per_array.items()} == {
        k: (a.reads, a.writes) for k, a in r.stats.per_array.items()
    }
    # token 1's rows in iosim's order (b, h, t): O = 0, L = -inf; fla's NaN against it is an infinite error
    ours = r.outputs["O"].reshape(16, 4, 16)[:, 1]
    assert np.array_equal(ours, np.zeros((16, 16))) and np.isneginf(r.outputs["L"].reshape(16, 4)[:, 1]).all()
    assert _max_error(O_fla[0, 1], ours) == np.inf
    assert _max_error(L_fla[0, 1], r.outputs["L"].reshape(16, 4)[:, 1]) == 0.0
