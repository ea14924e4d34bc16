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


def _compile_once_across_workers() -> None:
    """Under pytest-xdist, a Numba specialization is compiled by one worker only: the others wait for it and load
    it from the on-disk cache. A fresh cache spends most of the suite's time compiling (a driver takes 10-60 s of
    CPU), and two workers that reach the same driver at once would otherwise both compile it. The lock is one file
    per (function, signature, cache folder), taken around Numba's own load-or-compile-and-save
    (``Dispatcher.compile``); call graphs have no cycles, so the locks cannot deadlock. Only caching dispatchers
    are locked (what the other worker cannot load it must compile anyway)."""
    try:
        import fcntl
    except ImportError:  # no POSIX file locks (Windows): each worker compiles what it needs
        return
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import hashlib
    import tempfile

    from numba.core import config, dispatcher, sigutils
    from numba.core.caching import NullCache

    locks = __import__("pathlib").Path(tempfile.gettempdir()) / f"iosim-numba-compile-locks-{os.getuid()}"
    locks.mkdir(exist_ok=True)
    original = dispatcher.Dispatcher.compile

    def compile_once(self, sig):
        args, _ = sigutils.normalize_signature(sig)
        if isinstance(self._cache, NullCache) or tuple(args) in self.overloads:
            return original(self, sig)
        py = self.py_func
        key = f"{config.CACHE_DIR}:{py.__module__}:{py.__qualname__}:{py.__code__.co_filename}:{args}"
        with open(locks / hashlib.sha1(key.encode()).hexdigest(), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return original(self, sig)

    dispatcher.Dispatcher.compile = compile_once


def pytest_configure(config):
    _compile_once_across_workers()
    # A Numba warning is a compiler-level problem (an inlining that broke an IR assumption, an operand layout that
    # falls off the fast path): fail on it rather than print it to users. Added here, not in pyproject.toml: pytest
    # imports a filter's warning class when it reads the ini file, and importing numba then would fix
    # NUMBA_ENABLE_CUDASIM before the line above sets it.
    for category in ("NumbaIRAssumptionWarning", "NumbaPerformanceWarning"):
        config.addinivalue_line("filterwarnings", f"error::numba.core.errors.{category}")


# Odd shapes, not just powers of two: N not a multiple of any block, d odd.
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


# CI installs every extra the suite uses (.ci/run: .[test,plot,cuda,sweep,dask,parquet]) and sets IOSIM_CI=1: there a
# test skipped because one of them is missing is a failure, so the tests of every extra really run in CI. A skip for
# something CI is not meant to have (cupy, a real GPU) stays a skip.
CI_EXTRAS = ("matplotlib", "pandas", "pyarrow", "distributed", "dask", "numba_cuda", "numba-cuda", "tabulate", "tqdm",
             "triton", "torch", "jax", "mkdocs", "selenium", "chromium")  # fmt: skip


@pytest.fixture(name="cli")
def cli_fixture(capsys):
    """``cli(*args)`` runs ``iosim kernel *args`` in this process and returns (exit code, stdout, stderr)."""
    from iosim.cli import main

    def run(*args):
        rc = main(["kernel", *args])
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


def ci_failure(reason: str) -> str | None:
    """The failure message for a skip under IOSIM_CI=1 whose reason names a missing extra, else None."""
    if os.environ.get("IOSIM_CI") != "1":
        return None
    missing = [m for m in CI_EXTRAS if f"'{m}'" in reason or f"{m} is not installed" in reason]
    if not missing:
        return None
    return f"IOSIM_CI=1: skipped for a missing extra that CI installs ({', '.join(missing)}): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        message = ci_failure(str(reason))
        if message is not None:
            rep.outcome, rep.longrepr = "failed", message


# What the package registry cannot install: Debian's chromium (the teaching pages' browser tests) and sglang and
# flash-mlm, which install only without their dependencies (they pin a CUDA torch). Tests that use them are marked
# `ci_only`: the README's test command deselects them, and .ci/run, which installs all three, runs them after it.
CI_ONLY_FIXTURES = {"browser", "sglang", "tutorial"}


# The longest tests of the default run, by node id (tests/heavy.txt, measured): marked `heavy`, left out of the
# README's test command and run by .ci/run after it, so the quick run stays under 10 minutes and CI keeps them all.
HEAVY = {
    line.strip()
    for line in (__import__("pathlib").Path(__file__).with_name("heavy.txt")).read_text().splitlines()
    if line.strip() and not line.startswith("#")
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if CI_ONLY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ci_only)
        if item.nodeid in HEAVY:
            item.add_marker(pytest.mark.heavy)
