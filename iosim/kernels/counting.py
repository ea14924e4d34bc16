"""Count the global-memory traffic of a real kernel launch, exactly, on a machine without a GPU.

A backend runs the kernel in its interpreter or simulator (Triton's ``TRITON_INTERPRET=1``, Pallas's interpret
mode, numba-cuda's CUDA simulator) and sees every global-memory access as it is issued. Each access is attributed
to the kernel argument whose storage holds its address and counted per lane:

* **reads / writes**: elements moved slow -> fast / fast -> slow, as issued (a lane masked off moves nothing), and
  the same in bytes (elements x the element size of the access);
* **atomics**: a read-modify-write (atomic add, CAS, ...) is one read and one write per enabled lane, also
  counted on their own;
* **distinct**: the elements each program touched at least once, summed over programs: issued > distinct means a
  program loaded (or stored) some data more than once;
* **per program**: the words each program (Triton program, CUDA thread block, Pallas grid step) read and wrote,
  and the number of programs;
* **LSU sectors** (Triton): the 32-byte global-memory sectors each ``tl.load`` / ``tl.store`` / atomic of a program
  touches under its mask, summed per array: what Nsight Compute's ``l1tex__t_bytes_pipe_lsu_mem_global_op_ld`` /
  ``_op_st`` / ``_op_atom`` + ``_op_red`` count, in sectors (see :func:`sectors_of` for the convention).

Semantics: counts are per program, like the model's fast memory per thread block: an element read by two programs
counts twice. Apart from the LSU sectors there is no coalescing, no cache line, no L2: the words are an upper bound
on DRAM traffic and exactly the quantity the two-level model (and the papers' I/O bounds) count, one word per
element whatever its dtype. Arguments that are not the attention arrays (sequence lengths, page tables, counters)
are counted under their own names. Elements of an array are named by the launcher (the dict it returns) or,
failing that, by the kernel's parameter name at its first launch.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from iosim.base.errors import InputError, install_hint

BACKENDS = ("triton", "pallas", "numba-cuda")
UNKNOWN = "<unattributed>"
# an aligned 32-byte chunk of global memory: the unit of the LSU's requests (Nsight Compute Kernel Profiling Guide,
# Memory Tables; iosim.hierarchy.lsu.SECTOR_BYTES, which tests/test_kernels_lsu.py checks this equals)
SECTOR_BYTES = 32
LSU_FIELDS = {"ld": "load_sectors", "st": "store_sectors", "atom": "atomic_sectors",
              "descriptor_ld": "descriptor_load_sectors", "descriptor_st": "descriptor_store_sectors"}  # fmt: skip


@dataclass(frozen=True)
class ArrayTraffic:
    """One array's traffic: elements (words) and bytes read and written as issued, atomics, distinct elements."""

    reads: int = 0
    writes: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    atomics: int = 0  # enabled lanes of read-modify-write operations (each also counted as a read and a write)
    distinct_reads: int = 0  # sum over programs of the elements that program read at least once
    distinct_writes: int = 0
    # LSU level: 32-byte sectors each load (store, atomic) request touched, summed over requests (sectors_of)
    load_sectors: int = 0
    store_sectors: int = 0
    atomic_sectors: int = 0
    descriptor_load_sectors: int = 0  # through a tensor descriptor (a TMA copy on sm_90): apart from the LSU's
    descriptor_store_sectors: int = 0

    @property
    def total(self) -> int:
        return self.reads + self.writes

    @property
    def reloads(self) -> int:
        """Reads beyond the first of each element within its program: data a program loaded more than once."""
        return self.reads - self.distinct_reads


@dataclass
class KernelCounts:
    """The counted traffic of one launcher run (one or more kernel launches): see the module docstring."""

    backend: str
    per_array: dict[str, ArrayTraffic]
    programs: int
    launches: int
    per_program: np.ndarray  # (programs, 2): words read and written by each program, in launch order
    seconds: float = 0.0
    kernels: list[str] = field(default_factory=list)  # kernel name of each launch
    shared_memory: dict = field(default_factory=dict)  # kernel -> bytes of shared memory its compiler allocates
    # per launch: kernel, grid, constexprs, launch options, autotune config, block shapes of its accesses per array
    launch_info: list[dict] = field(default_factory=list)
    out_of_bounds: list[dict] = field(default_factory=list)  # the first out-of-bounds accesses (kernel, program, ...)
    out_of_bounds_lanes: int = 0  # lanes out of bounds in all (counted under <unattributed>)
    config: str | None = None  # the autotune config counted (when a kernel had several)
    # stray accesses: a load/store site that touched one argument and then another in the same launch (the first
    # access of each such site, described: kernel, site, programs, arrays, offsets); stray_lanes counts them all
    stray: list[dict] = field(default_factory=list)
    stray_lanes: int = 0
    # arguments sharing storage (views of one buffer) that the kernel moved the same words through: kernel, arrays
    # (the pair; for write/read the writer first), kind (read/read, write/read, write/write), words (lane addresses)
    overlap: list[dict] = field(default_factory=list)
    output: str = ""  # what the launcher printed (count_file: its standard output in the counting process)
    # count_file: every config's (counts, numbers, arrays) when an autotuned kernel had several (this one first)
    runs: list = field(default_factory=list, repr=False)
    sectors_counted: bool = False  # the backend counted the LSU sectors of its requests (Triton's: sectors_of)

    @property
    def reads(self) -> int:
        return sum(a.reads for a in self.per_array.values())

    @property
    def writes(self) -> int:
        return sum(a.writes for a in self.per_array.values())

    @property
    def total(self) -> int:
        return self.reads + self.writes

    def lsu(self) -> dict | None:
        """The LSU level in bytes as Nsight Compute counts them (sectors x 32; None where the backend does not count
        sectors): ``ld`` (``l1tex__t_bytes_pipe_lsu_mem_global_op_ld``), ``st`` (``_op_st``), ``atom``
        (``_op_atom`` + ``_op_red``); the loads and stores through a tensor descriptor apart (``descriptor_ld``,
        ``descriptor_st``: on sm_90 Triton lowers them to TMA copies, which do not issue through the LSU pipe), and
        ``per_array`` {array: {the same keys}}. With no descriptor and every request touching whole sectors only
        (aligned, sector-multiple rows, no masked edge), ``ld`` equals the read bytes and ``st`` the write bytes."""
        if not self.sectors_counted:
            return None
        per = {k: {op: getattr(a, f) * SECTOR_BYTES for op, f in LSU_FIELDS.items()} for k, a in self.per_array.items()}
        total = {op: sum(p[op] for p in per.values()) for op in LSU_FIELDS}
        return {"sector_bytes": SECTOR_BYTES, **total, "per_array": per}

    def to_dict(self) -> dict:
        return {
            "backend": self.backend,
            "programs": self.programs,
            "launches": self.launches,
            "kernels": list(self.kernels),
            "shared_memory": dict(self.shared_memory),
            "seconds": self.seconds,
            "per_array": {k: _asdict(v) for k, v in self.per_array.items()},
            "per_program": self.per_program.tolist(),
            "launch_info": self.launch_info,
            "out_of_bounds": self.out_of_bounds,
            "out_of_bounds_lanes": self.out_of_bounds_lanes,
            "config": self.config,
            "stray": self.stray,
            "stray_lanes": self.stray_lanes,
            "overlap": self.overlap,
            "sectors_counted": self.sectors_counted,
            "lsu": self.lsu(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> KernelCounts:
        return cls(
            backend=d["backend"],
            per_array={k: ArrayTraffic(**v) for k, v in d["per_array"].items()},
            programs=int(d["programs"]),
            launches=int(d["launches"]),
            per_program=np.asarray(d["per_program"], dtype=np.int64).reshape(-1, 2),
            seconds=float(d["seconds"]),
            kernels=list(d.get("kernels", [])),
            shared_memory=dict(d.get("shared_memory", {})),
            launch_info=list(d.get("launch_info", [])),
            out_of_bounds=list(d.get("out_of_bounds", [])),
            out_of_bounds_lanes=int(d.get("out_of_bounds_lanes", 0)),
            config=d.get("config"),
            stray=list(d.get("stray", [])),
            stray_lanes=int(d.get("stray_lanes", 0)),
            overlap=list(d.get("overlap", [])),
            sectors_counted=bool(d.get("sectors_counted", False)),
        )


def _asdict(x) -> dict:
    return {k: getattr(x, k) for k in x.__dataclass_fields__}


@dataclass
class _Range:
    name: str
    start: int
    end: int
    itemsize: int


OOB_KEPT = 8  # out-of-bounds accesses described one by one (all are counted)


def sectors_of(addresses: np.ndarray, nbytes: int) -> int:
    """The 32-byte sectors one request touches: the distinct aligned 32-byte chunks holding a byte of any of its
    enabled lanes (``addresses``: their first bytes, ``nbytes`` each).

    The convention of :mod:`iosim.hierarchy.lsu` (whose model equals Nsight on iosim's numba.cuda kernels): a request's
    sectors are counted once per request, however many lanes share one, and a sector touched by two requests counts
    twice (Nsight's ``l1tex__t_bytes`` count the sectors the L1's tag stage looks up, hits included: the L1 is not a
    cache here). A partial sector (a masked edge, a row whose bytes are not a multiple of 32) counts whole.

    A request here is one ``tl.load`` / ``tl.store`` / atomic of one program (its whole block). The hardware issues
    it as several warp requests (``num_warps`` warps, a few instructions each), and Triton's blocked layout gives
    each thread a contiguous vector (up to 16 bytes) and a warp consecutive vectors along the contiguous dimension,
    so warp requests covering whole 32-byte sectors touch disjoint sectors and their sum is this count. Where a
    sector is split between two warp requests (rows of a byte length not a multiple of 32 split between warps, a
    block read by every warp, a layout the compiler chose for a transposed operand) Nsight counts it once per warp
    request and this count is a lower bound. Addresses are host addresses of the CPU tensors: torch's CPU
    allocator aligns storage to 64 bytes (c10/core/alignment.h, ``gAlignment``) as its CUDA caching allocator does to
    512 (c10/cuda/CUDACachingAllocator.cpp, ``kMinBlockSize``), so an offset's sector is the same on both."""
    a = np.asarray(addresses, dtype=np.uint64).ravel()
    if a.size == 0:
        return 0
    first, last = a // np.uint64(SECTOR_BYTES), (a + np.uint64(max(nbytes, 1) - 1)) // np.uint64(SECTOR_BYTES)
    if (first == last).all():
        return int(np.unique(first).size)
    # a lane straddling two sectors (a misaligned element: none in Triton, whose elements are naturally aligned)
    return int(np.unique(np.concatenate([first, last])).size)


class Recorder:
    """Backend-independent bookkeeping: address ranges of the arrays, the current program, lane-level accesses.

    An access's lanes are attributed with one binary search over the ranges' end points (a view inside a larger
    argument wins: the tightest range holding an address names it). An access whose lanes do not all lie in the
    argument its first lane lies in (or in a larger argument holding that one), or that lies outside every argument,
    is out of bounds: its lanes are counted under ``<unattributed>`` and described (kernel, program id, offsets).

    An access wholly inside another argument is caught by its *site* (a backend that can tell gives one: the chain
    of source lines, kernel to ``tl.load``, that issued it): within a launch each site touches one argument (or
    views inside it); a site that touched argument A and later touches B is a *stray* access, described like an
    out-of-bounds one (its lanes stay counted under the argument holding them, which is where a GPU would move
    them). A kernel that selects its pointer at run time declares the site (see :func:`count`)."""

    def __init__(self) -> None:
        self.ranges: list[_Range] = []
        self._bounds = np.zeros(0, dtype=np.uint64)  # sorted end points of the ranges
        self._seg = np.full(1, -1, dtype=np.int64)  # range id of the segment left of each bound (-1: none)
        self.issued: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(5, dtype=np.int64))  # r, w, rb, wb, atomics
        self.distinct: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(2, dtype=np.int64))
        self.count_sectors = False  # set by a backend whose accesses are one request each (Triton's: sectors_of)
        self.descriptor = False  # set by the backend around a tensor descriptor's load or store
        # ld, st, atomic, descriptor ld, descriptor st (ArrayTraffic's *_sectors)
        self.sectors: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(5, dtype=np.int64))
        self._touched: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)
        self.per_program: list[list[int]] = []
        self.launches = 0
        self.kernels: list[str] = []
        self.launch_info: list[dict] = []  # per counted launch: kernel, grid, constexprs, options, config, shapes
        self.program: tuple = ()  # the current program's id (grid index)
        self.oob: list[dict] = []  # the first OOB_KEPT out-of-bounds accesses
        self.oob_lanes = 0
        self._outer = np.zeros(0, dtype=np.int64)  # the outermost range holding each range (views -> their base)
        self._sites: dict[tuple, tuple[int, tuple]] = {}  # this launch: site -> (outermost range, first program)
        self.strays: dict[tuple, dict] = {}  # (kernel, site) -> its first stray access and the lanes of all
        self.sites_seen: set[str] = set()  # innermost FILE:LINE of every site that moved data
        self._in_program = False
        self.paused = False  # inside ``paused()``: launches run uncounted
        self._claimed: dict[int, str] = {}  # this launch: range id -> the argument name it was registered for
        self._retired: set[int] = set()  # arguments of finished launches not claimed again: out of the index
        self._copies: set[int] = set()  # ranges of per-launch copies (register_copy): never matched by address
        self._overlapping: dict[int, set[int]] = {}  # range id -> the ranges sharing some of its bytes
        self._through: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)  # this launch, (rid, r/w): bytes
        self.overlaps: dict[tuple, int] = {}  # (kernel, rid a, rid b, kind) -> words moved through both

    # --- arrays ---------------------------------------------------------------------------------------------
    def register(self, name: str, start: int, nbytes: int, itemsize: int) -> int | None:
        """Name the bytes [start, start + nbytes) after a kernel parameter; a range already known keeps its name (the
        same tensor handed to two launches is one array; a per-launch copy's range is no array's but its own:
        :meth:`register_copy`). Returns the range id (None for an empty range)."""
        if nbytes <= 0:
            return None
        start, end = int(start), int(start) + int(nbytes)
        for rid, r in enumerate(self.ranges):
            if r.start == start and r.end == end and rid not in self._copies:
                if rid in self._retired:  # an argument of an earlier launch handed to this one
                    self._retired.discard(rid)
                    self._index()
                return rid
        self.ranges.append(_Range(name, start, end, int(itemsize)))
        self._index()
        return len(self.ranges) - 1

    def register_argument(self, name: str, start: int, nbytes: int, itemsize: int) -> int | None:
        """:meth:`register` for one argument of the current launch, whose accesses the backend attributes by the
        pointer they were derived from (``origin``): two arguments of one launch over the very same bytes (one tensor
        passed twice) are two arrays, each counted for the accesses made through it."""
        rid = self.register(name, start, nbytes, itemsize)
        if rid is None:
            return None
        if rid in self._claimed and self._claimed[rid] != name:
            same = [i for i, r in enumerate(self.ranges) if (r.start, r.end) == (self.ranges[rid].start,
                    self.ranges[rid].end) and i not in self._copies]  # fmt: skip
            rid = next((i for i in same if self.ranges[i].name == name), None)
            if rid is None:
                self.ranges.append(_Range(name, int(start), int(start) + int(nbytes), int(itemsize)))
                self._index()
                rid = len(self.ranges) - 1
        self._claimed[rid] = name
        return rid

    def register_copy(self, name: str, start: int, nbytes: int, itemsize: int, rid: int | None) -> int | None:
        """:meth:`register_argument` for an argument the backend hands the kernel as a copy made for this launch
        (numba.cuda's simulator copies every host array): its identity is the array copied, never the address,
        which a finished launch's freed copy of another array may have held. ``rid``: the range of an earlier copy
        of the same array, moved to this copy's bytes (its counts go on under its name); None, or a range this
        launch already claimed for another parameter (one array passed as two arguments): a new range."""
        if nbytes <= 0:
            return None
        start, end = int(start), int(start) + int(nbytes)
        if rid is None or self._claimed.get(rid, name) != name:
            self.ranges.append(_Range(name, start, end, int(itemsize)))
            rid = len(self.ranges) - 1
        else:
            r = self.ranges[rid]
            self.ranges[rid] = _Range(r.name, start, end, r.itemsize)
        self._copies.add(rid)
        self._retired.discard(rid)
        self._claimed[rid] = name
        self._index()
        return rid

    def _live(self) -> list[int]:
        """The range ids an address may be attributed to now: every range but the retired arguments."""
        return [i for i in range(len(self.ranges)) if i not in self._retired]

    def _index(self) -> None:
        """The segment table over the live ranges: between consecutive end points, the tightest range holding them
        (or none); each live range's outermost live range and the live ranges sharing its bytes.

        A finished launch's arguments are retired from it (:meth:`begin_launch`) until a launch hands them in again:
        their memory may since have been freed and reused (numba.cuda's simulator copies every host array per
        launch), and a stale range holding a later argument's bytes would attribute its lanes, name its base and
        set its bounds."""
        live = self._live()
        pts = sorted({p for i in live for p in (self.ranges[i].start, self.ranges[i].end)})
        seg = [-1]
        for a in pts:
            holding = [i for i in live if self.ranges[i].start <= a < self.ranges[i].end]
            seg.append(min(holding, key=lambda i: self.ranges[i].end - self.ranges[i].start) if holding else -1)
        self._bounds = np.asarray(pts, dtype=np.uint64)
        self._seg = np.asarray(seg, dtype=np.int64)
        self._outer = np.arange(len(self.ranges), dtype=np.int64)
        for i in live:
            self._outer[i] = self._outermost_id(i)
        self._overlapping = {i: {j for j in live if j != i and self.ranges[j].start < self.ranges[i].end
                                 and self.ranges[i].start < self.ranges[j].end} for i in live}  # fmt: skip

    def _outermost_id(self, rid: int) -> int:
        """The largest live range holding range ``rid`` (itself when none does; the first of equal ones)."""
        r = self.ranges[rid]
        holding = [i for i in self._live() if self.ranges[i].start <= r.start and r.end <= self.ranges[i].end]
        return max(holding or [rid], key=lambda i: (self.ranges[i].end - self.ranges[i].start, -i))

    def _outermost(self, rid: int) -> _Range:
        return self.ranges[self._outermost_id(rid)]

    # --- programs -------------------------------------------------------------------------------------------
    def begin_launch(self, kernel: str, info: dict | None = None) -> None:
        """A new launch: the last one's overlaps closed, its sites forgotten and its arguments retired from the
        address index (:meth:`_index`) until this launch registers them again."""
        self.end_program()
        self._close_launch()
        self._sites = {}
        if self._claimed:
            self._retired |= set(self._claimed)
            self._index()
        self._claimed = {}
        if self.paused:
            return
        self.launches += 1
        self.kernels.append(kernel)
        self.launch_info.append({"kernel": kernel, **(info or {}), "shapes": {}})

    def begin_program(self, program: tuple = ()) -> None:
        self.end_program()
        self.program = tuple(int(x) for x in program)
        if self.paused:
            return
        self.per_program.append([0, 0])
        self._in_program = True

    def end_program(self) -> None:
        if not self._in_program:
            return
        for (rid, col), chunks in self._touched.items():
            self.distinct[rid][col] += _distinct(chunks, self.ranges[rid] if rid >= 0 else None)
        self._touched.clear()
        self._in_program = False

    # --- accesses -------------------------------------------------------------------------------------------
    def range_ids(self, addresses: np.ndarray) -> np.ndarray:
        """The tightest registered range holding each byte address (-1: none): how a backend whose buffered
        accesses mix arguments (numba-cuda's element accesses, flushed a block at a time) splits them into one
        access per argument before :meth:`access`, which reads a batch as one access starting in one argument."""
        addr = np.asarray(addresses, dtype=np.uint64).ravel()
        return self._seg[np.searchsorted(self._bounds, addr, side="right")]

    def access(
        self,
        addresses: np.ndarray,
        kind: str,
        nbytes: int,
        shape: tuple | None = None,
        site: tuple | None = None,
        origin: int | None = None,
    ) -> np.ndarray | None:
        """Lanes that moved data: their byte addresses (enabled lanes only), kind "r", "w" or "a" (atomic: a read and
        a write), the bytes one lane moves, the shape of the access's block (for reading block sizes off) and its
        site (a tuple of (file, line, ...) frames, kernel first; None when the backend cannot tell). ``origin``: the
        range id of the argument the access's pointer was derived from, when the backend knows it (then every lane
        inside that argument is its, whatever other argument shares the bytes: see :meth:`_access_through`); None:
        attributed by address. Returns None, or which of the lanes are out of bounds (a backend may then keep them
        from touching memory)."""
        if self.paused:
            return None
        if not self._in_program:
            self.begin_program(self.program)
        addr = np.asarray(addresses, dtype=np.uint64).ravel()
        if addr.size == 0:
            return None
        if origin is not None and 0 <= origin < len(self.ranges):
            return self._access_through(addr, kind, nbytes, shape, site, int(origin))
        rids = self._seg[np.searchsorted(self._bounds, addr, side="right")]
        first = int(rids[0])
        if site is not None and first >= 0:
            self._check_site(site, first, rids, addr, kind)
        if shape is not None and first >= 0 and self.launch_info:
            self.launch_info[-1]["shapes"].setdefault((first, kind), set()).add(tuple(int(s) for s in shape))
        if first >= 0 and (rids.size == 1 or (rids[1:] == first).all()):  # the common case: one argument
            self._add(first, kind, nbytes, addr)
            return None
        inside = np.zeros(addr.size, dtype=bool)
        if first >= 0:
            outer = self._outermost(first)
            inside = (addr >= np.uint64(outer.start)) & (addr < np.uint64(outer.end)) & (rids >= 0)
        for rid in np.unique(rids[inside]):
            sel = inside & (rids == rid)
            self._add(int(rid), kind, nbytes, addr[sel])
        out = ~inside
        n = int(out.sum())
        if not n:
            return None
        self._add(-1, kind, nbytes, addr[out])
        self.oob_lanes += n
        if len(self.oob) < OOB_KEPT:
            info = self.launch_info[-1] if self.launch_info else {"kernel": "kernel"}
            r = self.ranges[first] if first >= 0 else None
            offs = (addr[out].astype(np.int64) - r.start) // r.itemsize if r else addr[out].astype(np.int64)
            landed = rids[out][rids[out] >= 0]  # out of the argument it started in, inside another one
            self.oob.append({"kernel": info["kernel"], "program": list(self.program), "kind": kind, "lanes": n,
                             "rid": first, "offsets": [int(x) for x in offs[:6]],
                             "elements": (r.end - r.start) // r.itemsize if r else None,
                             "inside_rid": int(self._outer[landed[0]]) if landed.size else -1})  # fmt: skip
        return out

    def _access_through(self, addr: np.ndarray, kind: str, nbytes: int, shape, site, origin: int) -> np.ndarray | None:
        """Lanes issued through argument ``origin``'s pointer: those inside its storage are its (views of one buffer
        each keep their own loads: K and V split from one cache, V nested in K). A lane outside it is the kernel's
        overrun: inside another argument it is *stray* (counted there, where a GPU would move it), outside every
        argument out of bounds (counted under ``<unattributed>``); both are described (:func:`access_problem`)."""
        r = self.ranges[origin]
        inside = (addr >= np.uint64(r.start)) & (addr < np.uint64(r.end))
        if site is not None:  # the lanes inside the argument: an overrun's are stray (or out of bounds) below
            self._check_site_origin(site, origin, addr[inside], kind)
        if shape is not None and self.launch_info:
            self.launch_info[-1]["shapes"].setdefault((origin, kind), set()).add(tuple(int(s) for s in shape))
        if inside.all():
            self._add(origin, kind, nbytes, addr)
            self._note_through(origin, kind, addr)
            return None
        if inside.any():
            mine = addr[inside]
            self._add(origin, kind, nbytes, mine)
            self._note_through(origin, kind, mine)
        out = ~inside
        rids = self._seg[np.searchsorted(self._bounds, addr, side="right")]
        landed = out & (rids >= 0)
        for rid in np.unique(rids[landed]):  # an overrun into another argument: stray, counted where it lands
            sel = landed & (rids == rid)
            self._add(int(rid), kind, nbytes, addr[sel])
        if landed.any():
            own_program = self._sites.get(site, (origin, self.program))[1] if site is not None else self.program
            self._stray(site or (("<no site>", 0, 0),), origin, int(self._outer[rids[landed][0]]), addr[landed], kind,
                        own_program)  # fmt: skip
        gone = out & (rids < 0)
        n = int(gone.sum())
        if not n:
            return out
        self._add(-1, kind, nbytes, addr[gone])
        self.oob_lanes += n
        if len(self.oob) < OOB_KEPT:
            info = self.launch_info[-1] if self.launch_info else {"kernel": "kernel"}
            wild = not inside[0] and rids[0] < 0  # no lane starts in any argument: described by its addresses
            offs = addr[gone].astype(np.int64) if wild else (addr[gone].astype(np.int64) - r.start) // r.itemsize
            size = None if wild else (r.end - r.start) // r.itemsize
            self.oob.append({"kernel": info["kernel"], "program": list(self.program), "kind": kind, "lanes": n,
                             "rid": -1 if wild else origin, "offsets": [int(x) for x in offs[:6]], "elements": size,
                             "inside_rid": -1})  # fmt: skip
        return out

    def _check_site_origin(self, site: tuple, origin: int, addr: np.ndarray, kind: str) -> None:
        """One site, one argument per launch, by the pointer it used: a site that moved argument A and later moves
        B (a pointer chosen at run time, unless declared) is stray. ``addr``: the access's lanes inside ``origin``
        (those outside it are an overrun, recorded by :meth:`_access_through`; never twice)."""
        self.sites_seen.add(site_label(site[-1:]))
        known = self._sites.get(site)
        if known is None:
            self._sites[site] = (origin, self.program)
        elif known[0] != origin and addr.size:
            self._stray(site, known[0], origin, addr, kind, known[1])

    def _stray(self, site: tuple, own: int, other: int, lanes: np.ndarray, kind: str, seen_in: tuple) -> None:
        """Record stray lanes of ``site``: it moved argument ``own`` (first in program ``seen_in``), now ``other``
        (the range the first of ``lanes`` lies in); every lane counts, the record describes those inside ``other``
        (their offsets in ``other`` and in ``own``), never a lane of a third array measured from ``other``'s base."""
        kernel = self.launch_info[-1]["kernel"] if self.launch_info else "kernel"
        key = (kernel, site)
        if key in self.strays:
            self.strays[key]["total"] += lanes.size
            return
        o, r = self.ranges[own], self.ranges[other]
        mine = lanes[(lanes >= np.uint64(r.start)) & (lanes < np.uint64(r.end))].astype(np.int64)
        self.strays[key] = {
            "kernel": kernel, "site": site_label(site), "program": list(self.program), "kind": kind,
            "lanes": int(mine.size), "own_rid": own, "own_program": list(seen_in),
            "own_elements": (o.end - o.start) // o.itemsize, "rid": other,
            "offsets": [int(x) for x in (mine[:6] - r.start) // r.itemsize],
            "own_offsets": [int(x) for x in (mine[:6] - o.start) // o.itemsize], "total": int(lanes.size),
        }  # fmt: skip

    def _note_through(self, rid: int, kind: str, addr: np.ndarray) -> None:
        """Keep, for this launch, the bytes moved through an argument that shares storage with another (overlap)."""
        if self._overlapping.get(rid):
            if kind in ("r", "a"):
                self._through[(rid, 0)].append(addr)
            if kind in ("w", "a"):
                self._through[(rid, 1)].append(addr)

    def _close_launch(self) -> None:
        """The launch's overlap: for two arguments sharing storage, the words (lane addresses) moved through both,
        by kind: ``read/read`` (views read alike: harmless), ``write/read`` (stored through the first, loaded
        through the second) and ``write/write``."""
        if not self._through:
            return
        kernel = self.launch_info[-1]["kernel"] if self.launch_info else "kernel"
        seen = {k: np.unique(np.concatenate(v)) for k, v in self._through.items()}
        self._through = defaultdict(list)
        for (a, col_a), xa in seen.items():
            for b in self._overlapping.get(a, ()):
                for col_b, kind in ((0, "read/read" if col_a == 0 else "write/read"), (1, "write/write")):
                    if col_a == 0 and col_b == 1 or (col_a == col_b and b < a):
                        continue  # each unordered pair once per kind; read/write is the writer's write/read
                    xb = seen.get((b, col_b))
                    n = 0 if xb is None else int(np.intersect1d(xa, xb, assume_unique=True).size)
                    if n:
                        key = (kernel, a, b, kind)
                        self.overlaps[key] = self.overlaps.get(key, 0) + n

    def _check_site(self, site: tuple, first: int, rids: np.ndarray, addr: np.ndarray, kind: str) -> None:
        """One site, one argument per launch: the first argument a site touches is its own; a later access by that
        site that starts inside another argument is stray (recorded; the first per site described): its lanes
        inside that argument (the outermost range holding its first lane), measured from that argument's base.
        Its lanes beyond that argument are out of bounds (:meth:`access` counts and describes them), not stray."""
        self.sites_seen.add(site_label(site[-1:]))
        home = int(self._outer[first])
        known = self._sites.get(site)
        if known is None:
            self._sites[site] = (home, self.program)
            return
        own, seen_in = known
        if own == home:
            return
        h = self.ranges[home]
        mine = (rids >= 0) & (addr >= np.uint64(h.start)) & (addr < np.uint64(h.end))
        self._stray(site, own, home, addr[mine], kind, seen_in)

    def _add(self, rid: int, kind: str, nbytes: int, addr: np.ndarray) -> None:
        """Count the lanes at byte addresses ``addr`` (``nbytes`` each) for range ``rid`` (-1: out of bounds): words,
        bytes, the elements touched (offsets in the range; raw addresses out of bounds) and, where the backend's
        accesses are requests (:attr:`count_sectors`), the sectors of this request that lie in the range."""
        n = int(addr.size)
        if rid >= 0:
            r = self.ranges[rid]
            elements = (addr - np.uint64(r.start)) // np.uint64(r.itemsize)
        else:
            elements = addr
        if self.count_sectors:
            col = {"r": 0, "w": 1, "a": 2}[kind] + (3 if self.descriptor and kind != "a" else 0)
            self.sectors[rid][col] += sectors_of(addr, nbytes)
        c, prog = self.issued[rid], self.per_program[-1]
        if kind in ("r", "a"):
            c[0] += n
            c[2] += n * nbytes
            prog[0] += n
            self._touched[(rid, 0)].append(elements)
        if kind in ("w", "a"):
            c[1] += n
            c[3] += n * nbytes
            prog[1] += n
            self._touched[(rid, 1)].append(elements)
        if kind == "a":
            c[4] += n

    def result(
        self, backend: str, seconds: float, names: dict[str, tuple[int, int]] | None = None, selects_pointers=()
    ) -> KernelCounts:
        """The counts; ``names`` (name -> (start, nbytes)) renames the ranges of the arrays the launcher named (not a
        per-launch copy's, whose bytes a later array may occupy); ``selects_pointers`` (kernel names or sites
        ``FILE.py:LINE``) are let touch several arguments."""
        self.end_program()
        self._close_launch()
        label = {-1: UNKNOWN}
        for rid, r in enumerate(self.ranges):
            label[rid] = r.name
        for name, (start, nbytes) in (names or {}).items():
            same = [rid for rid, r in enumerate(self.ranges)
                    if r.start == start and r.end == start + nbytes and rid not in self._copies]  # fmt: skip
            own = [rid for rid in same if self.ranges[rid].name == name]  # one tensor passed as two arguments
            for rid in own or same:
                label[rid] = name
        final: dict[int, str] = {-1: UNKNOWN}
        taken: dict[str, int] = {}
        for rid in sorted(label, key=lambda i: (i < 0, -1 if i in self.issued else 0, i)):
            name = label[rid]
            if name in taken and taken[name] != rid:  # two different arrays behind one parameter name
                k = 2
                while f"{name}#{k}" in taken:
                    k += 1
                name = f"{name}#{k}"
            taken[name] = rid
            final[rid] = name
        per: dict[str, ArrayTraffic] = {}
        for rid in sorted(self.issued, key=lambda i: (i < 0, i)):
            c, dist = self.issued[rid], self.distinct[rid]
            sec = self.sectors.get(rid, np.zeros(5, dtype=np.int64))
            per[final[rid]] = ArrayTraffic(*(int(x) for x in c), int(dist[0]), int(dist[1]), *(int(x) for x in sec))
        launches = []
        for info in self.launch_info:
            shapes: dict[str, dict[str, list]] = {}
            for (rid, kind), got in info["shapes"].items():
                shapes.setdefault(final[rid], {})[kind] = sorted(got)
            launches.append({**info, "shapes": shapes})
        oob = [{**{k: v for k, v in o.items() if k != "rid"}, "array": final[o["rid"]] if o["rid"] >= 0 else None}
               for o in self.oob]  # fmt: skip
        for o in oob:
            o["inside"] = final[o.pop("inside_rid")] if o.get("inside_rid", -1) >= 0 else None
        allowed = _allowed_sites(selects_pointers, set(self.kernels), self.sites_seen)
        stray = [{**{k: v for k, v in e.items() if not k.endswith("rid")}, "own": final[e["own_rid"]],
                  "array": final[e["rid"]]}
                 for (kernel, site), e in self.strays.items()
                 if kernel not in allowed and site_label(site[-1:]) not in allowed]  # fmt: skip
        pp = np.asarray(self.per_program, dtype=np.int64).reshape(-1, 2)
        overlap = [{"kernel": k, "arrays": [final[a], final[b]], "kind": kind, "words": n}
                   for (k, a, b, kind), n in self.overlaps.items()]  # fmt: skip
        return KernelCounts(backend, per, len(pp), self.launches, pp, seconds, list(self.kernels),
                            launch_info=launches, out_of_bounds=oob, out_of_bounds_lanes=self.oob_lanes,
                            stray=stray[:OOB_KEPT], stray_lanes=sum(e["total"] for e in stray),
                            overlap=overlap, sectors_counted=self.count_sectors)  # fmt: skip


def lsu_lines(counts: KernelCounts) -> list[str]:
    """The LSU level as text (to print under ``iosim kernel``'s per-array table): the bytes Nsight Compute's
    ``l1tex__t_bytes_pipe_lsu_mem_global_op_ld`` / ``_op_st`` count, from the 32-byte sectors of each request
    (:func:`sectors_of`), per array where they differ from the bytes moved; descriptor (TMA) traffic apart."""
    lsu = counts.lsu()
    if lsu is None:
        return []
    moved = {k: (a.read_bytes, a.write_bytes) for k, a in counts.per_array.items()}
    rb, wb = sum(r for r, _ in moved.values()), sum(w for _, w in moved.values())
    line = (f"LSU (32-byte sectors per tl.load/tl.store request, as Nsight's l1tex__t_bytes_pipe_lsu_mem_global_op_ld"
            f"/_st): loads {lsu['ld']:,} bytes, stores {lsu['st']:,} bytes")  # fmt: skip
    if lsu["atom"]:
        line += f", atomics {lsu['atom']:,} bytes (_op_atom + _op_red)"
    if lsu["descriptor_ld"] or lsu["descriptor_st"]:
        line += (f"; through tensor descriptors (TMA on sm_90, not the LSU pipe): loads {lsu['descriptor_ld']:,}, "
                 f"stores {lsu['descriptor_st']:,} bytes")  # fmt: skip
    lsu_r = lsu["ld"] + lsu["descriptor_ld"] + lsu["atom"]
    lsu_w = lsu["st"] + lsu["descriptor_st"] + lsu["atom"]
    if (lsu_r, lsu_w) == (rb, wb):
        return [line + "; every sector whole: the bytes moved"]
    out = [line + f"; the bytes moved: {rb:,} read, {wb:,} written (partial sectors counted whole)"]
    for k, p in lsu["per_array"].items():
        r = p["ld"] + p["descriptor_ld"] + p["atom"]
        w = p["st"] + p["descriptor_st"] + p["atom"]
        if (r, w) != moved[k]:
            out.append(f"LSU {k}: {r:,} bytes in sectors read (moved {moved[k][0]:,}), {w:,} written "
                       f"(moved {moved[k][1]:,})")  # fmt: skip
    return out


def site_label(site: tuple) -> str:
    """A site (frames (file, line, ...), kernel first) as ``file.py:LINE`` (the load or store), then
    ``<- file.py:LINE`` for each call above it up to the kernel."""
    import os

    return " <- ".join(f"{os.path.basename(f[0])}:{f[1]}" for f in reversed(site))


def _allowed_sites(declared, kernels: set[str], sites: set[str]) -> set[str]:
    """The launcher's ``selects_pointers``: kernel names or ``FILE.py:LINE`` sites that ran, else one line."""
    if isinstance(declared, str):
        declared = [declared]
    if not isinstance(declared, (list, tuple, set)) or not all(isinstance(x, str) for x in declared):
        raise InputError("launcher result 'selects_pointers'", "must be a list of kernel names or FILE.py:LINE sites",
                         declared)  # fmt: skip
    for x in declared:
        if x not in kernels and x not in sites:
            accepted = f"must name a kernel launched ({', '.join(sorted(kernels)) or 'none'}) or a FILE.py:LINE " \
                       "site of one of its loads or stores"  # fmt: skip
            raise InputError("launcher result 'selects_pointers'", accepted, x)
    return set(declared)


class AccessError(Exception):
    """A kernel moved data no argument accounts for: lanes out of bounds (outside every argument, or past the end of
    the one they started in) or stray (a load/store site that touched one argument, then another). The message is
    one line naming the kernel, the site or program, the arrays and the offsets; ``counts`` holds what was counted."""

    def __init__(self, message: str, counts: KernelCounts) -> None:
        super().__init__(message)
        self.counts = counts


_VERB = {"r": "loaded", "w": "stored", "a": "updated atomically"}


def access_problem(counts: KernelCounts) -> str | None:
    """One line describing the first out-of-bounds or stray access of ``counts`` (None when there is none)."""
    if counts.out_of_bounds_lanes or UNKNOWN in counts.per_array:
        o = counts.out_of_bounds[0] if counts.out_of_bounds else {}
        verb = _VERB.get(o.get("kind"), "moved")
        if o.get("array"):
            offs, n = o["offsets"], o["elements"]
            side = "past the end of" if min(offs) >= n else "before the start of" if max(offs) < 0 else "outside"
            where = f"{side} {o['array']} ({n:,} elements) at element offsets {offs}"
            if o.get("inside"):
                where += f", inside {o['inside']}"
        else:
            where = f"outside every argument at addresses {[hex(a) for a in o.get('offsets', [])]}"
        return (f"{counts.out_of_bounds_lanes:,} lanes out of bounds ({UNKNOWN}): first, kernel {o.get('kernel')} "
                f"program {tuple(o.get('program', ()))} {verb} {o.get('lanes')} lanes {where}")  # fmt: skip
    if counts.stray_lanes:
        e = counts.stray[0]
        offs, n = e["own_offsets"], e["own_elements"]
        side = "past the end of" if min(offs) >= n else "before the start of" if max(offs) < 0 else "outside"
        return (f"{counts.stray_lanes:,} stray lanes (a site that moved one argument, then another): first, kernel "
                f"{e['kernel']} site {e['site']} program {tuple(e['program'])} {_VERB[e['kind']]} {e['lanes']} lanes "
                f"inside {e['array']} at element offsets {e['offsets']}, {side} {e['own']} ({n:,} elements, which the "
                f"site moved in program {tuple(e['own_program'])}) at its offsets {offs}; a kernel that picks its "
                f"pointer at run time declares the site ('selects_pointers')")  # fmt: skip
    return None


def overlap_lines(counts: KernelCounts) -> tuple[list[str], list[str]]:
    """(notes, warnings) on arguments that share storage and that the kernel moved the same words through: views
    read alike are a note (each load counted for the view it went through); a store through one view of words
    loaded (or stored) through another is a warning naming both (which value a program sees then depends on the
    order programs run)."""
    notes, warnings = [], []
    for e in counts.overlap:
        a, b = e["arrays"]
        n, k = f"{e['words']:,}", e["kernel"]
        if e["kind"] == "read/read":
            notes.append(f"{a} and {b} share storage (views of one buffer): kernel {k} loaded {n} words through both, "
                         f"each load counted for the view it went through")  # fmt: skip
        elif e["kind"] == "write/read":
            warnings.append(f"overlap: kernel {k} stored {n} words through {a} that it loaded through {b} (views of "
                            f"one buffer): what a load sees depends on the order the programs run")  # fmt: skip
        else:
            warnings.append(f"overlap: kernel {k} stored {n} words through both {a} and {b} (views of one buffer)")
    return notes, warnings


def _distinct(chunks: list[np.ndarray], r: _Range | None) -> int:
    """Distinct elements among a program's accesses of one range: a bitmap over the range when the accesses cover a
    good part of it, a sort otherwise."""
    els = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    if r is not None:
        size = -(-(r.end - r.start) // r.itemsize)
        if els.size * 8 >= size:
            seen = np.zeros(size, dtype=bool)
            seen[els] = True
            return int(np.count_nonzero(seen))
    return int(np.unique(els).size)


# ---------------------------------------------------------------------------------------------------------------
# Running a launcher: in this process (the backend's mode already on) or in a fresh one (count_file)
# ---------------------------------------------------------------------------------------------------------------
ENV = {  # what each backend needs set before its package is first imported
    "triton": {"TRITON_INTERPRET": "1"},
    "numba-cuda": {"NUMBA_ENABLE_CUDASIM": "1"},
    "pallas": {"JAX_PLATFORMS": "cpu"},
}
EXTRA = {"triton": ("triton", ("triton", "torch")), "pallas": ("pallas", ("jax",)), "numba-cuda": ("cuda", ("numba",))}


def backend_module(backend: str):
    if backend == "triton":
        from iosim.kernels import triton_backend as m
    elif backend == "numba-cuda":
        from iosim.kernels import numba_cuda_backend as m
    elif backend == "pallas":
        from iosim.kernels import pallas_backend as m
    else:
        raise InputError("backend", f"must be one of {', '.join(BACKENDS)}", backend)
    return m


def require_extra(backend: str) -> None:
    """InputError naming the extra when the backend's packages are not installed (checked without importing)."""
    import importlib.util

    if backend not in BACKENDS:
        raise InputError("backend", f"must be one of {', '.join(BACKENDS)}", backend)
    extra, modules = EXTRA[backend]
    for m in modules:
        if importlib.util.find_spec(m) is None:
            raise InputError(f"backend {backend}", f"needs the extra: {install_hint(extra)} ({m} is missing)")


DECLARATIONS = (
    "names",
    "layout",
    "metadata",
    "buffers",
    "selects_pointers",
)  # launcher result keys that are not arrays
_ACTIVE: list[Recorder] = []
LAST_RECORDER: list[Recorder | None] = [None]  # the recorder of the last count() (its launches, for compiling)


@contextlib.contextmanager
def paused():
    """Launches inside this block are not counted (a launcher's setup, e.g. the forward before a backward)."""
    saved = [r.paused for r in _ACTIVE]
    for r in _ACTIVE:
        r.end_program()
        r.paused = True
    try:
        yield
    finally:
        for r, p in zip(_ACTIVE, saved, strict=True):
            r.paused = p


def count(launch, backend: str = "triton", config=None, strict: bool = True, fast: bool = False
          ) -> tuple[KernelCounts, dict]:  # fmt: skip
    """Count the traffic of ``launch()`` (a callable that launches one or more kernels) in this process.

    ``launch`` may return a dict naming the arrays (name -> array, as the model names them: Q, K, V, O, L, ...)
    and numbers (``scale``); arrays it does not name are counted under the kernel's parameter names. The backend's
    mode must already be on in this process (``TRITON_INTERPRET=1`` / ``NUMBA_ENABLE_CUDASIM=1`` set before the
    package was imported); :func:`count_file` starts a fresh process that sets it. ``config`` (Triton) picks the
    config of an autotuned kernel with several: a label or part of one (``BLOCK_M=64,num_warps=4``) or an index;
    with none the first is counted (:func:`count_configs` counts each). Returns the counts and the dict ``launch``
    returned (or {}). ``fast`` (Triton only) skips the values no count depends on and refuses a kernel whose
    addresses, masks or control flow would need them (:mod:`iosim.kernels.fast`): the same counts, no numerics.

    Data the kernel moved that no argument accounts for (lanes out of bounds; a load/store site that touched one
    argument and then another in the same launch) raises :class:`AccessError` (one line; its ``counts`` hold the
    counts) unless ``strict`` is False, when it is only described in ``counts.out_of_bounds`` and ``counts.stray``.
    A kernel that selects its pointer at run time (one ``tl.load`` reading A in some programs and B in others) is
    declared by the launcher: ``"selects_pointers": [kernel name or "FILE.py:LINE" of the load or store]``.
    """
    mod = backend_module(backend)
    if fast and backend != "triton":
        raise InputError("--fast", "is offered for Triton kernels (under the interpreter) only", backend)
    rec = Recorder()
    t0 = time.perf_counter()
    _ACTIVE.append(rec)
    try:
        with mod.hooks(rec, config, fast) if backend == "triton" else mod.hooks(rec):
            out = launch()
    finally:
        _ACTIVE.remove(rec)
    seconds = time.perf_counter() - t0
    out = {} if out is None else out
    if not isinstance(out, dict):
        raise InputError("launcher", "must return a dict of named arrays (or None)", type(out).__name__)
    names, rename = {}, out.get("names") or {}
    if not isinstance(rename, dict):
        raise InputError("launcher result 'names'", "must be a dict (kernel's name -> model's name)", rename)
    for name, x in out.items():
        if isinstance(x, (int, float, bool, str)) or x is None or name in DECLARATIONS:
            continue
        r = mod.array_range(x)
        if r is None and not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise InputError(f"launcher result {name!r}", "must be an array or a number", type(x).__name__)
        if r is not None:
            names[name] = r
    if hasattr(mod, "name_arrays"):
        mod.name_arrays(rec, out)
    counts = rec.result(backend, seconds, names, out.get("selects_pointers") or ())
    counts.config = next((i["config"] for i in counts.launch_info if " of " in str(i.get("config"))), None)
    LAST_RECORDER[0] = rec
    if rename:
        counts.per_array = {str(rename.get(k, k)): v for k, v in counts.per_array.items()}
        for e in counts.stray + counts.out_of_bounds:
            for k in ("array", "own", "inside"):
                if e.get(k) is not None:
                    e[k] = str(rename.get(e[k], e[k]))
        for e in counts.overlap:
            e["arrays"] = [str(rename.get(a, a)) for a in e["arrays"]]
    if strict:
        raise_access(counts)
    return counts, out


def raise_access(counts: KernelCounts) -> None:
    """:class:`AccessError` when ``counts`` hold out-of-bounds or stray lanes."""
    problem = access_problem(counts)
    if problem:
        raise AccessError(problem, counts)


def count_configs(launch, backend: str = "triton", config=None, strict: bool = True, fast: bool = False
                  ) -> list[tuple[KernelCounts, dict]]:  # fmt: skip
    """:func:`count` once per config of the autotuned kernel(s) ``launch`` runs (each config its own counts, its
    ``config`` naming it), or once for the config named (``config``) or when no kernel has several configs."""
    runs = [count(launch, backend, 0 if config is None else config, strict, fast)]
    tuned = getattr(LAST_RECORDER[0], "autotuned", {})
    if config is not None and not tuned:
        raise InputError(
            "--config", "names a config of an @triton.autotune kernel: this launcher launched none", config
        )
    many = max((len(v) for v in tuned.values()), default=1)
    if config is None and many > 1:
        runs += [count(launch, backend, k, strict, fast) for k in range(1, many)]
    return runs


BACKEND_OF = {"triton": "triton", "torch": "triton", "jax": "pallas", "numba": "numba-cuda"}  # module -> backend
KIND = {"triton": "Triton", "pallas": "Pallas", "numba-cuda": "numba-cuda"}  # the kernels each backend counts


def _imports(path) -> list[str]:
    """The top-level modules a launcher file imports, in the order it imports them."""
    import re
    from pathlib import Path

    text = Path(path).read_text(errors="replace")
    return list(dict.fromkeys(re.findall(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", text, flags=re.M)))


def detect_backend(path) -> str:
    """The backend a launcher file needs, from the modules it imports: triton (or, for a library of Triton kernels
    imported by name, torch), pallas (jax), or numba-cuda (numba)."""
    from pathlib import Path

    top = set(_imports(path))
    for module, backend in (("triton", "triton"), ("jax", "pallas"), ("numba", "numba-cuda"), ("torch", "triton")):
        if module in top:
            return backend
    text = Path(path).read_text(errors="replace")
    for word, backend in (
        ("triton", "triton"),
        ("pallas", "pallas"),
        ("cuda.jit", "numba-cuda"),
        ("numba", "numba-cuda"),
    ):
        if word in text:  # a launcher importing another launcher: the backend its text names
            return backend
    raise InputError(
        "--backend", f"could not be told from {path} (imports none of triton, jax, numba, torch): name one"
    )


def check_backend(path, backend: str) -> None:
    """InputError when ``backend`` is named for a file that imports another backend's package and not its own (a
    Triton kernel under ``--backend pallas`` would fail on a missing GPU driver, a Pallas one under ``--backend
    triton`` launch nothing Triton counts). A file that imports none of them (a launcher importing a library or
    another launcher) is not judged."""
    from pathlib import Path

    if backend not in KIND:
        return  # require_extra names the accepted backends
    mods = [m for m in _imports(path) if m in BACKEND_OF]
    if not mods or backend in {BACKEND_OF[m] for m in mods}:
        return
    own = next(m for m, b in BACKEND_OF.items() if b == backend)
    raise InputError(f"--backend {backend}", f"counts {KIND[backend]} kernels: {Path(path).name} imports "
                     f"{', '.join(mods)} and not {own}, so its launcher's kernel is not a {KIND[backend]} kernel "
                     f"(--backend {BACKEND_OF[mods[0]]}, or auto)")  # fmt: skip


def _resolve_backend(reqs: list[dict], backend: str | None, gpu_standin: bool, shared_memory, fast: bool,
                     config=None) -> str:  # fmt: skip
    """The backend of a batch: named (and then the launcher files' own, :func:`check_backend`) or detected from the
    first file; the options it does not take refused; its extra installed."""
    if backend is None:
        backend = detect_backend(reqs[0]["path"])
    else:
        for r in reqs:
            check_backend(r["path"], backend)
    _backend_options(backend, gpu_standin, shared_memory, fast, config)
    require_extra(backend)
    return backend


def _backend_options(backend: str, gpu_standin: bool, shared_memory, fast: bool, config=None) -> None:
    """The options that apply to Triton launchers only, refused (one line) for another backend, before any work."""
    if config is not None and backend != "triton":
        raise InputError("--config", "names a config of an @triton.autotune kernel: it is taken by the triton backend "
                         f"only (not pallas or numba-cuda); this launcher runs under {backend}", config)  # fmt: skip
    if fast and backend != "triton":
        raise InputError("--fast", "is offered for Triton kernels (under the interpreter) only", backend)
    if gpu_standin and backend != "triton":
        raise InputError("--gpu-standin", "applies to Triton launchers (it stands in for Triton's active driver and "
                         f"torch.cuda's device queries); this launcher runs under {backend}")  # fmt: skip
    if shared_memory and backend != "triton":
        raise InputError("--shared-memory", "applies to Triton kernels (Triton's compiler for sm_90); this launcher "
                         f"runs under {backend}")  # fmt: skip


def count_file(
    path: str,
    launcher: str | None = None,
    backend: str | None = None,
    params: dict | None = None,
    timeout: float = 300.0,
    arrays: bool = True,
    shared_memory: int | None = None,
    config: str | None = None,
    gpu_standin: bool = False,
    strict: bool = True,
    fast: bool = False,
    must_take: tuple = (),
    keep: tuple = (),
) -> tuple[KernelCounts, dict, dict]:
    """Count a launcher file's kernels in a fresh process with the backend's mode on.

    ``path`` defines the launcher (``launcher`` or ``launch``), called with the keywords of ``params`` it declares.
    Returns (counts, numbers the launcher returned, arrays it returned as float64 NumPy when ``arrays``). Raises
    InputError (one line) for a missing file or launcher, a kernel that raises, a non-array argument or result, a
    backend not installed or not supported, or a run longer than ``timeout`` seconds. ``shared_memory=90``
    (Triton only) also compiles each kernel for sm_90 with the real compiler (no GPU needed) and records the shared
    memory it allocates per program in ``counts.shared_memory``. ``config`` names the config of an autotuned
    kernel to count (refused before any work for a backend other than Triton); with none (or ``"all"``), a kernel
    with several configs is counted once per config: ``counts.runs`` holds
    every config's (counts, numbers, arrays), each ``counts.config`` naming it. ``gpu_standin`` installs the CPU
    stand-ins for the GPU queries libraries make at import (:mod:`iosim.kernels.standin`) in the counting process
    before the launcher file is imported. Out-of-bounds or stray accesses raise :class:`AccessError` unless
    ``strict`` is False (see :func:`count`). ``fast`` (Triton) skips the values no count depends on
    (:mod:`iosim.kernels.fast`): the same counts, no arrays. ``must_take``: the keys of ``params`` the launcher
    must declare (a parameter of that name, or ``**kwargs``), or InputError naming the option before anything runs
    (``iosim kernel``: an option the launch would otherwise run without). ``keep``: arrays of the launcher's result
    returned even when ``arrays`` is False or under ``fast`` (a BlockMask's index tensors, checked in every mode).
    """
    return count_batch([(path, launcher, params or {})], backend, timeout, arrays, shared_memory, config,
                       gpu_standin, strict, fast, must_take, keep)[0]  # fmt: skip


def count_batch(
    jobs,
    backend: str | None = None,
    timeout: float = 300.0,
    arrays: bool = True,
    shared_memory: int | None = None,
    config: str | None = None,
    gpu_standin: bool = False,
    strict: bool = True,
    fast: bool = False,
    must_take: tuple = (),
    keep: tuple = (),
) -> list[tuple]:
    """:func:`count_file` for several (path, launcher, params) jobs in one fresh process (one import of the backend's
    packages): a list of (counts, numbers, arrays). ``timeout`` bounds the whole batch."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    reqs = []
    for path, launcher, params in jobs:
        p = Path(path)
        if not p.is_file():
            raise InputError("FILE", "must be an existing Python file defining a launcher", str(path))
        reqs.append({"path": str(p.resolve()), "launcher": launcher or None, "params": dict(params),
                     "shared_memory": shared_memory, "config": None if config == "all" else config,
                     "gpu_standin": gpu_standin,
                     "fast": bool(fast), "must_take": list(must_take)})  # fmt: skip
    backend = _resolve_backend(reqs, backend, gpu_standin, shared_memory, fast, config)
    with tempfile.TemporaryDirectory(prefix="iosim-kernel-") as tmp:
        req = {"jobs": reqs, "backend": backend, "arrays": bool(arrays) and not fast,  # --fast computes no outputs
               "keep": list(keep)}  # fmt: skip
        Path(tmp, "request.json").write_text(json.dumps(req))
        env = dict(os.environ, **ENV[backend])
        cmd = [sys.executable, "-m", "iosim.kernels._worker", tmp]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise InputError(
                "kernel", f"did not finish within {timeout:g} s (a program waiting on another never returns under "
                "the interpreter, which runs programs one at a time; or raise --timeout)"
            ) from None  # fmt: skip
        results = []
        for i in range(len(reqs)):
            res_file = Path(tmp, f"result_{i}.json")
            if not res_file.exists():
                tail = (proc.stderr or proc.stdout or "").strip().splitlines()
                got = tail[-1] if tail else f"exit {proc.returncode}"
                raise InputError("kernel process", "ended without a result", got)
            res = json.loads(res_file.read_text())
            if not res["ok"]:
                raise InputError(res["parameter"], res["accepted"], res.get("got"))
            runs = []
            for k, run in enumerate(res["runs"]):
                out = {}
                if (arrays or keep) and Path(tmp, f"arrays_{i}_{k}.npz").exists():
                    with np.load(Path(tmp, f"arrays_{i}_{k}.npz")) as z:
                        out = {name: z[name] for name in z.files}
                runs.append((KernelCounts.from_dict(run["counts"]), run["numbers"], out))
            counts = runs[0][0]
            counts.output = res.get("output", "")
            if len(runs) > 1:
                counts.runs = runs
            if shared_memory and res.get("launch_specs"):
                counts.shared_memory = _compile_shared(res["launch_specs"], int(shared_memory), tmp, i, timeout)
            if strict:
                for run in runs:
                    raise_access(run[0])
            results.append(runs[0])
        return results


def _compile_shared(specs: list[dict], cc: int, tmp: str, i: int, timeout: float) -> dict:
    """Triton's compiler for sm_``cc``, in a process without TRITON_INTERPRET (the interpreter's patches of
    triton.language would break it): shared memory per program of each kernel."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = Path(tmp, f"specs_{i}.json")
    path.write_text(json.dumps(specs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "iosim.kernels.triton_backend", str(path), str(cc)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as e:  # a second figure only
        return {s["kernel"]: f"not compiled: {type(e).__name__}" for s in specs}
