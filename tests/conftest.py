"""Shared test settings. Markers (slow, gpu) are declared in pyproject.toml and enforced by --strict-markers."""

import numpy as np
import pytest

# Odd shapes, not just powers of two (design.md): N not a multiple of any block, d odd.
ODD_N = (1, 17, 113, 203)
ODD_D = (1, 16, 59)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
