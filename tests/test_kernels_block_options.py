"""``iosim kernel`` options that must be applied or refused, never ignored (issue 48): ``--Br``/``--Bc`` with
``--like`` reach the model (through a launcher that declares them, or checked against the block sizes the kernel
ran when it does not), and ``--config`` on a backend without autotuned Triton kernels is refused before any work."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from iosim.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "iosim" / "kernels" / "examples"

FIXED_BLOCKS = """
from iosim.kernels.examples.triton_flash2 import launch as flash2


def launch(N, d, H=1):  # declares no Br, Bc: the kernel runs Br = 32, Bc = 16
    return flash2(N, d, Br=32, Bc=16, H=H)
"""


@pytest.fixture
def cli(capsys):
    """``iosim kernel ARGS`` in this process (the count in its own subprocess): (rc, stdout, stderr)."""

    def run(*args):
        rc = main(["kernel", *args])
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


def _one_line(err: str, *words) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("iosim: error:") and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]


def test_br_bc_reach_a_launcher_that_declares_them(cli):
    """triton_flash2's launcher takes Br, Bc (default 64, 32): --Br 16 --Bc 8 must be what the kernel ran and what
    the model reads. Independently: every program reads all of K once, so K's reads are ceil(N / Br) N d, which the
    launcher's defaults (ceil(48 / 64) = 1) would not give."""
    pytest.importorskip("triton")
    N, d, Br, Bc = 48, 16, 16, 8
    rc, out, err = cli(str(EXAMPLES / "triton_flash2.py"), "--N", str(N), "--d", str(d), "--like", "flash2",
                       "--Br", str(Br), "--Bc", str(Bc), "--fast", "--json")  # fmt: skip
    assert rc == 0, err
    doc = json.loads(out)
    assert (doc["comparison"]["Br"], doc["comparison"]["Bc"]) == (Br, Bc)
    consts = doc["counts"]["launch_info"][0]["constexprs"]
    assert (consts["BLOCK_M"], consts["BLOCK_N"]) == (Br, Bc)
    assert doc["counts"]["per_array"]["K"]["reads"] == math.ceil(N / Br) * N * d
    assert doc["comparison"]["equal"] is True


@pytest.mark.slow
def test_br_refused_when_the_launcher_runs_other_blocks(cli, tmp_path):
    """A launcher that declares no Br: --Br is not passed to it, so a --Br other than the block the kernel ran is
    refused in one line naming --Br and what the kernel ran (never a model at the wrong block size)."""
    pytest.importorskip("triton")
    f = tmp_path / "fixed_blocks.py"
    f.write_text(FIXED_BLOCKS)
    rc, _, err = cli(str(f), "--N", "48", "--d", "16", "--like", "flash2", "--Br", "16", "--fast")
    assert rc == 2
    _one_line(err, "--Br", "Br=32")


@pytest.mark.slow
def test_br_bc_accepted_when_they_are_what_the_kernel_ran(cli, tmp_path):
    pytest.importorskip("triton")
    f = tmp_path / "fixed_blocks.py"
    f.write_text(FIXED_BLOCKS)
    rc, out, err = cli(str(f), "--N", "48", "--d", "16", "--like", "flash2", "--Br", "32", "--Bc", "16", "--fast",
                       "--json")  # fmt: skip
    assert rc == 0, err
    doc = json.loads(out)
    assert (doc["comparison"]["Br"], doc["comparison"]["Bc"]) == (32, 16)
    assert doc["counts"]["per_array"]["K"]["reads"] == math.ceil(48 / 32) * 48 * 16


MARKED = """
import {module}
from pathlib import Path


def launch(N, d):
    Path({marker!r}).write_text("ran")  # what the launcher would do first: it must never run
    return {{}}
"""


@pytest.mark.parametrize("backend, module", [("pallas", "jax"), ("numba-cuda", "numba")])
@pytest.mark.parametrize("named", [False, True])
@pytest.mark.parametrize("config", ["BLOCK_M=64", "all"])
def test_config_refused_before_any_work_on_non_triton_backends(cli, tmp_path, backend, module, named, config):
    """--config on a Pallas or numba-cuda launcher (the backend told from its imports, or named): exit 2, one line
    naming --config and the backend that takes it, and the launcher never ran (no counting process)."""
    marker = tmp_path / "ran.txt"
    f = tmp_path / f"launcher_{module}.py"
    f.write_text(MARKED.format(module=module, marker=str(marker)))
    extra = ["--backend", backend] if named else []
    rc, _, err = cli(str(f), "--N", "8", "--d", "4", "--config", config, *extra)
    assert rc == 2
    _one_line(err, "--config", "triton", backend)
    assert not marker.exists()


@pytest.mark.parametrize("example, backend", [("pallas_gpu_mha.py", "pallas"), ("pallas_tpu_flash.py", "pallas"),
                                              ("numba_cuda_flash2.py", "numba-cuda")])  # fmt: skip
def test_config_refused_on_the_non_triton_examples(cli, example, backend):
    rc, out, err = cli(str(EXAMPLES / example), "--N", "64", "--d", "16", "--like", "flash2", "--config", "all=1")
    assert rc == 2 and not out
    _one_line(err, "--config", "triton", backend)


@pytest.mark.parametrize("backend, module", [("pallas", "jax"), ("numba-cuda", "numba")])
def test_config_all_refused_by_count_file_on_non_triton_backends(tmp_path, backend, module):
    """``count_file(config="all")`` (what ``--config all`` asks) is refused on Pallas and numba-cuda as any other
    --config is, before the launcher runs; under Triton "all" is the default (each config in turn)."""
    from iosim.base.errors import InputError
    from iosim.kernels.counting import count_file

    marker = tmp_path / "ran.txt"
    f = tmp_path / f"launcher_{module}.py"
    f.write_text(MARKED.format(module=module, marker=str(marker)))
    with pytest.raises(InputError, match="--config") as e:
        count_file(str(f), params={"N": 8, "d": 4}, config="all")
    assert backend in str(e.value) and "triton" in str(e.value)
    assert not marker.exists()
