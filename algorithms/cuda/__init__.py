"""numba.cuda kernels running the simulator's schedules, with GPU shared memory as the fast memory of M words.

Modules (import them directly; importing this package does not import ``numba.cuda``):

* :mod:`.flash`: flash2 forward, flash1 forward (the paper's K/V-outer order, one block per (b, h)),
  flash2 backward (D precomputed, K/V outer, dQ by atomics or in order);
* :mod:`.standard`: standard attention, tiled products and a softmax kernel, S and P in global memory;
* :mod:`.square_tiling`: Saha & Ye's square tiling forward (two kernels);
* :mod:`._common`: the counted global <-> shared transfers every kernel uses;
* :mod:`._host`: array conversion, output allocation, counters, launches with M words of dynamic
  shared memory (opting in above 48 KiB);
* :mod:`.ptx`: compile every kernel for sm_90 without a GPU (``python -m iosim.algorithms.cuda.ptx``);
  :mod:`iosim.gpu.resources` assembles them and reports registers, spills, shared memory and occupancy.

Launchers take explicit tile sizes, like the CPU drivers; :mod:`iosim.gpu` chooses them from M exactly as the
simulator does (``iosim.runner.registry.get(name).choose_tiling``) and compares the kernels' counters with the
simulator.

Conventions: float32 compute and storage; inputs (B, H, N, d) or (N, d), viewed as (B * H, N, d); grid axis y is
the (batch, head) pair; one word = one float32 (4 bytes). In counting mode (``count=True``) every thread adds the
number of elements it copied between global and shared memory to an int64 counter per named array (reads,
writes, initialisation writes), so the counters tally what the kernel did; they equal the simulator's
``count_only`` counts for the same (N, d, M, tiling, causal), times B * H (tests/test_cuda.py).
"""

# The cuda extra's requirements (pyproject.toml), named so that the command works outside a checkout too (iosim is not
# on the package index); tests/test_install_hints.py holds it equal to iosim.base.errors.install_hint("cuda").
CUDA_HINT = "pip install 'numba-cuda[cu13]<0.31,>=0.30' 'numpy<2.5'"


def cuda_missing() -> str | None:
    """None when numba-cuda (NVIDIA's numba.cuda, the ``cuda`` extra) can be imported; else why, in one line.

    numba's own deprecated ``numba.cuda`` may import without it, so the package itself is looked for.
    """
    import importlib.util

    try:
        found = importlib.util.find_spec("numba_cuda") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"numba-cuda is not installed: {CUDA_HINT}"
