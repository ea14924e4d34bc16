"""The causal forward's gap, hypothesis by hypothesis (experiments/bench/hierarchy_causal.py): the docs block is the
script's output from the stored runs, the measured side is the stored Nsight rows, the stored clocks are the
dispatch of each CTA's words counted here, a start-up time delays every CTA by exactly its words, the spilled frames
are the binary's, and a scaled-down run re-derives its stored figure."""

from __future__ import annotations

import json
import pathlib
import re
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "bench"))
import hierarchy_causal as h  # noqa: E402

MARK = re.compile(r"<!-- hierarchy-causal -->\n(.*?)\n<!-- /hierarchy-causal -->", re.S)


def _stored() -> dict:
    return json.loads(h.STORED.read_text())["runs"]


def test_the_docs_block_is_the_scripts_output_from_the_stored_runs():
    block = MARK.search((ROOT / "docs" / "hierarchy-hardware.md").read_text())
    assert block, "docs/hierarchy-hardware.md has no generated hierarchy-causal block"
    assert block.group(1).strip() == h.table().strip()


def test_every_variant_is_stored_and_the_source_model_is_the_mechanisms_tables():
    runs = _stored()
    assert {v.key for v in h.variants()} <= set(runs)
    mech = json.loads(h.h100.STORED.read_text())["runs"]["forward causal | + FA2's walk"]
    assert runs["source-H100"]["dram_read"] == mech["dram_read"] and runs["source-H100"]["blocks_per_sm"] == 2


def test_the_measured_side_is_the_stored_ncu_rows():
    ncu = json.loads(h.h100.NCU.read_text())["launches"]
    (fwd,) = [x for x in ncu if x["label"] == 2 and "flash_fwd_kernel" in x["kernel"]]
    h200 = json.loads((ROOT / "experiments/bench/gpu_h200/predictions.json").read_text())
    label = [x["id"] for x in h200["labels"]].index("fa2-fwd-causal")
    (fwd200,) = [x for x in h200["launches"] if x["label"] == label and "flash_fwd_kernel" in x["kernel"]]
    assert h.measured() == {"H100": fwd["dram__bytes_read.sum"], "H200": fwd200["dram__bytes_read.sum"]}
    (nc,) = [x for x in ncu if x["label"] == 0 and "flash_fwd_kernel" in x["kernel"]]
    assert h.measured_durations()["H100"] == fwd["gpu__time_duration.sum"] / nc["gpu__time_duration.sum"]
    assert h.measured(causal=False)["H100"] == nc["dram__bytes_read.sum"]
    # the reuse profile's start, every load of the launch, is what the SMs loaded (both launches, to the byte)
    assert h.load_bytes() == fwd["l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"]
    assert h.load_bytes(causal=False) == nc["l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"]


def _words(heads: int, causal: bool) -> list[int]:
    """Each CTA's words, counted here: row block i loads Q_i (128 x 128), then K_j and V_j (64 x 128 each) for
    j = 2i + 1 down to 0 (causal) or all 512 column blocks, and stores O_i (128 x 128) and L_i (128)."""
    out = []
    for _ in range(heads):
        for i in range(256):
            blocks = 2 * i + 2 if causal else 512
            out.append(128 * 128 + blocks * 2 * 64 * 128 + 128 * 128 + 128)
    return out


def _end(words: list[int], delays: list[int], slots: int) -> int:
    """List scheduling, written here: each CTA in order takes the slot that frees first."""
    free = [0] * slots
    end = 0
    for w, dl in zip(words, delays, strict=True):
        s = min(range(slots), key=free.__getitem__)
        free[s] += dl + w
        end = max(end, free[s])
    return end


def test_the_stored_clocks_are_the_dispatch_of_each_ctas_words():
    """The model's clock (stored per run) is list scheduling of the CTAs' words on 264 slots, with the scheduler's
    seeded stalls (numpy's default_rng([seed, 0]), 0..W words) where a variant has them."""
    runs = _stored()
    words = _words(32, causal=True)
    assert runs["source-H100"]["clock_words"] == _end(words, [0] * len(words), 264)
    w = 16 * 2 * 64 * 128
    stalls = np.random.default_rng([0, 0]).integers(0, w + 1, len(words)).tolist()
    assert runs["stall-16"]["clock_words"] == _end(words, stalls, 264)
    flat = _words(32, causal=False)
    v = next(v for v in h.variants() if v.key == "stall-16")
    assert h.noncausal_end(v, 264) == _end(flat, stalls, 264)
    assert h.noncausal_end(h.variants()[0], 264) == 32 * flat[0]  # 8,192 equal CTAs on 264 slots: 32 rounds


def test_a_start_up_time_delays_every_cta_by_its_words():
    """On one slot the launch's end moves by exactly (CTAs x the start-up words); the counts do not move."""
    from iosim.hierarchy import Machine
    from iosim.hierarchy.scheduler import Scheduler
    from iosim.hierarchy.simulate import hierarchy

    kw = dict(N=512, d=64, M=16384, causal=True, device=Machine(P=1, C=4096, L=8, blocks_per_sm=1))
    plain = hierarchy("flash2", scheduler=Scheduler(walk="descending"), **kw)
    late = hierarchy("flash2", scheduler=h.FixedStart(Scheduler(walk="descending"), 1000), **kw)
    assert late.clock[0] - plain.clock[0] == 1000 * plain.ctas
    assert late.dram_read == plain.dram_read and late.ctas == plain.ctas > 1


def test_the_spilled_frames_are_the_binarys():
    res = json.loads(h.h100.RESOURCES.read_text())["kernels"]
    (k,) = [k for k in res if k["ncu_name"] == h.h100.main_kernel(h.LAUNCH)]
    assert (k["stack_bytes"], k["threads"], k["resident"]["H100"]["blocks_per_sm"]) == (
        h.STACK_BYTES,
        h.THREADS,
        h.CTAS_PER_SM,
    )
    assert h._frame_bytes(66) == k["stack_bytes"] * k["threads"] * 2 * 66


def test_the_verdict_rule():
    assert h.verdict([(1.1, True)], 2.5) == "explains"
    assert h.verdict([(1.1, False), (2.4, True)], 2.5) == "closes only at an unsourced value"
    assert h.verdict([(2.0, False)], 2.5) == "narrows"  # |log 2.0| = 0.69 < 0.9 x |log 2.5| = 0.82
    assert h.verdict([(2.3, True), (2.9, False)], 2.5) == "ruled out"  # 0.83 and 1.06: neither below 0.82
    assert h.verdict([(0.5, False)], 2.5) == "narrows"  # past the measurement by less than the source model is short


def test_a_scaled_down_run_is_rederived():
    """H = 8 (a quarter of the heads, each as measured), the source model: its stored DRAM read, recomputed."""
    v = next(v for v in h.variants() if v.key == "scaled-source")
    got = h.run(v)
    assert h.h100.levels(got)["dram_read"] == _stored()["scaled-source"]["dram_read"]
    assert got.clock[0] == _end(_words(8, causal=True), [0] * 2048, 264)


def test_the_probe_curve_is_the_stored_probe():
    """x = the buffer over the H200's 60 MiB, the miss fraction = DRAM read / buffer - 1, from the stored rows."""
    data = json.loads(h.PROBE.read_text())
    ids = [x["id"] for x in data["labels"]]
    (row,) = [x for x in data["launches"] if ids[x["label"]] == "l2-probe-64MiB"]
    xs, miss = h.probe_curve()
    k = list(xs).index(64 / 60)
    assert miss[k] == row["dram__bytes_read.sum"] / (64 << 20) - 1 and list(xs) == sorted(xs) and len(xs) == 9


def test_the_probe_estimate_under_an_lru_curve_is_the_model_at_that_size(monkeypatch):
    """With the miss curve of an LRU L2 (none below its size, all above) the estimate is the model's own run at that
    size: the reuse profile's bins above it sum to its misses beyond the compulsory."""
    import pytest

    monkeypatch.setattr(h, "probe_curve", lambda path=h.PROBE: (np.array([0, 0.999, 1.001, 3]), np.array([0, 0, 1, 1])))
    stored = json.loads(h.STORED.read_text())
    runs = stored["runs"]
    assert h.probe_estimate(stored, "H100") == pytest.approx(runs["source-H100"]["dram_read"], rel=1e-12)
    assert h.probe_estimate(stored, "H200") == pytest.approx(runs["l2-60MiB"]["dram_read"], rel=1e-12)
    assert runs["l2-60MiB"]["dram_read"] == runs["source-H200"]["dram_read"]  # the H200 is the H100 with 60 MiB
