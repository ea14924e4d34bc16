"""The README's two first-screen commands and what CI runs agree, and the install resolves from the registry alone.

.ci/run resolves the README's install against PyPI with this machine's wheel folder out of the way (a dry run); these
tests hold the pieces that run depends on to one another, so a change to one is caught here, not in CI.
"""

import pathlib
import re
import shlex

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _bash_blocks(text):
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def _test_command():
    block = _bash_blocks(README)[1]  # the first screen: the main job, then the tests
    return [shlex.split(step) for step in block.strip().split(" && ")]


def test_the_readme_test_command_installs_what_ci_installs_and_runs_what_ci_runs():
    steps = _test_command()
    installs = [s for s in steps if s[:2] == ["pip", "install"]]
    assert installs[0] == ["pip", "install", "torch==2.13.0"]
    extras = installs[1][-1]
    assert f'python -m pip install --quiet -e "{extras}"' in CI
    assert "python -m pip install --quiet torch==2.13.0" in CI
    pytest_step = " ".join(steps[-1])
    assert pytest_step.startswith("pytest")
    assert re.search(rf"^{re.escape(pytest_step)}$", CI, flags=re.M), "CI runs the README's test command as written"
    # the resolution check asks PyPI for the same torch and extras, and CI runs the ci_only and heavy tests too
    assert f'"torch==2.13.0" -e "{extras}"' in CI and "--dry-run" in CI and "PIP_CONFIG_FILE=/dev/null" in CI
    assert re.search(r'^pytest .*-m "ci_only or heavy"$', CI, flags=re.M)


def test_the_triton_extra_admits_the_triton_pypis_torch_pins():
    """PyPI's torch 2.13.0 for Linux is the CUDA build and requires triton==3.7.1 (its metadata, read by `pip install
    --dry-run --report` on 2026-11-28); an extra that refused it made the README's install ResolutionImpossible."""
    reqs = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["triton"]]
    triton = next(r for r in reqs if r.name == "triton")
    assert triton.specifier.contains("3.7.1") and triton.specifier.contains("3.9.0")
    torch = next(r for r in reqs if r.name == "torch")
    assert torch.specifier.contains("2.13.0")


def test_what_the_registry_cannot_install_is_marked_and_named():
    opts = PYPROJECT["tool"]["pytest"]["ini_options"]
    assert "not ci_only" in opts["addopts"] and "not heavy" in opts["addopts"]
    assert {m.split(":")[0] for m in opts["markers"]} >= {"ci_only", "heavy", "slow"}
    assert "ci_only" in README and "chromium" in README and "heavy" in README
    assert "pytest-xdist" in " ".join(PYPROJECT["project"]["optional-dependencies"]["test"])


def test_every_heavy_test_is_collected():
    """tests/heavy.txt names node ids: one that no longer exists (renamed, removed) would leave a long test in the
    quick run unnoticed, so each must name a test that is collected."""
    import subprocess
    import sys

    from conftest import HEAVY

    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "heavy", "-p", "no:randomly"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600).stdout  # fmt: skip
    collected = {line.strip() for line in out.splitlines() if "::" in line}
    assert HEAVY <= collected, sorted(HEAVY - collected)[:5]
