"""Beyond two levels: thread blocks on P SMs, their shared memory (the explicit M words of the two-level model), one
shared L2 of C words in front of DRAM. :func:`hierarchy` runs an algorithm's launch through it and counts every
level in Timeloop's words.

The launch
----------
``B`` batch elements x ``H_q`` query heads (``H_kv`` key/value heads, g = H_q / H_kv; the field names of
:class:`iosim.Problem`), each head an independent copy of the single-head schedule at its own slow-memory addresses,
except that query head h reads the K and V of KV head h // g (the same addresses: where an L2 helps GQA), and that
under a mask that differs per (b, h) each head unit runs its own mask's schedule (:func:`_merge`); where every
array lives is :meth:`iosim.Problem.storage` (an MLA latent's V at K's addresses, the page table one per batch item).
Gradients dK, dV are per query head (FlashAttention-2's GQA backward accumulates them per query head and sums
afterwards). The single-head schedule is cut into pieces by :mod:`iosim.hierarchy.ctas`, and the pieces run as the
kernels :mod:`iosim.hierarchy.launches` declares (one CTA per piece, or one per head for FlashAttention-1's kernels; a
launch whose CTAs would race is refused). Split-KV (``splits`` > 1, flash2's forward) is the split kernel, one CTA per
(row block, split), then the combine kernel. flash2's backward over a problem whose dQ output dtype is not its fp32
accumulator's ends with **dQ's conversion**, a launch of its own after the schedule's (reading ``dq_accum``, dQ's own
lines, and writing ``dQ_out``): iosim run does not count it, so the result keeps it apart (its arrays' ``launch``
"convert dQ"): DRAM = the schedule's launches (:attr:`HierarchyResult.schedule_dram`; with C = 0 the two-level count,
per array) + the conversion (:attr:`HierarchyResult.convert_dq_dram`).

Each CTA has M words of shared memory; an SM holds ``floor(smem_per_sm / (M x bytes_per_word + 1 KB))`` of them (at
most 32; the 1 KB is the CUDA driver's reservation per block), so ``P x blocks_per_sm`` CTAs are resident at once.

**Resident CTAs from the kernel's resources** (the :class:`~iosim.hierarchy.machine.Machine`'s ``kernel``, with a
device preset): the kernel the launch models, its threads
per block, registers per thread and shared memory per block (:func:`iosim.hierarchy.resident.kernel_of`: a
FlashAttention-2 kernel name, whose traits give its threads and shared memory by FA2's source, or the figures as a
dict), gives the blocks per SM by the CUDA occupancy calculation on the device's per-SM limits
(:func:`iosim.hierarchy.resident.resident_ctas`: threads, registers, shared memory, blocks per SM, each cited in the
devices table). ``HierarchyResult.resident`` says which limit bound it; with registers unknown the count is the
bound the other limits allow and says so ("upper bound"). M is then the two-level model's fast memory per CTA (a
kernel may hold part of it in registers: FA2 keeps O and S there), not what decides residency. A ``blocks_per_sm``
passed wins (at most what the kernel's resources allow).

**Block orders** (``Scheduler(order=...)``, within each launch; p = the CTA's piece, the row block of flash2's forward):

* ``grid``: heads fastest, for p, for b, for h (a grid with batch x heads as blockIdx.x);
* ``head-grouped``: all CTAs of one head together, for b, for h, for p (FlashAttention-2's and Triton's launch
  grid: the row block is blockIdx.x);
* ``swizzled``: the g query heads that share a KV head interleaved at each piece, for b, for KV head, for p, for
  the g heads (keeps the CTAs that read the same K_j, V_j together; the same as head-grouped when g = 1).

**The clock** (:mod:`iosim.hierarchy.l2`): each resident CTA advances by the words it moves; the L2 sees the
requests of all resident CTAs in the order of their clocks, ties by block id; a finished CTA's slot takes the
next CTA in order; launches run one after another and the L2 keeps its contents across them.

Counts (Timeloop's vocabulary: *fill* = words into a level from the level below, *read* = words read out of a
level by the level above, *update* = words written into a level from above)
----------------------------------------------------------------------------------------------------------------
* shared memory: fill = the two-level reads (words loaded); its stores are the L2's updates;
* L2: read = words the CTAs load, update = words the CTAs store (and the memsets write), fill = words brought
  from DRAM (L per missed line), write-back = words of dirty lines evicted or flushed at the end;
* DRAM: read = L2 fill, update = L2 write-back. With C = 0 (no L2) DRAM read and update are the two-level reads
  and writes, word for word.

Bytes per array (``element_bytes``)
-----------------------------------
``uniform`` (the default): every array's word is ``bytes_per_word`` bytes (default 2: fp16/bf16 operands; over a
problem, its K/V dtype's) and a line is L of them. ``kernel`` (a problem's dtypes; ``iosim hierarchy --dtype-q
--dtype-kv --dtype-o``): each array at the dtype its kernel moves it in, :func:`kernel_dtype` (the statistics L, l,
m, D, the split-KV partials and dQ's accumulator in fp32, the GQA backward's dK/dV partials at Q's dtype). The L2's
capacity and line are bytes (C and L words of ``bytes_per_word``); array a's line holds ``line bytes / a's element
bytes`` of its words, and every level is reported per array in words and in bytes (:meth:`LevelCounts.bytes`).
Under ``kernel`` the launches that add an array atomically (flash2's backward, dQ) issue one **reduction** per
element (``l2_reduce``, at dQ's accumulator's 4 bytes: Nsight Compute's ``op_red``) where the schedule loads and
stores dQ_i. With every array at one element size, ``kernel`` moves exactly ``uniform``'s words (a forward pass).

The L2 in partitions (the Machine's ``partitions``, ``home_lines``)
-------------------------------------------------------------------
An L2 of ``partitions`` parts of C / partitions each (:mod:`iosim.hierarchy.l2`: the NVIDIA A100 whitepaper's "L2
cache" section, each partition caching for the SMs of the GPCs directly connected to it, coherent across them).
Slot n runs on SM n mod P; SM s is in partition s x partitions // P (the SMs split evenly, in halves for two). A
line's home partition is (its index within its array copy // ``home_lines``) mod partitions: NVIDIA does not
publish its address hash, so this one is a stated choice (1: lines alternate). A read that misses its SM's
partition crosses the fabric from the line's home (``fabric``, what ``lts__t_sectors_srcunit_ltcfabric`` counts),
which fills it from DRAM on its own miss; writes and reductions are made dirty at the home. ``partitions="device"``
takes the device preset's ``l2_partitions`` (2 on the A100 and H100, with their sources); the default is one
partition, the single shared L2, exactly, which every figure published before the partitions were modelled used
(docs/hierarchy-hardware.md holds the launches measured on an H100 under both).

Replacement (``policy``)
------------------------
``lru`` (the default): the segment LRU of :mod:`iosim.hierarchy.l2`, a fully associative line LRU, exactly. ``opt``:
Belady's, the floor, over the line stream the clock recorded. ``random`` (``random:SEED``) and ``sets:W``
(``sets:W:xor``): random replacement and W-way set-associative LRU (:mod:`iosim.hierarchy.replacement`), replayed
over the same recorded stream, one L2 of whole lines (partitions and sectors refused, as under OPT); NVIDIA publishes
neither the H100's replacement policy nor its associativity, so these are alternatives to test, not a preset's.

DRAM writes, both ways
----------------------
Each launch's DRAM writes *during* the kernel (dirty lines evicted while it runs: Nsight Compute's per-kernel
``dram__bytes_write``) and the final flush after the last launch (dirty lines left):
:attr:`HierarchyResult.dram_writes`; their sum is the DRAM update (the hierarchy's total, which flushes every dirty
line at the end). Each launch's DRAM reads are there too (``read_bytes``). Under the Machine's ``flush="per-kernel"``
(Nsight Compute's cache control: each kernel it profiles starts from a clean L2) the L2 is written back and emptied
after each launch but the last: that write-back is the launch's ``flush_after_bytes``, apart from its writes during
the kernel and from the next launch's.

A tile scheduler (``scheduler``)
--------------------------------
An object with a method ``plan(launch_index, blocks, cut, declared)`` called once per launch, in order: ``blocks``
the launch's CTAs in ``order`` (rows: CTA, head-unit copy, KV copy, batch item; :func:`block_order`), ``cut`` the
unit's requests (:class:`iosim.hierarchy.ctas.Cut`) and ``declared`` the launches
(:class:`iosim.hierarchy.launches.Launches`: CTA c's requests are rows ``cta_ptr[c]:cta_ptr[c + 1]`` of
``cut.requests``). It returns ``(blocks_in_order, request_order, delay, static_slot)``, each None for today's
behaviour: ``blocks_in_order`` a reordering of ``blocks`` (the launch order); ``request_order`` a permutation of
the rows of ``cut.requests`` that keeps every CTA's rows within its own span (the order in which a CTA issues its
requests: a descending walk, say); ``delay`` per block (aligned with ``blocks_in_order``), words of idle time before
its first request; ``static_slot`` per block, the resident slot (0 to P x blocks_per_sm - 1) it must run on, each
slot running its blocks in launch order (a persistent kernel with a static tile schedule), or -1 for every block of
the launch (the next free slot takes the next block). Anything else is one line naming ``scheduler``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from iosim.base.errors import InputError
from iosim.hierarchy import ctas as ctas_mod
from iosim.hierarchy import l2, replacement
from iosim.hierarchy import launches as launches_mod
from iosim.hierarchy.devices import MAX_BLOCKS_PER_SM, RESERVED_SMEM_PER_BLOCK, Device
from iosim.hierarchy.machine import FAR_COPY, Machine, check_int, machine_of
from iosim.hierarchy.scheduler import Scheduler
from iosim.runner import estimate
from iosim.runner.api import short_keywords

ORDERS = ("grid", "head-grouped", "swizzled")
POLICIES = ("lru", "opt", "random", "sets:W")  # and random:SEED, sets:W:xor (iosim.hierarchy.replacement)
ELEMENT_BYTES = ("uniform", "kernel")  # every array at bytes_per_word, or each at its kernel dtype (kernel_dtype)
# More than one L2 partition cuts segments where the home changes (every home_lines lines): an LRU step per segment,
# about HIERARCHY_LINE seconds a line at home_lines = 1. Measured on the 2-core machine under load (load average 8):
# flash2 forward, B = 4, H_q = 16, N = 8192, d = 64, bf16 on the H100 preset, 16.8 million line requests, 7.3-10.2 s
# in the L2's run (440-600 ns a line; 0.2 s with one partition, 1.0 s at home_lines = 16).
HIERARCHY_LINE = 6e-7
COPY_KINDS = {
    "head": 0,
    "kv head": 1,
    "batch item": 2,
}  # iosim.spec.problem.Problem.storage's copies: inst_copy's column
MAX_HEADS = 1 << 16
# OPT under the hierarchy holds, per line access: the int64 line stream and its flag byte, the int32 copy the cache
# simulator takes, its int32 next use, and the simulator's own per-access arrays. Measured from outside: 1.71 GB held
# where 9 bytes a line predicted 0.76 GB, about 20.3 bytes a line: the guard prices 21 (at most).
OPT_BYTES_PER_LINE = 21


@dataclass
class LevelCounts:
    """One array's words at each level (summed over every head); ``launch``: "schedule" (the schedule's launches,
    what iosim run counts) or "convert dQ" (dQ's conversion, which it does not)."""

    two_level_reads: int = 0
    two_level_writes: int = 0
    l2_read: int = 0
    l2_update: int = 0
    l2_fill: int = 0
    l2_writeback: int = 0
    compulsory: int = 0  # every copy's lines once: fetched if first read, written back if ever written
    launch: str = "schedule"
    l2_reduce: int = 0  # words added by atomic reductions at the L2 (flash2's backward's dQ, element_bytes="kernel")
    fabric: int = 0  # words that crossed between L2 partitions (lts__t_sectors_srcunit_ltcfabric's traffic)
    word_bytes: int = 2  # bytes per word of this array: bytes_per_word, or its kernel dtype's
    fabric_read: int = 0  # the reads' part of fabric (what lts__t_sectors_srcunit_ltcfabric_op_read counts)
    fabric_reduce: int = 0  # the reductions' part of fabric (reductions homed across the fabric)

    LEVELS = ("two_level_reads", "two_level_writes", "l2_read", "l2_update", "l2_reduce", "l2_fill", "l2_writeback",
              "fabric", "compulsory")  # fmt: skip

    @property
    def l2_requests(self) -> int:
        """Words the SMs request from the L2 (Nsight Compute's srcunit tex): reads, updates and reductions."""
        return self.l2_read + self.l2_update + self.l2_reduce

    def bytes(self, level: str) -> int:
        """A level's words of this array in bytes (``dram``, ``dram_read``, ``dram_update`` or one of LEVELS)."""
        return int(getattr(self, level)) * self.word_bytes

    @property
    def dram_read(self) -> int:
        return self.l2_fill

    @property
    def dram_update(self) -> int:
        return self.l2_writeback

    @property
    def dram(self) -> int:
        return self.l2_fill + self.l2_writeback

    @property
    def two_level(self) -> int:
        return self.two_level_reads + self.two_level_writes


@dataclass
class HierarchyResult:
    """What :func:`hierarchy` returns: the launch, the per-array counts at every level and the totals."""

    algorithm: str
    backward: bool
    B: int
    H_q: int
    H_kv: int
    N: int
    d: int
    M: int
    P: int
    blocks_per_sm: int
    C: int
    L: int
    bytes_per_word: int
    order: str
    policy: str
    device: str | None
    tiling: str
    ctas: int
    launches: list[dict]  # the declared kernels launched, in order: kernel, models, grid, atomic, ctas, waves
    waves: list[int]
    per_array: dict[str, LevelCounts]
    requests: int
    seconds: float
    clock: list[int] = field(default_factory=list)
    problem: object = None  # the iosim.Problem launched, when it is not one head of N x d copied (N_q != N_k, ...)
    gqa: str = "per-head"  # per-head: a CTA family per query head; packed: per KV head, its g heads' rows together
    splits: int = 1  # split-KV (flash2's forward): the split kernel's splits per row block, then the combine kernel
    element_bytes: str = "uniform"  # uniform: every array at bytes_per_word; kernel: each at its kernel dtype
    l2_partitions: int = 1
    home_lines: int = 1  # a line's home partition: (its index in its array copy // home_lines) mod partitions
    final_flush_bytes: int | None = None  # dirty bytes written back after the last launch (None under OPT)
    resident: str = "given"  # how blocks_per_sm was decided: given, the kernel's limiter, or M's shared memory
    sector_bytes: int | None = None  # the L2 fills and writes back sectors of this many bytes (None: whole lines)
    far_copy: str = "both"  # where a line read from the far partition is kept (FAR_COPY, iosim.hierarchy.l2)
    flush: str | None = None  # None: the L2 kept across launches; "per-kernel": written back and emptied between them

    def _sum(self, attr: str) -> int:
        return sum(getattr(c, attr) for c in self.per_array.values())

    @property
    def two_level(self) -> int:
        """The two-level count of the whole launch (every head's reads and writes)."""
        return self._sum("two_level")

    @property
    def dram_read(self) -> int:
        return self._sum("dram_read")

    @property
    def dram_update(self) -> int:
        return self._sum("dram_update")

    @property
    def dram(self) -> int:
        """DRAM words: L2 fills plus L2 write-backs."""
        return self.dram_read + self.dram_update

    @property
    def dram_bytes(self) -> int:
        """DRAM bytes, each array's words at its bytes per word."""
        return sum(c.bytes("dram") for c in self.per_array.values())

    def level_bytes(self, level: str) -> int:
        """A level's bytes over every array (:meth:`LevelCounts.bytes`)."""
        return sum(c.bytes(level) for c in self.per_array.values())

    @property
    def dram_writes(self) -> list[dict]:
        """DRAM writes per launch, both ways (None under OPT): ``during`` the kernel (write-backs of evicted dirty
        lines while it runs: Nsight Compute's per-kernel ``dram__bytes_write``) and ``with_flush`` (the last launch
        also writes back every dirty line left at the end, and under ``flush="per-kernel"`` each launch the flush
        after it, ``flush_after_bytes``; so their sum is :attr:`dram_update`'s bytes); ``read_bytes``: the launch's
        DRAM reads (fills)."""
        if self.final_flush_bytes is None:
            return []
        out = [{"kernel": k["kernel"], "during_words": k["dram_write_during"], "during_bytes":
                k["dram_write_during_bytes"], "flush_after_bytes": k["flush_after_bytes"],
                "with_flush_bytes": k["dram_write_during_bytes"] + k["flush_after_bytes"],
                "read_bytes": k["dram_read_bytes"]} for k in self.launches]  # fmt: skip
        if out:
            out[-1]["with_flush_bytes"] += self.final_flush_bytes
        return out

    @property
    def schedule_dram(self) -> int:
        """DRAM words of the schedule's launches (the arrays iosim run counts): with C = 0, its two-level count.
        Under ``policy="opt"`` a fill is counted by the line's owner, so the conversion's fills of ``dq_accum`` count
        under dQ here (the total is exact)."""
        return sum(c.dram for c in self.per_array.values() if c.launch == "schedule")

    @property
    def convert_dq_dram(self) -> int:
        """DRAM words of dQ's conversion launch (0 where it does not run): dram = schedule_dram + this."""
        return self.dram - self.schedule_dram

    @property
    def compulsory(self) -> int:
        """The compulsory DRAM words of a launch that touches every word of its arrays (a non-causal, unmasked
        run): each copy's lines once, fetched where the array's first access reads it, written back where it is
        ever written. What an L2 holding everything moves (tests/test_hierarchy.py checks the exact set version)."""
        return self._sum("compulsory")

    @property
    def ratio(self) -> float:
        """DRAM words over the two-level count."""
        return self.dram / self.two_level if self.two_level else float("nan")

    def table(self, fmt: str = "simple") -> str:
        """Words per array and level; the reduction and fabric columns where there are any."""

        head = ["array", "smem fill", "L2 read", "L2 update", "L2 fill", "L2 write-back", "DRAM / two-level"]
        extra = [k for k in ("l2_reduce", "fabric") if self._sum(k) or (k == "fabric" and self.l2_partitions > 1)]
        return self._table(fmt, head, extra)

    def bytes_table(self, fmt: str = "simple") -> str:
        """Bytes per array and level, each array at its bytes per word."""
        from tabulate import tabulate

        head = ["array", "bytes/word", "L2 read", "L2 update", "L2 reduce", "L2 fill", "L2 write-back", "fabric",
                "DRAM"]  # fmt: skip
        keys = ("l2_read", "l2_update", "l2_reduce", "l2_fill", "l2_writeback", "fabric", "dram")
        rows = [[n, str(c.word_bytes), *(f"{c.bytes(k):,}" for k in keys)] for n, c in self.per_array.items()]
        rows.append(["total", "", *(f"{self.level_bytes(k):,}" for k in keys)])
        return tabulate(rows, headers=head, tablefmt=fmt, disable_numparse=True)

    def _table(self, fmt: str, head: list, extra: list) -> str:
        from tabulate import tabulate

        head = head[:4] + [{"l2_reduce": "L2 reduce", "fabric": "fabric"}[k] for k in extra] + head[4:]
        keys = ["two_level_reads", "l2_read", "l2_update", *extra, "l2_fill", "l2_writeback"]
        if "fabric" in extra:  # after the fills it serves
            keys = [*[k for k in keys if k != "fabric"], "fabric"]
            head = [*[h for h in head[:-1] if h != "fabric"], "fabric", head[-1]]
        rows = []
        convert = [n for n, c in self.per_array.items() if c.launch != "schedule"]
        for name, c in self.per_array.items():
            if convert and name == convert[0]:  # the schedule's launches, then dQ's conversion (its own rows)
                sched = [c for c in self.per_array.values() if c.launch == "schedule"]
                rows.append(["schedule's launches", *(f"{sum(getattr(c, k) for c in sched):,}" for k in keys),
                             f"{self.schedule_dram / self.two_level:.3f}" if self.two_level else "-"])  # fmt: skip
            rows.append([name if c.launch == "schedule" else f"{name} ({c.launch})",
                         *(f"{getattr(c, k):,}" for k in keys),
                         f"{c.dram / c.two_level:.3f}" if c.two_level else "-"])  # fmt: skip
        rows.append(["total" if not convert else "total (schedule's launches + convert dQ)",
                     *(f"{self._sum(k):,}" for k in keys), f"{self.ratio:.3f}"])  # fmt: skip
        return tabulate(rows, headers=head, tablefmt=fmt, disable_numparse=True)

    def as_dict(self) -> dict:
        from iosim.base.version import __version__

        keys = ("algorithm", "backward", "B", "H_q", "H_kv", "N", "d", "M", "P", "blocks_per_sm", "C", "L")
        out = {"iosim_version": __version__, **{k: getattr(self, k) for k in keys}}
        out.update(problem=None if self.problem is None else self.problem.as_dict(), gqa=self.gqa, splits=self.splits)
        out.update(
            bytes_per_word=self.bytes_per_word,
            order=self.order,
            policy=self.policy,
            device=self.device,
            tiling=self.tiling,
            ctas=self.ctas,
            launches=list(self.launches),
            waves=list(self.waves),
            requests=self.requests,
            seconds=self.seconds,
            two_level=self.two_level,
            dram_read=self.dram_read,
            dram_update=self.dram_update,
            dram=self.dram,
            dram_bytes=self.dram_bytes,
            schedule_dram=self.schedule_dram,
            convert_dq_dram=self.convert_dq_dram,
            ratio=self.ratio,
            compulsory=self.compulsory,
            per_array={
                n: {**vars(c), "dram_read": c.dram_read, "dram_update": c.dram_update,
                    **{f"{k}_bytes": c.bytes(k) for k in (*c.LEVELS, "dram_read", "dram_update", "dram")}}
                for n, c in self.per_array.items()
            },
            element_bytes=self.element_bytes,
            l2_partitions=self.l2_partitions,
            home_lines=self.home_lines,
            far_copy=self.far_copy,
            fabric=self._sum("fabric"),
            fabric_bytes=self.level_bytes("fabric"),
            l2_reduce=self._sum("l2_reduce"),
            l2_request_bytes=sum(c.bytes("l2_read") + c.bytes("l2_update") + c.bytes("l2_reduce")
                                 for c in self.per_array.values()),
            dram_writes=self.dram_writes,
            final_flush_bytes=self.final_flush_bytes,
            resident=self.resident,
            sector_bytes=self.sector_bytes,
            flush=self.flush,
        )  # fmt: skip
        return out


_int = check_int


def block_order(order: str, pieces: np.ndarray, B: int, H_q: int, H_kv: int) -> np.ndarray:  # noqa: N803
    """The CTAs of one launch in ``order``: rows (piece, head-unit copy, KV copy, batch item)."""
    g = H_q // H_kv
    P = len(pieces)
    if order == "grid":  # for p, b, h
        p, b, h = np.meshgrid(np.arange(P), np.arange(B), np.arange(H_q), indexing="ij")
    elif order == "head-grouped":  # for b, h, p
        b, h, p = np.meshgrid(np.arange(B), np.arange(H_q), np.arange(P), indexing="ij")
    else:  # swizzled: for b, kv, p, j (h = kv g + j)
        b, kv, p, j = np.meshgrid(np.arange(B), np.arange(H_kv), np.arange(P), np.arange(g), indexing="ij")
        h = kv * g + j
    p, b, h = p.ravel(), b.ravel(), h.ravel()
    return np.stack([pieces[p], b * H_q + h, b * H_kv + h // g, b], axis=1).astype(np.int64)


@dataclass
class _Layout:
    """Where every array's copies and segments are (see :mod:`iosim.hierarchy.l2`)."""

    kv: np.ndarray  # the copy kind of each array (COPY_KINDS)
    base: np.ndarray  # the array whose addresses it uses (itself, or K for an MLA latent's V)
    stride: np.ndarray  # its row stride in words (the base array's width)
    nl: np.ndarray
    nseg: np.ndarray
    gbase: np.ndarray
    lbase: np.ndarray
    loff: np.ndarray
    soff: np.ndarray
    seg_of_line: np.ndarray
    seg_start: np.ndarray
    seg_aid: np.ndarray
    n_segments: int
    n_lines: int
    seg_home: np.ndarray  # the home partition of the segment starting at seg_start[j]
    line_words: np.ndarray  # each array's words per line


def _layout(trace, cut, B: int, H_q: int, H_kv: int, Lw, where, parts: int = 1, G: int = 1, iso: int = 0) -> _Layout:  # noqa: N803
    """Every array's lines, copies and segments; ``where`` is :meth:`iosim.spec.problem.Problem.storage`, the one
    address
    map (which array's addresses an array uses, and what one copy of it serves); ``Lw`` each array's words per line.
    With ``parts`` > 1 L2 partitions a line's home is (its index within its array copy // G) mod parts (every copy
    aligned to G parts lines), and segments also end where the home changes (every G lines). ``iso`` = 1 (sector
    fills): a line some request covers only in part is a segment of its own."""
    names = trace.names
    n = len(names)
    placed = [where(nm) for nm in names]
    base = np.array([names.index(b) if b in names else a for a, (b, _) in enumerate(placed)], np.int64)
    kv = np.array([COPY_KINDS[c] for _, c in placed], np.int64)
    used = np.zeros(n, bool)
    if len(cut.requests):
        used[base[np.unique(cut.requests[:, 1])]] = True
    rows = np.array([trace.shapes[nm][0] for nm in names], np.int64)
    cols = np.array([trace.shapes[nm][1] for nm in names], np.int64)
    stride = cols[base]
    nl = np.where(used & (base == np.arange(n)), -(-(rows * cols) // Lw), 0).astype(np.int64)
    copies = np.choose(kv, [B * H_q, B * H_kv, B]).astype(np.int64)
    loff = np.concatenate(([0], np.cumsum(nl + 1)[:-1])).astype(np.int64)
    mark = np.zeros(int(np.sum(nl + 1)) + 1, np.int8)
    l2.mark_boundaries(cut.requests, 0, len(cut.requests), base, stride, loff, Lw, mark, iso)
    seg_of_line = np.zeros(max(int(np.sum(nl)), 1), np.int64)
    starts, nseg, soff, lo_off = [], np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    so = lo = 0
    for a in range(n):
        if not used[a]:
            soff[a], lo_off[a] = so, lo
            continue
        m = mark[loff[a] : loff[a] + nl[a] + 1].copy()
        m[0] = m[nl[a]] = 1
        if parts > 1:
            m[::G] = 1
        b = np.flatnonzero(m)
        nseg[a] = len(b) - 1
        soff[a], lo_off[a] = so, lo
        starts.append(b)
        seg_of_line[lo : lo + nl[a]] = np.cumsum(m[: nl[a]]) - 1
        so += len(b)
        lo += nl[a]
    seg_start = np.concatenate(starts).astype(np.int64) if starts else np.zeros(1, np.int64)
    per = nseg * copies
    gbase = np.concatenate(([0], np.cumsum(per)[:-1])).astype(np.int64)
    lbase = np.concatenate(([0], np.cumsum(nl * copies)[:-1])).astype(np.int64)
    n_segments = int(np.sum(per))
    seg_aid = np.repeat(np.arange(n, dtype=np.int16), per)
    seg_home = (seg_start // G) % parts
    return _Layout(
        kv, base, stride, nl, nseg, gbase, lbase, lo_off, soff, seg_of_line, seg_start, seg_aid, n_segments,
        int(np.sum(nl * copies)), seg_home.astype(np.int64), np.asarray(Lw, np.int64),
    )  # fmt: skip


def _merge(parts: list, mask) -> tuple:
    """One cut and one set of launches from the head units' classes (a unit trace per distinct mask): the requests
    of every class one after another, class k's CTA c at CTA k n + c (n CTAs a class); one line unless every class
    launches the same kernels with the same CTAs per launch on the same arrays and tiles."""
    first = parts[0]
    if len(parts) == 1:
        return first.cut, first.declared
    for x in parts[1:]:
        if (list(x.arrays.names) != list(first.arrays.names) or x.tiling != first.tiling
                or not np.array_equal(x.declared.launch_ptr, first.declared.launch_ptr)
                or x.declared.ctas != first.declared.ctas):  # fmt: skip
            raise InputError("mask", "differs per (b, h) in a way that changes the launch's thread blocks (their "
                             "number per launch or the tiles): give one mask for every head", mask.label)  # fmt: skip
    ptr, events, cta_ptr, off = [first.cut.piece_ptr[:1]], [], [first.declared.cta_ptr[:1]], 0
    for x in parts:
        assert x.declared.cta_ptr[-1] == len(x.cut.requests)
        ptr.append(x.cut.piece_ptr[1:] + off)
        cta_ptr.append(x.declared.cta_ptr[1:] + off)
        events.append(x.cut.piece_events)
        off += len(x.cut.requests)
    cut = ctas_mod.Cut(np.concatenate([x.cut.requests for x in parts]), np.concatenate(ptr), np.concatenate(events))
    return cut, launches_mod.Launches(first.declared.kernels, first.declared.launch_ptr, np.concatenate(cta_ptr))


def _single(N: int, d: int):  # noqa: N803
    from iosim.spec.problem import Problem

    return Problem(N=N, d=d)


def _converts_dq(algorithm: str, backward: bool, problem) -> bool:
    """Whether dQ's conversion launch runs: flash2's backward over a problem whose dQ output dtype (dtype_o) is not
    the dtype its accumulator is kept in (fp32; fp64 in a problem at fp64)."""
    return (
        algorithm == "flash2" and bool(backward) and problem is not None and problem.dtype_of("dQ") != problem.dtype_o
    )


def _with_convert_dq(storage):
    """The address map with the conversion's arrays: the accumulator it reads is dQ's words (the same lines), the
    dQ it writes an array of its own, one copy per head unit as dQ."""

    def where(array: str) -> tuple[str, str]:
        if array == launches_mod.DQ_ACCUM:
            return storage("dQ")
        if array == launches_mod.DQ_OUT:
            return launches_mod.DQ_OUT, storage("dQ")[1]
        return storage(array)

    return where


def _from_problem(problem, N, d, gqa: str, splits: int = 1, backward: bool = False) -> tuple:
    """(N, d, B, H_q, H_kv, causal, bytes per word, unit) of an :class:`iosim.Problem` the hierarchy can run. The
    unit is the problem one family of CTAs runs (None: one head of N x d, the seed case): one query head of N_q
    rows against N_k keys (GQA ``per-head``), or one KV head's g query heads packed together (``packed``); the
    launch is B H_q (per-head) or B H_kv (packed) copies of it. The backward under per-head GQA (g > 1) runs a KV
    head's g query heads as one unit too, each head's CTAs on its own, because their dK, dV partials meet in the
    group sum that follows (a launch of its own)."""
    from iosim.spec.problem import GQA_POLICIES, Problem

    if not isinstance(problem, Problem):
        raise InputError("problem", "must be an iosim.Problem", type(problem).__name__)
    if N is not None or d is not None:
        raise InputError("N" if N is not None else "d", "must not be given beside a problem (it has its own)", N or d)
    if not isinstance(gqa, str) or gqa not in GQA_POLICIES:
        raise InputError("gqa", f"must be one of {', '.join(GQA_POLICIES)}", gqa)
    p = problem
    unit = None
    group = p.g > 1 and (gqa == "packed" or backward)  # a KV head's g query heads in one unit
    if p.N_q != p.N_k or p.d_qk != p.d_v or p.latent or p.page_size or group or splits != 1:
        unit = Problem(B=1, H_q=p.g if group else 1, H_kv=1, N_q=p.N_q, N_k=p.N_k, d_qk=p.d_qk,
                       d_v=p.d_v, causal=p.causal, latent=p.latent, page_size=p.page_size)  # fmt: skip
    word = p.bytes_of("K", 1)  # one word of the K/V cache, which dominates the traffic
    return p.N_q, p.d_qk, p.B, p.H_q, p.H_kv, p.causal, word, unit


SCHEDULE_KEYWORDS = ("kv_policy", "tiling", "Br", "Bc", "block", "gqa", "mla", "splits", "pages")
MACHINE_KEYWORDS = ("P", "C", "L", "blocks_per_sm", "partitions", "home_lines", "sector_bytes", "kernel")
# The keywords hierarchy() no longer takes, each refused in one line naming the object that takes it now
# (iosim.runner.api.short_keywords, run's mechanism).
MOVED = {
    **{k: f"is a schedule option now: pass iosim.Schedule(algorithm, {k}=...) in place of the algorithm's name (or "
          "hierarchy(problem, schedule, device))" for k in SCHEDULE_KEYWORDS if k != "block"},
    "block": "is a schedule option now: pass iosim.Schedule(algorithm, B=...) (the square tile; B here is the batch) "
             "in place of the algorithm's name (or hierarchy(problem, schedule, device))",
    **{k: f"is the machine's now: pass device=Machine(preset or None, {k}=...) (from iosim.hierarchy import "
          "Machine)" for k in MACHINE_KEYWORDS},
    "order": "is the scheduler's now: pass scheduler=Scheduler(order=...) (from iosim.hierarchy import Scheduler)",
}  # fmt: skip


@short_keywords("hierarchy", MOVED, "(algorithm or schedule, *, N, d or problem, M, device, ...) or (problem, "
                "schedule, device or M)")  # fmt: skip
def hierarchy(
    algorithm,
    schedule=None,
    device_or_memory=None,
    *,
    N: int | None = None,
    d: int | None = None,
    problem=None,
    M: int | None = None,
    B: int = 1,
    H_q: int = 1,
    H_kv: int | None = None,
    causal: bool = False,
    mask=None,
    backward: bool = False,
    device: str | Device | Machine | None = None,
    scheduler=None,
    policy: str = "lru",
    bytes_per_word: int = 2,
    element_bytes: str = "uniform",
    allow_long: bool = False,
    record: bool = False,
    opt_limit_bytes: int | None = None,
    _trace=None,
):
    """Run ``algorithm``'s launch (forward, or the backward pass) over ``B`` x ``H_q`` heads through P SMs, an L2
    of C words with lines of L words, and DRAM (module docstring); a :class:`HierarchyResult`.

    Two forms, the same launch, as :func:`iosim.run` has them: the keyword form ``hierarchy("flash2", N=1024, d=64,
    M=16384, device="H100")`` (the first argument an algorithm's name or an :class:`iosim.Schedule`) and the objects
    form ``hierarchy(problem, schedule, device)`` (an :class:`iosim.Problem`, a Schedule or an algorithm's name, and
    the device or M). The keywords are the problem's, the memory's and the run's; everything else is a field of the
    object it describes, and passing it as a keyword is one line naming that object (:data:`MOVED`):

    * the **schedule** (:class:`iosim.Schedule`): the tiling rule, explicit tiles ``Br``, ``Bc`` (flash1, flash2) or
      ``B`` (the square tile of standard attention and square tiling; the keyword ``B`` here is the batch), the GQA
      launch ``gqa`` (``per-head``: each query head its own schedule, the L2 may catch the g - 1 repeated K and V
      requests; ``packed``: one schedule per KV head, its g heads' rows together, as decoding kernels launch it),
      MLA's read of V ``mla``, split-KV's ``splits`` (flash2's forward over a problem: the split kernel, then the
      combine kernel), ``kv_policy`` (None: run's default, paper for one head of N x d, skip over a problem),
      flash1's paged reads ``pages``, all checked against M as :func:`iosim.run` checks them;
    * the **device** (``device``: a :class:`iosim.hierarchy.machine.Machine`, or a preset's name such as ``"H100"``
      or a :class:`iosim.hierarchy.devices.Device`, which is ``Machine(that)``): a preset gives P, C, L (bytes over
      ``bytes_per_word``) and the default M (the largest shared memory a block may have); the Machine's ``P``,
      ``C``, ``L``, ``blocks_per_sm`` override them, and it carries the L2's ``partitions`` and ``home_lines``, its
      ``sector_bytes`` and the ``kernel`` whose resources give the blocks per SM (``result.resident`` says how).
      Without a preset: P 1, one block per SM, lines of 1 word, and C must be given (0: no L2);
    * the **scheduler** (``scheduler``): the block order is a :class:`iosim.hierarchy.scheduler.Scheduler`'s
      ``order`` (default ``head-grouped``); a Scheduler that walks, stalls or persists, or any object with a
      ``plan`` method, plans each launch's blocks and requests (module docstring).

    The keywords: N and d (one head each) or ``problem`` (an :class:`iosim.Problem`: N_q against N_k keys, d_qk and
    d_v, an MLA latent, a paged cache, the dtypes; its B, H_q, H_kv, causal and K/V dtype replace those keywords),
    B, H_q, H_kv, ``causal``, ``mask`` (one for every head, or one that differs per (b, h): each head unit's CTAs
    cut from its own mask's trace, :func:`iosim.masking.head_masks.unit_masks`), ``backward``, M (the shared memory
    of a block in words), ``bytes_per_word`` (2; a problem's is its K/V dtype's), ``element_bytes`` (``uniform``:
    every array at bytes_per_word; ``kernel``, over a problem: each array at :func:`kernel_dtype`, dQ's atomic
    accumulation as reductions), ``policy`` (``lru``, or ``opt``: Belady's, the floor, which needs the whole line
    stream in memory, at most ``opt_limit_bytes``; or ``random[:SEED]``, ``sets:W[:xor]``, replayed over that stream
    in one cache of whole lines: :mod:`iosim.hierarchy.replacement`), ``allow_long`` (a launch estimated at over a
    minute, :data:`iosim.runner.estimate.HIERARCHY_REQUEST` a tile request, needs it; over an hour is refused before
    the L2 runs) and ``record`` (keeps the order in which the L2 saw the requests, ``result.record``: block, request
    row, and the launch's blocks, cut, declared launches and address layout)."""
    from iosim.spec.problem import Problem

    if isinstance(algorithm, Problem):  # hierarchy(problem, schedule, device or M): the three objects
        return _three_objects(dict(locals()))
    if schedule is not None or device_or_memory is not None:
        raise InputError("schedule", "goes with a problem as the first argument: hierarchy(problem, schedule, device)")
    return _simulate(_objects(dict(locals())))


def _objects(kw: dict) -> dict:
    """The launch's keywords read off its objects: the schedule's options (``block`` its square tile B), the
    machine (``machine``) and the block order with the scheduler that plans each launch (:func:`_order_of`)."""
    from dataclasses import fields, replace

    from iosim.spec.schedule import Schedule

    algorithm, backward = kw["algorithm"], kw["backward"]
    if isinstance(algorithm, Schedule):
        spec = algorithm
    elif kw["_trace"] is not None:  # a given trace: the name only picks its launches; the schedule's defaults
        spec = None
    else:
        spec = Schedule(algorithm)
    if spec is None:
        options = {f.name: f.default for f in fields(Schedule) if f.name != "algorithm"}
    else:
        spec = spec if backward is False else replace(spec, backward=backward)
        algorithm, options = spec.algorithm, spec.run_options()
    options["backward"] = options["backward"] or backward
    options["block"] = options.pop("B")
    return {**kw, **options, "algorithm": algorithm, "machine": machine_of(kw["device"]), **_order_of(kw["scheduler"])}


def _order_of(scheduler) -> dict:
    """The block order (:func:`block_order`) and the scheduler that plans over it: none by default (head-grouped);
    a :class:`Scheduler` that only orders, in one of :data:`ORDERS`, is that order with no plan (the same blocks);
    any other scheduler plans each launch, over its own order where that is one of ORDERS, else head-grouped."""
    from dataclasses import replace

    if scheduler is None:
        return dict(order="head-grouped", scheduler=None)
    if not isinstance(scheduler, Scheduler):
        return dict(order="head-grouped", scheduler=scheduler)
    order = scheduler.order if scheduler.order in ORDERS else "head-grouped"
    plain = replace(scheduler, order="head-grouped", slots=None) == Scheduler()
    return dict(order=order, scheduler=None if plain and scheduler.order in ORDERS else scheduler)


def _simulate(kw: dict) -> HierarchyResult:
    """:func:`hierarchy`'s launch from its keywords ``kw``: the machine, the schedule's traced parts cut into CTAs and
    ordered, the L2 run over them, and the result."""
    algorithm, problem, backward, policy, order, record, _trace = (
        kw[k] for k in ("algorithm", "problem", "backward", "policy", "order", "record", "_trace")
    )
    tiling, Br, Bc, block, allow_long, gqa, mla, splits, pages = (
        kw[k] for k in ("tiling", "Br", "Bc", "block", "allow_long", "gqa", "mla", "splits", "pages")
    )
    element_bytes, scheduler, opt_limit_bytes = kw["element_bytes"], kw["scheduler"], kw["opt_limit_bytes"]
    w = _launch(kw)
    N, d, B, H_q, H_kv, causal, bytes_per_word = w.N, w.d, w.B, w.H_q, w.H_kv, w.causal, w.bytes_per_word
    unit, units, mask, kv_policy = w.unit, w.units, w.mask, w.kv_policy
    mc = _machine(kw["machine"], kw["M"], bytes_per_word, policy)

    t0 = time.perf_counter()
    Hu = H_kv if unit is not None and unit.H_q > 1 else H_q  # CTA families per batch item: packed, one per KV head
    where = (problem if problem is not None else _single(N, d)).storage
    convert = _trace is None and _converts_dq(algorithm, backward, problem)
    if convert:
        where = _with_convert_dq(where)
    run_kw = dict(M=mc.M, backward=backward, kv_policy=kv_policy, tiling=tiling, Br=Br, Bc=Bc, block=block,
                  allow_long=allow_long, gqa=gqa, mla=mla, splits=splits, pages=pages)  # fmt: skip
    parts, unit_class = _unit_parts(algorithm, problem, unit, N, d, causal, mask, units, B * Hu, convert, run_kw,
                                    _trace)  # fmt: skip
    trace, tiling_used, arrays = parts[0].trace, parts[0].tiling, parts[0].arrays
    cut, declared = _merge(parts, mask if units is None else units[0])
    eb = _element_bytes(arrays.names, problem, element_bytes, mc.bytes_per_word)
    Lw = _line_words(arrays.names, eb, mc)
    _check_sectors(arrays.names, eb, mc)
    if element_bytes == "kernel":  # the kernel's atomic accumulations: one reduction each, no load
        cut = _reductions(cut, declared, arrays.names)
    widths = np.array([arrays.shapes[n][1] for n in arrays.names], np.int64)
    n_req_total = _estimate(parts, cut, policy, mc, Lw, widths, B * Hu, problem, N, allow_long)
    lay = _layout(arrays, cut, B, Hu, H_kv, Lw, where, mc.parts, mc.home_lines, int(mc.spl > 1))
    inst, launch_ptr, delay, static, cut = _blocks(declared, cut, order, B, Hu, H_kv, unit_class, parts[0], scheduler,
                                                   mc.slots)  # fmt: skip
    assert n_req_total == (int(np.sum(np.diff(declared.cta_ptr)[inst[:, 0]])) if len(inst) else 0)
    run = _run_l2(inst, launch_ptr, declared, cut, lay, Lw, mc, policy, record, n_req_total, delay, static,
                  opt_limit_bytes)  # fmt: skip
    per, kinds = _collect(parts, trace, arrays, cut, declared, lay, run, eb, launch_ptr, mc, B, Hu, H_kv, problem)
    res = HierarchyResult(
        algorithm, bool(backward), B, H_q, H_kv, int(N), int(d), mc.M, mc.P, mc.blocks_per_sm, mc.C, mc.L,
        mc.bytes_per_word, order, policy, mc.name, tiling_used, len(inst), kinds, [k["waves"] for k in kinds], per,
        int(run.n_rec), time.perf_counter() - t0, [int(x) for x in run.clock[: len(kinds)]],
        problem if unit is not None else None, gqa, int(splits), element_bytes, mc.parts, mc.home_lines,
        None if run.final_flush is None else int(np.sum(run.final_flush * eb)), mc.resident, mc.sector_bytes,
        mc.far_copy, mc.flush,
    )  # fmt: skip
    if record:
        res.record = np.stack([run.rec_inst[: run.n_rec], run.rec_req[: run.n_rec]], axis=1)
        res.blocks = inst
        res.cut = cut
        res.declared = declared
        res.layout = lay
        res.trace = trace
        res.line_words = Lw
    return res


def _three_objects(kw: dict):
    """hierarchy(problem, schedule, device or M): the launch from the three objects; the problem's and the schedule's
    fields are not keywords here (one line naming the keyword), the device or M the one not given third."""
    from iosim.spec.schedule import from_objects

    if kw["_trace"] is not None:
        raise InputError("problem", "is not used with a given trace")
    given = dict(B=None if kw["B"] == 1 else kw["B"], H_q=None if kw["H_q"] == 1 else kw["H_q"], H_kv=kw["H_kv"],
                 backward=kw["backward"] or None)  # fmt: skip
    clash = [n for n, v in given.items() if v is not None]
    if clash:
        raise InputError(clash[0], "belongs to the Schedule or the Problem when they are given as objects")
    spec, _ = from_objects(kw["algorithm"], kw["schedule"], {n: kw[n] for n in ("N", "d", "causal", "problem")})
    third = kw["device_or_memory"]
    key = "device" if isinstance(third, (str, Device, Machine)) else "M"
    if third is not None and kw[key] is not None:
        raise InputError(key, "is given twice: third as hierarchy(problem, schedule, device or M) and as a keyword")
    if third is not None:
        kw[key] = third
    kw.update(algorithm=spec, problem=kw["algorithm"], schedule=None, device_or_memory=None)
    return _simulate(_objects(kw))


def _launch(kw: dict) -> SimpleNamespace:
    """Check the launch: its shape (N, d, B, H_q, H_kv, causal and the bytes per word, from a problem or the
    keywords), the unit one family of CTAs runs, each head unit's mask, the kv policy, the pricing, order and
    policy."""
    N, d, B, H_q, H_kv, causal, bpw = (kw[k] for k in ("N", "d", "B", "H_q", "H_kv", "causal", "bytes_per_word"))  # noqa: N806
    problem, gqa, mla, splits, mask, kv_policy = (kw[k] for k in ("problem", "gqa", "mla", "splits", "mask",
                                                                   "kv_policy"))  # fmt: skip
    unit = units = None  # units: each head unit's mask, when the mask differs per (b, h)
    if problem is not None:
        N, d, B, H_q, H_kv, causal, bpw, unit = _from_problem(problem, N, d, gqa, splits, kw["backward"])  # noqa: N806
        if kv_policy is None and not problem.is_single:  # iosim.run's default over a problem, as the kernels do
            kv_policy = "skip"
        if mask is not None:  # one mask for every head, or each head unit's own (iosim.masking.head_masks)
            from iosim.masking.head_masks import unit_masks

            group = unit is not None and unit.H_q > 1
            mask, units = unit_masks(problem, mask, group, gqa == "packed", kw["allow_long"] is True)
    elif gqa != "per-head" or mla != "shared" or splits != 1:
        which, value = ("gqa", gqa) if gqa != "per-head" else ("mla", mla) if mla != "shared" else ("splits", splits)
        raise InputError(which, "applies to a problem (problem=iosim.Problem(...)); N, d launch one head each", value)
    if N is None or d is None:
        raise InputError("N" if N is None else "d", "must be given (or a problem)", None)
    eb = kw["element_bytes"]
    if not isinstance(eb, str) or eb not in ELEMENT_BYTES:
        raise InputError("element_bytes", f"must be one of {', '.join(ELEMENT_BYTES)}", eb)
    if eb == "kernel" and problem is None:
        raise InputError("element_bytes", "kernel prices each array at its dtype: give a problem (its dtypes)")
    if not isinstance(kw["order"], str) or kw["order"] not in ORDERS:
        raise InputError("order", f"must be one of {', '.join(ORDERS)}", kw["order"])
    replacement.parse(kw["policy"])  # one line naming the accepted policies
    B = _int("B (batch)", B, 1, MAX_HEADS)  # noqa: N806
    H_q = _int("H_q (query heads)", H_q, 1, MAX_HEADS)  # noqa: N806
    H_kv = H_q if H_kv is None else _int("H_kv (key/value heads)", H_kv, 1, H_q)  # noqa: N806
    if H_q % H_kv:
        raise InputError("H_kv (key/value heads)", f"must divide H_q = {H_q}", H_kv)
    return SimpleNamespace(N=N, d=d, B=B, H_q=H_q, H_kv=H_kv, causal=causal, bytes_per_word=bpw, unit=unit,
                           units=units, mask=mask, kv_policy=kv_policy)  # fmt: skip


def _machine(machine: Machine, M, bytes_per_word, policy):  # noqa: N803
    """The machine checked against the launch: P SMs, an L2 of C words (in partitions, homes by ``home_lines``) with
    lines of L words, M words of shared memory per block and the blocks per SM (from the kernel's resources where
    given); the preset gives the defaults (:class:`iosim.hierarchy.machine.Machine`, whose fields are checked)."""
    from iosim.runner import api

    dev = machine.device
    P, C, L, partitions = machine.P, machine.C, machine.L, machine.partitions  # noqa: N806
    bytes_per_word = _int("bytes_per_word", bytes_per_word, 1, 64)
    if dev is not None:
        P = dev.sms if P is None else P  # noqa: N806
        C = dev.l2_bytes // bytes_per_word if C is None else C  # noqa: N806
        L = max(dev.l2_line_bytes // bytes_per_word, 1) if L is None else L  # noqa: N806
        M = dev.smem_per_block_bytes // bytes_per_word if M is None else M  # noqa: N806
        partitions = dev.l2_partitions if partitions == "device" else partitions
    P = 1 if P is None else P  # noqa: N806
    if C is None:
        raise InputError("C (L2 words)", "must be given (device=Machine(C=...), or a device preset): 0 for no L2", C)
    L = 1 if L is None else L  # noqa: N806
    if L & (L - 1):
        raise InputError("L (line words)", "must be a power of two", L)
    if C and C < L:
        raise InputError("C (L2 words)", f"must be 0 (no L2) or at least one line of L = {L} words", C)
    parts = 1 if partitions is None else partitions
    if parts > P:
        raise InputError("l2_partitions", f"must be at most P = {P} (each partition serves its own SMs)", parts)
    if C and C // L < parts:
        raise InputError("C (L2 words)", f"must hold a line of L = {L} words in each of {parts} partitions", C)
    if parts > 1 and policy == "opt":
        raise InputError("policy opt", "is one cache (Belady's): use lru with more than one L2 partition", policy)
    if parts > 1 and replacement.parse(policy).replayed:
        raise InputError(f"policy {policy}", "is one cache (replayed over the line stream): use lru with more than "
                         "one L2 partition", policy)  # fmt: skip
    if machine.flush is not None and policy == "opt":
        raise InputError("policy opt", "keeps no per-launch counts: use lru, random or sets:W with flush", policy)
    if M is None:
        raise InputError("M", "must be given (or a device)", M)
    M = _int("M", M, 1, api.MAX_M)  # noqa: N806
    blocks_per_sm, resident = _blocks_per_sm(dev, M, bytes_per_word, machine.blocks_per_sm, machine.kernel)
    sector_bytes, spl = _sector_size(dev, machine.sector_bytes, L * bytes_per_word, policy)
    slot_part = (np.arange(P * blocks_per_sm, dtype=np.int64) % P) * parts // P  # slot on SM slot mod P
    return SimpleNamespace(name=machine.name, P=P, C=C, L=L, M=M, blocks_per_sm=blocks_per_sm,
                           bytes_per_word=bytes_per_word, parts=parts, home_lines=machine.home_lines,
                           slots=P * blocks_per_sm, slot_part=slot_part, cap=C // L // parts,
                           resident=resident, sector_bytes=sector_bytes, spl=spl,
                           far_copy=machine.far_copy, flush=machine.flush)  # fmt: skip


MAX_SECTORS_PER_LINE = 32  # a line's sector masks are int64 bit sets


def _sector_size(dev, sector_bytes, line_bytes: int, policy: str) -> tuple[int | None, int]:
    """(sector bytes or None, sectors per line): None is whole-line fills (one "sector" a line); ``"device"`` the
    preset's ``sector_bytes``; a number must divide the line into at most 32 sectors."""
    if sector_bytes is None:
        return None, 1
    if sector_bytes == "device":
        if dev is None:
            raise InputError("sector_bytes", "'device' needs a device preset (or give a number of bytes)", sector_bytes)
        sector_bytes = dev.sector_bytes
    sector_bytes = _int("sector_bytes", sector_bytes, 1, line_bytes)
    if line_bytes % sector_bytes or line_bytes // sector_bytes > MAX_SECTORS_PER_LINE:
        raise InputError("sector_bytes", f"must divide the line of {line_bytes} bytes into at most "
                         f"{MAX_SECTORS_PER_LINE} equal sectors", sector_bytes)  # fmt: skip
    if policy == "opt":
        raise InputError("policy opt", "is a line cache (Belady's): use lru with sectors", policy)
    if replacement.parse(policy).replayed:
        raise InputError(f"policy {policy}", "is a line cache (replayed over the line stream): use lru with sectors",
                         policy)  # fmt: skip
    return sector_bytes, line_bytes // sector_bytes


def _check_sectors(names, eb: np.ndarray, mc) -> None:
    """Every array's words fill whole sectors (a sector holds sector_bytes / element bytes of them)."""
    for n, e in zip(names, eb.tolist(), strict=True):
        if mc.sector_bytes is not None and mc.sector_bytes % e:
            raise InputError("sector_bytes", f"must hold a whole number of every array's words: {n} has {e}-byte "
                             "words", mc.sector_bytes)  # fmt: skip


def _blocks_per_sm(dev, M, bytes_per_word, blocks_per_sm, kernel=None) -> tuple[int, str]:  # noqa: N803
    """Resident blocks per SM and how they were decided: the kernel's resources on the device's per-SM limits
    (``kernel``), else what fits the device's shared memory per SM at M words a block; a given number wins (at most
    that bound)."""
    if kernel is not None:
        return _blocks_of_kernel(dev, kernel, blocks_per_sm)
    block_bytes = M * bytes_per_word
    how = "given" if blocks_per_sm is not None else "one per SM (no device)"
    if dev is not None:
        _check_m_fits(dev, M, bytes_per_word)
        fit = min(dev.smem_per_sm_bytes // (block_bytes + RESERVED_SMEM_PER_BLOCK), MAX_BLOCKS_PER_SM)
        if fit < 1:
            raise InputError("M", f"gives blocks that do not fit an SM of the {dev.name}", M)
        if blocks_per_sm is None:
            blocks_per_sm = fit
            how = "shared memory of M words per block (no kernel given: threads and registers not counted)"
        elif blocks_per_sm > fit:
            raise InputError(
                "blocks_per_sm",
                f"must be at most {fit} ({dev.name}: shared memory per SM / the block's)",
                blocks_per_sm,
            )
    return _int("blocks_per_sm", 1 if blocks_per_sm is None else blocks_per_sm, 1, MAX_BLOCKS_PER_SM), how


def _check_m_fits(dev, M, bytes_per_word) -> None:  # noqa: N803
    if M * bytes_per_word > dev.smem_per_block_bytes:
        raise InputError(
            "M",
            f"must fit the {dev.name}'s shared memory per block: {dev.smem_per_block_bytes:,} bytes = "
            f"{dev.smem_per_block_bytes // bytes_per_word:,} words of {bytes_per_word} bytes",
            M,
        )


def _blocks_of_kernel(dev, kernel, blocks_per_sm) -> tuple[int, str]:
    """Blocks per SM from the kernel's threads, registers and shared memory (the occupancy calculation on the
    device's per-SM limits, :func:`iosim.hierarchy.resident.resident_ctas`) and which limit binds; a given number
    wins, at most that."""
    from iosim.hierarchy import resident

    if dev is None:
        raise InputError("kernel", "needs a device preset (its per-SM limits decide the resident blocks)")
    k = resident.kernel_of(kernel)
    bound, limiter = k.resident(dev)
    if bound < 1:
        raise InputError("kernel", f"does not fit an SM of the {dev.name} ({limiter})", k.kernel)
    how = f"{k.kernel}'s resources on the {dev.name}: {limiter}"
    if blocks_per_sm is None:
        return bound, how
    blocks_per_sm = _int("blocks_per_sm", blocks_per_sm, 1, MAX_BLOCKS_PER_SM)
    if blocks_per_sm > bound:
        raise InputError("blocks_per_sm", f"must be at most {bound} ({how})", blocks_per_sm)
    return blocks_per_sm, f"given (at most {bound} by {how})"


def _unit_parts(algorithm, problem, unit, N, d, causal, mask, units, n_units, convert, run_kw, given) -> tuple:  # noqa: N803
    """Build the unit traces: one per distinct mask (one unless the mask differs per (b, h)), each cut into pieces
    and mapped onto the declared launches (races refused); (parts, each unit's class or None)."""
    if units is None:
        masks, unit_class = [mask], None
    else:  # a unit trace per distinct mask; unit u runs its mask's
        from iosim.masking.head_masks import classes

        masks, unit_class = classes(units)
    parts = []
    for m in masks:
        if given is None:
            trace, stats, tiling_used, Br = _unit_run(algorithm, problem, unit, N, d, causal, m, run_kw)
        else:
            trace, stats, tiling_used, Br = given, given.replay(), "given trace", None
        cut = ctas_mod.cut(trace)
        kinds = launches_mod.kernels(algorithm, run_kw["backward"], run_kw["splits"])
        declared = launches_mod.assign(cut, trace, kinds)
        launches_mod.check_races(cut, trace, declared)
        arrays = trace  # the arrays' names and shapes: the trace's, and the conversion's two where it runs
        if convert:
            cut, declared, names, shapes = launches_mod.append_convert_dq(
                cut, declared, list(trace.names), dict(trace.shapes), Br
            )
            arrays = SimpleNamespace(names=names, shapes=shapes)
        n = n_units if unit_class is None else int(np.sum(unit_class == len(parts)))  # the units that run it
        parts.append(SimpleNamespace(trace=trace, stats=stats, tiling=tiling_used, cut=cut, declared=declared,
                                     arrays=arrays, units=n))  # fmt: skip
    return parts, unit_class


def _unit_run(algorithm, problem, unit, N, d, causal, mask, kw) -> tuple:  # noqa: N803
    """One unit's schedule, count-only with its event trace: (trace, stats, tiling, Br)."""
    from iosim.runner import api

    shape = (dict(N=N, d=d, causal=causal) if unit is None
             else dict(problem=unit, gqa=kw["gqa"], mla=kw["mla"], splits=kw["splits"], pages=kw["pages"]))  # fmt: skip
    try:
        r = api.run_keywords(
            algorithm, M=kw["M"], backward=kw["backward"], mask=mask, kv_policy=kw["kv_policy"], tiling=kw["tiling"],
            Br=kw["Br"], Bc=kw["Bc"], B=kw["block"], count_only=True, trace=True, reference=False,
            allow_long=kw["allow_long"], **shape,
        )  # fmt: skip
    except InputError as e:
        if e.parameter != "trace":
            raise
        raise InputError(  # the launch is cut from one unit's trace: name the size that makes it too large
            "problem" if problem is not None else "N",
            f"gives a schedule too large to cut into thread blocks: its trace {e.accepted}",
            str(problem) if problem is not None else N,
        ) from None
    return r.trace, r.stats, str(r.tiling), r.tiling.Br


def kernel_dtype(problem, array: str) -> str:
    """The dtype ``array`` moves at in the kernels the hierarchy models (``element_bytes="kernel"``), the one
    convention: :meth:`iosim.Problem.dtype_of` (Q at dtype_q; K, V, dK, dV at dtype_kv; O, dO at dtype_o; the
    statistics L, l, m, D, the split-KV partials and dQ's accumulator in fp32; the page table int32; the GQA
    backward's partials dKpart, dVpart at Q's dtype, as FlashAttention-2 allocates them: flash-attn 2,
    csrc/flash_attn/flash_api.cpp, ``mha_bwd``: ``dk_expanded``, ``dv_expanded`` = ``torch::empty(..., opts)`` with
    ``opts = q.options()``). dQ's conversion reads ``dq_accum`` (dQ's accumulator) and writes ``dQ_out`` at dtype_o."""
    if array == launches_mod.DQ_ACCUM:
        return problem.dtype_of("dQ")
    if array == launches_mod.DQ_OUT:
        return problem.dtype_o
    return problem.dtype_of(array)


def _element_bytes(names, problem, mode: str, bytes_per_word: int) -> np.ndarray:
    """Bytes per word of every array: ``bytes_per_word`` for all (``uniform``) or each at :func:`kernel_dtype`."""
    from iosim.spec.problem import BYTES, INT_BYTES

    if mode == "uniform":
        return np.full(len(names), bytes_per_word, np.int64)
    sizes = {**BYTES, **INT_BYTES}
    return np.array([sizes[kernel_dtype(problem, n)] for n in names], np.int64)


def _line_words(names, eb: np.ndarray, mc) -> np.ndarray:
    """Each array's words per L2 line: the line's bytes (L words of ``bytes_per_word``) over its element bytes."""
    line_bytes = mc.L * mc.bytes_per_word
    for n, e in zip(names, eb.tolist(), strict=True):
        if line_bytes % e:
            raise InputError(
                "L (line words)",
                f"must give lines of a whole number of every array's words: {mc.L} words of {mc.bytes_per_word} "
                f"bytes = {line_bytes} bytes, and {n} has {e}-byte words",
                mc.L,
            )
    return (line_bytes // eb).astype(np.int64)


def _reductions(cut, declared, names):
    """The requests as the kernels move them: in a launch that adds array X atomically (flash2's backward, dQ),
    each store of X is one reduction per word at the L2 (``l2.REDUCE``) and the schedule's load of X before it is no
    request of the kernel's (``l2.SKIP``): FlashAttention-2 adds dQ_i into dq_accum with atomicAdd, never loading it."""
    req = cut.requests.copy()
    n = int(declared.launch_ptr[-1])  # CTAs of one class (_merge: class m's CTA c is CTA m n + c)
    for k, kern in enumerate(declared.kernels):
        aids = [names.index(a) for a in kern.atomic if a in names]
        for m in range(declared.ctas // n if aids and n else 0):
            lo = int(declared.cta_ptr[m * n + declared.launch_ptr[k]])
            hi = int(declared.cta_ptr[m * n + declared.launch_ptr[k + 1]])
            rows = req[lo:hi]  # a view: the marks land in req
            mine = np.isin(rows[:, 1], aids)
            rows[mine & (rows[:, 0] == 0), 0] = l2.SKIP
            rows[mine & (rows[:, 0] == 1), 0] = l2.REDUCE
    return ctas_mod.Cut(req, cut.piece_ptr, cut.piece_events)


def _estimate(parts, cut, policy, mc, Lw, widths, n_units, problem, N, allow_long) -> int:  # noqa: N803
    """The time rule, before any array of the launch's size (the layout, the block order) exists: every CTA of every
    launch runs once per (batch item, head unit), each making its tile requests; with more than one L2 partition the
    LRU runs line by line (:data:`HIERARCHY_LINE` a line). Returns the requests."""
    n_launched = int(parts[0].declared.launch_ptr[-1])
    n_req_total = sum(x.units * int(np.sum(np.diff(x.declared.cta_ptr)[:n_launched])) for x in parts)
    seconds = n_req_total * estimate.HIERARCHY_REQUEST * (2 if policy != "lru" else 1)
    if mc.parts > 1 and len(cut.requests):  # the lines touched, at most: each contiguous range's, and its two ends
        r = cut.requests
        lw = Lw[r[:, 1]]
        whole = r[:, 5] == widths[r[:, 1]]
        lines = np.where(whole, (r[:, 3] * r[:, 5]) // lw + 2, r[:, 3] * (r[:, 5] // lw + 2)) // mc.home_lines
        seconds += float(np.sum(lines)) * (n_req_total / len(r)) * HIERARCHY_LINE
    estimate.check(seconds, f"a launch of {n_units * n_launched:,} thread blocks making "
                   f"{n_req_total:,} tile requests", allow_long=allow_long,
                   parameter="problem" if problem is not None else "N",
                   value=str(problem) if problem is not None else N,
                   remedy="a smaller batch, fewer heads or a shorter sequence")  # fmt: skip
    return n_req_total


def _blocks(declared, cut, order, B, Hu, H_kv, unit_class, first, scheduler, slots) -> tuple:  # noqa: N803
    """Order the blocks: each launch's CTAs in ``order`` (:func:`block_order`), or as the scheduler plans them
    (module docstring); (blocks, launch_ptr, delay, static slot, the cut with each CTA's requests in the planned
    order)."""
    n_launch = declared.launch_ptr.size - 1
    blocks, delays, statics = [], [], []
    perm = None
    for k in range(n_launch):
        b = block_order(order, declared.grid_order(k), B, Hu, H_kv)
        dl, sl = np.zeros(len(b), np.int64), np.full(len(b), -1, np.int64)
        if scheduler is not None:
            b, order_k, dl, sl = _plan(scheduler, k, b, cut, declared, slots)
            if order_k is not None:
                perm = order_k if perm is None else perm[order_k]
        blocks.append(b)
        delays.append(dl)
        statics.append(sl)
    inst = np.concatenate(blocks) if blocks else np.zeros((0, 4), np.int64)
    if unit_class is not None:  # a unit's CTAs: its mask's (_merge)
        inst[:, 0] += first.declared.ctas * unit_class[inst[:, 1]]
    launch_ptr = np.concatenate(([0], np.cumsum([len(b) for b in blocks]))).astype(np.int64)
    delay = np.concatenate(delays) if delays else np.zeros(0, np.int64)
    static = np.concatenate(statics) if statics else np.zeros(0, np.int64)
    if perm is not None:
        cut = ctas_mod.Cut(cut.requests[perm], cut.piece_ptr, cut.piece_events)
    return inst, launch_ptr, delay, static, cut


def _plan(scheduler, k, blocks, cut, declared, slots) -> tuple:
    """Launch k's plan from the scheduler, checked: (blocks, request order or None, delay, static slots)."""
    import inspect

    try:  # iosim.hierarchy.scheduler.Scheduler takes the resident slots (a static persistent schedule needs them)
        takes_slots = "slots" in inspect.signature(scheduler.plan).parameters
    except (TypeError, ValueError, AttributeError):
        takes_slots = False
    if not callable(getattr(scheduler, "plan", None)):
        raise InputError("scheduler", "must have a method plan(launch_index, blocks, cut, declared)", type(scheduler))
    got = scheduler.plan(k, blocks.copy(), cut, declared, **({"slots": slots} if takes_slots else {}))
    if not isinstance(got, tuple) or len(got) != 4:
        raise InputError("scheduler", "plan() must return (blocks, request_order, delay, static_slot)", type(got))
    b, order_k, dl, sl = got
    b = blocks if b is None else np.asarray(b, np.int64)
    if b.shape != blocks.shape or not np.array_equal(np.unique(b, axis=0), np.unique(blocks, axis=0)):
        raise InputError("scheduler", f"plan() of launch {k} must return a reordering of its {len(blocks)} blocks")
    n = len(b)
    dl = np.zeros(n, np.int64) if dl is None else np.asarray(dl, np.int64)
    if dl.shape != (n,) or (n and dl.min() < 0):
        raise InputError("scheduler", f"delay of launch {k} must be {n} non-negative integers (words)")
    sl = np.full(n, -1, np.int64) if sl is None else np.asarray(sl, np.int64)
    if sl.shape != (n,) or (n and (sl.max() >= slots or sl.min() < -1)):
        raise InputError("scheduler", f"static_slot of launch {k} must be {n} slots from 0 to {slots - 1}, or -1")
    if n and len(np.unique(sl >= 0)) > 1:
        raise InputError("scheduler", f"static_slot of launch {k} must be -1 for every block or for none")
    if order_k is not None:
        order_k = np.asarray(order_k, np.int64)
        owner = np.repeat(np.arange(declared.ctas), np.diff(declared.cta_ptr))  # each request row's CTA
        if (order_k.shape != (len(cut.requests),) or not np.array_equal(np.sort(order_k), np.arange(len(order_k)))
                or not np.array_equal(owner[order_k], owner)):  # fmt: skip
            raise InputError("scheduler", "request_order must permute the cut's requests within each CTA's own rows")
    return b, order_k, dl, sl


def _run_l2(inst, launch_ptr, declared, cut, lay, Lw, mc, policy, record, n_req, delay, static, opt_limit):  # noqa: N803
    """Run the L2: the blocks through the clock into the LRU partitions (or, for OPT, the clock's order recorded
    and replayed); the counters per array."""
    n_aids = len(lay.nl)
    z = SimpleNamespace(**{k: np.zeros(n_aids, np.int64) for k in ("fill", "wb", "read", "update", "reduce")})
    z.fabric = np.zeros((3, n_aids), np.int64)  # every crossing's words; the reads'; the reductions' (l2.segment)
    need_record = record or policy != "lru"
    cap = mc.cap
    if policy != "lru" and cap > 0:
        limit = opt_limit if opt_limit is not None else estimate.available_bytes() // 2
        if lay.n_lines >= 1 << 31:
            raise InputError(f"policy {policy}", "needs line numbers below 2^31: use a smaller launch or lru", policy)
        if n_req * 16 > limit:
            raise InputError(f"policy {policy}", f"needs about {n_req * 16 / 2**30:.1f} GiB for its request record; "
                             "use lru")  # fmt: skip
    z.rec_inst = np.zeros(n_req if need_record else 0, np.int64)
    z.rec_req = np.zeros(n_req if need_record else 0, np.int64)
    n_launch = max(len(launch_ptr) - 1, 1)
    z.clock = np.zeros(n_launch, np.int64)
    wb_launch = np.zeros((n_launch, n_aids), np.int64)
    z.fill_launch, z.wb_flush = np.zeros((n_launch, n_aids), np.int64), np.zeros((n_launch, n_aids), np.int64)
    lru_cap = cap if policy == "lru" else 0  # OPT: the clock run only records the order
    ns, pn = (lay.n_segments if lru_cap else 1), mc.parts
    st = (np.tile(np.array([-1, -1, 0], np.int64), (pn, 1)), np.zeros((pn, ns), np.int32), np.zeros((pn, ns), np.int8),
          np.full((pn, ns), -1, np.int32), np.full((pn, ns), -1, np.int32),
          lay.seg_aid if lru_cap else np.zeros(1, np.int16))  # fmt: skip
    lru = policy == "lru" or cap == 0
    f_lru, w_lru = (z.fill, z.wb) if lru else (np.zeros_like(z.fill), np.zeros_like(z.wb))
    masks = (pn, ns) if mc.spl > 1 and lru_cap else (1, 1)  # each segment's valid and dirty sectors
    vmask, dmask = np.zeros(masks, np.int64), np.zeros(masks, np.int64)
    z.n_rec = l2.run_launches(
        inst[:, 0].copy(), inst[:, 1:].copy(), launch_ptr, mc.slots, mc.slot_part, declared.cta_ptr, cut.requests,
        lay.kv, lay.base, lay.stride, lay.nseg, lay.gbase, lay.loff, lay.soff, lay.seg_of_line, lay.seg_start,
        lay.seg_home, Lw, lru_cap, st, f_lru, w_lru, z.fabric, z.read, z.update, z.reduce, delay, static, wb_launch,
        need_record, z.rec_inst, z.rec_req, z.clock, mc.spl, vmask, dmask, FAR_COPY.index(mc.far_copy),
        z.fill_launch, int(mc.flush == "per-kernel"), z.wb_flush,
    )  # fmt: skip
    z.wb_launch = wb_launch if lru else None  # OPT's write-backs are not in launch time
    if policy == "lru" and cap > 0:
        if mc.spl > 1:
            l2.flush_sectors(st, dmask, Lw, mc.spl, z.wb)
        else:
            l2.flush(st, Lw, z.wb)
    if policy == "opt" and cap > 0:
        _opt(z.rec_inst, z.rec_req, z.n_rec, inst, cut, lay, Lw, cap, z.fill, z.wb, opt_limit)
    if policy not in ("lru", "opt") and cap > 0:
        z.wb_launch = _replayed(z, inst, launch_ptr, cut, lay, Lw, cap, replacement.parse(policy), mc.flush,
                                opt_limit)  # fmt: skip
        wb_launch = z.wb_launch
    z.final_flush = z.wb - wb_launch[len(launch_ptr) - 2] if z.wb_launch is not None and len(launch_ptr) > 1 else None
    return z


def _replayed(z, inst, launch_ptr, cut, lay, Lw, cap, pol, flush, limit_bytes) -> np.ndarray:  # noqa: N803
    """A replayed policy (random, sets:W; :mod:`iosim.hierarchy.replacement`) over the recorded line stream: fills
    and write-backs per array into ``z`` (words, each array's ``Lw`` per line), per launch (``z.fill_launch``,
    ``z.wb_flush``); returns the write-backs by the end of each launch (before its flush)."""
    args = _stream_args(inst, cut, lay, Lw)
    lines, flags = _recorded_lines(z.rec_inst, z.rec_req, z.n_rec, args, limit_bytes, pol.kind,
                                   replacement.REPLAY_BYTES_PER_LINE)  # fmt: skip
    ends = replacement.launch_ends(z.rec_inst, z.rec_req, z.n_rec, launch_ptr, args)
    aid_of = _owner_of_lines(lay)
    n_sets, ways, victim = pol.geometry(cap)
    k, n_aids = len(ends), len(lay.nl)
    f, w = np.zeros(n_aids, np.int64), np.zeros(n_aids, np.int64)
    f_at, w_at, fl_at = (np.zeros((k, n_aids), np.int64) for _ in range(3))
    tag, dirty = replacement.replay(lines, flags, ends, n_sets, ways, victim, int(pol.xor), pol.seed, aid_of,
                                    lay.n_lines, int(flush == "per-kernel"), f, w, f_at, w_at, fl_at)  # fmt: skip
    left = tag[(tag >= 0) & (dirty > 0)]
    w_end = w + np.bincount(aid_of[left], minlength=n_aids)  # the final flush
    z.fill += f * Lw
    z.wb += w_end * Lw
    z.fill_launch[:k] = f_at * Lw
    z.wb_flush[:k] = fl_at * Lw
    return w_at * Lw


def _stream_args(inst, cut, lay, Lw) -> tuple:  # noqa: N803
    """:func:`iosim.hierarchy.l2.line_stream`'s arguments after the records: the blocks' copies, the requests and the
    address layout."""
    return inst[:, 1:].copy(), cut.requests, lay.kv, lay.base, lay.stride, lay.lbase, lay.nl, Lw


def _recorded_lines(rec_inst, rec_req, n_rec, stream_args, limit_bytes, policy, bytes_per_line, max_lines=None):
    """The recorded requests as a line stream (:func:`iosim.hierarchy.l2.line_stream`: lines and their flags), for a
    policy replayed over it (OPT, random, sets:W); refused in one line naming ``policy`` when it would take more than
    ``limit_bytes`` (default: half the memory available) at ``bytes_per_line``, or more than ``max_lines`` lines."""
    empty_l, empty_f = np.zeros(0, np.int64), np.zeros(0, np.int8)
    n = l2.line_stream(rec_inst, rec_req, n_rec, *stream_args, empty_l, empty_f)
    limit = limit_bytes if limit_bytes is not None else estimate.available_bytes() // 2
    if n * bytes_per_line > limit or (max_lines is not None and n > max_lines):
        raise InputError(f"policy {policy}", f"needs the whole line stream in memory: {n:,} line accesses, about "
                         f"{n * bytes_per_line / 2**30:.1f} GiB, over the limit of {limit / 2**30:.1f} GiB; use lru",
                         policy)  # fmt: skip
    lines, flags = np.empty(n, np.int64), np.empty(n, np.int8)
    l2.line_stream(rec_inst, rec_req, n_rec, *stream_args, lines, flags)
    return lines, flags


def _owner_of_lines(lay) -> np.ndarray:
    """The array (aid) each line of the layout belongs to: its lines run from ``lay.lbase[a]`` to the next's."""
    return np.repeat(np.arange(len(lay.nl), dtype=np.int64), np.diff(np.append(lay.lbase, lay.n_lines)))


def _collect(parts, trace, arrays, cut, declared, lay, run, eb, launch_ptr, mc, B, Hu, H_kv, problem) -> tuple:  # noqa: N803
    """Collect the counts: each array's words at every level (:class:`LevelCounts`) and each launch's row."""
    two_level = {}  # every unit's schedule moves its own words (K, V included): its mask's counts, per unit
    for x in parts:
        for name, c in x.stats.per_array.items():
            r0, w0 = two_level.get(name, (0, 0))
            two_level[name] = (r0 + c.reads * x.units, w0 + c.writes * x.units)
    kinds = _launch_rows(declared, launch_ptr, mc.slots, run, eb, arrays, problem)
    first_write = {}
    for row in cut.requests[cut.requests[:, 0] >= 0]:  # an array's first access in schedule order
        first_write.setdefault(int(row[1]), bool(row[0]))
    written = set(cut.requests[cut.requests[:, 0] >= 1][:, 1].tolist())
    array_copies = np.choose(lay.kv, [B * Hu, B * H_kv, B])
    per = {}
    for a, name in enumerate(arrays.names):
        c = two_level.get(name) if a < len(trace.names) else None
        moved = (run.fill[a], run.wb[a], run.read[a], run.update[a], run.reduce[a], run.fabric[0, a])
        if c is None and not any(moved):
            continue
        per[name] = LevelCounts(
            0 if c is None else c[0], 0 if c is None else c[1], int(run.read[a]), int(run.update[a]),
            int(run.fill[a]), int(run.wb[a]),
            int(lay.nl[a] * lay.line_words[a] * array_copies[a]) * ((not first_write.get(a, True)) + (a in written)),
            "schedule" if a < len(trace.names) else launches_mod.CONVERT_DQ.name,
            int(run.reduce[a]), int(run.fabric[0, a]), int(eb[a]), int(run.fabric[1, a]), int(run.fabric[2, a]),
        )  # fmt: skip
    return per, kinds


def _launch_rows(declared, launch_ptr, slots, run, eb, arrays, problem) -> list[dict]:
    """Each launch's row: kernel, what it models, grid, CTAs, waves, and its DRAM writes during the kernel (words,
    bytes; what Nsight Compute's per-kernel ``dram__bytes_write`` counts: write-backs while it runs, not the dirty
    lines it leaves)."""
    kinds = []
    for i, k in enumerate(declared.kernels):
        n = int(launch_ptr[i + 1] - launch_ptr[i])
        row = {"kernel": k.name, "models": k.models, "grid": k.grid, "atomic": list(k.atomic), "splits": k.splits,
               "ctas": n, "waves": int(-(-n // slots))}  # fmt: skip
        if run.wb_launch is not None:  # less the flush after the previous launch (flush="per-kernel")
            during = run.wb_launch[i] - (run.wb_launch[i - 1] + run.wb_flush[i - 1] if i else 0)
            fills = run.fill_launch[i] - (run.fill_launch[i - 1] if i else 0)
            row.update(dram_write_during=int(during.sum()), dram_write_during_bytes=int(np.sum(during * eb)),
                       dram_read_bytes=int(np.sum(fills * eb)),
                       flush_after_bytes=int(np.sum(run.wb_flush[i] * eb)))  # fmt: skip
        kinds.append(row)
    if kinds and declared.kernels[-1] is launches_mod.CONVERT_DQ:  # its words each way, priced at their dtypes
        a_in, a_out = len(arrays.names) - 2, len(arrays.names) - 1
        n_in, n_out = int(run.read[a_in]), int(run.update[a_out])
        kinds[-1].update(
            reads={launches_mod.DQ_ACCUM: n_in}, writes={launches_mod.DQ_OUT: n_out},
            read_bytes=problem.bytes_of("dQ", n_in), write_bytes=problem.bytes_of("O", n_out),
            read_dtype=problem.dtype_of("dQ"), write_dtype=problem.dtype_o,
        )  # fmt: skip
    return kinds


def _opt(rec_inst, rec_req, n_rec, inst, cut, lay, Lw, cap, fill, wb, opt_limit_bytes) -> None:  # noqa: N803
    """Belady's OPT over the recorded line stream (:func:`iosim.views.cache_sim.opt`, write-validate), counted in
    lines and priced at each owner array's words per line ``Lw``."""
    from iosim.views import cache_sim as cs

    args = _stream_args(inst, cut, lay, Lw)
    lines, flags = _recorded_lines(rec_inst, rec_req, n_rec, args, opt_limit_bytes, "opt", OPT_BYTES_PER_LINE,
                                   max_lines=(1 << 31) - 1)  # fmt: skip
    lines32 = lines.astype(np.int32)
    aid_of = _owner_of_lines(lay).astype(np.int32)
    nxt = cs.next_use(lines32, lay.n_lines)
    f_lines, w_lines = np.zeros_like(fill), np.zeros_like(wb)
    left = cs.opt(lines32, flags, nxt, cap, 2, 1, aid_of, lay.n_lines, f_lines, w_lines)
    for line in left:
        w_lines[aid_of[line]] += 1
    fill += f_lines * Lw
    wb += w_lines * Lw
