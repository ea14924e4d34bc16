"""``iosim kernel --fast``: the values no address, mask, branch or loop bound depends on are not computed
(iosim.kernels.fast), and the counts are those of the exact run.

Every Triton kernel the test-suite counts (tests/_kernel_cases.py, the launchers of tests/_kernel_launches.py, the
examples, and the library kernels where installed) is counted both ways: per array reads, writes, distinct reads
and writes and atomics, programs, launches, out-of-bounds and stray lanes are identical. The fast run is audited
(IOSIM_FAST_AUDIT=1): each cheap rule's result type is checked against the type Triton's own operation gives. A
kernel whose address, mask, branch or loop bound needs a skipped value, and host code that reads an output the fast
run did not compute, are refused with one line (exit 2).
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

from iosim.base.errors import InputError  # noqa: E402
from iosim.kernels import count_batch, count_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "iosim" / "kernels" / "examples"
LAUNCHES = str(ROOT / "tests" / "_kernel_launches.py")
TUTORIAL_CONFIG = "BLOCK_M=128,BLOCK_N=64,num_stages=2,num_warps=4"


def _jobs() -> list[tuple]:
    sys.path.insert(0, str(ROOT / "tests"))
    from _kernel_cases import cases

    jobs = [(str(EXAMPLES / f"{file}.py"), None, p) for file, _, p in cases("triton")]
    jobs += [
        (LAUNCHES, name, dict(N=100, d=16))
        for name in (
            "launch",
            "launch_pinned",
            "launch_heur",
            "launch_ragged",
            "launch_host",
            "launch_desc",
            "launch_log2",
            "launch_bnhd",
            "launch_decode_bhd",
            "launch_stray",
            "launch_pick_site",
            "launch_two_calls",
            "launch_unnamed",
        )
    ]
    bwd = str(EXAMPLES / "triton_flash2_bwd.py")
    jobs += [
        (bwd, None, dict(N=64, d=16, Br=16, Bc=32, B=2, H=4, kv_heads=2, causal=True)),
        (bwd, "launch_packed", dict(N=50, d=8, Br=16, Bc=16, H=4, kv_heads=2, causal=True)),
        (str(EXAMPLES / "triton_decode_splitkv.py"), None, dict(N=100, d=16, Bc=16, splits=4, H=4, kv_heads=1)),
        (str(EXAMPLES / "triton_flex_blocksparse.py"), None, dict(N=200, d=16, H=2)),
    ]
    libs = {
        "fla": ("fla_parallel_attn.py", None, dict(N=200, d=16, B=2, H=4, kv_heads=2)),
        "sageattention": ("sageattention_int8.py", "launch_with_quantization", dict(N=200, d=64)),
        "sglang": ("sglang_decode.py", None, dict(N=40, d=16, splits=4, B=2, H=2)),
    }
    for package, (file, launcher, p) in libs.items():
        if importlib.util.find_spec(package) is not None:
            jobs.append((str(EXAMPLES / file), launcher, p))
    return jobs  # fmt: skip


def _summary(counts) -> tuple:
    per = {k: (a.reads, a.writes, a.distinct_reads, a.distinct_writes, a.atomics) for k, a in counts.per_array.items()}
    return per, counts.programs, counts.launches, counts.out_of_bounds_lanes, counts.stray_lanes


def _both(jobs, config=None):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IOSIM_FAST_AUDIT", "1")
        mp.delenv("PYTEST_VERSION", raising=False)  # the tutorial keeps one config under pytest
        exact = count_batch(jobs, "triton", arrays=False, strict=False, config=config)
        fast = count_batch(jobs, "triton", arrays=False, strict=False, config=config, fast=True)
    return exact, fast


@pytest.fixture(scope="module")
def runs():
    jobs = _jobs()
    exact, fast = _both(jobs)
    if importlib.util.find_spec("flash_mlm") is not None:
        tutorial = [(str(EXAMPLES / "triton_tutorial_attention.py"), None, dict(N=256, d=64, B=2, H=2, causal=True))]
        e, f = _both(tutorial, TUTORIAL_CONFIG)
        jobs, exact, fast = jobs + tutorial, exact + e, fast + f
    return jobs, exact, fast


def test_fast_counts_equal_the_exact_counts_on_every_kernel_the_tests_count(runs):
    jobs, exact, fast = runs
    assert len(jobs) >= 30
    for job, (e, _, _), (f, _, _) in zip(jobs, exact, fast, strict=True):
        assert _summary(f) == _summary(e), job
    flagged = [job[1] for job, (e, _, _) in zip(jobs, exact, strict=True) if e.out_of_bounds_lanes or e.stray_lanes]
    assert set(flagged) == {"launch_ragged", "launch_stray"}  # the flagged ones are flagged the same way


REFUSED = textwrap.dedent(
    """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def gather_by_score(A, B, X, Out, BLOCK: tl.constexpr):
        r = tl.arange(0, BLOCK)
        a = tl.load(A + r[:, None] * BLOCK + r[None, :])
        b = tl.load(B + r[:, None] * BLOCK + r[None, :])
        s = tl.dot(a, b)  # skipped under --fast
        idx = (s * s).to(tl.int32) % BLOCK  # an address computed from it
        tl.store(Out + r[:, None] * BLOCK + r[None, :], tl.load(X + idx))


    @triton.jit
    def branch_on_score(A, B, Out, BLOCK: tl.constexpr):
        r = tl.arange(0, BLOCK)
        a = tl.load(A + r[:, None] * BLOCK + r[None, :])
        s = tl.sum(tl.sum(tl.dot(a, a), 1), 0)
        if s > 0:  # a branch on it
            tl.store(Out + r, tl.load(B + r))


    @triton.jit
    def scores(A, Out, BLOCK: tl.constexpr):
        r = tl.arange(0, BLOCK)
        a = tl.load(A + r[:, None] * BLOCK + r[None, :])
        tl.store(Out + r[:, None] * BLOCK + r[None, :], tl.dot(a, a))


    def _inputs():
        g = torch.Generator().manual_seed(0)
        return torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g), torch.zeros(16, 16)


    def launch_address(N, d):
        a, b, out = _inputs()
        gather_by_score[(1,)](a, b, torch.randn(16), out, BLOCK=16)
        return {"A": a, "B": b, "Out": out}


    def launch_branch(N, d):
        a, b, out = _inputs()
        branch_on_score[(1,)](a, b, out, BLOCK=16)
        return {"A": a, "Out": out}


    def launch_host_views(N, d):
        a, _, out = _inputs()
        scores[(1,)](a, out, BLOCK=16)
        return {"A": a, "Out": out[0:8].reshape(-1).cpu().float().t()}  # views of an output: nothing read


    def launch_host_copy(N, d):
        a, _, out = _inputs()
        scores[(1,)](a, out, BLOCK=16)
        return {"A": a, "Out": out.t().contiguous()}  # a copy reads it


    def launch_host_read(N, d):
        a, _, out = _inputs()
        scores[(1,)](a, out, BLOCK=16)
        n = int(out.abs().max() > 0) + 1  # the host reads the output to choose the next launch
        scores[(n,)](a, out, BLOCK=16)
        return {"A": a, "Out": out}
    """
)


@pytest.mark.parametrize(
    "launcher, why",
    [("launch_address", "the address or mask of a load, computed from a value it skipped"),
     ("launch_branch", "a branch condition, loop bound or scalar (bool) computed from a value it skipped"),
     ("launch_host_read", "host code's torch abs() reading an output it did not compute"),
     ("launch_host_copy", "host code's torch contiguous() reading an output it did not compute")],
)  # fmt: skip
def test_a_kernel_needing_a_skipped_value_is_refused_with_one_line(tmp_path, launcher, why):
    path = tmp_path / "needs_values.py"
    path.write_text(REFUSED)
    with pytest.raises(InputError) as e:
        count_file(str(path), launcher, "triton", dict(N=1, d=1), arrays=False, fast=True)
    assert e.value.parameter == "--fast" and e.value.got == why
    assert "count without --fast" in str(e.value) and "\n" not in str(e.value)


def test_the_refused_kernels_count_without_fast(tmp_path):
    path = tmp_path / "needs_values.py"
    path.write_text(REFUSED)
    names = ("launch_address", "launch_branch", "launch_host_read", "launch_host_copy")
    runs = count_batch([(str(path), n, dict(N=1, d=1)) for n in names], "triton", arrays=False)
    assert [counts.launches for counts, _, _ in runs] == [1, 1, 2, 1]


def test_views_of_an_output_the_fast_run_did_not_compute_read_nothing(tmp_path):
    path = tmp_path / "needs_values.py"
    path.write_text(REFUSED)
    exact, fast = (count_file(str(path), "launch_host_views", "triton", dict(N=1, d=1), arrays=False, fast=f)[0]
                   for f in (False, True))  # fmt: skip
    assert _summary(fast) == _summary(exact) and exact.per_array["Out"].writes == 256


def test_the_cli_refuses_with_exit_2_and_counts_fast_with_exit_0(tmp_path, capsys):
    from iosim.cli import main

    path = tmp_path / "needs_values.py"
    path.write_text(REFUSED)
    assert main(["kernel", f"{path}:launch_branch", "--N", "1", "--d", "1", "--fast"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("iosim: error: --fast counts only kernels whose addresses")
    example = str(EXAMPLES / "triton_flash2.py")
    assert main(["kernel", example, "--N", "100", "--d", "16", "--like", "flash2", "--fast"]) == 0
    out = capsys.readouterr().out
    assert "equal to flash2's closed form to the word" in out and "numerics O" not in out
    assert "note: --fast: the values no count depends on were not computed (no numerics checked)" in out


def test_fast_is_for_triton_only():
    pytest.importorskip("jax")
    with pytest.raises(InputError, match="--fast is offered for Triton kernels"):
        count_file(str(EXAMPLES / "pallas_tpu_flash.py"), None, "pallas", dict(N=256, d=32), arrays=False, fast=True)
