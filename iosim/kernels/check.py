"""Numerical cross-check of any attention implementation against a golden reference.

:func:`check` runs a callable over a grid of cases (input distribution x shape x causal), forward and, where the
callable offers one, backward, and compares every output element with the golden result of
:mod:`iosim.algorithms.reference`: float64 for float32, float16 and bfloat16 kernels, and for float64 kernels an
extended-precision golden (longdouble with exact products, ``precision="extended"``) so that a float64 kernel is
judged against something more precise than itself.

The bound
---------
An element passes when its error is within the larger of two terms:

    |out - golden| <= max(rule, floor)

* **rule** (the FlashAttention test rule, as in the flash-attn test suite): factor x max|naive - golden| over the
  output, where *naive* is plain attention in the same precision (S = Q K^T, softmax, P V; float16 and bfloat16
  emulated in float32, rounded to the dtype wherever a kernel stores a value: S, P, O, dP, dS and the gradients,
  :func:`~iosim.algorithms.reference.naive_forward`).
  factor is 2 for forward outputs and 3 for gradients. The rule alone collapses where the naive baseline happens to
  be exact: at N = 1 the exact dQ and dK are 0 and the naive result lands on 0, so the allowed error would be 0.
* **floor**: FLOOR_FACTOR x a first-order bound on the error of a computation that rounds each stored intermediate
  once to the dtype (unit roundoff u: 2^-53, 2^-24, 2^-11, 2^-8 for float64, float32, float16, bfloat16) and
  accumulates each sum of n terms in its accumulator (unit roundoff v: float32's 2^-24 for float32, float16 and
  bfloat16, as GPU kernels and tensor cores do; 2^-53 for float64) with an error of g(n) = u + sqrt(n) v times the
  sum of its absolute terms: one rounding of the result, and the probabilistic sqrt(n) growth of a sum's rounding
  errors (Higham & Mary, SIAM J. Sci. Comput. 2019) rather than the worst case n. Per element, with P, O, L the
  golden values and |.| elementwise:

  - scores S_rc = scale sum_k Q_rk K_ck: |dS_rc| <= e_rc = (2u + sqrt(d) v) scale sum_k |Q_rk| |K_ck|, the 2u for
    S's rounding and for the scale's (applied to Q, or as sqrt(scale) to Q and K);
  - softmax: P_rc = exp(S_rc - L_r) moves by P_rc (dS_rc - sum_c' P_rc' dS_rc') = P_rc sum_c' P_rc' (dS_rc - dS_rc'),
    so |dP_rc| <= eP_rc = P_rc ((1 - P_rc) e_rc + s_r - P_rc e_rc + u + u |L_r|) with s_r = sum_c P_rc e_rc (a
    row with one visible key has P = 1 whatever its score: no score term), u for P's own rounding, and u |L_r| for
    a kernel that normalises with a stored, rounded row statistic (P = exp(S - L), or exp(S - m) / l) rather than
    the sum of its own exponentials: that error is common to the row and no normalisation cancels it;
  - O_rk = sum_c P_rc V_ck: floor(O_rk) = sum_c (eP_rc + g(N_k) P_rc) |V_ck|;
  - L_r = logsumexp_c S_rc moves by sum_c P_rc dS_rc: floor(L_r) = s_r + u |L_r|;
  - backward, dP = dO V^T, D = rowsum(dO o O), dS = P o (dP - D), with P recomputed as exp(S - L) from the
    stored L (FlashAttention's backward), whose rounding and scores are not those of the forward:
    eP_rc = P_rc (e_rc + s_r + u |L_r| + u) (not centred);
    eD_r = sum_k |dO_rk| floor(O_rk) + g(d) sum_k |dO_rk O_rk|;
    edS_rc = eP_rc |dP_rc - D_r| + P_rc (g(d) sum_k |dO_rk| |V_ck| + eD_r) + u |dS_rc|;
    floor(dV) = eP^T |dO| + g(N_q) P^T |dO|, floor(dQ) = scale (edS + g(n) |dS|) |K|,
    floor(dK) = scale (edS + g(n) |dS|)^T |Q| with n = max(N_q, N_k) (grouped-query heads: summed over the group).

  The floor never collapses: it is at least u times the magnitude of each output's operands (u sum_c P_rc |V_ck|
  for O, the analogous sums for the gradients), an error no implementation rounding to the dtype can avoid.
  FLOOR_FACTOR = 2 covers the second-order terms and summation orders less kind than the probabilistic rule.

Each report row is one output of one case; it shows the element nearest its bound (largest error / bound), its
error, the naive error, the rule and the floor at that element, and which of the two set the bound there. A row
also fails (with a note) when the output has the wrong shape, is missing or not finite where the golden is, or when
the callable raised: a report row, never an exception (except iosim's own InputError and CapacityError, which
a built-in kernel raises for a bad configuration such as too small an M).

Input distributions (``distributions``; all by default)
-------------------------------------------------------
``normal`` standard normal Q, K, V, dO; ``large`` Q and K times 10, so scale x Q K^T (scale = 1/sqrt(d)) has
standard deviation 100: logits in the hundreds, which overflow an unstabilised softmax in float16 and
float32; ``near-ties`` every key within 1e-2 of one key (scores nearly tied in every row); ``dominant`` one
visible key per row whose score leads the others by about 8; ``masked-rows`` N_q > N_k, so that under the
bottom-right causal alignment the first N_q - N_k rows see no key (O = 0, L = -inf, zero gradients); ``long-n``
N = 1536, d = 2; ``wide-d`` N = 9, d = 512. The failing rows name their distribution.

Calling convention of ``fn``
----------------------------
``fn(Q, K, V, *, causal: bool, scale: float)`` with Q of shape (B, H, N_q, d) and K, V of shape (B, H_kv, N_k, d)
(``layout="BHND"``, the default) or (B, N_q, H, d) and (B, N_k, H_kv, d) (``layout="BNHD"``, flash-attn's), in the
array type chosen by ``inputs`` (NumPy by default) and dtype ``dtype`` (bfloat16 NumPy arrays are ``ml_dtypes``
arrays; ``inputs="torch"`` gives torch.bfloat16 tensors). H_kv = ``heads_kv`` divides H (grouped-query attention:
query head h uses key/value head h // (H / H_kv)). It returns O (the layout of Q), or a tuple (O, L), or a dict
with "O" and optionally "L" (the row logsumexp, shape (B, H, N_q), natural log, of scale * Q K^T with the causal
mask; +inf or -inf for a row that sees no key). Causal: row r sees columns c <= r + N_k - N_q
(``causal_align="bottom-right"``, FlashAttention's) or c <= r (``"top-left"``, PyTorch's ``is_causal``); the two
agree when N_q = N_k. The backward, when offered, is ``fn.backward`` or the ``backward=`` argument:
``backward(Q, K, V, O, dO, L, *, causal, scale)`` with the forward's own O and L (as ``fn`` returned them; L may
be None) and the upstream gradient dO; it returns (dQ, dK, dV) or a dict with those keys. A callable that needs
N_q = N_k sets ``fn.equal_lengths = True`` (or pass ``equal_lengths=True``). Outputs may be NumPy arrays,
objects exposing ``__cuda_array_interface__`` (Numba, CuPy, PyTorch CUDA tensors), PyTorch tensors (bfloat16
included), JAX arrays or DLPack-capable arrays, contiguous or not; they are copied to NumPy for the comparison.

>>> import numpy as np, iosim
>>> def naive(Q, K, V, *, causal, scale):
...     S = scale * Q @ np.swapaxes(K, -1, -2)
...     if causal:
...         S = np.where(np.tril(np.ones(S.shape[-2:], bool)), S, -np.inf)
...     P = np.exp(S - S.max(-1, keepdims=True))
...     return (P / P.sum(-1, keepdims=True)) @ V
>>> iosim.check(naive, quick=True, equal_lengths=True).passed
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from iosim.algorithms.reference import (
    FLUSH,
    attention_forward,
    attention_forward_backward,
    default_scale,
    naive_backward,
    naive_forward,
)
from iosim.base.errors import InputError
from iosim.memory_model import CapacityError

DEFAULT_N = (1, 17, 113, 203, 1023)
DEFAULT_D = (16, 59, 64, 128)
QUICK_N = (1, 17, 33)
QUICK_D = (16, 59)
FORWARD_FACTOR = 2.0
BACKWARD_FACTOR = 3.0
FLOOR_FACTOR = 2.0
ACCUMULATOR_U = 2.0**-24  # float32 accumulators for float32, float16 and bfloat16
INPUT_KINDS = ("numpy", "numba", "cupy", "torch")
DTYPES = ("float64", "float32", "float16", "bfloat16")
LAYOUTS = ("BHND", "BNHD")
ALIGNS = ("bottom-right", "top-left")
DISTRIBUTIONS = ("normal", "large", "near-ties", "dominant", "masked-rows", "long-n", "wide-d")
LARGE = 10.0  # Q and K are multiplied by this in "large": scale * q.k has standard deviation LARGE^2
TIE = 1e-2  # keys within this of one key in "near-ties"
LEAD = 8.0  # the dominant key's score lead in "dominant"
LONG = (1536, 2)  # (N, d) of "long-n"
WIDE = (9, 512)  # (N, d) of "wide-d"
OUTPUTS = ("O", "L", "dQ", "dK", "dV")
USER_ERRORS = (InputError, CapacityError)  # raised by iosim's own kernels for a bad configuration: not caught


@dataclass(frozen=True)
class Case:
    """One input draw: a distribution, the lengths N_q and N_k, the head dimension d and the causal flag."""

    distribution: str
    N_q: int
    N_k: int
    d: int
    causal: bool


@dataclass(frozen=True)
class OutputCheck:
    """One output of one case: the element nearest its bound, with its error, the naive same-precision
    baseline's error (the whole output's maximum), the rule and the floor there; ``note`` says why a row failed
    without a comparison (wrong shape, missing output, the callable raised)."""

    passname: str
    N: int
    d: int
    causal: bool
    output: str
    error: float
    baseline: float
    bound: float
    distribution: str = "normal"
    N_k: int | None = None
    rule: float = 0.0
    floor: float = 0.0
    where: str = ""
    note: str = ""
    all_within: bool = True  # every element within max(rule, its floor)

    @property
    def set_by(self) -> str:
        """Which term set the bound at the reported element: "rule" or "floor" ("-" for a row with a note)."""
        if self.note:
            return "-"
        return "rule" if self.rule >= self.floor else "floor"

    @property
    def passed(self) -> bool:
        return not self.note and self.all_within and bool(self.error <= self.bound)  # NaN fails


@dataclass
class CheckReport:
    """What :func:`check` returns: one row per (case, output); ``passed`` when every row passes."""

    name: str
    dtype: str
    batch: int
    heads: int
    rows: list[OutputCheck] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    heads_kv: int | None = None
    layout: str = "BHND"
    causal_align: str = "bottom-right"

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows)

    @property
    def failures(self) -> list[OutputCheck]:
        return [r for r in self.rows if not r.passed]

    def table(self, fmt: str = "simple", failures_only: bool = False) -> str:
        from tabulate import tabulate

        rows = [
            [
                r.distribution,
                r.N,
                r.N if r.N_k is None else r.N_k,
                r.d,
                "yes" if r.causal else "no",
                r.passname,
                r.output,
                f"{r.error:.2e}",
                f"{r.baseline:.2e}",
                f"{r.rule:.2e}",
                f"{r.floor:.2e}",
                r.set_by,
                "ok" if r.passed else "FAIL",
                r.note or r.where,
            ]
            for r in (self.failures if failures_only else self.rows)
        ]
        headers = ["inputs", "N_q", "N_k", "d", "causal", "pass", "output", "err", "naive err", "rule", "floor"]
        headers += ["bound by", "", "at (b, h, row) / note"]
        return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)

    def summary(self) -> str:
        n_fail = len(self.failures)
        verdict = "PASSED" if self.passed else f"FAILED ({n_fail} of {len(self.rows)} outputs)"
        if not self.rows:
            verdict = "NOTHING CHECKED"
        kv = "" if self.heads_kv in (None, self.heads) else f", H_kv={self.heads_kv}"
        return (
            f"{self.name}: {verdict} -- {self.dtype}, {self.layout}, B={self.batch}, H={self.heads}{kv}, causal "
            f"{self.causal_align}; bound = max(rule: {FORWARD_FACTOR:g}x (gradients {BACKWARD_FACTOR:g}x) the naive "
            f"{self.dtype} error, floor: {FLOOR_FACTOR:g}x the first-order rounding bound)"
        )

    def __str__(self) -> str:
        return self.table() + "\n" + self.summary()


# --- arrays in and out ----------------------------------------------------------------------------------------------


def _dtype(dtype) -> tuple[str, np.dtype, float]:
    """(name, NumPy dtype, unit roundoff u) of an accepted dtype; InputError naming the accepted ones otherwise."""
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None) or str(dtype)
    name = name.removeprefix("torch.").removeprefix("jnp.")
    if name not in DTYPES:
        raise InputError("dtype", f"must be one of {', '.join(DTYPES)}", dtype)
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as e:  # a runtime dependency; only a broken install lacks it
            raise InputError("dtype", 'bfloat16 needs ml_dtypes: pip install "ml_dtypes"', dtype) from e
        np_dtype = np.dtype(ml_dtypes.bfloat16)
        eps = float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps)
    else:
        np_dtype = np.dtype(name)
        eps = float(np.finfo(np_dtype).eps)
    return name, np_dtype, eps / 2


def to_numpy(x) -> np.ndarray:
    """Copy any supported array (NumPy, CuPy, PyTorch incl. bfloat16, JAX, __cuda_array_interface__, DLPack) to a
    NumPy array."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # PyTorch
        t = x.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":  # NumPy has no bfloat16: widen (exactly) to float32
            t = t.float()
        return t.numpy()
    if hasattr(x, "copy_to_host"):  # Numba device array
        return x.copy_to_host()
    if hasattr(x, "get") and hasattr(x, "__cuda_array_interface__"):  # CuPy
        return x.get()
    if hasattr(x, "__cuda_array_interface__"):
        from numba import cuda

        return cuda.as_cuda_array(x).copy_to_host()
    if hasattr(x, "__array__"):  # JAX and other array libraries (bfloat16 arrives as an ml_dtypes array)
        return np.asarray(x)
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    return np.asarray(x)


def _need(module: str, parameter: str, value, how: str):
    """Import ``module`` or raise an InputError naming the package (not a ModuleNotFoundError traceback)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise InputError(parameter, f"{value!r} needs the package {module}, which is not installed: {how}") from None


def _converter(inputs) -> Callable[[np.ndarray], object]:
    if callable(inputs):
        return inputs
    if not isinstance(inputs, str):
        raise InputError("inputs", f"must be one of {', '.join(INPUT_KINDS)} or a callable", type(inputs).__name__)
    if inputs == "numpy":
        return lambda a: a
    if inputs == "numba":
        from numba import cuda

        return cuda.to_device
    if inputs == "cupy":
        cupy = _need("cupy", "inputs", "cupy", "pip install cupy-cuda12x (or the build for your CUDA)")
        return cupy.asarray
    if inputs == "torch":
        torch = _need("torch", "inputs", "torch", "pip install torch")

        device = "cuda" if torch.cuda.is_available() else "cpu"

        def to_torch(a):
            if a.dtype.name == "bfloat16":  # torch.from_numpy knows no ml_dtypes: go through float32 (exact)
                return torch.from_numpy(a.astype(np.float32)).to(device=device, dtype=torch.bfloat16)
            return torch.from_numpy(a).to(device)

        return to_torch
    raise InputError("inputs", f"must be one of {', '.join(INPUT_KINDS)} or a callable", inputs)


def _unpack(out, names: tuple[str, ...]) -> dict:
    """A callable's result as a dict: a bare array is the first name, a tuple names its items in order."""
    if isinstance(out, dict):
        return {n: out.get(n) for n in names}
    if isinstance(out, (tuple, list)):
        return {n: (out[i] if i < len(out) else None) for i, n in enumerate(names)}
    return {names[0]: out, **{n: None for n in names[1:]}}


# --- inputs ---------------------------------------------------------------------------------------------------------


def _draw(case: Case, rng, B: int, H: int, H_kv: int, scale: float, offset: int) -> tuple[np.ndarray, ...]:
    """Q, dO (B, H, N_q, d) and K, V (B, H_kv, N_k, d) in float64, drawn from ``case.distribution``."""
    Q = rng.standard_normal((B, H, case.N_q, case.d))
    K = rng.standard_normal((B, H_kv, case.N_k, case.d))
    V = rng.standard_normal((B, H_kv, case.N_k, case.d))
    dO = rng.standard_normal((B, H, case.N_q, case.d))
    if case.distribution == "large":
        Q *= LARGE
        K *= LARGE
    elif case.distribution == "near-ties":
        K = K[:, :, :1, :] + TIE * K
    elif case.distribution == "dominant" and case.N_k:
        # row r: a key j_r it can see gets a score lead of about LEAD (Q_r += LEAD / scale * K_j / |K_j|^2)
        last = np.arange(case.N_q) + offset if case.causal else np.full(case.N_q, case.N_k - 1)
        j = (rng.random(case.N_q) * (np.clip(last, 0, case.N_k - 1) + 1)).astype(int)
        group = H // H_kv
        for h in range(H):
            Kj = K[:, h // group, j, :]
            Q[:, h] += LEAD / scale * Kj / np.maximum(np.sum(Kj * Kj, axis=-1, keepdims=True), 1e-30)
    return Q, K, V, dO


def _cases(Ns, ds, causals, distributions, quick: bool, explicit: bool, equal_lengths: bool) -> list[Case]:
    """The grid: ``normal`` on every N x d (and two N_q != N_k pairs), the other distributions on a few shapes."""
    out: list[Case] = []
    small = [n for n in Ns if n > 1][:2] or list(Ns)
    for dist in distributions:
        if dist == "normal":
            shapes = [(n, n, dd) for n in Ns for dd in ds]
            if not equal_lengths and not explicit and len(small) > 1:
                shapes += [(small[0], small[1], ds[-1]), (small[1], small[0], ds[0])]
        elif dist == "masked-rows":
            if equal_lengths:
                continue
            shapes = [(n, max(1, n // 3), dd) for n in small for dd in ds[:1]]
        elif dist == "long-n":
            shapes = [] if quick or explicit else [(LONG[0], LONG[0], LONG[1])]
        elif dist == "wide-d":
            shapes = [] if quick or explicit else [(WIDE[0], WIDE[0], WIDE[1])]
        elif explicit:
            shapes = [(n, n, dd) for n in Ns for dd in ds]
        else:  # quick: one small shape (cheap on the CUDA simulator); else two N x two d
            shapes = [(n, n, dd) for n in small[: 1 if quick else 2] for dd in ds[: 1 if quick else 2]]
        out += [Case(dist, nq, nk, dd, bool(c)) for nq, nk, dd in shapes for c in causals]
    return out


# --- golden, naive, floors --------------------------------------------------------------------------------------------


def _golden(Q, K, V, dO, scale, causal, offset, H_kv, precision, with_backward):
    """Golden O, L (and dQ, dK, dV) per (b, h), as float64 arrays (K/V heads shared by groups of query heads)."""
    B, H, N_q, d = Q.shape
    group = H // H_kv
    out = {"O": np.empty((B, H, N_q, V.shape[-1])), "L": np.empty((B, H, N_q)), "dQ": np.empty(Q.shape)}
    out["dK"], out["dV"] = np.zeros(K.shape), np.zeros(V.shape)
    kw = dict(scale=scale, causal=causal, offset=offset, precision=precision)
    for b in range(B):
        for h in range(H):
            g = h // group
            if not with_backward:
                out["O"][b, h], out["L"][b, h] = attention_forward(Q[b, h], K[b, g], V[b, g], **kw)
                continue
            O, L, dQ, dK, dV = attention_forward_backward(Q[b, h], K[b, g], V[b, g], dO[b, h], **kw)
            out["O"][b, h], out["L"][b, h], out["dQ"][b, h] = O, L, dQ
            out["dK"][b, g] += dK
            out["dV"][b, g] += dV
    return out


def _keep(N_q: int, N_k: int, causal: bool, offset: int) -> np.ndarray:
    if not causal:
        return np.ones((N_q, N_k), dtype=bool)
    return np.arange(N_k)[None, :] <= (np.arange(N_q) + offset)[:, None]


def _floors(Q, K, V, dO, gold, scale, causal, offset, H_kv, u, v, with_backward) -> dict[str, np.ndarray]:
    """FLOOR_FACTOR x the first-order rounding bound of the module docstring, per output element (u: the dtype's
    unit roundoff, v: the accumulator's)."""
    B, H, N_q, d = Q.shape
    N_k = K.shape[2]
    group = H // H_kv

    def g(n: int) -> float:  # a sum of n terms: its result's rounding and the sqrt(n) growth of its errors
        return u + np.sqrt(n) * v

    keep = _keep(N_q, N_k, causal, offset)
    f = {"O": np.empty((B, H, N_q, V.shape[-1])), "L": np.empty((B, H, N_q)), "dQ": np.empty(Q.shape)}
    f["dK"], f["dV"] = np.zeros(K.shape), np.zeros(V.shape)
    for b in range(B):
        for h in range(H):
            # magnitudes need no more than float32 (relative error 1e-6 on a bound); P from the golden L
            g_h = h // group
            q, k, vv, do, O = (x.astype(np.float32) for x in (Q[b, h], K[b, g_h], V[b, g_h], dO[b, h], gold["O"][b, h]))
            L = gold["L"][b, h]
            seen = np.isfinite(L)[:, None]
            Z = np.float32(scale) * (q @ k.T) - np.where(seen, L[:, None], 0).astype(np.float32)
            Z[~(keep & seen) | (Z < FLUSH)] = -np.inf  # P < e^-60 adds nothing to a bound; it would be subnormal
            P = np.exp(Z)
            aq, ak, av, aO = np.abs(q), np.abs(k), np.abs(vv), np.abs(O)
            e = np.float32((2 * u + np.sqrt(d) * v) * scale) * (aq @ ak.T)
            Pe = P * e
            s = Pe.sum(axis=1, keepdims=True)
            aL = np.float32(u) * (1 + np.where(seen, np.abs(L[:, None]), 0).astype(np.float32))  # u (1 + |L_r|)
            eP = P * ((1 - P) * e + (s - Pe) + aL)  # centred: no score term where P_rc = 1
            fO = (eP + np.float32(g(N_k)) * P) @ av
            f["O"][b, h] = fO
            f["L"][b, h] = s[:, 0] + u * np.where(np.isfinite(L), np.abs(L), 0)
            if not with_backward:
                continue
            ado = np.abs(do)
            # a backward recomputes P = exp(S - L) from its own scores and the stored, rounded L
            eP = P * (e + s + aL)
            dPD = do @ vv.T - np.sum(do * O, axis=1, keepdims=True)
            adS = np.abs(P * dPD)
            eD = np.sum(ado * fO, axis=1, keepdims=True) + np.float32(g(d)) * np.sum(ado * aO, axis=1, keepdims=True)
            edS = eP * np.abs(dPD) + P * (np.float32(g(d)) * (ado @ av.T) + eD) + np.float32(u) * adS
            f["dV"][b, h // group] += (eP + np.float32(g(N_q)) * P).T @ ado
            edS += np.float32(g(max(N_q, N_k))) * adS  # the sums of dQ (N_k terms) and dK (N_q terms): the longer
            f["dQ"][b, h] = scale * (edS @ ak)
            f["dK"][b, h // group] += scale * (edS.T @ aq)
    return {name: FLOOR_FACTOR * x for name, x in f.items()}


def _naive(Q, K, V, dO, scale, causal, offset, H_kv, np_dtype, with_backward):
    """The same-precision naive baseline on the whole (B, H, ...) batch, K/V heads repeated for each group."""
    group = Q.shape[1] // H_kv
    Ke, Ve = (np.repeat(x, group, axis=1) for x in (K, V))
    O, L, P = naive_forward(Q, Ke, Ve, scale, causal, np_dtype, offset=offset)
    out = {"O": O, "L": L}
    if with_backward:
        dQ, dK, dV = naive_backward(Q, Ke, Ve, dO, P, scale, np_dtype)
        B, _, N_k, d = K.shape
        out["dQ"] = dQ
        out["dK"] = dK.astype(np.float64).reshape(B, H_kv, group, N_k, d).sum(axis=2)
        out["dV"] = dV.astype(np.float64).reshape(B, H_kv, group, N_k, V.shape[-1]).sum(axis=2)
    return out


def _abs_err(x: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|x - ref| elementwise; where ref is -inf (a row that sees no key: L) either infinity is right; NaN is inf."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        err = np.abs(x - ref)
    infinite = np.isinf(ref)
    err = np.where(infinite, np.where(np.isinf(x), 0.0, np.inf), err)
    return np.where(np.isnan(err), np.inf, err)


# --- the check --------------------------------------------------------------------------------------------------------


MAX_SIZE = 1 << 20  # N, d, batch and heads of a check (the arrays are checked against memory as well)


def _positive_ints(label: str, values, limit: int = MAX_SIZE) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        values = (values,) if isinstance(values, (int, np.integer)) and not isinstance(values, bool) else None
        if values is None:
            raise InputError(label, f"must be one or more integers from 1 to {limit:,}", values)
    values = tuple(values)
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 < v <= limit]
    if not values or bad:
        raise InputError(label, f"must be one or more integers from 1 to {limit:,}", values)
    return tuple(int(v) for v in values)


def _positive_int(label: str, v, limit: int = MAX_SIZE) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 < v <= limit:
        raise InputError(label, f"must be an integer from 1 to {limit:,}", v)
    return int(v)


def _flag(label: str, v) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise InputError(label, "must be True or False", v)
    return bool(v)


def _causals(causal) -> tuple[bool, ...]:
    """``causal``: an iterable of True/False (a bare bool is the common mistake: say so, not 'not iterable')."""
    if isinstance(causal, (bool, np.bool_)):
        raise InputError("causal", f"must be an iterable of True/False, for example ({bool(causal)},)", causal)
    if isinstance(causal, (str, bytes)) or not hasattr(causal, "__iter__"):
        raise InputError("causal", "must be an iterable of True/False, for example (False, True)", causal)
    values = tuple(causal)
    if not values or not all(isinstance(c, (bool, np.bool_)) for c in values):
        raise InputError("causal", "must be a non-empty iterable of True/False, for example (False, True)", causal)
    return tuple(bool(c) for c in values)


def _case_bytes(case, B: int, H: int, H_kv: int, with_bwd: bool) -> int:
    """Memory a case holds at once (float64): inputs and their copies, golden, naive and floors (about 24 N x d
    arrays per head) and the naive score matrices (a few N_q x N_k per head)."""
    nd = (B * H * case.N_q + B * H_kv * case.N_k) * case.d
    nn = B * H * case.N_q * max(case.N_k, 1)
    return 8 * (24 * nd + (6 if with_bwd else 3) * nn)


def _choice(label: str, value, accepted: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in accepted:
        raise InputError(label, f"must be one of {', '.join(accepted)}", value)
    return value


def validate(dtype: str = "float32", layout: str = "BHND", distributions=None, causal_align="bottom-right") -> None:
    """Raise InputError for a bad dtype, layout, distribution name or causal alignment (what :func:`check` accepts),
    before any work: the command line calls it before it selects a GPU."""
    _dtype(dtype)
    _choice("layout", layout, LAYOUTS)
    _choice("causal_align", causal_align, ALIGNS)
    if distributions is not None:
        if not isinstance(distributions, str) and not isinstance(distributions, (list, tuple)):
            raise InputError("distributions", f"must be a name or a list of names from {', '.join(DISTRIBUTIONS)}",
                             distributions)  # fmt: skip
        distributions = (distributions,) if isinstance(distributions, str) else tuple(distributions)
        if not distributions:
            raise InputError("distributions", f"must name at least one of {', '.join(DISTRIBUTIONS)}", distributions)
        for dist in distributions:
            _choice("distribution", dist, DISTRIBUTIONS)


@dataclass(frozen=True)
class _Setup:
    """What every case of one check shares: the callables, the random stream, the report (its batch and heads),
    the dtype and its unit roundoff ``u``, the conversion of inputs, the scale (None: 1/sqrt(d)), the golden's
    precision, the layout and the causal alignment."""

    fn: Callable
    bwd: Callable | None
    rng: np.random.Generator
    report: CheckReport
    np_dtype: np.dtype
    u: float
    convert: Callable
    scale: float | None
    precision: str
    layout: str
    causal_align: str


@dataclass(frozen=True)
class _CaseData:
    """One case's inputs (in the kernel's dtype), its scale, and the golden, naive and floor values per output."""

    case: Case
    scale: float
    inputs: tuple  # Q, K, V, dO
    gold: dict
    naive: dict
    floors: dict


def _check_arguments(fn, backward, quick, equal_lengths, seed, scale, name):
    """The callables and scalar options checked (InputError naming the first bad one): (quick, equal_lengths,
    scale as a Python float or None)."""
    if not callable(fn):
        raise InputError("fn", "must be a callable fn(Q, K, V, *, causal, scale)", type(fn).__name__)
    if not (backward is None or isinstance(backward, bool) or callable(backward)):
        raise InputError("backward", "must be a callable, False, or None (use fn.backward if it exists)", backward)
    quick = _flag("quick", quick)
    if equal_lengths is not None:
        equal_lengths = _flag("equal_lengths", equal_lengths)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 1 << 64:
        raise InputError("seed", "must be an integer from 0 to 2^64 - 1", seed)
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
            raise InputError("scale", "must be None or a finite real number", scale)
        if not math.isfinite(float(scale)) or scale <= 0:
            raise InputError("scale", "must be None or a positive finite number (default 1/sqrt(d))", scale)
        scale = float(scale)  # a plain Python float: a float32 kernel must stay float32 (NumPy 2 promotion)
    if name is not None and not isinstance(name, str):
        raise InputError("name", "must be None or a string", name)
    return quick, equal_lengths, scale


def _shapes(N, d, quick: bool) -> tuple[bool, tuple[int, ...], tuple[int, ...]]:
    """(whether N or d was given, the N values, the d values): the defaults (quick or not) where not given."""
    Ns = _positive_ints("N", N) if N is not None else (QUICK_N if quick else DEFAULT_N)
    ds = _positive_ints("d", d) if d is not None else (QUICK_D if quick else DEFAULT_D)
    return N is not None or d is not None, Ns, ds


def _names(distributions) -> tuple[str, ...]:
    """Distribution names as a tuple (one name may be given bare)."""
    return (distributions,) if isinstance(distributions, str) else tuple(distributions)


def _heads(batch, heads, heads_kv) -> tuple[int, int, int]:
    """(batch, heads, heads_kv) checked: positive, and heads_kv (default heads) dividing heads."""
    batch, heads = _positive_int("batch", batch), _positive_int("heads", heads)
    heads_kv = heads if heads_kv is None else _positive_int("heads_kv", heads_kv)
    if heads % heads_kv:
        raise InputError("heads_kv", f"must divide heads ({heads})", heads_kv)
    return batch, heads, heads_kv


def _check_memory(cases: list[Case], B: int, H: int, H_kv: int, with_bwd: bool, Ns) -> None:
    """InputError when the largest case would need more than 80% of the memory available."""
    from iosim.runner.estimate import available_bytes as _available_bytes

    need = max((_case_bytes(c, B, H, H_kv, with_bwd) for c in cases), default=0)
    have = _available_bytes()
    if need > 0.8 * have:
        big = max(cases, key=lambda c: _case_bytes(c, B, H, H_kv, with_bwd))
        raise InputError(
            "N",
            f"and d give a case (N_q={big.N_q}, N_k={big.N_k}, d={big.d}, B={B}, H={H}) that needs about "
            f"{need / 2**30:.1f} GiB; {have / 2**30:.1f} GiB are available: use smaller N, d or heads",
            Ns,
        )


def check(
    fn: Callable,
    *,
    N: Iterable[int] | None = None,
    d: Iterable[int] | None = None,
    causal: Iterable[bool] = (False, True),
    quick: bool = False,
    batch: int = 1,
    heads: int = 2,
    heads_kv: int | None = None,
    backward: Callable | None | bool = None,
    dtype: str = "float32",
    layout: str = "BHND",
    distributions: Iterable[str] | None = None,
    causal_align: str = "bottom-right",
    equal_lengths: bool | None = None,
    inputs: str | Callable = "numpy",
    scale: float | None = None,
    seed: int = 0,
    name: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> CheckReport:
    """Check attention callable ``fn`` (calling convention and bound in the module docstring) against the golden
    reference.

    Cases: every distribution in ``distributions`` (default: all of :data:`DISTRIBUTIONS`) x ``causal``; ``normal``
    on N in ``N`` (default 1, 17, 113, 203, 1023) x d in ``d`` (default 16, 59, 64, 128) plus two N_q != N_k pairs,
    the others on a few of those shapes (``long-n`` and ``wide-d`` on their own). With ``quick`` the grid shrinks
    to N in (1, 17, 33), d in (16, 59), without ``long-n`` and ``wide-d``. Given ``N`` or ``d``, every requested
    distribution runs on exactly that grid (only ``normal`` unless ``distributions`` is given). Inputs are drawn
    from ``seed``, rounded to ``dtype`` (float64, float32, float16, bfloat16), laid out as ``layout`` ("BHND" or
    "BNHD") with ``heads`` query heads and ``heads_kv`` key/value heads (default ``heads``), and handed to ``fn``
    through ``inputs`` ("numpy", "numba", "cupy", "torch" or a callable on a NumPy array). ``backward``: a
    backward callable, False to skip the backward, or None to use ``fn.backward`` when it exists.
    ``equal_lengths`` (default ``fn.equal_lengths`` or False): skip the N_q != N_k cases. Returns a
    :class:`CheckReport`; ``report.passed`` is the verdict.
    """
    validate(dtype, layout, distributions, causal_align)
    quick, equal_lengths, scale = _check_arguments(fn, backward, quick, equal_lengths, seed, scale, name)
    dtype_name, np_dtype, u = _dtype(dtype)
    explicit, Ns, ds = _shapes(N, d, quick)
    batch, heads, heads_kv = _heads(batch, heads, heads_kv)
    # all by default, on the user's shapes too: "large" is what catches a softmax without max-subtraction
    distributions = DISTRIBUTIONS if distributions is None else _names(distributions)
    causals = _causals(causal)
    if equal_lengths is None:
        equal_lengths = bool(getattr(fn, "equal_lengths", False))
    bwd = getattr(fn, "backward", None) if backward is None else (backward or None)
    convert = _converter(inputs)
    precision = "extended" if dtype_name == "float64" else "float64"
    label = name or getattr(fn, "__name__", "fn")
    report = CheckReport(label, dtype_name, batch, heads, heads_kv=heads_kv, layout=layout, causal_align=causal_align)
    rng = np.random.default_rng(seed)
    cases = _cases(Ns, ds, causals, distributions, quick, explicit, equal_lengths)
    _check_memory(cases, batch, heads, heads_kv, bwd is not None, Ns)
    setup = _Setup(fn, bwd, rng, report, np_dtype, u, convert, scale, precision, layout, causal_align)
    for case in cases:
        if progress:
            progress(f"{case.distribution} N_q={case.N_q} N_k={case.N_k} d={case.d} causal={case.causal}")
        report.rows += _check_case(setup, case)
    return report


def planned_cases(N=None, d=None, quick: bool = False, distributions=None, causal=(False, True), equal_lengths=False):
    """The cases :func:`check` would run with these arguments (for an estimate of its time before it starts)."""
    explicit, Ns, ds = _shapes(N, d, quick)
    distributions = None if distributions is None else _names(distributions)
    return _cases(Ns, ds, _causals(causal), distributions or DISTRIBUTIONS, quick, explicit, equal_lengths)


def _case_data(setup: _Setup, case: Case) -> _CaseData:
    """Draw one case's inputs, round them to the dtype, and compute the golden, naive and floor values from the
    values the kernel sees, exactly."""
    report, u, np_dtype = setup.report, setup.u, setup.np_dtype
    B, H, H_kv = report.batch, report.heads, report.heads_kv
    sc = float(default_scale(case.d) if setup.scale is None else setup.scale)  # a Python float, as PyTorch passes it
    offset = case.N_k - case.N_q if setup.causal_align == "bottom-right" else 0
    Q, K, V, dO = (x.astype(np_dtype) for x in _draw(case, setup.rng, B, H, H_kv, sc, offset))
    Q64, K64, V64, dO64 = (x.astype(np.float64) for x in (Q, K, V, dO))  # the values fn sees, exactly
    with_bwd = setup.bwd is not None
    gold = _golden(Q64, K64, V64, dO64, sc, case.causal, offset, H_kv, setup.precision, with_bwd)
    with np.errstate(all="ignore"):
        naive = _naive(Q64, K64, V64, dO64, sc, case.causal, offset, H_kv, np_dtype, with_bwd)
        v = u if np_dtype == np.float64 else ACCUMULATOR_U
        floors = _floors(Q64, K64, V64, dO64, gold, sc, case.causal, offset, H_kv, u, v, with_bwd)
    return _CaseData(case, sc, (Q, K, V, dO), gold, naive, floors)


def _lay(x: np.ndarray, layout: str) -> np.ndarray:
    """(B, H, N, d) -> the layout handed to fn."""
    return np.ascontiguousarray(x if layout == "BHND" else np.swapaxes(x, 1, 2))


def _check_case(setup: _Setup, case: Case) -> list[OutputCheck]:
    """The rows of one case: forward outputs, then (if offered) gradients; a callable that raises is a failed row
    (iosim's own InputError and CapacityError are raised on: a bad configuration, not a wrong kernel)."""
    data = _case_data(setup, case)
    Q, K, V, dO = data.inputs
    try:
        dev = [setup.convert(_lay(x, setup.layout)) for x in (Q, K, V)]
        out = _unpack(setup.fn(*dev, causal=case.causal, scale=data.scale), ("O", "L"))
    except USER_ERRORS:  # iosim's own: a bad configuration (too small an M), not a wrong kernel: exit 2
        raise
    except Exception as e:  # a callable that raises is a failed row, not a crashed check
        return [_row(setup, data, "forward", "O", note=f"raised {type(e).__name__}: {e}"[:200])]
    rows = _read(setup, data, "forward", out, ("O", "L"), optional=("L",))
    if setup.bwd is None or out["O"] is None:
        return rows
    try:
        g = setup.bwd(*dev, out["O"], setup.convert(_lay(dO, setup.layout)), out["L"], causal=case.causal,
                      scale=data.scale)  # fmt: skip
        grads = _unpack(g, ("dQ", "dK", "dV"))
    except USER_ERRORS:
        raise
    except Exception as e:
        return rows + [_row(setup, data, "backward", "dQ", note=f"raised {type(e).__name__}: {e}"[:200])]
    return rows + _read(setup, data, "backward", grads, ("dQ", "dK", "dV"))


def _read(setup: _Setup, data: _CaseData, passname, outputs, keys, optional=()) -> list[OutputCheck]:
    """A row per output: compared, or failed with a note when it is missing or cannot be read."""
    found = []
    for key in keys:
        if outputs[key] is None:
            if key not in optional:
                found.append(_row(setup, data, passname, key, note=f"no output {key}"))
            continue
        try:
            got = to_numpy(outputs[key])
        except Exception as e:  # an output NumPy cannot read is a failed row
            found.append(_row(setup, data, passname, key, note=f"unreadable output: {type(e).__name__}: {e}"[:200]))
            continue
        found.append(_row(setup, data, passname, key, got))
    return found


def _row(setup: _Setup, data: _CaseData, passname, output, got=None, note="") -> OutputCheck:
    """One output's row: its naive baseline and rule, then a failed row with ``note`` (or why ``got`` is no array
    of the golden's shape), or the comparison element by element."""
    case, layout = data.case, setup.layout
    factor = FORWARD_FACTOR if passname == "forward" else BACKWARD_FACTOR
    ref = data.gold[output]
    baseline = float(np.max(_abs_err(data.naive[output], ref))) if ref.size else 0.0
    rule = factor * baseline if np.isfinite(baseline) else 0.0
    base = dict(distribution=case.distribution, N_k=case.N_k, rule=rule)
    x, why = (None, note) if note else _as_output(got, output, ref, layout)
    if why:
        return OutputCheck(passname, case.N_q, case.d, case.causal, output, np.inf, baseline, rule, note=why, **base)
    if not ref.size:
        return OutputCheck(passname, case.N_q, case.d, case.causal, output, 0.0, baseline, rule, **base)
    err = _abs_err(x, ref)
    floor = data.floors[output]
    bound = np.maximum(rule, floor)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err > bound, np.where(bound > 0, err / bound, np.inf), err / np.where(bound > 0, bound, 1))
    i = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    where = f"({i[0]}, {i[1]}, {i[2]})"
    return OutputCheck(
        passname, case.N_q, case.d, case.causal, output, float(err[i]), baseline, float(bound[i]),
        floor=float(floor[i]), where=where, all_within=bool(np.all(err <= bound)), **base,
    )  # fmt: skip


def _as_output(got, output: str, ref: np.ndarray, layout: str) -> tuple[np.ndarray | None, str]:
    """(got as a float64 array in the (B, H, N, d) layout, "") or (None, why it cannot be compared: not an array
    of numbers, or not the golden's shape)."""
    try:
        x = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError) as e:  # a string, an object: a failed row, never a crashed check
        shown = f"{type(got).__name__} {str(got)[:40]!r}" if isinstance(got, (str, bytes)) else type(got).__name__
        return None, f"not an array of numbers: {shown} ({type(e).__name__})"[:200]
    if output != "L" and layout == "BNHD" and x.ndim == 4:
        x = np.swapaxes(x, 1, 2)
    if x.shape != ref.shape:
        shown = x.shape if output == "L" or layout == "BHND" or x.ndim != 4 else np.swapaxes(x, 1, 2).shape
        expected = ref.shape if output == "L" or layout == "BHND" else np.swapaxes(ref, 1, 2).shape
        return None, f"shape {tuple(shown)}, expected {tuple(expected)} ({layout})"
    return x, ""
