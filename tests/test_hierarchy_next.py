"""The predictions registered for the next H200 lease (experiments/bench/hierarchy_next.py): well formed, at the
resident CTAs the binary's registers give, never rewritten in place, and the model's own figures (one launch
re-derived here)."""

from __future__ import annotations

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "bench"))
import gpu_predictions  # noqa: E402
import hierarchy_next as nx  # noqa: E402


def test_the_file_is_well_formed_and_covers_each_size_causal_and_not():
    entries = gpu_predictions.load(nx.PREDICTIONS)
    got = {(e["N_q"], e["causal"]) for e in entries}
    assert got == {(n, c) for n in nx.SIZES for c in (True, False)}
    for e in entries:
        assert e["blocks_per_sm"] == 2 and e["backend"] == "sdpa-flash" and e["model"] == "far_copy=both"
        assert set(e["alternatives"]) == {f"far_copy={v}" for v in nx.VARIANTS[1:]}
        # the model's compulsory floor: Q, K and V read once (fp16), never less
        assert e["predicted"]["dram_read"] >= 3 * 32 * e["N_q"] * 128 * 2


def test_a_registered_figure_is_the_models():
    e = next(x for x in json.loads(nx.PREDICTIONS.read_text())["entries"] if x["id"] == "fa2-fwd-causal-N8192")
    r = nx.run(8192, True, "both")
    assert r.blocks_per_sm == 2
    assert {k: int(v) for k, v in nx.h100.levels(r).items() if k in e["predicted"]} == e["predicted"]


def test_the_registered_file_is_never_rewritten_in_place(capsys):
    before = nx.PREDICTIONS.read_bytes()
    assert nx.main(["predictions"]) == 2
    assert "is registered" in capsys.readouterr().err and nx.PREDICTIONS.read_bytes() == before


def test_the_docs_table_is_the_registered_file():
    import re

    text = (ROOT / "docs" / "hierarchy-hardware.md").read_text()
    block = re.search(r"<!-- hierarchy-next -->\n(.*?)\n<!-- /hierarchy-next -->", text, re.S)
    assert block and block.group(1).strip() == nx.show().strip()
