"""Install hints name what to install from wherever the user is: iosim is not on the package index, so
``pip install "iosim[plot]"`` fails outside a checkout; the hint lists the extra's own requirements instead."""

from __future__ import annotations

import pathlib
import re

import pytest
import tomllib

from iosim.base.errors import install_hint

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _name(req: str) -> str:
    return re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0].lower()


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_the_hint_installs_the_extras_own_requirements(extra):
    hint = install_hint(extra)
    assert hint.startswith("pip install ") and "iosim[" not in hint
    named = {_name(w.strip("'\"")) for w in hint.split()[2:]}
    assert named == {_name(r) for r in EXTRAS[extra]}, (hint, EXTRAS[extra])


def test_no_message_or_page_suggests_installing_iosim_from_the_index():
    """Every `pip install "iosim[...]"` in the code and the docs is gone: it fails outside a checkout."""
    bad = []
    for path in [*ROOT.glob("iosim/**/*.py"), *ROOT.glob("algorithms/**/*.py"), *ROOT.glob("experiments/**/*.py"),
                 *ROOT.glob("docs/**/*.md"), ROOT / "README.md"]:  # fmt: skip
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"pip install [\"']?iosim\[", line) or re.search(r"pip install iosim\b(?!\S)", line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)


def test_the_cuda_hint_of_the_algorithms_layer_is_the_extras():
    """algorithms/ cannot import iosim.base.errors (imports flow up): its literal hint is held equal to the extra's."""
    from iosim.algorithms.cuda import CUDA_HINT

    assert CUDA_HINT == install_hint("cuda")
