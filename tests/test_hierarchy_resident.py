"""Resident CTAs computed inside hierarchy() from the launch's kernel (``kernel=``, with a device), and sector-granular
fills inside the L2's lines.

The independent occupancy here is written from the per-SM limits as the sources give them (CUDA C++ Programming
Guide, "Technical Specifications per Compute Capability" and the "Shared Memory" sections of compute capability 8.x
and 9.0; the allocation granularities of cuda_occupancy.h), not from iosim's tables."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from iosim import InputError
from iosim.hierarchy import hierarchy

ROOT = pathlib.Path(__file__).resolve().parents[1]
KIB = 1024
# (SMs, shared memory per SM, per block with the opt-in): the H100 SXM and A100 whitepapers' SM counts, the
# Programming Guide's 228 / 164 KB per SM and 227 / 163 KB per block.
SM = {"H100": (132, 228 * KIB, 227 * KIB), "A100": (108, 164 * KIB, 163 * KIB)}
REGS_PER_SM, THREADS_PER_SM, BLOCKS_PER_SM = 65536, 2048, 32  # cc 8.0 and 9.0 alike
RESERVED = 1 * KIB  # per block, for system use (cc 8.0 and later)
REG_UNIT, SUB_PARTITIONS, SMEM_UNIT = 256, 4, 128  # cuda_occupancy.h's granularities


def occupancy(dev: str, threads: int, registers: int | None, smem: int) -> tuple[int, set]:
    """(blocks per SM, the limits that bind) from the sources' rules; registers None: not counted."""
    _, smem_sm, _ = SM[dev]
    warps = -(-threads // 32)
    limits = {"threads": THREADS_PER_SM // (32 * warps), "blocks": BLOCKS_PER_SM,
              "shared": smem_sm // (-(-(smem + RESERVED) // SMEM_UNIT) * SMEM_UNIT)}  # fmt: skip
    if registers is not None:
        per_warp = -(-(registers * 32) // REG_UNIT) * REG_UNIT
        limits["registers"] = (REGS_PER_SM // SUB_PARTITIONS // per_warp) * SUB_PARTITIONS // warps
    best = min(limits.values())
    return best, {k for k, v in limits.items() if v == best}


TINY = dict(N=32, d=16, M=512)  # a launch of 4 row blocks: cheap, the machine is what is tested

KERNELS = [  # (threads, registers, shared memory bytes per block)
    (128, None, 65536),
    (128, 173, 64480),
    (256, 64, 16384),
    (1024, 32, 0),
    (96, 255, 4096),
    (64, 40, 100 * KIB),
    (32, 16, 512),
]


@pytest.mark.parametrize("dev", ["H100", "A100"])
def test_blocks_per_sm_come_from_the_kernels_resources(dev):
    for threads, registers, smem in KERNELS:
        want, binds = occupancy(dev, threads, registers, smem)
        kernel = dict(threads=threads, smem_bytes=smem, name="k")
        if registers is not None:
            kernel["registers"] = registers
        r = hierarchy("flash2", device=dev, kernel=kernel, **TINY)
        assert r.blocks_per_sm == want, (dev, threads, registers, smem)
        limiter = r.resident.split(": ", 1)[1]
        assert set(limiter.split(";")[0].split(",")) == binds, r.resident
        assert limiter.endswith("registers unknown (upper bound)") == (registers is None)
        assert r.waves == [-(-r.ctas // (SM[dev][0] * want))]
        assert r.as_dict()["resident"] == r.resident


def test_the_counts_are_those_of_the_same_blocks_per_sm_given():
    """The kernel's figure runs the clock with that many slots: the same counts as giving the number."""
    kernel = dict(threads=128, registers=173, smem_bytes=64480)
    a = hierarchy("flash2", N=256, d=16, M=512, B=2, H_q=3, device="H100", C=2048, kernel=kernel)
    b = hierarchy("flash2", N=256, d=16, M=512, B=2, H_q=3, device="H100", C=2048, blocks_per_sm=2)
    assert a.blocks_per_sm == b.blocks_per_sm == 2
    assert (a.dram_read, a.dram_update, a.clock) == (b.dram_read, b.dram_update, b.clock)
    assert b.resident == "given"


def fa2_fwd_smem(d, bm, bn, eb):
    return bm * d * eb + 2 * bn * d * eb  # Q tile, then K and V tiles (kernel_traits.h, kSmemSize)


def fa2_bwd_smem(d, bm, bn, eb):
    return 3 * bm * d * eb + 2 * bn * d * eb + 2 * bm * bn * eb  # Q double-buffered, dO; K, V; dS, P


@pytest.mark.parametrize(
    ("name", "threads", "smem"),
    [
        ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, 0, 0, cutlass::half_t>", 128,
         fa2_fwd_smem(128, 128, 64, 2)),
        ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, 0, 0, "
         "cutlass::half_t>", 256, fa2_bwd_smem(128, 64, 128, 2)),
        ("flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, 0, 0, cutlass::bfloat16_t>", 128,
         fa2_fwd_smem(128, 64, 128, 2)),
    ],
)  # fmt: skip
def test_flashattention2_kernels_by_name_give_an_upper_bound(name, threads, smem):
    want, binds = occupancy("H100", threads, None, smem)
    r = hierarchy("flash2", device="H100", kernel=name, **TINY)
    assert r.blocks_per_sm == want and r.resident.endswith("registers unknown (upper bound)")
    assert set(r.resident.split(": ", 1)[1].split(";")[0].split(",")) == binds


def test_the_h100_experiments_blocks_per_sm_are_hierarchys_own():
    """experiments/bench/hierarchy_h100.py no longer passes blocks per SM: the stored runs' figures are what
    hierarchy() computes from each launch's main kernel (its name as Nsight Compute stored it)."""
    sys.path.insert(0, str(ROOT / "experiments" / "bench"))
    import hierarchy_h100 as h

    stored = json.loads(h.STORED.read_text())["runs"]
    for name in ("forward", "forward causal", "backward", "backward causal"):
        r = hierarchy("flash2", device="H100", kernel=h.main_kernel(name), **TINY)
        assert r.blocks_per_sm == stored[f"{name} | + resident CTAs"]["blocks_per_sm"], name
    r = hierarchy("flash2", device="H100", kernel=h.IOSIM_FLASH2_FORWARD, **TINY)
    pred = {e["id"]: e for e in json.loads(h.PREDICTIONS.read_text())["entries"]}
    assert r.blocks_per_sm == pred["iosim-fwd-causal-ascending"]["blocks_per_sm"] == 2
    assert r.resident.endswith(": registers")


def test_a_passed_value_wins_up_to_what_the_resources_allow():
    kernel = dict(threads=128, registers=173, smem_bytes=64480)  # 2 per SM, registers bind
    r = hierarchy("flash2", device="H100", kernel=kernel, blocks_per_sm=1, **TINY)
    assert r.blocks_per_sm == 1 and r.resident.startswith("given (at most 2 ")
    with pytest.raises(InputError) as e:
        hierarchy("flash2", device="H100", kernel=kernel, blocks_per_sm=3, **TINY)
    assert e.value.parameter == "blocks_per_sm" and "at most 2" in str(e.value)


def test_without_a_kernel_the_shared_memory_of_m_words_decides_as_before():
    r = hierarchy("flash2", N=256, d=64, device="H100", M=16384)  # 32 KiB blocks: 228 KiB / 33 KiB = 6
    assert r.blocks_per_sm == 6 and r.resident.startswith("shared memory of M words")
    r = hierarchy("flash2", N=32, d=16, M=512, C=64)
    assert r.blocks_per_sm == 1 and r.resident == "one per SM (no device)"


@pytest.mark.parametrize(
    ("kw", "parameter"),
    [
        (dict(kernel=dict(threads=128, smem_bytes=0), C=64), "kernel"),  # no device
        (dict(kernel=dict(threads=128), device="H100"), "kernel"),
        (dict(kernel=dict(threads=128, smem_bytes=0, regs=3), device="H100"), "kernel"),
        (dict(kernel=5, device="H100"), "kernel"),
        (dict(kernel="flash_attn_kernel", device="H100"), "kernel name"),
        (dict(kernel=dict(threads=0, smem_bytes=0), device="H100"), "kernel threads"),
        (dict(kernel=dict(threads=128, smem_bytes=228 * KIB), device="H100"), "smem_bytes"),
        (dict(kernel=dict(threads=128, smem_bytes=0, registers=256), device="H100"), "registers"),
        (dict(kernel=dict(threads=1024, smem_bytes=0, registers=255), device="H100"), "kernel"),  # fits no SM
    ],
)
def test_bad_kernels_name_the_parameter(kw, parameter):
    with pytest.raises(InputError) as e:
        hierarchy("flash2", **TINY, **kw)
    assert e.value.parameter == parameter


def test_cli_kernel(capsys):
    from iosim.cli import main

    args = ["hierarchy", "flash2", "--N", "32", "--d", "16", "--M", "512", "--device", "H100"]
    assert main([*args, "--kernel", "threads=128,smem=64480,registers=173"]) == 0
    out = capsys.readouterr().out
    assert "blocks per SM: 2 (given kernel's resources on the H100: registers)" in out
    assert main([*args, "--kernel", "threads=128,smem=65536"]) == 0
    assert "blocks per SM: 3 (" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # argparse's own refusal: one line, exit 2
        main([*args, "--kernel", "threads=128"])
    assert e.value.code == 2 and "--kernel needs threads= and smem=" in capsys.readouterr().err
    assert main([*args, "--kernel", "threads=128,smem=0,registers=999"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
