"""A mask_mod's evaluation is long work priced by the long-run rule, and the run's consent reaches it: --yes on every
command that takes a mask, allow_long=True on iosim.run (one head and a problem) and on compile_mask.

The price per score is raised here (iosim.masking.masks.MOD_ELEMENT) so that a mask of N = 256 is "over a minute": the
rule is exercised without minutes of evaluation.
"""

from __future__ import annotations

import pytest

import iosim
from iosim.base.errors import InputError
from iosim.cli import main
from iosim.masking import masks

N = 256


@pytest.fixture
def long_mod(tmp_path, monkeypatch):
    monkeypatch.setattr(masks, "MOD_ELEMENT", 80.0 / (N * N))  # 80 s for N x N: over a minute, under an hour
    f = tmp_path / "mods.py"
    f.write_text("def sliding(b, h, q_idx, kv_idx):\n    return (q_idx - kv_idx >= 0) & (q_idx - kv_idx < 40)\n")
    return f"mod:{f}:sliding"


def test_compile_needs_consent_and_takes_the_runs(long_mod):
    with pytest.raises(InputError, match="--yes"):
        masks.compile_mask(long_mod, N)
    assert masks.compile_mask(long_mod, N, allow_long=True).nnz() > 0


@pytest.mark.parametrize("shape", [dict(N=N, d=8), dict(problem=iosim.Problem(H_q=2, H_kv=1, N=N, d=8))])
def test_run_passes_its_consent_to_the_mask(long_mod, shape):
    kw = dict(M=4096, mask=long_mod, count_only=True, **shape)
    with pytest.raises(InputError) as e:
        iosim.run("flash2", **kw)
    assert e.value.parameter == "allow_long" and "mask_mod" in str(e.value)
    r = iosim.run("flash2", allow_long=True, **kw)
    assert r.stats.total == r.predicted.total


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "flash2", "--N", str(N), "--d", "8", "--M", "4096", "--count-only"],
        ["run", "flash1", "--heads", "2", "--kv-heads", "1", "--N", str(N), "--d", "8", "--M", "4096", "--count-only"],
        ["compare", "--N", str(N), "--d", "8", "--M", "4096", "--count-only"],
        ["bounds", "--N", str(N), "--d", "8", "--M", "4096"],
    ],
)
def test_yes_reaches_the_mask_on_the_command_line(long_mod, argv, capsys):
    assert main([*argv, "--mask", long_mod]) == 2
    err = capsys.readouterr().err
    assert "allow_long" in err and "--yes" in err and len(err.strip().splitlines()) == 1
    assert main([*argv, "--mask", long_mod, "--yes"]) == 0
