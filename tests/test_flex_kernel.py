"""A Triton kernel that consumes a real FlexAttention BlockMask (iosim/kernels/examples/triton_flex_blocksparse.py),
counted in place under the Triton interpreter: its per-array traffic equals the block-sparse schedule's
(iosim.masking.block_sparse) on the same BlockMask and problem, metadata, document ids and bias included, and its output
equals the float64 reference of the masked, biased attention."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from iosim import Problem
from iosim.masking.block_sparse import Buffer, block_sparse

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

FILE = pathlib.Path(__file__).resolve().parents[1] / "iosim" / "kernels" / "examples" / "triton_flex_blocksparse.py"


@pytest.mark.parametrize("N, Br, Bc, H, bias", [(200, 32, 32, 2, True), (160, 16, 32, 1, False)])
def test_kernel_moves_what_the_schedule_counts(N, Br, Bc, H, bias):  # noqa: N803
    from torch.nn.attention.flex_attention import create_block_mask

    from iosim.kernels.counting import count_file
    from iosim.kernels.examples.triton_flex_blocksparse import documents

    d = 16
    params = {"N": N, "d": d, "Br": Br, "Bc": Bc, "H": H, "bias": bias}
    counts, _, arrays = count_file(str(FILE), "launch", backend="triton", params=params)
    doc = documents(N)

    def causal_document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    bm = create_block_mask(causal_document, None, None, N, N, device="cpu", BLOCK_SIZE=(Br, Bc))
    bufs = [Buffer("doc", "q+kv", "mask", "int32")] + ([Buffer("bias", "qkv", "score")] if bias else [])
    model = block_sparse(Problem(H_q=H, N=N, d=d, dtype_q="fp32"), bm, buffers=bufs)
    assert model.exact
    kernel = {k: (a.reads, a.writes) for k, a in counts.per_array.items() if a.reads or a.writes}
    schedule = {k: (a.reads, a.writes) for k, a in model.stats.per_array.items()}
    assert kernel == schedule
    assert {k: a.read_bytes + a.write_bytes for k, a in counts.per_array.items() if a.reads or a.writes} == model.bytes
    # numerics: the masked, biased softmax in float64
    Q, K, V = (arrays[x].astype(np.float64) for x in "QKV")
    dn = doc.numpy()
    allowed = (dn[:, None] == dn[None, :]) & (np.arange(N)[:, None] >= np.arange(N)[None, :])
    S = np.einsum("hnd,hmd->hnm", Q, K) / np.sqrt(d) + (arrays["bias"] if bias else 0.0)
    S = np.where(allowed, S, -np.inf)
    P = np.exp(S - S.max(-1, keepdims=True))
    O = np.einsum("hnm,hmd->hnd", P / P.sum(-1, keepdims=True), V)
    assert np.abs(arrays["O"] - O).max() < 1e-4


MASK = "mod:iosim/kernels/examples/flex_document_mask.py:causal_document"  # the example's mask_mod at N = 200


@pytest.fixture
def cli(capsys, monkeypatch):
    from iosim.cli import main

    monkeypatch.chdir(FILE.parents[3])  # the mask file's path is relative to the repository root

    def run(*args):
        rc = main(["kernel", str(FILE), "--N", "200", "--d", "16", "--H", "2", "--like", "block-sparse", *args])
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


def test_like_block_sparse_on_the_command_line_equals_the_schedule_per_array_and_in_bytes(cli):
    rc, out, err = cli("--mask", MASK)
    assert rc == 0, err
    rows = {line.split()[0]: line.split()[1:5] for line in out.splitlines() if "closed form to the word" in line}
    assert set(rows) == {"Q", "K", "V", "O", "L", "kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                         "full_kv_indices", "doc", "bias"}  # fmt: skip
    assert rows["doc"] == ["1,856", "0", "1,856", "0"] and rows["bias"] == ["29,824", "0", "29,824", "0"]
    assert "1x the closed form" in out
    assert "note: bytes: equal per array, 312,888 in all (the schedule's 312,888)" in out
    assert "16 partial and 1 full blocks of 49 per head" in out


def test_a_mask_other_than_the_kernels_block_mask_is_one_line_exit_2(cli):
    rc, _, err = cli("--mask", "causal")  # (a first run may say first that Numba compiles)
    assert rc == 2 and err.strip().splitlines()[-1] == (
        "iosim: error: --mask must be the mask the kernel's BlockMask was built for: at (b, h, row block) (0, 0, 1) "
        "the kernel's lists partial blocks [0, 1] and full [], the mask's [1] and [0]"
    )


def test_block_sparse_needs_a_mask_and_a_mask_needs_block_sparse(cli, capsys):
    from iosim.cli import main

    rc, _, err = cli()
    assert rc == 2 and err.startswith("iosim: error: --mask is needed by --like block-sparse") and err.count("\n") == 1
    rc = main(["kernel", str(FILE), "--N", "200", "--d", "16", "--like", "flash2", "--mask", "causal"])
    err = capsys.readouterr().err
    assert rc == 2 and "--mask is read by --like block-sparse (the mask of the kernel's BlockMask), got 'causal'" in err
    rc, _, err = cli("--mask", "window:x")
    assert rc == 2 and len(err.strip().splitlines()) == 1


def test_compare_takes_a_mask_mod_function_in_python():
    from iosim.kernels import Whole, compare
    from iosim.kernels.counting import count_file
    from iosim.kernels.examples.triton_flex_blocksparse import documents
    from iosim.masking.masks import from_mask_mod

    counts, numbers, arrays = count_file(str(FILE), "launch", "triton", dict(N=160, d=16, Br=16, Bc=32, H=1,
                                                                             bias=False))  # fmt: skip
    doc = documents(160)

    def causal_document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    whole = Whole(mask=from_mask_mod(causal_document), buffers=numbers["buffers"], dtype=numbers["dtype"])
    cmp = compare(counts, "block-sparse", 160, 16, 16, 32, heads=1, arrays=arrays, whole=whole)
    assert cmp.equal and cmp.extra_words == 0, cmp.table()
    assert cmp.notes[-2].startswith("bytes: equal per array")


TEMPLATE = FILE.parent / "torch_flex_template.py"


@pytest.mark.parametrize("N, block, H, bias", [(128, 32, 2, False), (96, 16, 1, True), (200, 32, 2, True),
                                               (72, 32, 1, False), (20, 32, 1, True)])  # fmt: skip
def test_torchs_own_flex_template_moves_what_the_schedule_counts(N, block, H, bias):  # noqa: N803
    """FlexAttention's own Triton forward (torch's installed template, rendered with iosim's hooks) on a real
    BlockMask, counted in place under the interpreter: every array equals the block-sparse schedule with the
    template's index reads, in words and bytes; its output equals flex_attention's. With N not a multiple of the
    block (N below the block too), the template evaluates mask_mod at every padded position of a partial block (its
    bounded indices wrap): the document ids are read BQ + BKV times per partial block, as that schedule counts, and
    a (q, kv) bias added by score_mod BQ x BKV times per visited block."""
    from torch.nn.attention.flex_attention import flex_attention

    from iosim.kernels.counting import count_file
    from iosim.kernels.examples.torch_flex_template import TORCH
    from iosim.masking.mask_mod import block_index

    if not torch.__version__.startswith(TORCH + "."):
        pytest.skip(f"the template's hooks are written against torch {TORCH}")

    d = 16
    params = {"N": N, "d": d, "block": block, "H": H, "score": "qkv" if bias else None}
    counts, _, arrays = count_file(str(TEMPLATE), "launch", backend="triton", params=params)
    names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
    bi = block_index(**{k: arrays[k].astype(np.int64) for k in names}, block_size=block)
    p = Problem(H_q=H, N=N, d=d, dtype_q="fp32")
    bufs = [Buffer("doc", "q+kv", "mask", "int32")] + ([Buffer("bias", "qkv", "score")] if bias else [])
    model = block_sparse(p, bi, buffers=bufs, indices="template")
    once = block_sparse(p, bi, buffers=bufs)
    assert model.exact and once.exact
    kernel = {k: (a.reads, a.writes) for k, a in counts.per_array.items() if a.reads or a.writes}
    schedule = {k: (a.reads, a.writes) for k, a in model.stats.per_array.items()}
    assert kernel == schedule
    assert kernel["doc"] == (H * int(bi.kv_num.sum()) * 2 * block, 0)
    assert (kernel["doc"][0] != once.words["doc"]) == (N % block != 0)  # the padded positions: ragged N only
    if bias:
        visited = int(bi.kv_num.sum() + bi.full_num.sum())
        assert kernel["bias"] == (H * visited * block * block, 0)
        assert (kernel["bias"][0] != once.words["bias"]) == (N % block != 0)
    assert {k: a.read_bytes + a.write_bytes for k, a in counts.per_array.items() if a.reads or a.writes} == model.bytes
    for lst, num in (("kv_indices", bi.kv_num), ("full_kv_indices", bi.full_num)):  # each head: max(1, 2 n) a row
        assert kernel[lst][0] == H * int(np.maximum(1, 2 * num).sum()) != once.words.get(lst, 0)
    doc = torch.from_numpy(arrays["doc"].astype(np.int64))
    q, k, v = (torch.from_numpy(arrays[x]).reshape(1, H, N, d).float() for x in "QKV")
    from torch.nn.attention.flex_attention import create_block_mask

    bm = create_block_mask(lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (qi >= ki), None, None, N, N, device="cpu",
                           BLOCK_SIZE=block)  # fmt: skip
    B = torch.from_numpy(arrays["bias"]).float() if bias else None
    ref = flex_attention(q, k, v, block_mask=bm, score_mod=(lambda s, b, h, qi, ki: s + B[qi, ki]) if bias else None)
    assert np.abs(arrays["O"].reshape(1, H, N, d) - ref.numpy()).max() < 1e-5


def test_like_block_sparse_with_the_templates_index_reads(capsys, monkeypatch):
    """``--indices template``: torch's own template at the ragged N = 200 equals, array by array, the schedule that
    reads the indices and the padded positions' document ids as the template does; the default schedule does not
    (the template re-reads the indices); --indices without --like block-sparse is one line, exit 2."""
    from iosim.cli import kernel as cli_kernel
    from iosim.cli import main
    from iosim.kernels.examples.torch_flex_template import TORCH
    from iosim.masking.block_sparse import INDEX_READS

    assert cli_kernel.INDEX_READS == INDEX_READS
    if not torch.__version__.startswith(TORCH + "."):
        pytest.skip(f"the template's hooks are written against torch {TORCH}")
    monkeypatch.chdir(FILE.parents[3])
    base = ["kernel", str(TEMPLATE), "--N", "200", "--d", "16", "--H", "2", "--no-numerics"]
    rc = main([*base, "--like", "block-sparse", "--mask", MASK, "--indices", "template"])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:5] for line in out.splitlines() if "closed form to the word" in line}
    assert rc == 0 and set(rows) == {"Q", "K", "V", "O", "L", "kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                                     "full_kv_indices", "doc"}  # fmt: skip
    assert rows["doc"] == ["2,048", "0", "2,048", "0"] and rows["kv_indices"] == ["64", "0", "64", "0"]
    assert "note: bytes: equal per array, 194,544 in all (the schedule's 194,544)" in out
    main([*base, "--like", "block-sparse", "--mask", MASK])
    out = capsys.readouterr().out
    assert {line.split()[0] for line in out.splitlines() if "closed form to the word" in line} == {
        "Q", "K", "V", "O", "L", "kv_num_blocks", "full_kv_num_blocks"}  # fmt: skip
    rc = main([*base, "--like", "flash2", "--Br", "32", "--Bc", "32", "--indices", "template"])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == ("iosim: error: --indices is read by --like block-sparse (how the kernel reads "
                                       "its BlockMask), got 'template'")  # fmt: skip


def test_the_template_under_gqa_on_the_command_line(capsys, monkeypatch):
    """``--kv-heads``: the template with one key/value head for its two query heads (GQA_SHARED_HEADS = 2) equals the
    per-head block-sparse schedule in every array, K and V read g = 2 times per key/value head (one program per query
    head), so it moves the same 194,544 bytes as the launch with two key/value heads above."""
    from iosim.cli import main
    from iosim.kernels.examples.torch_flex_template import TORCH

    if not torch.__version__.startswith(TORCH + "."):
        pytest.skip(f"the template's hooks are written against torch {TORCH}")
    monkeypatch.chdir(FILE.parents[3])
    args = ["kernel", str(TEMPLATE), "--N", "200", "--d", "16", "--H", "2", "--kv-heads", "1", "--no-numerics"]
    rc = main([*args, "--like", "block-sparse", "--mask", MASK, "--indices", "template"])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if "closed form to the word" in line}
    assert rc == 0 and set(rows) == {"Q", "K", "V", "O", "L", "kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                                     "full_kv_indices", "doc"}, out  # fmt: skip
    assert "heads=2 kv-heads=1 (per-head)" in out
    for name in "KV":
        assert rows[name].split()[1:5] == [
            "16,640",
            "0",
            "16,640",
            "0",
        ]  # 2 query heads x 520 keys (17 visited blocks) x d
        assert rows[name].endswith("(g = 2 times per KV head: per-head)")
    assert "note: bytes: equal per array, 194,544 in all (the schedule's 194,544)" in out
