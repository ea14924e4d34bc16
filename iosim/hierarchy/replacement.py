"""L2 replacement policies beside LRU and OPT: random replacement and set-associative LRU, replayed over the line
stream the clock recorded (:func:`iosim.hierarchy.l2.line_stream`), as OPT is (:func:`iosim.hierarchy.simulate._opt`).

NVIDIA publishes neither the H100's nor the H200's L2 associativity, index hash or replacement policy. The hierarchy's
``lru`` is a fully associative line LRU (exact, :mod:`iosim.hierarchy.l2`); these are the alternatives to test it
against, each parameter-free given the capacity or run over a range of its one parameter (the ways):

* ``random`` (``random:SEED``): fully associative, the victim drawn uniformly from the resident lines;
* ``sets:W`` (``sets:W:xor``): W-way set-associative LRU, C / W sets (W must divide the L2's lines); a line's set is
  its line number mod the number of sets (``xor``: (line XOR line // sets) mod sets, a hashed index). W = the L2's
  lines is one set: the fully associative LRU, exactly.

**The cache.** A line cache of ``sets x ways`` slots in front of DRAM, write-back and write-validate as the
hierarchy's LRU: a read miss fetches the line; a write miss allocates it dirty without fetching it (flags of the line
stream: 0 a read, 3 a write; a reduction is a read then a write of its lines); an evicted or flushed dirty line is
written back. A set fills its free ways in order (way 0 first); when it is full the victim is the way least recently
used (``sets``) or a random one (``random``): way ``(x >> 33) mod ways`` where x steps the 64-bit linear
congruential generator x <- x 6364136223846793005 + 1442695040888963407 (mod 2^64) once per victim (Knuth's MMIX
constants), x starting at the seed. Counts are in lines, per owning array. One cache: the replay does not model the L2
partitions or sectors (the hierarchy refuses those beside these policies, as beside OPT).

**Launches and the flush.** The line stream is in launch order; at the end of each launch the counts are recorded,
and with ``flush_between`` every dirty line is written back (counted apart, per launch) and the cache emptied before
the next launch (Nsight Compute's cache control, each kernel starting from a clean L2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from iosim.base.errors import InputError

ACCEPTED = "lru, opt, random (or random:SEED), sets:W or sets:W:xor (W ways)"
LCG_A = 6364136223846793005  # Knuth's MMIX linear congruential generator
LCG_C = 1442695040888963407
MASK64 = (1 << 64) - 1
VICTIM_LRU, VICTIM_RANDOM = 0, 1
REPLAY_BYTES_PER_LINE = 17  # the int64 line stream, its flag byte, and the int64 copy the cache takes


@dataclass(frozen=True)
class Policy:
    """An L2 replacement policy: ``kind`` lru, opt, random or sets; ``ways`` (sets), ``xor`` index, ``seed``."""

    kind: str
    ways: int = 0
    xor: bool = False
    seed: int = 0

    @property
    def replayed(self) -> bool:
        """Whether it runs over the recorded line stream (random and sets), not in the clock's segment LRU."""
        return self.kind in ("random", "sets")

    def geometry(self, cap: int) -> tuple[int, int, int]:
        """(sets, ways, victim rule) of a cache of ``cap`` lines; sets:W needs W to divide cap (one line naming
        policy)."""
        if self.kind == "random":
            return 1, cap, VICTIM_RANDOM
        if self.ways > cap or cap % self.ways:
            raise InputError("policy", f"sets:W needs W to divide the L2's {cap:,} lines (W <= {cap:,})",
                             f"sets:{self.ways}")  # fmt: skip
        return cap // self.ways, self.ways, VICTIM_LRU


def parse(policy) -> Policy:
    """``policy`` (a string) as a :class:`Policy`, or one line naming the accepted ones."""
    bad = InputError("policy", f"must be one of {ACCEPTED}", policy)
    if not isinstance(policy, str):
        raise bad
    parts = policy.split(":")
    if parts[0] in ("lru", "opt") and len(parts) == 1:
        return Policy(parts[0])
    if parts[0] == "random" and len(parts) <= 2:
        if len(parts) == 2 and not parts[1].isdigit():
            raise bad
        return Policy("random", seed=int(parts[1]) if len(parts) == 2 else 0)
    if parts[0] == "sets" and len(parts) in (2, 3) and parts[1].isdigit() and int(parts[1]) >= 1:
        if len(parts) == 3 and parts[2] != "xor":
            raise bad
        return Policy("sets", ways=int(parts[1]), xor=len(parts) == 3)
    raise bad


@njit(cache=True, inline="always")
def set_of(line, n_sets, xor):
    """A line's set: its number mod the sets, or (``xor``) (line XOR line // sets) mod sets."""
    if xor:
        return (line ^ (line // n_sets)) % n_sets
    return line % n_sets


@njit(cache=True)
def _write_back_all(tag, dirty, aid_of, written, flushed):
    """Every dirty slot written back (``written`` and ``flushed`` per array, in lines), then left clean."""
    for s in range(tag.shape[0]):
        if tag[s] >= 0 and dirty[s]:
            written[aid_of[tag[s]]] += 1
            flushed[aid_of[tag[s]]] += 1
            dirty[s] = 0


@njit(cache=True)
def _victim(base, ways, victim, stamp, rng):
    """The way to replace in a full set at ``base``: the least recently used, or the LCG's draw; (slot, rng)."""
    if victim == VICTIM_RANDOM:
        rng = rng * np.uint64(LCG_A) + np.uint64(LCG_C)
        return base + np.int64((rng >> np.uint64(33)) % np.uint64(ways)), rng
    best = base
    for w in range(base + 1, base + ways):
        if stamp[w] < stamp[best]:
            best = w
    return best, rng


@njit(cache=True)
def replay(lines, flags, ends, n_sets, ways, victim, xor, seed, aid_of, n_lines, flush_between, fetched, written,
           fetched_at, written_at, flushed_at):  # fmt: skip
    """The line stream through a ``n_sets`` x ``ways`` cache (module docstring). ``ends[k]``: the stream index where
    launch k ends; ``fetched_at[k]``, ``written_at[k]``: the counts per array at its end (before its flush);
    ``flushed_at[k]``: the flush after it (``flush_between``; never after the last). Returns the slots' tags and
    dirty bits left (the final flush is the caller's)."""
    n_slots = n_sets * ways
    tag = np.full(n_slots, -1, np.int64)
    stamp = np.zeros(n_slots, np.int64)
    dirty = np.zeros(n_slots, np.int8)
    filled = np.zeros(n_sets, np.int64)
    slot_of = np.full(n_lines, -1, np.int64)
    rng = np.uint64(seed)
    k = 0
    for i in range(lines.shape[0]):
        while k < ends.shape[0] and ends[k] <= i:  # launch k's lines are all before line i
            k = _launch_end(k, ends, tag, dirty, filled, slot_of, aid_of, flush_between, fetched, written,
                            fetched_at, written_at, flushed_at)  # fmt: skip
        line, f = lines[i], flags[i]
        s = slot_of[line]
        if s < 0:
            if not f & 1:
                fetched[aid_of[line]] += 1
            q = set_of(line, n_sets, xor)
            base = q * ways
            if filled[q] < ways:
                s = base + filled[q]
                filled[q] += 1
            else:
                s, rng = _victim(base, ways, victim, stamp, rng)
                slot_of[tag[s]] = -1
                if dirty[s]:
                    written[aid_of[tag[s]]] += 1
            tag[s] = line
            slot_of[line] = s
            dirty[s] = 0
        stamp[s] = i
        if f & 2:
            dirty[s] = 1
    while k < ends.shape[0]:  # the last launch, and any with no line after it
        k = _launch_end(k, ends, tag, dirty, filled, slot_of, aid_of, flush_between, fetched, written, fetched_at,
                        written_at, flushed_at)  # fmt: skip
    return tag, dirty


@njit(cache=True)
def _launch_end(k, ends, tag, dirty, filled, slot_of, aid_of, flush_between, fetched, written, fetched_at,
                written_at, flushed_at):  # fmt: skip
    """Launch k has ended: its counts recorded; with ``flush_between`` (not after the last launch) every dirty line
    written back and the cache emptied. Returns k + 1."""
    fetched_at[k, :] = fetched
    written_at[k, :] = written
    if flush_between and k + 1 < ends.shape[0]:
        _write_back_all(tag, dirty, aid_of, written, flushed_at[k])
        for s in range(tag.shape[0]):
            if tag[s] >= 0:
                slot_of[tag[s]] = -1
                tag[s] = -1
        filled[:] = 0
    return k + 1


def launch_ends(rec_inst, rec_req, n_rec, launch_ptr, stream_args) -> np.ndarray:
    """Where each launch's lines end in the line stream: the records are in launch order (launches run one after
    another), each launch's records counted into lines by :func:`iosim.hierarchy.l2.line_stream`."""
    from iosim.hierarchy import l2

    launch = np.searchsorted(launch_ptr, rec_inst[:n_rec], side="right") - 1
    assert np.all(np.diff(launch) >= 0), "the L2's records are not in launch order"
    rec_end = np.searchsorted(launch, np.arange(len(launch_ptr) - 1), side="right")
    empty_l, empty_f = np.zeros(0, np.int64), np.zeros(0, np.int8)
    ends, lo, total = [], 0, 0
    for hi in rec_end.tolist():
        if hi > lo:
            total += l2.line_stream(rec_inst[lo:hi], rec_req[lo:hi], hi - lo, *stream_args, empty_l, empty_f)
        ends.append(total)
        lo = hi
    return np.array(ends, np.int64)
