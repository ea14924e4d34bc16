"""The LSU level of ``iosim kernel`` (Triton): the 32-byte sectors each tl.load / tl.store of a program touches under
its mask, summed per array (iosim.kernels.counting.sectors_of), against sectors counted here from the kernels'
own index arithmetic: a ragged N with masked edges, rows of d * 2 bytes not a multiple of 32, a strided view, the
Triton tutorial's attention (tensor descriptors), and every access aligned (sectors x 32 = the bytes moved).

The model in this file: one request per access of one program; its sectors are the distinct ``byte // 32`` of the
elements it moves; every array's storage starts on a sector boundary (torch's CPU allocator aligns to 64 bytes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "iosim" / "kernels" / "examples"
SECTOR = 32


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _sectors(first_bytes) -> int:
    return len({b // SECTOR for b in first_bytes})


def flash2_sectors(N: int, d: int, H: int, Br: int, Bc: int, es: int = 2) -> dict:
    """Sectors per array of examples/triton_flash2.py (not causal): program (i, h) loads Q rows i Br.., every K and
    V block of Bc rows, stores O as Q and L (fp32) at h N + row; rows past N and columns past d masked."""
    out = {"Q": 0, "K": 0, "V": 0, "O": 0, "L": 0}

    def rows(h, r0, n):
        return _sectors((h * N + r) * d * es + c * es for r in range(r0, min(r0 + n, N)) for c in range(d))

    for h in range(H):
        kv = sum(rows(h, s, Bc) for s in range(0, N, Bc))
        for i in range(_cdiv(N, Br)):
            q = rows(h, i * Br, Br)
            out["Q"] += q
            out["O"] += q
            out["K"] += kv
            out["V"] += kv
            out["L"] += _sectors((h * N + r) * 4 for r in range(i * Br, min(i * Br + Br, N)))
    return out


def copy_sectors(R: int, LD: int, offset: int, W: int, BLOCK_R: int, es: int = 2) -> dict:
    """Sectors of tests/_kernel_lsu_launchers.py's copy: X[r, c] at byte (r LD + offset + c) es of its storage, Y
    contiguous R x W."""
    x = y = 0
    for i in range(_cdiv(R, BLOCK_R)):
        rs = range(i * BLOCK_R, min(i * BLOCK_R + BLOCK_R, R))
        x += _sectors((r * LD + offset + c) * es for r in rs for c in range(W))
        y += _sectors((r * W + c) * es for r in rs for c in range(W))
    return {"X": x, "Y": y}


def _kernel_json(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "iosim.cli", "kernel", *args, "--json"], capture_output=True,
                         text=True, timeout=600, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_sector_bytes_is_the_hierarchy_lsu_sector():
    from iosim.hierarchy import lsu
    from iosim.kernels import counting

    assert counting.SECTOR_BYTES == lsu.SECTOR_BYTES == SECTOR


def test_sectors_of_counts_distinct_sectors_whole():
    import numpy as np

    from iosim.kernels.counting import sectors_of

    assert sectors_of(np.array([], dtype=np.uint64), 2) == 0
    assert sectors_of(np.arange(0, 64, 2, dtype=np.uint64), 2) == 2  # 32 fp16 lanes, two whole sectors
    assert sectors_of(np.array([30, 30, 30], dtype=np.uint64), 2) == 1  # lanes sharing a sector: once
    assert sectors_of(np.array([30, 34], dtype=np.uint64), 2) == 2  # 4 bytes over two partial sectors: both
    assert sectors_of(np.array([30], dtype=np.uint64), 4) == 2  # a misaligned lane straddling two sectors


RAGGED = {"N": 50, "d": 20, "H": 2, "Br": 16, "Bc": 16}  # masked last blocks; 40-byte rows: partial sectors
ALIGNED = {"N": 64, "d": 16, "H": 2, "Br": 16, "Bc": 32}  # 32-byte rows: every request covers whole sectors


def _check_flash2(counts, params: dict) -> None:
    """The per-array sectors of a triton_flash2 count (KernelCounts or its JSON) against :func:`flash2_sectors`."""
    doc = counts if isinstance(counts, dict) else counts.to_dict()
    per, lsu = doc["per_array"], doc["lsu"]
    want = flash2_sectors(**params)
    assert doc["sectors_counted"] is True and lsu["sector_bytes"] == SECTOR
    for name, n in want.items():
        ld, st = (n, 0) if name in ("Q", "K", "V") else (0, n)
        assert (per[name]["load_sectors"], per[name]["store_sectors"]) == (ld, st), name
        assert (lsu["per_array"][name]["ld"], lsu["per_array"][name]["st"]) == (ld * SECTOR, st * SECTOR), name
    assert lsu["ld"] == SECTOR * (want["Q"] + want["K"] + want["V"])
    assert lsu["st"] == SECTOR * (want["O"] + want["L"])


def test_strided_view_ragged_aligned_atomics_and_descriptors_in_one_batch():
    from iosim.kernels.counting import count_batch, lsu_lines

    jobs = [(str(ROOT / "tests" / "_kernel_lsu_launchers.py"), None, {}),
            (str(EXAMPLES / "triton_flash2.py"), None, RAGGED),
            (str(EXAMPLES / "triton_flash2.py"), None, ALIGNED),
            (str(ROOT / "tests" / "_kernel_lsu_launchers.py"), "launch_atomic", {}),
            (str(ROOT / "tests" / "_kernel_launches.py"), "launch_desc", {"N": 40, "d": 16})]  # fmt: skip
    got = count_batch(jobs, "triton", timeout=600, arrays=False, fast=True)
    (copy, _, _), (ragged, _, _), (aligned, _, _), (atomic, _, _), (desc, _, _) = got
    _check_atomic_and_descriptors(atomic, desc)
    want = copy_sectors(37, 40, 3, 20, 16)
    assert copy.per_array["X"].load_sectors == want["X"]
    assert copy.per_array["Y"].store_sectors == want["Y"]
    assert copy.lsu()["ld"] == want["X"] * SECTOR
    assert copy.per_array["X"].load_sectors * SECTOR > copy.per_array["X"].read_bytes  # the view's partial sectors
    _check_flash2(ragged, RAGGED)
    assert ragged.lsu()["ld"] > sum(a.read_bytes for a in ragged.per_array.values())  # partial sectors counted whole
    assert any(line.startswith("LSU L:") for line in lsu_lines(ragged))  # L's 200-byte heads: partial sectors
    _check_flash2(aligned, ALIGNED)
    lsu = aligned.lsu()
    for name, a in aligned.per_array.items():  # aligned: sectors x 32 = the bytes moved, array by array
        assert (lsu["per_array"][name]["ld"], lsu["per_array"][name]["st"]) == (a.read_bytes, a.write_bytes), name
    assert lsu_lines(aligned)[-1].endswith("every sector whole: the bytes moved")
    from iosim.kernels.comparison import Whole, compare

    p = ALIGNED
    cmp = compare(aligned, "flash2", p["N"], p["d"], p["Br"], p["Bc"], heads=p["H"], whole=Whole(H_q=p["H"]))
    assert cmp.equal and "LSU (32-byte sectors" not in cmp.table()
    assert cmp.table(lsu=True).splitlines()[-1] == lsu_lines(aligned)[-1]


def _check_atomic_and_descriptors(atomic, desc) -> None:
    """tests/_kernel_lsu_launchers.py's atomic adds at a 12-byte stride (37 rows, blocks of 16), and
    tests/_kernel_launches.py's descriptor forward at N = 40, d = 16 (float32: 64-byte rows; blocks of 32 query
    and 16 key rows, rows past N padded by the descriptor, not moved)."""
    want = sum(_sectors(r * 12 for r in range(i, min(i + 16, 37))) for i in range(0, 37, 16))
    a = atomic.per_array["Y"]
    assert (a.atomic_sectors, a.load_sectors, a.store_sectors) == (want, 0, 0)
    assert atomic.lsu()["atom"] == want * SECTOR
    N, row = 40, 16 * 4
    q = N * row // SECTOR  # Q (and O) once: 80 sectors
    kv = _cdiv(N, 32) * q  # all of K (and V) per program
    per = desc.per_array
    assert {k: (per[k].descriptor_load_sectors, per[k].load_sectors) for k in "QKV"} == {
        "Q": (q, 0), "K": (kv, 0), "V": (kv, 0)}  # fmt: skip
    assert (per["O"].descriptor_store_sectors, per["O"].store_sectors) == (q, 0)
    assert per["L"].store_sectors == _sectors(r * 4 for r in range(32)) + _sectors(r * 4 for r in range(32, N))
    lsu = desc.lsu()
    assert (lsu["descriptor_ld"], lsu["descriptor_st"], lsu["ld"]) == ((q + 2 * kv) * SECTOR, q * SECTOR, 0)


@pytest.mark.slow
def test_kernel_json_carries_the_lsu_level():
    """``iosim kernel --json``: the counts' ``lsu`` and the per-array sectors, as counted (the ragged case)."""
    args = [f"--{k}={v}" for k, v in RAGGED.items()]
    doc = _kernel_json(str(EXAMPLES / "triton_flash2.py"), *args, "--fast")
    _check_flash2(doc["counts"], RAGGED)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("IOSIM_TUTORIAL_ATTENTION") and
                    __import__("importlib").util.find_spec("flash_mlm") is None,
                    reason="the tutorial's kernel: flash-mlm or IOSIM_TUTORIAL_ATTENTION")  # fmt: skip
def test_tutorial_attention_descriptor_sectors_apart_and_whole():
    """The tutorial's forward moves Q, K, V, O through tensor descriptors (TMA on sm_90: apart from the LSU's) and
    stores its logsumexp M with tl.store: 128-byte rows, every sector whole. N = 128; BLOCK_M as its autotuner
    chose (the tutorial keeps one config under pytest)."""
    from iosim.kernels.counting import count_file

    N, d, H = 128, 64, 1
    counts, _, _ = count_file(str(EXAMPLES / "triton_tutorial_attention.py"), params={"N": N, "d": d, "H": H},
                              arrays=False, fast=True, timeout=600)  # fmt: skip
    lsu, consts = counts.lsu(), counts.launch_info[0]["constexprs"]
    rows = N * d * 2 // SECTOR  # one head's Q (or K, V, O) in sectors
    programs = _cdiv(N, consts["BLOCK_M"])
    want = {"Q": (rows, 0), "K": (programs * rows, 0), "V": (programs * rows, 0), "O": (0, rows)}
    for name, (ld, st) in want.items():
        p = lsu["per_array"][name]
        assert (p["descriptor_ld"], p["descriptor_st"], p["ld"], p["st"]) == (ld * SECTOR, st * SECTOR, 0, 0), name
    assert lsu["per_array"]["L"]["st"] == N * 4 == counts.per_array["L"].write_bytes
    assert lsu["ld"] == 0 and lsu["st"] == N * 4


def test_lsu_flag_prints_the_sector_level(cli):
    """``iosim kernel --lsu``: the LSU line under the table, with and without --like; its bytes are the sectors of
    flash2 at d = 16 (32-byte fp16 rows: each tile row is one whole sector), counted here: Q, K, V loads 3 N d x 2
    bytes; O's stores N d x 2 and L's N x 4 (fp32, 40 x 4 = 160 bytes, 5 whole sectors)."""
    N, d = 40, 16
    words = {"Q": N * d, "K": N * d, "V": N * d}  # flash2 at one row block reads each of Q, K, V once
    ld, st = 2 * sum(words.values()), 2 * N * d + 4 * N
    for like in ((), ("--like", "flash2")):
        rc, out, err = cli(str(EXAMPLES / "triton_flash2.py"), f"--N={N}", f"--d={d}", "--Br=64", "--Bc=64",
                           "--fast", "--lsu", *like)  # fmt: skip
        assert rc == 0, err
        line = next(x for x in out.splitlines() if x.startswith("LSU"))
        assert f"loads {ld:,} bytes, stores {st:,} bytes" in line, line
        rc, out, _ = cli(str(EXAMPLES / "triton_flash2.py"), f"--N={N}", f"--d={d}", "--fast", *like)
        assert rc == 0 and "LSU" not in out


def test_lsu_flag_refused_on_a_named_non_triton_backend(cli):
    for backend in ("pallas", "numba-cuda"):
        rc, out, err = cli(str(EXAMPLES / "numba_cuda_flash2.py"), "--N=40", "--d=16", "--lsu", "--backend", backend)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--lsu" in err, err
