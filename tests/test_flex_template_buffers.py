"""torch's own FlexAttention Triton forward (iosim/kernels/examples/torch_flex_template.py) with every kind of
captured buffer iosim.masking.block_sparse.Buffer models, read as inductor lowers a score_mod or mask_mod that reads it:
counted in place under the Triton interpreter, each array equals the block-sparse schedule with the template's reads
(``indices="template"``) in words and in bytes, at N a multiple of the block and at a ragged N (below the block
too), with B H > 1 where the buffer depends on b or h, and under GQA (fewer key/value heads than query heads); the
output equals flex_attention's on the CPU."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from iosim import Problem
from iosim.masking.block_sparse import Buffer, block_sparse

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "iosim" / "kernels" / "examples" / "torch_flex_template.py"
INDICES = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
WORDS = {"q": lambda BQ, BKV: BQ, "kv": lambda BQ, BKV: BKV, "q+kv": lambda BQ, BKV: BQ + BKV,  # noqa: N803
         "qkv": lambda BQ, BKV: BQ * BKV, "bhqkv": lambda BQ, BKV: BQ * BKV, "h": lambda BQ, BKV: 1}  # fmt: skip


def _skip_other_torch():
    from iosim.kernels.examples.torch_flex_template import TORCH

    if not torch.__version__.startswith(TORCH + "."):
        pytest.skip(f"the template's hooks are written against torch {TORCH}")


@pytest.mark.parametrize(
    "score, mask, N, block, B, H, padded",  # padded: the buffers the template reads at padded positions
    [
        ("h", "h", 128, 32, 1, 2, ()),  # ALiBi: one slope per head and visited block; a window per head
        ("h", "kv", 200, 64, 2, 2, ()),  # (the padding keys' ragged block is empty: no partial block is ragged)
        pytest.param("q", "h", 128, 32, 1, 2, (), marks=pytest.mark.slow),  # (the kinds: in the default run too)
        ("q", "kv", 200, 64, 1, 2, ("bias",)),
        ("q", "q+kv", 20, 32, 1, 1, ("bias", "doc")),  # N below the block: the indices wrap
        pytest.param("kv", "q+kv", 96, 32, 1, 2, (), marks=pytest.mark.slow),  # (the kinds: in the default run too)
        ("kv", "q", 128, 32, 1, 2, ()),  # the padding queries' row block sees no key: an empty row block
        ("kv", "kv", 20, 32, 1, 1, ("bias", "valid")),
        pytest.param("bhqkv", "kv", 64, 32, 2, 2, (), marks=pytest.mark.slow),  # (the kinds: in the default run too)
        ("bhqkv", "h", 72, 32, 2, 2, ("bias",)),  # a BlockMask per head
        ("qkv", "q", 20, 32, 1, 1, ("bias", "valid")),
    ],
)
def test_each_buffer_kind_moves_what_the_schedule_counts(score, mask, N, block, B, H, padded):  # noqa: N803
    """Per kind, the template reads score_mod's buffer WORDS[kind](BQ, BKV) words in every visited block and
    mask_mod's in every partial block, the padded positions of a ragged block included (wrapped indices; a
    per-head scalar is one word whatever N), where the once-per-position schedule reads them at the block's own
    rows and columns only."""
    _moves_what_the_schedule_counts(score, mask, N, block, B, H, H, padded)


@pytest.mark.parametrize(
    "score, mask, N, block, B, H, H_kv, padded",
    [
        ("h", "q+kv", 128, 32, 1, 4, 2, ()),  # g = 2: ALiBi's slope per query head
        ("kv", "h", 200, 64, 2, 4, 1, ("bias",)),  # g = 4 (MQA), ragged: a window (a BlockMask) per query head
        ("bhqkv", "h", 72, 32, 1, 4, 2, ("bias",)),  # g = 2, ragged: a (b, h, q, kv) bias per query head
    ],
)
def test_gqa_moves_what_the_schedule_counts(score, mask, N, block, B, H, H_kv, padded):  # noqa: N803
    """GQA (``flex_attention(..., enable_gqa=True)``: K, V with H_kv < H heads, ``GQA_SHARED_HEADS`` = g = H /
    H_kv): the template still runs one program per (row block, b, query head), each reading the K/V tiles of its
    key/value head h // g itself, so each key/value head's tiles are read g times, and it passes the query head to
    the mods and to the BlockMask (one per query head when mask_mod reads h). Every array equals the schedule on
    Problem(H_q=H, H_kv=H_kv) in words and bytes; the output equals flex_attention's with enable_gqa."""
    _moves_what_the_schedule_counts(score, mask, N, block, B, H, H_kv, padded)


def _moves_what_the_schedule_counts(score, mask, N, block, B, H, H_kv, padded):  # noqa: N803
    from torch.nn.attention.flex_attention import flex_attention

    from iosim.kernels.counting import count_file
    from iosim.kernels.examples import torch_flex_template as tft
    from iosim.masking.mask_mod import block_index

    _skip_other_torch()
    d = 16
    params = {"N": N, "d": d, "block": block, "H": H, "B": B, "score": score, "mask": mask, "kv_heads": H_kv}
    counts, numbers, arrays = count_file(str(TEMPLATE), "launch", backend="triton", params=params)
    assert counts.stray == [] and counts.out_of_bounds_lanes == 0
    name, (mask_name, mask_dtype) = tft.SCORES[score], tft.MASKS[mask]
    assert numbers["buffers"] == {mask_name: [mask, "mask", mask_dtype], name: [score, "score"]}
    bi = block_index(**{k: arrays[k].astype(np.int64) for k in INDICES}, block_size=block)
    assert numbers["kv_heads"] == H_kv and arrays["K"].size == arrays["V"].size == B * H_kv * N * d
    p = Problem(B=B, H_q=H, H_kv=H_kv, N=N, d=d, dtype_q="fp32")
    bufs = [Buffer(mask_name, mask, "mask", mask_dtype), Buffer(name, score, "score")]
    model = block_sparse(p, bi, buffers=bufs, indices="template")
    once = block_sparse(p, bi, buffers=bufs)
    assert model.exact and once.exact
    kernel = {k: (a.reads, a.writes) for k, a in counts.per_array.items() if a.reads or a.writes}
    assert kernel == {k: (a.reads, a.writes) for k, a in model.stats.per_array.items()}
    assert {k: a.read_bytes + a.write_bytes for k, a in counts.per_array.items() if a.reads or a.writes} == model.bytes
    cls = bi.classes(-(-N // block))  # (B', H', T_r, T_c), each (b', h') standing for `weight` heads
    assert bi.kv_num.shape[:2] == (1, H if mask == "h" else 1)  # a BlockMask per head when mask_mod reads h
    assert ((bi.kv_num + bi.full_num) == 0).any() == (mask == "q" and N % block == 0)  # the padding queries' block
    weight = B * H // (cls.shape[0] * cls.shape[1])
    partial, full = weight * int((cls == 1).sum()), weight * int((cls == 2).sum())
    assert partial > 0
    widths = np.minimum(block, N - np.arange(cls.shape[3]) * block)  # every query head reads its blocks' K tiles
    assert kernel["K"] == (weight * int(((cls > 0) * widths).sum()) * d, 0)  # (H_kv appears nowhere: g reads each)
    assert kernel[name] == ((partial + full) * WORDS[score](block, block), 0)
    assert kernel[mask_name] == (partial * WORDS[mask](block, block), 0)
    r = np.minimum(block, N - np.arange(cls.shape[2]) * block)[:, None]  # the padded positions: what the template
    c = np.minimum(block, N - np.arange(cls.shape[3]) * block)[None, :]  # reads beyond the once count
    for buf, kind, scope in ((name, score, cls > 0), (mask_name, mask, cls == 1)):
        extra = weight * int((scope * (WORDS[kind](block, block) - WORDS[kind](r, c))).sum())
        assert kernel[buf][0] - once.words[buf] == extra and (extra > 0) == (buf in padded)
    assert model.bytes[mask_name] == kernel[mask_name][0] * {"int32": 4, "bool": 1}[mask_dtype]
    # numerics: flex_attention (eager, CPU) with the same mods on the same captured tensors
    held = {name: torch.from_numpy(arrays[name]).float(),  # (the arrays come back as float64)
            mask_name: torch.from_numpy(arrays[mask_name]).to(getattr(torch, mask_dtype))}  # fmt: skip
    bm = tft.block_mask(mask, held[mask_name], N, H, block)
    q = torch.from_numpy(arrays["Q"]).reshape(B, H, N, d).float()
    k, v = (torch.from_numpy(arrays[x]).reshape(B, H_kv, N, d).float() for x in "KV")
    ref = flex_attention(q, k, v, score_mod=tft.score_mod(score, held[name]), block_mask=bm, enable_gqa=H_kv < H)
    assert np.abs(arrays["O"].reshape(B, H, N, d) - ref.numpy()).max() < 1e-5


def test_a_kind_the_launcher_does_not_render_is_one_line():
    from iosim.base.errors import InputError
    from iosim.kernels.examples.torch_flex_template import launch

    with pytest.raises(InputError, match="score must be None or one of qkv, q, kv, bhqkv, h"):
        launch(64, 16, score="q+kv")
    with pytest.raises(InputError, match=r"mask must be one of q\+kv, kv, q, h"):
        launch(64, 16, mask="qkv")
    for bad in (3, 0, 2.0):
        with pytest.raises(InputError, match="kv_heads must be None or a divisor of H = 4"):
            launch(64, 16, H=4, kv_heads=bad)


def test_the_command_line_compares_a_launcher_with_any_kind(tmp_path, capsys, monkeypatch):
    """``iosim kernel ... --like block-sparse --indices template`` takes the buffers the launcher declares: a
    launcher file that calls the template with a full (b, h, q, kv) bias and a padding mask, at B = H = 2 and the
    ragged N = 200, equals the schedule in every array, the two buffers included."""
    from iosim.cli import main

    _skip_other_torch()
    (tmp_path / "padded.py").write_text(
        "import torch\n\nvalid = torch.arange(200) < 150\n\n\n"
        "def padded(b, h, q_idx, kv_idx):\n    return valid[kv_idx] & (q_idx >= kv_idx)\n"
    )  # the mask the launcher's BlockMask is built for, as a user writes it (valid up to N - N // 4)
    (tmp_path / "launcher.py").write_text(
        "from iosim.kernels.examples.torch_flex_template import launch as template\n\n\n"
        "def launch(N, d, H=1, B=1):\n    return template(N, d, block=32, H=H, B=B, score='bhqkv', mask='kv')\n"
    )
    monkeypatch.chdir(tmp_path)
    args = [
        "kernel",
        "launcher.py",
        "--N",
        "200",
        "--d",
        "16",
        "--H",
        "2",
        "--B",
        "2",
        "--no-numerics",
        "--backend",
        "triton",
    ]
    rc = main([*args, "--like", "block-sparse", "--mask", "mod:padded.py:padded", "--indices", "template"])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:5] for line in out.splitlines() if "closed form to the word" in line}
    assert rc == 0 and set(rows) == {"Q", "K", "V", "O", "L", *INDICES, "valid", "bias"}, out
    assert rows["bias"] == ["102,400", "0", "102,400", "0"]  # B H x 25 visited blocks x 32 x 32
    assert rows["valid"] == ["1,408", "0", "1,408", "0"]  # B H x 11 partial blocks x 32 keys
    assert "note: bytes: equal per array, 927,264 in all (the schedule's 927,264)" in out
