"""The H100's predictions as the H200 measured them, and the next H200 lease's predictions
(experiments/bench/hierarchy_h200.py): the docs block is the script's output from the stored files, the measured
side is the stored Nsight Compute rows summed here, the predictions file is well formed and carries the stored runs,
and the probe's figures on the H200 preset follow from the L2's capacity and the partitions' hash, counted here."""

from __future__ import annotations

import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "bench"))
import gpu_predictions  # noqa: E402
import hierarchy_h200 as h  # noqa: E402

MARK = re.compile(r"<!-- hierarchy-h200 -->\n(.*?)\n<!-- /hierarchy-h200 -->", re.S)
MIB = 1 << 20


def test_the_docs_block_is_the_scripts_output_from_the_stored_files():
    block = MARK.search((ROOT / "docs" / "hierarchy-hardware.md").read_text())
    assert block, "docs/hierarchy-hardware.md has no generated hierarchy-h200 block"
    assert block.group(1).strip() == h.block().strip()


def test_the_measured_side_is_the_stored_rows_without_pytorchs_copies():
    """fa2-bwd (label 2): its three FlashAttention kernels' sums, the two at:: copies left out; the ratio is theirs."""
    data = json.loads(h.MEASURED.read_text())
    label = [x["id"] for x in data["labels"]].index("fa2-bwd")
    rows = [x for x in data["launches"] if x["label"] == label]
    flash = [x for x in rows if "pytorch_flash::" in x["kernel"]]
    assert len(rows) == 5 and len(flash) == 3
    red = sum(x["lts__t_sectors_op_red.sum"] + x["lts__t_sectors_op_atom.sum"] for x in flash) * 32
    got = {(r["id"], r["level"]): r for r in h.comparison()}
    row = got[("fa2-bwd", "l2_reduction")]
    assert row["measured"] == red and row["ratio"] == red / row["predicted"]
    probe = got[("l2-probe-40MiB", "dram_read")]
    (x,) = [x for x in data["launches"] if x["label"] == [y["id"] for y in data["labels"]].index("l2-probe-40MiB")]
    assert probe["measured"] == x["dram__bytes_read.sum"] and h.verdict(probe["ratio"]) == "miss"
    assert h.verdict(1.09) == "hit" and h.verdict(0.89) == "miss" and h.verdict(None) == "not measured"


def test_the_predictions_file_is_well_formed_and_carries_the_stored_runs():
    entries = gpu_predictions.load(h.PREDICTIONS)
    ids = {e["id"] for e in entries}
    assert {f"l2-probe-{mb}MiB" for mb in (40, 48, 56, 64, 72, 96)} <= ids
    assert {"iosim-fwd-causal-ascending", "cudnn-decode-gqa-packed", "fig2-gpt2-fa2-fwd-causal",
            "fig2-gpt2-fa2-bwd-causal"} <= ids  # fmt: skip
    runs = json.loads(h.RUNS.read_text())["runs"]
    keys = h.run_keys()
    for e in entries:
        assert e["model"] == f"far_copy={h.PRIMARY}"
        assert e["predicted"] == h._predicted(runs[f"{keys[e['id']]} | {h.PRIMARY}"])
        assert {f"far_copy={v}" for v in h.VARIANTS if v != h.PRIMARY} <= set(e["alternatives"])
        if e["backend"] == "copy":
            assert e["bytes"] == int(e["id"][len("l2-probe-") : -len("MiB")]) * MIB
    assert "l1_reduction" in next(e for e in entries if e["id"] == "fig2-gpt2-fa2-bwd-causal")["predicted"]


def test_the_predictions_file_is_the_scripts_output_from_the_stored_runs():
    """Registered is what ``hierarchy_h200.py predictions`` makes of the stored runs (its date aside)."""
    assert h.predictions()["entries"] == json.loads(h.PREDICTIONS.read_text())["entries"]


def _far_lines(nbytes: int) -> int:
    """Lines of the probe's buffer that its reader's SM reads from the other partition: line x is read by CTA
    (x // 8) mod 1056 (8 warps a CTA, one line a warp, grid-stride), every CTA resident at once on slot = CTA, SM slot
    mod 132, partition SM x 2 // 132; its home is (x // 16) mod 2 (runs of 16 lines)."""
    ctas, sms = 132 * 8, 132
    far = 0
    for x in range(nbytes // 128):
        sm = ((x // 8) % ctas) % sms
        far += (x // 16) % 2 != sm * 2 // sms
    return far


def test_the_probes_fabric_is_its_far_lines_read_once_or_twice():
    """8 MiB fits every variant: read once from DRAM; the far lines cross the fabric once where the reader keeps a
    copy (both, near, shared) and on both reads where it keeps none (home)."""
    far = _far_lines(8 * MIB) * 128
    for variant, times in (("both", 1), ("near", 1), ("shared", 1), ("home", 2)):
        got = h.h100.copy_probe(8 * MIB, 2, "H200", variant)
        assert got["dram_read"] == 8 * MIB, variant
        assert got["fabric_reads_only"] == got["l2_read_from_fabric"] == times * far, variant


def test_a_copy_in_both_partitions_overflows_the_h200_at_48_mib():
    """Each 30 MiB partition serves half the SMs, so 24 MiB of a 48 MiB buffer; keeping the other half's far lines
    too (both: 12 MiB more) makes 36 MiB, past 30, and a cyclic re-read through an LRU misses on every line (2x);
    one copy per line (near) is 24 MiB: read once."""
    assert h.h100.copy_probe(48 * MIB, 2, "H200", "both")["dram_read"] == 2 * 48 * MIB
    assert h.h100.copy_probe(48 * MIB, 2, "H200", "near")["dram_read"] == 48 * MIB


@pytest.mark.slow
def test_past_the_capacity_lru_refetches_the_whole_buffer():
    """72 MiB exceeds 60 MiB however the lines are placed: LRU misses on every line of the second read (2x), the
    figure the H200's 1.62x at 64 MiB is not (its replacement is not LRU)."""
    for variant in h.VARIANTS:
        assert h.h100.copy_probe(72 * MIB, 2, "H200", variant)["dram_read"] == 2 * 72 * MIB, variant


def test_the_registered_h200_predictions_are_never_rewritten_in_place(capsys):
    before = h.PREDICTIONS.read_bytes()
    assert h.main(["predictions"]) == 2
    assert "is registered" in capsys.readouterr().err and h.PREDICTIONS.read_bytes() == before
