"""Attention masks for users: pattern objects, ``--mask`` strings, and their compilation to a tile oracle.

Semantics (:mod:`iosim.algorithms.tile_masks`): a mask allows or forbids each score (r, c); forbidden scores are -inf
before the softmax; a row with no allowed entry has O = 0, L = -inf and zero gradients. Every pattern below is
independent of N until :meth:`Mask.compile` fixes N; the compiled :class:`~iosim.algorithms.tile_masks.TileMask`
answers "empty, full or partial, and how many nonzeros" for any tile without materialising N x N (except
:class:`FromArray`, whose tile answers come from a 2-D prefix-sum table of the user's array, and :class:`FromBlocks`,
which holds one of the block array; both are refused in one line, naming the mask and the size, when that table
would not fit in memory).

Random masks (:class:`RandomElements`, :class:`RandomBlocks`, :class:`BigBird`) hold no table: an element's (a
block's) draw is a pure function of (seed, position), SplitMix64's finaliser applied in turn to the seed and the
coordinates (:mod:`iosim.algorithms.tile_masks`), so any tile is reproducible on its own, on any tiling and at any
N. ``random:S`` and ``random-blocks:S`` are Bernoulli(S) per element / per block (the draw, uniform on [0, 2^53),
below round(S 2^53)): the density is S in expectation, not exactly S nnz. BigBird's r random blocks of a block row
are the first r distinct columns among the draws keyed by (seed, block row, k), k = 0, 1, ... Counting a tile
costs one draw per element (random elements), one per block it meets (random blocks) or O(r^2) per block row it
meets (BigBird).

``--mask`` strings (:func:`parse`): ``none``, ``causal``, ``window:W``, ``window:W:causal``, ``dilated:W:K``
(``dilated:W:K:causal``), ``blockdiag:L1,L2,...``, ``prefix:P``, ``bigbird:B:G:W:R[:SEED]``,
``random-blocks:S:HxW[:SEED]``, ``random:S[:SEED]``, ``file:mask.npy`` (N x N boolean),
``file:blocks.npy:HxW`` (a block mask of H x W blocks) and ``mod:FILE.py:NAME`` (a FlexAttention ``mask_mod``
function NAME defined in FILE.py, :func:`from_mask_mod`).

FlexAttention's masks (:mod:`iosim.masking.mask_mod`): :func:`from_mask_mod` takes a ``mask_mod(b, h, q_idx, kv_idx)``,
:func:`from_block_mask` a torch ``BlockMask`` (or its four index tensors and block size). Both compile to the MOD
kind: the function evaluated a band of 64 rows at a time into 64 x 64 blocks (empty, full, or partial with the
partial blocks' bits kept), which answers any tile of any tiling exactly; the compiled oracle is cached per N.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace

import numpy as np

from iosim.algorithms import tile_masks as _m
from iosim.algorithms.tile_masks import POLICIES, TileMask
from iosim.base.errors import InputError
from iosim.runner import estimate

__all__ = [
    "POLICIES",
    "BigBird",
    "BlockDiagonal",
    "Causal",
    "Dense",
    "Dilated",
    "FromArray",
    "FromBlocks",
    "Mask",
    "PrefixLM",
    "RandomBlocks",
    "RandomElements",
    "SlidingWindow",
    "TileMask",
    "FromBlockMask",
    "FromMaskMod",
    "compile_mask",
    "from_block_mask",
    "from_mask_mod",
    "parse",
]


def _pos(name: str, value, limit: int = 1 << 40) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 < value <= limit:
        raise InputError(name, f"must be a positive integer (1 to {limit:,})", value)
    return int(value)


def _density(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
        raise InputError(name, "must be a number in (0, 1]", value)
    return float(value)


def _seed(value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < 1 << 64:
        raise InputError("mask seed", "must be an integer from 0 to 2^64 - 1", value)
    return int(value)


def _block(name: str, value) -> tuple[int, int]:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (value, value)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise InputError(name, "must be a block shape (rows, columns) of positive integers", value)
    return _pos(name, value[0]), _pos(name, value[1])


class Mask:
    """A mask pattern, independent of N; :meth:`compile` gives the tile oracle for one N."""

    label = "mask"

    def compile(self, N: int, policy: str = "paper") -> TileMask:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True)
class Dense(Mask):
    """No mask: every score allowed."""

    @property
    def label(self) -> str:
        return "none"

    def compile(self, N: int, policy: str = "paper") -> TileMask:
        return _m.dense_mask(N, policy)


@dataclass(frozen=True)
class Causal(Mask):
    """Row r sees columns c <= r (``causal=True``)."""

    @property
    def label(self) -> str:
        return "causal"

    def compile(self, N: int, policy: str = "paper") -> TileMask:
        return _m.causal_mask(N, policy)


@dataclass(frozen=True)
class SlidingWindow(Mask):
    """Local attention of width w: row r sees |r - c| < w (w - 1 neighbours each side); causal: r - w < c <= r."""

    w: int
    causal: bool = False

    def __post_init__(self):
        _pos("mask window", self.w)

    @property
    def label(self) -> str:
        return f"window:{self.w}" + (":causal" if self.causal else "")

    def compile(self, N: int, policy: str = "paper") -> TileMask:
        lo, hi = -(self.w - 1), 0 if self.causal else self.w - 1
        return _m.tile_mask(_m.BAND, (lo, hi), N=N, label=self.label, policy=policy)


@dataclass(frozen=True)
class Dilated(Mask):
    """Dilated (strided) window: row r sees c with c - r a multiple of k and |c - r| < w k (w taps each side)."""

    w: int
    k: int
    causal: bool = False

    def __post_init__(self):
        _pos("mask window", self.w)
        _pos("mask dilation", self.k)
        if (self.w - 1) * self.k > 1 << 40:  # the reach (w - 1) k is an int64 offset of the tile oracle
            raise InputError("mask dilation", f"times (window - 1) must be at most {1 << 40:,} (the reach in columns)",
                             f"{self.w}:{self.k}")  # fmt: skip

    @property
    def label(self) -> str:
        return f"dilated:{self.w}:{self.k}" + (":causal" if self.causal else "")

    def compile(self, N: int, policy: str = "paper") -> TileMask:
        reach = (self.w - 1) * self.k
        return _m.tile_mask(_m.DILATED, (-reach, 0 if self.causal else reach, self.k), N=N, label=self.label,
                            policy=policy)  # fmt: skip


@dataclass(frozen=True)
class BlockDiagonal(Mask):
    """Documents of the given lengths (summing to N): a row sees the columns of its own document."""

    lengths: tuple[int, ...]

    def __post_init__(self):
        if isinstance(self.lengths, (str, bytes)) or not hasattr(self.lengths, "__len__") or not len(self.lengths):
            raise InputError("mask document lengths", "must be a non-empty list of positive integers", self.lengths)
        object.__setattr__(self, "lengths", tuple(_pos("mask document lengths", x) for x in self.lengths))

    @property
    def label(self) -> str:
        return "blockdiag:" + ",".join(map(str, self.lengths))

    def compile(self, N: int, policy: str = "paper") -> TileMask:
        if sum(self.lengths) != N:
            raise InputError("mask document lengths", f"must sum to N = {N}", f"sum {sum(self.lengths)}")
        bounds = np.concatenate([[0], np.cumsum(self.lengths)])
        return _m.tile_mask(_m.BLOCKDIAG, bounds, N=N, label=self.label, policy=policy)


@dataclass(frozen=True)
class PrefixLM(Mask):
    """Prefix-LM: the first p columns are seen by every row (bidirectional prefix), the rest causally."""

    p: int

    def __post_init__(self):
        _pos("mask prefix", self.p)

    @property
    def label(self) -> str:
        return f"prefix:{self.p}"

    def compile(self, N: int, policy: str = "paper") -> TileMask:
        if self.p > N:
            raise InputError("mask prefix", f"must be at most N = {N}", self.p)
        return _m.tile_mask(_m.PREFIX, (self.p,), N=N, label=self.label, policy=policy)


def _table_fits(shape: tuple[int, int], label: str) -> None:
    """Refuse up front, in one line naming the mask and the size, a 2-D prefix-sum table that would not fit in
    memory (int64, (rows + 1) x (columns + 1), with the cumulative sum's temporary of the same size)."""
    need = 16 * (shape[0] + 1) * (shape[1] + 1)
    have = estimate.available_bytes()
    if need > 0.8 * have:
        raise InputError("mask", f"needs {need / 2**30:.1f} GiB for the prefix-sum table of its {shape[0]:,} x "
                         f"{shape[1]:,} array ({have / 2**30:.1f} GiB available); use a block mask (file:X.npy:HxW), "
                         "a random or a structured mask", label)  # fmt: skip


def _blocks_mask(blocks: np.ndarray, h: int, w: int, N: int, label: str, policy: str) -> TileMask:
    _table_fits(blocks.shape, label)
    return _m.tile_mask(_m.BLOCKS, (h, w), _m.prefix_table(blocks), N=N, label=label, policy=policy)


@dataclass(frozen=True)
class FromBlocks(Mask):
    """A block mask: ``blocks[I, J]`` allows the h x w block of scores (I h.., J w..) (ragged last blocks)."""

    blocks: np.ndarray = field(repr=False)
    block: tuple[int, int] = (16, 256)
    label: str = "blocks"

    def __post_init__(self):
        object.__setattr__(self, "block", _block("mask block shape", self.block))
        object.__setattr__(self, "blocks", _bool_array("mask blocks", self.blocks))

    def compile(self, N: int, policy: str = "paper") -> TileMask:
        h, w = self.block
        want = (-(-N // h), -(-N // w))
        if self.blocks.shape != want:
            raise InputError("mask blocks", f"must have shape {want} (ceil(N/h), ceil(N/w)) for N = {N}",
                             f"shape {self.blocks.shape}")  # fmt: skip
        return _blocks_mask(self.blocks, h, w, N, self.label, policy)


@dataclass(frozen=True)
class RandomBlocks(Mask):
    """Random block sparsity: each h x w block allowed with probability s, independently, decided by a counter-based
    generator keyed by (seed, block) (:mod:`iosim.algorithms.tile_masks`), so a tile's blocks are known without
    the rest of the pattern.

    FlashAttention's block-sparse tests draw (N/16) x (N/256) block masks: ``block=(16, 256)``."""

    density: float
    block: tuple[int, int] = (16, 256)
    seed: int = 0

    def __post_init__(self):
        _density("mask density", self.density)
        object.__setattr__(self, "block", _block("mask block shape", self.block))
        _seed(self.seed)

    @property
    def label(self) -> str:
        return f"random-blocks:{self.density:g}:{self.block[0]}x{self.block[1]}:{self.seed}"

    def compile(self, N: int, policy: str = "paper") -> TileMask:
        h, w = self.block
        p = (h, w, _m.seed_word(self.seed), _m.threshold(self.density))
        return _m.tile_mask(_m.RANDOM_BLOCKS, p, N=N, label=self.label, policy=policy)


MAX_RANDOM_BLOCKS = 256  # BigBird's random blocks per block row: testing a block costs O(r^2) draws


@dataclass(frozen=True)
class BigBird(Mask):
    """BigBird-like block pattern (Zaheer et al. 2020) on blocks of b x b: g global block rows and columns, a window
    of wb blocks each side of the diagonal block, and r distinct random blocks per block row, drawn by a
    counter-based generator keyed by (seed, block row) (:mod:`iosim.algorithms.tile_masks`)."""

    b: int
    g: int = 1
    wb: int = 1
    r: int = 1
    seed: int = 0

    def __post_init__(self):
        _pos("mask block", self.b)
        for name, v, hi in (("mask global blocks", self.g, 1 << 40), ("mask window blocks", self.wb, 1 << 40),
                            ("mask random", self.r, MAX_RANDOM_BLOCKS)):  # fmt: skip
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= v <= hi:
                raise InputError(name, f"must be an integer from 0 to {hi:,}", v)
        _seed(self.seed)

    @property
    def label(self) -> str:
        return f"bigbird:{self.b}:{self.g}:{self.wb}:{self.r}:{self.seed}"

    def compile(self, N: int, policy: str = "paper") -> TileMask:
        n = -(-N // self.b)
        p = (self.b, self.b, _m.seed_word(self.seed), self.g, self.wb, self.r, n)
        return _m.tile_mask(_m.BIGBIRD, p, N=N, label=self.label, policy=policy)


def _bool_array(name: str, a) -> np.ndarray:
    try:
        arr = np.asarray(a)
    except (TypeError, ValueError) as e:
        raise InputError(name, "must be a 2-D boolean array", type(a).__name__) from e
    if arr.dtype != np.bool_:
        raise InputError(name, "must be a boolean array (dtype bool)", f"dtype {arr.dtype}")
    if arr.ndim != 2 or 0 in arr.shape:
        raise InputError(name, "must be a non-empty 2-D boolean array", f"shape {arr.shape}")
    return arr


@dataclass(frozen=True)
class FromArray(Mask):
    """A user's own N x N boolean array (True = allowed)."""

    allowed: np.ndarray = field(repr=False)
    label: str = "array"

    def __post_init__(self):
        a = _bool_array("mask", self.allowed)
        if a.shape[0] != a.shape[1]:
            raise InputError("mask", "must be a square N x N boolean array", f"shape {a.shape}")
        object.__setattr__(self, "allowed", a)

    def compile(self, N: int, policy: str = "paper") -> TileMask:
        if self.allowed.shape != (N, N):
            raise InputError("mask", f"must have shape ({N}, {N})", f"shape {self.allowed.shape}")
        _table_fits(self.allowed.shape, self.label)
        return _m.tile_mask(_m.ELEMENTS, (), _m.prefix_table(self.allowed), N=N, label=self.label, policy=policy)


@dataclass(frozen=True)
class RandomElements(Mask):
    """Random element sparsity: each score allowed independently with probability ``density``, decided by a
    counter-based generator keyed by (seed, row, column) (:mod:`iosim.algorithms.tile_masks`): no N x N table."""

    density: float
    seed: int = 0

    def __post_init__(self):
        _density("mask density", self.density)
        _seed(self.seed)

    @property
    def label(self) -> str:
        return f"random:{self.density:g}:{self.seed}"

    def compile(self, N: int, policy: str = "paper") -> TileMask:
        p = (_m.seed_word(self.seed), _m.threshold(self.density))
        return _m.tile_mask(_m.RANDOM, p, N=N, label=self.label, policy=policy)


def _int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InputError(name, "must be an integer", text) from None


def _float(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InputError(name, "must be a number", text) from None


def _shape(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2:
        raise InputError("mask block shape", "must be HxW (for example 16x256)", text)
    return _block("mask block shape", (_int("mask block shape", parts[0]), _int("mask block shape", parts[1])))


FORMS = (
    "none, causal, window:W[:causal], dilated:W:K[:causal], blockdiag:L1,L2,..., prefix:P, bigbird:B:G:W:R[:SEED], "
    "random-blocks:S:HxW[:SEED], random:S[:SEED], file:MASK.npy[:HxW], mod:FILE.py:NAME"
)


def parse(text: str) -> Mask:
    """A mask from its ``--mask`` string (see the module docstring); InputError naming the mask's parameter."""
    if isinstance(text, Mask):
        return text
    if not isinstance(text, str) or not text:
        raise InputError("mask", f"must be one of {FORMS}", text)
    kind, _, rest = text.partition(":")
    args = rest.split(":") if rest else []
    n = len(args)
    try:
        if kind in ("none", "dense") and n == 0:
            return Dense()
        if kind == "causal" and n == 0:
            return Causal()
        if kind == "window" and n in (1, 2) and (n == 1 or args[1] == "causal"):
            return SlidingWindow(_int("mask window", args[0]), causal=n == 2)
        if kind == "dilated" and n in (2, 3) and (n == 2 or args[2] == "causal"):
            return Dilated(_int("mask window", args[0]), _int("mask dilation", args[1]), causal=n == 3)
        if kind == "blockdiag" and n == 1:
            return BlockDiagonal(tuple(_int("mask document lengths", x) for x in args[0].split(",")))
        if kind == "prefix" and n == 1:
            return PrefixLM(_int("mask prefix", args[0]))
        if kind == "bigbird" and n in (4, 5):
            v = [_int("mask bigbird", x) for x in args]
            return BigBird(*v)
        if kind == "random-blocks" and n in (2, 3):
            seed = _int("mask seed", args[2]) if n == 3 else 0
            return RandomBlocks(_float("mask density", args[0]), _shape(args[1]), seed)
        if kind == "random" and n in (1, 2):
            return RandomElements(_float("mask density", args[0]), _int("mask seed", args[1]) if n == 2 else 0)
        if kind == "mod" and n == 2:
            return _from_module(args[0], args[1])
        if kind == "file" and n in (1, 2):
            return _from_file(args[0], _shape(args[1]) if n == 2 else None)
    except InputError:
        raise
    raise InputError("mask", f"must be one of {FORMS}", text)


def _from_file(path: str, block: tuple[int, int] | None) -> Mask:
    try:
        a = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise InputError("mask file", "must be a .npy file holding a boolean array that numpy.load can read",
                         f"{path} ({type(e).__name__})") from None  # fmt: skip
    if block is None:
        return FromArray(a, label=f"file:{path}")
    return FromBlocks(a, block, label=f"file:{path}:{block[0]}x{block[1]}")


def check_policy(policy, default: str | None = "paper") -> str | None:
    """An empty-block policy (one of :data:`POLICIES`), ``default`` for None; anything else an InputError."""
    if policy is None:
        return default
    if not isinstance(policy, str) or policy not in POLICIES:
        raise InputError("kv_policy", f"must be one of {', '.join(POLICIES)}", policy)
    return policy


def compile_mask(
    mask, N: int, causal: bool = False, policy: str | None = "paper", allow_long: bool = False
) -> TileMask:
    """The tile oracle of ``mask`` (a :class:`Mask`, a ``--mask`` string, a TileMask or None) for N; ``causal``
    True is the causal mask (it cannot be combined with another mask). ``allow_long`` is the run's consent to long
    work (``--yes``): it reaches a mask_mod's evaluation, which is priced under the same rule."""
    policy = check_policy(policy)
    if isinstance(N, bool) or not isinstance(N, numbers.Integral) or not 0 < N <= 1 << 26:
        raise InputError("N", f"must be an integer from 1 to {1 << 26:,}", N)
    if mask is None or (isinstance(mask, str) and mask in ("none", "dense")):
        return (_m.causal_mask if causal else _m.dense_mask)(N, policy)
    if causal:
        raise InputError("causal", "cannot be combined with a mask (use the causal mask, or a causal window)", True)
    if isinstance(mask, TileMask):
        if mask.N != N:
            raise InputError("mask", f"was compiled for N = {mask.N}, not N = {N}", mask.label)
        return mask.with_policy(policy)
    if isinstance(mask, np.ndarray):
        mask = FromArray(mask)
    mask = parse(mask)
    if allow_long is True and isinstance(mask, _Evaluated) and not mask.allow_long:
        mask = replace(mask, allow_long=True, _cache={})
    return mask.compile(N, policy)


# --- FlexAttention's masks: mask_mod functions and BlockMasks (iosim.masking.mask_mod)
# -----------------------------------

MOD_ELEMENT = (
    3e-8  # seconds per element of a mask_mod evaluated a chunk at a time (measured 2-7 ns NumPy, 23-27 ns torch)
)


def price_mod(N: int, label: str, allow_long: bool, heads: int = 1) -> None:  # noqa: N803
    """The long-run rule on evaluating a mask_mod over N x N at ``heads`` (b, h) pairs."""
    seconds = heads * N * N * MOD_ELEMENT
    what = f"evaluating the mask_mod {label} on {f'{heads:,} x ' if heads > 1 else ''}{N:,} x {N:,} scores"
    if seconds > estimate.LONG_SECONDS and not allow_long and seconds <= estimate.MAX_SECONDS:
        raise InputError(
            "allow_long",
            f"must be True for {what}, estimated at about {estimate.describe(seconds)} (over a minute): --yes on the "
            "command line, allow_long=True on the run, or from_mask_mod(fn, allow_long=True)",
            allow_long,
        )
    estimate.check(seconds, what, allow_long=allow_long, parameter="mask", value=label)


def _mod_compile(fn, b: int, h: int, N: int, label: str, policy: str, allow_long: bool) -> TileMask:
    """The MOD tile oracle of ``fn`` at (b, h) over N x N, priced by the long-run rule and sized before any work."""
    from iosim.masking import mask_mod as _mm

    price_mod(N, label, allow_long)
    n = -(-N // _m.MOD_G)
    _table_fits((n, n + 2), label)
    c = _mm.classify(fn, b, h, N, N, _m.MOD_G, _m.MOD_G, padded=False, bits=True, name="mask_mod")
    params, table = _mm.mod_table(c, N)
    return _m.tile_mask(_m.MOD, params, table, N=N, label=label, policy=policy)


class _Evaluated(Mask):
    """A mask given as a function evaluated at (b, h) (:meth:`allowed`), compiled to the MOD kind once per N. With b
    (h) None it is evaluated at every batch item (head) of a problem (:mod:`iosim.masking.head_masks`), at 0 on
    one head."""

    def allowed(self, N: int):
        raise NotImplementedError

    @property
    def per_head(self) -> bool:
        """Whether it may differ per (b, h): evaluated at each (b, h) of a problem rather than at one."""
        return self.b is None or self.h is None

    def at(self, b: int, h: int) -> _Evaluated:
        """This mask at (b, h) (its own b or h where it has one)."""
        return replace(self, b=self.b if self.b is not None else b, h=self.h if self.h is not None else h, _cache={})

    def compile(self, N: int, policy: str = "paper") -> TileMask:
        if N not in self._cache:
            self._cache.clear()  # one N at a time: a table of (N / 64)^2 words
            b, h = self.b or 0, self.h or 0
            self._cache[N] = _mod_compile(self.allowed(N), b, h, N, self.label, "paper", self.allow_long)
        return self._cache[N].with_policy(policy)


@dataclass(frozen=True, eq=False)
class FromMaskMod(_Evaluated):
    """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` (:mod:`iosim.masking.mask_mod`), evaluated at every (b, h) of a
    problem (b, h None: each head runs under its own mask, :mod:`iosim.masking.head_masks`) or at the (b, h) given for
    every head."""

    fn: object = field(repr=False)
    b: int | None = None
    h: int | None = None
    label: str = ""
    allow_long: bool = False
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        from iosim.masking import mask_mod as _mm

        _mm.check_mask_mod(self.fn)
        for name, v in (("mask_mod b", self.b), ("mask_mod h", self.h)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= v < 1 << 16):
                raise InputError(name, "must be None (every one of the problem's) or an integer from 0 to 65,535", v)
        if not isinstance(self.allow_long, bool):
            raise InputError("allow_long", "must be True or False", self.allow_long)
        if not self.label:
            object.__setattr__(self, "label", f"mod:{_mm.fn_label(self.fn)}")

    def allowed(self, N: int):
        return self.fn


def from_mask_mod(fn, b: int | None = None, h: int | None = None, *, label: str = "",
                  allow_long: bool = False) -> FromMaskMod:  # fmt: skip
    """A FlexAttention ``mask_mod`` as an iosim mask (:class:`FromMaskMod`): per (b, h) of the problem, or at the
    (b, h) given for every head."""
    return FromMaskMod(fn, b, h, label, allow_long)


@dataclass(frozen=True, eq=False)
class FromBlockMask(_Evaluated):
    """A torch ``BlockMask`` (or its index tensors, :func:`iosim.masking.mask_mod.block_index`) as an iosim mask at one
    (b, h), or per (b, h) of a problem (b, h None, its index tensors' leading 1s broadcast): a score is allowed when
    its block is listed full, or listed partial and its mask_mod allows it (every position of a partial block when
    it has none)."""

    index: object = field(repr=False)
    b: int | None = None
    h: int | None = None
    label: str = "blockmask"
    allow_long: bool = False
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def allowed(self, N: int):
        """The mask_mod of this BlockMask's scores at (b, h) for N (its block classes, then its own mask_mod)."""
        from iosim.masking import mask_mod as _mm

        bi = self.index
        if bi.seq_lengths is not None and bi.seq_lengths != (N, N):
            whole = f"must cover the whole sequence, (N_k, N_k) = ({N}, {N}), as every iosim mask does"
            raise InputError("block_mask", f"{whole} (the queries are its last N_q rows); "
                             "iosim.masking.block_sparse takes it "
                             "as built", bi.seq_lengths)  # fmt: skip
        Tc = _mm.check_shape(bi, N, N, *bi.kv_num.shape[:2])
        b, h = self.b or 0, self.h or 0
        cls = bi.classes(Tc)[min(b, bi.kv_num.shape[0] - 1), min(h, bi.kv_num.shape[1] - 1)]
        inner = bi.mask_mod

        def block_mask_mod(b, h, q_idx, kv_idx):
            c = cls[q_idx // bi.BQ, kv_idx // bi.BKV]
            out = c == _mm.FULL
            if inner is None:
                return out | (c == _mm.PARTIAL)
            return out | (
                (c == _mm.PARTIAL) & _mm.call(inner, b, h, q_idx.ravel(), kv_idx.ravel(), "block_mask mask_mod")
            )

        return block_mask_mod

    @property
    def per_head(self) -> bool:  # one (b, h) held and no mask_mod to call: the same at every head
        bi = self.index
        return super().per_head and (bi.kv_num.shape[:2] != (1, 1) or bi.mask_mod is not None)


def from_block_mask(block_mask=None, b: int | None = None, h: int | None = None, *, label: str = "blockmask",
                    allow_long: bool = False, **tensors) -> FromBlockMask:  # fmt: skip
    """A torch ``BlockMask`` built on the CPU, or its four index tensors (``kv_num_blocks``, ``kv_indices``,
    ``full_kv_num_blocks``, ``full_kv_indices``) with ``block_size`` (and optionally ``mask_mod``,
    ``seq_lengths``), as an iosim mask (:class:`FromBlockMask`)."""
    from iosim.masking import mask_mod as _mm

    index = _mm.block_index(block_mask, **tensors)
    for name, v, held in (("block_mask b", b, index.kv_num.shape[0]), ("block_mask h", h, index.kv_num.shape[1])):
        hi = held if held > 1 else 1 << 16  # one held broadcasts: any b (h) its mask_mod is called with
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= v < hi):
            raise InputError(name, f"must be None (every one of the problem's) or an integer from 0 to {hi - 1:,} "
                             f"(the BlockMask holds {held})", v)  # fmt: skip
    return FromBlockMask(index, b, h, label, allow_long)


def _from_module(path: str, name: str) -> Mask:
    """``mod:FILE.py:NAME``: the function NAME of the Python file FILE.py as a mask_mod."""
    import runpy

    from iosim.base.errors import user_code

    try:
        with user_code("mask file", path):
            scope = runpy.run_path(path)
    except OSError as e:
        raise InputError(
            "mask file", "must be a readable Python file defining the mask_mod", f"{path} ({e.strerror})"
        ) from None
    except InputError:  # it exited (user_code)
        raise
    except Exception as e:  # noqa: BLE001 (the user's module: any failure is one line)
        raise InputError("mask file", "must run without raising", f"{path}: {type(e).__name__}: {e}") from None
    if name not in scope:
        raise InputError("mask mod", f"must name a function defined in {path}", name)
    return from_mask_mod(scope[name], label=f"mod:{path}:{name}")
