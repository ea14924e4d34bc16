"""``iosim kernel``: no option is silently ignored (issue 48's kernel cases). An option the launcher does not declare,
an option the chosen model or backend does not read, --kv-heads that do not divide --H, a kernel of another backend
than --backend names, a block-sparse kernel whose BlockMask cannot be checked against --mask: each one line on
stderr naming the option, exit 2, nothing on stdout. The refusals that need no kernel run happen before anything is
counted (in this process, no subprocess); those that need the launcher's signature or its BlockMask run the counting
process on launchers written here (a numba-cuda copy, a Triton copy with a BlockMask built by hand)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from iosim.base.errors import InputError
from iosim.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "iosim" / "kernels" / "examples"
NOTICE = "iosim: compiling Numba kernels"  # a first run's notice on a cold cache, before any error

NUMBA_LAUNCHERS = textwrap.dedent(
    """
    import numpy as np
    from numba import cuda


    @cuda.jit
    def copy(X, Y):
        i = cuda.grid(1)
        if i < X.size:
            Y[i] = X[i]


    def _copy(n):
        x = np.arange(n, dtype=np.float32)
        y = np.zeros_like(x)
        copy[1, n](x, y)
        return {"X": x, "Y": y}


    def launch(N, d):
        return _copy(N * d)


    def launch_heads(N, d, H=1):
        return _copy(H * N * d)


    def launch_any(N, d, **options):
        return _copy(options.get("H", 1) * N * d)


    def launch_none(N, d):
        _copy(N * d)


    def launch_qo(N, d):
        # one head's Q copied into O, named as the model names them
        q, k, v = (np.ones(N * d, dtype=np.float32) for _ in range(3))
        o = np.zeros_like(q)
        copy[1, N * d](q, o)
        return {"Q": q, "K": k, "V": v, "O": o, "names": {"X": "Q", "Y": "O"}}


    def launch_returns(N, d):
        # takes neither H nor causal, and says what it ran: one head, causal (as a library's causal-only kernel)
        return {**_copy(N * d), "H": 1, "causal": True}
    """
)

# A Triton copy of Q into O (flat loads: the block sizes come from --Br/--Bc) that returns the BlockMask it was given,
# built by hand for N = 32, blocks of 16 (one batch item, one head, two row blocks): dense (every block full) or causal
# (row block 0: block 0 partial; row block 1: block 1 partial, block 0 full), or none at all.
TRITON_LAUNCHERS = textwrap.dedent(
    """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def copy(X, Y, n, B: tl.constexpr):
        i = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(Y + i, tl.load(X + i, mask=i < n), mask=i < n)


    def _run(N, d):
        Q, K, V = (torch.ones(N, d) for _ in range(3))
        O = torch.empty_like(Q)
        copy[(triton.cdiv(N * d, 64),)](Q, O, N * d, B=64)
        return {"Q": Q, "K": K, "V": V, "O": O}


    def _mask(kv_num, kv_idx, full_num, full_idx):
        t = lambda x: torch.tensor(x, dtype=torch.int32)[None, None]
        return {"kv_num_blocks": t(kv_num), "kv_indices": t(kv_idx), "full_kv_num_blocks": t(full_num),
                "full_kv_indices": t(full_idx)}


    def launch_dense(N, d):
        return {**_run(N, d), **_mask([0, 0], [[0, 0], [0, 0]], [1, 2], [[0, 0], [0, 1]])}


    def launch_no_block_mask(N, d):
        return _run(N, d)
    """
)
DENSE_NOT_CAUSAL = (
    "iosim: error: --mask must be the mask the kernel's BlockMask was built for: at (b, h, row block) (0, 0, 0) the "
    "kernel's lists partial blocks [] and full [0], the mask's [0] and []"
)


def needs(*modules: str) -> None:
    """Skip unless the modules are installed (found, not imported: the counting process imports them)."""
    import importlib.util

    for m in modules:
        if importlib.util.find_spec(m) is None:
            pytest.skip(f"{m} is not installed")


@pytest.fixture(scope="module")
def numba_file(tmp_path_factory):
    needs("numba_cuda")
    p = tmp_path_factory.mktemp("launchers") / "numba_launchers.py"
    p.write_text(NUMBA_LAUNCHERS)
    return p


@pytest.fixture(scope="module")
def triton_file(tmp_path_factory):
    needs("triton", "torch")
    p = tmp_path_factory.mktemp("launchers") / "triton_launchers.py"
    p.write_text(TRITON_LAUNCHERS)
    return p


@pytest.fixture
def cli(capsys, monkeypatch):
    """``iosim kernel ARGS`` from the repository root: (rc, stdout, stderr lines less a first run's Numba notice)."""
    monkeypatch.chdir(ROOT)

    def run(*args):
        rc = main(["kernel", *map(str, args)])
        out = capsys.readouterr()
        return rc, out.out, [x for x in out.err.strip().splitlines() if not x.startswith(NOTICE)]

    return run


def refused(result, option: str, *words: str) -> str:
    """Exit 2, nothing on stdout, exactly one line on stderr, naming ``option`` first (and ``words``)."""
    rc, out, err = result
    assert rc == 2 and out == "" and len(err) == 1, (rc, out, err)
    line = err[0]
    assert line.startswith(f"iosim: error: {option} "), line
    assert "Traceback" not in line and all(w in line for w in words), line
    return line


# --- options the launcher does not declare (counting process, before the launch) ----------------------------------
def test_the_issues_case_a_problem_option_a_triton_launcher_does_not_declare(cli):
    """`--like flash2 --H 4` on a launcher of one head that takes no H: the model would count 4 heads (0.25x)."""
    needs("triton", "torch")
    line = refused(cli("tests/_kernel_launches.py:launch", "--N", 64, "--d", 16, "--like", "flash2", "--H", 4,
                       "--no-numerics"), "--H")  # fmt: skip
    assert line == ("iosim: error: --H is not a parameter of launcher launch (_kernel_launches.py), which ran without "
                    "it (it returns no H): declare H in the launcher, or leave --H out")  # fmt: skip


@pytest.mark.parametrize("extra, option", [(["--page-size", "4"], "--page-size"), (["--N-q", "2"], "--N-q")])
def test_an_option_the_launcher_does_not_declare_is_refused(cli, numba_file, extra, option):
    """--page-size on a launcher without pages, --N-q on one without query rows of their own: refused by name."""
    name = option.removeprefix("--").replace("-", "_")
    refused(cli(f"{numba_file}:launch", "--N", 4, "--d", 4, *extra), option, "launcher launch (numba_launchers.py)",
            f"declare {name} in the launcher")  # fmt: skip


def test_an_option_the_launcher_returns_instead_must_be_what_it_ran(cli, numba_file):
    """A launcher may return an option instead of taking it: the same value is accepted (the counts printed), another
    refused, naming what the launcher says it ran."""
    rc, out, err = cli(f"{numba_file}:launch_returns", "--N", 4, "--d", 4, "--H", 1, "--causal")
    assert rc == 0 and err == [] and "total: 16 reads, 16 writes" in out, (err, out)
    refused(cli(f"{numba_file}:launch_returns", "--N", 4, "--d", 4, "--H", 2), "--H",
            "launcher launch_returns (numba_launchers.py), which ran with H = 1 (its result)")  # fmt: skip


@pytest.mark.parametrize(
    "like, taken, own",
    [
        (None, {"N", "d", "H", "B", "kv_heads", "N_q", "page_size", "Br", "Bc", "mla", "causal", "dtype"}, set()),
        ("flash2", {"N", "d", "H", "B", "kv_heads", "N_q", "page_size", "causal", "dtype", "dv"}, {"Br", "Bc", "mla"}),
        ("decode-splitkv", {"N", "d", "H", "kv_heads", "splits", "Br"}, {"Bc", "mla"}),
        ("flash2-backward", {"N", "d", "B", "H", "mla"}, {"Br", "Bc"}),
    ],
)
def test_which_options_the_launcher_must_take(like, taken, own):
    """Every option given must be a parameter of the launcher, except the block sizes a --like model reads off the
    kernel's loads (and checks there) and --mla where the model describes how the kernel reads V."""
    from types import SimpleNamespace

    from iosim.cli.kernel import _must_take

    params = dict.fromkeys(taken | own, 1)
    assert set(_must_take(SimpleNamespace(like=like), params)) == taken


@pytest.mark.parametrize("launcher", ["launch_heads", "launch_any"])
def test_a_declared_option_reaches_the_launch(cli, numba_file, launcher):
    """A launcher declaring H (or taking **kwargs) runs with --H 3: it copies H N d = 3 x 4 x 4 = 48 elements, each
    read once through X and written once through Y (a hand count)."""
    rc, out, err = cli(f"{numba_file}:{launcher}", "--N", 4, "--d", 4, "--H", 3)
    assert rc == 0 and err == [], err
    rows = {w[0]: w[1:3] for w in map(str.split, out.splitlines()) if w and w[0] in ("X", "Y")}
    assert rows == {"X": ["48", "0"], "Y": ["0", "48"]}, out


def test_format_reaches_the_table_beside_the_model(cli, numba_file):
    """--format is the table's format with --like too (it was printed as "simple" whatever was asked)."""
    args = [f"{numba_file}:launch_qo", "--N", 4, "--d", 4, "--like", "flash2", "--Br", 4, "--Bc", 4, "--no-numerics"]
    rc, out, err = cli(*args, "--format", "github")
    rows = [x for x in out.splitlines() if x.startswith("| Q ") or x.startswith("| O ")]
    assert rc == 0 and len(rows) == 2, (err, out)
    cells = [c.strip() for c in rows[0].split("|")[2:6]]
    assert cells == ["16", "0", "16", "0"]  # Q: 4 x 4 read once, as flash2's closed form reads it


def test_a_launcher_returning_none_is_refused(cli, numba_file):
    refused(cli(f"{numba_file}:launch_none", "--N", 4, "--d", 4), "launcher launch_none", "it returned None")


# --- options that do not apply, refused before anything is counted ------------------------------------------------
FLASH2 = EXAMPLES / "triton_flash2.py"
BWD = EXAMPLES / "triton_flash2_bwd.py"
SPLITKV = EXAMPLES / "triton_decode_splitkv.py"
SPARSE = EXAMPLES / "triton_flex_blocksparse.py"
PALLAS = EXAMPLES / "pallas_gpu_mha.py"
NUMBA = EXAMPLES / "numba_cuda_flash2.py"
NOT_APPLYING = [
    ([FLASH2, "--like", "flash2", "--empty-splits", "skipped"], "--empty-splits", ("decode-splitkv",)),
    ([FLASH2, "--empty-splits", "written"], "--empty-splits", ("decode-splitkv",)),
    ([PALLAS, "--gpu-standin"], "--gpu-standin", ("Triton launchers", "under pallas")),
    ([NUMBA, "--gpu-standin"], "--gpu-standin", ("Triton launchers", "under numba-cuda")),
    ([PALLAS, "--shared-memory"], "--shared-memory", ("Triton kernels", "under pallas")),
    ([NUMBA, "--fast"], "--fast", ("Triton kernels",)),
    ([BWD, "--like", "flash2-backward", "--page-size", "16"], "--page-size", ("not the backward",)),
    ([SPARSE, "--like", "block-sparse", "--mask", "causal", "--page-size", "16"], "--page-size", ("not block-sparse",)),
    ([SPARSE, "--like", "block-sparse", "--mask", "causal", "--causal"], "--causal", ("--mask causal",)),
    ([SPARSE, "--like", "block-sparse", "--mask", "causal", "--gqa", "packed"], "--gqa", ("per query head",)),
    ([SPLITKV, "--like", "decode-splitkv", "--causal"], "--causal", ("decode-splitkv",)),
    ([SPLITKV, "--like", "decode-splitkv", "--N-q", "2"], "--N-q", ("one query row per head",)),
]


IDS = [" ".join(map(str, argv[1:])) for argv, _, _ in NOT_APPLYING]


@pytest.mark.parametrize("argv, option, words", NOT_APPLYING, ids=IDS)
def test_an_option_that_does_not_apply_is_refused_before_counting(cli, monkeypatch, argv, option, words):
    import subprocess

    def no_count(*a, **k):
        raise AssertionError("a counting process was started")

    monkeypatch.setattr(subprocess, "run", no_count)  # the refusal comes first: no process, nothing counted
    refused(cli(argv[0], "--N", 64, "--d", 16, *argv[1:]), option, *words)


# --- --kv-heads and --H ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kv", [8, 3])
def test_kv_heads_must_divide_H_on_the_command_line(cli, kv):
    line = refused(cli(SPLITKV, "--N", 64, "--d", 16, "--H", 4, "--kv-heads", kv, "--like", "decode-splitkv"),
                   "--kv-heads")  # fmt: skip
    assert line == f"iosim: error: --kv-heads must divide --H = 4 (one of 1, 2, 4: 1..4), got {kv}"


def test_kv_heads_must_divide_the_heads_a_launcher_returns():
    """The heads may come from the launcher's dict (no --H): the comparison checks them too."""
    from iosim.kernels import KernelCounts, compare
    from iosim.kernels.comparison import Whole

    empty = KernelCounts("triton", {}, 0, 0, np.zeros((0, 2), dtype="int64"))
    with pytest.raises(InputError, match=r"^--kv-heads must divide --H = 4 \(one of 1, 2, 4: 1\.\.4\), got 8$"):
        compare(empty, "decode-splitkv", 64, 16, None, 16, heads=4, splits=2, whole=Whole(H_kv=8))


# --- a kernel of another backend than --backend names ------------------------------------------------------------
@pytest.mark.parametrize(
    "path, backend, says",
    [
        (FLASH2, "pallas", "imports torch, triton and not jax, so its launcher's kernel is not a Pallas kernel "
                           "(--backend triton, or auto)"),
        (PALLAS, "triton", "imports jax and not triton, so its launcher's kernel is not a Triton kernel (--backend "
                           "pallas, or auto)"),
        (NUMBA, "pallas", "imports numba and not jax, so its launcher's kernel is not a Pallas kernel (--backend "
                          "numba-cuda, or auto)"),
    ],
)  # fmt: skip
def test_a_kernel_of_another_backend_is_refused_by_name(cli, path, backend, says):
    refused(cli(path, "--N", 64, "--d", 16, "--backend", backend), f"--backend {backend}", says)


# --- --like block-sparse: the kernel's BlockMask is checked against --mask in every mode ---------------------------
@pytest.mark.parametrize("mode", ["--no-numerics", "--fast"])
def test_the_block_mask_is_checked_without_numerics(cli, triton_file, mode):
    """A kernel handed the dense BlockMask, compared with --mask causal: refused as with numerics."""
    rc, out, err = cli(f"{triton_file}:launch_dense", "--N", 32, "--d", 4, "--Br", 16, "--Bc", 16, "--like",
                       "block-sparse", "--mask", "causal", mode)  # fmt: skip
    assert refused((rc, out, err), "--mask") == DENSE_NOT_CAUSAL


def test_a_block_sparse_launcher_that_returns_no_block_mask_is_refused(cli, triton_file):
    rc, out, err = cli(f"{triton_file}:launch_no_block_mask", "--N", 32, "--d", 4, "--Br", 16, "--Bc", 16, "--like",
                       "block-sparse", "--mask", "causal", "--no-numerics")  # fmt: skip
    assert refused((rc, out, err), "--mask") == (
        "iosim: error: --mask is checked against the kernel's BlockMask: the launcher must return its index tensors "
        "by name (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)"
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["--no-numerics", "--fast"])
def test_the_issues_case_the_flex_example_against_another_mask(cli, mode):
    """The issue's reproduction: the FlexAttention example (its BlockMask built for a causal document mask) held
    against --mask causal exited 0 ("0.671x") under --no-numerics and --fast."""
    needs("triton", "torch")
    rc, out, err = cli(SPARSE, "--N", 128, "--d", 16, "--like", "block-sparse", "--mask", "causal", mode)
    assert refused((rc, out, err), "--mask") == (
        "iosim: error: --mask must be the mask the kernel's BlockMask was built for: at (b, h, row block) (0, 0, 1) "
        "the kernel's lists partial blocks [1] and full [], the mask's [1] and [0]"
    )
