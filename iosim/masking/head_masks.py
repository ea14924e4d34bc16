"""A mask that differs per (b, h) over a problem: a FlexAttention ``mask_mod`` that reads b or h (document ids per
batch item, a window per head) or a BlockMask with an entry per (b, h).

:func:`grid` evaluates such a mask (:class:`iosim.masking.masks.FromMaskMod`,
:class:`iosim.masking.masks.FromBlockMask` with b, h
None) at every (b, h) of the problem: B x H_q tile oracles over the N_k x N_k sequence. When they are all the same,
the problem runs as before, one mask for every head. Otherwise :func:`parts` cuts the problem where the mask
changes, into the coarsest of

* one part per batch item b (B = 1, every head), when the mask is the same at every head of b;
* one part per key/value head of b (B = 1, H_q = g, H_kv = 1), when it is the same within each group of g query
  heads that share K and V;
* one part per query head (B = 1, H_q = H_kv = 1) otherwise; under ``gqa`` packed (the g query heads of a group
  packed into the rows of one pass over K and V) one part per key/value head still, its rows under a mask of
  their own (:func:`packed_mask`: packed row h N_q + q is head h's query row q);

and each part is its own problem under its own mask, counted and put beside its closed form
(:func:`iosim.runner.problem_runs.run_problem`). The schedules over a problem run their groups of rows one after
another,
each group's traffic its own, so every array's counts over the whole problem are the parts' sums and the peak is
the largest part's (in the backward of per-query-head parts with g > 1, each head's dK, dV are the group's
partials and the group sum follows, as in the whole problem). Split-KV (``splits`` > 1, flash2's forward) runs
each part's split kernel (a thread block per row block and split, within one group of rows) and then the combine
kernel once over every row of the problem, its row blocks across the parts as over the whole (the combine reads
every split's partials whatever the mask). A trace is refused in one line (one trace per part would overlay).

The compulsory traffic under such a mask (:func:`seen_totals`) reads each query row that sees a key once and, for
each key/value head, the keys some query head of its group sees."""

from __future__ import annotations

import numpy as np

from iosim.base.errors import InputError

PARTS = ("batch", "kv-head", "head")  # the three cuts, coarsest first


def per_head_mask(mask):
    """``mask`` parsed when it is a ``mod:`` string (once: a file is run per parse); the mask itself otherwise."""
    if isinstance(mask, str) and mask.startswith("mod:"):
        from iosim.masking.masks import parse

        return parse(mask)
    return mask


def grid(p, mask, allow_long: bool = False) -> list | None:
    """The tile oracles of ``mask`` at every (b, h) of problem ``p`` (B rows of H_q, over N_k x N_k), or None when
    ``mask`` is one mask for every head (any other mask, a pinned (b, h), a problem of one head, or a mask_mod that
    never reads b or h, :func:`iosim.masking.mask_mod.reads_b_or_h`)."""
    from iosim.masking import mask_mod as _mm
    from iosim.masking import masks

    if not isinstance(mask, (masks.FromMaskMod, masks.FromBlockMask)) or not mask.per_head or p.B * p.H_q == 1:
        return None
    fn, held = mask.fn if isinstance(mask, masks.FromMaskMod) else mask.index.mask_mod, (1, 1)
    if isinstance(mask, masks.FromBlockMask):
        Bm, Hm = held = mask.index.kv_num.shape[:2]
        if Bm not in (1, p.B) or Hm not in (1, p.H_q):
            raise InputError("block_mask", f"has (B, H) = ({Bm}, {Hm}); the problem's is ({p.B}, {p.H_q}) (1 "
                             "broadcasts)", (Bm, Hm))  # fmt: skip
    if held == (1, 1) and (fn is None or not _mm.reads_b_or_h(fn, p.N_k)):
        return None  # it never reads b or h: one mask for every head, evaluated once
    with_long = allow_long is True or mask.allow_long
    masks.price_mod(p.N_k, mask.label, with_long, heads=p.B * p.H_q)
    return [[masks.compile_mask(mask.at(b, h), p.N_k, allow_long=with_long) for h in range(p.H_q)]
            for b in range(p.B)]  # fmt: skip


def same(a, b) -> bool:
    """Whether two tile oracles are the same mask (the MOD kind's tables are canonical: equal masks, equal tables)."""
    return a.kind == b.kind and np.array_equal(a.params, b.params) and np.array_equal(a.table, b.table)


def uniform(g: list) -> bool:
    return all(same(m, g[0][0]) for row in g for m in row)


def cut(p, g: list) -> str:
    """The coarsest cut of :data:`PARTS` within whose parts the mask is the same (``g`` not uniform)."""
    if all(same(m, row[0]) for row in g for m in row):
        return "batch"
    if all(same(m, row[h - h % p.g]) for row in g for h, m in enumerate(row)):
        return "kv-head"
    return "head"


def parts(p, g: list, how: str) -> list[tuple[int, int, int]]:
    """The parts of a cut: (b, first query head, query heads) each."""
    if how == "batch":
        return [(b, 0, p.H_q) for b in range(p.B)]
    if how == "kv-head":
        return [(b, hk * p.g, p.g) for b in range(p.B) for hk in range(p.H_kv)]
    return [(b, h, 1) for b in range(p.B) for h in range(p.H_q)]


def packed(p, how: str, gqa: str) -> bool:
    """Whether the cut ``how`` runs per key/value head with the group's packed rows under a mask of their own
    (query heads of a group differ, and ``gqa`` packed runs them as one block of rows)."""
    return how == "head" and gqa == "packed" and p.g > 1


def part_masks(p, g: list, how: str, gqa: str) -> list[tuple[int, int, int, object]]:
    """The parts of a cut with the mask each runs under: (b, first query head, query heads, mask)."""
    if packed(p, how, gqa):
        return [(b, h0, nh, packed_mask(g[b][h0 : h0 + nh], p.N_q, p.N_k - p.N_q))
                for b, h0, nh in parts(p, g, "kv-head")]  # fmt: skip
    return [(b, h0, nh, g[b][h0]) for b, h0, nh in parts(p, g, how)]


def packed_mask(heads: list, Nq: int, off: int):  # noqa: N803
    """One group's mask over its R = g N_q packed rows: row h N_q + q is row q + off of ``heads[h]`` (each a tile
    oracle over N_k x N_k), a MOD oracle whose params carry R (:attr:`TileMask.packed_rows`), so the problem
    drivers and closed forms take packed row r as its row r. Built a band of 64 rows at a time from the heads' own
    oracles (priced with them, :func:`grid`)."""
    from iosim.algorithms import tile_masks as _m
    from iosim.masking import mask_mod as _mm
    from iosim.masking.masks import _table_fits

    Nk, R = heads[0].N, Nq * len(heads)
    _table_fits((-(-R // _m.MOD_G), -(-Nk // _m.MOD_G) + 2), heads[0].label)

    def rows(b, h, q_idx, kv_idx):  # the packed rows q_idx (a contiguous band) against keys kv_idx (contiguous)
        q, k = np.asarray(q_idx).ravel(), np.asarray(kv_idx).ravel()
        S = np.zeros((q.size, k.size))
        r = 0
        while r < q.size:
            hh, row = divmod(int(q[r]), Nq)
            n = min(q.size - r, Nq - row)
            m = heads[hh]
            _m.apply_mask(S[r : r + n], m.kind, *m.args[1:3], row + off, int(k[0]))
            r += n
        return S == 0.0

    c = _mm.classify(rows, 0, 0, R, Nk, _m.MOD_G, _m.MOD_G, padded=False, bits=True, name="mask")
    params, table = _mm.mod_table(c, Nk)
    label = heads[0].label
    return _m.tile_mask(_m.MOD, (*params, R), table, N=Nk, label=f"{label} packed", policy=heads[0].policy)


def seen_totals(p, g: list):
    """The compulsory traffic's :class:`iosim.spec.problem.SeenTotals` under the per-(b, h) oracles ``g``: query rows
    that see a key, summed over every head, and for each key/value head the keys that some query head of its
    group sees."""
    from iosim.algorithms.tile_masks import seen_keys
    from iosim.spec.problem import SeenTotals

    off = p.N_k - p.N_q
    distinct, of = classes([m for row in g for m in row])  # each distinct mask tested once
    seen = [seen_keys(*m.args[:3], p.N_q, off, p.N_k) for m in distinct]  # (a grid's oracles are all MOD ones)
    rows_q = sum(int(seen[k][0]) for k in of)
    rows_k = 0
    for group in of.reshape(p.B * p.H_kv, p.g):  # the g query heads of each key/value head
        keys = np.zeros(p.N_k, dtype=bool)
        for k in group:
            keys |= seen[k][1]
        rows_k += int(keys.sum())
    return SeenTotals(rows_q, rows_k)


def check_schedule(trace) -> None:
    """One line for a trace: the parts run one after another, each its own problem."""
    why = "the mask differs per (b, h), so each part of the problem runs as its own problem"
    if trace is True:
        raise InputError("trace", f"is not recorded with a mask that differs per (b, h) ({why}; one trace each "
                         "would overlay)", True)  # fmt: skip


def unit_masks(p, mask, group: bool, packed_rows: bool, allow_long: bool = False) -> tuple:
    """(the mask of every head, None) when ``mask`` is the same at every head (as :func:`one_mask`), else (None, the
    masks of a launch's head units): :func:`iosim.hierarchy.hierarchy`'s B H_q units of one query head, or
    (``group``) B H_kv units of a key/value head's g query heads, unit u of batch item b at index b Hu + u. A group
    whose heads differ runs under its packed rows' own mask (``packed_rows``: gqa packed); a group of per-head query
    heads that differ is refused in one line (their CTAs are cut from one unit's trace)."""
    one, g = resolve(p, mask, allow_long)
    if g is None:
        return one, None
    if not group:
        return None, [m for row in g for m in row]
    out = []
    for row in g:
        for hk in range(p.H_kv):
            heads = row[hk * p.g : (hk + 1) * p.g]
            if all(same(m, heads[0]) for m in heads):
                out.append(heads[0])
            elif packed_rows:
                out.append(packed_mask(heads, p.N_q, p.N_k - p.N_q))
            else:
                raise InputError("gqa", f"must be packed for this launch: the mask differs between the g = {p.g} "
                                 "query heads of a key/value head, whose backward CTAs run as one unit",
                                 "per-head")  # fmt: skip
    return None, out


def classes(masks: list) -> tuple[list, np.ndarray]:
    """The distinct masks of a list (in order of first use) and each entry's index among them."""
    distinct, of = [], np.zeros(len(masks), dtype=np.int64)
    for i, m in enumerate(masks):
        k = next((k for k, x in enumerate(distinct) if same(x, m)), len(distinct))
        if k == len(distinct):
            distinct.append(m)
        of[i] = k
    return distinct, of


def resolve(p, mask, allow_long: bool = False) -> tuple:
    """(the mask every head of ``p`` runs under, None) when ``mask`` is the same at every (b, h): ``mask`` itself
    (parsed, :func:`per_head_mask`), or its oracle when it was evaluated at each; else (None, its oracles at every
    (b, h), :func:`grid`)."""
    mask = per_head_mask(mask)
    g = grid(p, mask, allow_long)
    if g is None:
        return mask, None
    if uniform(g):
        return g[0][0], None
    return None, g


def one_mask(p, mask, allow_long: bool = False):
    """The mask every head of ``p`` runs under, for a count that takes one (:func:`resolve`); one line when it
    differs."""
    one, g = resolve(p, mask, allow_long)
    if g is not None:
        raise InputError("mask", "differs per (b, h); this count takes one mask for every head (iosim.run takes one "
                         "per (b, h); or give the (b, h) to use: from_mask_mod(fn, b, h))", g[0][0].label)  # fmt: skip
    return one
