"""A mask that differs per (b, h) over a problem: a FlexAttention ``mask_mod`` that reads b or h (document ids per
batch item, a window per head) or a BlockMask with an entry per (b, h).

:func:`grid` evaluates such a mask (:class:`iosim.masks.FromMaskMod`, :class:`iosim.masks.FromBlockMask` with b, h
None) at every (b, h) of the problem: B x H_q tile oracles over the N_k x N_k sequence. When they are all the same,
the problem runs as before, one mask for every head. Otherwise :func:`parts` cuts the problem where the mask
changes, into the coarsest of

* one part per batch item b (B = 1, every head), when the mask is the same at every head of b;
* one part per key/value head of b (B = 1, H_q = g, H_kv = 1), when it is the same within each group of g query
  heads that share K and V;
* one part per query head (B = 1, H_q = H_kv = 1) otherwise;

and each part is its own problem under its own mask, counted and put beside its closed form
(:func:`iosim.problem_runs.run_problem`). The schedules over a problem run their groups of rows one after another,
each group's traffic its own, so every array's counts over the whole problem are the parts' sums and the peak is
the largest part's (in the backward of per-query-head parts with g > 1, each head's dK, dV are the group's
partials and the group sum follows, as in the whole problem). Split-KV (``splits`` > 1, flash2's forward) runs
each part's split kernel (a thread block per row block and split, within one group of rows) and then the combine
kernel once over every row of the problem, its row blocks across the parts as over the whole (the combine reads
every split's partials whatever the mask). A schedule whose steps mix the parts cannot be cut and is refused in
one line: ``gqa`` packed when the g heads of a group differ (they share one pass over K and V and one mask) and
``trace`` (one trace per part would overlay)."""

from __future__ import annotations

import numpy as np

from iosim.errors import InputError

PARTS = ("batch", "kv-head", "head")  # the three cuts, coarsest first


def per_head_mask(mask):
    """``mask`` parsed when it is a ``mod:`` string (once: a file is run per parse); the mask itself otherwise."""
    if isinstance(mask, str) and mask.startswith("mod:"):
        from iosim.masks import parse

        return parse(mask)
    return mask


def grid(p, mask, allow_long: bool = False) -> list | None:
    """The tile oracles of ``mask`` at every (b, h) of problem ``p`` (B rows of H_q, over N_k x N_k), or None when
    ``mask`` is one mask for every head (any other mask, a pinned (b, h), a problem of one head, or a mask_mod that
    never reads b or h, :func:`iosim.mask_mod.reads_b_or_h`)."""
    from iosim import mask_mod as _mm
    from iosim import masks

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


def check_schedule(p, how: str, gqa: str, trace) -> None:
    """One line unless the schedule's steps stay within the parts of the cut ``how``."""
    why = "the mask differs per (b, h), so each part of the problem runs as its own problem"
    if how == "head" and gqa == "packed" and p.g > 1:
        raise InputError("gqa", f"must be per-head: the mask differs between the g = {p.g} query heads that share a "
                         "key/value head, and packed GQA runs them as one block of rows under one mask",
                         gqa)  # fmt: skip
    if trace is True:
        raise InputError("trace", f"is not recorded with a mask that differs per (b, h) ({why}; one trace each "
                         "would overlay)", True)  # fmt: skip


def one_mask(p, mask, allow_long: bool = False):
    """The mask every head of ``p`` runs under, for a count that takes one: ``mask`` itself, or its oracle when it
    is the same at every (b, h); one line when it differs."""
    mask = per_head_mask(mask)
    g = grid(p, mask, allow_long)
    if g is None:
        return mask
    if not uniform(g):
        raise InputError("mask", "differs per (b, h); this count takes one mask for every head (iosim.run takes one "
                         "per (b, h); or give the (b, h) to use: from_mask_mod(fn, b, h))", mask.label)  # fmt: skip
    return g[0][0]
