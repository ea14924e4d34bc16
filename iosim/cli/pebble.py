"""``iosim pebble``: play the red-blue pebble game, check iosim's schedules as pebblings, find tiny optima.

    iosim pebble matmul:2x2x2 --M 4 docs/pebble/matmul-2x2x2-M4.txt     play a schedule, report legality and I/O
    iosim pebble matmul:2x2x2 --M 4 --optimum                           exact minimum I/O beside the bounds
    iosim pebble --from-run flash1 --N 8 --d 4 --M 64 [--backward]      an iosim run as a checked pebbling
    iosim pebble --from-run all --N 8 --d 4 --M 64                      every algorithm and pass
    iosim pebble matmul:2x2x2 --M 4 SCHEDULE --picture g.png --at 10    the graph with its pebbles after move 10

Exit codes: 0 legal and complete (or the optimum found), 1 an illegal move or an output left without a blue
pebble, 2 bad input (a graph name, a schedule line that does not parse, a search past its limits).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from iosim.base.errors import InputError, install_hint
from iosim.base.version import __version__
from iosim.cli.options import Parser, add_problem_shape, add_yes, count, output_file, positive, problem_of
from iosim.pebble import from_run, search
from iosim.pebble.game import Game, IllegalMoveError, Outcome, format_moves, parse
from iosim.pebble.graph import SPEC_HELP, Graph, named


class _Intermixed(Parser):
    """Options and the two positionals in any order (``GRAPH --M 4 SCHEDULE``): argparse's intermixed parsing."""

    _inside = False

    def parse_known_args(self, args=None, namespace=None):
        if self._inside:
            return super().parse_known_args(args, namespace)
        self._inside = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.__class__ = _Intermixed

    p.add_argument("graph", nargs="?", help=f"the graph: {SPEC_HELP}")
    p.add_argument("schedule", nargs="?", help="a schedule file: one move a line ('R1 Q[0,0]'), or JSON")
    p.add_argument("--M", type=positive("--M"), help="red pebbles (fast-memory words)")
    p.add_argument(
        "--optimum", action="store_true", help="exact minimum I/O by search (graphs of a few dozen vertices)"
    )
    p.add_argument("--greedy", action="store_true", help="a greedy schedule's I/O (any size) beside the bounds")
    p.add_argument("--print-schedule", action="store_true", help="with --optimum/--greedy: print the schedule")
    p.add_argument("--max-states", type=positive("--max-states"), default=search.MAX_STATES, help="search limit")
    p.add_argument("--from-run", metavar="ALGO", help="check an iosim run of ALGO (or 'all') as a pebbling")
    p.add_argument("--N", type=positive("--N", from_run.MAX_N), help=f"with --from-run: N (at most {from_run.MAX_N})")
    p.add_argument("--d", type=positive("--d", from_run.MAX_D), help=f"with --from-run: d (at most {from_run.MAX_D})")
    p.add_argument("--backward", action="store_true", help="with --from-run: the backward pass")
    p.add_argument("--causal", action="store_true", help="with --from-run: causal masking")
    p.add_argument("--mask", default=None, help="with --from-run: a mask, as iosim run --mask (window:3, ...)")
    p.add_argument("--kv-policy", choices=("paper", "skip"), default=None,
                   help="with --from-run: empty blocks (default paper for one head, skip over a problem)")  # fmt: skip
    p.add_argument("--Br", type=positive("--Br", from_run.MAX_N), default=None, help="with --from-run: row block")
    p.add_argument("--Bc", type=positive("--Bc", from_run.MAX_N), default=None, help="with --from-run: column block")
    p.add_argument("--B", type=positive("--B", from_run.MAX_N), default=None,
                   help="with --from-run: square tile (standard, square-tiling)")  # fmt: skip
    g = p.add_argument_group(
        "a problem (with --from-run flash1|flash2|all, forward)",
        "batch, heads and GQA, N_q against N_k, d_qk and d_v (iosim.Problem; --causal is bottom-right)",
    )
    add_problem_shape(g)
    g.add_argument("--gqa", choices=("per-head", "packed"), default=None, help="GQA schedule (default per-head)")
    p.add_argument("--picture", metavar="FILE", help="draw the graph with its pebbles (PNG; needs iosim[plot])")
    p.add_argument("--at", type=count("--at"), default=None, help="with --picture: the state after this many moves")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--html", metavar="FILE", help="a page to play the game in a browser (GRAPH may be a folder of "
                   "exercises, as docs/pebble; docs/teaching.md)")  # fmt: skip
    add_yes(p, "a search (--max-states)")


def _need(args, *names: str, why: str) -> None:
    for name in names:
        if getattr(args, name.lstrip("-").replace("-", "_")) is None:
            raise InputError(name, f"is required {why}")


PICTURES = (".png", ".pdf", ".svg")


def command(args) -> int:
    if args.picture is not None:  # before any work: nothing computed, nothing written
        output_file("--picture", args.picture, PICTURES)
    if args.from_run is not None:
        if args.graph is not None:
            raise InputError("graph", "is not used with --from-run (the run's own graph is checked)", args.graph)
        return _cmd_from_run(args)
    _need(args, "graph", why=f"({SPEC_HELP}), or --from-run ALGO")
    _refuse_run_options(args)
    if args.html is not None:
        return _html(args)
    _graph_name(args.graph)
    _need(args, "--M", why="(the number of red pebbles)")
    graph = named(args.graph)
    if args.optimum or args.greedy:
        if args.schedule is not None:
            raise InputError("schedule", "is not used with --optimum (the search writes its own)", args.schedule)
        return _cmd_optimum(args, graph)
    if args.schedule is None:
        if args.picture is None:
            raise InputError("schedule", "is required to play a game (or use --optimum or --picture)")
        return _picture(args, graph, [])
    path = Path(args.schedule)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError("schedule", "must be a readable text file", f"{args.schedule}: {e}") from None
    moves = parse(text, graph, source=path.name)
    game = Game(graph, args.M)
    illegal = None
    try:
        outcome = game.play(moves)
    except IllegalMoveError as e:
        illegal, outcome = e, game.outcome()
    if args.picture is not None:
        _picture(args, graph, moves)
    if args.json:
        print(
            json.dumps(
                {
                    "iosim_version": __version__,
                    **outcome.as_dict(),
                    "legal": illegal is None,
                    "illegal": illegal and str(illegal),
                }
            )
        )
    else:
        print(graph.summary())
        print(f"schedule {path.name}: {len(moves)} moves, M = {args.M} red pebbles")
        if illegal is not None:
            print(f"{illegal}")
            print(f"before it: I/O {outcome.io} (R1 {outcome.reads}, R2 {outcome.writes}), red peak {outcome.peak}")
        else:
            _print_outcome(outcome)
    return 0 if illegal is None and outcome.complete else 1


# The options of an iosim run (--from-run) and what a named graph is instead: its builder (iosim.pebble.graph) takes
# its sizes from its name and nothing else, so none of them can be honoured on it.
RUN_ONLY = (
    ("--causal", "causal", "it is dense (no mask)"),
    ("--backward", "backward", "the backward's graph is attention-backward:NxD"),
    ("--mask", "mask", "it is dense (no mask)"),
    ("--kv-policy", "kv_policy", "it is dense (no mask, no empty blocks)"),
    ("--Br", "Br", "it has no tiles (a schedule file orders its moves)"),
    ("--Bc", "Bc", "it has no tiles (a schedule file orders its moves)"),
    ("--B", "B", "it has no tiles (a schedule file orders its moves)"),
    ("--gqa", "gqa", "it has one head"),
)


def _refuse_run_options(args) -> None:
    """A named graph (or a folder of them) with an option of a run: one line naming the option, where it applies
    (--from-run) and why the graph cannot take it. A problem's sizes first: a named graph has its own
    (matmul:MxKxN, attention:NxD)."""
    problem_only = [f"--{n}" for n in ("N", "d", "batch", "heads", "kv_heads", "Nq", "Nk", "dqk", "dv")
                    if getattr(args, n, None) is not None]  # fmt: skip
    if problem_only:
        raise InputError(
            problem_only[0].replace("_", "-"),
            f"applies with --from-run; the graph {args.graph} has its sizes in its name ({SPEC_HELP})",
            getattr(args, problem_only[0][2:]),
        )
    for flag, name, why in RUN_ONLY:
        value = getattr(args, name, None)
        if value is not None and value is not False:
            raise InputError(
                flag, f"applies with --from-run ALGO; the graph {args.graph} is built from its name: {why}", value
            )


def _graph_name(spec: str) -> None:
    """A folder, or a path that names neither a folder that exists nor a graph (a graph's name has a colon and no
    slash: matmul:2x2x2), refused in one line naming it (a folder of exercises applies with --html)."""
    if Path(spec).is_dir():
        raise InputError("graph", "is a folder: a folder of exercises applies with --html FILE", spec)
    if ":" not in spec or "/" in spec or "\\" in spec:
        raise InputError("graph", f"is neither a folder that exists nor a graph ({SPEC_HELP})", spec)


def _html(args) -> int:
    """``--html FILE``: the game in a page (iosim.views.html.pebble_page), the output checked before any work."""
    from iosim.views import html

    out = output_file("--html", args.html, html.SUFFIXES)
    if Path(args.graph).is_dir():
        _check_exercises(args.graph)
        games = html.exercises(args.graph)
        if not games:
            raise InputError("graph", "as a folder must hold exercises named GRAPH-SIZES-MM.txt", args.graph)
    else:
        _graph_name(args.graph)
        _need(args, "--M", why="(the number of red pebbles)")
        games = [(args.graph, args.M, args.schedule)]
    html.pebble_page(games, out, optimum_states=args.max_states, allow_long=args.yes)
    print(f"wrote {out}: {', '.join(f'{g} with M = {m}' for g, m, _ in games)}")
    return 0


def _check_exercises(folder: str) -> None:
    """Each exercise of ``folder`` as :func:`iosim.views.html.exercises` reads it (named GRAPH-SIZES-MM.txt and
    readable as text, else one line naming the file), its graph one that parses."""
    from iosim.views import html

    try:
        games = html.exercises(folder)
    except InputError as e:  # the folder is given as the graph argument here
        raise InputError("graph", f"as a folder {e.accepted}", e.got) from None
    for spec, _, f in games:
        try:
            named(spec)
        except InputError as e:
            raise InputError("graph", f"as a folder must hold exercises of graphs: {e}", f) from None


def _print_outcome(o: Outcome) -> None:
    print(f"legal: yes; I/O {o.io} (R1 reads {o.reads}, R2 writes {o.writes}); R3 computes {o.computes}")
    print(f"red peak {o.peak} of M = {o.M}")
    shown = ", ".join(o.missing[:6]) + (", ..." if len(o.missing) > 6 else "")
    print("every output is blue: yes" if o.complete else f"every output is blue: no (missing {shown})")


def _cmd_optimum(args, graph: Graph) -> int:
    rows = search.bound_rows(graph, args.M)
    heuristic = Game(graph, args.M).play(search.greedy(graph, args.M)).io
    if args.greedy:
        opt = None
        moves = search.greedy(graph, args.M)
    else:
        opt = search.optimum(graph, args.M, max_states=args.max_states, allow_long=args.yes)
        moves = opt.moves
    if args.json:
        out = {
            "iosim_version": __version__,
            "graph": graph.name,
            "M": args.M,
            "greedy_io": heuristic,
            "optimum_io": opt and opt.io,
        }
        out["search_states"] = opt and opt.states
        out["lower_bounds"] = [{"name": n, "value": v, "formula": f} for n, v, f in rows]
        print(json.dumps(out))
        return 0
    print(graph.summary())
    for name, value, formula in rows:
        print(f"lower bound, {name}: {max(value, 0):g}  [{formula}]")
    if opt is not None:
        print(f"minimum I/O with M = {args.M}: {opt.io}  [exact: A* search over {opt.states:,} states]")
    print(f"greedy schedule with M = {args.M}: {heuristic}  [demand order, Belady removal]")
    if args.print_schedule:
        print(format_moves(moves, graph), end="")
    if args.picture is not None:  # the schedule found (the optimum's, else the greedy one), drawn at --at or its end
        _picture(args, graph, moves)
    return 0


def _cmd_from_run(args) -> int:
    problem = problem_of(args, with_gqa=True)
    if problem is not None:
        _need(args, "--M", why="with --from-run")
        if args.backward:
            raise InputError("--backward", "is not available for a problem as a pebbling (forward only)", True)
        algos = ["flash1", "flash2"] if args.from_run == "all" else [args.from_run]
        masking = dict(mask=args.mask, kv_policy=args.kv_policy)
        gqa = args.gqa or "per-head"
        runs = [from_run.pebble_run(a, M=args.M, problem=problem, gqa=gqa, **masking, **_tiles(args, a))
                for a in algos]  # fmt: skip
        return _report(args, runs)
    _need(args, "--N", "--d", "--M", why="with --from-run")
    algos = from_run.registry.algorithms() if args.from_run == "all" else [args.from_run]
    algos = [a for a in algos if from_run.registry.get(a).builtin]
    passes = ["forward", "backward"] if args.from_run == "all" else ["backward" if args.backward else "forward"]
    masking = dict(mask=args.mask, kv_policy=args.kv_policy)
    runs = [from_run.pebble_run(a, args.N, args.d, args.M, p, args.causal, **masking, **_tiles(args, a))
            for a in algos for p in passes]  # fmt: skip
    return _report(args, runs)


def _tiles(args, algorithm: str) -> dict:
    """The explicit tiles for ``algorithm``: with --from-run all, Br and Bc go to flash1 and flash2 and B to standard
    attention and square tiling; with one algorithm all given (a tile it does not take is refused in one line)."""
    tiles = {k: getattr(args, k) for k in ("Br", "Bc", "B") if getattr(args, k) is not None}
    if args.from_run == "all":
        square = algorithm in ("standard", "square-tiling")
        tiles = {k: v for k, v in tiles.items() if (k == "B") == square}
    return tiles


def _report(args, runs) -> int:
    if args.json:
        print(json.dumps([{"iosim_version": __version__, **r.as_dict()} for r in runs]))
    elif len(runs) == 1:
        _print_run(runs[0])
    else:
        from tabulate import tabulate

        rows = []
        for r in runs:
            x = r.as_dict()
            rows.append(
                [
                    r.algorithm,
                    r.pass_,
                    ("yes" if r.legal_at_M else f"M'={r.M_prime}") if r.legal and x["complete"] else "NO",
                    x["pebble_io"],
                    x["sim_io"],
                    "yes" if r.io_matches else "NO",
                    x["red_peak"],
                    x["model_peak"],
                    f"{r.level1}/{r.level1_total}",
                ]
            )
        shape = str(runs[0].problem) if runs[0].problem is not None else f"N={args.N} d={args.d}"
        policy = args.kv_policy or ("paper" if runs[0].problem is None else "skip")
        print(
            f"iosim runs as red-blue pebblings: {shape} M={args.M}"
            f"{f' gqa={runs[0].gqa}' if runs[0].problem is not None else ''} causal={'yes' if args.causal else 'no'}"
            f"{f' mask={runs[0].mask} ({policy})' if args.mask else ''}"
        )
        heads = [
            "algorithm",
            "pass",
            "legal",
            "pebble I/O",
            "iosim I/O",
            "equal",
            "red peak",
            "model peak",
            "QK^T prods",
        ]
        print(tabulate(rows, headers=heads))
    ok = all(r.legal and r.io_matches and r.outcome.complete for r in runs)
    return 0 if ok else 1


def _print_run(r: from_run.PebbleRun) -> None:
    x = r.as_dict()
    masked = f" mask {r.mask}" if r.mask not in ("none", "causal") else ""
    causal = " causal" if r.causal else ""
    shape = f"{r.problem}, gqa {r.gqa}" if r.problem is not None else f"N={r.N} d={r.d}"
    print(f"{r.algorithm} {r.pass_}, {shape} M={r.M}{causal}{masked}: the run as a pebbling")
    print(f"  its DAG: {x['vertices']:,} vertices; {x['moves']:,} moves")
    if not r.legal:
        print(f"  {r.illegal}")
        return
    print(f"  {r.legality()}; every output blue: {'yes' if x['complete'] else 'no'}")
    print(
        f"  I/O: pebbling {x['pebble_io']} (R1 {x['pebble_reads']}, R2 {x['pebble_writes']}) vs iosim {x['sim_io']} "
        f"(reads {x['sim_reads']}, writes {x['sim_writes']} incl. {x['sim_init_writes']} initialisation): "
        f"{'equal' if r.io_matches else 'DIFFERENT'}"
    )
    over = x["over_M"]
    note = f", {over} above M: per-row scalars and temporaries the model does not count" if over else ""
    print(f"  red peak {x['red_peak']} vs M = {r.M} (the model's peak {x['model_peak']}){note}")
    whole = "N^2 d" if r.problem is None else "B H_q N_q N_k d_qk"
    print(f"  level-1 products Q[i,k] K[j,k] of the papers' graph: {r.level1} of {whole} = {r.level1_total}")


def _picture(args, graph: Graph, moves) -> int:
    try:
        import matplotlib
    except ImportError:
        raise InputError("--picture", f"needs matplotlib: {install_hint('plot')}") from None
    if len(graph) > 400:
        raise InputError("--picture", f"draws graphs of at most 400 vertices; {graph.name} has {len(graph)}")
    at = len(moves) if args.at is None else args.at
    if not 0 <= at <= len(moves):
        raise InputError("--at", f"must be a move number from 0 to {len(moves)}", args.at)
    game = Game(graph, args.M, strict=False)
    try:
        game.play(moves, stop=at)
    except IllegalMoveError:
        pass  # the picture shows the state before the illegal move; the report names it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = _layout(graph)
    fig_w = max(6.0, 1.2 * max(sum(1 for p in pos.values() if p[1] == y) for y in {p[1] for p in pos.values()}))
    fig_h = max(3.0, 0.9 * (1 + max(p[1] for p in pos.values())))
    fig, ax = plt.subplots(figsize=(min(fig_w, 40), min(fig_h, 30)))
    for v, ps in enumerate(graph.parents):
        for p in ps:
            ax.plot([pos[p][0], pos[v][0]], [pos[p][1], pos[v][1]], color="0.75", lw=0.6, zorder=1)
    for v in range(len(graph)):
        red, blue = v in game.red, v in game.blue
        face = "#d62728" if red else "white"
        edge = "#1f77b4" if blue else "0.4"
        ax.scatter(*pos[v], s=160, c=face, edgecolors=edge, linewidths=2.5 if blue else 0.8, zorder=2)
        if len(graph) <= 80:
            ax.annotate(graph.names[v], pos[v], xytext=(0, 9), textcoords="offset points", ha="center", fontsize=6)
    ax.set_title(
        f"{graph.name}, M = {args.M}: after {at} of {len(moves)} moves (red: fast, blue ring: slow); "
        f"I/O so far {game.reads + game.writes}",
        fontsize=9,
    )
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(args.picture, dpi=130)
    plt.close(fig)
    if not args.json:
        print(f"wrote {args.picture}")
    return 0


def _layout(graph: Graph) -> dict[int, tuple[float, float]]:
    """Layers by longest path from the inputs (inputs at the bottom), vertices spread evenly in each layer."""
    depth = [0] * len(graph)
    for v, ps in enumerate(graph.parents):  # parents come first
        depth[v] = 1 + max((depth[p] for p in ps), default=-1)
    layers: dict[int, list[int]] = {}
    for v, dep in enumerate(depth):
        layers.setdefault(dep, []).append(v)
    width = max(len(vs) for vs in layers.values())
    pos = {}
    for dep, vs in layers.items():
        for k, v in enumerate(vs):
            pos[v] = ((k + 0.5) * width / len(vs), float(dep))
    return pos
