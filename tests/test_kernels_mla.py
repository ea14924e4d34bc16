"""`iosim kernel` over every problem option `iosim run` has (issue 45): --dv, --mla shared|naive, --dtype-q/kv/o,
--gqa. A small MLA-style Triton kernel written for these tests (tests/_kernel_views.py: one latent cache K, V its
first d_v columns as a view, the g query heads' rows packed) is held against iosim's `--mla shared --gqa packed`
(V read with K's tiles) and `--mla naive` (V loaded again) closed forms, equal array by array to a hand count
written here; its outputs within iosim.check's rule.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

from iosim.kernels.comparison import Whole, compare  # noqa: E402

FILE = str(Path(__file__).with_name("_kernel_views.py"))
N, d, dv, H, N_q, Br, Bc = 40, 32, 16, 4, 5, 8, 16


def _hand(mla: str) -> dict[str, tuple[int, int]]:
    """The kernel by hand: R = H N_q packed query rows in Tr = ceil(R / Br) programs; each program loads its Q rows
    (d words each, as two parts), every key row of K (d words, as two parts), V's rows again (d_v) only when naive,
    and stores its rows of O (d_v) and L (1)."""
    R = H * N_q
    Tr = math.ceil(R / Br)
    out = {"Q": (R * d, 0), "K": (Tr * N * d, 0), "O": (0, R * dv), "L": (0, R)}
    if mla == "naive":
        out["V"] = (Tr * N * dv, 0)
    return out


@pytest.fixture(scope="module")
def runs():
    from iosim.kernels import count_batch

    jobs = [(FILE, "launch_mla", dict(N=N, d=d, dv=dv, H=H, N_q=N_q, Br=Br, Bc=Bc, mla=m)) for m in ("shared", "naive")]
    return dict(zip(("shared", "naive"), count_batch(jobs, "triton"), strict=True))


@pytest.mark.parametrize("mla", ["shared", "naive"])
def test_the_mla_kernel_equals_the_closed_form_and_the_hand_count_array_by_array(runs, mla):
    counts, numbers, arrays = runs[mla]
    assert {k: (a.reads, a.writes) for k, a in counts.per_array.items()} == _hand(mla)
    cmp = compare(counts, "flash2", N, d, Br, Bc, heads=H, arrays=arrays, scale=numbers["scale"],
                  whole=Whole(N_q=N_q, d_v=dv, mla=mla), gqa="packed")  # fmt: skip
    model = {r.array: (r.model_reads, r.model_writes) for r in cmp.rows if r.model_reads is not None}
    assert {k: v for k, v in model.items() if v != (0, 0)} == _hand(mla)
    assert cmp.equal and cmp.numerics_ok, cmp.table()


def test_the_command_line_takes_run_s_problem_options_and_states_them(cli):
    rc, out, err = cli(f"{FILE}:launch_mla", "--N", str(N), "--d", str(d), "--dv", str(dv), "--H", str(H), "--N-q",
                       str(N_q), "--mla", "shared", "--gqa", "packed", "--like", "flash2", "--dtype-q", "fp32",
                       "--dtype-kv", "fp32", "--dtype-o", "fp32")  # fmt: skip
    assert rc == 0 and "error" not in err and "warning" not in err, err  # (a first run may say it compiles Numba)
    assert "kv-heads=1 (packed) N_q=5 d_v=16 mla=shared dtypes q=fp32 kv=fp32 o=fp32" in out
    assert out.count("equal to flash2's closed form to the word") == 4  # Q, K, O, L (V: no words in either)
    R = H * N_q
    words = R * d + math.ceil(R / Br) * N * d + R * dv + R  # Q, K, O, L
    assert f"note: bytes at the problem's dtypes: equal per array, {4 * words:,} in the model's arrays" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--like", "block-sparse", "--mask", "causal", "--mla", "shared"], "--mla is modelled for --like flash2"),
        (["--dv", "0"], "--dv must be"),
        (["--dtype-kv", "fp7"], "--dtype-kv must be one of"),
        (["--dtype-q", "fp16"], "--dtype-q is read by --like"),
    ],
)
def test_problem_options_out_of_range_are_one_line_exit_2(cli, capsys, extra, message):
    try:
        rc, _, err = cli(f"{FILE}:launch_mla", "--N", str(N), "--d", str(d), "--no-numerics", *extra)
    except SystemExit as e:  # argparse's own refusal of a value (one line, exit 2)
        rc, err = e.code, capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err, err


# --- --like flash2 --mask: a windowed kernel without BlockMask metadata ---------------------------------------------
def _window_hand(N, d, W, Br, Bc):
    """The window kernel by hand: row block i (rows r0 .. r1 - 1) walks key blocks from the one holding
    max(r0 - W + 1, 0) to the one holding r1 - 1, loading each block's keys (clipped at N) of K and V; Q read and
    O, L written once per row."""
    keys = 0
    for r0 in range(0, N, Br):
        r1 = min(r0 + Br, N)
        for j in range(max(r0 - W + 1, 0) // Bc, (r1 - 1) // Bc + 1):
            keys += min(Bc, N - j * Bc)
    return {"Q": (N * d, 0), "K": (keys * d, 0), "V": (keys * d, 0), "O": (0, N * d), "L": (0, N)}


def test_a_sliding_window_kernel_equals_flash2_under_the_mask_skipping_empty_tiles(cli):
    rc, out, err = cli(f"{FILE}:launch_window", "--N", "40", "--d", "16", "--like", "flash2", "--mask",
                       "window:12:causal", "--json")  # fmt: skip
    import json

    doc = json.loads(out)
    assert rc == 0 and "error" not in err and "warning" not in err, err  # (a first run may say it compiles Numba)
    got = {k: (a["reads"], a["writes"]) for k, a in doc["counts"]["per_array"].items()}
    assert got == _window_hand(40, 16, 12, 16, 8)
    rows = doc["comparison"]["rows"]
    assert {r["array"]: (r["model_reads"], r["model_writes"]) for r in rows} == got and doc["comparison"]["equal"]
    assert doc["comparison"]["bound"] == "the problem's compulsory traffic under the mask"


@pytest.mark.parametrize("mla", [None, "shared", "naive"])
def test_split_kv_decoding_over_an_mla_cache_by_hand(mla):
    from iosim.kernels.comparison import decode_splitkv

    # 40 keys in 3 splits of whole 8-key blocks (chunk 16: splits of 16, 16, 8 keys); 4 query heads packed on one
    # latent head (one unit of R = 4 rows): each split reads its length (1 word), q (4 x 32), its keys' K rows (32
    # words) and, unless V is read with K, V rows (16 words); writes 4 x 16 partial outputs and 4 logsumexps, which
    # the combine reads; O is 4 x 16. Over the splits: every key once.
    got = decode_splitkv(40, 32, 3, 8, H_q=4, H_kv=1, gqa="packed", d_v=16, mla=mla)
    want = {"lengths": (3, 0), "indptr": (3 * 2, 0), "Q": (3 * 4 * 32, 0), "K": (40 * 32, 0),
            "V": (0 if mla == "shared" else 40 * 16, 0), "O_part": (3 * 4 * 16, 3 * 4 * 16), "L_part": (3 * 4, 3 * 4),
            "O": (0, 4 * 16), "kv_indices": (40, 0)}  # fmt: skip
    assert {k: (c.reads, c.writes) for k, c in got.items()} == want
