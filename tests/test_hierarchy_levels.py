"""The hierarchy's levels as the hardware has them (issue 43): each array at its own bytes per word, an L2 in
partitions with the traffic between them, DRAM writes during a kernel and with the final flush, and the tile
scheduler's hooks (per-CTA delays, static slots, a planned block and request order).

The independent model here takes the same request stream (the cut of the schedule's trace, each CTA's requests,
and the launches' blocks, as a uniform-bytes run records them) and runs its own clock and a naive line-by-line LRU
per partition, written from the rules of :mod:`iosim.hierarchy.l2`'s docstring; nothing of iosim's counting."""

import heapq
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pytest

import iosim
from iosim import InputError
from iosim.hierarchy import Device, Machine, device, hierarchy
from iosim.hierarchy.simulate import kernel_dtype

SIZE = {"fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int32": 4}


def model_bytes(p, name):
    """Each array's bytes per word as the kernels move them (the test's own table of the convention)."""
    if name == "Q" or name in ("dKpart", "dVpart"):  # FlashAttention-2 allocates the GQA partials at Q's dtype
        return SIZE[p.dtype_q]
    if name in ("K", "V", "dK", "dV"):
        return SIZE[p.dtype_kv]
    if name in ("O", "dO", "dQ_out"):
        return SIZE[p.dtype_o]
    if name in ("dQ", "dq_accum"):
        return 8 if p.dtype_o == "fp64" else 4
    if name == "page_table":
        return 4
    return 4  # L, l, m, D, Opart, Lpart: fp32


def model(rec, p, kernel, P, bps, C, L, bpw, parts=1, G=1, delay=None, static=None, far="both"):  # noqa: N803
    """(per-array counts, per-launch write-backs during the kernel) of the launch ``rec`` (a recorded uniform run:
    its cut, blocks, launches, trace) under the rules of iosim.hierarchy.l2's docstring, line by line; ``far``:
    where a line read from the far partition is kept (both, near: the reader's partition only, home: the home's
    only)."""
    names = list(rec.trace.names) + [n for n in ("dq_accum", "dQ_out") if n in rec.per_array]
    shapes = dict(rec.trace.shapes)
    shapes.update({n: shapes["dQ"] for n in ("dq_accum", "dQ_out") if n in rec.per_array})
    owner = {n: n for n in names}
    if p.latent:
        owner["V"] = "K"
    owner["dq_accum"] = "dQ"
    eb = {n: (model_bytes(p, n) if kernel else bpw) for n in names}
    LB = L * bpw  # noqa: N806
    lw = {n: LB // eb[owner[n]] for n in names}
    cap = C // L // parts
    caches = [OrderedDict() for _ in range(parts)]
    cnt = {n: dict.fromkeys(("read", "update", "reduce", "fill", "wb", "fabric", "fabric_read", "fabric_reduce"), 0)
           for n in names}  # fmt: skip

    def add(n, k, words):
        cnt[n][k] += words

    def put(part, key, dirty):
        c = caches[part]
        if key in c:
            c.move_to_end(key)
            c[key] = c[key] or dirty
            return False
        c[key] = dirty
        if len(c) > cap:
            (o, _, _), was_dirty = c.popitem(last=False)
            if was_dirty:
                add(o, "wb", lw[o])
        return True

    def line(w, a, q, key, home):
        o = owner[a]
        if w == 0:
            if home != q and far == "home":  # no near copy: across to the home every time
                add(a, "fabric", lw[o])
                add(a, "fabric_read", lw[o])
                if put(home, key, False):
                    add(a, "fill", lw[o])
            elif key in caches[q]:
                put(q, key, False)
            elif far == "shared":  # any partition's copy serves it, else DRAM behind the home
                put(q, key, False)
                peer = any(key in caches[x] for x in range(parts) if x != q)
                if home != q or peer:
                    add(a, "fabric", lw[o])
                    add(a, "fabric_read", lw[o])
                if not peer:
                    add(a, "fill", lw[o])
            elif home == q:
                put(q, key, False)
                add(a, "fill", lw[o])
            else:
                put(q, key, False)
                add(a, "fabric", lw[o])
                add(a, "fabric_read", lw[o])
                if far == "both":
                    if put(home, key, False):
                        add(a, "fill", lw[o])
                elif key in caches[home]:  # near: the home serves what it holds, its LRU untouched
                    pass
                else:
                    add(a, "fill", lw[o])
            return
        if home != q:
            add(a, "fabric", lw[o])
            if w == 2:
                add(a, "fabric_reduce", lw[o])
            if w == 1 and far != "home":
                if key in caches[q]:
                    caches[q].move_to_end(key)
                else:
                    put(q, key, False)
        missed = key not in caches[home]
        put(home, key, True)
        if w == 2 and missed:
            add(a, "fill", lw[o])
        for x in range(parts):
            if x != home and (w == 2 or x != q):
                caches[x].pop(key, None)

    def request(req, blk, q):
        w, a, r0, nr, c0, nc, words = (int(x) for x in req)
        name = names[a]
        add(name, ("read", "update", "reduce")[w], words)
        o = owner[name]
        copy = blk[2] if o in ("K", "V") else (blk[3] if o == "page_table" else blk[1])
        stride = shapes[o][1]
        if C == 0:
            if w != 0:
                add(name, "wb", words)
            if w != 1:
                add(name, "fill", words)
            return
        seen = []
        for r in range(r0, r0 + nr):
            for x in range((r * stride + c0) // lw[o], (r * stride + c0 + nc - 1) // lw[o] + 1):
                if x not in seen:
                    seen.append(x)
        for x in seen:
            line(w, name, q, (o, copy, x), (x // G) % parts)

    cta_ptr, launch_ptr = rec.declared.cta_ptr, rec.launch_ptr
    slots = P * bps
    dl = np.zeros(len(rec.blocks), np.int64) if delay is None else delay
    during, t0 = [], 0
    for k in range(len(launch_ptr) - 1):
        lo, hi = int(launch_ptr[k]), int(launch_ptr[k + 1])
        atomic = kernel and "dQ" in rec.launches[k]["atomic"]
        rows_of = {}
        for i in range(lo, hi):
            c = int(rec.blocks[i, 0])
            rows = rec.cut.requests[cta_ptr[c] : cta_ptr[c + 1]]
            if atomic:  # the kernel adds into dQ: no load of it, each store a reduction
                is_dq = np.array([names[a] == "dQ" for a in rows[:, 1]], bool)
                rows = rows[~(is_dq & (rows[:, 0] == 0))].copy()
                rows[np.array([names[a] == "dQ" for a in rows[:, 1]], bool) & (rows[:, 0] == 1), 0] = 2
            rows_of[i] = rows
        # each slot's queue: its static blocks in launch order, or (dynamic) the first wave, then the next free slot
        if static is not None and hi > lo and static[lo] >= 0:
            queues = {s: [i for i in range(lo, hi) if static[i] == s] for s in range(slots)}
            shared = []
        else:
            queues = {s: [lo + s] for s in range(min(slots, hi - lo))}
            shared = list(range(lo + slots, hi))
        heap = [(t0 + int(dl[q[0]]), q[0], s, 0) for s, q in queues.items() if q]
        heapq.heapify(heap)
        t_end = t0
        wb0 = sum(c["wb"] * eb[n] for n, c in cnt.items())
        while heap:
            t, i, s, j = heapq.heappop(heap)
            rows = rows_of[i]
            request(rows[j], rec.blocks[i], ((s % P) * parts) // P)
            t += int(rows[j, 6])
            if j + 1 < len(rows):
                heapq.heappush(heap, (t, i, s, j + 1))
                continue
            t_end = max(t_end, t)
            mine = queues[s]
            later = [x for x in mine if x > i]
            n = later[0] if later else (shared.pop(0) if shared else None)
            if n is not None:
                heapq.heappush(heap, (t + int(dl[n]), n, s, 0))
        during.append(sum(c["wb"] * eb[n] for n, c in cnt.items()) - wb0)
        t0 = t_end
    for c in caches:
        for (o, _, _), dirty in c.items():
            if dirty:
                add(o, "wb", lw[o])
    return {n: c for n, c in cnt.items() if any(c.values())}, during, eb


def got(h):
    return {n: {"read": c.l2_read, "update": c.l2_update, "reduce": c.l2_reduce, "fill": c.l2_fill,
                "wb": c.l2_writeback, "fabric": c.fabric, "fabric_read": c.fabric_read,
                "fabric_reduce": c.fabric_reduce}
            for n, c in h.per_array.items()
            if any((c.l2_read, c.l2_update, c.l2_reduce, c.l2_fill, c.l2_writeback, c.fabric))}  # fmt: skip


def _prob(B, H_q, H_kv, N_q, N_k, d, dv=None, q="bf16", kv=None, o=None, causal=False, latent=False):  # noqa: N803
    return iosim.Problem(B=B, H_q=H_q, H_kv=H_kv, N_q=N_q, N_k=N_k, d_qk=d, d_v=dv, dtype_q=q, dtype_kv=kv, dtype_o=o,
                         causal=causal, latent=latent)  # fmt: skip


# fmt: off
CASES = [  # (algorithm, backward, problem, Br, Bc, gqa, P, C, L, parts, G)
    ("flash2", False, _prob(1, 2, 1, 12, 12, 8), 4, 4, "per-head", 2, 96, 8, 1, 1),
    ("flash2", False, _prob(1, 2, 1, 12, 12, 8), 4, 4, "per-head", 2, 96, 8, 2, 1),
    ("flash2", False, _prob(2, 2, 2, 10, 10, 8, q="fp32", kv="bf16", o="fp16", causal=True), 3, 4, "per-head", 3,
     128, 8, 2, 2),
    ("flash2", True, _prob(1, 2, 2, 8, 8, 8), 4, 4, "per-head", 2, 128, 8, 2, 1),
    ("flash2", True, _prob(1, 4, 2, 8, 8, 8, q="fp32", kv="bf16"), 4, 4, "per-head", 2, 192, 8, 2, 1),
    ("flash2", True, _prob(1, 2, 1, 8, 8, 8, causal=True), 4, 4, "packed", 3, 64, 8, 3, 1),
    ("flash1", False, _prob(1, 2, 2, 8, 8, 8), 4, 4, "per-head", 2, 64, 8, 2, 1),
    # an L2 that keeps everything, and a second wave of column blocks: lines written at their home are read again
    # from the other partition, whose copy the write invalidated (coherence)
    ("flash2", True, _prob(1, 1, 1, 8, 16, 8), 4, 4, "per-head", 2, 1 << 12, 8, 2, 1),
]
# fmt: on


def _run(case, kernel, record=False, far="both", **kw):
    alg, backward, p, Br, Bc, gqa, P, C, L, parts, G = case  # noqa: N806
    return hierarchy(
        iosim.Schedule(alg, Br=Br, Bc=Bc, gqa=gqa),
        problem=p,
        M=100_000,
        backward=backward,
        record=record,
        element_bytes="kernel" if kernel else "uniform",
        **kw,
        device=Machine(P=P, C=C, L=L, blocks_per_sm=1, partitions=parts, home_lines=G, far_copy=far),
    )


@pytest.mark.parametrize("kernel", [False, True], ids=["uniform", "kernel-bytes"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'bwd' if c[1] else 'fwd'}-p{c[9]}-G{c[10]}")
def test_partitions_and_bytes_per_array_agree_with_a_naive_model(case, kernel):
    """Per array: L2 requests (read, update, reduce), DRAM fills and write-backs, fabric words; per launch: the DRAM
    bytes written during the kernel; every level in bytes at each array's bytes per word."""
    rec = _run(case, False, record=True)  # the request stream (uniform: the schedule's own requests)
    rec.launch_ptr = np.concatenate(([0], np.cumsum([k["ctas"] for k in rec.launches])))
    h = _run(case, kernel)
    alg, backward, p, Br, Bc, gqa, P, C, L, parts, G = case  # noqa: N806
    want, during, eb = model(rec, p, kernel, P, 1, C, L, h.bytes_per_word, parts, G)
    assert got(h) == want
    assert [w["during_bytes"] for w in h.dram_writes] == during
    assert sum(w["with_flush_bytes"] for w in h.dram_writes) == h.level_bytes("dram_update")
    for n, c in h.per_array.items():
        assert c.word_bytes == eb[n], n
        assert c.bytes("l2_fill") == c.l2_fill * eb[n] and c.bytes("dram") == (c.l2_fill + c.l2_writeback) * eb[n]
    assert h.dram_bytes == sum((c["fill"] + c["wb"]) * eb[n] for n, c in want.items())
    if parts > 1:
        assert h.as_dict()["fabric"] > 0  # lines homed in the other partition crossed


@pytest.mark.parametrize("far", ["near", "home", "shared"])
@pytest.mark.parametrize("kernel", [False, True], ids=["uniform", "kernel-bytes"])
@pytest.mark.parametrize("case", [c for c in CASES if c[9] > 1], ids=lambda c: f"{c[0]}-{'bwd' if c[1] else 'fwd'}")
def test_where_a_far_read_line_is_kept_agrees_with_a_naive_model(case, kernel, far):
    """far_copy near (the reader's partition keeps the line, the home only serves what it holds), home (no near
    copy: every far access crosses) and shared (as near, a miss served by any partition's copy before DRAM): every
    level per array, the reads' fabric apart, against the line model."""
    rec = _run(case, False, record=True)
    rec.launch_ptr = np.concatenate(([0], np.cumsum([k["ctas"] for k in rec.launches])))
    h = _run(case, kernel, far=far)
    _, _, p, _, _, _, P, C, L, parts, G = case  # noqa: N806
    want, during, _ = model(rec, p, kernel, P, 1, C, L, h.bytes_per_word, parts, G, far=far)
    assert got(h) == want and h.far_copy == far
    assert [w["during_bytes"] for w in h.dram_writes] == during


def test_far_copy_is_checked():
    with pytest.raises(InputError, match="far_copy"):
        Machine(far_copy="nowhere")
    assert Machine().far_copy == "both"  # the model as built stays the default


def test_one_dtype_and_one_line_size_is_todays_count():
    """Every array at one element size (fp32 throughout, the statistics' own): pricing by kernel dtype moves exactly
    the uniform (today's) words at every level, forward and split-KV; with one partition given explicitly, too."""
    p = _prob(2, 4, 2, 9, 21, 8, q="fp32")
    for kw in (dict(), dict(splits=3)):
        flash2 = iosim.Schedule("flash2", Br=4, Bc=5, **kw)
        a = hierarchy(flash2, problem=p, M=100_000, device=Machine(P=3, C=160, L=8))
        b = hierarchy(
            flash2, problem=p, M=100_000, element_bytes="kernel", device=Machine(P=3, C=160, L=8, partitions=1)
        )
        assert got(a) == got(b) and a.dram_bytes == b.dram_bytes == 4 * a.dram
        assert {n: c.word_bytes for n, c in b.per_array.items()} == dict.fromkeys(b.per_array, 4)


def test_the_gqa_partials_are_at_qs_dtype():
    """dKpart, dVpart: FlashAttention-2 allocates them with q.options(); the one convention, kernel_dtype."""
    p = _prob(1, 4, 2, 8, 8, 8, q="bf16", kv="fp8", o="fp32")
    assert [kernel_dtype(p, n) for n in ("dKpart", "dVpart", "dK", "dV", "dQ", "D", "L", "dq_accum", "dQ_out")] == [
        "bf16", "bf16", "fp8", "fp8", "fp32", "fp32", "fp32", "fp32", "fp32"]  # fmt: skip
    h = hierarchy(
        iosim.Schedule("flash2", Br=4, Bc=4),
        problem=p,
        M=100_000,
        backward=True,
        element_bytes="kernel",
        device=Machine(P=2, C=256, L=8),
    )
    assert (h.per_array["dKpart"].word_bytes, h.per_array["dK"].word_bytes) == (2, 1)
    assert h.per_array["dKpart"].bytes("l2_update") == 2 * h.per_array["dKpart"].l2_update > 0


def test_dq_accumulation_is_one_four_byte_reduction_per_element():
    """flash2's backward adds dQ_i into its fp32 accumulator atomically: in kernel bytes the main kernel's loads of
    dQ are gone and its stores are reductions (their own column, 4 bytes each); the memset still writes it."""
    p = _prob(1, 2, 2, 12, 12, 8)
    kw = dict(problem=p, M=100_000, backward=True, device=Machine(P=2, C=0, L=8))
    u = hierarchy(iosim.Schedule("flash2", Br=4, Bc=4), **kw)
    k = hierarchy(iosim.Schedule("flash2", Br=4, Bc=4), element_bytes="kernel", **kw)
    memset = 2 * 12 * 8  # the dQ accumulator of both heads, zeroed
    Tc = 3  # column blocks: each adds its contribution to every row block's dQ_i  # noqa: N806
    assert u.per_array["dQ"].l2_read == u.per_array["dQ"].l2_update - memset == Tc * memset
    assert (k.per_array["dQ"].l2_read, k.per_array["dQ"].l2_update) == (0, memset)
    assert k.per_array["dQ"].l2_reduce == Tc * memset and k.per_array["dQ"].bytes("l2_reduce") == 4 * Tc * memset
    # no L2: a reduction is a DRAM read and a write of each element, the words of the schedule's load and store
    assert (k.per_array["dQ"].dram_read, k.per_array["dQ"].dram_update) == (Tc * memset, memset + Tc * memset)
    assert "L2 reduce" in k.table() and "L2 reduce" not in u.table()


class Hand:
    """A hand-made scheduler: each launch's blocks reversed, each CTA's requests reversed (the main kernel's), and
    the given delays and static slots (aligned with the reversed blocks)."""

    def __init__(self, launch_ptr, delay=None, static=None, reverse_requests=True):
        self.launch_ptr, self.delay, self.static, self.reverse = launch_ptr, delay, static, reverse_requests
        self.calls = []

    def plan(self, k, blocks, cut, declared):
        self.calls.append((k, len(blocks)))
        lo, hi = int(self.launch_ptr[k]), int(self.launch_ptr[k + 1])
        order = None
        if self.reverse:
            order = np.arange(len(cut.requests))
            for c in range(int(declared.launch_ptr[k]), int(declared.launch_ptr[k + 1])):
                s, e = int(declared.cta_ptr[c]), int(declared.cta_ptr[c + 1])
                order[s:e] = order[s:e][::-1]
        pick = lambda x: None if x is None else x[lo:hi]  # noqa: E731
        return blocks[::-1], order, pick(self.delay), pick(self.static)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static-slots"])
def test_scheduler_hooks_delay_static_slots_and_orders_agree_with_the_model(static):
    case = ("flash2", True, _prob(1, 2, 1, 12, 12, 8), 4, 4, "per-head", 2, 96, 8, 2, 1)
    rec = _run(case, False, record=True)
    launch_ptr = np.concatenate(([0], np.cumsum([k["ctas"] for k in rec.launches])))
    n = len(rec.blocks)
    delay = (np.arange(n) * 37) % 53
    slots = (np.arange(n) * 5 + 1) % 2 if static else None
    hand = Hand(launch_ptr, delay, slots)
    h = _run(case, True, scheduler=hand)
    assert [k for k, _ in hand.calls] == list(range(len(rec.launches)))
    # the same plan, applied by the test to the unscheduled stream
    from types import SimpleNamespace

    from iosim.hierarchy.ctas import Cut

    blocks = np.concatenate([rec.blocks[launch_ptr[k] : launch_ptr[k + 1]][::-1] for k in range(len(launch_ptr) - 1)])
    req = rec.cut.requests.copy()
    cta_ptr = rec.declared.cta_ptr
    for c in range(len(cta_ptr) - 1):
        req[cta_ptr[c] : cta_ptr[c + 1]] = req[cta_ptr[c] : cta_ptr[c + 1]][::-1]
    planned = SimpleNamespace(trace=rec.trace, per_array=rec.per_array, cut=Cut(req, rec.cut.piece_ptr, None),
                              blocks=blocks, declared=rec.declared, launch_ptr=launch_ptr,
                              launches=rec.launches)  # fmt: skip
    want, during, _ = model(planned, case[2], True, 2, 1, 96, 8, h.bytes_per_word, 2, 1, delay, slots)
    assert got(h) == want and [w["during_bytes"] for w in h.dram_writes] == during
    plain = _run(case, True)
    assert got(plain) != got(h)  # the plan changed the stream the L2 saw


def test_static_slots_on_one_slot_run_the_blocks_one_after_another():
    """Every block of every launch on slot 0 of 3: the L2 sees each CTA's requests whole, in launch order, as one
    SM running one block at a time does."""
    case = ("flash2", False, _prob(1, 2, 2, 12, 12, 8), 4, 4, "per-head", 3, 96, 8, 1, 1)

    class OneSlot:
        def plan(self, k, blocks, cut, declared):
            return blocks, None, None, np.zeros(len(blocks), np.int64)

    h = _run(case, False, record=True, scheduler=OneSlot())
    one = hierarchy(
        iosim.Schedule("flash2", Br=4, Bc=4),
        problem=case[2],
        M=100_000,
        record=True,
        device=Machine(P=1, C=96, L=8, blocks_per_sm=1),
    )
    assert np.array_equal(h.record, one.record) and got(h) == got(one)


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        (lambda k, b, c, d: (b[:-1], None, None, None), "reordering"),
        (lambda k, b, c, d: (b, None, -np.ones(len(b)), None), "non-negative"),
        (lambda k, b, c, d: (b, None, None, np.full(len(b), 9)), "static_slot"),
        (lambda k, b, c, d: (b, None, None, np.r_[0, -np.ones(len(b) - 1)]), "every block or for none"),
        (lambda k, b, c, d: (b, np.arange(len(c.requests))[::-1], None, None), "request_order"),
        (lambda k, b, c, d: b, "must return"),
    ],
)
def test_a_bad_plan_is_one_line_naming_the_scheduler(plan, says):
    sched = type("S", (), {"plan": staticmethod(plan)})()
    with pytest.raises(InputError) as e:
        hierarchy(
            iosim.Schedule("flash2", Br=4, Bc=4),
            N=12,
            d=8,
            M=100_000,
            H_q=2,
            scheduler=sched,
            device=Machine(P=2, C=64, L=4),
        )
    assert e.value.parameter == "scheduler" and says in str(e.value)


@dataclass(frozen=True)
class TwoPartitions(Device):
    l2_partitions: int = 2


@pytest.mark.parametrize(
    ("kw", "parameter"),
    [
        (dict(partitions=0), "l2_partitions"),
        (dict(partitions=5, P=4), "l2_partitions"),
        (dict(partitions=2, policy="opt"), "policy opt"),
        (dict(partitions=2, C=4, L=4), "C (L2 words)"),
        (dict(home_lines=0), "home_lines"),
        (dict(element_bytes="fp8"), "element_bytes"),
        (dict(element_bytes="kernel", problem=None), "element_bytes"),
        (dict(element_bytes="kernel", L=1), "L (line words)"),  # a 2-byte line cannot hold an fp32 statistic
    ],
)
def test_bad_levels_name_the_parameter(kw, parameter):
    args = dict(problem=_prob(1, 2, 2, 8, 8, 8), M=100_000)
    machine = dict(P=4, C=64, L=4)
    for k in ("P", "C", "L", "partitions", "home_lines"):
        if k in kw:
            machine[k] = kw.pop(k)
    args.update(kw)
    if args.get("problem") is None:
        args.update(problem=None, N=8, d=8)
    with pytest.raises(InputError) as e:
        hierarchy(iosim.Schedule("flash2", Br=4, Bc=4), **args, device=Machine(**machine))
    assert e.value.parameter == parameter


def test_a_device_with_two_partitions_uses_them_when_asked():
    """partitions="device" takes a device's l2_partitions (read with getattr: a device without the field has one);
    the default, one partition, is the single shared L2 of the same figures."""
    base = device("H100")
    two = TwoPartitions(*(getattr(base, f) for f in ("name", "sms", "smem_per_sm_bytes", "smem_per_block_bytes",
                                                     "l2_bytes", "l2_line_bytes")))  # fmt: skip
    kw = dict(problem=_prob(1, 2, 2, 64, 64, 16), M=4096)
    flash2 = iosim.Schedule("flash2", Br=16, Bc=16)
    h = hierarchy(flash2, **kw, device=Machine(two, P=4, C=1024, partitions="device"))
    assert h.l2_partitions == 2 and h.as_dict()["fabric"] > 0
    one = hierarchy(flash2, **kw, device=Machine(two, P=4, C=1024))
    plain = hierarchy(flash2, **kw, device=Machine(P=4, C=1024, L=64, blocks_per_sm=one.blocks_per_sm))
    assert one.l2_partitions == 1 and got(one) == got(plain) and one.as_dict()["fabric"] == 0


def test_cli_dtypes_and_partitions(capsys):
    from iosim.cli import main

    args = ["hierarchy", "flash2", "--N", "12", "--d", "8", "--heads", "2", "--M", "100000", "--Br", "4", "--Bc", "4",
            "--P", "2", "--C", "128", "--L", "8", "--backward"]  # fmt: skip
    assert main([*args, "--dtype-q", "bf16", "--l2-partitions", "2", "--json"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert d["element_bytes"] == "kernel" and d["l2_partitions"] == 2 and d["per_array"]["dQ"]["word_bytes"] == 4
    assert d["per_array"]["dQ"]["l2_reduce"] > 0 and d["fabric_bytes"] == sum(
        a["fabric_bytes"] for a in d["per_array"].values())  # fmt: skip
    assert sum(w["with_flush_bytes"] for w in d["dram_writes"]) == sum(
        a["dram_update_bytes"] for a in d["per_array"].values())  # fmt: skip
    assert main([*args, "--dtype-q", "bf16", "--l2-partitions", "2"]) == 0
    out = capsys.readouterr().out
    assert "L2 reduce" in out and "bytes/word" in out and "DRAM writes during the kernels" in out
    assert main([*args, "--dtype-q", "bf16", "--bytes-per-word", "4"]) == 2
    assert "--bytes-per-word" in capsys.readouterr().err
    assert main([*args, "--l2-partitions", "3"]) == 2  # more partitions than the 2 SMs
    assert "l2_partitions" in capsys.readouterr().err
