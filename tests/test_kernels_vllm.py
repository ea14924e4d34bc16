"""vLLM 0.33.0's Triton paged decoding and MLA decoding (``vllm.v1.attention.ops.triton_decode_attention``) counted in
place (iosim/kernels/examples/vllm_decode.py), against a hand model of the kernel source written here, against
iosim's split-KV flash2 over the problem (``iosim run flash2 --Nq 1 --page-size P --splits S``, with ``--mla shared
--gqa packed`` for MLA) and against the decode-splitkv closed form, array by array; the outputs against a float64
reference computed here from the paged cache.

The vLLM wheel installs only without its dependencies (``pip install --no-deps vllm==0.33.0``: they pin a CUDA torch),
as .ci/run does, so every test here is ``ci_only``.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")
pytestmark = pytest.mark.ci_only

FILE = str(Path(__file__).parents[1] / "iosim" / "kernels" / "examples" / "vllm_decode.py")
# (launcher, params): grouped paged GQA with splits of whole 32-key blocks and 16-token pages; the per-head kernel
# (H_q = H_kv) with 25-key splits that cut pages; MLA shared and naive; MLA with an empty split (N = 5, 4 splits of 2)
CASES = {
    "gqa": ("launch", dict(N=128, d=32, splits=4, B=2, H=4, kv_heads=1, page_size=16)),
    "mha": ("launch", dict(N=100, d=16, splits=4, B=1, H=2, kv_heads=2, page_size=16)),
    "mla": ("launch_mla", dict(N=128, d=48, dv=32, splits=4, B=2, H=4, page_size=16, mla="shared")),
    "naive": ("launch_mla", dict(N=128, d=48, dv=32, splits=4, B=2, H=4, page_size=16, mla="naive")),
    "empty": ("launch_mla", dict(N=5, d=48, dv=32, splits=4, B=1, H=4, page_size=4, mla="shared")),
}


@pytest.fixture(scope="module")
def runs():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install --no-deps vllm==0.33.0; .ci/run)")
    from iosim.kernels import count_batch

    got = count_batch([(FILE, launcher, p) for launcher, p in CASES.values()], "triton")
    return dict(zip(CASES, got, strict=True))


def hand(N, d, splits, B, H, kv_heads=1, page_size=16, dv=None, mla=None):
    """The kernels by hand, from triton_decode_attention.py. A unit is one stage-1 program's heads: one query head
    when H_q = H_kv (``_fwd_kernel_stage1``), else a KV head's g <= 16 query heads (the grouped kernel; MLA has
    one latent head). A split is ceil(N / splits) keys. Stage 1, per (unit, split): the length (1 word) and q
    (R d words) always; a live split reads k_scale and v_scale (1 word each) and, per key, its page-table entry (1
    word: every lane loads its page's entry), K (d) and, unless MLA shared, V (d_v); it stores R (d_v + 1) words
    of attn_logits. Stage 2, per query head: the length, and (d_v + 1) words of each live split; stores O (d_v) and
    L (1). Returns (reads, writes) per array and the page-table words read at least once per program, summed."""
    dv = d if dv is None else dv
    grouped = H != kv_heads
    units, R = (B * kv_heads, H // kv_heads) if grouped else (B * H, 1)
    chunk = math.ceil(N / splits)
    spans = [(k * chunk, min(k * chunk + chunk, N)) for k in range(splits) if k * chunk < N]
    live = len(spans)
    per = {
        "Q": (units * splits * R * d, 0),
        "K": (units * N * d, 0),
        "page_table": (units * N, 0),
        "lengths": (units * splits + B * H, 0),
        "k_scale": (units * live, 0),
        "v_scale": (units * live, 0),
        "attn_logits": (B * H * live * (dv + 1), B * H * live * (dv + 1)),
        "O": (0, B * H * dv),
        "L": (0, B * H),
    }
    if mla != "shared":
        per["V"] = (units * N * dv, 0)
    pages = units * sum((end - 1) // page_size - start // page_size + 1 for start, end in spans)
    return per, pages


def _params(name):
    p = dict(CASES[name][1])
    return {**p, "dv": p.get("dv"), "mla": p.get("mla")}


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_decode_equals_the_hand_count_array_by_array(runs, name):
    counts, _, _ = runs[name]
    want, pages = hand(**_params(name))
    assert {k: (a.reads, a.writes) for k, a in counts.per_array.items()} == want
    assert counts.per_array["page_table"].distinct_reads == pages
    assert counts.kernels[0] == ("_fwd_kernel_stage1" if name == "mha" else "_fwd_grouped_kernel_stage1")


@pytest.mark.parametrize("name", ["gqa", "mha"])
def test_one_cache_tensor_counts_as_separate_buffers(runs, name):
    """vLLM's one cache tensor, split into K and V interleaved within each (token, head) row, counts exactly as K
    and V in buffers of their own: every array's reads, writes and distinct words, attributed by the pointer."""
    from iosim.kernels import count_batch

    launcher, params = CASES[name]
    ((apart, _, _),) = count_batch([(FILE, launcher, {**params, "one_cache": False})], "triton")
    one = runs[name][0]

    def table(counts):
        return {k: (a.reads, a.writes, a.distinct_reads, a.distinct_writes) for k, a in counts.per_array.items()}

    assert table(one) == table(apart)
    assert one.per_array["K"].reads == hand(**_params(name))[0]["K"][0]


def _reference(arrays, numbers):
    """float64 decoding from the paged cache: token t of sequence b is row t % P of page table[b, t // P]."""
    q, cache_k, cache_v, table = (np.asarray(arrays[k], dtype=np.float64) for k in ("Q", "K", "V", "page_table"))
    B, H, _ = q.shape
    P, g = numbers["page_size"], H // numbers["kv_heads"]
    N = table.shape[1] * P if "N" not in numbers else numbers["N"]
    O, L = np.empty((B, H, cache_v.shape[-1])), np.empty((B, H))
    for b in range(B):
        t = np.arange(N)
        rows = table[b, t // P].astype(int)
        for h in range(H):
            k, v = cache_k[rows, t % P, h // g], cache_v[rows, t % P, h // g]
            s = k @ q[b, h] * numbers["scale"]
            L[b, h] = s.max() + np.log(np.exp(s - s.max()).sum())
            O[b, h] = np.exp(s - L[b, h]) @ v
    return O, L


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_decode_outputs_equal_a_float64_reference(runs, name):
    _, numbers, arrays = runs[name]
    O, L = _reference(arrays, {**numbers, "N": CASES[name][1]["N"]})
    assert np.abs(np.asarray(arrays["O"]) - O).max() < 1e-5 and np.abs(np.asarray(arrays["L"]) - L).max() < 1e-5


def _iosim_run(name):
    """iosim's split-KV flash2 over the problem, simulated (iosim.run, count only): the problem and schedule of
    ``iosim run flash2 --Nq 1 --page-size P --splits S --Br R --Bc BLOCK_N`` (MLA: ``--mla shared --gqa packed``)."""
    import iosim

    p = CASES[name][1]
    grouped = p["H"] != p.get("kv_heads", 1) or "mla" in p
    problem = iosim.Problem(B=p["B"], H_q=p["H"], H_kv=p.get("kv_heads", 1), N_q=1, N_k=p["N"], d_qk=p["d"],
                            d_v=p.get("dv"), latent="mla" in p, page_size=p["page_size"])  # fmt: skip
    schedule = iosim.Schedule("flash2", Br=p["H"] if grouped else 1, Bc=32 if grouped else 64, splits=p["splits"],
                              gqa="packed" if grouped else "per-head", mla=p.get("mla", "shared"))  # fmt: skip
    r = iosim.run(problem, schedule, M=1 << 20, count_only=True)
    return {k: (c.reads, c.writes) for k, c in r.stats.per_array.items() if c.reads or c.writes}


@pytest.mark.parametrize("name", ["gqa", "mla", "naive"])
def test_vllm_decode_equals_iosim_run_flash2_split_kv_but_its_page_table_reads(runs, name):
    """Splits of whole BLOCK_N-key blocks and pages dividing them: Q, K, V, O and L equal iosim's schedule to the
    word; attn_logits (the partial outputs with their logsumexp as a last column) equals Opart + Lpart; the page
    table's words read at least once per program equal iosim's one word per page piece, and the kernel issues P
    times as many (a lane per key, each loading its page's entry)."""
    counts, _, _ = runs[name]
    model = _iosim_run(name)
    got = {k: (a.reads, a.writes) for k, a in counts.per_array.items()}
    for k in ("Q", "K", "V", "O", "L"):
        assert got.get(k, (0, 0)) == model.get(k, (0, 0)), k
    assert got["attn_logits"] == tuple(a + b for a, b in zip(model["Opart"], model["Lpart"], strict=True))
    assert counts.per_array["page_table"].distinct_reads == model["page_table"][0]
    assert got["page_table"][0] == CASES[name][1]["page_size"] * model["page_table"][0]


def test_vllm_mla_with_an_empty_split_differs_from_iosim_where_the_source_says(runs):
    """N = 5 keys in 4 splits: vLLM's splits are ceil(5 / 4) = 2 keys, the fourth empty; iosim's splits hold whole
    32-key column blocks, so its splits 2-4 are empty. vLLM loads q before testing the split (``:331``-``:337``,
    all 4 splits), iosim's schedule only where a split has a tile (1); vLLM stores nothing for an empty split
    (``:360``) and its stage 2 skips it (``:611``), iosim writes O = 0, L = -inf for every split and the combine
    reads them all (4)."""
    counts, _, _ = runs["empty"]
    model = _iosim_run("empty")
    R, d, dv = 4, 48, 32
    assert counts.per_array["Q"].reads == 4 * R * d and model["Q"] == (1 * R * d, 0)
    assert counts.per_array["K"].reads == model["K"][0] == 5 * d
    assert counts.per_array["attn_logits"].writes == 3 * R * (dv + 1)
    assert model["Opart"][1] + model["Lpart"][1] == 4 * R * (dv + 1)


def test_vllm_mla_equals_the_decode_splitkv_closed_form_but_its_own_arrays(runs):
    from iosim.kernels.comparison import Whole, compare

    counts, numbers, _ = runs["mla"]
    whole = Whole(B=2, H_q=4, H_kv=1, page_size=16, empty_splits="skipped", chunk_multiple=1,
                  metadata=numbers["metadata"], d_v=32, mla="shared")  # fmt: skip
    cmp = compare(counts, "decode-splitkv", 128, 48, Bc=32, heads=4, splits=4, whole=whole, gqa="packed")
    rows = {r.array: r for r in cmp.rows}
    for k in ("lengths", "Q", "K", "O"):
        assert rows[k].verdict.startswith("equal"), rows[k].verdict
    assert rows["attn_logits"].reads == rows["O_part"].model_reads + rows["L_part"].model_reads
    assert rows["page_table"].reads == 16 * rows["page_table"].model_reads


def test_the_docs_mla_table_is_what_iosim_kernel_prints(cli):
    """docs/kv-cache.md's vLLM MLA table (its lines shortened) against the command it names, row by row: reads,
    writes, model reads, model writes and distinct reads."""
    import json
    import re
    import shlex

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install --no-deps vllm==0.33.0; .ci/run)")
    text = (Path(__file__).parents[1] / "docs" / "kv-cache.md").read_text()
    section = text.split("## vLLM's paged decoding, counted in place")[1]
    command = re.search(r"```bash\n(iosim kernel .*?)\n```", section, re.S).group(1).replace("\\\n", " ")
    table = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    rows = {}
    for line in table.splitlines():
        cells = re.match(r"(\w+)\s+([\d,]+)\s+([\d,]+)\s+([\d,]*)\s+([\d,]*)\s+([\d,]+)\s", line)
        if cells:
            rows[cells.group(1)] = [int(c.replace(",", "")) if c else None for c in cells.groups()[1:]]
    rc, out, err = cli(*shlex.split(command)[2:], "--json")
    assert rc == 0, err
    doc = json.loads(out)
    got = {r["array"]: [r["reads"], r["writes"], r["model_reads"], r["model_writes"], r["distinct_reads"]]
           for r in doc["comparison"]["rows"]}  # fmt: skip
    assert len(rows) == 12 and rows == {k: got[k] for k in rows}
