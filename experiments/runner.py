"""The one runner every experiment shares: the command line, the output folder, quick mode, the outputs with
their verdict and provenance.

An experiment module holds only what is its own (experiments/__init__.py says how to add one):

* ``NAME``, ``TITLE``, ``CLAIM`` (and ``NEEDS``, the extras it needs, default ``("plot",)``; ``DPI``, default 100);
* ``FULL`` and ``QUICK``: its grids, dicts of parameters (``--quick`` picks ``QUICK``; either may be omitted:
  ``FULL`` defaults to ``{}``, ``QUICK`` to ``FULL``);
* ``measure(g) -> list[dict]``: the measurements, one dict per CSV row; ``g`` is the grid with attribute access
  (``g.N``) plus ``g.quick`` and ``g.skipped``, a list for the points it could not run (one line each);
* ``verdict(rows, g) -> Summary``: the verdict and the summary table;
* ``plot(rows, g) -> Figure | None``: the matplotlib figure.

The runner (:func:`run`) checks the extras and the output folder before any work, then writes
``<stem>.csv`` (every row), ``<stem>.png`` (the figure), ``<stem>.tex`` (the table, LaTeX booktabs) and
``<stem>.md`` (claim, verdict, table, figure, notes, provenance), plus any ``Summary.texts``. :func:`main` is the
command line ``python experiments/NN_x.py [--quick] [--out DIR]`` (plus ``--KEY INT`` for each integer of the grid);
each file ends with ``main = runner.script(globals())`` and ``if __name__ == "__main__": raise SystemExit(main())``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace

from iosim.experiments._common import RESULTS, MissingExtra, Verdict, require, write_csv
from tabulate import tabulate

from iosim.base.errors import InputError


@dataclass
class Summary:
    """What an experiment's ``verdict`` function returns: the verdict and the table that backs it."""

    verdict: Verdict
    table: list[list]
    headers: list[str]
    md: Sequence[str] = ()  # extra markdown lines after the figure, before the notes
    texts: dict[str, str] = field(default_factory=dict)  # extra text outputs: suffix -> content (<stem>.<suffix>)


def stem(module: ModuleType) -> str:
    """The stem of an experiment's outputs: its file name (``02_flash_thm2``)."""
    return Path(module.__file__).stem


def needs(module: ModuleType) -> tuple[str, ...]:
    return tuple(getattr(module, "NEEDS", ("plot",)))


def grid(module: ModuleType, quick: bool, overrides: dict | None = None) -> SimpleNamespace:
    """The experiment's QUICK or FULL grid (with ``overrides`` from the command line), with attribute access,
    ``quick`` and an empty ``skipped`` list."""
    full = getattr(module, "FULL", {})
    g = {**(getattr(module, "QUICK", full) if quick else full), **(overrides or {})}
    return SimpleNamespace(**g, quick=quick, skipped=[])


def integers(module: ModuleType) -> list[str]:
    """The grid's integer entries (``N``, ``half``, ...): the command line can set each one (``--N 64``)."""
    full = getattr(module, "FULL", {})
    return [k for k, val in full.items() if isinstance(val, int) and not isinstance(val, bool)]


def check_out(out: Path) -> None:
    """Refuse an output folder that cannot be written, before any work: it must be a folder (or not exist yet),
    and its nearest existing ancestor a writable directory (missing folders in between are created)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError("--out", "must be a folder, not a file", str(out))
    base = out
    while not base.exists():
        if base.parent == base:
            break
        base = base.parent
    if not base.is_dir():
        raise InputError("--out", f"must lie in a directory, but {base} is a file", str(out))
    if not os.access(base, os.W_OK | os.X_OK):
        raise InputError("--out", f"must be writable, but {base} is not", str(out))


def provenance(name: str, quick: bool, command: str | None, seconds: float) -> dict[str, str]:
    from iosim.base.version import __version__

    return {
        "iosim": __version__,
        "command": command or f"iosim experiments run {name}" + (" --quick" if quick else ""),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "quick": "yes (smoke-run grid)" if quick else "no (full grid)",
        "seconds": f"{seconds:.1f} (computing, before writing)",
        "python": platform.python_version(),
    }


def prepare(module: ModuleType, out: Path) -> None:
    """Everything that must hold before any work: the extras installed, the output folder writable."""
    require(needs(module))
    check_out(out)


def run(
    module: ModuleType,
    out: Path = RESULTS,
    quick: bool = False,
    command: str | None = None,
    overrides: dict | None = None,
) -> Verdict:
    """Run one experiment module and write its outputs; returns its verdict (files and seconds filled in)."""
    out = Path(out)
    prepare(module, out)
    t0 = time.perf_counter()
    g = grid(module, quick, overrides)
    rows = module.measure(g)
    summary = module.verdict(rows, g)
    inexact = [r for r in rows if r.get("exact") is False]
    if inexact:  # a simulated count that differs from its closed form is a defect of iosim, never a finding
        summary.verdict.failures.append(f"{len(inexact)} of {len(rows)} rows differ from their closed form")
    fig = None
    if hasattr(module, "plot"):
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        fig = module.plot(rows, g)
    v = summary.verdict
    v.seconds = time.perf_counter() - t0
    write(out, stem(module), rows, summary, fig, provenance(v.name, quick, command, v.seconds), module)
    v.seconds = time.perf_counter() - t0  # with the writing, as the command lines report it
    return v


def write(out: Path, name: str, rows: list[dict], s: Summary, fig, prov: dict[str, str], module=None) -> None:
    """Write <name>.csv (all rows), .tex (the summary table), .png (the figure, if any), .md (verdict, table,
    figure, notes, provenance) and every extra text; fills in the verdict's file list."""
    v = s.verdict
    out.mkdir(parents=True, exist_ok=True)
    files = [f"{name}.csv", f"{name}.tex"]
    write_csv(out / f"{name}.csv", rows)
    tex = tabulate(s.table, headers=s.headers, tablefmt="latex_booktabs", disable_numparse=True)
    stamp = ", ".join(f"{k} {val}" for k, val in prov.items() if k != "command")
    (out / f"{name}.tex").write_text(f"% {v.name}: generated by `{prov['command']}`\n% {stamp}\n% {v.claim}\n{tex}\n")
    if fig is not None:
        import matplotlib.pyplot as plt

        fig.savefig(out / f"{name}.png", dpi=getattr(module, "DPI", 100))
        plt.close(fig)
        files.append(f"{name}.png")
    md = [
        f"# {v.name}",
        "",
        f"Command: `iosim experiments run {v.name}`",
        "",
        f"**Claim.** {v.claim}",
        "",
        f"**Verdict: {v.word}.** {v.measured} ({v.figure})",
        "",
        tabulate(s.table, headers=s.headers, tablefmt="github", disable_numparse=True),
        "",
    ]
    if fig is not None:
        md += [f"![{v.name}]({name}.png)", ""]
    md += list(s.md)
    if v.notes:
        md += ["", "Notes:", "", *(f"- {n}" for n in v.notes)]
    md += [
        "",
        "Provenance:",
        "",
        *(f"- {k}: `{val}`" if k == "command" else f"- {k}: {val}" for k, val in prov.items()),
    ]
    (out / f"{name}.md").write_text("\n".join(md) + "\n")
    files.append(f"{name}.md")
    for suffix, text in s.texts.items():
        (out / f"{name}.{suffix}").write_text(text)
        files.append(f"{name}.{suffix}")
    v.files = files


def report(v: Verdict, out: Path, echo=print) -> None:
    """The lines both command lines print after a run: the verdict, its notes, the files written."""
    echo(f"{v.name}: {v.line()}")
    for n in v.notes:
        echo(f"  - {n}")
    echo(f"wrote {', '.join(str(Path(out) / f) for f in v.files)} in {v.seconds:.1f} s")
    for f in v.failures:
        echo(f"FAILED: {f}")


def _module(module: ModuleType | str | dict) -> ModuleType:
    if isinstance(module, str):
        return sys.modules[module]
    if isinstance(module, dict):  # a module's globals(): also for a file loaded without registering it
        ns = ModuleType(module["__name__"], module.get("__doc__"))
        ns.__dict__.update(module)
        return ns
    return module


def main(module: ModuleType | str | dict, argv: list[str] | None = None) -> int:
    """``python experiments/NN_x.py [--quick] [--out DIR] [--KEY INT ...]``: run one experiment, print its verdict;
    exit 2 with one line for a missing extra or an unusable output folder. ``module`` is the module, its name or
    its ``globals()``; every integer of the grid can be set (``--N 64``)."""
    module = _module(module)
    ap = argparse.ArgumentParser(description=module.TITLE)
    ap.add_argument("--quick", action="store_true", help="a smaller smoke run (the QUICK grid)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="output folder (default ./results)")
    keys = integers(module)
    for k in keys:
        ap.add_argument(
            f"--{k}", type=int, dest=f"grid_{k}", metavar="INT", help=f"the grid's {k} (default {module.FULL[k]})"
        )
    args = ap.parse_args(argv)
    overrides = {k: getattr(args, f"grid_{k}") for k in keys if getattr(args, f"grid_{k}") is not None}
    raw = sys.argv[1:] if argv is None else argv
    command = " ".join(["python", f"experiments/{stem(module)}.py", *raw])
    try:
        v = run(module, args.out, quick=args.quick, command=command, overrides=overrides)
    except MissingExtra as e:
        print(e, file=sys.stderr)
        return 2
    except InputError as e:
        print(f"{stem(module)}: error: {e}", file=sys.stderr)
        return 2
    report(v, args.out)
    return 1 if v.failures else 0


def script(namespace: dict):
    """``main = runner.script(globals())``: an experiment's ``main(argv=None) -> int``, its command line."""

    def main_(argv: list[str] | None = None) -> int:
        return main(namespace, argv)

    return main_
