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


def pytest_configure(config):
    # A Numba warning is a compiler-level problem (an inlining that broke an IR assumption, an operand layout that
    # falls off the fast path): fail on it rather than print it to users. Added here, not in pyproject.toml: pytest
    # imports a filter's warning class when it reads the ini file, and importing numba then would fix
    # NUMBA_ENABLE_CUDASIM before the line above sets it.
    for category in ("NumbaIRAssumptionWarning", "NumbaPerformanceWarning"):
        config.addinivalue_line("filterwarnings", f"error::numba.core.errors.{category}")


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
