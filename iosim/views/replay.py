"""Replay a schedule's computation through a hardware-managed cache: LRU, FIFO and Belady's OPT.

The explicit two-level model lets the *program* decide what fast memory holds. A CPU or GPU cache decides by
itself, with a replacement policy. To compare the two, :func:`replay` takes one traced run of an algorithm, turns
it into the **operand-access trace** (every word each on-chip computation touches, in the order it touches them),
and replays that through a fully associative cache of ``cache_words`` words (M by default) with lines of ``line``
words (:mod:`iosim.views.cache_sim`).

Where the words are (the address map)
-------------------------------------
* Every slow array the schedule loads or stores (Q, K, V, O, L, dO, dQ, ..., S and P of standard attention) has
  its own address range, row-major, aligned to a line: the computation reads and writes it *in place*, through the
  cache. Over a problem the ranges follow its one address map (:meth:`iosim.spec.problem.Problem.storage`): MLA's V is
  the latent's first d_v columns, so a naive read of V touches K's lines and its misses are reported under K.
  A **loaded** tile is the slow array's own region (flash1's O_i, l_i, m_i are read, updated and left for the
  cache to write back). An **allocated tile that is later stored** (flash2's O_i and L_i, a product's
  accumulator C, dK_j, dV_j) is its destination region: the computation accumulates in the output. A loaded tile
  stored to *another* region (standard attention's S rows stored as P, dP rows stored as dS) reads its source and
  writes its destination.
* An **allocated tile that is never stored** (S_ij and m_i of FlashAttention, dP_ij and D_i of the flash
  backward) is *scratch*: it lives at addresses of its own after the slow arrays, one region per array name and
  per tile of that name resident at the same time, reused by the next tile of that name (tile row r, column c at
  ``base + r * nc + c``). Its traffic is reported as ``NAME (on chip)``.
* Loads, stores, allocs and frees themselves touch nothing: the cache moves the data. Zeroing an on-chip tile
  and scaling by a constant are register work (no access); the first step of a product into a fresh
  accumulator overwrites it instead of reading it. An allocated tile stored with no computation on it (a masked
  block's zero dK_j, dV_j; a split or row block the mask empties: O = 0) is written then, its zeros.

When the computation happens (derived from the event trace, not a second copy of the loop nests)
---------------------------------------------------------------------------------------------
The drivers compute at known points of their event sequence; :data:`RULES` names them per algorithm and pass,
and each computation is one of the two op kinds of :mod:`iosim.views.cache_sim` (a product, order row r, column c,
inner k; or a row sweep whose segments are listed per rule). For example, in flash2's forward, at the free of
S_ij: S_ij = Q_i K_j^T (reads Q_i[r, k], K_j[c, k], writes S[r, c]); then per row the max of S, m_i, P~ = exp(S -
m_new) in place, l_i, m_i and O_i *= alpha; then O_i += P~ V_j; at the store of O_i, O_i /= l_i and L_i = m_i +
log l_i. A *tiled product* (standard attention, square tiling) happens at the free of its left operand's tile, when
an accumulator of the product's output array is resident.

Counts
------
Per array: words **fetched** (L per miss), words **written** (L per dirty line evicted or left dirty at the end
of a slow array, plus one per write miss without write-allocate); dirty scratch left at the end is dropped (dead,
as shared memory is at the end of a kernel). Beside them the explicit schedule's reads and writes of the same
pass and the ratio of the totals.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from iosim.base.errors import InputError
from iosim.memory_model.core import ALLOC, FREE, LOAD, STORE
from iosim.runner import estimate
from iosim.views import cache_sim as cs

POLICIES = cs.POLICIES
# OPT keeps one int32 line, one flag byte and one int32 next use per access: 9 bytes.
OPT_BYTES_PER_ACCESS = 9
# about 5 minutes of LRU at 5 ns an access (iosim.runner.estimate); OPT also needs int32 indices (< 2^31)
MAX_ACCESSES = 60_000_000_000
BASE_ALGORITHMS = ("standard", "flash1", "flash2", "square-tiling")


@dataclass
class _Tile:
    name: str
    r0: int
    nr: int
    c0: int
    nc: int
    src: tuple[int, int]  # (base, row stride): where the tile's input values are read
    dst: tuple[int, int]  # where the computation writes (and reads back what it wrote)
    stored: bool
    scratch: int = -1  # the scratch instance (-1: a slow region)
    written: bool = False  # an accumulator already holds a partial product
    loaded: bool = False  # read from slow memory (not allocated on chip)


class _Deriver:
    """Walks the event trace, keeps the resident tiles with their addresses, and collects the compute ops."""

    def __init__(self, trace, L: int, problem=None) -> None:  # noqa: N803
        self.names, self.shapes, self.L = trace.names, trace.shapes, L
        # The problem's one address map (iosim.spec.problem.Problem.storage): an array stored at another's addresses
        # (MLA's V, the latent's first d_v columns of K) has no range of its own; its words are K's, at K's stride.
        self.alias: dict[str, str] = {}
        if problem is not None:
            for name in self.names:
                owner = problem.storage(name)[0]
                if owner != name and owner in self.names:
                    self.alias[name] = owner
        ev = trace.events
        self.events = ev
        self.stored_to: dict[int, tuple[int, int, int]] = {}
        slow = set()
        for row in ev[(ev[:, 0] == STORE) | (ev[:, 0] == LOAD)]:
            slow.add(int(row[1]))
            if row[0] == STORE:
                self.stored_to[int(row[8])] = (int(row[1]), int(row[2]), int(row[4]))
        # Scratch: allocated tiles never stored. One region per name and per tile of that name live at once.
        live: dict[str, int] = {}
        self.scratch_words: dict[str, int] = {}
        self.scratch_count: dict[str, int] = {}
        alloc_of: dict[int, str] = {}
        for row in ev[(ev[:, 0] == ALLOC) | (ev[:, 0] == FREE)]:
            h = int(row[8])
            if row[0] == ALLOC and h not in self.stored_to:
                name = self.names[int(row[1])]
                alloc_of[h] = name
                live[name] = live.get(name, 0) + 1
                self.scratch_count[name] = max(self.scratch_count.get(name, 0), live[name])
                self.scratch_words[name] = max(self.scratch_words.get(name, 0), int(row[6]))
            elif row[0] == FREE and h in alloc_of:
                live[alloc_of.pop(h)] -= 1
        # The address map: slow arrays, then the scratch regions, every one aligned to a line.
        self.report: list[str] = []  # report rows, in address order
        bases: list[int] = []
        self.slow_base: dict[str, int] = {}
        top = 0
        for aid, name in enumerate(self.names):
            if aid in slow and name not in self.alias:
                r, c = self.shapes[name]
                self.slow_base[name] = top
                self.report.append(name)
                bases.append(top)
                top += -(-(r * c) // L) * L
        self.scratch_base: dict[str, list[int]] = {}
        self.n_slow = len(self.report)
        for name, count in self.scratch_count.items():
            self.report.append(f"{name} (on chip)")
            bases.append(top)
            size = -(-self.scratch_words[name] // L) * L
            self.scratch_base[name] = [top + i * size for i in range(count)]
            top += count * size
        self.n_lines = max(top // L, 1)
        self.aid_of = np.zeros(self.n_lines, np.int32)
        for i, b in enumerate(bases):
            self.aid_of[b // L :] = i
        self.ops: list[list[int]] = []
        self.live: dict[int, _Tile] = {}
        self.by_name: dict[str, list[int]] = {}
        self.free_scratch: dict[str, list[int]] = {n: list(range(c)) for n, c in self.scratch_count.items()}

    # --- tiles -------------------------------------------------------------------------------------------------
    def _region(self, aid: int, r0: int, c0: int) -> tuple[int, int]:
        name = self.names[aid]
        name = self.alias.get(name, name)  # MLA's V: K's words, at K's row stride
        cols = self.shapes[name][1]
        return self.slow_base[name] + r0 * cols + c0, cols

    def _open(self, op: int, aid: int, r0: int, nr: int, c0: int, nc: int, h: int) -> _Tile:
        name = self.names[aid]
        dest = self.stored_to.get(h)
        if op == LOAD:
            src = self._region(aid, r0, c0)
            dst = src if dest is None else self._region(*dest)
            t = _Tile(name, r0, nr, c0, nc, src, dst, dest is not None, loaded=True)
        elif dest is not None:
            dst = self._region(*dest)
            t = _Tile(name, r0, nr, c0, nc, dst, dst, True)
        else:
            k = self.free_scratch[name].pop(0)
            base = (self.scratch_base[name][k], nc)
            t = _Tile(name, r0, nr, c0, nc, base, base, False, k)
        self.live[h] = t
        self.by_name.setdefault(name, []).append(h)
        return t

    def _close(self, h: int) -> None:
        t = self.live.pop(h)
        self.by_name[t.name].remove(h)
        if t.scratch >= 0:
            self.free_scratch[t.name].append(t.scratch)
            self.free_scratch[t.name].sort()

    def cur(self, name: str) -> _Tile | None:
        """The most recently opened resident tile of array ``name`` (None if none is resident)."""
        hs = self.by_name.get(name)
        return self.live[hs[-1]] if hs else None

    # --- ops -----------------------------------------------------------------------------------------------------
    def mm(self, C: _Tile, A: _Tile, B: _Tile, aT: bool = False, bT: bool = False, acc: bool | None = None) -> None:  # noqa: N803
        """C (+)= op(A) op(B) (a MATMUL op); ``acc`` defaults to whether C already holds a partial product."""
        acc = C.written if acc is None else acc
        C.written = True
        ti, tj = C.nr, C.nc
        tk = A.nr if aT else A.nc
        (ab, a0), (bb, b0), (cb, c0) = A.src, B.src, C.dst
        a = (ab, 1, a0) if aT else (ab, a0, 1)
        b = (bb, 1, b0) if bT else (bb, b0, 1)
        row = [cs.MATMUL, ti, tj, tk, int(acc), cb, c0, 1, *a, *b]
        self.ops.append(row + [0] * (cs.OP_WIDTH - len(row)))

    def seg(self, mode: int, t: _Tile, row: int = 0, ncols: int | None = None) -> list[int]:
        """A row-sweep segment over tile ``t`` from its row ``row`` (R reads t's input, W/RW its output, RD both)."""
        (sb, s0), (db, d0) = t.src, t.dst
        if mode != cs.R:
            t.written = True
        return [mode, t.nc if ncols is None else ncols, sb + row * s0, s0, 1, db + row * d0, d0, 1]

    def rows(self, n: int, *segs: list[int]) -> None:
        """For each of n rows, the segments in order (a ROWS op)."""
        row = [cs.ROWS, n, len(segs)]
        for s in segs:
            row += s
        self.ops.append(row + [0] * (cs.OP_WIDTH - len(row)))

    def R(self, t, row=0):  # noqa: N802
        return self.seg(cs.R, t, row)

    def W(self, t, row=0):  # noqa: N802
        return self.seg(cs.W, t, row)

    def RW(self, t, row=0):  # noqa: N802
        return self.seg(cs.RW, t, row)

    def RD(self, t, row=0):  # noqa: N802
        return self.seg(cs.RD, t, row)

    def derive(self, rule, products=()) -> np.ndarray:
        """Walk the events; call ``rule(self, op, tile, event_array_name)`` at each; products fire at the free of
        their left operand. Returns the ops as an int64 array."""
        for row in self.events:
            op, aid, r0, nr, c0, nc, h = (int(x) for x in row[[0, 1, 2, 3, 4, 5, 8]])
            if op == LOAD or op == ALLOC:
                t = self._open(op, aid, r0, nr, c0, nc, h)
                rule(self, op, t, self.names[aid])
            elif op == STORE:
                t = self.live[h]
                rule(self, op, t, self.names[aid])
                if not t.loaded and not t.written:  # an on-chip tile no computation wrote: its zeros are written
                    self.rows(t.nr, self.W(t))
            elif op == FREE:
                t = self.live[h]
                for C, A, aT, B, bT, prologue in products:
                    if t.name == A and self.cur(C) is not None and self.cur(B) is not None:
                        if prologue is not None and self.cur(prologue) is not None:
                            self.rows(self.cur(prologue).nr, self.R(self.cur(prologue)))
                        self.mm(self.cur(C), t, self.cur(B), aT, bT)
                        break
                rule(self, op, t, self.names[aid])
                self._close(h)
        if not self.ops:
            return np.zeros((0, cs.OP_WIDTH), np.int64)
        return np.array(self.ops, np.int64)


# ---------------------------------------------------------------------------------------------------------------
# Where each driver computes (one rule per algorithm and pass)
# ---------------------------------------------------------------------------------------------------------------


def _either(x: _Deriver, *names: str):
    """The resident tile of the first of ``names`` that has one: a problem's schedules write some arrays under a
    second name (split-KV's partial O and its logsumexp: Opart, Lpart; per-head GQA's dK, dV partials)."""
    for n in names:
        t = x.cur(n)
        if t is not None:
            return t
    return None


def _values(x: _Deriver, K: _Tile, like: _Tile) -> _Tile:  # noqa: N803
    """V_j: the V tile, or under MLA's shared latent the first d_v columns of the resident K_j (``like`` is a tile
    d_v wide, O_i), read in place."""
    V = x.cur("V")  # noqa: N806
    return V if V is not None else replace(K, nc=like.nc)


def _problem_reads(x: _Deriver, op, t) -> None:
    """A problem's own reads: a page-table entry (one word, read where it is loaded) and, in split-KV's combine
    step, L_i = logsumexp over the s partial logsumexps (a max sweep and a sum sweep of the Lpart tile) and each
    partial O tile added into O_i with its weight exp(lse_k - L_i)."""
    if op == LOAD and t.name == "page_table":
        x.rows(t.nr, x.R(t))
    elif op == ALLOC and t.name == "L" and x.cur("Lpart") is not None and x.cur("m") is None:
        lse = x.cur("Lpart")
        x.rows(t.nr, x.R(lse), x.R(lse), x.W(t))
    elif op == FREE and t.name == "Opart" and x.cur("m") is None and x.cur("O") is not None:
        O, lse, L = x.cur("O"), x.cur("Lpart"), x.cur("L")  # noqa: N806
        k = t.r0 // (x.shapes["Opart"][0] // lse.nc)  # split k's partials are rows [k R_tot, (k + 1) R_tot)
        w = [cs.R, 1, lse.src[0] + k, lse.src[1], 1, lse.dst[0] + k, lse.dst[1], 1]  # lse[r, k]
        x.rows(t.nr, w, x.R(L), x.R(t), x.RW(O) if O.written else x.W(O))


def _group_sum(x: _Deriver, op, t) -> None:
    """Per-head GQA's group sum: each dKpart (dVpart) tile loaded is added into the resident dK (dV) accumulator."""
    if op == FREE and t.name in ("dKpart", "dVpart"):
        acc = x.cur(t.name[:2])
        if acc is not None:
            x.rows(t.nr, x.R(t), x.RW(acc) if acc.written else x.W(acc))


def _flash2_forward(x: _Deriver, op, t, _name) -> None:
    _problem_reads(x, op, t)
    if op == FREE and t.name == "S":
        Q, K, m_i = x.cur("Q"), x.cur("K"), x.cur("m")  # noqa: N806
        O, l_i = _either(x, "O", "Opart"), _either(x, "L", "Lpart")  # noqa: N806
        x.mm(t, Q, K, bT=True, acc=False)  # S_ij = Q_i K_j^T
        # per row: max of S, m_i; P~ = exp(S - m_new) in place; l_i; m_i; O_i *= alpha
        x.rows(t.nr, x.R(t), x.R(m_i), x.RW(t), x.RW(l_i), x.W(m_i), x.RW(O))
        x.mm(O, t, _values(x, K, O), acc=True)  # O_i += P~ V_j
    elif op == STORE and t.name in ("O", "Opart") and x.cur("m") is not None:
        l_i, m_i = _either(x, "L", "Lpart"), x.cur("m")
        x.rows(t.nr, x.R(l_i), x.RW(t), x.R(m_i), x.RW(l_i))  # O_i /= l_i; L_i = m_i + log l_i


def _flash1_forward(x: _Deriver, op, t, _name) -> None:
    _problem_reads(x, op, t)
    if op == STORE and t.name == "O":
        Q, K, S, l_i, m_i = (x.cur(n) for n in ("Q", "K", "S", "l", "m"))  # noqa: N806
        x.mm(S, Q, K, bT=True, acc=False)  # step 9: S_ij = Q_i K_j^T
        x.rows(S.nr, x.R(S), x.RW(S), x.R(m_i), x.R(l_i), x.RW(t))  # steps 10-11: m~, P~, l~; O_i *= a
        x.mm(t, S, _values(x, K, t), acc=True)  # O_i += b P~ V_j
        x.rows(S.nr, x.RW(t), x.W(m_i), x.W(l_i))  # O_i /= l_new; steps 12-13: m_i, l_i


def _softmax_rows(x: _Deriver, op, t, name, N) -> None:  # noqa: N803
    """Standard attention's softmax: S rows loaded, P written (one pass per row block, or two sweeps of chunks)."""
    if op == STORE and t.name == "S":
        if t.nc == N:  # whole rows: max, P = exp(S - max) written to P, P /= sum
            x.rows(t.nr, x.R(t), x.RD(t), x.RW(t))
        else:  # the second sweep of a chunked row: P = exp(S - m) / l
            x.rows(t.nr, x.RD(t))
    elif op == FREE and t.name == "S" and not t.stored and t.nc < N:  # the first sweep: running max and sum
        x.rows(t.nr, x.R(t), x.R(t))


def _softmax_backward_rows(x: _Deriver, op, t, name, N) -> None:  # noqa: N803
    """Standard attention's step 3: D_i = P_i . dP_i, dS = P o (dP - D_i), written to dS."""
    if op == STORE and t.name == "dP" and name == "dS":
        P = x.cur("P")
        if t.nc == N:
            x.rows(t.nr, x.R(P), x.R(t), x.R(P), x.RD(t))
        else:
            x.rows(t.nr, x.R(P), x.RD(t))
    elif op == FREE and t.name == "dP" and not t.stored and x.cur("P") is not None:
        x.rows(t.nr, x.R(x.cur("P")), x.R(t))


def _square_forward(x: _Deriver, op, t, _name) -> None:
    if op == STORE and t.name == "S":  # the phase-1 epilogue: scale and mask, row max, sum, m_i, l_i
        m_i, l_i = x.cur("m"), x.cur("L")
        x.rows(t.nr, x.RW(t), x.R(t), x.R(t), x.RW(m_i), x.RW(l_i))
    elif op == STORE and t.name == "L":
        x.rows(t.nr, x.R(x.cur("m")), x.RW(t))  # L_i = m_i + log l_i


def _flash_backward_tile(x: _Deriver, S, dP, Q, K, V, dO, dQ, dK, dV, D) -> None:  # noqa: N803
    """Steps 17-23 of Algorithm 4 (FlashAttention-2: 12-16) on chip."""
    x.mm(dV, S, dO, aT=True)  # dV~_j += P_ij^T dO_i
    x.mm(dP, dO, V, bT=True, acc=False)  # dP_ij = dO_i V_j^T
    x.rows(S.nr, x.R(D), x.R(S), x.RW(dP))  # dS_ij = P_ij o (dP_ij - D_i) in place of dP_ij
    x.mm(dQ, dP, K, acc=True)  # dQ_i += tau dS_ij K_j
    x.mm(dK, dP, Q, aT=True)  # dK~_j += tau dS_ij^T Q_i


def _flash1_backward(x: _Deriver, op, t, _name) -> None:
    _group_sum(x, op, t)
    if op == STORE and t.name == "dQ":
        Q, K, V, O, dO, l_i, m_i, S, dP, D = (x.cur(n) for n in ("Q", "K", "V", "O", "dO", "l", "m", "S", "dP", "D"))  # noqa: N806
        dK, dV = _either(x, "dK", "dKpart"), _either(x, "dV", "dVpart")  # noqa: N806
        x.mm(S, Q, K, bT=True, acc=False)  # steps 12-13
        x.rows(S.nr, x.R(m_i), x.R(l_i), x.RW(S))  # step 14: P_ij = diag(l_i)^-1 exp(S_ij - m_i)
        x.rows(S.nr, x.R(dO), x.R(O), x.W(D))  # step 20: D_i = rowsum(dO_i o O_i)
        _flash_backward_tile(x, S, dP, Q, K, V, dO, t, dK, dV, D)


def _flash2_backward(x: _Deriver, op, t, _name) -> None:
    _group_sum(x, op, t)
    if op == STORE and t.name == "D":
        x.rows(t.nr, x.R(x.cur("dO")), x.R(x.cur("O")), x.W(t))  # step 4: D_i = rowsum(dO_i o O_i)
    elif op == STORE and t.name == "dQ":
        Q, K, V, dO, L_i, S, dP, D = (x.cur(n) for n in ("Q", "K", "V", "dO", "L", "S", "dP", "D"))  # noqa: N806
        dK, dV = _either(x, "dK", "dKpart"), _either(x, "dV", "dVpart")  # noqa: N806
        x.mm(S, Q, K, bT=True, acc=False)  # step 10
        x.rows(S.nr, x.R(L_i), x.RW(S))  # step 11: P_ij = exp(S_ij - L_i)
        _flash_backward_tile(x, S, dP, Q, K, V, dO, t, dK, dV, D)


def _square_backward(x: _Deriver, op, t, _name) -> None:
    if op == FREE and t.name == "dO" and x.cur("O") is not None and x.cur("dP") is None:
        x.rows(t.nr, x.R(t), x.R(x.cur("O")), x.RW(x.cur("D")))  # step 1: D_i += rowsum(dO_il o O_il)
    elif op == FREE and t.name == "S" and x.cur("dP") is not None:  # step 3, one row of S_ij
        dP = x.cur("dP")
        r = t.r0 - dP.r0
        x.rows(1, x.R(t), x.R(x.cur("L"), r), x.R(x.cur("D"), r), x.RW(dP, r))


# (C, A, A transposed, B, B transposed, prologue vector read per product or None): C (+)= op(A) op(B) at the free
# of A's tile while C and B are resident.
_STANDARD_FWD = (("S", "Q", False, "K", True, None), ("O", "P", False, "V", False, None))
_STANDARD_BWD = (
    ("dV", "P", True, "dO", False, None),
    ("dP", "dO", False, "V", True, None),
    ("dQ", "dS", False, "K", False, None),
    ("dK", "dS", True, "Q", False, None),
)
_SQUARE_FWD = (("S", "Q", False, "K", True, None), ("O", "S", False, "V", False, "L"))
_SQUARE_BWD = (
    ("dP", "dO", False, "V", True, None),
    ("dV", "S", True, "dO", False, "L"),
    ("dQ", "dS", False, "K", False, None),
    ("dK", "dS", True, "Q", False, None),
)


def _rule(algorithm: str, backward: bool, N: int):  # noqa: N803
    """(rule, products) for an algorithm and pass."""
    if algorithm == "standard":
        if backward:
            return (lambda x, op, t, n: _softmax_backward_rows(x, op, t, n, N)), _STANDARD_BWD
        return (lambda x, op, t, n: _softmax_rows(x, op, t, n, N)), _STANDARD_FWD
    if algorithm == "square-tiling":
        return (_square_backward, _SQUARE_BWD) if backward else (_square_forward, _SQUARE_FWD)
    if algorithm == "flash1":
        return (_flash1_backward if backward else _flash1_forward), ()
    return (_flash2_backward if backward else _flash2_forward), ()


def operand_ops(
    trace, algorithm: str, backward: bool, N: int, line: int = 1, problem=None
) -> tuple[np.ndarray, _Deriver]:  # noqa: N803, E501
    """The compute ops of a traced pass and its address map (see the module docstring; over a ``problem``, its
    :meth:`iosim.spec.problem.Problem.storage` map)."""
    x = _Deriver(trace, line, problem)
    rule, products = _rule(algorithm, backward, N)
    return x.derive(rule, products), x


# ---------------------------------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class PolicyResult:
    """What one policy moved, per report row (slow arrays, then scratch)."""

    policy: str
    fetched: dict[str, int]
    written: dict[str, int]
    accesses: int
    seconds: float

    @property
    def total(self) -> int:
        return sum(self.fetched.values()) + sum(self.written.values())


@dataclass
class ReplayResult:
    """The explicit schedule's counts beside each policy's, per array."""

    algorithm: str
    N: int
    d: int
    M: int
    cache_words: int
    line: int
    write_allocate: bool
    backward: bool
    causal: bool
    accesses: int
    explicit: dict[str, tuple[int, int]]  # array -> (reads, writes) of the explicit schedule
    policies: dict[str, PolicyResult] = field(default_factory=dict)
    rows: list[str] = field(default_factory=list)
    problem: object = None  # the iosim.Problem replayed (None: one head, N and d)

    @property
    def explicit_total(self) -> int:
        return sum(r + w for r, w in self.explicit.values())

    def ratio(self, policy: str) -> float:
        """The policy's total words moved over the explicit schedule's."""
        return self.policies[policy].total / self.explicit_total

    def table(self, fmt: str = "simple") -> str:
        from tabulate import tabulate

        headers = ["array", "explicit reads", "explicit writes"]
        for p in self.policies:
            headers += [f"{p} fetched", f"{p} written", f"{p} / explicit"]
        body = []
        for name in self.rows:
            er, ew = self.explicit.get(name, (0, 0))
            row = [name, f"{er:,}", f"{ew:,}"]
            for p in self.policies.values():
                f, w = p.fetched.get(name, 0), p.written.get(name, 0)
                row += [f"{f:,}", f"{w:,}", f"{(f + w) / (er + ew):.2f}" if er + ew else "-"]
            body.append(row)
        tot = [
            "total",
            f"{sum(r for r, _ in self.explicit.values()):,}",
            f"{sum(w for _, w in self.explicit.values()):,}",
        ]
        for name, p in self.policies.items():
            tot += [f"{sum(p.fetched.values()):,}", f"{sum(p.written.values()):,}", f"{self.ratio(name):.2f}"]
        body.append(tot)
        return tabulate(body, headers=headers, tablefmt=fmt, disable_numparse=True)

    def as_dict(self) -> dict:
        from iosim.base.version import __version__

        return {
            "iosim_version": __version__,
            "algorithm": self.algorithm,
            "N": self.N,
            "d": self.d,
            "M": self.M,
            "pass": "backward" if self.backward else "forward",
            "causal": self.causal,
            **({"problem": self.problem.as_dict()} if self.problem is not None else {}),
            "cache_words": self.cache_words,
            "line": self.line,
            "write_allocate": self.write_allocate,
            "accesses": self.accesses,
            "explicit": {k: {"reads": r, "writes": w} for k, (r, w) in self.explicit.items()},
            "explicit_total": self.explicit_total,
            "policies": {
                name: {
                    "fetched": p.fetched,
                    "written": p.written,
                    "total": p.total,
                    "ratio": self.ratio(name),
                    "seconds": p.seconds,
                }
                for name, p in self.policies.items()
            },
        }


def parse_policies(policy) -> tuple[str, ...]:
    """'lru,opt' or a sequence of names -> the tuple of known policy names (InputError naming the bad one)."""
    listed = isinstance(policy, (list, tuple)) and all(isinstance(n, str) for n in policy)
    if not isinstance(policy, str) and not listed:
        raise InputError("policy", f"must be one or more of {', '.join(POLICIES)} (comma-separated)", policy)
    names = policy.split(",") if isinstance(policy, str) else list(policy)
    names = [str(n).strip().lower() for n in names if str(n).strip()]
    bad = [n for n in names if n not in POLICIES]
    if bad or not names:
        raise InputError("policy", f"must be one or more of {', '.join(POLICIES)} (comma-separated)", policy)
    return tuple(dict.fromkeys(names))


def replay_ops(
    ops: np.ndarray,
    x: _Deriver,
    policy: str,
    cache_words: int,
    line: int,
    write_allocate: bool,
    opt_limit_bytes: int | None = None,
) -> PolicyResult:
    """Replay compute ops through one policy's cache (see :mod:`iosim.views.cache_sim`)."""
    capacity = cache_words // line
    accesses = cs.access_count(ops)
    n_rows = len(x.report)
    t0 = time.perf_counter()
    if policy == "opt":
        upper = cs.access_count(ops)
        need = upper * OPT_BYTES_PER_ACCESS + 4 * x.n_lines
        limit = opt_limit_bytes if opt_limit_bytes is not None else estimate.available_bytes() // 2
        if need > limit or upper >= 1 << 31:
            raise InputError(
                "policy opt",
                f"needs the whole operand trace in memory: {upper:,} accesses, about {need / 2**30:.1f} GiB, over "
                f"the limit of {limit / 2**30:.1f} GiB; use a smaller N or --policy lru,fifo (they stream)",
                "opt",
            )
        state = cs.new_state(cs.EMIT, 1, write_allocate, x.n_lines, line, n_rows)
        lines, flags = np.empty(upper, np.int32), np.empty(upper, np.int8)
        cs.run_ops(ops, *state, x.aid_of, lines, flags)
        n = int(state[0][cs._NOUT])
        lines, flags = lines[:n], flags[:n]
        nxt = cs.next_use(lines, x.n_lines)
        fetched, written = np.zeros(n_rows, np.int64), np.zeros(n_rows, np.int64)
        left = cs.opt(lines, flags, nxt, capacity, write_allocate, line, x.aid_of, x.n_lines, fetched, written)
    else:
        mode = cs.LRU if policy == "lru" else cs.FIFO
        state = cs.new_state(mode, capacity, write_allocate, x.n_lines, line, n_rows)
        empty_l, empty_f = np.empty(0, np.int32), np.empty(0, np.int8)
        cs.run_ops(ops, *state, x.aid_of, empty_l, empty_f)
        h, _slot_of, line_of, dirty, _p, _n, fetched, written = state
        used = int(h[cs._USED])
        left = line_of[:used][dirty[:used] != 0]
    # dirty lines of slow arrays left at the end are written back; dead scratch is dropped
    for aid in x.aid_of[left]:
        if aid < x.n_slow:
            written[aid] += line
    seconds = time.perf_counter() - t0
    return PolicyResult(
        policy,
        {x.report[i]: int(fetched[i]) for i in range(n_rows)},
        {x.report[i]: int(written[i]) for i in range(n_rows)},
        accesses,
        seconds,
    )


PROBLEM_ALGORITHMS = ("flash1", "flash2")


def _problem_scope(algorithm, problem) -> None:
    """What a replay over a problem covers: flash1 and flash2, forward and backward, with GQA per-head or packed, any
    N_q, N_k, d_qk, d_v, any mask, split-KV (the partials and the combine step), paged KV (the page-table words
    read) and MLA's latent, shared (V read from the resident K tile) or naive."""
    from iosim.spec.problem import Problem

    if not isinstance(problem, Problem):
        raise InputError("problem", "must be an iosim.Problem", type(problem).__name__)
    if algorithm not in PROBLEM_ALGORITHMS:
        raise InputError(
            "algorithm",
            f"replay over a problem knows the compute steps of {' and '.join(PROBLEM_ALGORITHMS)} (standard attention "
            "and square tiling: one head, N and d)",
            algorithm,
        )


def replay(
    algorithm,
    schedule=None,
    M: int | None = None,  # noqa: N803
    *,
    N: int | None = None,  # noqa: N803
    d: int | None = None,
    policy="lru,opt,fifo",
    line: int = 1,
    write_allocate: bool = True,
    cache_words: int | None = None,
    backward: bool = False,
    causal: bool = False,
    tiling: str = "fit",
    opt_limit_bytes: int | None = None,
    **run_options,
) -> ReplayResult:
    """Replay ``algorithm``'s computation (forward, or the backward pass) through a fully associative cache of
    ``cache_words`` words (default M) with lines of ``line`` words, under each policy of ``policy`` (``"lru,opt"``
    or a list; from lru, opt, fifo). The schedule itself runs count-only with a trace, at fast memory M; other
    keyword options go to :func:`iosim.run`, ``problem=`` (an :class:`iosim.Problem`, in place of N and d) with
    ``gqa=`` among them (:func:`_problem_scope` says what a problem's replay covers). Returns a
    :class:`ReplayResult` (per-array words fetched and written per policy, beside the explicit schedule's counts).
    ``replay(problem, schedule, M)`` replays a :class:`iosim.Schedule` over an :class:`iosim.Problem`, as
    :func:`iosim.run` runs it.

    Steps: check the options (:func:`_check_options`), the shape and its least work (:func:`_shape`) and the cache
    (:func:`_check_cache`); refuse a replay too long up front (:func:`_check_work`); run the schedule count-only
    with a trace; derive its compute ops (:func:`operand_ops`); check their exact count; replay them through each
    policy (:func:`_replayed`)."""
    from iosim.runner import api
    from iosim.spec.problem import Problem
    from iosim.spec.schedule import from_objects

    if isinstance(algorithm, Problem):
        spec, options = from_objects(algorithm, schedule, dict(run_options, N=N, d=d, causal=causal))
        return replay(spec.algorithm, M=M, policy=policy, line=line, write_allocate=write_allocate,
                      cache_words=cache_words, opt_limit_bytes=opt_limit_bytes, **options)  # fmt: skip
    if schedule is not None:
        raise InputError("schedule", "is given with a problem as the first argument: replay(problem, schedule, M)")
    if M is None:
        raise InputError("M", "must be given: the fast memory's size in words")

    problem = run_options.pop("problem", None)
    policies, allow_long = _check_options(algorithm, policy, write_allocate, opt_limit_bytes, run_options)
    N, d, work = _shape(algorithm, problem, N, d, run_options)  # noqa: N806
    cache = _check_cache(M, cache_words, line, write_allocate, policies, opt_limit_bytes)
    where = ("problem", str(problem)) if problem is not None else ("N", N)
    limit = _Limit(allow_long, *where, policies)
    if work is not None:
        _check_work(work, limit)
    shape = dict(problem=problem) if problem is not None else dict(N=N, d=d, causal=causal)
    run = dict(M=M, backward=backward, tiling=tiling, count_only=True, trace=True, reference=False)
    r = api.run_keywords(algorithm, **shape, **run, **run_options)
    ops, x = operand_ops(r.trace, algorithm, backward, N, cache.line, problem)
    accesses = cs.access_count(ops)
    _check_accesses(accesses, limit)
    return _replayed(algorithm, r, M, cache, backward, accesses, (ops, x), problem)


@dataclass(frozen=True)
class _Cache:
    """The replayed cache, checked: ``words`` its size and ``line`` its line (words), ``write_allocate``, the
    ``policies`` to replay and OPT's memory limit ``opt_limit_bytes`` (None: half the free memory)."""

    words: int
    line: int
    write_allocate: bool
    policies: tuple[str, ...]
    opt_limit_bytes: int | None


@dataclass(frozen=True)
class _Limit:
    """How a replay's length is checked (:mod:`iosim.runner.estimate`): ``allow_long`` past a minute, the ``parameter``
    and ``value`` an InputError names (N, or the problem), the ``policies`` whose time is estimated."""

    allow_long: bool
    parameter: str
    value: object
    policies: tuple[str, ...]


def _check_options(algorithm, policy, write_allocate, opt_limit_bytes, run_options) -> tuple[tuple[str, ...], bool]:
    """The policies (:func:`parse_policies`), write_allocate, opt_limit_bytes, allow_long and the algorithm, checked
    in that order: (the policies, allow_long)."""
    policies = parse_policies(policy)
    if not isinstance(write_allocate, (bool, np.bool_)):
        raise InputError("write_allocate", "must be True or False", write_allocate)
    if opt_limit_bytes is not None and (
        isinstance(opt_limit_bytes, bool) or not isinstance(opt_limit_bytes, (int, np.integer)) or opt_limit_bytes <= 0
    ):
        raise InputError("opt_limit_bytes", "must be None or a positive integer (bytes)", opt_limit_bytes)
    allow_long = run_options.get("allow_long", False)
    if not isinstance(allow_long, bool):
        raise InputError("allow_long", "must be True or False", allow_long)
    if not isinstance(algorithm, str) or algorithm not in BASE_ALGORITHMS:
        raise InputError("algorithm", f"replay knows the compute steps of {', '.join(BASE_ALGORITHMS)}", algorithm)
    return policies, allow_long


def _shape(algorithm, problem, N, d, run_options):  # noqa: N803
    """(N, d, the least number of operand accesses or None when it is not known before the run): one head's N and
    d (N^2 d), or a problem's N_q and d_qk (B H_q N_q N_k d_qk: every head forms its N_q x N_k scores; under a mask
    fewer, counted after the run)."""
    if problem is not None:
        _problem_scope(algorithm, problem)
        if N is not None or d is not None:
            raise InputError("N, d", "must not be given with problem= (the problem holds N_q, N_k, d_qk)", (N, d))
        heads = problem.B * problem.H_q
        masked = run_options.get("mask") not in (None, "none", "dense")
        work = None if masked else heads * problem.N_q * problem.N_k * problem.d_qk
        return problem.N_q, problem.d_qk, work
    if N is None or d is None:
        raise InputError("N and d", "must be given (or problem=)", (N, d))
    work = N * N * d if isinstance(N, (int, np.integer)) and isinstance(d, (int, np.integer)) else None
    return N, d, work


def _check_cache(M, cache_words, line, write_allocate, policies, opt_limit_bytes) -> _Cache:  # noqa: N803
    """The cache's size (default M, from 1 to 2^40 words) and its line (a power of two up to the size)."""
    cache_words = M if cache_words is None else cache_words
    whole = isinstance(cache_words, (int, np.integer)) and not isinstance(cache_words, bool)
    if not whole or not 0 < cache_words <= 1 << 40:
        raise InputError("cache_words", f"must be an integer from 1 to {1 << 40:,} (words)", cache_words)
    if (
        isinstance(line, bool)
        or not isinstance(line, (int, np.integer))
        or not 0 < line <= cache_words
        or line & (line - 1)
    ):
        raise InputError("line", f"must be a power of two from 1 to the cache size {cache_words:,} (words)", line)
    return _Cache(int(cache_words), int(line), bool(write_allocate), policies, opt_limit_bytes)


def _check_work(work: int, limit: _Limit) -> None:
    """Up front: every algorithm touches at least N^2 d operand words (S = Q K^T), so a replay of more than
    :data:`MAX_ACCESSES`, or longer than :mod:`iosim.runner.estimate` allows, is refused before the run."""
    if work > MAX_ACCESSES:
        raise InputError(
            limit.parameter,
            f"gives over {work:,} operand accesses (the scores' N^2 d at least), over the replay limit of "
            f"{MAX_ACCESSES:,} (about 5 minutes of LRU); use a smaller N or d",
            limit.value,
        )
    estimate.check(
        estimate.replay_seconds(work, limit.policies),
        f"a replay through {', '.join(limit.policies)} of at least {work:,} operand accesses",
        allow_long=limit.allow_long,
        parameter=limit.parameter,
        value=limit.value,
        remedy="use a smaller N or d, or --policy lru,fifo",
    )


def _check_accesses(accesses: int, limit: _Limit) -> None:
    """The exact count, now that the schedule has run (its OPT trace included): at most :data:`MAX_ACCESSES` and
    within the time :mod:`iosim.runner.estimate` allows."""
    if accesses > MAX_ACCESSES:
        raise InputError(
            limit.parameter,
            f"gives {accesses:,} operand accesses, over the replay limit of {MAX_ACCESSES:,}; use a smaller N",
            limit.value,
        )
    estimate.check(
        estimate.replay_seconds(accesses, limit.policies),
        f"a replay through {', '.join(limit.policies)} of {accesses:,} operand accesses",
        allow_long=limit.allow_long,
        parameter=limit.parameter,
        value=limit.value,
        remedy="use a smaller N or d, or --policy lru,fifo",
    )


def _replayed(algorithm, r, M, cache: _Cache, backward, accesses, derived, problem) -> ReplayResult:  # noqa: N803
    """The result: the explicit schedule's per-array reads and writes (of the run ``r``), then the compute ops
    ``derived`` (ops, address map) replayed through each policy's cache (:func:`replay_ops`)."""
    ops, x = derived
    explicit = {n: (c.reads, c.writes) for n, c in r.stats.per_array.items()}
    out = ReplayResult(
        algorithm, r.N, r.d, M, cache.words, cache.line, cache.write_allocate, backward, r.causal, accesses,
        explicit, problem=problem,
    )  # fmt: skip
    out.rows = list(x.report) + [n for n in explicit if n not in x.report]
    for p in cache.policies:
        out.policies[p] = replay_ops(ops, x, p, cache.words, cache.line, cache.write_allocate, cache.opt_limit_bytes)
    return out
