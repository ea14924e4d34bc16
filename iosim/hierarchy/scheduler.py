"""The tile scheduler as an input of the hierarchy: which CTA runs when, on which slot, and how it walks its loop.

A :class:`Scheduler` plans one launch at a time for :func:`iosim.hierarchy.hierarchy` (its ``scheduler=`` hook):
``plan(launch_index, blocks, cut, declared)`` takes the launch's CTA rows (piece, head-unit copy, KV copy, batch
item) in grid order, the cut (:mod:`iosim.hierarchy.ctas`) and the declared launches (:mod:`.launches`) and returns

``(blocks_in_order, request_order, delay, static_slot)``

* ``blocks_in_order``: the same rows, in the order the launch dispatches them (the **order**);
* ``request_order``: None (every CTA walks its requests as the schedule does) or a permutation of the cut's request
  rows: row k of the walked cut is ``cut.requests[request_order[k]]``. It moves a row only inside its own piece (so
  inside its CTA: ``declared.cta_ptr`` still delimits every CTA) and only inside this launch's CTAs (the identity
  elsewhere, so the launches' orders compose);
* ``delay``: None or, per CTA row of ``blocks_in_order``, the words of idle time before its first request (a
  stall);
* ``static_slot``: None (dynamic dispatch: the next free slot takes the next CTA, today's clock) or, per CTA row, the
  resident slot it must run on (persistent CTAs with a static tile schedule).

**Orders** (``order``; p = the CTA's position in its launch's grid, :meth:`Launches.grid_order`; u = the head-unit
copy b H_u + h, k = the KV copy):

* ``grid`` (for p, for u), ``head-grouped`` (for u, for p), ``swizzled`` (for k, for p, for u): the orders of
  :func:`iosim.hierarchy.simulate.block_order`, recomputed from the rows, whatever order they come in;
* ``sections:K``: head-grouped L2 sections: head units in sections of K (u // K), inside a section the K units'
  CTAs interleaved (for section, for p, for u): the "L2 swizzling" of FlashAttention-3's
  ``DynamicPersistentTileScheduler`` (hopper/tile_scheduler.hpp), whose section is the number of heads whose K and V
  fit 32 MB (:func:`fa3_section_heads`);
* ``lpt``: heaviest first: CTAs sorted by the words of their requests, descending, ties in the given (grid) order;
  FlashAttention-3's scheduler for causal and local masks runs the row blocks in reverse ("longest-processing-time
  first", the same file), which is this order where a row block's work grows with its index. On a launch whose CTAs
  all weigh the same it is the given order. It is allowed on every launch: it is a rule about work, not about
  masks, so nothing here is a "causal order" that a launch without a mask could refuse;
* ``lpt-sections:K``: FlashAttention-3's ``DynamicPersistentTileScheduler`` order itself: sections of K units, inside
  a section heaviest first, ties in the given order.

**Walks** (``walk``: the order of a piece's inner loop; :func:`inner_loop` finds it from the requests):

* ``ascending``: the schedule's own order;
* ``descending``: the inner loop's iterations reversed, prologue and epilogue in place: FlashAttention-2's forward
  walks K_j, V_j from the last block down (csrc/flash_attn/src/flash_fwd_kernel.h, ``int n_block = n_block_max -
  1`` and ``for (; n_block >= n_block_min; --n_block)``);
* ``sawtooth``: pieces alternate: the piece of index s (its CTA's grid position plus its place inside a CTA that
  runs several) walks ascending when s is even, descending when odd; ``sawtooth:W`` alternates in runs of W
  (direction by (s // W) mod 2: with W the resident slots of a one-head launch, successive waves scan K/V in
  opposite directions, so each wave starts on the tiles the previous one used last). Sawtooth wavefront reordering,
  Zhu, Pan and Ding, arXiv 2601.16032. The hook carries one walk per CTA of the cut, shared by its every head unit:
  a persistent CTA alternating over its own successive tiles across heads is not expressible here.

**Persistent CTAs** (``persistent``): P x blocks_per_sm resident CTAs take the launch's tiles in ``order``:

* ``static``: tile t runs on slot t mod slots (FlashAttention-3's ``StaticPersistentTileScheduler``: its grid is
  the SM count and a CTA's next tile is ``tile_idx + gridDim.x``); needs ``slots``;
* ``dynamic``: the next free slot takes the next tile (FlashAttention-3's ``DynamicPersistentTileScheduler``, an
  atomic tile counter). In this clock model that is exactly what non-persistent dispatch already does (a finished
  CTA's slot takes the next CTA at its finishing time), so ``dynamic`` plans the same launch as None: the model has
  no launch overhead per CTA for a persistent kernel to save.

Both refuse a launch whose grid is one CTA per head unit (FlashAttention-1's kernels, ``Kernel.grid == "unit"``).

**Stalls** (``stall`` W, ``seed`` S): each CTA waits a random 0..W words before its first request, drawn by
``numpy.random.default_rng([S, launch_index])`` (reproducible, independent of the order launches are planned in):
for studying launches where CTAs do not progress in lock-step.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from iosim.base.errors import InputError

ORDERS = ("grid", "head-grouped", "swizzled", "sections:K", "lpt", "lpt-sections:K")
WALKS = ("ascending", "descending", "sawtooth", "sawtooth:W")
PERSISTENT = (None, "static", "dynamic")
MAX_STALL = 1 << 40
MAX_SEED = (1 << 63) - 1
MAX_SLOTS = 1 << 26
MAX_SECTION = 1 << 16
MAX_RUN = 1 << 30
FA3_L2_SECTION_BYTES = 32 * 1024 * 1024  # hopper/tile_scheduler.hpp: "int const size_l2 = 32 * 1024 * 1024"


def _int(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not lo <= value <= hi:
        raise InputError(name, f"must be an integer from {lo:,} to {hi:,}", value)
    return int(value)


def _suffix(name: str, text: str, stem: str, hi: int) -> int | None:
    """K of ``stem:K`` (None when ``text`` is not of that form); InputError where K is not an integer 1..hi."""
    if not text.startswith(stem + ":"):
        return None
    tail = text[len(stem) + 1 :]
    if not tail.isdigit() or not 1 <= int(tail) <= hi:
        raise InputError(name, f"{stem}:K needs K an integer from 1 to {hi:,}", text)
    return int(tail)


def fa3_section_heads(seqlen_k: int, headdim: int, element_size: int, qhead_per_khead: int = 1,
                      pack_gqa: bool = False) -> int:  # fmt: skip
    """The heads of one L2 section of FlashAttention-3's DynamicPersistentTileScheduler (hopper/tile_scheduler.hpp,
    ``to_underlying_arguments``): the largest power of two of KV heads whose K and V fit 32 MB (at least 1), times
    the query heads per KV head unless GQA is packed. ``sections:K`` with this K is its order."""
    one = seqlen_k * headdim * element_size * 2
    swizzle = 1 if FA3_L2_SECTION_BYTES < one else 1 << (FA3_L2_SECTION_BYTES // one).bit_length() - 1
    return swizzle * (1 if pack_gqa else qhead_per_khead)


def inner_loop(rows: np.ndarray) -> tuple[int, list[int], int]:
    """A piece's inner loop from its requests (rows of :data:`iosim.hierarchy.ctas.REQ_WIDTH`):
    ``(start, group_starts, stop)``.

    An **inner array** is one the piece requests at more than one region (r0, nr, c0, nc): the operands its loop
    walks (flash2 forward: K, V; the backward's column block: Q, dO, dQ, L, D). The loop runs from the first to
    the last request of an inner array (``start``, ``stop``); before it is the **prologue** (Q_i; K_j, V_j), after
    it the **epilogue** (the stores of O_i, L_i; dK_j, dV_j). The **leading** request is the first of the loop (its
    array and direction): each request of the same array and direction starts an iteration, a **group** (flash2
    forward: (K_j, V_j); backward: (Q_i, dO_i, dQ_i read, L_i, D_i, dQ_i update)). A request of an outer array
    inside the loop stays in the group it falls in. No inner array: no loop (``group_starts`` empty)."""
    n = len(rows)
    if n == 0:
        return 0, [], 0
    regions = np.unique(rows[:, 1:6], axis=0)  # (array, r0, nr, c0, nc), each once
    arrays, count = np.unique(regions[:, 0], return_counts=True)
    inner = np.isin(rows[:, 1], arrays[count > 1])
    if not inner.any():
        return n, [], n
    hits = np.flatnonzero(inner)
    start, stop = int(hits[0]), int(hits[-1]) + 1
    loop = rows[start:stop]
    lead = (loop[:, 0] == rows[start, 0]) & (loop[:, 1] == rows[start, 1])
    return start, (start + np.flatnonzero(lead)).tolist(), stop


def walk_piece(rows: np.ndarray, descending: bool) -> np.ndarray:
    """The local order of a piece's requests (indices 0..n-1): the identity, or with the inner loop's groups
    reversed, prologue and epilogue in place (:func:`inner_loop`)."""
    n = len(rows)
    if not descending:
        return np.arange(n, dtype=np.int64)
    start, starts, stop = inner_loop(rows)
    if len(starts) < 2:
        return np.arange(n, dtype=np.int64)
    bounds = [*starts, stop]
    groups = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(starts))]
    parts = [np.arange(start), *groups[::-1], np.arange(stop, n)]
    return np.concatenate(parts).astype(np.int64)


@dataclass(frozen=True)
class Scheduler:
    """A launch's tile scheduler (module docstring): ``order``, ``walk``, ``persistent``, ``stall`` and ``seed``;
    ``slots`` (P x blocks_per_sm) is the resident CTAs a static persistent schedule deals its tiles over."""

    order: str = "head-grouped"
    walk: str = "ascending"
    persistent: str | None = None
    stall: int = 0
    seed: int = 0
    slots: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.order, str) or not (
            self.order in ("grid", "head-grouped", "swizzled", "lpt")
            or _suffix("order", self.order, "sections", MAX_SECTION)
            or _suffix("order", self.order, "lpt-sections", MAX_SECTION)
        ):
            raise InputError("order", f"must be one of {', '.join(ORDERS)} (K an integer from 1 to {MAX_SECTION:,})",
                             self.order)  # fmt: skip
        if not isinstance(self.walk, str) or not (
            self.walk in ("ascending", "descending", "sawtooth") or _suffix("walk", self.walk, "sawtooth", MAX_RUN)
        ):
            raise InputError("walk", f"must be one of {', '.join(WALKS)} (W an integer from 1 to {MAX_RUN:,})",
                             self.walk)  # fmt: skip
        if self.persistent not in PERSISTENT or (self.persistent is not None and not isinstance(self.persistent, str)):
            raise InputError("persistent", "must be None (one CTA per tile), static or dynamic", self.persistent)
        _int("stall", self.stall, 0, MAX_STALL)
        _int("seed", self.seed, 0, MAX_SEED)
        if self.slots is not None:
            _int("slots", self.slots, 1, MAX_SLOTS)

    # ---- spelling -------------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> Scheduler:
        """A scheduler from its command-line spelling, ``key=value`` pairs separated by commas: ``order=lpt,
        walk=descending,persistent=static,stall=64,seed=1`` (keys order, walk, persistent, stall, seed, slots;
        ``persistent=none`` is None). An empty text is the default scheduler."""
        if not isinstance(text, str):
            raise InputError("scheduler", "must be a text of key=value pairs separated by commas", text)
        given: dict = {}
        for item in (x.strip() for x in text.split(",")):
            if not item:
                continue
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or key not in ("order", "walk", "persistent", "stall", "seed", "slots"):
                raise InputError("scheduler", "takes key=value pairs with keys order, walk, persistent, stall, seed, "
                                 "slots", item)  # fmt: skip
            if key in given:
                raise InputError("scheduler", f"gives {key} twice", text)
            if key in ("stall", "seed", "slots"):
                if not value.isdigit():
                    raise InputError(key, "must be a non-negative integer", value)
                given[key] = int(value)
            elif key == "persistent":
                given[key] = None if value.lower() in ("none", "") else value
            else:
                given[key] = value
        return cls(**given)

    def spelling(self) -> str:
        """The text :meth:`parse` reads back into this scheduler."""
        parts = [f"order={self.order}", f"walk={self.walk}", f"persistent={self.persistent or 'none'}",
                 f"stall={self.stall}", f"seed={self.seed}"]  # fmt: skip
        if self.slots is not None:
            parts.append(f"slots={self.slots}")
        return ",".join(parts)

    def as_dict(self) -> dict:
        return dict(order=self.order, walk=self.walk, persistent=self.persistent, stall=self.stall, seed=self.seed,
                    slots=self.slots)  # fmt: skip

    @property
    def is_default(self) -> bool:
        """Whether every launch it plans is today's (the orders of block_order aside): ascending walks, dispatch to
        the next free slot, no stalls."""
        return self.walk == "ascending" and self.persistent in (None, "dynamic") and self.stall == 0

    # ---- the plan -------------------------------------------------------------------------------------------
    def plan(self, launch_index: int, blocks: np.ndarray, cut, declared, slots: int | None = None) -> tuple:
        """``(blocks_in_order, request_order, delay, static_slot)`` for launch ``launch_index`` (module docstring);
        ``slots`` (P x blocks_per_sm) overrides the field for a static persistent schedule."""
        n_launch = len(declared.launch_ptr) - 1
        k = _int("launch_index", launch_index, 0, max(n_launch - 1, 0))
        blocks = np.asarray(blocks, np.int64)
        if blocks.ndim != 2 or blocks.shape[1] != 4:
            raise InputError("blocks", "must be rows (piece, head-unit copy, KV copy, batch item)", blocks.shape)
        kernel = declared.kernels[k]
        if self.persistent is not None and kernel.grid == "unit":
            raise InputError("persistent", f"applies to a launch with a CTA per tile; '{kernel.name}' runs one CTA "
                             "per head unit (its pieces looped inside)", self.persistent)  # fmt: skip
        slots = self.slots if slots is None else _int("slots", slots, 1, MAX_SLOTS)
        if self.persistent == "static" and slots is None:
            raise InputError("slots", "must be given for persistent=static (P x blocks_per_sm resident CTAs)", None)
        pos = _grid_position(declared, k, blocks[:, 0])
        ordered = blocks[self._order(blocks, pos, cut, declared)]
        request_order = None if self.walk == "ascending" else self._walk(k, ordered, cut, declared)
        n = len(ordered)
        delay = None
        if self.stall:
            delay = np.random.default_rng([self.seed, k]).integers(0, self.stall + 1, n).astype(np.int64)
        static_slot = np.arange(n, dtype=np.int64) % slots if self.persistent == "static" else None
        return ordered, request_order, delay, static_slot

    def _order(self, blocks: np.ndarray, pos: np.ndarray, cut, declared) -> np.ndarray:
        """The permutation of ``blocks`` that dispatches them in ``order``."""
        given = np.arange(len(blocks))
        unit, kv = blocks[:, 1], blocks[:, 2]
        if self.order == "grid":
            keys = (unit, pos)
        elif self.order == "head-grouped":
            keys = (pos, unit)
        elif self.order == "swizzled":
            keys = (unit, pos, kv)
        elif self.order.startswith("sections:"):
            keys = (unit, pos, unit // int(self.order.split(":")[1]))
        else:  # lpt, lpt-sections:K: heaviest first, ties in the given order
            words = cta_words(cut, declared)[blocks[:, 0]]
            keys = (given, -words)
            if self.order.startswith("lpt-sections:"):
                keys = (*keys, unit // int(self.order.split(":")[1]))
        return np.lexsort(keys)  # the last key is the primary one

    def _walk(self, k: int, ordered: np.ndarray, cut, declared) -> np.ndarray:
        """The request order of the walk: each piece of this launch's CTAs walked (:func:`walk_piece`)."""
        order = np.arange(len(cut.requests), dtype=np.int64)
        run = 1 if self.walk in ("sawtooth", "descending") else int(self.walk.split(":")[1])
        for c in np.unique(ordered[:, 0]).tolist():
            lo, hi = int(declared.cta_ptr[c]), int(declared.cta_ptr[c + 1])
            p0 = int(np.searchsorted(cut.piece_ptr, lo, side="right")) - 1
            p1 = int(np.searchsorted(cut.piece_ptr, hi, side="left"))
            base = int(_grid_position(declared, k, np.array([c]))[0])
            for s, p in enumerate(range(p0, p1)):
                a, b = max(int(cut.piece_ptr[p]), lo), min(int(cut.piece_ptr[p + 1]), hi)
                desc = self.walk == "descending" or ((base + s) // run) % 2 == 1
                order[a:b] = a + walk_piece(cut.requests[a:b], desc)
        return order


def cta_words(cut, declared) -> np.ndarray:
    """The words each CTA of the cut requests (its loads, stores and initialisations): the weight ``lpt`` sorts by."""
    total = np.concatenate(([0], np.cumsum(cut.requests[:, 6]))).astype(np.int64)
    ptr = np.asarray(declared.cta_ptr, np.int64)
    return total[ptr[1:]] - total[ptr[:-1]]


def _grid_position(declared, k: int, ctas: np.ndarray) -> np.ndarray:
    """Each CTA's position in launch k's grid (:meth:`Launches.grid_order`). A cut merged from several masks' classes
    (:func:`iosim.hierarchy.simulate._merge`) numbers class q's CTA c at q n + c (n the CTAs of one class): its
    position is c's."""
    c0, c1 = int(declared.launch_ptr[k]), int(declared.launch_ptr[k + 1])
    n = int(declared.launch_ptr[-1])
    grid = declared.grid_order(k)
    inverse = np.empty(c1 - c0, np.int64)
    inverse[grid - c0] = np.arange(c1 - c0)
    base = np.asarray(ctas, np.int64) % n if n else np.asarray(ctas, np.int64)
    if len(base) and (base.min() < c0 or base.max() >= c1):
        raise InputError("blocks", f"must be CTAs of launch {k} (CTAs {c0} to {c1 - 1})", int(base.min()))
    return inverse[base - c0]


# The published scheduler results a later run should simulate beside their figures (docs/scheduler.md). Sizes a
# source states are marked as its; sizes chosen here to bracket a stated threshold say so in ``chosen``. ``compare``
# is the pair of schedulers (this module's spelling) whose difference the source reports.
PUBLISHED_CASES = (
    dict(
        name="sawtooth-gb10",
        source="Zhu, Pan, Ding: Sawtooth Wavefront Reordering: Enhanced CuTile FlashAttention on NVIDIA GB10, "
        "arXiv 2601.16032 (2026), abstract and setup",
        device="GB10 (Grace Blackwell)",
        sms=48,
        l2_bytes=24 * 1024 * 1024,  # 24 MiB, one L2
        algorithm="flash2",
        causal=False,
        d=64,
        tiles=((64, 64), (80, 80)),  # the tile sizes the setup names (64 to 80 rows)
        B=1,
        H_q=1,
        H_kv=1,
        N_k=(65536, 131072),
        kv_bytes=2,
        chosen="B, H, N and fp16 are chosen here, not the paper's (not in the text read): one head's K and V are "
        "16 MiB at N = 65,536 (fit the 24 MiB L2) and 32 MiB at N = 131,072 (do not); sawtooth:48 alternates "
        "per wave at one resident CTA per SM (48 k at k per SM)",
        reported="50 % or greater reduction in L2 misses against the natural (cyclic) order, up to 60 % more "
        "throughput, in CUDA and in CuTile",
        compare=("walk=ascending", "walk=sawtooth:48"),
    ),
    dict(
        name="flashinfer-reverse-q-fits",
        source="flashinfer-ai/flashinfer pull request 3575 (perf: optimize trtllm_fmha_v2 fp8 causal attention "
        "q-tile scheduling), description and gate table",
        device="H200",
        sms=132,
        l2_bytes=62914560,  # the devices table's H200 row: the driver's L2_CACHE_SIZE on an H200 (60 MiB)
        algorithm="flash2",
        causal=True,
        d=128,
        tiles=None,  # the kernel's tiles are not in the PR text: the later run names the ones it uses
        B=1,
        H_q=32,
        H_kv=8,
        N_k=16384,
        N_q=4096,  # reuse 75 %: q_len = (1 - r) seqlen
        kv_bytes=1,  # FP8 paged KV
        chosen="",
        reported="KV 33.5 MB 'fits L2, but fails 2x headroom heuristic': global reverse-Q 1177.45 us against "
        "1175.85 us with it gated off (1.00x)",
        compare=("order=lpt-sections:1", "order=lpt"),
    ),
    dict(
        name="flashinfer-reverse-q-exceeds",
        source="flashinfer-ai/flashinfer pull request 3575, gate table",
        device="H200",
        sms=132,
        l2_bytes=62914560,
        algorithm="flash2",
        causal=True,
        d=128,
        tiles=None,
        B=1,
        H_q=32,
        H_kv=8,
        N_k=32768,
        N_q=8192,
        kv_bytes=1,
        chosen="",
        reported="KV 67 MB 'exceeds L2': global reverse-Q 4712.94 us against 4596.09 us with it gated off (2.5 % "
        "slower)",
        compare=("order=lpt-sections:1", "order=lpt"),
    ),
)
