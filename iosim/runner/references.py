"""The float64 references a run's outputs are checked against, over one head (:mod:`iosim.algorithms.reference`) or
a whole problem (head by head, each query head against its key/value head), and how an error is measured."""

from __future__ import annotations

import numpy as np

from iosim.algorithms.reference import attention_backward, attention_forward
from iosim.spec.problem import Problem


def logsumexp_error(L, L_ref) -> float:
    """max |L - L_ref|, where a fully masked row's -inf must match exactly (then it counts as 0)."""
    same_inf = np.isneginf(L) & np.isneginf(L_ref)
    with np.errstate(invalid="ignore"):
        return float(np.max(np.where(same_inf, 0.0, np.abs(L - L_ref)), initial=0.0))


def all_finite(outputs: dict, names) -> bool:
    """Every output finite; L may be -inf (a fully masked row's logsumexp), never NaN or +inf."""

    def ok(name, x):
        return bool(np.all(np.isfinite(x) | (np.isneginf(x) if name == "L" else False)))

    return all(outputs.get(n) is None or ok(n, outputs[n]) for n in names)


class _QueryRows:
    """A mask over the whole sequence (N_k x N_k) as a problem's queries see it: query row q is its row q + offset
    (the reference's ``rows(r0, r1)``)."""

    def __init__(self, mask, offset: int) -> None:
        self.mask, self.offset = mask, offset

    def rows(self, r0: int, r1: int) -> np.ndarray:
        return self.mask.rows(r0 + self.offset, r1 + self.offset)


def _shape(p: Problem, mask, b: int, h: int) -> dict:
    """The reference's mask arguments for query head (b, h): the causal field, the mask's last N_q rows, or (a
    group's mask over its packed rows, one key/value head) the head's own N_q rows of it."""
    if mask is None:
        return dict(causal=p.causal, offset=p.offset)
    if getattr(mask, "packed_rows", 0):
        return dict(mask=_QueryRows(mask, (b * p.H_q + h) * p.N_q))
    return dict(mask=_QueryRows(mask, p.offset))


def problem_reference(p: Problem, Q, K, V, scale: float, mask=None):
    """The float64 reference of a problem, head by head: query head h uses key/value head h // g; causal is
    bottom-right (offset N_k - N_q); ``mask``: a TileMask over N_k x N_k whose last N_q rows are the queries'.
    Returns (O, L) in (b, h_q, r) row order."""
    O = np.empty((Q.shape[0], p.d_v))
    L = np.empty(Q.shape[0])
    for b in range(p.B):
        for h in range(p.H_q):
            q = (b * p.H_q + h) * p.N_q
            k = (b * p.H_kv + h // p.g) * p.N_k
            O[q : q + p.N_q], L[q : q + p.N_q] = attention_forward(
                Q[q : q + p.N_q], K[k : k + p.N_k], V[k : k + p.N_k], scale=scale, **_shape(p, mask, b, h)
            )
    return O, L


def problem_reference_backward(p: Problem, Q, K, V, dO, scale: float, mask=None):
    """The float64 reference gradients of a problem, head by head (as :func:`problem_reference`): dQ in (b, h_q, r)
    row order; dK, dV in (b, h_kv, c) order, each key/value head's the sum over its g query heads. ``mask``: as
    :func:`problem_reference`, in place of the causal field."""
    dQ = np.empty_like(Q, dtype=np.float64)
    dK = np.zeros(K.shape)
    dV = np.zeros(V.shape)
    for b in range(p.B):
        for h in range(p.H_q):
            q = slice((b * p.H_q + h) * p.N_q, (b * p.H_q + h + 1) * p.N_q)
            k0 = (b * p.H_kv + h // p.g) * p.N_k
            k = slice(k0, k0 + p.N_k)
            dq, dk, dv = attention_backward(Q[q], K[k], V[k], dO[q], scale=scale, **_shape(p, mask, b, h))
            dQ[q] = dq
            dK[k] += dk
            dV[k] += dv
    return dQ, dK, dV
