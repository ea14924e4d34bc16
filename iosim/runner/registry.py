"""The algorithm registry: one entry per algorithm name, tying its driver, tiling rule and closed form together."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from iosim.algorithms import flash, square_tiling, standard, topk_sparse
from iosim.base.errors import InputError
from iosim.theory import io_model, tiling
from iosim.theory.io_model import Prediction
from iosim.theory.tiling import Tiling


@dataclass(frozen=True)
class Algorithm:
    """An algorithm as iosim knows it.

    ``forward(mem, Q, K, V, N, d, tiling, scale, causal, dtype)`` returns a dict of named outputs that
    includes "O" and, where the algorithm produces it, "L" (the row logsumexp); ``predict_forward(N, d, M,
    tiling, causal)`` is its exact closed form in :mod:`iosim.theory.io_model`.

    Optional backward pass (None when the algorithm has none):
    ``backward(mem, Q, K, V, dO, fwd, N, d, tiling, scale, causal, dtype)`` returns a dict with "dQ", "dK", "dV"
    (None each in count-only mode, where every data argument is None); ``fwd`` is the dict the forward returned
    (its outputs O, l, m, L, P as the paper's backward reads them). ``predict_backward(N, d, M, tiling, causal)`` is
    the backward's exact closed form. ``choose_backward_tiling(N, d, M, rule)`` picks the backward's blocks when they
    differ from the forward's (its working set is larger); None means the backward reuses the forward's tiling.
    """

    name: str
    title: str
    citation: str
    choose_tiling: Callable[[int, int, int, str], Tiling]
    forward: Callable[..., dict]
    predict_forward: Callable[..., Prediction]
    backward: Callable[..., dict] | None = None
    predict_backward: Callable[..., Prediction] | None = None
    choose_backward_tiling: Callable[[int, int, int, str], Tiling] | None = None
    square_arrays: tuple[int, int] = (0, 0)  # N x N slow arrays a numeric forward / backward allocates
    builtin: bool = False  # built-in: its count-only runs may use the counters-only memory (see iosim.runner.api.run)

    @property
    def has_backward(self) -> bool:
        return self.backward is not None

    def backward_tiling(self, N: int, d: int, M: int, rule: str) -> Tiling:
        """The tiling the backward pass runs with (the forward's unless the algorithm chooses its own)."""
        choose = self.choose_backward_tiling or self.choose_tiling
        return choose(N, d, M, rule)

    def min_M(self, N: int, d: int, backward: bool = False) -> int | None:
        """The smallest M for which the ``fit`` rule finds a tiling (of the forward and, if asked, the backward)."""

        def fits(M: int) -> bool:
            try:
                self.choose_tiling(N, d, M, "fit")
                if backward:
                    self.backward_tiling(N, d, M, "fit")
            except InputError:
                return False
            return True

        lo, hi = 1, 1
        while not fits(hi):
            if hi > 1 << 40:
                return None
            lo, hi = hi + 1, hi * 2
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo


def _standard_forward(mem, Q, K, V, N, d, t, scale, causal, dtype):
    O, S, P = standard.standard_forward(mem, Q, K, V, N=N, d=d, B=t.B, scale=scale, causal=causal, dtype=dtype)
    return {"O": O, "S": S, "P": P}


def _log(x):
    """np.log, also of an object array (the pebble game's symbolic run) where a row that saw no key holds a plain
    float 0.0 beside symbolic values: np.log would call ``0.0.log()``."""
    if not (isinstance(x, np.ndarray) and x.dtype == object):
        return np.log(x)
    flat = [v.log() if hasattr(v, "log") else math.log(v) if v > 0 else -math.inf for v in x.ravel()]
    out = np.empty(x.shape, dtype=object)
    out.ravel()[:] = flat
    return out


def _flash1_forward(mem, Q, K, V, N, d, t, scale, causal, dtype):
    O, l_, m = flash.flash1_forward(mem, Q, K, V, N=N, d=d, Br=t.Br, Bc=t.Bc, scale=scale, causal=causal, dtype=dtype)
    with np.errstate(divide="ignore"):  # a fully masked row: l = 0, L = -inf
        L = None if m is None else m + _log(l_)  # computed outside the model, for checking only
    return {"O": O, "l": l_, "m": m, "L": L}


def _flash2_forward(mem, Q, K, V, N, d, t, scale, causal, dtype):
    O, L = flash.flash2_forward(mem, Q, K, V, N=N, d=d, Br=t.Br, Bc=t.Bc, scale=scale, causal=causal, dtype=dtype)
    return {"O": O, "L": L}


def _standard_backward(mem, Q, K, V, dO, fwd, N, d, t, scale, causal, dtype):
    dQ, dK, dV = standard.standard_backward(
        mem, Q, K, V, fwd["P"], dO, N=N, d=d, B=t.B, scale=scale, causal=causal, dtype=dtype
    )
    return {"dQ": dQ, "dK": dK, "dV": dV}


def _flash1_backward(mem, Q, K, V, dO, fwd, N, d, t, scale, causal, dtype):
    O, l_, m = fwd["O"], fwd["l"], fwd["m"]
    dQ, dK, dV = flash.flash1_backward(
        mem, Q, K, V, O, dO, l_, m, N=N, d=d, Br=t.Br, Bc=t.Bc, scale=scale, causal=causal, dtype=dtype
    )
    return {"dQ": dQ, "dK": dK, "dV": dV}


def _flash2_backward(mem, Q, K, V, dO, fwd, N, d, t, scale, causal, dtype):
    dQ, dK, dV = flash.flash2_backward(
        mem, Q, K, V, fwd["O"], dO, fwd["L"], N=N, d=d, Br=t.Br, Bc=t.Bc, scale=scale, causal=causal, dtype=dtype
    )
    return {"dQ": dQ, "dK": dK, "dV": dV}


def _square_tiling_forward(mem, Q, K, V, N, d, t, scale, causal, dtype):
    O, L, S = square_tiling.square_tiling_forward(
        mem, Q, K, V, N=N, d=d, B=t.B, scale=scale, causal=causal, dtype=dtype
    )
    return {"O": O, "L": L, "S": S}


def _square_tiling_backward(mem, Q, K, V, dO, fwd, N, d, t, scale, causal, dtype):
    dQ, dK, dV, dS = square_tiling.square_tiling_backward(
        mem, Q, K, V, fwd["O"], fwd["L"], fwd["S"], dO, N=N, d=d, B=t.B, scale=scale, causal=causal, dtype=dtype
    )
    return {"dQ": dQ, "dK": dK, "dV": dV, "dS": dS}


REGISTRY: dict[str, Algorithm] = {
    a.name: a
    for a in [
        Algorithm(
            "standard",
            "Standard attention (Algorithm 0), S and P materialised, tiled products",
            "Dao et al., NeurIPS 2022, Algorithm 0 (backward: Algorithm 3)",
            lambda N, d, M, rule: tiling.square_tiling("standard", N, d, M, rule),
            _standard_forward,
            lambda N, d, M, t, causal: io_model.standard_forward(N, d, M, t.B, causal),
            backward=_standard_backward,
            predict_backward=lambda N, d, M, t, causal: io_model.standard_backward(N, d, M, t.B, causal),
            square_arrays=(2, 5),
            builtin=True,
        ),
        Algorithm(
            "flash1",
            "FlashAttention (Algorithm 1/2): K/V outer loop, O, l, m round-trip through slow memory",
            "Dao et al., NeurIPS 2022, Algorithm 1 (backward: Algorithm 4)",
            lambda N, d, M, rule: tiling.flash_tiling("flash1", N, d, M, rule),
            _flash1_forward,
            lambda N, d, M, t, causal: io_model.flash1_forward(N, d, t.Br, t.Bc, causal),
            backward=_flash1_backward,
            predict_backward=lambda N, d, M, t, causal: io_model.flash1_backward(N, d, t.Br, t.Bc, causal),
            choose_backward_tiling=lambda N, d, M, rule: tiling.flash_backward_tiling("flash1", N, d, M, rule),
            builtin=True,
        ),
        Algorithm(
            "flash2",
            "FlashAttention-2 forward: Q outer loop, O and logsumexp L written once",
            "Dao, FlashAttention-2, 2023 (forward and backward, Algorithms 1-2)",
            lambda N, d, M, rule: tiling.flash_tiling("flash2", N, d, M, rule),
            _flash2_forward,
            lambda N, d, M, t, causal: io_model.flash2_forward(N, d, t.Br, t.Bc, causal),
            backward=_flash2_backward,
            predict_backward=lambda N, d, M, t, causal: io_model.flash2_backward(N, d, t.Br, t.Bc, causal),
            choose_backward_tiling=lambda N, d, M, rule: tiling.flash_backward_tiling("flash2", N, d, M, rule),
            builtin=True,
        ),
        Algorithm(
            "square-tiling",
            "Saha-Ye square tiling (Algorithm 1, stable form); small-cache backward (a construction)",
            "Saha & Ye, ICML 2024, Algorithm 1 (backward: in the regime of Li et al., arXiv 2410.09397)",
            lambda N, d, M, rule: tiling.saha_ye_tiling(N, d, M, rule),
            _square_tiling_forward,
            lambda N, d, M, t, causal: io_model.square_tiling_forward(N, d, t.B, causal),
            backward=_square_tiling_backward,
            predict_backward=lambda N, d, M, t, causal: io_model.square_tiling_backward(N, d, t.B, causal),
            square_arrays=(1, 3),
            builtin=True,
        ),
    ]
}


ENTRY_POINT_GROUP = "iosim.algorithms"
_plugins_loaded = False


def _user_tiling(N: int, d: int, M: int, rule: str) -> Tiling:
    """The tiling of a user algorithm registered without a tiling rule: the rule name only (it chooses its own)."""
    if rule not in tiling.RULES:
        raise InputError("tiling", f"must be one of {', '.join(tiling.RULES)}", rule)
    return Tiling(rule)


# Built-in algorithms replaced by register(replace=True): unregister puts them back.
_REPLACED: dict[str, Algorithm] = {}
FORWARD_ARGS = ("mem", "Q", "K", "V", "N", "d", "tiling", "scale", "causal", "dtype")
BACKWARD_ARGS = ("mem", "Q", "K", "V", "dO", "fwd", "N", "d", "tiling", "scale", "causal", "dtype")


def _arity(name: str, what: str, fn, params: tuple[str, ...]) -> None:
    """``fn`` must accept ``params`` positionally (checked at registration, not deep inside a run)."""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C callable without a signature: checked at first use
    try:
        sig.bind(*params)
    except TypeError as e:
        raise InputError(
            what, f"of algorithm {name} must accept ({', '.join(params)}) ({e})", getattr(fn, "__name__", fn)
        ) from None


def _checked(name: str, what: str, fn, keys: tuple[str, ...], inputs: int, outputs: int):
    """Wrap a user's forward or backward: at every call, its result must be a dict holding ``keys`` (None in a
    count-only run), no tile may be left resident (ScheduleError, as the README says) and it must move at least
    the trivial words: read ``inputs`` N x d arrays and write ``outputs`` (else it cannot have read its inputs)."""
    from iosim.memory_model import ScheduleError

    def run(mem, *args):
        out = fn(mem, *args)
        N, d = (args[3], args[4]) if what == "forward" else (args[5], args[6])
        if not isinstance(out, dict):
            raise InputError(what, f"of algorithm {name} must return a dict with {', '.join(keys)}",
                             f"{type(out).__name__} {str(out)[:40]}")  # fmt: skip
        missing = [k for k in keys if k not in out]
        if missing:
            raise InputError(what, f"of algorithm {name} must return a dict with {', '.join(keys)}",
                             f"a dict without {', '.join(missing)}")  # fmt: skip
        data = args[0] is not None  # Q (count-only runs pass None)
        for k in keys:
            x = out[k]
            if data and (not isinstance(x, np.ndarray) or x.shape != (N, d)):
                shown = f"shape {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
                raise InputError(what, f"of algorithm {name} must return {k} as an array of shape ({N}, {d})", shown)
        mem.check()  # tiles left resident, a schedule error, a strict overflow
        s = mem.stats()
        if s.reads < inputs * N * d or s.writes < outputs * N * d:
            raise ScheduleError(
                f"algorithm {name} ({what}) moved {s.reads:,} reads and {s.writes:,} writes, fewer than the trivial "
                f"{inputs} N d = {inputs * N * d:,} reads and {outputs} N d = {outputs * N * d:,} writes: it cannot "
                "have read its inputs and written its outputs through the memory model"
            )
        return out

    run.__wrapped__ = fn
    return run


def _checked_result(name: str, what: str, fn, kind, none_ok: bool):
    """Wrap a user's tiling or prediction: its result must be a ``kind`` (or None where allowed)."""

    def run(*args):
        out = fn(*args)
        if not (isinstance(out, kind) or (none_ok and out is None)):
            accepted = f"an {kind.__module__}.{kind.__name__}" + (" or None" if none_ok else "")
            raise InputError(what, f"of algorithm {name} must return {accepted}", type(out).__name__)
        return out

    run.__wrapped__ = fn
    return run


def register(
    name: str,
    forward: Callable[..., dict],
    *,
    title: str = "",
    citation: str = "",
    tiling: Callable[[int, int, int, str], Tiling] | None = None,
    predict: Callable[..., Prediction | None] | None = None,
    backward: Callable[..., dict] | None = None,
    predict_backward: Callable[..., Prediction | None] | None = None,
    backward_tiling: Callable[[int, int, int, str], Tiling] | None = None,
    replace: bool = False,
) -> Algorithm:
    """Add an algorithm to iosim: it appears in ``iosim run``, ``compare``, ``trace`` and every later tool exactly
    like a built-in one.

    ``forward(mem, Q, K, V, N, d, tiling, scale, causal, dtype) -> dict`` runs the schedule on the
    :class:`~iosim.memory_model.TwoLevelMemory` ``mem`` (in plain Python with :class:`iosim.memory_model.Memory`,
    or a Numba driver through ``mem.call``) and returns its outputs, "O" at least ("L", the row logsumexp, if it
    has one); Q, K and V are None in a count-only run. ``tiling(N, d, M, rule) -> Tiling`` chooses the blocks (rule
    "fit" or "paper"; raise :class:`~iosim.base.errors.InputError` naming M when none fits); without one the algorithm
    receives ``Tiling(rule)`` and picks its own. ``predict(N, d, M, tiling, causal)`` returns the exact closed form
    (an :class:`iosim.theory.io_model.Prediction`) or None; without one, ``exact`` is reported as unknown.
    ``backward(mem, Q, K, V, dO, fwd, N, d, tiling, scale, causal, dtype) -> dict`` with "dQ", "dK", "dV" (``fwd``
    is the dict the forward returned). A user algorithm always runs on the checked memory (the tile table),
    count-only included.

    Separate packages register algorithms through the entry-point group ``iosim.algorithms``: each entry point
    names a callable that calls this function (or an :class:`Algorithm`), loaded the first time iosim lists or
    looks up algorithms.
    """
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise InputError("name", "must be a non-empty algorithm name without spaces", name)
    if name in REGISTRY and not replace:
        raise InputError("name", f"is already registered ({name}); pass replace=True to replace it", name)
    if not isinstance(replace, bool):
        raise InputError("replace", "must be True or False", replace)
    for what, text in (("title", title), ("citation", citation)):
        if not isinstance(text, str):
            raise InputError(what, "must be a string", text)
    if not callable(forward):
        raise InputError("forward", "must be callable: forward(mem, Q, K, V, N, d, tiling, scale, causal, dtype)")
    for what, fn in (
        ("tiling", tiling),
        ("predict", predict),
        ("backward", backward),
        ("predict_backward", predict_backward),
        ("backward_tiling", backward_tiling),
    ):
        if fn is not None and not callable(fn):
            raise InputError(what, f"of algorithm {name} must be callable or None", fn)
    _arity(name, "forward", forward, FORWARD_ARGS)
    if backward is not None:
        _arity(name, "backward", backward, BACKWARD_ARGS)
    for what, fn, params in (
        ("tiling", tiling, ("N", "d", "M", "rule")),
        ("backward_tiling", backward_tiling, ("N", "d", "M", "rule")),
        ("predict", predict, ("N", "d", "M", "tiling", "causal")),
        ("predict_backward", predict_backward, ("N", "d", "M", "tiling", "causal")),
    ):
        if fn is not None:
            _arity(name, what, fn, params)
    none = lambda N, d, M, t, causal: None  # noqa: E731
    algo = Algorithm(
        name,
        title or f"user algorithm {name}",
        citation or "registered with iosim.register",
        _checked_result(name, "tiling", tiling, Tiling, False) if tiling else _user_tiling,
        _checked(name, "forward", forward, ("O",), 3, 1),
        _checked_result(name, "predict", predict, Prediction, True) if predict else none,
        backward=_checked(name, "backward", backward, ("dQ", "dK", "dV"), 3, 3) if backward else None,
        predict_backward=(
            _checked_result(name, "predict_backward", predict_backward, Prediction, True) if predict_backward else none
        )
        if backward
        else None,  # fmt: skip
        choose_backward_tiling=_checked_result(name, "backward_tiling", backward_tiling, Tiling, False)
        if backward_tiling
        else None,
    )
    if name in REGISTRY and REGISTRY[name].builtin and name not in _REPLACED:
        _REPLACED[name] = REGISTRY[name]
    REGISTRY[name] = algo
    return algo


def unregister(name: str) -> None:
    """Remove a user-registered algorithm; a built-in one it replaced (``register(replace=True)``) comes back, and
    built-in ones stay."""
    if not isinstance(name, str):
        raise InputError("name", "must be an algorithm name", name)
    if name in REGISTRY and not REGISTRY[name].builtin:
        del REGISTRY[name]
        if name in _REPLACED:
            REGISTRY[name] = _REPLACED.pop(name)


def _load_plugins() -> None:
    """Register the algorithms of installed packages (entry-point group ``iosim.algorithms``), once."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if isinstance(obj, Algorithm):
                REGISTRY.setdefault(obj.name, obj)
            elif callable(obj):
                obj()
        except Exception as e:  # a broken plugin must not break iosim: say which, and go on
            import warnings

            warnings.warn(f"iosim: the algorithm plugin {ep.name!r} ({ep.value}) failed to load: {e}", stacklevel=2)


def get(name: str) -> Algorithm:
    _load_plugins()
    if not isinstance(name, str) or name not in REGISTRY:
        raise InputError("algorithm", f"must be one of {', '.join(REGISTRY)}", name)
    return REGISTRY[name]


def algorithms() -> list[str]:
    """The names of all registered algorithms."""
    _load_plugins()
    return list(REGISTRY)


@dataclass(frozen=True)
class IndexSchedule:
    """A schedule whose keys per query come from an index array (sparse attention by top-k indices) rather than a
    mask: it takes the problem and the selection, so it is registered apart from the dense algorithms above (which
    ``iosim compare`` and the sweeps run at any N, d). ``driver`` is its loop nest, ``predict`` its closed form;
    :mod:`iosim.masking.topk_sparse` (``front_door``) runs it over a problem beside both and the floor."""

    name: str
    title: str
    citation: str
    policies: tuple[str, ...]
    driver: Callable[..., None]
    predict: Callable[..., Prediction]
    front_door: str


INDEX_SCHEDULES: dict[str, IndexSchedule] = {
    "topk-sparse": IndexSchedule(
        "topk-sparse",
        "Sparse attention by top-k indices (FlashAttention-2 over the selected keys; per-query, group:G, gqa, gather)",
        "DeepSeek-V3.2 (DSA, FlashMLA's sparse kernels); Yuan et al. 2025 (NSA); Lu et al. 2025 (MoBA)",
        ("per-query", "group:G", "gqa", "gather"),
        topk_sparse.topk_forward,
        io_model.topk_sparse,
        "iosim.masking.topk_sparse.topk_sparse",
    )
}


def index_schedule(name: str) -> IndexSchedule:
    """The registered index-driven schedule ``name`` (one line naming the algorithm otherwise)."""
    if not isinstance(name, str) or name not in INDEX_SCHEDULES:
        raise InputError("algorithm", f"must be one of {', '.join(INDEX_SCHEDULES)} (an index-driven schedule)", name)
    return INDEX_SCHEDULES[name]
