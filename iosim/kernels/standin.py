"""CPU stand-ins for the GPU that library kernels probe at import, for counting them under Triton's interpreter.

Many packages of Triton kernels ask, when imported, which GPU they run on: ``triton.runtime.driver.active``
(Triton's active driver: under ``TRITON_INTERPRET=1`` on a machine without a GPU there is none, "0 active
drivers"), ``torch.cuda.get_device_name`` / ``get_device_capability`` / ``get_device_properties`` (torch built
without CUDA raises), or an environment variable naming the vendor. :func:`install` answers those questions as an
H100 (sm_90, 132 SMs, 228 KiB of shared memory per SM) would, without pretending that tensors live on a GPU:
``torch.cuda.is_available()`` stays False and tensors stay on the CPU, where the interpreter reads them.

Install it only in the counting process, before the library is imported: ``iosim kernel --gpu-standin`` does it
before importing the launcher file, or the launcher calls ``iosim.kernels.standin.install()`` at its top. Nothing
here runs a kernel: a library's benchmark (``driver.active.get_benchmarker()``) gets a stand-in that runs the
function once and reports no time, so an autotuner still needs its config named (iosim's hooks skip the
benchmark). What a stand-in answers is a property a GPU would report, not a measurement of anything.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

CAPABILITY = (9, 0)
NAME = "NVIDIA H100 80GB HBM3 (iosim CPU stand-in)"
PROPERTIES = {  # as triton's CUDA driver reports them (utils.get_device_properties)
    "max_shared_mem": 232448,
    "max_num_regs": 65536,
    "multiprocessor_count": 132,
    "warpSize": 32,
    "sm_clock_rate": 1980000,
    "mem_clock_rate": 2619000,
    "mem_bus_width": 5120,
}
_INSTALLED: list[bool] = [False]


class _Driver:
    """Triton's active driver, as a CUDA driver for sm_90 answers queries (no device behind it)."""

    def __init__(self) -> None:
        import torch

        self.utils = SimpleNamespace(get_device_properties=lambda device=0: dict(PROPERTIES))
        self._torch = torch

    def is_active(self) -> bool:
        return True

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", CAPABILITY[0] * 10 + CAPABILITY[1], 32)

    def get_active_torch_device(self):
        return self._torch.device("cpu")

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device) -> None:
        return None

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_device_interface(self):
        return self._torch.cuda

    def get_benchmarker(self):
        def bench(fn, *args, quantiles=None, **kwargs):
            fn()
            return [0.0, 0.0, 0.0] if quantiles else 0.0

        return bench

    def get_empty_cache_for_benchmark(self):
        return self._torch.empty(0)

    def clear_cache(self, cache) -> None:
        return None


def _properties(device=None):
    return SimpleNamespace(name=NAME, major=CAPABILITY[0], minor=CAPABILITY[1], multi_processor_count=132,
                           total_memory=80 * 2**30, shared_memory_per_block_optin=PROPERTIES["max_shared_mem"],
                           max_shared_memory_per_block_optin=PROPERTIES["max_shared_mem"], warp_size=32,
                           L2_cache_size=50 * 2**20, gcnArchName="")  # fmt: skip


def install(vendor: str = "nvidia") -> None:
    """Install the stand-ins in this process (idempotent): Triton's active driver, ``torch.cuda``'s device
    queries, and ``GEMS_VENDOR`` (FlagGems' vendor probe) unless already set."""
    if _INSTALLED[0]:
        return
    import torch
    import triton

    triton.runtime.driver.set_active(_Driver())
    _backend_active(vendor)
    cuda = torch.cuda
    cuda.get_device_capability = lambda device=None: CAPABILITY
    cuda.get_device_name = lambda device=None: NAME
    cuda.get_device_properties = _properties
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.set_device = lambda device: None
    cuda.synchronize = lambda device=None: None
    os.environ.setdefault("GEMS_VENDOR", vendor)
    _INSTALLED[0] = True


def _backend_active(vendor: str) -> None:
    """The vendor's entry of ``triton.backends.backends`` answers ``driver.is_active()`` True: a library may count
    the active backends' drivers instead of asking the active one (vLLM's ``vllm/triton_utils/importing.py`` wants
    exactly one, else it disables Triton), and with no device every backend says False."""
    from triton.backends import backends

    entry = backends.get("nvidia" if vendor in ("nvidia", "cuda") else vendor)
    if entry is not None and entry.driver is not None:
        entry.driver.is_active = staticmethod(lambda: True)


def bare_package(name: str) -> None:
    """Make ``import name.sub.module`` skip ``name/__init__.py``: a package whose top level imports its whole
    application (servers, tokenizers, a GPU runtime) can then lend one kernel module, which imports only what it
    needs. Registers an empty module with the package's search path (idempotent; nothing is imported)."""
    import importlib.util
    import sys
    import types

    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        from iosim.base.errors import InputError

        raise InputError("package", "must be installed (pip install --no-deps it)", name)
    module = types.ModuleType(name)
    module.__path__ = list(spec.submodule_search_locations)
    module.__spec__ = spec
    sys.modules[name] = module
