"""Golden float64 NumPy attention: the reference every algorithm and kernel is checked against.

O = softmax(scale * Q K^T + mask) V, with the row logsumexp L = logsumexp(scale * Q K^T + mask) (natural log).
The causal mask lets row r see columns c <= r. Inputs are promoted to float64 whatever their dtype.
``mask`` (optional, a boolean N x N array, True = allowed; :meth:`iosim.algorithms.masks.TileMask.dense`) forbids
scores as the causal mask does; a row with no allowed entry has O = 0, L = -inf and zero gradients.

Backward (FlashAttention paper, appendix B.2), for an upstream gradient dO = dLoss/dO:
dV = P^T dO, dP = dO V^T, D = rowsum(dO o O), dS = P o (dP - D), dQ = scale dS K, dK = scale dS^T Q.
"""

from __future__ import annotations

import numpy as np


def default_scale(d: int) -> float:
    """FlashAttention's softmax scale tau = 1 / sqrt(d)."""
    return 1.0 / np.sqrt(d)


def _scores(Q, K, scale, causal, mask=None):  # noqa: N803
    Q = np.asarray(Q, dtype=np.float64)
    K = np.asarray(K, dtype=np.float64)
    S = scale * (Q @ K.T)
    if causal:
        n, nk = S.shape
        S = np.where(np.tril(np.ones((n, nk), dtype=bool)), S, -np.inf)
    if mask is not None:
        S = np.where(mask, S, -np.inf)
    return S


def _row_max(S):
    """Row maxima, 0 for a row with no allowed entry (its exp(S - m) is then 0 everywhere, never NaN)."""
    m = S.max(axis=1, keepdims=True)
    return np.where(np.isneginf(m), 0.0, m)


def attention_forward(Q, K, V, scale: float | None = None, causal: bool = False, mask=None):  # noqa: N803
    """Return (O, L): the attention output (N x d) and the row logsumexp (N,), in float64."""
    d = np.shape(Q)[1]
    scale = default_scale(d) if scale is None else scale
    S = _scores(Q, K, scale, causal, mask)
    m = _row_max(S)
    P = np.exp(S - m)
    l_row = P.sum(axis=1, keepdims=True)
    # a fully masked row (l = 0) gets O = 0
    O = (P / np.where(l_row > 0, l_row, 1.0)) @ np.asarray(V, dtype=np.float64)  # noqa: E741
    with np.errstate(divide="ignore"):
        L = (m + np.log(l_row))[:, 0]  # a fully masked row: log 0 = -inf
    return O, L


def attention_backward(Q, K, V, dO, scale: float | None = None, causal: bool = False, mask=None):  # noqa: N803
    """Return (dQ, dK, dV), the gradients of sum(O o dO) with respect to Q, K and V, in float64.

    Masked entries have P = 0, hence dS = 0: the mask needs no separate treatment here.
    """
    d = np.shape(Q)[1]
    scale = default_scale(d) if scale is None else scale
    Q, K, V, dO = (np.asarray(x, dtype=np.float64) for x in (Q, K, V, dO))
    P = _scores(Q, K, scale, causal, mask)
    P -= _row_max(P)
    np.exp(P, out=P)
    l_row = P.sum(axis=1, keepdims=True)
    P /= np.where(l_row > 0, l_row, 1.0)  # a fully masked row stays 0
    O = P @ V  # noqa: E741
    dV = P.T @ dO
    dS = dO @ V.T  # dP, overwritten in place by dS
    dS -= np.einsum("ij,ij->i", dO, O)[:, None]  # dP - D with D = rowsum(dO o O)
    dS *= P
    dQ = scale * (dS @ K)
    dK = scale * (dS.T @ Q)
    return dQ, dK, dV


def naive_forward(Q, K, V, scale, causal, dtype):  # noqa: N803
    """Plain attention computed in ``dtype`` (the FlashAttention rule's same-precision baseline): O, L and P.

    Works on (..., N, d) arrays.
    """
    dtype = np.dtype(dtype)
    Q, K, V = (np.asarray(x, dtype=dtype) for x in (Q, K, V))
    S = (Q @ np.swapaxes(K, -1, -2)) * dtype.type(scale)
    if causal:
        S = np.where(np.tril(np.ones(S.shape[-2:], dtype=bool)), S, dtype.type(-np.inf))
    m = S.max(axis=-1, keepdims=True)
    P = np.exp(S - m)
    s = P.sum(axis=-1, keepdims=True)
    return (P / s) @ V, (m + np.log(s))[..., 0], P / s


def naive_backward(Q, K, V, dO, P, scale, dtype):  # noqa: N803
    """Plain attention backward in ``dtype`` from the naive forward's P: (dQ, dK, dV) on (..., N, d) arrays."""
    dtype = np.dtype(dtype)
    Q, K, V, dO = (np.asarray(x, dtype=dtype) for x in (Q, K, V, dO))
    O = P @ V
    dV = np.swapaxes(P, -1, -2) @ dO
    dP = dO @ np.swapaxes(V, -1, -2)
    D = np.sum(dO * O, axis=-1, keepdims=True)
    dS = P * (dP - D) * dtype.type(scale)
    return dS @ K, np.swapaxes(dS, -1, -2) @ Q, dV
