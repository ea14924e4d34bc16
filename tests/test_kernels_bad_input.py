"""Bad input to ``iosim kernel`` / iosim.kernels: one line on stderr and exit code 2 (InputError), never a traceback."""

from __future__ import annotations

import textwrap

import pytest

from iosim.base.errors import InputError, install_hint
from iosim.cli import main

BAD = textwrap.dedent(
    """
    import numpy as np
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def copy_kernel(X, Y, n, B: tl.constexpr):
        i = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(Y + i, tl.load(X + i, mask=i < n), mask=i < n)


    @triton.jit
    def wait_kernel(flag):
        # program 0 waits for program 1, which the interpreter never runs before program 0 finishes
        if tl.program_id(0) == 0:
            while tl.atomic_add(flag, 0) == 0:
                pass
        else:
            tl.atomic_xchg(flag, 1)


    def launch_raises(N, d):
        raise ValueError("the launcher could not build its inputs")


    def launch_numpy(N, d):
        x = np.ones(N, dtype=np.float32)
        copy_kernel[(1,)](x, torch.empty(N), N, B=16)


    def launch_hangs(N, d):
        wait_kernel[(2,)](torch.zeros(1, dtype=torch.int32))


    @triton.jit
    def asm_kernel(X, Y, B: tl.constexpr):
        i = tl.arange(0, B)
        y = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [tl.load(X + i)], dtype=tl.int32, is_pure=True,
                                      pack=1)
        tl.store(Y + i, y)


    def launch_asm(N, d):
        asm_kernel[(1,)](torch.ones(16, dtype=torch.int32), torch.empty(16, dtype=torch.int32), B=16)


    def launch_nhd(N, d):
        # (N, H, d) arrays, no layout declared
        q, k, v = (torch.randn(N, 2, d) for _ in range(3))
        o = torch.empty_like(q)
        copy_kernel[(triton.cdiv(q.numel(), 64),)](q, o, q.numel(), B=64)
        return {"Q": q, "K": k, "V": v, "O": o}


    @triton.jit
    def wild_kernel(X, Y, n, B: tl.constexpr):
        i = tl.arange(0, B)
        tl.store(Y + i + (1 << 40), tl.load(X + i, mask=i < n))  # far outside every argument


    def launch_wild(N, d):
        x, y = torch.ones(16), torch.zeros(16)
        wild_kernel[(1,)](x, y, 16, B=16)
        return {"X": x, "Y": y}


    def launch_list(N, d):
        x, y = torch.ones(N), torch.empty(N)
        copy_kernel[(1,)](x, y, N, B=16)
        return {"X": x, "Y": [1, 2]}
    """
)


@pytest.fixture(scope="module")
def bad_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("kernels") / "bad_kernels.py"
    p.write_text(BAD)
    return p


@pytest.fixture
def cli(capsys):
    """``iosim kernel ARGS`` in this process (the counting itself runs in its own subprocess): (rc, stderr)."""

    def run(*args):
        rc = main(["kernel", *args])
        return rc, capsys.readouterr().err

    return run


def _one_line(out, *words):
    rc, err = out
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("iosim: error:"), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]


def test_missing_file(capsys):
    assert main(["kernel", "no/such/file.py", "--N", "4", "--d", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "FILE must be an existing Python file" in err[0]


def test_not_a_python_file(capsys):
    assert main(["kernel", "kernel.cu", "--N", "4", "--d", "4"]) == 2
    assert "FILE.py[:LAUNCHER]" in capsys.readouterr().err


def test_no_launcher(bad_file, cli):
    _one_line(cli(str(bad_file), "--N", "4", "--d", "4"), "defines no launcher")  # several launch*: name one


def test_kernel_raises(bad_file, cli):
    _one_line(cli(f"{bad_file}:launch_raises", "--N", "4", "--d", "4"), "kernel raised", "ValueError")


def test_an_argument_that_is_not_an_array(bad_file, cli):
    _one_line(cli(f"{bad_file}:launch_numpy", "--N", "4", "--d", "4"), "argument X", "torch tensor", "ndarray")
    _one_line(cli(f"{bad_file}:launch_list", "--N", "4", "--d", "4"), "launcher result 'Y'", "array")


def test_a_kernel_that_never_finishes(bad_file, cli):
    out = cli(f"{bad_file}:launch_hangs", "--N", "4", "--d", "4", "--timeout", "8")
    _one_line(out, "did not finish within 8 s")


def test_unsupported_backend_version(monkeypatch):
    pytest.importorskip("triton")
    from triton.runtime import interpreter

    from iosim.kernels import triton_backend

    def create_masked_load(self, pointers, mask, *rest):  # a renamed parameter: an interpreter this code never saw
        return None

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_masked_load", create_masked_load)
    with pytest.raises(InputError, match="supports triton 3.7"):
        triton_backend.require()


def test_missing_extra_names_it(monkeypatch, capsys, bad_file):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    assert main(["kernel", str(bad_file), "--N", "4", "--d", "4", "--backend", "triton"]) == 2
    err = capsys.readouterr().err
    assert install_hint("triton") in err and len(err.strip().splitlines()) == 1


def test_like_needs_block_sizes(capsys, tmp_path):
    from iosim.kernels import KernelCounts, compare

    empty = KernelCounts("triton", {}, 0, 0, __import__("numpy").zeros((0, 2), dtype="int64"))
    with pytest.raises(InputError, match="--Br"):
        compare(empty, "flash2", 64, 16)
    with pytest.raises(InputError, match="--like"):
        compare(empty, "flash3", 64, 16, 16, 16)


def test_a_launcher_importing_a_missing_package(tmp_path, cli):
    p = tmp_path / "needs_a_package.py"
    p.write_text("import triton\nimport not_a_package_anyone_installed\n\n\ndef launch(N, d):\n    pass\n")
    _one_line(cli(str(p), "--N", "4", "--d", "4"), "imports not_a_package_anyone_installed", "not installed")


def test_a_kernel_needing_a_gpu_feature_the_interpreter_lacks(bad_file, cli):
    _one_line(cli(f"{bad_file}:launch_asm", "--N", "4", "--d", "4"), "GPU feature", "inline_asm")


def test_an_undeclared_layout_on_the_command_line(bad_file, cli):
    out = cli(f"{bad_file}:launch_nhd", "--N", "16", "--d", "8", "--like", "flash2", "--Br", "16", "--Bc", "16")
    _one_line(out, "launcher array Q", "declare its layout", "(16, 2, 8)")


def test_a_store_outside_every_argument_is_reported_and_never_made(bad_file, cli):
    # the out-of-bounds lanes are switched off before the interpreter writes host memory: no crash, exit 1
    rc, err = cli(f"{bad_file}:launch_wild", "--N", "4", "--d", "4")
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, err
    assert (
        "16 lanes out of bounds (<unattributed>): first, kernel wild_kernel program (0, 0, 0) stored 16 lanes "
        "outside every argument at addresses ['0x" in lines[0]
    )
