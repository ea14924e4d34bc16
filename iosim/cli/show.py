"""``iosim show ALGO ... -o FILE``: a schedule as pictures (tile heat maps, residency timeline, a step, a GIF)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from iosim.base.errors import InputError
from iosim.cli.options import (
    add_algorithm,
    add_problem_options,
    add_problem_sizes,
    add_run_options,
    count,
    output_file,
    problem_run_kwargs,
)
from iosim.runner import api
from iosim.views import show


def add_arguments(p) -> None:
    add_algorithm(p)
    p.add_argument("algorithm2", nargs="?", metavar="ALGORITHM2", help="with --html: a second schedule side by side")
    add_problem_sizes(p)
    add_run_options(p)
    add_problem_options(p)
    p.add_argument("-o", "--output", help="the picture (.png; .gif for animate); with --view all, the stem of four")
    p.add_argument("--view", choices=show.VIEWS, default=None, help="which picture (default tiles)")
    p.add_argument("--step", type=count("--step"), default=None, help="the event of the step view (default: peak)")
    p.add_argument("--text", action="store_true", help="a plain-text step-through on stdout (no matplotlib needed)")
    p.add_argument("--limit", type=count("--limit"), default=None, help="events printed by --text (default 200)")
    p.add_argument(
        "--html", action="store_true", help="a self-contained teaching page (-o FILE.html; docs/teaching.md)"
    )
    g = p.add_argument_group("a grid of settings on one --html page (each one a real trace; docs/teaching.md)")
    for axis in ("N", "d", "M"):
        g.add_argument(f"--grid-{axis}", type=_positive_list(f"--grid-{axis}"), default=None, metavar="A,B,...",
                       help=f"values of {axis} the page's controls choose among (default: --{axis} alone)")  # fmt: skip
    g.add_argument("--grid-mask", default=None, metavar="none,causal,...", help="masks the page chooses among")


def _positive_list(name: str):
    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError(f"must be a comma-separated list of positive integers, got {text!r}")
        return values

    return parse


def _grid(args, out) -> int:
    """``--html`` with ``--grid-N/-d/-M/-mask``: one page of every setting's real traces (html.grid_page)."""
    from iosim.views import html

    if getattr(args, "problem", None) is not None or any(
        getattr(args, n, None) is not None for n in ("batch", "heads", "kv_heads", "Nq", "Nk", "dqk", "dv")
    ):
        raise InputError("--grid-N", "applies to one head (--N, --d), not to a problem")
    kw = problem_run_kwargs(args)
    Ns = args.grid_N or [kw.pop("N")]  # noqa: N806
    ds = args.grid_d or [kw.pop("d")]
    Ms = args.grid_M or [kw.pop("M")]  # noqa: N806
    for k in ("N", "d", "M", "mask", "causal"):
        kw.pop(k, None)
    masks = args.grid_mask.split(",") if args.grid_mask else [args.mask or ("causal" if args.causal else "none")]
    names = [args.algorithm] + ([args.algorithm2] if getattr(args, "algorithm2", None) else [])
    html.grid_page(names, out, Ns=Ns, ds=ds, Ms=Ms, masks=masks, **kw)
    print(f"wrote {out} ({out.stat().st_size:,} bytes; open it in a browser, no network needed)")
    return 0


def _traced(args):
    kw = problem_run_kwargs(args)
    kw.update(count_only=True, reference=False, trace=True)
    kw.pop("dtype", None)
    return api.run_keywords(args.algorithm, **kw)


def _output(args) -> Path:
    """-o checked before any work: .png (.gif for animate); with --view all a stem (no suffix, or .png)."""
    if args.view == "all":
        out = Path(args.output)
        if out.suffix.lower() not in ("", ".png"):
            raise InputError(
                "--output",
                "with --view all must be a stem (no suffix, or .png): it writes STEM_tiles.png, STEM_timeline.png, "
                "STEM_step.png and STEM_animate.gif",
                str(out),
            )
        stem = out.with_suffix("") if out.suffix.lower() == ".png" else out
        output_file("--output", stem.with_name(f"{stem.name}_tiles.png"), (".png",))
        return stem
    return output_file("--output", args.output, (".gif",) if args.view == "animate" else show.PICTURES)


# The options of a picture or of --text, and where each applies: the --html page steps through every event and
# shows every view itself, so none of them says anything to it.
NOT_HTML = (
    ("--text", "text", "is an output of its own (a step-through on stdout); --html writes a page: choose one"),
    ("--view", "view", "chooses a picture (-o FILE.png); the --html page shows every view"),
    ("--step", "step", "chooses the event of a picture's step view; the --html page steps through every event"),
    ("--limit", "limit", "applies with --text (events printed); the --html page holds every event"),
)


def _refuse_picture_options(args) -> None:
    """With --html: a picture's or --text's option given is refused in one line saying where it applies."""
    for flag, name, where in NOT_HTML:
        value = getattr(args, name, None)
        if value is not None and value is not False:  # 0 is a value given (--step 0, --limit 0)
            raise InputError(flag, where, value)


def _html(args) -> int:
    """``--html``: one self-contained page (iosim.views.html), the options checked (:func:`_refuse_picture_options`)
    and the output checked before any work."""
    from iosim.views import html

    _refuse_picture_options(args)
    if not args.output:
        raise InputError("--output", "is needed with --html (a .html file)")
    out = output_file("--output", args.output, html.SUFFIXES)
    if any(getattr(args, f"grid_{a}", None) for a in ("N", "d", "M", "mask")):
        return _grid(args, out)
    names = [args.algorithm] + ([args.algorithm2] if getattr(args, "algorithm2", None) else [])
    kw = problem_run_kwargs(args)
    html.page(names, out, **kw)
    print(f"wrote {out} ({out.stat().st_size:,} bytes; open it in a browser, no network needed)")
    return 0


def command(args) -> int:
    if getattr(args, "html", False):  # getattr: callers may build args by hand (tests/test_show.py)
        return _html(args)
    if getattr(args, "algorithm2", None):
        raise InputError("ALGORITHM2", "applies with --html (a second schedule side by side)", args.algorithm2)
    for a in ("N", "d", "M", "mask"):
        value = getattr(args, f"grid_{a}", None)
        if value:
            raise InputError(f"--grid-{a}", "applies with --html (a page of several settings)", value)
    args.view = getattr(args, "view", None) or "tiles"
    if not args.text:
        if not args.output:
            raise InputError("--output", "is needed for a picture (or use --text)")
        out = _output(args)  # before the run: a bad path is one line and exit 2, nothing computed or written
        show.pyplot()  # before the run: a missing matplotlib is one line and exit 2
    r = _traced(args)
    n = len(r.trace)
    step = args.step
    if step is None:  # the event at the peak
        step = int(np.argmax(r.trace.events[:, 7])) if n else 0
    if not 0 <= step < max(n, 1):
        raise InputError("--step", f"must be an event number from 0 to {n - 1:,}", args.step)
    if args.text:
        print(show.text(r, args.step, 200 if args.limit is None else args.limit))
        return 0
    views = ("tiles", "timeline", "step", "animate") if args.view == "all" else (args.view,)
    for v in views:
        path = out
        if args.view == "all":
            path = out.with_name(f"{out.name}_{v}{'.gif' if v == 'animate' else '.png'}")
        if v == "tiles":
            show.draw_tiles(r, path)
        elif v == "timeline":
            show.draw_timeline(r, path)
        elif v == "step":
            show.draw_step(r, path, step)
        else:
            show.draw_animation(r, path)
        print(f"wrote {path}")
    return 0
