"""Paged KV caches (vLLM): where a key's row lives, and the page pieces a FlashAttention tile is loaded in.

K and V live in pages of P tokens located through a page table (one int32 entry per page of a sequence; pages are
shared by the key/value heads of a batch item, as vLLM's cache is). A key tile [c0, c1) is cut at page boundaries
into *page pieces*; each piece costs its page-table entry (one word) and a load of its rows from the page
(:func:`load_piece`). A K/V-outer kernel either runs each piece as an outer step of its own or gathers the whole
tile from its pages first (:func:`gather_tile`). The rows of physical page p for key/value head h_kv are
[(p H_kv + h_kv) P, ... + P). A contiguous cache (P = 0) is one piece per tile, read at the head's own rows.
The loop nests that use these: :mod:`iosim.algorithms.flash`.
"""

from __future__ import annotations

from iosim.memory_model import alloc, free, load, load_vec
from numba import njit, types
from numba.extending import overload


@njit(cache=True)
def piece_end(p0, c1, P):  # noqa: N803
    """The end of the page piece that starts at key p0 of a tile ending at c1 (P = 0: contiguous, one piece)."""
    return c1 if P == 0 else min(c1, (p0 // P + 1) * P)


def _page_of(tb, logical):
    """The physical page of a piece: the page-table entry just loaded (numeric run), or, in a count-only run where
    nothing is copied, the logical page (the region it names has the same shape, so the counts are the same)."""
    return logical if tb is None else tb[0]


@overload(_page_of, jit_options={"cache": True})
def _ol_page_of(tb, logical):
    if isinstance(tb, types.NoneType):
        return lambda tb, logical: logical
    return lambda tb, logical: tb[0]


def tile_at(buf, r0, r, c):
    """Rows r0 : r0 + r of the r x c tiles at the start of a 1-D buffer (a piece of a gathered tile); None in
    count-only mode."""
    return None if buf is None else buf[r0 * c : (r0 + r) * c].reshape(r, c)


@overload(tile_at, jit_options={"cache": True})
def _ol_tile_at(buf, r0, r, c):
    if isinstance(buf, types.NoneType):
        return lambda buf, r0, r, c: None
    return lambda buf, r0, r, c: buf[r0 * c : (r0 + r) * c].reshape(r, c)


@njit(cache=True, inline="always")
def load_piece(W, ids, K, V, table, tb, Kj, Vj, at, p0, n, dqk, dv, shared):  # noqa: N803
    """Algorithm 1's step 6 for a page piece: its page-table entry (paged), then K_j and V_j (none under MLA
    shared) from the piece's rows; ``at`` = (the head's first K/V row, batch item, pages per item, key/value head,
    H_kv, P). Returns the handles (hK, hV)."""
    iK, iV, iT = ids
    kv, b, pages, hk, Hkv, P = at
    row = kv + p0
    if P > 0:  # the page's table entry, then the piece from its page
        hT = load_vec(W, iT, table, b * pages + p0 // P, 1, tb)
        row = (_page_of(tb, b * pages + p0 // P) * Hkv + hk) * P + p0 % P
    hK = load(W, iK, K, row, n, 0, dqk, Kj)
    hV = -1 if shared else load(W, iV, V, row, n, 0, dv, Vj)
    if P > 0:
        free(W, hT)
    return hK, hV


@njit(cache=True, inline="always")
def gather_tile(W, ids, K, V, table, tb, Kb, Vb, at, c0, c1, dqk, dv, shared):  # noqa: N803
    """A paged K/V-outer step that gathers the whole tile [c0, c1) from its pages (a kernel that looks each key's
    page up and copies it into one shared-memory tile): every page piece's table entry (one word) and its rows of
    K and V are loaded (:func:`load_piece`), and the pieces are merged into one resident tile as they arrive
    (their handles freed, one handle of the rows so far taken: the same resident words). Returns (hK, hV)."""
    iK, iV, _ = ids
    hK = hV = -1
    p0 = c0
    while p0 < c1:
        p1 = piece_end(p0, c1, at[5])
        n = p1 - p0
        Kp, Vp = tile_at(Kb, p0 - c0, n, dqk), tile_at(Vb, p0 - c0, n, dv)
        hk, hv = load_piece(W, ids, K, V, table, tb, Kp, Vp, at, p0, n, dqk, dv, shared)
        if hK < 0:  # the first piece is the tile so far
            hK, hV = hk, hv
        else:  # merged: the rows so far and this piece are one tile of p1 - c0 rows
            free(W, hK)
            free(W, hk)
            hK = alloc(W, iK, 0, p1 - c0, 0, dqk)
            if not shared:
                free(W, hV)
                free(W, hv)
                hV = alloc(W, iV, 0, p1 - c0, 0, dv)
        p0 = p1
    return hK, hV


def kv_rows(problem) -> int:
    """Rows of the K (and V) slow arrays: B H_kv N_k, or paged: every page of every batch item, P rows per head."""
    p = problem
    if p.page_size is None:
        return p.B * p.H_kv * p.N_k
    return p.B * p.pages * p.H_kv * p.page_size
