"""Shared test settings. Markers (slow, gpu) are declared in pyproject.toml and enforced by --strict-markers."""

import os

# The CUDA-simulator switch: numba.cuda reads NUMBA_ENABLE_CUDASIM once, when it is first imported, so it is set
# here, before any test module imports numba. Without IOSIM_GPU=1 every numba.cuda kernel runs on the simulator
# (CPU, no GPU needed; CPU @njit code is unaffected) and tests marked `gpu` skip. On a GPU machine run
# `IOSIM_GPU=1 pytest` to run the kernels and the `gpu` tests on the device.
if os.environ.get("IOSIM_GPU") != "1":
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# Odd shapes, not just powers of two (design.md): N not a multiple of any block, d odd.
ODD_N = (1, 17, 113, 203)
ODD_D = (1, 16, 59)

# What the issue asks every JSON result (Result.as_dict, `iosim run --json`) to hold at least.
RESULT_KEYS = (
    "algorithm",
    "pass",
    "N",
    "d",
    "M",
    "reads",
    "writes",
    "total",
    "peak",
    "predicted_total",
    "lower_bound",
    "tiling",
    "max_abs_error",
)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
