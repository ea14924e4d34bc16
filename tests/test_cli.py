"""The command line: tables, JSON, LaTeX, and exit code 2 with one line for a user mistake."""

import json
import subprocess
import sys

import pytest
from conftest import RESULT_KEYS

from iosim.cli import main


def test_run_json(capsys):
    assert main(["run", "flash2", "--N", "100", "--d", "16", "--M", "2000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(RESULT_KEYS) <= set(out)
    assert out["total"] == out["predicted_total"] and out["exact"] and out["pass"] == "forward"


def test_run_table_and_latex(capsys):
    assert main(["run", "flash1", "--N", "64", "--d", "8", "--M", "500", "--causal", "--count-only"]) == 0
    assert "predicted total" in capsys.readouterr().out
    assert main(["run", "standard", "--N", "64", "--d", "8", "--M", "500", "--format", "latex"]) == 0
    assert "\\begin{tabular}" in capsys.readouterr().out


def test_compare_defaults_rank_every_algorithm(capsys):
    assert main(["compare", "--N", "256", "--d", "32", "--M", "4096"]) == 0
    out = capsys.readouterr().out
    for name in ("standard", "flash1", "flash2"):
        assert name in out
    assert "lower bound" in out and "NO" not in out.split("lower bound")[1]


def test_compare_reports_a_tiling_that_does_not_fit(capsys):
    assert main(["compare", "--N", "1024", "--d", "64", "--M", "4096", "--tiling", "paper", "--count-only"]) == 0
    assert "not run: flash1: fast memory capacity exceeded" in capsys.readouterr().out


def test_bounds(capsys):
    assert main(["bounds", "--N", "2048", "--d", "128", "--M", "4096"]) == 0
    out = capsys.readouterr().out
    assert "small cache" in out and "Saha-Ye" in out and "fine-grained" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "flash9", "--N", "8", "--d", "4", "--M", "100"], "algorithm must be one of"),
        (["run", "flash1", "--N", "8", "--d", "64", "--M", "100"], "M must be at least 259"),
        (["run", "flash1", "--N", "0", "--d", "4", "--M", "100"], "--N must be an integer from 1 to"),
        (["run", "flash1", "--N", "8", "--d", "x", "--M", "100"], "--d must be an integer from 1 to"),
        (["run", "flash1", "--N", "1024", "--d", "64", "--M", "4096", "--tiling", "paper"], "capacity exceeded"),
    ],
)
def test_user_errors_exit_2_without_traceback(argv, message):
    p = subprocess.run([sys.executable, "-m", "iosim.cli", *argv], capture_output=True, text=True)
    assert p.returncode == 2
    assert message in p.stderr
    assert "Traceback" not in p.stderr
