"""The registry of experiments: every claim of the papers that iosim reproduces, one module each, by name.

``iosim experiments list | run NAME | run all`` (iosim/cli/experiments.py) runs them; the folder installs as
``iosim.experiments`` (experiments sit on top of iosim: nothing else in iosim imports them). Each module
writes results/<stem>.{csv,png,tex,md}; ``run_all`` also writes results/index.md, the gallery.

Adding an experiment is one file and one registry entry:

1. ``experiments/NN_short_name.py`` (NN the next number; the file name is the stem of its outputs) holding only
   what is its own::

       # ruff: noqa: N999 - numbered experiment scripts, loaded by file or by importlib
       # (the module docstring: the claim, its source (paper, theorem), the grid, how the verdict is decided)
       from iosim.experiments import runner
       from iosim.experiments._common import Verdict, fit_power

       NAME = "short-name"                  # what `iosim experiments run NAME` takes
       TITLE = "One line for --help"
       CLAIM = "What the paper says, with its source."
       NEEDS = ("plot",)                    # extras it needs (the default); checked before anything runs
       FULL = {"N": 4096, "ds": (64, 128)}  # the grid; g.N, g.ds in the functions below
       QUICK = {"N": 512, "ds": (32, 64)}   # --quick: a smoke run of seconds

       def measure(g) -> list[dict]:        # one dict per CSV row; g.skipped collects points that cannot run
           ...

       def verdict(rows, g) -> runner.Summary:
           v = Verdict(NAME, CLAIM, measured="...", figure="the deciding number", holds=True)
           return runner.Summary(v, table=[[...]], headers=[...])

       def plot(rows, g):                   # a matplotlib figure (or None)
           ...

       main = runner.script(globals())      # python experiments/NN_x.py [--quick] [--out DIR]

       if __name__ == "__main__":
           raise SystemExit(main())

2. an :class:`Entry` in ``EXPERIMENTS`` below: name, stem (the file name), the claim's source, a title.

The runner (experiments/runner.py) does the rest: ``python experiments/NN_short_name.py [--quick] [--out DIR]``
(and ``--KEY INT`` for each integer of the grid, e.g. ``--N 1024``),
the extras and output-folder checks before any work, and the outputs with the verdict and the provenance (iosim
version, command, date, quick or full grid). tests/test_experiments.py runs every registered experiment's QUICK
grid and checks its four outputs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from iosim.experiments import runner
from iosim.experiments._common import RESULTS, MissingExtra, Verdict


@dataclass(frozen=True)
class Entry:
    name: str  # what `iosim experiments run NAME` takes
    stem: str  # the module file (experiments/<stem>.py) and the stem of its outputs in results/
    item: str  # which claim of a paper or kernel it reproduces
    title: str
    pending: str | None = None  # why it cannot run yet (a placeholder for work in another issue)


EXPERIMENTS: tuple[Entry, ...] = (
    Entry("crossover", "01_crossover", "Saha & Ye Thm 3.1, Li et al. Thm 1.1", "Crossover at M ~ d^2, both passes"),
    Entry("flash-thm2", "02_flash_thm2", "FlashAttention Thm 2", "I/O scaling in M, N and d; the +Nd term at Tc = 1"),
    Entry("fig2-gpt2", "03_fig2_gpt2", "FlashAttention Fig. 2 (left)", "GPT-2 medium HBM traffic: 40.3 GB vs 4.4 GB"),
    Entry("backward-thm11", "04_backward_thm11", "Li et al. Thm 1.1, Fig. 1", "Backward I/O around M = d^2"),
    Entry("tightness", "05_tightness", "all lower bounds", "Measured / lower bound over (N, d, M): heat map"),
    Entry(
        "sparse",
        "06_sparse",
        "FlashAttention Prop. 4",
        "Block-sparse scaling in s and the pattern effect",
    ),
    Entry(
        "devices",
        "07_devices",
        "Li et al. (fine-grained I/O): which GPUs are small-cache",
        "Device regime table: M vs d^2 per GPU and dtype",
    ),
    Entry(
        "replay",
        "08_replay",
        "Li et al.: does the two-level model map onto hardware caches",
        "Explicit schedule vs LRU and OPT caches",
    ),
    Entry(
        "kernels",
        "09_kernels",
        "real kernels move their schedule's closed form",
        "Triton, Pallas, numba.cuda kernels against the model",
    ),
    Entry(
        "decoding-gqa",
        "10_decoding_gqa",
        "GQA decoding: K/V loaded once per KV head or g times",
        "Decoding I/O vs group size: per-head vs packed",
    ),
    Entry(
        "split-kv",
        "11_split_kv",
        "Flash-Decoding: the I/O cost of split-KV",
        "Split-KV: I/O and thread blocks vs splits",
    ),
    Entry(
        "mla", "12_mla", "MLA (DeepSeek-V2/V3): shared latent vs naive", "MLA shared latent vs naive on every device"
    ),
    Entry(
        "paged-kv", "13_paged_kv", "vLLM's paged KV: I/O against the page size", "Paged KV: I/O against the page size"
    ),
    Entry(
        "hierarchy",
        "14_hierarchy",
        "Li et al.: the slow memory of a GPU is an L2",
        "A shared L2: DRAM vs two-level, orders",
    ),
    Entry(
        "fig2-hierarchy",
        "15_fig2_hierarchy",
        "FlashAttention Fig. 2: measured HBM traffic against the L2 model",
        "Fig. 2's measured HBM vs the A100 L2",
    ),
    Entry(
        "mask-efficiency",
        "16_mask_efficiency",
        "FlexAttention / FlashAttention block-sparse kernels: what a mask really loads",
        "Is my mask efficient? Block-sparse bytes vs naive and dense",
    ),
    Entry(
        "topk-overlap",
        "17_topk_overlap",
        "vLLM PR #52963: four decode tokens pick ~22 distinct blocks while the kernel loads 64",
        "Top-k decoding: per-query loads vs the group union",
    ),
)


def names() -> list[str]:
    return [e.name for e in EXPERIMENTS]


def get(name: str) -> Entry:
    """An entry by name, by file stem, or by number ("2", "02")."""
    for e in EXPERIMENTS:
        if name in (e.name, e.stem) or (name.isdigit() and int(name) == int(e.stem[:2])):
            return e
    from iosim.base.errors import InputError

    raise InputError("experiment", f"must be one of {', '.join(names())} (or all)", name)


def load(entry: Entry):
    return importlib.import_module(f"{__name__}.{entry.stem}")


def run(entry: Entry, out: Path = RESULTS, quick: bool = False, command: str | None = None) -> Verdict:
    """Run one experiment (extras and output folder checked first: MissingExtra or InputError before any work)."""
    if entry.pending:
        from iosim.base.errors import InputError

        raise InputError("experiment", f"{entry.name} cannot run yet: it {entry.pending}", entry.name)
    return runner.run(load(entry), Path(out), quick=quick, command=command)


def run_all(out: Path = RESULTS, quick: bool = False, echo=print) -> list[tuple[Entry, Verdict | None]]:
    """Run every experiment that can run (all extras and the output folder checked first), then write
    out/index.md."""
    out = Path(out)
    for e in EXPERIMENTS:
        if not e.pending:
            runner.prepare(load(e), out)
    done: list[tuple[Entry, Verdict | None]] = []
    for e in EXPERIMENTS:
        if e.pending:
            echo(f"{e.name}: skipped ({e.pending})")
            done.append((e, None))
            continue
        v = run(e, out, quick, command=f"iosim experiments run all{' --quick' if quick else ''}")
        echo(f"{e.name}: {v.line()} [{v.seconds:.1f} s]")
        for f in v.failures:
            echo(f"FAILED: {f}")
        done.append((e, v))
    write_index(out, done)
    return done


def write_index(out: Path, done: list[tuple[Entry, Verdict | None]]) -> None:
    """results/index.md: one section per experiment with its command, verdict line and figure."""
    total = sum(v.seconds for _, v in done if v is not None)
    lines = [
        "# iosim experiments",
        "",
        f"Generated by `iosim experiments run all` ({total:.0f} s of experiments).",
        "",
        "| experiment | claim | verdict | seconds |",
        "|---|---|---|---|",
    ]
    for e, v in done:
        if v is None:
            lines.append(f"| {e.name} | {e.item} | pending: {e.pending} | - |")
        else:
            lines.append(f"| [{e.name}]({e.stem}.md) | {e.item} | {v.word}: {v.figure} | {v.seconds:.1f} |")
    for e, v in done:
        lines += ["", f"## {e.name}: {e.title}", ""]
        if v is None:
            lines.append(f"Not run: this experiment {e.pending}.")
            continue
        lines += [f"`iosim experiments run {e.name}`", "", f"**{v.word}**: {v.measured} ({v.figure})", ""]
        png = f"{e.stem}.png"
        if png in v.files:
            lines.append(f"![{e.name}]({png})")
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.md").write_text("\n".join(lines) + "\n")


__all__ = ["EXPERIMENTS", "Entry", "MissingExtra", "Verdict", "get", "load", "names", "run", "run_all", "runner"]
