"""Arguments that share storage (issue 45): each access is credited to the argument its pointer was derived from,
not to whichever argument's address range holds it. K and V as views of one cache tensor, interleaved
(``kv.split(d, -1)``) or nested (V = ``K[..., :d_v]``, an MLA latent's first columns), count exactly what separate
buffers count, array by array, against a hand count written here; views read alike are a note, a store through one
view of words loaded through another a warning naming both (never a stray access or out of bounds).

Launchers: tests/_kernel_views.py (Triton) and tests/_kernel_views_numba.py (numba.cuda), kernels written for these
tests. Sizes are tiny (programs run one after another under the interpreters).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from iosim.kernels.counting import Recorder, access_problem

HERE = Path(__file__).parent
FILE = str(HERE / "_kernel_views.py")
NUMBA_FILE = str(HERE / "_kernel_views_numba.py")


# --- the recorder alone: attribution by origin ---------------------------------------------------------------------
def test_an_access_through_a_view_is_the_views_even_inside_a_tighter_argument():
    rec = Recorder()
    k = rec.register_argument("K", 1000, 64, 4)  # 16 elements
    v = rec.register_argument("V", 1000, 32, 4)  # its first 8: nested
    rec.begin_program((0,))
    rec.access(1000 + 4 * np.arange(16), "r", 4, origin=k)  # by address, 8 of these would be V's (the tighter range)
    rec.access(1000 + 4 * np.arange(8), "r", 4, origin=v)
    counts = rec.result("triton", 0.0)
    assert {n: a.reads for n, a in counts.per_array.items()} == {"K": 16, "V": 8}
    assert counts.overlap == [{"kernel": "kernel", "arrays": ["K", "V"], "kind": "read/read", "words": 8}]
    assert access_problem(counts) is None


def test_one_tensor_passed_as_two_arguments_is_two_arrays():
    rec = Recorder()
    rec.begin_launch("k")
    a = rec.register_argument("A", 1000, 64, 4)
    b = rec.register_argument("B", 1000, 64, 4)
    assert a != b
    rec.begin_program((0,))
    rec.access(1000 + 4 * np.arange(16), "r", 4, origin=a)
    rec.access(1000 + 4 * np.arange(4), "w", 4, origin=b)
    counts = rec.result("triton", 0.0)
    assert (counts.per_array["A"].reads, counts.per_array["B"].writes) == (16, 4)
    assert counts.overlap == [{"kernel": "k", "arrays": ["B", "A"], "kind": "write/read", "words": 4}]


# --- Triton kernels under the interpreter --------------------------------------------------------------------------
def _hand(H, N, d, dv):
    """The decode kernel by hand: per head, q (d words) once, every key row of K (d) and of V (dv) once (masked
    lanes past N move nothing), o (dv) stored once."""
    return {"Q": (H * d, 0), "K": (H * N * d, 0), "V": (H * N * dv, 0), "O": (0, H * dv)}


@pytest.fixture(scope="module")
def triton_runs():
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    from iosim.kernels import count_batch

    p = dict(N=40, d=16, H=2, block_n=16)
    jobs = [(FILE, "launch_separate", {**p, "dv": 8}), (FILE, "launch_nested", {**p, "dv": 8}),
            (FILE, "launch_separate", {**p, "dv": 16}), (FILE, "launch_interleaved", {**p, "dv": 16}),
            (FILE, "launch_write_overlap", {})]  # fmt: skip
    return count_batch(jobs, "triton", arrays=False, strict=False)


def _words(counts):
    return {k: (a.reads, a.writes) for k, a in counts.per_array.items()}


@pytest.mark.parametrize("i, dv", [(0, 8), (1, 8), (2, 16), (3, 16)])
def test_views_of_one_cache_count_what_separate_buffers_count_array_by_array(triton_runs, i, dv):
    counts = triton_runs[i][0]
    assert _words(counts) == _hand(2, 40, 16, dv)
    assert counts.out_of_bounds_lanes == 0 and counts.stray_lanes == 0 and access_problem(counts) is None


def test_nested_views_read_alike_are_a_note_interleaved_halves_share_no_word(triton_runs):
    nested, interleaved = triton_runs[1][0], triton_runs[3][0]
    assert nested.overlap == [{"kernel": "decode", "arrays": ["K", "V"], "kind": "read/read", "words": 2 * 40 * 8}]
    assert interleaved.overlap == []  # K's and V's words interleave, none is both


def test_a_store_through_one_view_of_words_loaded_through_another_is_an_overlap_naming_both(triton_runs):
    counts = triton_runs[4][0]
    assert _words(counts) == {"Src": (32 * 8, 0), "Dst": (0, 32 * 8)}  # rows x dv, by hand
    assert counts.overlap == [{"kernel": "scale_into", "arrays": ["Dst", "Src"], "kind": "write/read", "words": 256}]
    assert access_problem(counts) is None


def test_the_command_line_warns_of_the_overlap_in_one_line_and_counts(cli):
    pytest.importorskip("triton")
    rc, out, err = cli(f"{FILE}:launch_write_overlap", "--N", "32", "--d", "16")
    assert rc == 0 and "out of bounds" not in out + err and "stray" not in out + err
    assert err.strip().splitlines() == [
        "iosim: warning: overlap: kernel scale_into stored 256 words through Dst that it loaded through Src (views of "
        "one buffer): what a load sees depends on the order the programs run"
    ]


# --- numba.cuda under the simulator --------------------------------------------------------------------------------
def test_numba_cuda_attributes_by_the_wrapper_the_access_went_through():
    pytest.importorskip("numba")
    from iosim.kernels import count_batch

    names = ["launch_separate", "launch_nested", "launch_interleaved"]
    runs = count_batch([(NUMBA_FILE, n, {}) for n in names], "numba-cuda", arrays=False, strict=False)
    N, d = 4, 4  # thread i reads K's row i (d words) and V's row i (dv words), writes out[i]
    for (counts, _, _), dv in zip(runs, (2, 2, 4), strict=True):
        assert _words(counts) == {"K": (N * d, 0), "V": (N * dv, 0), "out": (0, N)}
        assert access_problem(counts) is None
    assert runs[1][0].overlap == [{"kernel": "row_sums", "arrays": ["K", "V"], "kind": "read/read", "words": N * 2}]
    assert runs[2][0].overlap == []


# --- the headline over all arrays ------------------------------------------------------------------------------------
def test_the_headline_counts_every_array_and_names_those_the_model_lacks(cli):
    pytest.importorskip("triton")
    blocks = ["--Br", "16", "--Bc", "16"]
    rc, out, err = cli(f"{FILE}:launch_scores", "--N", "32", "--d", "16", "--like", "flash2", *blocks, "--no-numerics")
    assert rc == 0, err
    # by hand: 2 programs of 16 rows; each reads its Q rows (16 x 16) and all of K (32 x 16) and its mask rows
    # (16 x 32), and writes its S rows (16 x 32). flash2's closed form (N = 32, d = 16, Br = Bc = 16): Q 512,
    # K, V 2 x 512 each, O 512, L 32 = 3,104 words. The kernel: 512 + 1,024 + 1,024 + 1,024 = 3,584 words.
    kernel, model, extra = 512 + 2 * 512 + 2 * 16 * 32 + 2 * 16 * 32, 512 + 2 * 1024 + 512 + 32, 2 * 2 * 16 * 32
    line = next(x for x in out.splitlines() if x.startswith("total"))
    assert line.startswith("total (all arrays)")
    assert (f"{kernel / model:.4g}x the closed form over all arrays" in line and f"({extra:,} words in S, mask: not in "
            f"the model; the model's arrays alone {(kernel - extra) / model:.4g}x)" in line)  # fmt: skip


# --- the launcher's own output; a launcher returning None ----------------------------------------------------------
def test_a_launchers_printed_output_is_shown_before_the_counts(cli):
    pytest.importorskip("triton")
    rc, out, err = cli(f"{FILE}:launch_prints", "--N", "16", "--d", "4")
    assert rc == 0, err
    assert out.splitlines()[0] == "launching scale_into on 16 rows"
    table = {w[0]: w[1:3] for w in map(str.split, out.splitlines()) if w and w[0] in ("X", "Y")}
    assert table == {"X": ["64", "0"], "Y": ["0", "64"]}  # 16 rows x 4 read through X, stored through Y


def test_a_launcher_returning_none_is_refused_in_one_line(cli):
    pytest.importorskip("triton")
    rc, out, err = cli(f"{FILE}:launch_returns_none", "--N", "16", "--d", "4")
    assert rc == 2 and err.strip().splitlines() == [
        "iosim: error: launcher launch_returns_none must return the dict of its arrays by name (Q, K, V, O, ...; as "
        "the model names them) for the counts to be named and checked: it returned None"
    ]


# --- docs/kv-cache.md: every pasted block is what its command prints ------------------------------------------------
DOC = HERE.parent / "docs" / "kv-cache.md"


def _doc_blocks() -> list[tuple[str, str]]:
    import re

    text = DOC.read_text()
    return [
        (m.group(1), m.group(2)) for m in re.finditer(r"```console\n\$ (iosim kernel [^\n]*)\n(.*?)```", text, re.S)
    ]


def _normal(text: str) -> str:
    """The output less what changes from run to run: the seconds a count took, Numba's first-use notice."""
    import re

    lines = [x for x in text.splitlines() if not x.startswith("iosim: compiling Numba kernels")]
    return re.sub(r"counted in \d+\.\d+ s", "counted in T s", "\n".join(lines)).strip()


@pytest.mark.parametrize(
    "i", [pytest.param(i, marks=() if i == 0 else pytest.mark.slow) for i in range(len(_doc_blocks()))]
)
def test_the_docs_blocks_are_what_their_commands_print(cli, i):
    pytest.importorskip("triton")
    import shlex

    command, printed = _doc_blocks()[i]
    args = shlex.split(command)[2:]
    rc, out, err = cli(*[str(HERE.parent / a) if a.startswith("tests/") else a for a in args])
    assert rc == 0 and _normal(out + err) == _normal(printed), out + err


def test_the_docs_page_has_every_case():
    assert len(_doc_blocks()) == 6
