"""jax's Pallas TPU flash-attention op, counted in place under TPU interpret mode (iosim.kernels, backend pallas).

CI installs the ``pallas`` extra (.ci/run), so these tests never skip there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_kernel_cases.py"), "pallas"],
        env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_the_op_ships_with_jax():
    from jax.experimental.pallas.ops.tpu import flash_attention

    assert callable(flash_attention.flash_attention)


def test_square_blocks_equal_flash2s_closed_form_where_it_moves_data(results):
    for r in (r for r in results if r["params"]["Br"] == r["params"]["Bc"]):
        assert r["equal_where_moved"], r["rows"]
        for name in ("Q", "K", "V", "O"):
            assert r["rows"][name][:2] == r["rows"][name][2:4], (name, r["params"])
        assert r["rows"]["L"][:2] == [0, 0]  # no residuals: the op does not write the logsumexp
        assert all(n["ok"] for n in r["numerics"])


def test_the_pipeline_keeps_an_unchanged_block_resident_across_row_blocks(results):
    # Br = 64 < Bc = 128, causal: consecutive row blocks i = 2k, 2k + 1 ask for the same last key block, whose
    # index does not change between the grid steps, so the pipeline does not copy it again: fewer reads than
    # flash2's per-program closed form, which charges every row block for its own K_j, V_j.
    r = next(r for r in results if r["params"]["Br"] == 64)
    for name in ("K", "V"):
        reads, _, model_reads, _, _ = r["rows"][name]
        assert reads == 32768 and model_reads == 49152
    assert r["rows"]["Q"][:2] == r["rows"]["Q"][2:4]


# --- jax's Pallas GPU ops (Triton-lowered), counted under the generic interpreter ------------------------------
GPU_MHA = [dict(N=256, d=64, Br=64, Bc=32, causal=False), dict(N=256, d=64, Br=64, Bc=32, causal=True, H=2),
           dict(N=128, d=32, Br=32, Bc=64, causal=True)]  # fmt: skip
GPU_DECODE = [dict(N=256, d=64, Bc=32, splits=4), dict(N=128, d=16, Bc=16, splits=2, H=3)]


@pytest.fixture(scope="module")
def gpu_results():
    from iosim.kernels import count_batch

    ex = ROOT / "iosim" / "kernels" / "examples"
    jobs = [(ex / "pallas_gpu_mha.py", None, p) for p in GPU_MHA]
    jobs += [(ex / "pallas_gpu_decode.py", None, p) for p in GPU_DECODE]
    return count_batch(jobs, backend="pallas", timeout=600)


def test_the_gpu_ops_ship_with_jax():
    from jax.experimental.pallas.ops.gpu import attention, decode_attention

    assert callable(attention.mha) and callable(decode_attention.mqa)


def test_gpu_mha_equals_flash2s_closed_form_array_by_array(gpu_results):
    from iosim.kernels import compare

    for p, (counts, numbers, arrays) in zip(GPU_MHA, gpu_results, strict=False):
        H = p.get("H", 1)
        cmp = compare(counts, "flash2", p["N"], p["d"], p["Br"], p["Bc"], p["causal"], heads=H, arrays=arrays,
                      scale=numbers["scale"], dtype="float32")  # fmt: skip
        rows = {r.array: r for r in cmp.rows}
        for name in ("Q", "K", "V", "O"):
            assert (rows[name].reads, rows[name].writes) == (rows[name].model_reads, rows[name].model_writes), p
        assert (rows["L"].reads, rows["L"].writes) == (0, 0)  # no residuals asked for: no logsumexp written
        assert set(counts.per_array) == {"Q", "K", "V", "O"}
        assert counts.programs == (p["N"] // p["Br"]) * H and counts.launches == 1
        assert counts.per_array["K"].reads == counts.per_array["K"].distinct_reads  # no re-loads within a program
        if not p["causal"]:  # each program: its Q_i, all of K and V, its O_i (the grid steps are the programs)
            N, d, Br = p["N"], p["d"], p["Br"]
            assert counts.per_program.tolist() == [[Br * d + 2 * N * d, Br * d]] * counts.programs
        assert all(n["ok"] for n in cmp.numerics)


def test_gpu_mha_causal_count_by_hand(gpu_results):
    # N = 256, Br = 64, Bc = 32, causal: row block i reads key blocks 0 .. 2i + 1, i.e. 2 + 4 + 6 + 8 = 20 blocks of
    # 32 x 64 per head, two heads
    counts = gpu_results[1][0]
    assert counts.per_array["K"].reads == 2 * 20 * 32 * 64
    assert counts.per_array["Q"].reads == counts.per_array["O"].writes == 2 * 256 * 64


def test_gpu_decode_against_decode_splitkv(gpu_results):
    from iosim.kernels import compare

    for p, (counts, numbers, arrays) in zip(GPU_DECODE, gpu_results[len(GPU_MHA) :], strict=False):
        N, d, S, H = p["N"], p["d"], p["splits"], p.get("H", 1)
        a = counts.per_array
        assert counts.programs == S and counts.launches == 1  # H <= block_h = 16: one head block
        assert (a["K"].reads, a["V"].reads) == (N * d, N * d)  # the chunks once, shared by the heads of the block
        assert a["Q"].reads == S * H * d and a["lengths"].reads == S  # the block's heads (masked to H), the length
        assert a["O_part"].writes == S * H * d and a["L_part"].writes == a["M_part"].writes == S * H
        assert sum(t.writes for t in a.values()) == S * H * (d + 2)
        cmp = compare(counts, "decode-splitkv", N, d, None, p["Bc"], heads=1, splits=S, arrays=arrays,
                      scale=numbers["scale"], dtype="float32")  # fmt: skip
        assert all(n["ok"] for n in cmp.numerics)
        if H == 1:  # pass 1 of the closed form, to the word; its pass 2 is plain jax after the pallas_call
            rows = {r.array: r for r in cmp.rows}
            for name in ("lengths", "Q", "K", "V"):
                assert (rows[name].reads, rows[name].writes) == (rows[name].model_reads, rows[name].model_writes)
            assert rows["O_part"].writes == rows["O_part"].model_writes and rows["O_part"].reads == 0


def test_gpu_hooks_leave_jax_as_they_found_it():
    from jax._src.pallas import hlo_interpreter as hi
    from jax._src.state import discharge as sd

    from iosim.kernels.counting import Recorder
    from iosim.kernels.pallas_backend import gpu_hooks

    with gpu_hooks(Recorder()):  # the first entry imports Pallas's GPU primitives, which register their rules
        pass
    before = (hi.pallas_call_hlo_interpret, hi.kernel_to_hlo_jaxpr, hi._dynamic_slice, sd.discharge_state,
              dict(sd._discharge_rules))  # fmt: skip
    with gpu_hooks(Recorder()):
        pass
    after = (hi.pallas_call_hlo_interpret, hi.kernel_to_hlo_jaxpr, hi._dynamic_slice, sd.discharge_state,
             dict(sd._discharge_rules))  # fmt: skip
    assert before == after


def test_gpu_internals_that_differ_fail_with_one_line_naming_the_supported_jax(monkeypatch):
    from jax._src.pallas import hlo_interpreter as hi

    from iosim.base.errors import InputError
    from iosim.kernels.pallas_backend import require_gpu

    require_gpu()
    monkeypatch.delattr(hi, "_dynamic_slice")
    with pytest.raises(InputError, match="jax 0.10"):
        require_gpu()


def test_a_gpu_launch_run_twice_counts_twice():
    import jax
    from jax.experimental.pallas.ops.gpu import attention

    from iosim.kernels import count

    def launch():
        q, k, v = (jax.random.normal(key, (1, 128, 1, 32)) for key in jax.random.split(jax.random.PRNGKey(0), 3))
        sizes = attention.BlockSizes(block_q=64, block_k=32)
        for _ in range(2):
            attention.mha(q, k, v, segment_ids=None, block_sizes=sizes, interpret=True).block_until_ready()
        return {"names": {"q": "Q", "k": "K", "v": "V", "o": "O"}}

    counts, _ = count(launch, "pallas")
    assert (counts.launches, counts.programs) == (2, 4)
    a = counts.per_array
    assert (a["Q"].reads, a["K"].reads, a["V"].reads, a["O"].writes) == (
        2 * 128 * 32,
        4 * 128 * 32,
        4 * 128 * 32,
        2 * 128 * 32,
    )
    assert a["K"].distinct_reads == a["K"].reads


def test_a_small_gpu_kernel_counted_by_hand():
    # ref[...] (state get/swap), a slice re-read and re-written, a masked plgpu.load, and a partial last block
    # (N = 20, blocks of 8): the padding of the last block is no element of the array and is not counted
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    from iosim.kernels import count

    def kernel(x_ref, y_ref):
        y_ref[...] = x_ref[...] * 2.0
        y_ref[pl.ds(0, 2)] = x_ref[pl.ds(0, 2)] + 1.0
        head = plgpu.load(x_ref, mask=jnp.arange(8) < 3, other=0.0)  # 3 lanes enabled
        y_ref[pl.ds(2, 1)] = y_ref[pl.ds(2, 1)] + head.sum()  # y read back: 1 read, 1 write

    def launch():
        x = jnp.arange(20, dtype=jnp.float32)
        spec = pl.BlockSpec((8,), lambda i: (i,))
        y = pl.pallas_call(kernel, grid=(3,), in_specs=[spec], out_specs=spec, interpret=True,
                           out_shape=jax.ShapeDtypeStruct((20,), jnp.float32),
                           compiler_params=plgpu.CompilerParams())(x)  # fmt: skip
        return {"names": {"x": "X", "y": "Y"}, "Y": y}

    counts, out = count(launch, "pallas")
    assert counts.per_program.tolist() == [[14, 11], [14, 11], [10, 7]]  # last block: elements 16..19 only
    a = counts.per_array
    assert (a["X"].reads, a["X"].distinct_reads, a["Y"].writes, a["Y"].distinct_writes) == (35, 20, 29, 20)
    assert a["Y"].reads == 3 and a["X"].writes == 0


def test_tritons_atomics_in_a_gpu_kernel_are_a_read_and_a_write_per_lane():
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    from iosim.kernels import count

    def kernel(x_ref, acc_ref):
        plgpu.atomic_add(acc_ref, pl.ds(0, 4), x_ref[...])

    def launch():
        x = jnp.ones((12,), jnp.float32)
        acc = pl.pallas_call(kernel, grid=(3,), in_specs=[pl.BlockSpec((4,), lambda i: (i,))],
                             out_specs=pl.BlockSpec((4,), lambda i: (0,)), interpret=True,
                             out_shape=jax.ShapeDtypeStruct((4,), jnp.float32),
                             compiler_params=plgpu.CompilerParams())(x)  # fmt: skip
        return {"names": {"x": "X", "acc": "A"}, "A": acc}

    counts, _ = count(launch, "pallas")
    a = counts.per_array
    assert (a["A"].reads, a["A"].writes, a["A"].atomics, a["X"].reads) == (12, 12, 12, 12)
    assert counts.per_program.tolist() == [[8, 4]] * 3
