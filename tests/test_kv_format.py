"""Quantized KV cache formats (iosim.spec.kv_format): bytes per row of the presets as their projects describe them
(584, 656, head_dim + 16), words and bytes per component of a counted decode run against a count made here, and
bad layouts in one line."""

from __future__ import annotations

import pytest

from iosim import Problem, Schedule, run
from iosim.base.errors import InputError
from iosim.spec.kv_format import PRESETS, kv_bytes, kv_format


def test_presets_bytes_per_row():
    # vLLM / FlashMLA's DeepSeek-V4 cache: 448 fp8 + 7 ue8m0 scales + 1 pad + 64 bf16 RoPE values
    assert kv_format("fp8_ds_mla").row_bytes(512) == 448 + 7 + 1 + 64 * 2 == 584
    # DeepSeek-V3.2's FP8-with-scale cache: 512 fp8 + 4 fp32 scales + 64 bf16
    assert kv_format("flashmla_v32").row_bytes(576) == 512 + 4 * 4 + 64 * 2 == 656
    for d in (64, 128, 256, 512):  # FlashInfer: [head_dim fp8][4-byte scale][12-byte pad]
        assert kv_format("flashinfer_fp8").row_bytes(d) == d + 16


@pytest.mark.parametrize("spec, width, want", [
    ("nvfp4", 128, 128 / 2 + 128 // 16),  # 4-bit values, one e4m3 scale per 16
    ("mxfp8", 96, 96 + 96 // 32),  # 8-bit values, one ue8m0 scale per 32
    ("mxfp4", 64, 32 + 2),
    ("fp8", 64, 64),  # a per-tensor scale: not in the row
    ("fp8:token-head", 64, 64 + 4),
    ("fp8:block16:inline", 64, 64 + 4 * 4),
    ("bf16", 10, 20),
    ("nvfp4+rope64:bf16", 576, 512 / 2 + 512 // 16 + 64 * 2),  # MLA: NVFP4 NoPE, bf16 RoPE
    ("fp8:block128:inline+rope64:bf16", 576, 656),  # DeepSeek-V3.2's layout, spelled out
])  # fmt: skip
def test_generic_formats(spec, width, want):
    assert kv_format(spec).row_bytes(width) == want


@pytest.mark.parametrize("spec, width, text", [
    ("nvfp4", 100, "scale block of 16 values must divide"),
    ("mxfp8:block48", 64, "scale block of 48 values must divide"),
    ("nvfp4:token", 7, "4-bit values pack two per byte"),
    ("fp8_ds_mla", 576, "describes rows of 512 values"),
    ("flashmla_v32", 512, "describes rows of 576 values"),
])  # fmt: skip
def test_bad_layouts_one_line(spec, width, text):
    with pytest.raises(InputError, match="kv-format") as e:
        kv_format(spec).components(width)
    assert text in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "spec",
    ["fp9", "fp8:blockX", "fp8:token:left", "fp8:a:b:c", 3, "fp8+rope:bf16", "fp8+rope64:int4", "fp8+nope64:bf16"],
)
def test_bad_names_one_line(spec):
    with pytest.raises(InputError, match="kv-format"):
        kv_format(spec)


def test_paged_split_decode_bytes_per_component():
    """MLA decode (V4 widths) over a paged cache with split-KV: the kernel reads every latent row once per KV head
    (B H_kv N_k rows); each row is 584 bytes: 448 fp8 + 7 scales + 1 pad + 64 bf16."""
    p = Problem(B=2, H_q=4, N_q=1, N_k=203, d_qk=512, d_v=448, latent=True, page_size=64)
    r = run(p, Schedule("flash2", gqa="packed", splits=3), 40000, count_only=True)
    rows = 2 * 1 * 203
    got = {name: (w, b) for name, w, b, _ in kv_bytes(PRESETS["fp8_ds_mla"], p, {"K": r.stats.per_array["K"].reads})}
    assert got == {"K.nope": (rows * 448, rows * 448), "K.nope_scale": (rows * 7, rows * 7),
                   "K.rope": (rows * 64, rows * 128), "K.pad": (0, rows)}  # fmt: skip
    assert sum(b for _, b in got.values()) == rows * 584


def test_gqa_decode_flashinfer_k_and_v():
    """Per-head GQA decoding reads each K/V row g times: 4 query heads on 2 KV heads, N_k = 37, head_dim 64."""
    p = Problem(H_q=4, H_kv=2, N_q=1, N_k=37, d_qk=64)
    r = run(p, Schedule("flash2"), 20000, count_only=True)
    reads = {n: c.reads for n, c in r.stats.per_array.items()}
    rows = 4 * 37  # per head: every query head reads its KV head's 37 rows
    got = {name: b for name, _, b, _ in kv_bytes(PRESETS["flashinfer_fp8"], p, reads)}
    assert got == {"K.values": rows * 64, "K.values_scale": rows * 4, "K.pad": rows * 12,
                   "V.values": rows * 64, "V.values_scale": rows * 4, "V.pad": rows * 12}  # fmt: skip


def test_cli_kv_format(capsys):
    from iosim.cli import main

    args = ["run", "flash2", "--Nq", "1", "--Nk", "100", "--dqk", "576", "--dv", "512", "--mla", "shared", "--heads",
            "2", "--gqa", "packed", "--page-size", "64", "--splits", "2", "--M", "100000", "--count-only"]  # fmt: skip
    assert main([*args, "--kv-format", "flashmla_v32"]) == 0
    out = capsys.readouterr().out
    assert "KV bytes read at flashmla_v32" in out and "65,600" in out  # 100 rows x 656 bytes
    assert main([*args, "--kv-format", "fp8_ds_mla"]) == 2
    err = capsys.readouterr()
    assert "describes rows of 512 values" in err.err and err.out == ""
    assert main([*args, "--kv-format", "fp8_ds_mla", "--backward"]) == 2


def test_per_tensor_scale_once_per_array_and_json(capsys):
    """fp8 with a per-tensor scale: the rows carry no scale; one fp32 scale word per array per run."""
    import json

    from iosim.cli import main

    p = Problem(N_q=1, N_k=50, d_qk=16)
    r = run(p, Schedule("flash2"), 5000, count_only=True)
    got = kv_bytes(kv_format("fp8"), p, {n: c.reads for n, c in r.stats.per_array.items()})
    assert got == [("K.values", 800, 800, "values"), ("K.values_scale", 1, 4, "per tensor"),
                   ("V.values", 800, 800, "values"), ("V.values_scale", 1, 4, "per tensor")]  # fmt: skip
    args = ["run", "flash2", "--Nq", "1", "--Nk", "50", "--dqk", "16", "--M", "5000", "--count-only", "--json"]
    assert main([*args, "--kv-format", "fp8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_format"]["K.values (values)"] == "800 words, 800 bytes"
    assert out["kv_format"]["KV bytes read at fp8"] == "1,608"


@pytest.mark.parametrize("extra, text", [(["--kv-format", "fp8"], "not standard"),
                                         (["--policy", "group:2"], "--policy is read by topk-sparse"),
                                         (["--index-block", "4"], "--index-block is read by topk-sparse")])  # fmt: skip
def test_cli_options_never_ignored(extra, text, capsys):
    from iosim.cli import main

    assert main(["run", "standard", "--N", "16", "--d", "4", "--M", "500", "--count-only", *extra]) == 2
    err = capsys.readouterr()
    assert text in err.err and err.out == ""
