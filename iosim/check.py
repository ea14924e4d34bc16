"""Numerical cross-check of any attention implementation against the float64 reference.

:func:`check` runs a callable on random standard-normal inputs over a grid of odd shapes (not only powers of two),
forward and, where the callable offers one, backward, and compares every output with the float64 reference of
:mod:`iosim.algorithms.reference` under the FlashAttention test rule (the rule of the flash-attn test suite):

    max|out - ref| <= factor * max|naive - ref| + floor

where *naive* is plain attention computed in the same precision (S = Q K^T, softmax, P V in ``dtype`` with
NumPy), factor is 2 for forward outputs and 3 for gradients, and the floor is the rounding of the reference's
magnitude in ``dtype``: the larger of flash-attn's 2 max|((ref + 0.3) - 0.3) - ref| and 4 units in the last place
of max|ref| (in float32 the naive baseline itself errs by a few ulps, so without an ulp floor the ratio of two
rounding errors decides the verdict; a real bug errs by orders of magnitude more).

Calling convention of ``fn``
----------------------------
``fn(Q, K, V, *, causal: bool, scale: float)`` with Q, K, V of shape (B, H, N, d) (batch, heads, sequence, head
dimension) in the array type chosen by ``inputs`` (NumPy by default) and dtype ``dtype``. It returns O, or a
tuple (O, L), or a dict with "O" and optionally "L" (the row logsumexp, shape (B, H, N), natural log, of
scale * Q K^T with the causal mask: row r sees columns c <= r). The backward, when offered, is
``fn.backward`` or the ``backward=`` argument: ``backward(Q, K, V, O, dO, L, *, causal, scale)`` with the
forward's own O and L (as ``fn`` returned them; L may be None) and the upstream gradient dO; it returns
(dQ, dK, dV) or a dict with those keys. Outputs may be NumPy arrays, objects exposing
``__cuda_array_interface__`` (Numba, CuPy, PyTorch CUDA tensors), PyTorch tensors, or DLPack-capable arrays;
they are copied to NumPy for the comparison.

>>> import numpy as np, iosim
>>> def naive(Q, K, V, *, causal, scale):
...     S = scale * Q @ np.swapaxes(K, -1, -2)
...     if causal:
...         S = np.where(np.tril(np.ones(S.shape[-2:], bool)), S, -np.inf)
...     P = np.exp(S - S.max(-1, keepdims=True))
...     return (P / P.sum(-1, keepdims=True)) @ V
>>> iosim.check(naive, quick=True).passed
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from iosim.algorithms.reference import (
    attention_backward,
    attention_forward,
    default_scale,
    naive_backward,
    naive_forward,
)
from iosim.errors import InputError

DEFAULT_N = (1, 17, 113, 203, 1023)
DEFAULT_D = (16, 59, 64, 128)
QUICK_N = (1, 17, 33)
QUICK_D = (16, 59)
FORWARD_FACTOR = 2.0
BACKWARD_FACTOR = 3.0
FLOOR_ULPS = 4
INPUT_KINDS = ("numpy", "numba", "cupy", "torch")


@dataclass(frozen=True)
class OutputCheck:
    """One output at one shape: its error, the naive same-precision baseline's error and the bound it must meet."""

    passname: str
    N: int
    d: int
    causal: bool
    output: str
    error: float
    baseline: float
    bound: float

    @property
    def passed(self) -> bool:
        return bool(self.error <= self.bound)  # NaN fails


@dataclass
class CheckReport:
    """What :func:`check` returns: one row per (shape, causal, output); ``passed`` when every row passes."""

    name: str
    dtype: str
    batch: int
    heads: int
    rows: list[OutputCheck] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(r.passed for r in self.rows)

    @property
    def failures(self) -> list[OutputCheck]:
        return [r for r in self.rows if not r.passed]

    def table(self, fmt: str = "simple") -> str:
        from tabulate import tabulate

        rows = [
            [
                r.passname,
                r.N,
                r.d,
                "yes" if r.causal else "no",
                r.output,
                f"{r.error:.2e}",
                f"{r.baseline:.2e}",
                f"{r.bound:.2e}",
                "ok" if r.passed else "FAIL",
            ]
            for r in self.rows
        ]
        headers = ["pass", "N", "d", "causal", "output", "max err", "naive err", "bound", ""]
        return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)

    def summary(self) -> str:
        n_fail = len(self.failures)
        verdict = "PASSED" if self.passed else f"FAILED ({n_fail} of {len(self.rows)} outputs)"
        if not self.rows:
            verdict = "NOTHING CHECKED"
        return (
            f"{self.name}: {verdict} -- {self.dtype}, B={self.batch}, H={self.heads}; bound = factor x naive "
            f"{self.dtype} error + rounding floor (forward {FORWARD_FACTOR:g}x, gradients {BACKWARD_FACTOR:g}x)"
        )

    def __str__(self) -> str:
        return self.table() + "\n" + self.summary()


def to_numpy(x) -> np.ndarray:
    """Copy any supported array (NumPy, CuPy, PyTorch, __cuda_array_interface__, DLPack) to a NumPy array."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # PyTorch
        return x.detach().cpu().numpy()
    if hasattr(x, "copy_to_host"):  # Numba device array
        return x.copy_to_host()
    if hasattr(x, "get") and hasattr(x, "__cuda_array_interface__"):  # CuPy
        return x.get()
    if hasattr(x, "__cuda_array_interface__"):
        from numba import cuda

        return cuda.as_cuda_array(x).copy_to_host()
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    return np.asarray(x)


def _converter(inputs) -> Callable[[np.ndarray], object]:
    if callable(inputs):
        return inputs
    if inputs == "numpy":
        return lambda a: a
    if inputs == "numba":
        from numba import cuda

        return cuda.to_device
    if inputs == "cupy":
        import cupy

        return cupy.asarray
    if inputs == "torch":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        return lambda a: torch.from_numpy(a).to(device)
    raise InputError("inputs", f"must be one of {', '.join(INPUT_KINDS)} or a callable", inputs)


def _unpack(out, names: tuple[str, ...]) -> dict:
    """A callable's result as a dict: a bare array is the first name, a tuple names its items in order."""
    if isinstance(out, dict):
        return {n: out.get(n) for n in names}
    if isinstance(out, (tuple, list)):
        return {n: (out[i] if i < len(out) else None) for i, n in enumerate(names)}
    return {names[0]: out, **{n: None for n in names[1:]}}


def _reference(Q, K, V, dO, scale, causal, with_backward):
    """float64 reference per (b, h): O, L and, if asked, dQ, dK, dV."""
    B, H, N, d = Q.shape
    out = {n: np.empty((B, H, N, d)) for n in ("O", "dQ", "dK", "dV")}
    out["L"] = np.empty((B, H, N))
    for b in range(B):
        for h in range(H):
            out["O"][b, h], out["L"][b, h] = attention_forward(Q[b, h], K[b, h], V[b, h], scale=scale, causal=causal)
            if with_backward:
                g = attention_backward(Q[b, h], K[b, h], V[b, h], dO[b, h], scale=scale, causal=causal)
                out["dQ"][b, h], out["dK"][b, h], out["dV"][b, h] = g
    return out


def _floor(ref: np.ndarray, dtype: np.dtype) -> float:
    """The rounding floor: flash-attn's 2 max|((ref + 0.3) - 0.3) - ref| in ``dtype``, and at least FLOOR_ULPS
    units in the last place of the largest reference entry (in float32 both baselines err by a few ulps, and the
    ratio of two such errors is noise)."""
    if not ref.size:
        return 0.0
    r = ref.astype(dtype)
    fa = float(2 * np.max(np.abs((r + dtype.type(0.3)) - dtype.type(0.3) - r)))
    return max(fa, FLOOR_ULPS * float(np.finfo(dtype).eps) * float(np.max(np.abs(ref))))


def _max_err(x, ref) -> float:
    x = np.asarray(to_numpy(x), dtype=np.float64)
    if x.shape != ref.shape:
        raise ValueError(f"output of shape {x.shape}, expected {ref.shape}")
    return float(np.max(np.abs(x - ref))) if ref.size else 0.0


def check(
    fn: Callable,
    *,
    N: Iterable[int] | None = None,
    d: Iterable[int] | None = None,
    causal: Iterable[bool] = (False, True),
    quick: bool = False,
    batch: int = 1,
    heads: int = 2,
    backward: Callable | None | bool = None,
    dtype: str = "float32",
    inputs: str | Callable = "numpy",
    scale: float | None = None,
    seed: int = 0,
    name: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> CheckReport:
    """Check attention callable ``fn`` (calling convention in the module docstring) against the float64 reference.

    Shapes: N in ``N`` (default 1, 17, 113, 203, 1023) x d in ``d`` (default 16, 59, 64, 128) x ``causal``; with
    ``quick`` the defaults shrink to N in (1, 17, 33), d in (16, 59). Inputs are (batch, heads, N, d) standard
    normal draws from ``seed`` in ``dtype``, handed to ``fn`` through ``inputs`` ("numpy", "numba", "cupy", "torch"
    or a callable on a NumPy array). ``backward``: a backward callable, False to skip the backward, or None to use
    ``fn.backward`` when it exists. Returns a :class:`CheckReport`; ``report.passed`` is the verdict.
    """
    np_dtype = np.dtype(dtype)
    if np_dtype not in (np.dtype("float32"), np.dtype("float64"), np.dtype("float16")):
        raise InputError("dtype", "must be float16, float32 or float64", dtype)
    Ns = tuple(N) if N is not None else (QUICK_N if quick else DEFAULT_N)
    ds = tuple(d) if d is not None else (QUICK_D if quick else DEFAULT_D)
    for label, values in (("N", Ns), ("d", ds)):
        if not values or any(isinstance(v, bool) or int(v) != v or v <= 0 for v in values):
            raise InputError(label, "must be positive integers", values)
    for label, v in (("batch", batch), ("heads", heads)):
        if isinstance(v, bool) or int(v) != v or v <= 0:
            raise InputError(label, "must be a positive integer", v)
    bwd = getattr(fn, "backward", None) if backward is None else (backward or None)
    convert = _converter(inputs)
    report = CheckReport(name or getattr(fn, "__name__", "fn"), np_dtype.name, int(batch), int(heads))
    rng = np.random.default_rng(seed)
    for n in Ns:
        for dd in ds:
            sc = default_scale(dd) if scale is None else float(scale)
            shape = (int(batch), int(heads), int(n), int(dd))
            Q, K, V, dO = (rng.standard_normal(shape).astype(np_dtype) for _ in range(4))
            for c in causal:
                c = bool(c)
                if progress:
                    progress(f"N={n} d={dd} causal={c}")
                ref = _reference(Q, K, V, dO, sc, c, bwd is not None)
                O_n, L_n, P_n = naive_forward(Q, K, V, sc, c, np_dtype)
                dev = [convert(np.ascontiguousarray(x)) for x in (Q, K, V)]
                out = _unpack(fn(*dev, causal=c, scale=sc), ("O", "L"))
                if out["O"] is None:
                    raise ValueError(f"{report.name} returned no output O")
                for key, naive in (("O", O_n), ("L", L_n)):
                    if key == "L" and out["L"] is None:
                        continue
                    report.rows.append(
                        OutputCheck(
                            "forward",
                            n,
                            dd,
                            c,
                            key,
                            _max_err(out[key], ref[key]),
                            float(np.max(np.abs(naive - ref[key]))),
                            FORWARD_FACTOR * float(np.max(np.abs(naive - ref[key]))) + _floor(ref[key], np_dtype),
                        )
                    )
                if bwd is None:
                    continue
                grads = _unpack(
                    bwd(*dev, out["O"], convert(np.ascontiguousarray(dO)), out["L"], causal=c, scale=sc),
                    ("dQ", "dK", "dV"),
                )
                naive_g = dict(zip(("dQ", "dK", "dV"), naive_backward(Q, K, V, dO, P_n, sc, np_dtype), strict=True))
                for key in ("dQ", "dK", "dV"):
                    if grads[key] is None:
                        raise ValueError(f"{report.name}'s backward returned no {key}")
                    base = float(np.max(np.abs(naive_g[key] - ref[key])))
                    report.rows.append(
                        OutputCheck(
                            "backward",
                            n,
                            dd,
                            c,
                            key,
                            _max_err(grads[key], ref[key]),
                            base,
                            BACKWARD_FACTOR * base + _floor(ref[key], np_dtype),
                        )
                    )
    return report
