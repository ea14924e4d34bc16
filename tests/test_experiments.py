"""The experiments: registry, `iosim experiments` command, every experiment's outputs (quick grids), the gallery,
the device data file, and the missing-extra exit."""

import csv
import importlib.util
import pathlib
import subprocess
import sys

import pytest

from iosim.base.errors import install_hint
from iosim.cli import main
from iosim.cli.experiments import package

ROOT = pathlib.Path(__file__).resolve().parents[1]
EX = package()
RUNNABLE = [e for e in EX.EXPERIMENTS if not e.pending]
REQUIRED_DEVICES = {"V100", "A100", "H100", "H200", "B200", "L4", "T4", "RTX 3090", "RTX 4090", "GTX 1060"}


@pytest.fixture(scope="module")
def all_quick(tmp_path_factory):
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("results")
    done = EX.run_all(out, quick=True, echo=lambda line: None)
    return out, dict((e.name, v) for e, v in done)


def test_registry_names_and_lookup():
    assert EX.names()[:2] == ["crossover", "flash-thm2"]
    assert EX.get("02").name == "flash-thm2" and EX.get("07_devices").name == "devices"
    assert EX.get("06").name == "sparse" and EX.get("sparse").pending is None


@pytest.mark.parametrize("entry", RUNNABLE, ids=lambda e: e.name)
def test_every_experiment_writes_csv_plot_table_and_verdict(all_quick, entry):
    out, verdicts = all_quick
    v = verdicts[entry.name]
    for ext in ("csv", "png", "tex", "md"):
        assert (out / f"{entry.stem}.{ext}").stat().st_size > 0, ext
    assert v.claim and v.measured and v.figure and v.holds in (True, False, None)
    md = (out / f"{entry.stem}.md").read_text()
    assert f"iosim experiments run {entry.name}" in md and "Verdict" in md
    assert "\\begin{tabular}" in (out / f"{entry.stem}.tex").read_text()


def test_index_lists_every_experiment(all_quick):
    out, verdicts = all_quick
    index = (out / "index.md").read_text()
    for e in EX.EXPERIMENTS:
        assert e.name in index and verdicts[e.name] is not None


def test_quick_verdicts_hold_where_the_theory_is_decided(all_quick):
    _, v = all_quick
    assert v["crossover"].holds and v["flash-thm2"].holds and v["backward-thm11"].holds and v["tightness"].holds
    assert v["sparse"].holds


def test_cli_list_and_bad_names(capsys):
    assert main(["experiments", "list"]) == 0
    out = capsys.readouterr().out
    assert "flash-thm2" in out and "sparse" in out
    for argv, message in (
        (["experiments", "run", "nope"], "experiment must be one of"),
        (["experiments", "run"], "needs a NAME"),
    ):
        p = subprocess.run([sys.executable, "-m", "iosim.cli", *argv], capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr


def test_cli_run_one(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["experiments", "run", "fig2-gpt2", "--out", str(tmp_path)]) == 0
    assert "fig2-gpt2: reproduced" in capsys.readouterr().out
    assert {p.suffix for p in tmp_path.iterdir()} == {".csv", ".png", ".tex", ".md"}


def test_missing_matplotlib_exits_2_before_writing(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["experiments", "run", "devices", "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == install_hint("plot") + "\n"  # the command that works outside a checkout too
    assert main(["experiments", "run", "all", "--out", str(tmp_path / "r")]) == 2
    assert not (tmp_path / "r").exists()
    assert EX.load(EX.get("tightness")).main(["--out", str(tmp_path / "r")]) == 2
    assert not (tmp_path / "r").exists()


def test_an_unusable_output_folder_exits_2_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    for out in (blocker, blocker / "results"):
        assert main(["experiments", "run", "flash-thm2", "--out", str(out)]) == 2
        assert "--out must" in capsys.readouterr().err
        assert EX.load(EX.get("flash-thm2")).main(["--out", str(out)]) == 2
        assert "--out must" in capsys.readouterr().err
    assert blocker.read_text() == "not a folder"


def test_every_experiment_holds_only_its_claim_grid_and_verdict():
    for e in EX.EXPERIMENTS:
        if e.pending:
            continue
        mod = EX.load(e)
        assert mod.NAME == e.name and mod.CLAIM and mod.TITLE
        assert callable(mod.measure) and callable(mod.verdict) and callable(mod.plot), e.name
        assert isinstance(getattr(mod, "FULL", {}), dict) and isinstance(getattr(mod, "QUICK", {}), dict), e.name
        text = pathlib.Path(mod.__file__).read_text()
        for setup in ("argparse", "write_text", "mkdir", "savefig", "def main", "def run("):
            assert setup not in text, (e.name, setup)
        assert "main = runner.script(globals())" in text and "raise SystemExit(main())" in text, e.name


def test_run_by_path_and_provenance(tmp_path):
    pytest.importorskip("matplotlib")
    p = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "07_devices.py"), "--quick", "--out", str(tmp_path / "a" / "b")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("devices: see notes") and "07_devices.png" in p.stdout
    md = (tmp_path / "a" / "b" / "07_devices.md").read_text()
    assert "Provenance:" in md and "- quick: yes" in md and "python experiments/07_devices.py --quick --out" in md
    assert "- iosim: " in md and " UTC" in md
    assert "% iosim " in (tmp_path / "a" / "b" / "07_devices.tex").read_text()


def test_device_data_file_has_a_source_for_every_figure():
    with open(ROOT / "experiments" / "data" / "devices.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    names = {r["device"] for r in rows}
    assert REQUIRED_DEVICES <= names
    assert any(n.startswith("MI2") for n in names) and any(n.startswith("MI3") for n in names)
    assert any(n.startswith("Apple M") for n in names)
    for r in rows:
        assert int(r["smem_per_block_KiB"]) > 0 and "http" in r["source"], r["device"]
        if r["smem_per_sm_KiB"]:
            assert int(r["smem_per_sm_KiB"]) >= int(r["smem_per_block_KiB"])


def test_a_count_that_differs_from_its_closed_form_fails_the_run(tmp_path, capsys):
    """A row with exact = False is a defect of iosim, never a finding: the run prints FAILED and exits 1."""
    from iosim.experiments import runner
    from iosim.experiments._common import Verdict

    def measure(g):
        return [{"N": 1, "exact": True}, {"N": 2, "exact": False}]

    def verdict(rows, g):
        return runner.Summary(Verdict("fake", "a claim", "measured", "fig", True), [[1]], ["N"])

    fake = {"__name__": "fake_experiment", "__file__": str(tmp_path / "99_fake.py"), "NAME": "fake", "TITLE": "t"}
    fake.update(CLAIM="c", NEEDS=(), FULL={}, measure=measure, verdict=verdict)
    assert runner.main(fake, ["--out", str(tmp_path / "r")]) == 1
    assert "FAILED: 1 of 2 rows differ from their closed form" in capsys.readouterr().out


def test_the_experiments_page_counts_the_registry():
    """docs/experiments.md states how many experiments `run all` runs: the registry's number, not a stale one."""
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "experiments.md").read_text()
    said = re.search(r"runs the (\d+) experiments of the registry", text)
    assert said and int(said.group(1)) == len(package().names())
