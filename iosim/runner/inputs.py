"""The caller's arrays, checked once: one head's Q, K, V, dO (N x d) or a whole problem's, (B, H, N, d) as NumPy,
torch or JAX arrays (anything ``numpy.asarray`` reads; a torch tensor is detached and moved to the CPU first).

A problem's arrays come in the layout its kernels take, (B, H_q, N_q, d_qk) for Q, (B, H_kv, N_k, d_qk) for K,
(B, H_kv, N_k, d_v) for V and (B, H_q, N_q, d_v) for dO; a leading batch or head axis of size 1 may be left out. An
MLA latent problem takes K alone (V is K's first d_v columns; a V that is given must equal them). A paged problem
takes the logical K and V: the run lays them out in pages itself. :func:`problem_arrays` returns them flattened to
the rows the drivers address (batch item, then head, then token), as :func:`iosim.runner.api.run` draws its own.
"""

from __future__ import annotations

import numpy as np

from iosim.base.errors import InputError
from iosim.spec.problem import MAX_DIM, MAX_TOKENS


def as_real_array(name: str, x, what: str) -> np.ndarray:
    """``x`` as a NumPy array of finite real numbers; one line naming ``name`` (and ``what`` it must be) if not."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor (possibly on a device, possibly with grad)
        if getattr(x, "is_meta", False):
            raise InputError(name, f"must be {what} holding data: a meta tensor has none", "a tensor on device meta")
        x = x.detach().cpu()
        if str(getattr(x, "dtype", "")) == "torch.bfloat16":  # NumPy has no bfloat16: widen first
            x = x.float()
    try:
        a = np.asarray(x)
    except (TypeError, ValueError, RuntimeError) as e:
        raise InputError(name, f"must be {what}", type(x).__name__) from e
    if a.dtype == np.bool_ or np.iscomplexobj(a) or not (np.issubdtype(a.dtype, np.number) or a.dtype.kind == "V"):
        raise InputError(name, "must hold real numbers", f"dtype {a.dtype}")
    if a.dtype.kind == "V" or a.dtype.itemsize < 4:  # ml_dtypes' bfloat16 / fp8 and float16: widen for the checks
        a = a.astype(np.float32)
    if not np.all(np.isfinite(a)):
        raise InputError(name, "must hold only finite values (no NaN or inf)", "non-finite entries")
    return a


def problem_arrays(p, Q, K, V, dO=None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """The caller's Q, K, V (and dO) for the problem ``p`` (an :class:`iosim.spec.problem.Problem`), checked against its
    shapes and flattened to (B H N) x d rows: one line naming the array and the shape it must have when one
    disagrees."""
    if Q is None or K is None or (V is None and not p.latent):
        missing = [n for n, x in (("Q", Q), ("K", K), ("V", V)) if x is None and not (n == "V" and p.latent)]
        raise InputError(missing[0], "must be given together with Q, K and V (or none of them: drawn from seed)")
    want = {
        "Q": (p.B, p.H_q, p.N_q, p.d_qk),
        "K": (p.B, p.H_kv, p.N_k, p.d_qk),
        "V": (p.B, p.H_kv, p.N_k, p.d_v),
        "dO": (p.B, p.H_q, p.N_q, p.d_v),
    }
    out = {}
    for name, x in (("Q", Q), ("K", K), ("V", V), ("dO", dO)):
        if x is None:
            continue
        shape = want[name]
        a = as_real_array(name, x, f"an array of shape (B, H, N, d) = {shape}")
        full = a.reshape((1,) * (4 - a.ndim) + a.shape) if 2 <= a.ndim <= 4 else a
        if full.shape != shape:
            raise InputError(name, f"must have the shape (B, H, N, d) = {shape} for {p}", f"shape {a.shape}")
        out[name] = np.ascontiguousarray(full.reshape(-1, shape[3]), dtype=np.float64)
    if p.latent:
        latent_v = np.ascontiguousarray(out["K"][:, : p.d_v])
        if "V" in out and not np.array_equal(out["V"], latent_v):
            raise InputError(
                "V", f"must equal K's first d_v = {p.d_v} columns for an MLA latent problem (or be left out)"
            )
        out["V"] = latent_v
    return out["Q"], out["K"], out["V"], out.get("dO")


def check_arrays(Q, K, V, N, d) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """One head's Q, K, V (N x d each), read as :func:`as_real_array` reads a problem's arrays (torch tensors with
    grad or on a device, bfloat16 and fp8 widened), with one line naming the array when one is not."""
    arrays = {}
    for name, x in (("Q", Q), ("K", K), ("V", V)):
        if x is None:
            raise InputError(name, "must be given together with Q, K and V (or none of them, with N and d)")
        a = as_real_array(name, x, "a 2-D array of real numbers of shape (N, d)")
        if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
            raise InputError(name, "must be a non-empty 2-D array of shape (N, d)", f"shape {a.shape}")
        arrays[name] = a
    shape = arrays["Q"].shape
    for name in ("K", "V"):
        if arrays[name].shape != shape:
            raise InputError(name, f"must have the shape of Q {shape}", f"shape {arrays[name].shape}")
    if shape[0] > MAX_TOKENS or shape[1] > MAX_DIM:
        raise InputError("Q", f"must have at most {MAX_TOKENS:,} rows and {MAX_DIM:,} columns", f"shape {shape}")
    if N is not None and N != shape[0]:
        raise InputError("N", f"must match the rows of Q ({shape[0]}) when arrays are given", N)
    if d is not None and d != shape[1]:
        raise InputError("d", f"must match the columns of Q ({shape[1]}) when arrays are given", d)
    return arrays["Q"], arrays["K"], arrays["V"], shape[0], shape[1]


def check_dO(dO, N: int, d: int) -> np.ndarray:
    """The upstream gradient dO: validated like Q, K, V (shape N x d, real, finite)."""
    a = as_real_array("dO", dO, "a 2-D array of real numbers")
    if a.ndim != 2 or a.shape != (N, d):
        raise InputError("dO", f"must be a 2-D array of the shape of Q ({N}, {d})", f"shape {a.shape}")
    return a
