"""The register-tiled flash2 forward kernels (iosim.algorithms.cuda.flash_fast): numerics and exact counters.

Without IOSIM_GPU=1 they run on the CUDA simulator (tests/conftest.py), with the simulator's thread layouts
(8 threads) and tiny ragged shapes; the counters are compared with a closed form written here and with the
simulator's flash2 forward. ``test_fast_kernels_compile_for_sm90`` compiles the GPU variants for the real target
in a subprocess (no GPU needed). Tests marked ``gpu`` run the 256-thread variants on a device.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("numba_cuda", reason="numba-cuda is not installed (pip install -e '.[cuda]')")

from iosim.algorithms.reference import attention_forward
from numba import cuda
from numba.core import config

import iosim
from iosim.gpu import launch as gpu

SIMULATED = bool(config.ENABLE_CUDASIM)
ON_GPU = not SIMULATED and cuda.is_available()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 2e-5


def _ff():
    from iosim.algorithms.cuda import flash_fast

    from iosim.gpu import simulator

    if flash_fast.SIMULATOR:
        simulator.install()  # the simulator's cuda swap made thread-safe, as iosim.gpu.launch does before a launch
    return flash_fast


def _inputs(BH, N, d, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, BH, N, d)).astype(np.float32) for _ in range(3)]


def closed_form(N, d, Br, Bc, causal, BH):
    """FlashAttention-2 forward's words per array: Q read once, K and V once per row block for every column block
    the row block does not skip (causal: column blocks starting at or before the row block's last row), O and L
    written once. (reads, writes, init writes), times BH."""
    cols = 0
    for r0 in range(0, N, Br):
        last = min(r0 + Br, N) - 1
        cols += sum(min(Bc, N - c0) for c0 in range(0, N, Bc) if not causal or c0 <= last)
    per = {"Q": (N * d, 0, 0), "K": (cols * d, 0, 0), "V": (cols * d, 0, 0), "O": (0, N * d, 0), "L": (0, N, 0)}
    return {k: tuple(BH * x for x in v) for k, v in per.items()}


def _counts(c):
    return {k: (v.reads, v.writes, v.init_writes) for k, v in c.items()}


def _check_outputs(r, Q, K, V, causal):
    for h in range(Q.shape[1]):
        O_ref, L_ref = attention_forward(Q[0, h], K[0, h], V[0, h], causal=causal)
        assert np.max(np.abs(r.outputs["O"][0, h] - O_ref)) < TOL
        assert np.max(np.abs(r.outputs["L"][0, h] - L_ref)) < TOL


CASES = [
    ("sim2x4", 37, 8, 8, 8),
    ("sim4x2", 37, 16, 16, 8),
    ("sim2x4v", 37, 16, 16, 8),  # contiguous, K_j^T padded
    ("sim4x2v", 37, 16, 16, 8),  # contiguous, K_j^T swizzled (2 groups of 4 words per row)
    ("sim4x2v", 37, 16, 16, 16),  # swizzled, 2 groups per thread
    ("sim2x4", 5, 7, 8, 4),
]


@pytest.mark.skipif(not SIMULATED, reason="simulator thread layouts")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name,N,d,Br,Bc", CASES)
def test_fast_forward_matches_reference_and_closed_form(name, N, d, Br, Bc, causal):
    """Ragged last blocks (37 = 4 x 8 + 5), Br > Bc (rows with no allowed column in a causal tile), Br > N."""
    Q, K, V = _inputs(1, N, d)  # one head (the simulator's time); two heads in the tests below
    r = _ff().flash2_forward_fast(Q, K, V, variant_name=name, Br=Br, Bc=Bc, causal=causal, count=True)
    _check_outputs(r, Q, K, V, causal)
    assert _counts(r.counts) == closed_form(N, d, Br, Bc, causal, 1)


@pytest.mark.skipif(not SIMULATED, reason="simulator thread layouts")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fast_forward_counts_equal_the_simulator_at_its_tiling(causal):
    """Tiles chosen from M by the simulator's rule; the counters equal its flash2 forward, array by array."""
    N, d = 37, 8
    M = 2 * d * (8 + 8) + 2 * 8 + 8 * 8  # the working set of Br = Bc = 8: the fit rule's tiles at this M
    t = gpu.tiling_for("flash2", N, d, M)
    assert (t.Br, t.Bc) == (8, 8)
    Q, K, V = _inputs(2, N, d, seed=1)
    r = _ff().flash2_forward_fast(Q, K, V, variant_name="sim2x4", Br=t.Br, Bc=t.Bc, causal=causal, M=M, count=True)
    _check_outputs(r, Q, K, V, causal)
    assert r.shared_words <= M
    assert _counts(r.counts) == _counts(gpu.simulated_counts("flash2", N, d, M, causal=causal, batch=2))
    sim = iosim.run(iosim.Schedule("flash2", Br=16, Bc=8), N=N, d=d, M=10**6, causal=causal, count_only=True)
    per = sim.passes["forward"].stats.per_array
    assert {k: (2 * v.reads, 2 * v.writes, 2 * v.init_writes) for k, v in per.items()} == closed_form(
        N, d, 16, 8, causal, 2
    )


def test_layout_is_within_the_model_working_set():
    """Shared words: Q^T d Br, K^T d (Bc + pad_k), V Bc d, P^T Bc (Br + pad), plus TY ceil(Br / TY) - Br slack
    words; pad = pad_k = 1 strided; contiguous: pad 4, pad_k 0 where K^T's 4-word groups are swizzled (each thread
    owns whole groups: 4 | TN, TX TN = Bc, Bc / 4 a power of two, 4 | d), else 4. Never above the model's working
    set 2d(Br + Bc) + 2Br + Br Bc."""
    ff = _ff()
    for Br, Bc, d in ((128, 64, 64), (64, 64, 128), (128, 64, 128), (8, 8, 8), (16, 8, 16), (37, 37, 16)):
        for v in (*ff.VARIANTS.values(), *ff.SIM_VARIANTS.values()):
            TN = -(-Bc // v.TX)
            groups = Bc // 4
            swizzled = Bc % 4 == 0 and groups & (groups - 1) == 0 and TN % 4 == 0 and v.TX * TN == Bc and d % 4 == 0
            pad, pad_k = (4, 0 if swizzled else 4) if v.contiguous else (1, 1)
            slack = v.TY * -(-Br // v.TY) - Br
            words = ff.kernel_words(v, Br, Bc, d)
            assert words == d * Br + d * (Bc + pad_k) + Bc * d + Bc * (Br + pad) + slack
            assert words <= 2 * d * (Br + Bc) + 2 * Br + Br * Bc


def test_bad_variant_and_tiles_are_input_errors():
    ff = _ff()
    Q, K, V = _inputs(1, 9, 4)
    with pytest.raises(iosim.InputError, match="variant"):
        ff.flash2_forward_fast(Q, K, V, variant_name="nope", Br=8, Bc=8)
    with pytest.raises(iosim.InputError, match="Br"):
        ff.flash2_forward_fast(Q, K, V, variant_name="sim2x4", Br=0, Bc=8)


@pytest.mark.slow
def test_fast_kernels_compile_for_sm90_without_spills():
    """The GPU variants compile for compute capability 9.0 (no simulator, no GPU); ptxas reports no spills."""
    code = textwrap.dedent(
        """
        import json, sys
        sys.path.insert(0, "experiments/bench")
        import gpu_variants
        try:
            rows = gpu_variants.resource_rows(gpu_variants.PLAN[:2])
        except gpu_variants.ToolchainMissingError as e:
            print("SKIP:", e)
            raise SystemExit(0)
        print(json.dumps(rows))
        """
    )
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    if p.stdout.startswith("SKIP:"):
        pytest.skip(p.stdout.strip())
    assert p.returncode == 0, p.stderr[-4000:]
    import json

    rows = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(rows) == 2
    for row in rows:
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row
        assert row["registers"] <= 255 and row["blocks_per_sm"] >= 1, row


needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (run with IOSIM_GPU=1 on a GPU machine)")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", ["rt16x16", "rt16x16v", "rt16x16v1", "rt32x8"])
@pytest.mark.parametrize("d,Br,Bc", [(64, 128, 64), (128, 64, 64)])
def test_gpu_fast_variants_at_moderate_size(name, d, Br, Bc):
    """(BH, N) = (3, 203): ragged last blocks; numerics and counters on the device, causal and not."""
    N = 203
    Q, K, V = _inputs(3, N, d)
    for causal in (False, True):
        r = _ff().flash2_forward_fast(Q, K, V, variant_name=name, Br=Br, Bc=Bc, causal=causal, count=True)
        _check_outputs(r, Q, K, V, causal)
        assert _counts(r.counts) == closed_form(N, d, Br, Bc, causal, 3)


@pytest.mark.slow
@pytest.mark.skipif(not SIMULATED, reason="simulator thread layouts")
def test_gpu_variants_rows_pipeline_on_the_simulator(monkeypatch):
    """experiments/bench/gpu_variants.rows end to end on the simulator (the lease runs it on a GPU): SDPA's timing
    and the device transfer of torch are stood in for; rel err, counters and the simulator comparison are real."""
    torch = pytest.importorskip("torch")
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments", "bench"))
    import gpu as bench
    import gpu_variants as gv

    as_tensor = torch.as_tensor

    def host_tensor(a, device=None):
        return as_tensor(np.array(a.copy_to_host() if hasattr(a, "copy_to_host") else a))

    monkeypatch.setattr(torch, "as_tensor", host_tensor)
    monkeypatch.setattr(bench, "torch_median_ms", lambda fn, reps, seconds: (fn(), 1.0)[1])
    rows = gv.rows(cuda, bench.Timer(cuda, 2, 0.1), cases=((1, 2, 37, 8),), plan=(("sim2x4v", 16, 8, 8),))
    assert len(rows) == 1 and "error" not in rows[0], rows
    row = rows[0]
    assert row["tiling"] == "fit" and row["counters equal"] and row["rel err vs SDPA"] < 1e-5
    assert row["counters"] == {k: list(v) for k, v in closed_form(37, 8, 16, 8, False, 2).items()}
