"""The per-kernel resource report (registers, spills, shared memory, occupancy; no GPU needed) and the one-line
answer every CUDA command gives when the ``cuda`` extra is missing."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from iosim.base.errors import install_hint
from iosim.gpu import resources

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------------------------
# Occupancy arithmetic (cuda_occupancy.h) on hand-checked cases: no toolkit needed.

A100, H100 = resources.ARCHS[(8, 0)], resources.ARCHS[(9, 0)]


@pytest.mark.parametrize(
    "arch,regs,static,dynamic,threads,by_regs,by_smem,blocks",
    [
        # 103 regs -> 13 * 256 per warp -> 4 warps per sub-partition -> 16 warps -> 4 blocks of 4 warps;
        # 16380 + 1024 reserved -> 17408 allocated -> 164 KiB / 17408 = 9.
        (A100, 103, 0, 16380, 128, 4, 9, 4),
        # 255 regs -> 8192 per warp -> 2 warps per sub-partition -> 8 warps -> 2 blocks; 48 KiB + 1 KiB -> 4.
        (H100, 255, 0, 48 * 1024, 128, 2, 4, 2),
        # The largest block H100 takes: 227 KiB + 1 KiB reserved = the whole 228 KiB; one more word does not fit.
        (H100, 32, 0, 227 * 1024, 128, 16, 1, 1),
        (H100, 32, 0, 227 * 1024 + 4, 128, 16, 0, 0),
        (A100, 32, 0, 163 * 1024 + 4, 128, 16, 0, 0),
        # Static shared memory counts against the same opt-in ceiling.
        (A100, 32, 1024, 163 * 1024 - 1020, 128, 16, 0, 0),
        # 1024 threads of 32 regs: 32 warps, 2 blocks by threads and by registers; no shared memory at all -> 164.
        (A100, 32, 0, 0, 1024, 2, 164, 2),
    ],
)
def test_occupancy_limits(arch, regs, static, dynamic, threads, by_regs, by_smem, blocks):
    o = resources.occupancy(arch, regs, static, dynamic, threads)
    assert (o["blocks_by_registers"], o["blocks_by_smem"], o["blocks_per_sm"]) == (by_regs, by_smem, blocks)
    assert o["occupancy"] == blocks * -(-threads // 32) / 64


def test_info_log_parsing():
    log = textwrap.dedent(
        """
        ptxas info    : Compiling entry function '_Z6kernel' for 'sm_90'
        ptxas info    : Function properties for _Z6helper
        ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
        ptxas info    : Function properties for _Z6kernel
        ptxas         .     0 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads
        ptxas info    : Used 90 registers, used 1 barriers
        info    : Function properties for '_Z6kernel':
        info    : used 90 registers, used 1 barriers, 0 stack, 1024 bytes smem, 1048 bytes cmem[0], 0 bytes lmem
        """
    )
    r = resources.parse_info_log(log)
    assert r == {"registers": 90, "barriers": 1, "stack": 16, "smem": 1024, "spill_stores": 20, "spill_loads": 16}


# ---------------------------------------------------------------------------------------------------------------
# The report itself: every kernel compiled and assembled for sm_80 and sm_90 (about 20 s on two cores).


def test_resource_report_has_real_numbers_for_every_kernel():
    pytest.importorskip("numba_cuda", reason="numba-cuda is not installed (pip install -e '.[cuda]')")
    missing = resources.toolchain_missing()
    if missing:
        pytest.skip(missing)
    from iosim.algorithms.cuda import ptx

    Ms = (4096, 49152)
    cmd = [sys.executable, "-m", "iosim.cli", "gpu-resources", "--json", "--cc", "8.0", "9.0", "--M", *map(str, Ms)]
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    rows = json.loads(p.stdout)
    kernels = set(ptx.signatures())
    for cc in ("8.0", "9.0"):
        for M in Ms:
            assert {r["kernel"] for r in rows if r["cc"] == cc and r["M"] == M} == kernels
    for r in rows:
        where = f"{r['kernel']} sm_{r['cc']} M={r['M']}"
        assert 0 < r["registers"] <= 255, where
        assert r["spill_stores"] == r["spill_loads"] == r["stack"] == 0, where + ": spills to local memory"
        assert r["static_smem"] == 0, where  # the kernels use dynamic shared memory only
        assert r["reserved_smem"] in (0, 1024), where
        if r["dynamic_smem"] is not None:
            assert r["dynamic_smem"] <= 4 * r["M"], where  # the launch's layout fits the fast memory M
        fits = (r["dynamic_smem"] or 0) <= (163 if r["cc"] == "8.0" else 227) * 1024
        assert (r["blocks_per_sm"] > 0) == fits, where
        assert ("OVER" in r["warnings"]) == (not fits), where
    # M = 49152 words (192 KiB) fits one H100 block but no A100 block.
    f2 = {(r["cc"], r["M"]): r for r in rows if r["kernel"] == "flash2_forward_kernel"}
    assert f2["9.0", 49152]["blocks_per_sm"] == 1 and f2["8.0", 49152]["blocks_per_sm"] == 0
    # docs/gpu-resources.md's excerpt of this report is what it prints today (registers depend on the toolkit's version)
    import pathlib
    import re

    doc = (pathlib.Path(ROOT) / "docs" / "gpu-resources.md").read_text()
    excerpt = re.findall(r"^\| ([89]\.0) \| (\w+) \| (\d+) \| [^|]+ \| \d+ \| (\d+) \|", doc, flags=re.M)
    assert len(excerpt) >= 12
    regs = {(r["cc"], r["kernel"].removesuffix("_kernel"), r["M"]): r["registers"] for r in rows}
    for cc, kernel, M, registers in excerpt:
        assert regs[cc, kernel, int(M)] == int(registers), (
            f"docs/gpu-resources.md: {kernel} sm_{cc} M={M}: {registers} registers"
        )


# ---------------------------------------------------------------------------------------------------------------
# Without the cuda extra: one line naming it, exit 2, no traceback.

BLOCK_NUMBA_CUDA = textwrap.dedent(
    """
    import runpy, sys

    class _NoNumbaCuda:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "numba_cuda" or name == "numba.cuda" or name.startswith("numba.cuda."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, _NoNumbaCuda())
    """
)

WITHOUT_CUDA = {
    "iosim check": "from iosim.cli import main; sys.exit(main(['check', '--kernel', 'flash2', '--quick']))",
    "iosim gpu-resources": "from iosim.cli import main; sys.exit(main(['gpu-resources']))",
    "python -m ...ptx": "sys.argv = ['ptx']; runpy.run_module('iosim.algorithms.cuda.ptx', run_name='__main__')",
    "python -m iosim.cli": (
        "sys.argv = ['iosim', 'gpu-resources']; runpy.run_module('iosim.cli', run_name='__main__')"
    ),
    "experiments/bench/gpu.py": (
        "sys.argv = ['gpu.py', '--quick']; runpy.run_path('experiments/bench/gpu.py', run_name='__main__')"
    ),
    "iosim.gpu.launch.forward": (
        "import numpy as np\n"
        "from iosim.gpu import launch as gpu\n"
        "x = np.ones((4, 2), np.float32)\n"
        "try:\n"
        "    gpu.forward('flash2', x, x, x, M=64)\n"
        "except Exception as e:\n"
        "    print(type(e).__name__ + ': ' + str(e), file=sys.stderr); sys.exit(2)"
    ),
}


@pytest.mark.parametrize("command", list(WITHOUT_CUDA))
def test_missing_cuda_extra_says_what_to_install(command):
    code = BLOCK_NUMBA_CUDA + WITHOUT_CUDA[command]
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert install_hint("cuda") in p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    if command == "iosim.gpu.launch.forward":
        assert p.stderr.startswith("InputError: the cuda extra")
