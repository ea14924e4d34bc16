"""Attention kernels from public libraries, counted in place from their installed packages (never copied here):
flash-linear-attention's softmax attention (fla-core), SageAttention 1.0.6's int8 attention and sglang's split-KV
decoding (stage 1 and the combine, with its metadata: kv_indptr, kv_indices, num_kv_splits), launched through
the libraries' own host functions by the launchers in iosim/kernels/examples; their per-array counts equal a hand
derivation from the kernels' code (docs/kernels-library.md) and flash2's closed form. jax's Pallas GPU attention,
the third library, is in tests/test_kernels_pallas.py. The CPU stand-in for the GPU queries a library makes at import
(iosim.kernels.standin) is tested on a small package written here that probes the GPU when imported.

CI installs the ``kernel-libs`` extra and sglang without its dependencies (.ci/run), so these tests never skip there.
Shapes are tiny.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

from iosim.kernels.comparison import Whole, block_sizes, compare  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "iosim" / "kernels" / "examples"


@pytest.fixture(scope="module")
def fla():
    pytest.importorskip("fla")
    from iosim.kernels import count_batch

    cases = [dict(N=200, d=16, B=1, H=2), dict(N=200, d=16, B=2, H=4, kv_heads=2), dict(N=100, d=32, B=1, H=1)]
    return cases, count_batch([(str(EXAMPLES / "fla_parallel_attn.py"), None, p) for p in cases], "triton")


def test_fla_parallel_attention_equals_the_hand_derivation(fla):
    cases, runs = fla
    counts, numbers, _ = runs[0]
    # N = 200, d = 16, BT = 128, BS = 32, 2 heads: row block 0 steps over keys 0..127 (its diagonal blocks), row
    # block 1 over 0..127 then 128..199 (72 keys, masked): 128 + 200 = 328 keys x 16 per head
    per = {k: (a.reads, a.writes) for k, a in counts.per_array.items()}
    assert per == {"Q": (6400, 0), "K": (10496, 0), "V": (10496, 0), "O": (0, 6400), "L": (0, 400)}
    assert counts.launch_info[0]["constexprs"]["BT"] == 128 and counts.launch_info[0]["constexprs"]["BS"] == 32
    assert numbers["logsumexp"] == "log2"


@pytest.mark.parametrize("i", range(3))
def test_fla_parallel_attention_equals_flash2_causal_over_the_problem(fla, i):
    cases, runs = fla
    p, (counts, numbers, arrays) = cases[i], runs[i]
    blocks = block_sizes(counts, "flash2", p["d"], numbers)
    whole = Whole(B=p["B"], H_kv=numbers["kv_heads"])
    cmp = compare(counts, "flash2", p["N"], p["d"], blocks["Br"], blocks["Bc"], causal=True, heads=p["H"],
                  arrays=arrays, scale=numbers["scale"], layout=numbers["layout"], logsumexp="log2",
                  whole=whole)  # fmt: skip
    assert cmp.equal, [vars(r) for r in cmp.rows]
    assert cmp.numerics_ok and {n["output"] for n in cmp.numerics} == {"O", "L"}
    if p.get("kv_heads"):
        assert cmp.gqa == "per-head"  # each query head's program loads its KV head: g = 2 times


@pytest.fixture(scope="module")
def sage():
    pytest.importorskip("sageattention")
    from iosim.kernels import count_batch

    path = str(EXAMPLES / "sageattention_int8.py")
    return count_batch([(path, "launch", dict(N=200, d=64)), (path, "launch_with_quantization", dict(N=200, d=64))],
                       "triton")  # fmt: skip


def test_sageattention_equals_the_hand_derivation_and_flash2_where_it_moves_data(sage):
    counts, numbers, arrays = sage[0]
    # N = 200, d = 64, 2 heads, BLOCK_M = 128, BLOCK_N = 64: 2 row blocks per head, each reading all 200 keys
    per = {k: (a.reads, a.writes) for k, a in counts.per_array.items()}
    assert per == {"Q": (25600, 0), "K": (51200, 0), "V": (51200, 0), "O": (0, 25600), "Q_scale": (4, 0),
                   "K_scale": (16, 0)}  # fmt: skip
    assert counts.launches == 1  # the quantization ran paused
    blocks = block_sizes(counts, "flash2", 64, numbers)
    assert blocks == {"Br": 128, "Bc": 64}
    cmp = compare(counts, "flash2", 200, 64, heads=2, arrays=arrays, **blocks)
    assert cmp.equal_where_moved() and not cmp.equal  # it stores no logsumexp
    assert cmp.numerics == []  # int8 Q, K: not iosim.check's floating-point rule


def test_sageattention_with_its_quantization(sage):
    counts, _, _ = sage[1]
    per = {k: (a.reads, a.writes) for k, a in counts.per_array.items()}
    # quantization: Q, K read in fp16 and written in int8 once (one scale per block: 2 Q blocks, 4 K blocks per head)
    assert per["Q_fp16"] == (25600, 0) and per["K_fp16"] == (25600, 0)
    assert per["Q_int8"] == (25600, 25600) and per["K_int8"] == (51200, 25600)
    assert per["Q_scale"] == (4, 4) and per["K_scale"] == (16, 8)
    assert counts.launches == 3


@pytest.fixture(scope="module")
def sglang():
    import importlib.util

    if importlib.util.find_spec("sglang") is None:  # not imported: its top level starts its server stack
        pytest.skip("sglang is not installed (pip install --no-deps sglang==0.5.23; .ci/run)")
    from iosim.kernels import count_batch

    cases = [dict(N=100, d=16, splits=4, B=2, H=2), dict(N=40, d=16, splits=4, B=2, H=2)]
    return cases, count_batch([(str(EXAMPLES / "sglang_decode.py"), None, p) for p in cases], "triton")


def test_sglang_split_kv_decode_equals_the_hand_derivation(sglang):
    _, runs = sglang
    # N = 100, 4 splits of 32 keys (rounded to _MIN_BLOCK_KV), all live; B = 2, H = 2: 16 stage-1 programs (kv_indptr
    # 2 words and num_kv_splits 1 each) and 4 stage-2 programs (the same metadata); q 16 words per live program
    per = {k: (a.reads, a.writes) for k, a in runs[0][0].per_array.items()}
    assert per == {"Q": (256, 0), "K": (6400, 0), "V": (6400, 0), "indptr": (40, 0), "kv_indices": (400, 0),
                   "num_kv_splits": (20, 0), "O_part": (256, 256), "L_part": (16, 16), "O": (0, 64)}  # fmt: skip
    # N = 40: chunks of 32 keys, so splits 2 and 3 are empty: they read their metadata only, store nothing
    per = {k: (a.reads, a.writes) for k, a in runs[1][0].per_array.items()}
    assert per["Q"] == (8 * 16, 0) and per["O_part"] == (128, 128) and per["L_part"] == (8, 8)
    assert per["indptr"] == (40, 0) and per["kv_indices"] == (160, 0)


@pytest.mark.parametrize("i", range(2))
def test_sglang_split_kv_decode_equals_decode_splitkv_over_the_problem(sglang, i):
    cases, runs = sglang
    p, (counts, numbers, arrays) = cases[i], runs[i]
    blocks = block_sizes(counts, "decode-splitkv", p["d"], numbers)
    assert blocks == {"Bc": 64}
    whole = Whole(B=p["B"], empty_splits="skipped", chunk_multiple=numbers["chunk_multiple"],
                  metadata=numbers["metadata"])  # fmt: skip
    cmp = compare(counts, "decode-splitkv", p["N"], p["d"], Bc=64, heads=p["H"], splits=p["splits"], arrays=arrays,
                  scale=numbers["scale"], layout=numbers["layout"], whole=whole)  # fmt: skip
    assert cmp.equal and cmp.numerics_ok, [vars(r) for r in cmp.rows]


# --- the Triton tutorial's autotuned fused-attention forward (flash-mlm's packaged copy, or a file by its path) -----
TUTORIAL_CONFIG = "BLOCK_M=128,BLOCK_N=64,num_stages=2,num_warps=4"


@pytest.fixture(scope="module")
def tutorial():
    pytest.importorskip("flash_mlm.kernel")
    import flash_mlm.kernel

    from iosim.kernels import count_batch, count_file

    path = str(EXAMPLES / "triton_tutorial_attention.py")
    cases = [dict(N=256, d=64, B=1, H=2), dict(N=256, d=64, B=2, H=2, causal=True)]
    with pytest.MonkeyPatch.context() as mp:
        # the tutorial keeps one config when PYTEST_VERSION is set: count the one named among all of them
        mp.delenv("PYTEST_VERSION", raising=False)
        runs = count_batch([(path, None, p) for p in cases], "triton", config=TUTORIAL_CONFIG)
        mp.setenv("IOSIM_TUTORIAL_ATTENTION", flash_mlm.kernel.__file__)  # the same file, by its path
        by_path = count_file(path, params=cases[1], config=TUTORIAL_CONFIG)
        ragged = count_file(path, params=dict(N=200, d=64), config=TUTORIAL_CONFIG, strict=False)
    return cases, runs, by_path, ragged


def test_the_tutorial_attention_equals_the_hand_derivation(tutorial):
    cases, runs, by_path, _ = tutorial
    # N = 256, d = 64, BLOCK_M = 128, BLOCK_N = 64, 2 heads, non-causal: 2 row blocks per head, each loading its Q
    # block once and all 256 keys of K and V; O and M stored once
    counts, numbers, _ = runs[0]
    per = {k: (a.reads, a.writes) for k, a in counts.per_array.items()}
    assert per == {"Q": (32768, 0), "K": (65536, 0), "V": (65536, 0), "O": (0, 32768), "L": (0, 512)}
    info = counts.launch_info[0]
    assert info["kernel"] == "_attn_fwd" and info["constexprs"]["BLOCK_M"] == 128
    assert info["config"] == "BLOCK_M=128,BLOCK_N=64,num_warps=4,num_ctas=1,num_stages=2 (config 25 of 36)"
    assert numbers["logsumexp"] == "log2"
    # causal, 2 batch items: row block 0 reads keys 0..127 (stage 2, the diagonal), row block 1 keys 0..127
    # (stage 1) and 128..255 (stage 2): 384 keys x 64 per (batch, head)
    causal = {k: (a.reads, a.writes) for k, a in runs[1][0].per_array.items()}
    assert causal == {"Q": (65536, 0), "K": (98304, 0), "V": (98304, 0), "O": (0, 65536), "L": (0, 1024)}
    assert {k: (a.reads, a.writes) for k, a in by_path[0].per_array.items()} == causal


@pytest.mark.parametrize("i", range(2))
def test_the_tutorial_attention_equals_flash2_with_its_log2_logsumexp(tutorial, i):
    cases, runs, _, _ = tutorial
    p, (counts, numbers, arrays) = cases[i], runs[i]
    blocks = block_sizes(counts, "flash2", p["d"], numbers)
    assert blocks == {"Br": 128, "Bc": 64}
    cmp = compare(counts, "flash2", p["N"], p["d"], causal=p.get("causal", False), heads=p["H"], arrays=arrays,
                  scale=numbers["scale"], layout=numbers["layout"], logsumexp="log2", dtype=numbers["dtype"],
                  whole=Whole(B=p["B"]),
                  **blocks)  # fmt: skip
    assert cmp.equal and cmp.numerics_ok, [vars(r) for r in cmp.rows]
    assert {n["output"] for n in cmp.numerics} == {"O", "L"}


def test_the_tutorial_attention_at_a_ragged_n_stores_past_its_logsumexp(tutorial):
    *_, (counts, _, _) = tutorial
    # N = 200, BLOCK_M = 128: each head's second row block stores rows 128..255 of M unmasked; head 1's rows
    # 200..255 lie past the end of M (2 x 200 elements)
    assert counts.out_of_bounds_lanes == 56 and counts.per_array["L"].writes == 456
    first = counts.out_of_bounds[0]
    assert (first["kernel"], first["program"], first["array"], first["elements"]) == ("_attn_fwd", [1, 1, 0], "L", 400)
    assert first["kind"] == "w" and first["offsets"][:2] == [400, 401]


def test_a_tutorial_file_that_does_not_import_is_one_line(tmp_path, monkeypatch):
    from iosim.base.errors import InputError
    from iosim.kernels import count_file

    old = tmp_path / "06-fused-attention.py"
    old.write_text("import triton.tools.experimental_descriptor  # gone from Triton 3.9\n")
    monkeypatch.setenv("IOSIM_TUTORIAL_ATTENTION", str(old))
    with pytest.raises(InputError, match="IOSIM_TUTORIAL_ATTENTION must name a file that imports under this"):
        count_file(str(EXAMPLES / "triton_tutorial_attention.py"), params=dict(N=128, d=64))


# --- the CPU stand-in for a GPU probed at import -------------------------------------------------------------------
COPY = textwrap.dedent(
    """

    @triton.jit
    def copy(X, Y, n, B: tl.constexpr):
        i = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(Y + i, tl.load(X + i, mask=i < n), mask=i < n)


    """
)
PROBING = (
    textwrap.dedent(
        """
    import torch
    import triton
    import triton.language as tl

    # what library packages do when imported: ask the active driver and torch.cuda which GPU this is
    TARGET = triton.runtime.driver.active.get_current_target()
    SMEM = triton.runtime.driver.active.utils.get_device_properties(0)["max_shared_mem"]
    CAPABILITY = torch.cuda.get_device_capability()
    NAME = torch.cuda.get_device_name(0)
    BLOCK = 64 if SMEM >= 200_000 else 16  # block sizes picked from the GPU
    """
    )
    + COPY
    + textwrap.dedent(
        """
    def launch(N, d):
        x, y = torch.arange(N, dtype=torch.float32), torch.empty(N)
        copy[(triton.cdiv(N, BLOCK),)](x, y, N, B=BLOCK, num_warps=4)
        return {"X": x, "Y": y, "arch": TARGET.arch, "capability": CAPABILITY[0] * 10 + CAPABILITY[1],
                "name": NAME, "cuda": torch.cuda.is_available()}
    """
    )
)


def test_a_library_that_probes_the_gpu_at_import_counts_with_the_standin(tmp_path, capsys):
    from iosim.cli import main
    from iosim.kernels import count_file

    path = tmp_path / "probing.py"
    path.write_text(PROBING)
    counts, numbers, _ = count_file(str(path), params=dict(N=200, d=1), gpu_standin=True, arrays=False)
    assert numbers["arch"] == 90 and numbers["capability"] == 90 and "stand-in" in numbers["name"]
    assert numbers["cuda"] is False  # tensors stay on the CPU
    assert counts.programs == 4 and counts.launch_info[0]["constexprs"]["B"] == 64
    assert {k: (a.reads, a.writes) for k, a in counts.per_array.items()} == {"X": (200, 0), "Y": (0, 200)}
    # without it: one line naming the probe that failed, exit 2
    assert main(["kernel", str(path), "--N", "200", "--d", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("iosim: error: launcher file must import cleanly")


COUNTS_DRIVERS = (
    textwrap.dedent(
        """
    import torch
    import triton
    import triton.language as tl
    from triton.backends import backends

    # as vLLM's triton_utils/importing.py decides whether Triton is usable: exactly one active non-CPU driver
    ACTIVE = [name for name, b in backends.items() if name != "cpu" and b.driver and b.driver.is_active()]
    if len(ACTIVE) != 1:
        raise RuntimeError(f"{len(ACTIVE)} active driver(s) found (expected 1)")
    """
    )
    + COPY
    + textwrap.dedent(
        """
    def launch(N, d):
        x, y = torch.arange(N, dtype=torch.float32), torch.empty(N)
        copy[(triton.cdiv(N, 64),)](x, y, N, B=64)
        return {"X": x, "Y": y, "active": len(ACTIVE), "nvidia": int(ACTIVE == ["nvidia"])}
    """
    )
)


def test_a_library_that_counts_active_backends_sees_one_under_the_standin(tmp_path, capsys):
    """A probe over ``triton.backends.backends`` (vLLM's) finds one active driver under --gpu-standin, none without."""
    from iosim.cli import main
    from iosim.kernels import count_file

    path = tmp_path / "counting_drivers.py"
    path.write_text(COUNTS_DRIVERS)
    counts, numbers, _ = count_file(str(path), params=dict(N=100, d=1), gpu_standin=True, arrays=False)
    assert numbers["active"] == 1 and numbers["nvidia"] == 1
    assert {k: (a.reads, a.writes) for k, a in counts.per_array.items()} == {"X": (100, 0), "Y": (0, 100)}
    assert main(["kernel", str(path), "--N", "100", "--d", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "active driver" in err[0]


def test_the_standin_lives_only_in_the_counting_process():
    code = "import torch, triton; print(torch.cuda.get_device_capability.__module__)"
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "torch.cuda"  # this process's torch was never touched
