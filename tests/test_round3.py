"""Round 3 of the hostile inputs (issue: every claim true): options that would be ignored are refused or honoured,
an output asked for is written, a refusal names the option that caused it."""

from __future__ import annotations

import json

import pytest
from test_hostile import assert_refused, run_cli

S = ["--N", "64", "--d", "8", "--M", "1024", "--count-only"]


@pytest.mark.parametrize("extra", [["--splits", "2"], ["--splits", "2", "--heads", "2"]])
def test_compare_backward_refuses_splits(extra, tmp_path, monkeypatch, capsys):
    """split-KV splits the forward: --backward --splits 2 ran the backward and dropped --splits silently."""
    assert_refused(["compare", *S, "--backward", *extra], ["--splits", "forward"], tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize("fmt", ["--json", "--csv"])
def test_compare_writes_the_page_beside_json_or_csv(fmt, tmp_path, monkeypatch, capsys):
    """--html FILE with --json or --csv wrote no page; now the page is written and stdout stays the JSON or CSV."""
    rc, lines, left, out = run_cli(["compare", *S, fmt, "--html", "{tmp}/p.html"], tmp_path, monkeypatch, capsys)
    assert rc == 0 and (tmp_path / "p.html").stat().st_size > 10_000, lines
    assert any("wrote" in x and "p.html" in x for x in lines)
    if fmt == "--json":
        assert [r["algorithm"] for r in json.loads(out)["compare"]]
    else:
        assert out.splitlines()[0].startswith("rank,") and "wrote" not in out


@pytest.mark.parametrize(
    ("tiles", "named"), [(["--Br", "1000"], "--Br"), (["--Br", "1000", "--Bc", "1000"], "--Br, --Bc")]
)
def test_compare_names_the_tiles_that_do_not_fit(tiles, named, tmp_path, monkeypatch, capsys):
    """Tiles above M for every schedule: the refusal names the tiles (it said M is too small)."""
    assert_refused(["compare", *S, *tiles], [named, "smaller tiles"], tmp_path, monkeypatch, capsys)


VERSIONED = [  # every command whose JSON is a result a paper may quote
    ["run", "flash2", *S, "--json"],
    ["compare", *S, "--json"],
    ["bounds", "--N", "64", "--d", "8", "--M", "1024", "--json"],
    ["replay", "flash2", *S, "--json"],
    ["hierarchy", "flash2", "--N", "64", "--d", "8", "--M", "1024", "--C", "0", "--json"],
    ["pebble", "matmul:2x2x2", "--M", "4", "--greedy", "--json"],
]


@pytest.mark.parametrize("argv", VERSIONED, ids=lambda a: a[0])
def test_every_json_result_carries_the_version(argv, tmp_path, monkeypatch, capsys):
    from iosim.base.version import __version__

    rc, lines, _, out = run_cli(argv, tmp_path, monkeypatch, capsys)
    assert rc == 0, lines
    assert json.loads(out)["iosim_version"] == __version__


def test_sweep_records_carry_the_version():
    from iosim.base.version import __version__
    from iosim.runner.sweep import sweep

    recs = sweep({"algorithm": "flash2", "N": 64, "d": 8, "M": [1024, 2048]}, executor="serial", as_frame=False)
    assert [r["iosim_version"] for r in recs] == [__version__, __version__]


def test_compare_checks_the_page_cap_before_printing(tmp_path, monkeypatch, capsys):
    """A page over its cap is refused before the table is printed (it printed the table, then refused)."""
    rc, lines, left, out = run_cli(["compare", "--N", "8192", "--d", "64", "--M", "16384", "--count-only", "--html",
                                    "{tmp}/w.html"], tmp_path, monkeypatch, capsys)  # fmt: skip
    assert rc == 2 and len(lines) == 1 and "largest N that fits" in lines[0] and out == "" and not left


@pytest.mark.parametrize("words", [-5, 1.5, True, "3"])
def test_bytes_of_refuses_what_is_not_a_count(words):
    """Problem.bytes_of('Q', -5) returned -40."""
    from iosim import InputError, Problem

    with pytest.raises(InputError, match="^words must be a non-negative integer"):
        Problem(N=8, d=4).bytes_of("Q", words)


@pytest.mark.parametrize("extra", [["--heads", "4", "--kv-heads", "2", "--backward"],
                                   ["--heads", "2", "--mask", "window:8:causal"]])  # fmt: skip
def test_hierarchy_spelled_with_n_or_nq_nk_is_one_launch(extra, tmp_path, monkeypatch, capsys):
    """--N built no problem: a GQA backward had no group sum (23,296 DRAM words against 29,440) and a mask over
    several heads was taken from head 0; now --N and --Nq/--Nk spell the same launch, every level equal."""
    base = ["hierarchy", "flash2", "--d", "8", "--M", "2048", "--C", "0", "--json", *extra]
    got = []
    for i, sizes in enumerate((["--N", "64"], ["--Nq", "64", "--Nk", "64"])):
        (tmp_path / str(i)).mkdir()
        rc, lines, _, out = run_cli([*base, *sizes], tmp_path / str(i), monkeypatch, capsys)
        assert rc == 0, lines
        d = json.loads(out)
        got.append((d["dram"], d["two_level"], {k: v["l2_fill"] for k, v in d["per_array"].items()}))
    assert got[0] == got[1]


MODS = """
def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def corner(b, h, q_idx, kv_idx):
    return (q_idx < 32) & (kv_idx < 16)
"""


@pytest.mark.parametrize("command", ["run", "compare"])
@pytest.mark.parametrize("name", ["causal", "corner"])
def test_a_mask_mods_lower_bound_is_never_below_its_compulsory_traffic(command, name, tmp_path, monkeypatch, capsys):
    """A one-head run with --mask mod:...:causal reported a lower bound of 640 where --mask causal reported 3,200:
    the sparse nnz bound alone, below the words any schedule must read and write. The bound now is at least the
    rows and keys the mask leaves (computed here from the dense mask), on every command that reports it."""
    import numpy as np

    (tmp_path / "mods.py").write_text(MODS)
    N, d = 64, 16
    q, k = np.meshgrid(np.arange(N), np.arange(N), indexing="ij")
    dense = q >= k if name == "causal" else (q < 32) & (k < 16)
    floor = dense.any(1).sum() * d + 2 * dense.any(0).sum() * d + N * d
    argv = [command, *(["flash2"] if command == "run" else []), "--N", str(N), "--d", str(d), "--M", "2048",
            "--count-only", "--mask", f"mod:{tmp_path / 'mods.py'}:{name}"]  # fmt: skip
    rc, lines, _, out = run_cli(argv, tmp_path, monkeypatch, capsys)
    assert rc == 0, lines
    line = next(x for x in out.splitlines() if x.lower().startswith("lower bound"))
    assert f"{floor:,}" in line and "masked rows and keys" in line, line


def test_block_sparse_reads_one_mask_mod_alike_raw_wrapped_or_named(tmp_path):
    """With N_q < N_k the same mask_mod passed raw read K 1,536 words (3 blocks) and wrapped in from_mask_mod 7,680
    (15 blocks): two conventions. Every spelling now evaluates it over the sequence (q_idx = N_k - N_q + i, the
    queries the last N_q positions, as every iosim mask), and torch's create_block_mask given the function shifted
    by N_k - N_q lists the same blocks."""
    import numpy as np
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from iosim import Problem
    from iosim.masking import masks
    from iosim.masking.block_sparse import block_sparse

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    (tmp_path / "m.py").write_text("def causal(b, h, q_idx, kv_idx):\n    return q_idx >= kv_idx\n")
    Nq, Nk, d, blk = 40, 200, 8, 16
    p = Problem(N_q=Nq, N_k=Nk, d_qk=d, d_v=d)
    runs = [block_sparse(p, m, block=blk) for m in (causal, masks.from_mask_mod(causal), f"mod:{tmp_path}/m.py:causal")]
    off = Nk - Nq
    bm = create_block_mask(lambda b, h, q, kv: causal(b, h, q + off, kv), None, None, Nq, Nk, device="cpu",
                           BLOCK_SIZE=blk)  # fmt: skip
    runs.append(block_sparse(p, bm, block=blk))
    # independent: the key blocks each query block sees, the queries at positions off .. Nk - 1
    pos = off + np.arange(Nq)
    seen = sum(len({k // blk for k in range(Nk) if any(pos[i] >= k for i in range(r, min(r + blk, Nq)))})
               for r in range(0, Nq, blk))  # fmt: skip
    widths = {j: min(blk, Nk - j * blk) for j in range(-(-Nk // blk))}
    want_k = sum(d * widths[j] for r in range(0, Nq, blk)
                 for j in {k // blk for k in range(Nk) if pos[min(r + blk, Nq) - 1] >= k})  # fmt: skip
    assert seen > 3 and torch is not None
    for r in runs:
        assert r.exact and r.words["K"] == want_k, (r.words["K"], want_k)
    assert all(r.stats.per_array["K"] == runs[0].stats.per_array["K"] for r in runs)


def _tensor(kind, N=16, d=8):
    import torch

    if kind == "meta":
        return torch.empty(N, d, device="meta")
    if kind == "requires_grad":
        return torch.randn(N, d, dtype=torch.float64, requires_grad=True)
    if kind == "torch-bf16":
        return torch.randn(N, d).to(torch.bfloat16)
    import jax.numpy as jnp

    return jnp.asarray(__import__("numpy").random.default_rng(0).standard_normal((N, d)), dtype=jnp.bfloat16)


@pytest.mark.parametrize("path", ["one-head", "problem"])
@pytest.mark.parametrize("kind", ["meta", "requires_grad", "torch-bf16", "jax-bf16"])
def test_the_callers_tensors_read_alike_on_both_paths(kind, path):
    """A torch meta tensor ended in a traceback on the problem path and a misleading refusal on the one-head path; a
    requires_grad tensor in a traceback and a bf16 torch or JAX tensor in a refusal on the one-head path, where the
    problem path took them. Both paths now read the caller's arrays alike: a meta tensor is one line naming Q."""
    import numpy as np

    import iosim

    Q, K, V = (_tensor(kind) for _ in range(3))
    kw = dict(problem=iosim.Problem(N=16, d=8)) if path == "problem" else {}
    if kind == "meta":
        with pytest.raises(iosim.InputError, match="^Q must be .* holding data: a meta tensor has none"):
            iosim.run("flash2", Q=Q, K=K, V=V, M=1024, **kw)
        return
    r = iosim.run("flash2", Q=Q, K=K, V=V, M=1024, **kw)
    assert r.finite and r.stats.total == r.predicted.total
    assert max(r.errors.values()) < 1e-12 and np.isfinite(max(r.errors.values()))


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_sweep_out_is_written_with_the_mode_other_writers_use(suffix, tmp_path):
    """`iosim sweep --out` wrote mode 0600 (its temporary file's) where every other writer's files get 0644 under
    umask 022: the file now gets what open() gives a new file under the process's umask."""
    import os

    from iosim.runner.sweep import write_records

    out, plain = tmp_path / f"s{suffix}", tmp_path / "plain.txt"
    write_records([], out)
    with open(plain, "w"):
        pass
    assert out.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
    old = os.umask(0o027)
    try:
        write_records([], tmp_path / f"t{suffix}")
    finally:
        os.umask(old)
    assert (tmp_path / f"t{suffix}").stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("name, content", [("nodash-M4.txt", "x"), ("conv-2x2-M4.txt", None), ("-M.txt", "x")])
def test_an_exercise_folder_with_a_bad_file_is_one_line_in_python(name, content, tmp_path):
    """`iosim.views.html.exercises` ended in a traceback (ValueError, UnicodeDecodeError) on a misnamed or binary
    file, where the command line's own check gave one line; the check now lives in the function both use."""
    from iosim import InputError
    from iosim.views.html import exercises

    f = tmp_path / name
    if content is None:
        f.write_bytes(bytes(range(128, 256)))
    else:
        f.write_text(content)
    with pytest.raises(InputError, match=r"^folder must hold exercises .*" + name.replace(".", r"\.")):
        exercises(tmp_path)
