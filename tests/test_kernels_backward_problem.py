"""``iosim kernel --like flash2-backward`` over a whole problem: the project's Triton backward
(iosim/kernels/examples/triton_flash2_bwd.py) launched with B > 1, H > 1 and GQA (per-head: expanded dKpart, dVpart
and the group sum; packed: one program per column block and KV head) against ``io_model.flash2_backward_problem``,
per array and to the word, with the numerics against the float64 reference."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

from iosim.cli import main  # noqa: E402
from iosim.kernels import Whole, block_sizes, compare, count_batch  # noqa: E402
from iosim.theory import io_model  # noqa: E402

FILE = str(Path(__file__).parents[1] / "iosim" / "kernels" / "examples" / "triton_flash2_bwd.py")
CASES = {  # (launcher, params): N ragged where the packed rows do not straddle heads under causal skipping
    "per-head GQA causal ragged": ("launch", dict(N=50, d=16, Br=16, Bc=32, B=2, H=4, kv_heads=2, causal=True)),
    "per-head MQA": ("launch", dict(N=40, d=8, Br=16, Bc=16, B=1, H=3, kv_heads=1)),
    "MHA batch": ("launch", dict(N=40, d=8, Br=16, Bc=16, B=3, H=2)),
    "packed GQA causal": ("launch_packed", dict(N=64, d=16, Br=16, Bc=32, B=2, H=4, kv_heads=2, causal=True)),
    "packed GQA ragged": ("launch_packed", dict(N=50, d=8, Br=16, Bc=16, B=1, H=4, kv_heads=2)),
}


@pytest.fixture(scope="module")
def runs():
    jobs = [(FILE, name, params) for name, params in CASES.values()]
    return dict(zip(CASES, count_batch(jobs, "triton"), strict=True))


@pytest.mark.parametrize("case", CASES)
def test_the_backward_over_a_problem_equals_the_closed_form_per_array(runs, case):
    counts, numbers, arrays = runs[case]
    p = CASES[case][1]
    blocks = block_sizes(counts, "flash2-backward", p["d"], numbers)
    assert blocks == {"Br": p["Br"], "Bc": p["Bc"]}
    whole = Whole(B=p["B"], H_kv=p.get("kv_heads"))
    cmp = compare(counts, "flash2-backward", p["N"], p["d"], p["Br"], p["Bc"], p.get("causal", False), heads=p["H"],
                  arrays=arrays, scale=numbers["scale"], whole=whole)  # fmt: skip
    assert cmp.equal and cmp.extra_words == 0, cmp.table()
    assert cmp.numerics_ok, cmp.numerics
    g = p["H"] // p.get("kv_heads", p["H"])
    assert cmp.gqa == (None if g == 1 else "packed" if CASES[case][0] == "launch_packed" else "per-head")
    names = {"Q", "K", "V", "O", "dO", "L", "D", "dQ", "dK", "dV"}
    assert set(counts.per_array) == (names | {"dKpart", "dVpart"} if cmp.gqa == "per-head" else names)


def test_the_model_is_the_problem_closed_form_and_the_compulsory_floor(runs):
    from iosim.spec.problem import Problem

    counts, _, _ = runs["per-head GQA causal ragged"]
    p = Problem(B=2, H_q=4, H_kv=2, N_q=50, N_k=50, d_qk=16, causal=True)
    pred = io_model.flash2_backward_problem(p, 16, 32, "per-head")
    cmp = compare(counts, "flash2-backward", 50, 16, 16, 32, True, heads=4, whole=Whole(B=2, H_kv=2))
    assert {r.array: (r.model_reads, r.model_writes) for r in cmp.rows} == {
        k: (c.reads, c.writes) for k, c in pred.per_array.items()
    }
    assert cmp.lower_bound == sum(p.compulsory_backward().values())
    assert cmp.M == io_model.flash2_backward_problem_working_set(16, 16, 16, 32)
    # K and V: each of the g = 2 query heads of a KV head loads its K_j, V_j: B H_q N d words
    assert counts.per_array["K"].reads == 2 * 4 * 50 * 16


def test_the_cli_reads_batch_and_kv_heads_off_the_launcher(capsys):
    rc = main(["kernel", FILE, "--N", "40", "--d", "8", "--Br", "16", "--Bc", "16", "--B", "2", "--H", "4",
               "--kv-heads", "2", "--like", "flash2-backward", "--no-numerics"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert "batch=2 kv-heads=2 (per-head)" in out and "1x the closed form" in out
    assert "dKpart" in out and "g = 2 times per KV head: per-head" in out


def test_paged_backward_is_one_line(capsys):
    rc = main(["kernel", FILE, "--N", "40", "--d", "8", "--Br", "16", "--Bc", "16", "--H", "2", "--page-size", "16",
               "--like", "flash2-backward", "--no-numerics"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == (
        "iosim: error: --page-size is modelled for flash2 and decode-splitkv, not the backward, got 16"
    )
