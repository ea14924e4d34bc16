"""Resident CTAs computed inside hierarchy() from the launch's kernel (``kernel=``, with a device), and sector-granular
fills inside the L2's lines.

The independent occupancy here is written from the per-SM limits as the sources give them (CUDA C++ Programming
Guide, "Technical Specifications per Compute Capability" and the "Shared Memory" sections of compute capability 8.x
and 9.0; the allocation granularities of cuda_occupancy.h), not from iosim's tables."""

from __future__ import annotations

import heapq
import json
import pathlib
import sys
from dataclasses import replace

import numpy as np
import pytest

import iosim
from iosim import InputError
from iosim.hierarchy import Machine, hierarchy

ROOT = pathlib.Path(__file__).resolve().parents[1]
KIB = 1024
# (SMs, shared memory per SM, per block with the opt-in): the H100 SXM and A100 whitepapers' SM counts, the
# Programming Guide's 228 / 164 KB per SM and 227 / 163 KB per block.
SM = {"H100": (132, 228 * KIB, 227 * KIB), "A100": (108, 164 * KIB, 163 * KIB)}
REGS_PER_SM, THREADS_PER_SM, BLOCKS_PER_SM = 65536, 2048, 32  # cc 8.0 and 9.0 alike
RESERVED = 1 * KIB  # per block, for system use (cc 8.0 and later)
REG_UNIT, SUB_PARTITIONS, SMEM_UNIT = 256, 4, 128  # cuda_occupancy.h's granularities


def occupancy(dev: str, threads: int, registers: int | None, smem: int) -> tuple[int, set]:
    """(blocks per SM, the limits that bind) from the sources' rules; registers None: not counted."""
    _, smem_sm, _ = SM[dev]
    warps = -(-threads // 32)
    limits = {"threads": THREADS_PER_SM // (32 * warps), "blocks": BLOCKS_PER_SM,
              "shared": smem_sm // (-(-(smem + RESERVED) // SMEM_UNIT) * SMEM_UNIT)}  # fmt: skip
    if registers is not None:
        per_warp = -(-(registers * 32) // REG_UNIT) * REG_UNIT
        limits["registers"] = (REGS_PER_SM // SUB_PARTITIONS // per_warp) * SUB_PARTITIONS // warps
    best = min(limits.values())
    return best, {k for k, v in limits.items() if v == best}


TINY = dict(N=32, d=16, M=512)  # a launch of 4 row blocks: cheap, the machine is what is tested

KERNELS = [  # (threads, registers, shared memory bytes per block)
    (128, None, 65536),
    (128, 173, 64480),
    (256, 64, 16384),
    (1024, 32, 0),
    (96, 255, 4096),
    (64, 40, 100 * KIB),
    (32, 16, 512),
]


@pytest.mark.parametrize("dev", ["H100", "A100"])
def test_blocks_per_sm_come_from_the_kernels_resources(dev):
    for threads, registers, smem in KERNELS:
        want, binds = occupancy(dev, threads, registers, smem)
        kernel = dict(threads=threads, smem_bytes=smem, name="k")
        if registers is not None:
            kernel["registers"] = registers
        r = hierarchy("flash2", **TINY, device=Machine(dev, kernel=kernel))
        assert r.blocks_per_sm == want, (dev, threads, registers, smem)
        limiter = r.resident.split(": ", 1)[1]
        assert set(limiter.split(";")[0].split(",")) == binds, r.resident
        assert limiter.endswith("registers unknown (upper bound)") == (registers is None)
        assert r.waves == [-(-r.ctas // (SM[dev][0] * want))]
        assert r.as_dict()["resident"] == r.resident


def test_the_counts_are_those_of_the_same_blocks_per_sm_given():
    """The kernel's figure runs the clock with that many slots: the same counts as giving the number."""
    kernel = dict(threads=128, registers=173, smem_bytes=64480)
    a = hierarchy("flash2", N=256, d=16, M=512, B=2, H_q=3, device=Machine("H100", C=2048, kernel=kernel))
    b = hierarchy("flash2", N=256, d=16, M=512, B=2, H_q=3, device=Machine("H100", C=2048, blocks_per_sm=2))
    assert a.blocks_per_sm == b.blocks_per_sm == 2
    assert (a.dram_read, a.dram_update, a.clock) == (b.dram_read, b.dram_update, b.clock)
    assert b.resident == "given"


def fa2_fwd_smem(d, bm, bn, eb):
    return bm * d * eb + 2 * bn * d * eb  # Q tile, then K and V tiles (kernel_traits.h, kSmemSize)


def fa2_bwd_smem(d, bm, bn, eb):
    return 3 * bm * d * eb + 2 * bn * d * eb + 2 * bm * bn * eb  # Q double-buffered, dO; K, V; dS, P


@pytest.mark.parametrize(
    ("name", "threads", "smem"),
    [
        ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, 0, 0, cutlass::half_t>", 128,
         fa2_fwd_smem(128, 128, 64, 2)),
        ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, 0, 0, "
         "cutlass::half_t>", 256, fa2_bwd_smem(128, 64, 128, 2)),
        ("flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, 0, 0, cutlass::bfloat16_t>", 128,
         fa2_fwd_smem(128, 64, 128, 2)),
    ],
)  # fmt: skip
def test_flashattention2_kernels_by_name_give_an_upper_bound(name, threads, smem):
    want, binds = occupancy("H100", threads, None, smem)
    r = hierarchy("flash2", **TINY, device=Machine("H100", kernel=name))
    assert r.blocks_per_sm == want and r.resident.endswith("registers unknown (upper bound)")
    assert set(r.resident.split(": ", 1)[1].split(";")[0].split(",")) == binds


def test_the_h100_experiments_blocks_per_sm_are_hierarchys_own():
    """experiments/bench/hierarchy_h100.py no longer passes blocks per SM: the stored runs' figures are what
    hierarchy() computes from each launch's main kernel (its name as Nsight Compute stored it, its registers as the
    binary has them: 2 CTAs per SM for the forwards, 1 for the backwards)."""
    sys.path.insert(0, str(ROOT / "experiments" / "bench"))
    import hierarchy_h100 as h

    stored = json.loads(h.STORED.read_text())["runs"]
    for name in ("forward", "forward causal", "backward", "backward causal"):
        r = hierarchy("flash2", **TINY, device=Machine("H100", kernel=h.main_kernel_resources(name)))
        assert r.blocks_per_sm == stored[f"{name} | + resident CTAs"]["blocks_per_sm"], name
        assert r.blocks_per_sm == (1 if "backward" in name else 2), name
    r = hierarchy("flash2", **TINY, device=Machine("H100", kernel=h.IOSIM_FLASH2_FORWARD))
    pred = {e["id"]: e for e in json.loads(h.PREDICTIONS.read_text())["entries"]}
    assert r.blocks_per_sm == pred["iosim-fwd-causal-ascending"]["blocks_per_sm"] == 2
    assert r.resident.endswith(": registers")


def test_a_passed_value_wins_up_to_what_the_resources_allow():
    kernel = dict(threads=128, registers=173, smem_bytes=64480)  # 2 per SM, registers bind
    r = hierarchy("flash2", **TINY, device=Machine("H100", kernel=kernel, blocks_per_sm=1))
    assert r.blocks_per_sm == 1 and r.resident.startswith("given (at most 2 ")
    with pytest.raises(InputError) as e:
        hierarchy("flash2", **TINY, device=Machine("H100", kernel=kernel, blocks_per_sm=3))
    assert e.value.parameter == "blocks_per_sm" and "at most 2" in str(e.value)


def test_without_a_kernel_the_shared_memory_of_m_words_decides_as_before():
    r = hierarchy("flash2", N=256, d=64, device="H100", M=16384)  # 32 KiB blocks: 228 KiB / 33 KiB = 6
    assert r.blocks_per_sm == 6 and r.resident.startswith("shared memory of M words")
    r = hierarchy("flash2", N=32, d=16, M=512, device=Machine(C=64))
    assert r.blocks_per_sm == 1 and r.resident == "one per SM (no device)"


@pytest.mark.parametrize(
    ("kw", "parameter"),
    [
        (dict(kernel=dict(threads=128, smem_bytes=0), C=64), "kernel"),  # no device
        (dict(kernel=dict(threads=128), device="H100"), "kernel"),
        (dict(kernel=dict(threads=128, smem_bytes=0, regs=3), device="H100"), "kernel"),
        (dict(kernel=5, device="H100"), "kernel"),
        (dict(kernel="flash_attn_kernel", device="H100"), "kernel name"),
        (dict(kernel=dict(threads=0, smem_bytes=0), device="H100"), "kernel threads"),
        (dict(kernel=dict(threads=128, smem_bytes=228 * KIB), device="H100"), "smem_bytes"),
        (dict(kernel=dict(threads=128, smem_bytes=0, registers=256), device="H100"), "registers"),
        (dict(kernel=dict(threads=1024, smem_bytes=0, registers=255), device="H100"), "kernel"),  # fits no SM
    ],
)
def test_bad_kernels_name_the_parameter(kw, parameter):
    with pytest.raises(InputError) as e:  # where the Machine is made, or (its occupancy) where the launch runs
        hierarchy("flash2", **TINY, device=Machine(**kw))
    assert e.value.parameter == parameter


def test_cli_kernel(capsys):
    from iosim.cli import main

    args = ["hierarchy", "flash2", "--N", "32", "--d", "16", "--M", "512", "--device", "H100"]
    assert main([*args, "--kernel", "threads=128,smem=64480,registers=173"]) == 0
    out = capsys.readouterr().out
    assert "blocks per SM: 2 (given kernel's resources on the H100: registers)" in out
    assert main([*args, "--kernel", "threads=128,smem=65536"]) == 0
    assert "blocks per SM: 3 (" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # argparse's own refusal: one line, exit 2
        main([*args, "--kernel", "threads=128"])
    assert e.value.code == 2 and "--kernel needs threads= and smem=" in capsys.readouterr().err
    assert main([*args, "--kernel", "threads=128,smem=0,registers=999"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# ------------------------------------------------------------------------------------------ sectors inside L2 lines
SIZE = {"fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int32": 4}


def kernel_bytes(p, name):
    """Each array's bytes per word as the kernels move them (the test's own table of the convention)."""
    if name in ("Q", "dKpart", "dVpart"):
        return SIZE[p.dtype_q]
    if name in ("K", "V", "dK", "dV"):
        return SIZE[p.dtype_kv]
    if name in ("O", "dO", "dQ_out"):
        return SIZE[p.dtype_o]
    return 4  # dQ's accumulator, L, l, m, D, the split partials, the page table


def sector_model(rec, p, kernel, P, C, L, bpw, sector, parts=1, G=1, far="both"):  # noqa: N803, C901
    """Per-array counts of the launch ``rec`` (a recorded line-fill run: its cut, blocks, launches) through a line LRU
    per partition whose lines hold valid and dirty sector sets, written from the rules (iosim.hierarchy.l2's
    docstring, "Sectors" and "Partitions"): a read fills its sectors not yet valid; a write validates and dirties
    its sectors without a fetch; a reduction fills its missing sectors and dirties them; a line evicted or left at
    the end writes back its dirty sectors. ``far``: where a line read from the far partition is kept (both; near:
    the reader's only, the home serving the sectors it holds; home: the home's only; shared: the reader's only, a
    miss served by any other partition's valid sectors before DRAM), a read's state changes only where it allocates.
    """
    names = list(rec.trace.names) + [n for n in ("dq_accum", "dQ_out") if n in rec.per_array]
    shapes = dict(rec.trace.shapes)
    shapes.update({n: shapes["dQ"] for n in ("dq_accum", "dQ_out") if n in rec.per_array})
    owner = {n: n for n in names}
    if p.latent:
        owner["V"] = "K"
    owner["dq_accum"] = "dQ"
    eb = {n: (kernel_bytes(p, n) if kernel else bpw) for n in names}
    lw = {n: L * bpw // eb[owner[n]] for n in names}  # words per line
    sw = {n: sector // eb[owner[n]] for n in names}  # words per sector
    cap = C // L // parts
    caches = [dict() for _ in range(parts)]  # key -> [valid sectors, dirty sectors]; insertion order = LRU order
    cnt = {n: dict.fromkeys(("read", "update", "reduce", "fill", "wb", "fabric"), 0) for n in names}

    def touch(part, key, sectors, dirty):
        """The sectors that miss; the line becomes most recent, the oldest is evicted if over capacity."""
        c = caches[part]
        if key in c:
            valid, dirt = c.pop(key)
            c[key] = [valid | sectors, dirt | (sectors if dirty else set())]
            return sectors - valid
        c[key] = [set(sectors), set(sectors) if dirty else set()]
        if len(c) > cap:
            old = next(iter(c))
            _, dirt = c.pop(old)
            cnt[old[0]]["wb"] += len(dirt) * sw[old[0]]
        return set(sectors)

    def line(w, a, q, key, home, sectors):
        words = sw[owner[a]]
        if w == 0:
            if home != q and far == "home":
                cnt[a]["fabric"] += len(sectors) * words
                cnt[a]["fill"] += len(touch(home, key, sectors, False)) * words
                return
            miss = touch(q, key, sectors, False)
            if far == "shared" and miss:
                peers = set().union(*(caches[x][key][0] for x in range(parts) if x != q and key in caches[x]))
                cnt[a]["fabric"] += len(miss if home != q else miss & peers) * words
                cnt[a]["fill"] += len(miss - peers) * words
                return
            if miss and home != q:
                cnt[a]["fabric"] += len(miss) * words
                if far == "near":
                    miss = miss - caches[home][key][0] if key in caches[home] else miss
                else:
                    miss = touch(home, key, miss, False)
            cnt[a]["fill"] += len(miss) * words
            return
        if home != q:
            cnt[a]["fabric"] += len(sectors) * words
            if w == 1 and far != "home":
                touch(q, key, sectors, False)
        miss = touch(home, key, sectors, True)
        if w == 2:
            cnt[a]["fill"] += len(miss) * words
        for x in range(parts):
            if x != home and (w == 2 or x != q):
                caches[x].pop(key, None)

    def request(req, blk, q):
        w, a, r0, nr, c0, nc, words = (int(x) for x in req)
        name = names[a]
        cnt[name][("read", "update", "reduce")[w]] += words
        o = owner[name]
        copy = blk[2] if o in ("K", "V") else (blk[3] if o == "page_table" else blk[1])
        stride = shapes[o][1]
        ranges = ([(r0 * stride, (r0 + nr) * stride)] if nc == stride
                  else [(r * stride + c0, r * stride + c0 + nc) for r in range(r0, r0 + nr)])  # fmt: skip
        for w0, w1 in ranges:
            for x in range(w0 // lw[o], (w1 - 1) // lw[o] + 1):
                lo, hi = max(w0, x * lw[o]) - x * lw[o], min(w1, (x + 1) * lw[o]) - x * lw[o]
                line(w, name, q, (o, copy, x), (x // G) % parts, set(range(lo // sw[o], (hi - 1) // sw[o] + 1)))

    cta_ptr = rec.declared.cta_ptr
    launch_ptr = [0, *np.cumsum([k["ctas"] for k in rec.launches])]
    slots, t0 = P * rec.blocks_per_sm, 0
    for k in range(len(launch_ptr) - 1):
        lo, hi = int(launch_ptr[k]), int(launch_ptr[k + 1])
        atomic = kernel and "dQ" in rec.launches[k]["atomic"]
        rows_of = {}
        for i in range(lo, hi):
            c = int(rec.blocks[i, 0])
            rows = rec.cut.requests[cta_ptr[c] : cta_ptr[c + 1]].copy()
            if atomic:  # the kernel adds into dQ: no load of it, each store a reduction
                dq = np.array([names[a] == "dQ" for a in rows[:, 1]], bool)
                rows = rows[~(dq & (rows[:, 0] == 0))]
                rows[np.array([names[a] == "dQ" for a in rows[:, 1]], bool) & (rows[:, 0] == 1), 0] = 2
            rows_of[i] = rows
        heap = [(t0, lo + s, s, 0) for s in range(min(slots, hi - lo))]
        waiting = list(range(lo + slots, hi))
        heapq.heapify(heap)
        t_end = t0
        while heap:
            t, i, s, j = heapq.heappop(heap)
            rows = rows_of[i]
            if j < len(rows):
                request(rows[j], rec.blocks[i], ((s % P) * parts) // P)
                t += int(rows[j, 6])
            if j + 1 < len(rows):
                heapq.heappush(heap, (t, i, s, j + 1))
                continue
            t_end = max(t_end, t)
            if waiting:
                heapq.heappush(heap, (t, waiting.pop(0), s, 0))
        t0 = t_end
    for c in caches:
        for key, (_, dirt) in c.items():
            cnt[key[0]]["wb"] += len(dirt) * sw[key[0]]
    return {n: c for n, c in cnt.items() if any(c.values())}


def counts(h):
    return {n: {"read": c.l2_read, "update": c.l2_update, "reduce": c.l2_reduce, "fill": c.l2_fill,
                "wb": c.l2_writeback, "fabric": c.fabric} for n, c in h.per_array.items()
            if any((c.l2_read, c.l2_update, c.l2_reduce, c.l2_fill, c.l2_writeback, c.fabric))}  # fmt: skip


def _prob(B, H_q, H_kv, N_q, N_k, d, q="bf16", kv=None, o=None, causal=False):  # noqa: N803
    return iosim.Problem(B=B, H_q=H_q, H_kv=H_kv, N_q=N_q, N_k=N_k, d_qk=d, dtype_q=q, dtype_kv=kv, dtype_o=o,
                         causal=causal)  # fmt: skip


# fmt: off
SECTOR_CASES = [  # (algorithm, backward, problem, Br, Bc, gqa, P, C, L, sector bytes, parts, G, kernel bytes)
    # rows of 12 bytes in lines of 16: most lines are covered in part, by two rows
    ("flash2", False, _prob(1, 2, 1, 12, 12, 6), 3, 5, "per-head", 2, 32, 8, 4, 1, 1, False),
    ("flash2", False, _prob(1, 2, 1, 12, 12, 6), 3, 5, "per-head", 2, 32, 8, 4, 2, 1, False),
    # fp32 statistics and outputs beside bf16 operands, a causal mask, sectors of 8 bytes
    ("flash2", False, _prob(2, 2, 2, 10, 11, 5, q="fp32", kv="bf16", o="fp16", causal=True), 3, 4, "per-head", 3,
     64, 8, 8, 2, 2, True),
    # the backward: dQ's fp32 accumulator reduced atomically, its conversion after
    ("flash2", True, _prob(1, 2, 2, 9, 9, 6), 4, 4, "per-head", 2, 48, 8, 4, 2, 1, True),
    ("flash2", True, _prob(1, 4, 2, 7, 9, 5, q="fp32", kv="bf16"), 3, 4, "per-head", 2, 96, 8, 4, 1, 1, True),
    ("flash1", False, _prob(1, 2, 2, 9, 9, 7), 4, 4, "per-head", 2, 32, 8, 4, 2, 1, False),
    # decoding-like: few query rows against many keys, GQA packed
    ("flash2", False, _prob(1, 4, 2, 3, 17, 6), 4, 4, "packed", 2, 40, 8, 4, 2, 1, True),
    # an L2 that keeps everything: every sector read is fetched once
    ("flash2", False, _prob(1, 1, 1, 9, 9, 7), 4, 4, "per-head", 2, 1 << 12, 8, 4, 1, 1, False),
]
# fmt: on


def _sector_run(case, sector, record=False, kernel=None, far="both"):
    alg, backward, p, Br, Bc, gqa, P, C, L, _, parts, G, kb = case  # noqa: N806
    kb = kb if kernel is None else kernel
    return hierarchy(
        iosim.Schedule(alg, Br=Br, Bc=Bc, gqa=gqa),
        problem=p,
        M=100_000,
        backward=backward,
        record=record,
        element_bytes="kernel" if kb else "uniform",
        device=Machine(
            P=P, C=C, L=L, blocks_per_sm=1, partitions=parts, home_lines=G, sector_bytes=sector, far_copy=far
        ),
    )


@pytest.mark.parametrize("case", SECTOR_CASES, ids=lambda c: f"{c[0]}-{'bwd' if c[1] else 'fwd'}-d{c[2].d_qk}-p{c[10]}")
def test_sector_fills_agree_with_an_independent_sector_model(case):
    rec = _sector_run(case, None, record=True, kernel=False)  # the schedule's request stream (uniform, lines)
    line = _sector_run(case, None, record=True)
    h = _sector_run(case, case[9], record=True)
    assert h.sector_bytes == case[9] and np.array_equal(h.record, line.record)  # fills do not move the clock
    alg, backward, p, Br, Bc, gqa, P, C, L, sector, parts, G, kernel = case  # noqa: N806
    want = sector_model(rec, p, kernel, P, C, L, h.bytes_per_word, sector, parts, G)
    assert counts(h) == want
    assert sum(w["with_flush_bytes"] for w in h.dram_writes) == h.level_bytes("dram_update")
    if C < 1 << 12:  # ragged rows in a small L2: sectors move other words than lines do
        assert counts(h) != counts(line)


@pytest.mark.parametrize("far", ["near", "home", "shared"])
@pytest.mark.parametrize("case", [c for c in SECTOR_CASES if c[10] > 1], ids=lambda c: f"{c[0]}-d{c[2].d_qk}-{c[1]}")
def test_sectors_where_a_far_read_line_is_kept_agree_with_the_sector_model(case, far):
    """The far-copy variants (iosim.hierarchy.l2) with sectors, against the independent sector model."""
    rec = _sector_run(case, None, record=True, kernel=False)
    h = _sector_run(case, case[9], far=far)
    alg, backward, p, Br, Bc, gqa, P, C, L, sector, parts, G, kernel = case  # noqa: N806
    assert counts(h) == sector_model(rec, p, kernel, P, C, L, h.bytes_per_word, sector, parts, G, far=far)


def test_sectors_change_nothing_where_every_request_covers_whole_lines():
    """Rows of 8 words in lines of 8 words, tiles of 8 rows (the statistics' tiles 8 words): every request covers
    whole lines, so sectors fill what lines fill."""
    p = _prob(2, 4, 2, 32, 32, 8)
    kw = dict(problem=p, M=100_000, element_bytes="uniform")
    flash2, machine = iosim.Schedule("flash2", Br=8, Bc=8), Machine(P=3, C=64, L=8, partitions=2)
    line = hierarchy(flash2, **kw, device=machine)
    for sector in (2, 4, 8, 16):  # 16: one sector a line, lines
        assert counts(hierarchy(flash2, **kw, device=replace(machine, sector_bytes=sector))) == counts(line)


def test_the_device_sector_and_bad_sectors():
    r = hierarchy("flash2", **TINY, device=Machine("H100", sector_bytes="device"))
    assert r.sector_bytes == 32 and r.as_dict()["sector_bytes"] == 32
    assert hierarchy("flash2", device="H100", **TINY).sector_bytes is None  # the default: whole lines
    for machine, kw, parameter in (
        (dict(C=64, L=8, sector_bytes="device"), {}, "sector_bytes"),  # no device
        (dict(C=64, L=8, sector_bytes=3), {}, "sector_bytes"),  # does not divide the 16-byte line
        (dict(C=64, L=8, sector_bytes=32), {}, "sector_bytes"),  # larger than the line
        (dict(C=64, L=8, sector_bytes=True), {}, "sector_bytes"),
        (dict(C=64, L=64, sector_bytes=2), dict(bytes_per_word=4), "sector_bytes"),  # 128 sectors a line
        (dict(C=64, L=8, sector_bytes=4), dict(policy="opt"), "policy opt"),
    ):
        with pytest.raises(InputError) as e:
            hierarchy("flash2", N=32, d=16, M=512, **kw, device=Machine(**machine))
        assert e.value.parameter == parameter, (machine, kw)
    p = _prob(1, 1, 1, 8, 8, 8, q="fp32", kv="bf16")
    with pytest.raises(InputError) as e:  # a 2-byte sector cannot hold a 4-byte word of Q
        hierarchy("flash2", problem=p, M=100_000, element_bytes="kernel", device=Machine(C=64, L=8, sector_bytes=2))
    assert e.value.parameter == "sector_bytes"


def test_cli_sector_bytes(capsys):
    from iosim.cli import main

    args = ["hierarchy", "flash2", "--N", "12", "--d", "6", "--M", "4096", "--P", "2", "--C", "32", "--L", "8"]
    assert main([*args, "--sector-bytes", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["sector_bytes"] == 4
    want = hierarchy("flash2", N=12, d=6, M=4096, device=Machine(P=2, C=32, L=8, sector_bytes=4))
    assert d["dram"] == want.dram
    assert main([*args, "--sector-bytes", "4"]) == 0
    assert "by sectors of 4 bytes" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main([*args, "--sector-bytes", "x"])
    assert e.value.code == 2 and "--sector-bytes" in capsys.readouterr().err


def _h100_with_sectors(monkeypatch, names, models, N, decode):  # noqa: N803
    """The H100 experiment's models with sector fills (the preset's 32 bytes): cuDNN's decode at its full size gives
    the registered figures; the FA2 launches, scaled down to 2 heads of N (the same tiles, dtypes and machine), give
    every level as with whole lines."""
    from iosim.hierarchy import simulate as sim
    from iosim.hierarchy.machine import machine_of

    sys.path.insert(0, str(ROOT / "experiments" / "bench"))
    import hierarchy_h100 as h

    lines = sim.hierarchy

    def sectors(*args, device=None, **kw):  # the experiment's launch, its machine filling by the preset's sectors
        if len(args) == 3 and not isinstance(args[2], int):
            args, device = args[:2], args[2]
        return lines(*args, device=replace(machine_of(device), sector_bytes="device"), **kw)

    if decode:
        pred = {e["id"]: e for e in json.loads(h.PREDICTIONS.read_text())["entries"]}["cudnn-decode-gqa-packed"]
        monkeypatch.setattr(sim, "hierarchy", sectors)
        got = h.levels(h.run("decode GQA", h.MODELS[2]))
        assert {k: got[k] for k in pred["predicted"]} == pred["predicted"]
    small = {n: iosim.Problem(B=1, H_q=2, N=N, d=128, dtype_q="fp16", causal=h.LAUNCHES[n]["causal"]) for n in names}
    monkeypatch.setattr(h, "_problem", small.get)
    for name in small:
        for model in models or (*h.MODELS, *h.EXTRA):
            if model in h.EXTRA and name not in h.EXTRA[model]:
                continue
            monkeypatch.setattr(sim, "hierarchy", sectors)
            s = h.run(name, model)
            if s is None:
                continue
            assert s.sector_bytes == 32
            monkeypatch.setattr(sim, "hierarchy", lines)
            assert h.levels(s) == h.levels(h.run(name, model)), (name, model)


def test_sectors_move_no_h100_figure_fast_case(monkeypatch):
    _h100_with_sectors(monkeypatch, ("forward causal", "backward"), ("+ FA2's walk", "+ resident CTAs"), 512, False)


@pytest.mark.slow
def test_sectors_move_no_registered_h100_prediction(monkeypatch):
    """Every model of the experiment on the four FA2 launches at N = 1,024, and cuDNN's decode at full size (about
    5 minutes on the loaded 2-core machine)."""
    names = ("forward", "forward causal", "backward", "backward causal")
    _h100_with_sectors(monkeypatch, names, None, 1024, True)
