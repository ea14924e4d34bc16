"""The red-blue pebble game (iosim.pebble): graphs, the rules, iosim runs as pebblings, the search, the exercises."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import iosim
from iosim import InputError
from iosim.cli import main
from iosim.pebble import Game, IllegalMoveError, Move, attention, from_run, matmul, named, parse, search
from iosim.pebble.graph import attention_backward
from iosim.runner.api import run_keywords

DOCS = Path(__file__).resolve().parents[1] / "docs"


# graphs ----------------------------------------------------------------------------------------------------------
def test_matmul_graph_is_the_textbook_one():
    g = matmul(2, 3, 2)
    assert len(g.inputs) == 2 * 3 + 3 * 2
    assert sum(op == "mul" for op in g.ops) == 2 * 3 * 2  # m k n products
    assert sum(op == "add" for op in g.ops) == 2 * 2 * (3 - 1)  # one chain of k - 1 additions per entry
    assert [g.names[v] for v in g.outputs] == ["C[0,0]", "C[0,1]", "C[1,0]", "C[1,1]"]
    assert {g.names[p] for p in g.parents[g.index["prod(C[1,0],k=2)"]]} == {"A[1,2]", "B[2,0]"}
    for v, ps in enumerate(g.parents):  # parents first: a topological numbering
        assert all(p < v for p in ps)


@pytest.mark.parametrize(("N", "d"), [(1, 1), (2, 1), (4, 2), (3, 5)])
def test_attention_graph_has_the_papers_layers(N, d):  # noqa: N803
    g = attention(N, d)
    assert len(g.inputs) == 3 * N * d and len(g.outputs) == N * d
    products = [v for v, op in enumerate(g.ops) if op == "mul" and not g.names[v].startswith("O[")]
    assert len(products) == 2 * N * N * d  # level 1 (QK^T) and the second product layer (A V)
    assert sum(op == "exp" for op in g.ops) == N * N
    assert sum(op == "recip" for op in g.ops) == N
    s = attention(N, d, stable=True)
    assert sum(op == "exp-sub" for op in s.ops) == N * N
    assert {s.names[p] for p in s.parents[s.index[f"A[{N - 1},0]"]]} == {f"S[{N - 1},0]", f"m[{N - 1}]"}


def test_backward_graph():
    g = attention_backward(2, 2)
    assert sorted(g.names[v][:2] for v in g.outputs) == ["dK"] * 4 + ["dQ"] * 4 + ["dV"] * 4
    assert {g.names[p] for p in g.parents[g.index["dS[1,0]"]]} == {"P[1,0]", "dP[1,0]", "D[1]"}


def test_named_graphs():
    assert named("matmul:2x2x2").name == "matmul:2x2x2" and len(named("matmul:2x2x2")) == 20
    assert len(named("attention:4x2")) == 168
    for bad in ("matmul:2x2", "attention:0x2", "conv:2x2", "matmul", ""):
        with pytest.raises(InputError, match="graph"):
            named(bad)


# the rules ---------------------------------------------------------------------------------------------------------
def _moves(g, text):
    return parse(text, g)


def test_a_legal_game_counts_reads_and_writes():
    g = matmul(1, 1, 1)  # C = A B, one product
    out = Game(g, 3).play(_moves(g, "R1 A[0,0]\nR1 B[0,0]\nR3 C[0,0]\nR2 C[0,0]\nR4 C[0,0]\n"))
    assert (out.reads, out.writes, out.io, out.computes, out.peak, out.complete) == (2, 1, 3, 1, 3, True)


@pytest.mark.parametrize(
    ("text", "rule", "vertex", "reason"),
    [
        ("R3 C[0,0]", "R3", "C[0,0]", "parents A[0,0], B[0,0] not red"),
        ("R3 A[0,0]", "R3", "A[0,0]", "inputs enter fast memory only by R1"),
        ("R2 A[0,0]", "R2", "A[0,0]", "no red pebble"),
        ("R1 A[0,0]\nR1 B[0,0]\nR3 C[0,0]\nR4 C[0,0]\nR1 C[0,0]", "R1", "C[0,0]", "no blue pebble"),
        ("R4 B[0,0]", "R4", "B[0,0]", "no red pebble to remove"),
    ],
)
def test_illegal_moves_name_rule_and_vertex(text, rule, vertex, reason):
    g = matmul(1, 1, 1)
    with pytest.raises(IllegalMoveError) as e:
        Game(g, 3).play(_moves(g, text))
    assert (e.value.rule, e.value.vertex) == (rule, vertex)
    assert reason in str(e.value) and rule in str(e.value) and vertex in str(e.value)


def test_capacity_is_M_red_pebbles():
    g = matmul(1, 1, 1)
    with pytest.raises(IllegalMoveError, match=r"move 3 \(line 3\): R3 \(compute\) on C\[0,0\]: all M=2"):
        Game(g, 2).play(_moves(g, "R1 A[0,0]\nR1 B[0,0]\nR3 C[0,0]"))
    loose = Game(g, 2, strict=False)
    assert loose.play(_moves(g, "R1 A[0,0]\nR1 B[0,0]\nR3 C[0,0]\nR2 C[0,0]")).peak == 3


def test_recomputation_and_repeated_io_are_legal_and_counted():
    g = matmul(1, 1, 1)
    text = "R1 A[0,0]\nR1 A[0,0]\nR1 B[0,0]\nR3 C[0,0]\nR4 C[0,0]\nR3 C[0,0]\nR2 C[0,0]\nR2 C[0,0]"
    out = Game(g, 3).play(_moves(g, text))
    assert (out.reads, out.writes, out.computes, out.complete) == (3, 2, 2, True)


def test_an_unfinished_game_says_which_outputs_are_missing():
    g = matmul(1, 2, 1)
    out = Game(g, 4).play(_moves(g, "R1 A[0,0]"))
    assert not out.complete and out.missing == ["C[0,0]"]


def test_schedule_parse_errors_name_line_and_reason():
    g = matmul(1, 1, 1)
    with pytest.raises(InputError, match=r"schedule line 3: no vertex Q\[0,0\] in graph matmul:1x1x1"):
        parse("# comment\nR1 A[0,0]\nR1 Q[0,0]\n", g)
    with pytest.raises(InputError, match=r"schedule line 2: the move must start with R1"):
        parse("R1 A[0,0]\nR7 A[0,0]\n", g)
    with pytest.raises(InputError, match=r"schedule line 1: a move is a rule and a vertex"):
        parse("R1\n", g)
    with pytest.raises(InputError, match=r"schedule line 2: not valid JSON"):
        parse('[["R1", "A[0,0]"],\n oops]', g)
    moves = parse('{"moves": [["read", "A[0,0]"], {"rule": "R1", "vertex": "B[0,0]"}]}', g)
    assert moves == [Move("R1", 0), Move("R1", 1)]


# iosim runs as pebblings -----------------------------------------------------------------------------------------
# Sizes with several ragged tiles in every algorithm (fit tiling at these M), N and d odd.
RUNS = [(5, 3, 40), (7, 3, 30)]


@pytest.mark.parametrize("algorithm", ["standard", "flash1", "flash2", "square-tiling"])
@pytest.mark.parametrize("pass_", ["forward", "backward"])
@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
def test_every_iosim_schedule_is_a_legal_pebbling_with_the_same_io(algorithm, pass_, causal):
    for N, d, M in RUNS:
        r = from_run.pebble_run(algorithm, N, d, M, pass_, causal)
        label = f"{algorithm} {pass_} N={N} d={d} M={M} causal={causal}"
        assert r.legal, f"{label}: {r.illegal}"
        assert r.outcome.complete, f"{label}: outputs without blue: {r.outcome.missing[:4]}"
        assert r.outcome.io == r.sim_reads + r.sim_writes, label  # to the word, initialisation included
        assert r.outcome.reads == r.sim_reads and r.outcome.writes == r.sim_writes, label
        assert r.max_error < 1e-12, label  # the symbolic run computed the right numbers
        assert r.sim_peak <= M  # the model's peak obeys M; the pebbling's true peak is reported beside it
        assert r.outcome.peak >= 1
        recomputes_scores = not (pass_ == "backward" and algorithm in ("standard", "square-tiling"))
        if recomputes_scores and not causal:
            assert r.level1 == N * N * d, label  # every level-1 product of the papers' graph is in the run's DAG
        if pass_ == "forward" and algorithm == "flash1":
            assert r.sim_init_writes == N * d + 2 * N  # O, l, m zeroed in HBM: constant vertices, R3 + R2


@pytest.mark.parametrize("algorithm", ["standard", "flash1", "flash2", "square-tiling"])
@pytest.mark.parametrize("pass_", ["forward", "backward"])
@pytest.mark.parametrize("mask", ["window:2", "blockdiag:3,4", "random-blocks:0.5:2x3:1", "prefix:2"])
def test_masked_schedules_are_legal_pebblings_with_the_same_io(algorithm, pass_, mask):
    for policy in ("paper", "skip"):
        r = from_run.pebble_run(algorithm, 7, 3, 30, pass_, mask=mask, kv_policy=policy)
        label = f"{algorithm} {pass_} {mask} {policy}"
        assert r.legal, f"{label}: {r.illegal}"
        assert r.outcome.complete and r.io_matches, label
        assert r.outcome.reads == r.sim_reads and r.outcome.writes == r.sim_writes, label
        assert r.max_error < 1e-12, label
        assert r.mask.startswith(mask.split(":")[0]), r.mask
        if pass_ == "forward":  # the same schedule as iosim.run's, mask and policy included
            run = iosim.run(iosim.Schedule(algorithm, kv_policy=policy), N=7, d=3, M=30, mask=mask, reference=False)
            assert run.stats.total == r.sim_reads + r.sim_writes, label


def test_the_true_peak_is_reported_above_M():
    r = from_run.pebble_run("standard", 8, 4, 64)
    assert r.legal and r.io_matches
    assert r.outcome.peak > r.M >= r.sim_peak  # scalars and temporaries the model does not count


def test_a_schedule_that_skips_a_load_is_caught():
    r = from_run.pebble_run("flash2", 5, 3, 40)
    first_read = next(k for k, m in enumerate(r.moves) if m.rule == "R1")
    broken = r.moves[:first_read] + r.moves[first_read + 1 :]
    with pytest.raises(IllegalMoveError, match="R3"):
        Game(r.graph, r.M, strict=False).play(broken)


def test_from_run_refuses_large_sizes():
    with pytest.raises(InputError, match="N"):
        from_run.pebble_run("flash1", 64, 4, 256)
    with pytest.raises(InputError, match="pass"):
        from_run.pebble_run("flash1", 4, 2, 64, "sideways")


# the search ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "M", "io"),
    [
        ("matmul:1x2x1", 3, 7),
        ("matmul:1x2x1", 4, 5),
        ("matmul:2x2x1", 3, 13),
        ("matmul:2x2x1", 4, 9),
        ("matmul:2x2x1", 5, 8),
        ("attention:1x2", 4, 8),
    ],
)
def test_optimum_of_tiny_graphs(spec, M, io):  # noqa: N803
    g = named(spec)
    opt = search.optimum(g, M)
    assert opt.io == io
    out = Game(g, M).play(opt.moves)  # its schedule is a legal, complete game with that I/O
    assert out.complete and out.io == io and out.peak <= M
    assert opt.io >= max(v for _, v, _ in search.bound_rows(g, M))
    greedy = Game(g, M).play(search.greedy(g, M))
    assert greedy.complete and greedy.io >= opt.io


def test_matmul_1x2x1_by_hand():
    # C = A0 B0 + A1 B1. M = 4: read all four inputs, compute, write: 5. M = 3: no room for both products and an
    # input, so one product is written and read back: 7.
    assert search.optimum(matmul(1, 2, 1), 4).io == 5
    assert search.optimum(matmul(1, 2, 1), 3).io == 7


def test_search_refuses_past_its_limits():
    with pytest.raises(InputError, match="at most 40 vertices"):
        search.optimum(named("attention:4x2"), 8)
    with pytest.raises(InputError, match="gave up .* after 50 search states"):
        search.optimum(named("matmul:2x2x2"), 3, max_states=50)
    with pytest.raises(InputError, match="at least 3"):
        search.optimum(named("matmul:2x2x2"), 2)


# the exercises in docs/pebble.md ---------------------------------------------------------------------------------
def _exercises():
    table = (DOCS / "pebble.md").read_text()
    rows = re.findall(r"\| `(docs/pebble/[^`]+)` \| `([^`]+)` \| (\d+) \| (\d+) \|", table)
    assert len(rows) >= 3
    return rows


@pytest.mark.parametrize(("path", "spec", "M", "io"), _exercises())
def test_exercise_solutions_play_as_documented(path, spec, M, io):  # noqa: N803
    g = named(spec)
    out = Game(g, int(M)).play(parse((DOCS.parent / path).read_text(), g))
    assert out.complete and out.io == int(io) and out.peak <= int(M)


# the command ------------------------------------------------------------------------------------------------------
def test_cli_plays_a_schedule(capsys):
    assert main(["pebble", "matmul:2x2x2", "--M", "4", str(DOCS / "pebble" / "matmul-2x2x2-M4.txt")]) == 0
    assert "legal: yes; I/O 17" in capsys.readouterr().out


def test_cli_reports_an_illegal_schedule(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_text("R1 A[0,0]\nR3 prod(C[0,0],k=0)\n")
    assert main(["pebble", "matmul:2x2x2", "--M", "4", str(bad)]) == 1
    assert "illegal move 2 (line 2): R3 (compute) on prod(C[0,0],k=0): parent B[0,0] not red" in capsys.readouterr().out


def test_cli_from_run_and_optimum_json(capsys):
    assert main(["pebble", "--from-run", "flash2", "--N", "4", "--d", "2", "--M", "24", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)
    assert run["legal"] and run["io_matches"] and run["pebble_io"] == run["sim_io"]
    assert main(["pebble", "matmul:2x2x1", "--M", "4", "--optimum", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["optimum_io"] == 9


def test_cli_picture(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "g.png"
    sched = str(DOCS / "pebble" / "matmul-2x2x2-M4.txt")
    assert main(["pebble", "matmul:2x2x2", "--M", "4", sched, "--picture", str(png), "--at", "10"]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


# ----------------------------------------------------------------------------------------- a problem as a pebbling
@pytest.mark.parametrize("algorithm", ["flash1", "flash2"])
@pytest.mark.parametrize("gqa", ["per-head", "packed"])
@pytest.mark.parametrize("causal", [False, True])
def test_problem_run_as_a_pebbling(algorithm, gqa, causal):
    """flash1 and flash2 over a problem (batch, GQA, N_q != N_k, d_qk != d_v, bottom-right causal), run through the
    problem drivers as a pebbling: legal, complete, its I/O equal to the simulator's and to the run's, every score's
    products Q[i,k] K[j,k] of the matching heads in the DAG, outputs equal to the float64 problem reference."""
    import iosim
    from iosim.pebble.from_run import pebble_run

    p = iosim.Problem(B=2, H_q=2, H_kv=1, N_q=2, N_k=5, d_qk=3, d_v=2, causal=causal)
    r = pebble_run(algorithm, problem=p, M=60, gqa=gqa)
    assert r.legal and r.outcome.complete and r.io_matches
    assert (
        r.sim_reads + r.sim_writes
        == iosim.run(iosim.Schedule(algorithm, gqa=gqa), problem=p, M=60, count_only=True).stats.total
    )
    assert r.level1 == r.level1_total == 2 * 2 * 2 * 5 * 3
    assert r.max_error < 1e-12 and r.problem == p


@pytest.mark.parametrize("algorithm", ["flash1", "flash2"])
@pytest.mark.parametrize("gqa", ["per-head", "packed"])
def test_problem_run_as_a_pebbling_under_a_mask_per_head(algorithm, gqa):
    """A mask_mod that differs per (b, h) (documents per batch item, a window per head; the two heads of a group
    differ): each part of the problem runs under its own mask (packed: the group's rows under theirs), one after
    another in one pebbling: legal, complete, its I/O equal to the run's per array, outputs equal to the float64
    reference of each query head under its own mask."""
    import numpy as np

    import iosim
    from iosim.masking import masks
    from iosim.pebble.from_run import pebble_run

    docs = np.array([[0] * 3 + [1] * 2, [0] + [1] * 4])

    def doc_window(b, h, q_idx, kv_idx):
        return (docs[b][q_idx] == docs[b][kv_idx]) & (q_idx >= kv_idx) & (kv_idx > q_idx - 1 - 2 * h)

    p = iosim.Problem(B=2, H_q=2, H_kv=1, N_q=2, N_k=5, d_qk=3, d_v=2)
    r = pebble_run(algorithm, problem=p, M=60, gqa=gqa, mask=masks.from_mask_mod(doc_window), seed=5)
    run = iosim.run(
        iosim.Schedule(algorithm, gqa=gqa), problem=p, M=60, mask=masks.from_mask_mod(doc_window), count_only=True
    )
    assert r.legal and r.outcome.complete and r.io_matches and r.mask == "mod:doc_window per (b, h)"
    assert (r.sim_reads, r.sim_writes) == (run.stats.reads, run.stats.writes)
    assert r.max_error < 1e-12  # against each query head's reference under its own mask (head 0: the diagonal)


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        (dict(algorithm="standard"), "algorithm"),
        (dict(pass_="backward"), "pass"),
        (dict(problem=dict(page_size=2)), "problem"),
        (dict(problem=dict(N_k=200)), "problem"),
        (dict(gqa="grouped"), "gqa"),
        (dict(N=4), "N, d, causal"),
    ],
)  # fmt: skip
def test_problem_pebbling_bad_input(kwargs, parameter):
    import iosim
    from iosim.pebble.from_run import pebble_run

    fields = {**dict(B=1, H_q=2, H_kv=1, N_q=2, N_k=5, d=3), **kwargs.pop("problem", {})}
    algorithm = kwargs.pop("algorithm", "flash2")
    with pytest.raises(iosim.InputError) as e:
        pebble_run(algorithm, M=60, problem=iosim.Problem(**fields), **kwargs)
    assert e.value.parameter == parameter and "\n" not in str(e.value)


def test_cli_problem_pebbling(capsys):
    from iosim.cli import main

    argv = ["pebble", "--from-run", "all", "--batch", "2", "--heads", "2", "--Nq", "2", "--Nk", "5", "--d", "2"]
    assert main([*argv, "--M", "60"]) == 0
    out = capsys.readouterr().out
    assert "B=2, H_q=2, H_kv=2, N_q=2, N_k=5" in out and out.count("yes") >= 4 and "80/80" in out
    assert main([*argv, "--M", "60", "--backward"]) == 2
    assert main([*argv, "--M", "60", "--Nq", "9", "--mask", "window:2"]) == 2  # a mask needs N_q <= N_k
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--backward" in err[0] and "mask" in err[1] and "N_q <= N_k" in err[1]
    assert main([*argv, "--M", "60", "--mask", "window:2:causal"]) == 0  # masks over a problem play too
    out = capsys.readouterr().out
    assert "mask=window:2:causal (skip)" in out and out.count("yes") >= 4


def test_pebble_run_takes_explicit_tiles(capsys):
    """Br/Bc and B as iosim.run takes them: the pebbling's I/O equals iosim's run at those tiles (one head, both
    passes, and over a problem); a tile the algorithm does not take or one above M is refused in one line."""
    from iosim.cli import main
    from iosim.pebble.from_run import pebble_run

    for algo, tiles in (("flash2", dict(Br=2, Bc=3)), ("flash1", dict(Br=3, Bc=2)), ("square-tiling", dict(B=2))):
        for pass_ in ("forward", "backward"):
            r = pebble_run(algo, 6, 2, 80, pass_, **tiles)
            ref = run_keywords(algo, N=6, d=2, M=80, backward=pass_ == "backward", count_only=True, **tiles)
            assert r.legal and r.io_matches and (r.sim_reads, r.sim_writes) == (ref.stats.reads, ref.stats.writes)
    p = iosim.Problem(H_q=2, N_q=2, N_k=6, d=2)
    r = pebble_run("flash1", M=80, problem=p, gqa="packed", Br=4, Bc=2)
    ref = iosim.run(iosim.Schedule("flash1", gqa="packed", Br=4, Bc=2), problem=p, M=80, count_only=True)
    assert r.legal and r.io_matches and r.sim_reads == ref.stats.reads
    for argv, word in ((["--from-run", "flash2", "--N", "6", "--d", "2", "--M", "60", "--B", "2"], "B applies"),
                       (["--from-run", "flash1", "--heads", "2", "--Nq", "2", "--Nk", "6", "--d", "2", "--M", "30",
                         "--Br", "4", "--Bc", "6"], "working set")):  # fmt: skip
        assert main(["pebble", *argv]) == 2
        err = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("iosim: compiling")]
        assert len(err) == 1 and word in err[0]
