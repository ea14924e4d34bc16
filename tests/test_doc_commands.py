"""Every command the README and the docs pages show in a ``bash`` block runs as documented: exit code 0 in the
environment the README installs (every extra), from a fresh folder, with the repository's files where a command
names one. Commands that need a GPU, or that the pages say run for minutes, are listed here with the reason and run
under ``-m slow`` (or on a GPU machine); a command that stands for the reader's own file is listed as such."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Commands that run for minutes (the pages say so beside them): the long test run only.
SLOW = {
    "iosim experiments run all": "every experiment, several minutes",
    "iosim experiments run flash-thm2": "about a minute and a half on 2 cores",
    "python experiments/01_crossover.py": "a whole experiment",
    "python experiments/17_topk_overlap.py": "a whole experiment (its --quick grid runs in tests/test_experiments.py)",
    "python experiments/bench/gpu.py": "needs a GPU",
    "iosim sweep": "a 16-point grid at N = 4096 with its numeric references",
    "iosim run flash1 --N 4096 --d 64 --M 16384": "a numeric run with its reference",
    "iosim replay flash2 --N 512 --d 64 --M 8192": "three cache policies over 34 million accesses",
    "iosim kernel iosim/kernels/examples/triton_flash2_masked.py": "a Triton kernel at N = 1024 under the interpreter",
    "iosim kernel iosim/kernels/examples/pallas_gpu_decode.py": "a Pallas kernel at N = 1024 under the interpreter",
    "python -m iosim.algorithms.cuda.ptx": "compiles every kernel for sm_90 (tests/test_cuda.py compiles them too)",
    "python experiments/bench/kernel_count.py": "a benchmark: counts a kernel up to N = 4096",
    "python experiments/bench/estimates.py": "a benchmark: times every guarded path (35 s, 2-3 minutes compiling)",
    "python experiments/bench/simulator.py": "a benchmark: iosim check of each kernel on the CUDA simulator (minutes)",
    "iosim gpu-resources": "compiles every kernel for two targets (tests/test_gpu_resources.py runs it too)",
}
# Commands that need a process of their own: the resource report compiles for a real GPU target, which the CUDA
# simulator this test process runs under (tests/conftest.py) rules out.
OWN_PROCESS = {"iosim gpu-resources": "compiles for sm_80 / sm_90 without the CUDA simulator"}
GPU = {"python experiments/bench/gpu.py": "times the CUDA kernels on a GPU"}
# Stands for the reader's own file (the page says "any file").
OWN = {"iosim kernel my_kernel.py:launch_small": "the reader's own launcher file"}


EXPECTED_EXIT: dict[str, int] = {}


def commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                cmd, _, comment = line.partition(" #")
                cmd = cmd.strip()
                if cmd.startswith(("iosim ", "python experiments/", "python -m iosim")):
                    found.append((str(page.relative_to(ROOT)), cmd))
                    said = re.search(r"\bexit (\d)\b", comment)  # a command shown failing says its exit code
                    if said:
                        EXPECTED_EXIT[cmd] = int(said.group(1))
    return found


COMMANDS = commands()


def matches(cmd: str, table: dict) -> str | None:
    return next((why for prefix, why in table.items() if cmd == prefix or cmd.startswith(prefix + " ")), None)


def test_the_pages_show_commands():
    assert len(COMMANDS) >= 30
    assert not [c for _, c in COMMANDS if "TODO" in c]


# A kernel counted or checked under its interpreter starts a process of its own (4-12 s each): the README's one runs
# in the default suite, the docs pages' in the long run (tests/test_kernels_*.py count the same kernels there).
INTERPRETED = ("iosim kernel ", "iosim check ")


def params():
    out, seen = [], set()
    for page, cmd in COMMANDS:
        if cmd in seen:  # the same command on two pages runs once
            continue
        seen.add(cmd)
        marks = []
        if matches(cmd, OWN):
            continue
        if matches(cmd, SLOW) or matches(cmd, GPU) or (cmd.startswith(INTERPRETED) and page != "README.md"):
            marks.append(pytest.mark.slow)
        out.append(pytest.param(cmd, id=f"{page}: {cmd[:90]}", marks=marks))
    return out


@pytest.mark.parametrize("cmd", params())
def test_command_runs_as_documented(cmd, tmp_path):
    if matches(cmd, GPU) and os.environ.get("IOSIM_GPU") != "1":
        pytest.skip(f"needs a GPU: {matches(cmd, GPU)}")
    args = shlex.split(cmd)
    # the repository's files by their path from the root; whatever the command writes lands in tmp_path
    args = [str(ROOT / a) if (ROOT / a.split(":")[0]).is_file() and "/" in a else a for a in args]
    # a mask_mod file named by --mask mod:FILE.py:NAME, by its path from the root too
    args = [f"mod:{ROOT / a.split(':')[1]}:{a.split(':', 2)[2]}" if a.startswith("mod:") and a.count(":") == 2
            and (ROOT / a.split(":")[1]).is_file() else a for a in args]  # fmt: skip
    env = dict(os.environ)
    if matches(cmd, OWN_PROCESS):
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        args = ["python", "-m", "iosim.cli", *args[1:]]
    if args[0] == "iosim":  # in this process (the command line's own entry point), from the fresh folder
        from iosim.cli import main

        old = os.getcwd()
        os.chdir(tmp_path)
        try:
            rc = main(args[1:])
        finally:
            os.chdir(old)
        assert rc == EXPECTED_EXIT.get(cmd, 0), f"{cmd}: exit {rc}"
        return
    argv = [sys.executable, *args[1:]]
    out = subprocess.run(
        argv, cwd=tmp_path, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL, env=env
    )
    assert out.returncode == EXPECTED_EXIT.get(cmd, 0), (
        f"{cmd}: exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    )
    assert "Traceback" not in out.stderr
