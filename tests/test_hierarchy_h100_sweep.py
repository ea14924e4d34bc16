"""The hierarchy held against the H100's sweep launches and FlashAttention's Figure 2, level by level
(experiments/bench/hierarchy_h100_sweep.py, hierarchy_fig2.py): the docs tables are the scripts' output from the
stored runs, the measured side is the stored Nsight data, the resident CTAs are the driver's, and a cheap launch
recomputed equals both the stored run and closed forms written here."""

from __future__ import annotations

import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "bench"))
import gpu_predictions  # noqa: E402
import hierarchy_fig2 as fig2  # noqa: E402
import hierarchy_h100_sweep as sw  # noqa: E402

DOC = (ROOT / "docs" / "hierarchy-hardware.md").read_text()


def _block(tag: str) -> str:
    m = re.search(rf"<!-- {tag} -->\n(.*?)\n<!-- /{tag} -->", DOC, re.S)
    assert m, f"docs/hierarchy-hardware.md has no generated {tag} block"
    return m.group(1).strip()


def test_the_docs_sweep_table_is_the_scripts_output_from_the_stored_runs():
    assert _block("hierarchy-h100-sweep") == sw.table().strip()


def test_the_docs_fig2_table_is_the_scripts_output_from_the_stored_runs():
    assert _block("hierarchy-fig2") == fig2.table().strip()


def test_every_sweep_configuration_is_stored():
    stored = json.loads(sw.STORED.read_text())["runs"]
    assert sorted(map(int, stored)) == list(range(41))


def test_the_measured_side_is_the_stored_ncu_data():
    """Label 9's phase 2, read here from the raw file: L2 bytes are 32 per lts sector, DRAM bytes as stored."""
    raw = json.loads(sw.NCU.read_text())["launches"]
    row = next(x for x in raw if x["label"] == 9 and "square_phase2_kernel[" in x["kernel"])
    m = sw.measured()[(9, "square_phase2_kernel")]
    assert m["l2_read"] == 32 * row["lts__t_sectors_op_read.sum"]
    assert m["l2_write"] == 32 * row["lts__t_sectors_op_write.sum"]
    assert (m["dram_read"], m["dram_write"]) == (row["dram__bytes_read.sum"], row["dram__bytes_write.sum"])
    assert len(sw.measured()) == len(raw) == 62


def test_resident_ctas_are_the_drivers_where_it_reported_the_same_launch():
    """occupancy.json holds the H100 driver's cuOccupancyMaxActiveBlocksPerMultiprocessor at some (kernel, d, M);
    where a sweep label has the same kernel, d, M and shared memory, its blocks per SM must be the driver's."""
    occ = json.loads(sw.OCCUPANCY.read_text())["rows"]
    driver = {(r["kernel"], r["d"], r["M"]): (r["driver blocks/SM"], r["dynamic smem"]) for r in occ
              if "driver blocks/SM" in r}  # fmt: skip
    checked = 0
    for cfg in sw.configurations():
        for k in cfg["kernels"]:
            got = driver.get((k, cfg["d"], cfg["M"]))
            if got and got[1] == cfg["resources"][k]["smem_bytes"]:
                assert cfg["blocks_per_sm"][k] == got[0], (cfg["label"], k)
                checked += 1
    assert checked >= 10


def test_a_cheap_launch_recomputed_equals_the_stored_run_and_the_closed_forms():
    """Label 29: flash2, d = 64, Br = 256, Bc = 64, 8 heads of N = 2048 in float32. Everything (12.6 MB) fits one
    25 MiB partition: DRAM reads Q, K, V once; the SMs load Q once and K, V once per row block; they store O and L;
    nothing is evicted, so nothing is written back during the kernel."""
    cfg = next(c for c in sw.configurations() if c["label"] == 29)
    got = sw.run(cfg)
    stored = json.loads(sw.STORED.read_text())["runs"]["29"]
    assert got["launches"] == stored["launches"] and got["blocks_per_sm"] == stored["blocks_per_sm"] == 1
    p = got["launches"]["flash2_forward_kernel"]
    BH, N, d, Tr = 8, 2048, 64, 2048 // 256  # noqa: N806
    assert p["dram_read"] == 3 * BH * N * d * 4
    assert p["two_level_load"] == p["l2_read"] == BH * (N * d + 2 * Tr * N * d) * 4
    assert p["l2_write"] == BH * (N * d + N) * 4
    assert p["dram_write"] == 0


def test_the_mask_bracket_is_the_kernels_mask():
    """flash2's block mask is one Tr x Tc int64 array for every head (algorithms/cuda/flash.py)."""
    cfg = next(c for c in sw.configurations() if c["label"] == 0)
    assert cfg["tiles"] == {"Br": 1, "Bc": 1}
    assert sw.mask_bytes(cfg) == (2048 * 2048 * 8, 8 * 2048 * 2048 * 8)


def test_the_fig2_predictions_are_registered_unchanged():
    """The H100 FlashAttention-2 rows of Fig. 2 are in the predictions file, as the stored runs give them."""
    entries = {e["id"]: e for e in gpu_predictions.load(gpu_predictions.DEFAULT_FILE)}
    runs = json.loads(fig2.STORED.read_text())["runs"]
    for r in (x for x in runs if x["device"] == "H100"):
        e = entries[fig2.entry_id(r)]
        assert (e["B"], e["H_q"], e["N_q"], e["d"], e["causal"]) == (64, 16, 1024, 64, True)
        assert e["predicted"] == fig2.levels(r)


def test_the_fig2_fa2_forward_is_its_closed_forms():
    """FA2's causal forward at GPT-2 medium (1024 heads of N = 1024, d = 64, fp16, 128 x 128 tiles): row block i
    loads Q_i once and K_j, V_j for j <= i (36 column blocks over the 8 row blocks); it stores O (fp16) and L
    (fp32); DRAM reads Q, K, V once. Blocks per SM by shared memory, written here from the Programming Guide's
    per-SM figures: (Q tile + K and V tiles) x 2 bytes + the 1 KiB the driver reserves per block, against 228 KiB
    (H100) and 164 KiB (A100) per SM."""
    runs = json.loads(fig2.STORED.read_text())["runs"]
    heads, tile = 64 * 16, 128 * 64 * 2  # bytes of one 128 x 64 fp16 tile
    smem = (128 + 2 * 128) * 64 * 2 + 1024
    for r in (x for x in runs if x["algorithm"] == "flash2" and not x["backward"]):
        assert r["two_level_load"] == heads * (8 * tile + 36 * 2 * tile)
        assert r["two_level_store"] == heads * (1024 * 64 * 2 + 1024 * 4)
        assert r["dram_read"] == 3 * heads * 1024 * 64 * 2
        assert r["blocks_per_sm"] == {"H100": 228 * 1024, "A100": 164 * 1024}[r["device"]] // smem
