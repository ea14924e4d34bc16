"""GQA's shared K/V on the teaching page: which query heads read each K_j, V_j tile of a key/value head, and how
many times each tile is loaded from slow memory under ``per-head`` and under ``packed`` GQA, all read from traces.

Grouped-query attention gives g = H_q / H_kv query heads one key/value head: query head h reads K/V head h // g.
A schedule over such a problem chooses what is outer (:meth:`iosim.spec.problem.Problem.groups`): ``per-head`` runs
every
query head on its own (a K_j tile is loaded for each query head that reads it), ``packed`` stacks a key/value head's
g query heads into one group of g N_q rows (a K_j load serves every head whose rows are in fast memory with it).

The page draws the first key/value head (batch item 0, K/V head 0; its rows are K[0:N_k] and its query heads' rows
Q[0:g N_q], the layout of :func:`iosim.runner.problem_runs.problem_arrays`) from the run's own trace and from a second
trace
of the same problem under the other policy (:func:`partner`). A load of K_j is *read by* query head h when a tile of
Q rows of head h is in fast memory at some moment while that K_j is (a load of K_j no Q tile meets, an empty
block's under the paper policy, is read by no head). Every number the page shows is one of these counts, or a sum or
difference of them made here, never a formula evaluated in the page.

A paged cache (``page_size``) is not drawn: its K rows are page slots, not a key/value head's rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from iosim.base.errors import InputError
from iosim.memory_model.core import ALLOC, FREE, LOAD
from iosim.spec.problem import GQA_POLICIES

KV = ("K", "V")


def is_gqa(r) -> bool:
    """A traced run over a problem whose key/value heads are each shared by several query heads (g > 1)."""
    p = r.problem
    return (
        r.trace is not None
        and p is not None
        and p.g > 1
        and p.page_size is None
        and r.schedule.get("gqa") in GQA_POLICIES
        and "K" in r.trace.names
        and "Q" in r.trace.names
    )


def other_policy(policy: str) -> str:
    return GQA_POLICIES[1 - GQA_POLICIES.index(policy)]


def partner(r, kw: dict | None = None):
    """The run of ``r``'s problem under the other GQA policy with ``r``'s own tiles (Br, Bc of its pass: the same
    K_j, V_j, only the policy changed; the other policy's own tiling if those tiles are refused), traced and
    count-only: from ``kw`` (the keywords of :func:`iosim.run` the page was built with) when given, else from the
    run's own problem and schedule when its mask is none or causal (a causal problem carries its mask). Returns the
    run, an InputError's one line (the other policy refused at this M), or None (not a GQA run, or a mask that only
    the keywords can rebuild)."""
    from iosim.runner import api

    if not is_gqa(r):
        return None
    other = other_policy(r.schedule["gqa"])
    opts = dict(count_only=True, reference=False, trace=True, gqa=other)
    if kw is not None:
        kw = {k: v for k, v in kw.items() if k not in ("dtype", "count_only", "reference", "trace", "Br", "Bc")}
    elif r.mask not in ("none", "causal") or r.spec is None:
        return None
    refused, own = None, r.main.tiling or r.tiling
    for tiles in ({"Br": own.Br, "Bc": own.Bc}, {}):
        try:
            if kw is not None:
                return api.run_keywords(r.algorithm, **{**kw, **opts, **tiles})
            spec = dataclasses.replace(r.spec, gqa=other, **(tiles or {"Br": None, "Bc": None}))
            return api.run(r.problem, spec, r.M, **{k: v for k, v in opts.items() if k != "gqa"})
        except InputError as e:
            refused = refused or f"{other} is refused here: {e}"
    return refused


def _heads(r0: int, nr: int, n_q: int) -> range:
    """The query heads of the group whose rows Q[r0:r0+nr] holds (packed tiles may hold rows of several heads)."""
    return range(r0 // n_q, (r0 + nr - 1) // n_q + 1)


def _group_events(r) -> np.ndarray:
    """The loads, allocations and frees of K/V head 0's tiles (K, V rows [0, N_k)) and of its query heads' Q tiles
    (rows [0, g N_q)), in trace order: a few of the trace's events, walked one by one in :func:`policy_counts`."""
    p, t = r.problem, r.trace
    ev = t.events
    q = t.names.index("Q")
    kv = [t.names.index(a) for a in KV if a in t.names]
    live = np.isin(ev[:, 0], (LOAD, ALLOC))
    rows = np.where(ev[:, 1] == q, p.g * p.N_q, p.N_k)
    mine = live & np.isin(ev[:, 1], [q, *kv]) & (ev[:, 2] < rows)
    frees = (ev[:, 0] == FREE) & np.isin(ev[:, 8], ev[mine, 8])
    return ev[mine | frees]


def policy_counts(r) -> dict:
    """One policy's counts of K/V head 0 from the trace of ``r``: per array (K, V) its tiles as
    [k0, nk, loads, words, readers] (readers: [[the query heads that read a load], how many loads they read], one
    entry per distinct set of heads, in order of heads; a K tile adds the words of K_j and V_j together), the words
    the head's tiles were loaded in all (``group``; ``group_total`` their sum), the run's own reads of K and V over
    the whole problem (``problem``, from its counts; ``total`` their sum), the group's Q row blocks
    (``row_blocks``) and the run's tiles (``Br``, ``Bc``)."""
    p, t = r.problem, r.trace
    names = t.names
    q = names.index("Q")
    live_q: dict[int, range] = {}
    open_kv: dict[int, set] = {}  # handle of a live K/V load -> the heads that met it
    loads: list[tuple[str, int, int, int, set]] = []
    row_blocks = set()
    for op, a, r0, nr, _c0, _nc, words, _res, h in _group_events(r)[:, :9].tolist():
        if op == FREE:
            live_q.pop(h, None)
            open_kv.pop(h, None)
            continue
        if a == q:
            heads = _heads(r0, nr, p.N_q)
            live_q[h] = heads
            row_blocks.add((r0, nr))
            for met in open_kv.values():
                met.update(heads)
        elif op == LOAD:
            open_kv[h] = set().union(*live_q.values())
            loads.append((names[a], r0, nr, words, open_kv[h]))
    tiling = r.main.tiling or r.tiling
    out = {"policy": r.schedule["gqa"], "Br": tiling.Br, "Bc": tiling.Bc, "row_blocks": len(row_blocks), "tiles": {},
           "group": {}, "problem": {}}  # fmt: skip
    for name in (a for a in KV if a in names):
        tiles: dict[tuple, list] = {}
        for _, r0, nr, words, met in (x for x in loads if x[0] == name):
            tile = tiles.setdefault((r0, nr), [r0, nr, 0, 0, {}])
            tile[2] += 1
            tile[3] += words
            key = tuple(sorted(met))
            tile[4][key] = tile[4].get(key, 0) + 1
        rows = [[*x[:4], [[list(k), n] for k, n in sorted(x[4].items())]] for x in sorted(tiles.values())]
        out["tiles"][name] = rows
        out["group"][name] = sum(x[3] for x in rows)
        out["problem"][name] = r.stats.per_array[name].reads if name in r.stats.per_array else 0
    v_words = {(x[0], x[1]): x[3] for x in out["tiles"].get("V", [])}
    for x in out["tiles"].get("K", []):  # the words of the tile K_j and of V_j (the same keys), for the table
        x.append(x[3] + v_words.get((x[0], x[1]), 0))
    out["group_total"] = sum(out["group"].values())
    out["total"] = sum(out["problem"].values())
    return out


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n:,} times")


def _all(g: int) -> str:
    return "both query heads" if g == 2 else f"all {g} query heads"


def _readers(tile: list, g: int) -> str:
    """Who read the loads of one tile: "once for each of the 4 query heads", "each load read by all 4 query heads
    at once", or head by head with the loads read by several heads at once."""
    loads, readers = tile[2], tile[4]
    served = [sum(n for heads, n in readers if h in heads) for h in range(g)]
    shared = sum(n for heads, n in readers if len(heads) > 1)
    if loads and all(s == loads for s in served):
        return f"each load read by {_all(g)} at once"
    if not shared and len(set(served)) == 1 and sum(served) == loads:
        return f"{_times(served[0])} for each of the {g} query heads"
    who = ", ".join(f"query head {h} reads {s:,}" for h, s in enumerate(served) if s)
    return f"{who}; {shared:,} of them {'is' if shared == 1 else 'are'} read by more than one query head at once"


def _why(algorithm: str, pass_: str, per: dict, packed: dict) -> str:
    """Why the two policies' loads of a tile differ (or do not), in the schedule's loop order, with the counts."""
    if algorithm == "flash2" and pass_ == "forward":
        return (
            "FlashAttention-2 keeps a row block Q_i in fast memory and streams K, V past it, so each K_j is loaded "
            f"once per row block: the group's rows make {per['row_blocks']:,} row blocks per-head (each head's "
            f"rows alone) against {packed['row_blocks']:,} packed (the heads' rows stacked)."
        )
    return (
        "The schedule keeps K_j, V_j in fast memory while it streams query rows past them: per-head streams one query "
        "head's rows past each load, packed streams all of the group's rows past one load."
    )


def explain(data: dict) -> list[str]:
    """The page's sentences about the shared K/V, every number one of ``data``'s counts (:func:`gqa_data`)."""
    g, pol = data["g"], data["policies"]
    own = pol[data["own"]]
    k_tiles = own["tiles"]["K"]
    heads = "0 and 1" if g == 2 else f"0 to {g - 1}"
    out = [
        f"Query heads {heads} (g = {g} of H_q = {data['H_q']}) share key/value head 0: each of them reads its "
        f"{len(k_tiles):,} tiles K_j, V_j ({data['N_k']:,} keys)."
    ]
    for name in GQA_POLICIES:
        if name in pol and pol[name]["tiles"].get("K"):
            first = pol[name]["tiles"]["K"][0]
            out.append(f"{name}: K_1 is loaded {_times(first[2])}, {_readers(first, g)}.")
    if len(pol) < 2:
        out.append(data.get("refused") or "The other policy's counts are not on this page.")
        return out
    per, packed = pol["per-head"], pol["packed"]
    kv = " and ".join(a for a in KV if a in per["group"])
    if (per["Br"], per["Bc"]) == (packed["Br"], packed["Bc"]):
        out.append(
            f"Both runs use the same tiles, K_j and V_j of Bc = {per['Bc']} keys and row blocks of at most Br = "
            f"{per['Br']} query rows: only the policy differs."
        )
    else:
        out.append(
            f"The runs' tiles differ (per-head Br = {per['Br']}, Bc = {per['Bc']}; packed Br = {packed['Br']}, "
            f"Bc = {packed['Bc']}): the other policy refused this run's tiles."
        )
    out.append(
        f"{kv} of key/value head 0 are loaded {per['group_total']:,} words per-head against "
        f"{packed['group_total']:,} packed; over the problem {per['total']:,} against {packed['total']:,} "
        "(the two runs' counts)."
    )
    saved = data["saving"]
    verdict = (
        f"Packing saves {saved['words']:,} words of {kv} reads ({saved['percent']}%)."
        if saved["words"] > 0
        else "Packing saves nothing here."
        if saved["words"] == 0
        else f"Packing reads {-saved['words']:,} more words of {kv} here."
    )
    out.append(verdict + " " + _why(data["algorithm"], data["pass"], per, packed))
    if data.get("mask", "none") != "none":
        out.append(
            f"Under the mask ({data['mask']}) a block loads only the K_j its rows see: a packed row block holding "
            "rows of several heads loads every K_j that any of them sees, so tiles differ in loads and packing can "
            "save less, or read more."
        )
    return out


def gqa_data(r, other=None) -> dict | None:
    """The page's data on GQA's shared K/V of the traced run ``r`` (None unless :func:`is_gqa`), with the other
    policy's counts from ``other`` (a traced run of the same problem under it, :func:`partner`; a string is its
    refusal): the group (g, heads), each policy's :func:`policy_counts`, the saving in words (per-head's K and V
    reads over the problem less packed's) and the sentences of :func:`explain`."""
    if not is_gqa(r):
        return None
    p = r.problem
    own = policy_counts(r)
    data = {"g": p.g, "H_q": p.H_q, "H_kv": p.H_kv, "B": p.B, "N_q": p.N_q, "N_k": p.N_k, "own": own["policy"],
            "algorithm": r.algorithm, "pass": r.main.name, "heads": list(range(p.g)), "mask": r.mask,
            "policies": {own["policy"]: own}}  # fmt: skip
    if isinstance(other, str):
        data["refused"] = other
    elif other is not None and is_gqa(other):
        theirs = policy_counts(other)
        data["policies"][theirs["policy"]] = theirs
        per, packed = data["policies"]["per-head"], data["policies"]["packed"]
        words = per["total"] - packed["total"]
        data["saving"] = {"words": words, "percent": round(100 * words / per["total"], 1) if per["total"] else 0.0}
    data["text"] = explain(data)
    return data
