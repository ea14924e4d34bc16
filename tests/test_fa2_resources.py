"""FlashAttention-2's registers and shared memory read from PyTorch's binary (experiments/bench/fa2_resources.py).

The stored record (gpu_h100/fa2-resources.json) is held against the lease's own files (the kernel names Nsight
Compute stored, the full names of the H200 lease's raw CSV, the torch version every lease recorded), its blocks per SM
against the CUDA occupancy calculation written out again here, its shared memory against FlashAttention-2's kernel
traits' expressions written out here, and the docs against the record. The parsing and matching steps run on small
texts written in the tests. No wheel and no cuobjdump are needed.
"""

from __future__ import annotations

import csv
import io
import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "experiments" / "bench"
sys.path.insert(0, str(BENCH))
import fa2_resources as fr  # noqa: E402

REC = json.loads((BENCH / "gpu_h100" / "fa2-resources.json").read_text())
NCU = json.loads((BENCH / "gpu_h100" / "ncu-torch.json").read_text())


def _fa2_names(ncu: dict) -> set[str]:
    return {r["kernel"] for r in ncu["launches"] if "pytorch_flash::" in r["kernel"]}


def _csv_names(path: pathlib.Path) -> set[str]:
    text = path.read_text()
    rows = csv.DictReader(io.StringIO("\n".join(x for x in text.splitlines() if x.startswith('"'))))
    return {r["Kernel Name"] for r in rows if "pytorch_flash::" in r["Kernel Name"]}


# ------------------------------------------------------------------------------- the record is the lease's kernels
def test_record_names_are_the_kernels_ncu_stored():
    """One record per FlashAttention-2 kernel name of ncu-torch.json, no more, no fewer; its full name is that name
    (or, where Nsight's stored name was cut at 200 characters, begins with it)."""
    stored = [k["ncu_name"] for k in REC["kernels"]]
    assert len(stored) == len(set(stored))
    assert set(stored) == _fa2_names(NCU)
    for k in REC["kernels"]:
        assert k["name"] == k["ncu_name"] or (len(k["ncu_name"]) == 200 and k["name"].startswith(k["ncu_name"]))
        assert any(c["name"] == k["name"] for c in k["candidates"])
        launches = {r["label"] for r in NCU["launches"] if r["kernel"] == k["ncu_name"]}
        assert {x["label"] for x in k["launches"]} == launches


def test_record_names_are_the_full_names_the_h200_lease_stored():
    """Each matched name is, character for character, a kernel name in the H200 lease's raw Nsight CSV (same torch
    build, same launches), and all of that CSV's FlashAttention-2 kernels are in the record."""
    full = _csv_names(BENCH / "gpu_h200" / "raw" / "ncu-torch.csv")
    assert {k["name"] for k in REC["kernels"]} == full


def test_wheel_is_the_version_every_lease_ran():
    for lease in ("gpu_h100", "gpu_h200", "gpu_h200_2"):
        env = json.loads((BENCH / lease / "env.json").read_text())
        assert env["torch"] == REC["wheel"]["torch_version"] == "2.11.0+cu130"
    assert re.fullmatch(r"[0-9a-f]{64}", REC["wheel"]["sha256"])
    assert re.fullmatch(r"[0-9a-f]{40}", REC["wheel"]["git_version"])
    assert REC["command"].startswith("python experiments/bench/fa2_resources.py ")
    assert REC["ptx_files"] == 0  # the driver can only load the ELFs' SASS: the ELF's registers are the launch's


# ------------------------------------------------------------------------------------- occupancy, independently
def _blocks(lim: dict, regs: int, smem: int, threads: int) -> dict:
    """cuda_occupancy.h's blocks per SM for cc 8.0-9.0, written out: warps; registers per warp rounded up to 256,
    each of 4 sub-partitions holding whole warps; shared memory plus 1 KiB reserved, rounded up to 128 bytes."""
    warps = (threads + 31) // 32
    per_warp = (regs * 32 + 255) // 256 * 256
    by_regs = (lim["regs_per_sm"] // 4 // per_warp) * 4 // warps
    by_smem = lim["smem_per_sm"] // ((smem + 1024 + 127) // 128 * 128)
    by_thr = lim["max_threads_per_sm"] // 32 // warps
    return {"registers": by_regs, "shared": by_smem, "threads": by_thr, "blocks": lim["max_blocks_per_sm"]}


@pytest.mark.parametrize("dev", ["H100", "H200"])
def test_blocks_per_sm_follow_from_the_binary_registers(dev):
    lim = REC["devices"][dev]
    for k in REC["kernels"]:
        by = _blocks(lim, k["registers"], k["static_smem"] + k["dynamic_smem"], k["threads"])
        r = k["resident"][dev]
        assert r["blocks_per_sm"] == min(by.values()), k["name"]
        assert set(r["limiter"].split(",")) == {n for n, v in by.items() if v == min(by.values())}
        assert (r["blocks_by_registers"], r["blocks_by_smem"]) == (by["registers"], by["shared"])
        one_more = [x for x in range(1, 256)
                    if min(_blocks(lim, x, k["static_smem"] + k["dynamic_smem"], k["threads"]).values())
                    > r["blocks_per_sm"]]  # fmt: skip
        assert r["max_registers_for_one_more_block"] == (max(one_more) if one_more else None)


def test_device_limits_are_the_presets():
    for dev in ("H100", "H200"):
        assert REC["devices"][dev] == fr.device_limits(dev)
        assert REC["devices"][dev]["regs_per_sm"] == 65536 and REC["devices"][dev]["smem_per_sm"] == 228 * 1024


def test_forward_is_two_ctas_by_its_registers():
    """What the hierarchy's table turns on: 255 registers give FA2's forward 2 blocks per SM (3 need <= 168)."""
    fwd = [k for k in REC["kernels"] if "flash_fwd_kernel<" in k["name"]]
    assert len(fwd) == 2
    for k in fwd:
        r = k["resident"]["H100"]
        assert (k["registers"], r["blocks_per_sm"], r["limiter"]) == (255, 2, "registers")
        assert r["blocks_by_smem"] == 3 and r["max_registers_for_one_more_block"] == 168


# ------------------------------------------------------------------------------- shared memory and threads
def _traits(name: str) -> list[int]:
    return [int(x) for x in re.search(r"Flash_\w+_kernel_traits<([\d, ]+), cutlass", name).group(1).split(",")]


def _dynamic_smem(name: str) -> int:
    """FlashAttention-2's launch templates, written out (2-byte elements): the forward asks Q (kBlockM x d) and
    K, V (kBlockN x d each); the seqk-parallel backward Q and dO (3 tiles of kBlockM x d with Q double-buffered),
    K and V, dS and P (kBlockM x kBlockN each); convert_dq one kBlockM x d tile; dot_do_o and combine nothing."""
    t = _traits(name)
    d, bm, bn = t[0], t[1], t[2]
    if "flash_fwd_kernel<" in name or "flash_fwd_splitkv_kernel<" in name:
        return (bm * d + 2 * bn * d) * 2
    if "dq_dk_dv_loop_seqk_parallel" in name:
        return (3 * bm * d + 2 * bn * d + 2 * bm * bn) * 2
    if "convert_dq" in name:
        return bm * d * 2
    return 0


def test_shared_memory_and_threads_of_each_kernel():
    for k in REC["kernels"]:
        assert k["dynamic_smem"] == _dynamic_smem(k["name"]), k["name"]
        assert k["threads"] == _traits(k["name"])[3] * 32
        x, y, z = (int(v) for v in k["block"].strip("()").split(","))
        assert x * y * z == k["threads"]
        # sm_90 ELFs count the 1 KiB reserved per block in SHARED; the sm_80 ELF of the same kernel does not
        assert k["shared_sm90"] - 1024 == k["static_smem"] == k["shared_sm80"]


# ------------------------------------------------------------------------------------------------- the docs
def test_docs_table_is_the_stored_record():
    doc = (ROOT / "docs" / "gpu-resources.md").read_text()
    a, b = fr.BLOCK
    assert doc[doc.index(a) + len(a) : doc.index(b)].strip() == fr.table(REC).strip()


def test_docs_state_the_forward_registers():
    fwd = next(k for k in REC["kernels"] if "flash_fwd_kernel<" in k["name"])
    for page in ("gpu-resources.md", "hierarchy-hardware.md"):
        text = " ".join((ROOT / "docs" / page).read_text().split())
        assert f"{fwd['registers']} registers per thread" in text, page
        assert "fa2_resources.py" in text, page
    hw = " ".join((ROOT / "docs" / "hierarchy-hardware.md").read_text().split())
    assert "next lease measures `launch__registers_per_thread`" not in hw.lower()


# ------------------------------------------------------------------------------------- parsing and matching
DUMP = """
Fatbin elf code:
================
arch = sm_90
code version = [1,8]

Resource usage:
 Common:
  GLOBAL:30 CONSTANT[4]:240
 Function _ZN13pytorch_flash1aEv:
  REG:255 STACK:144 SHARED:1024 LOCAL:0 CONSTANT[0]:1000 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN2at1bEv:
  REG:32 STACK:0 SHARED:1056 LOCAL:4 CONSTANT[0]:900 TEXTURE:0 SURFACE:0 SAMPLER:0

Fatbin elf code:
================
arch = sm_90a

Resource usage:
 Function _ZN13pytorch_flash1cEv:
  REG:128 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:1000 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_parse_resource_usage_keeps_the_exact_arch():
    rows = fr.parse_resource_usage(DUMP, "sm_90")
    assert [(r["mangled"], r["REG"], r["STACK"], r["SHARED"], r["LOCAL"]) for r in rows] == [
        ("_ZN13pytorch_flash1aEv", 255, 144, 1024, 0),
        ("_ZN2at1bEv", 32, 0, 1056, 4),
    ]
    assert [r["mangled"] for r in fr.parse_resource_usage(DUMP, "sm_90a")] == ["_ZN13pytorch_flash1cEv"]
    assert fr.parse_resource_usage(DUMP, "sm_80") == []


def test_nsight_style():
    s = "void f<T<1, false, X<2> >, true, false>(P)"
    assert fr.nsight_style(s) == "void f<T<1, 0, X<2>>, 1, 0>(P)"
    assert fr.nsight_style("void g<trueish>(P)") == "void g<trueish>(P)"


def _k(name, reg, stack=0, shared=1024):
    return {"name": name, "mangled": "_Z" + name, "REG": reg, "STACK": stack, "SHARED": shared, "LOCAL": 0}


def test_match_exact_prefix_and_full_names():
    long_a, long_b = "void pytorch_flash::k<" + "x" * 200 + ", 0>(P)", "void pytorch_flash::k<" + "x" * 200 + ", 1>(P)"
    ks = [_k(long_a, 255, 8), _k(long_b, 255, 16), _k(long_b, 255, 16), _k("void pytorch_flash::s<1>(P)", 40)]
    ran, cands = fr.match(long_a[:200], ks, {long_b})
    assert ran["name"] == long_b and len(cands) == 3
    ran, _ = fr.match("void pytorch_flash::s<1>(P)", ks, set())
    assert ran["REG"] == 40
    with pytest.raises(fr.MismatchError, match="not the binary"):
        fr.match("void pytorch_flash::s<2>(P)", ks, set())  # a name the binary does not have
    with pytest.raises(fr.MismatchError, match="full names pick 0"):
        fr.match(long_a[:200], ks, set())  # two instantiations, nothing to tell which ran
    with pytest.raises(fr.MismatchError, match="not the binary"):
        fr.match("void pytorch_flash::s<1>(", ks, set())  # shorter than 200 characters: must be the whole name
    with pytest.raises(fr.MismatchError, match="different resources"):
        fr.match(long_b[:200], [_k(long_b, 255), _k(long_b, 254)], set())


def test_stored_launches_one_per_name():
    ls = fr.stored_launches(NCU)
    assert {x["ncu_name"] for x in ls} == _fa2_names(NCU)
    assert sorted(x["labels"] for x in ls if "dot_do_o" in x["ncu_name"]) == [[1, 3]]


def test_main_needs_the_binary(capsys):
    assert fr.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lib" in err[0]
    assert fr.main(["--lib", "/nonexistent/libtorch_cuda.so", "--cuobjdump", "/nonexistent/cuobjdump"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


SASS = """
        Function : _ZN13pytorch_flash1aEv
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   STL.64 [R1+0x8], R4 ;
        /*0020*/                   STL [R1], R2 ;
        /*0030*/                   LDL.LU R5, [R1] ;
        /*0040*/                   LDG.E R6, desc[UR4][R2.64] ;
        /*0050*/                   STG.E desc[UR4][R2.64], R6 ;
"""


def test_count_local_access():
    assert fr.count_local_access(SASS) == {"STL": 2, "LDL": 1}


def test_local_instructions_go_with_the_stack_frame():
    """A kernel with no stack frame has no local-memory instruction, and one with a frame writes and reads it."""
    for k in REC["kernels"]:
        lm = k["local_memory_instructions"]
        assert (lm["STL"] > 0) == (lm["LDL"] > 0) == (k["stack_bytes"] > 0), k["name"]
