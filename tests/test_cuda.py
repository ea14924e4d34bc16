"""The numba.cuda kernels: numerics against the float64 reference and counter equality with the simulator.

Without IOSIM_GPU=1 these run on the CUDA simulator (tests/conftest.py sets NUMBA_ENABLE_CUDASIM=1), so the sizes
are tiny: the simulator runs every CUDA thread as a Python thread. ``test_kernels_compile_for_sm90`` compiles every
kernel for the real target (compute capability 9.0) in a subprocess without the simulator. Tests marked ``gpu``
need a real GPU (``IOSIM_GPU=1 pytest -m gpu``) and skip otherwise.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("numba_cuda", reason="numba-cuda is not installed (pip install -e '.[cuda]')")

from iosim.algorithms.reference import attention_backward, attention_forward, default_scale
from iosim.memory_model import CapacityError
from numba import cuda
from numba.core import config

import iosim
from iosim.gpu import launch as gpu

SIMULATED = bool(config.ENABLE_CUDASIM)
ON_GPU = not SIMULATED and cuda.is_available()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 2e-5  # float32 kernels at these tiny sizes err by ~1e-6; a wrong schedule errs by ~1e-1


def _inputs(B, H, N, d, seed=0, n=3):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, H, N, d)).astype(np.float32) for _ in range(n)]


def _counts(c):
    return {k: (v.reads, v.writes, v.init_writes) for k, v in c.items()}


def _reference(Q, K, V, causal):
    B, H, N, d = Q.shape
    O, L = np.empty((B, H, N, d)), np.empty((B, H, N))
    for b in range(B):
        for h in range(H):
            O[b, h], L[b, h] = attention_forward(Q[b, h], K[b, h], V[b, h], causal=causal)
    return O, L


# (N, d) pairs: ragged last blocks, an odd head dimension, and N = 1.
SHAPES = [(17, 7), (1, 5)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("N,d", SHAPES)
@pytest.mark.parametrize("name", gpu.KERNELS)
def test_forward_kernel_matches_reference_and_simulator_counts(name, N, d, causal):
    B, H = 1, 2
    Q, K, V = _inputs(B, H, N, d)
    M = gpu.default_M(name, N, d)
    r = gpu.forward(name, Q, K, V, M=M, causal=causal, count=True)
    O_ref, L_ref = _reference(Q, K, V, causal)
    assert np.max(np.abs(r.outputs["O"] - O_ref)) < TOL
    if "L" in r.outputs:
        assert np.max(np.abs(r.outputs["L"] - L_ref)) < TOL
    assert r.shared_words <= M
    # Schedule equality: the words the kernels copied, per array, equal the simulator's count times B * H.
    sim = gpu.simulated_counts(name, N, d, M, causal=causal, batch=B * H)
    assert _counts(r.counts) == _counts(sim)


@pytest.mark.parametrize("dq_atomic", [True, False], ids=["atomic-dQ", "sequential-dQ"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash2_backward_matches_reference_and_simulator_counts(causal, dq_atomic):
    B, H, N, d = 1, 2, 17, 7
    Q, K, V, dO = _inputs(B, H, N, d, n=4)
    M = gpu.default_M("flash2", N, d, backward=True)
    O, L = _reference(Q, K, V, causal)
    r = gpu.backward(
        "flash2",
        Q,
        K,
        V,
        O.astype(np.float32),
        dO,
        L.astype(np.float32),
        M=M,
        causal=causal,
        count=True,
        dq_atomic=dq_atomic,
    )
    for b in range(B):
        for h in range(H):
            ref = attention_backward(Q[b, h], K[b, h], V[b, h], dO[b, h], causal=causal)
            for name, x in zip(("dQ", "dK", "dV"), ref, strict=True):
                assert np.max(np.abs(r.outputs[name][b, h] - x)) < TOL, name
    sim = gpu.simulated_counts("flash2", N, d, M, causal=causal, backward=True, batch=B * H)
    assert _counts(r.counts) == _counts(sim)
    assert r.shared_words <= M


def test_standard_two_pass_softmax_when_a_row_does_not_fit():
    """M < N + 2: the softmax sweeps each row twice in chunks (2 N^2 reads of S); counts still equal."""
    N, d, M = 7, 3, 8
    Q, K, V = _inputs(1, 1, N, d)
    for causal in (False, True):
        r = gpu.forward("standard", Q, K, V, M=M, causal=causal, count=True)
        O_ref, _ = _reference(Q, K, V, causal)
        assert np.max(np.abs(r.outputs["O"] - O_ref)) < TOL
        assert _counts(r.counts) == _counts(gpu.simulated_counts("standard", N, d, M, causal=causal))
        assert r.counts["S"].reads == 2 * N * N


def test_more_threads_than_rows_and_2d_inputs():
    """Idle threads (32 threads, blocks of 2-3 rows) and (N, d) inputs without batch or head axes."""
    N, d = 9, 4
    rng = np.random.default_rng(3)
    Q, K, V = (rng.standard_normal((N, d)).astype(np.float32) for _ in range(3))
    O_ref, L_ref = attention_forward(Q, K, V, causal=True)
    for name in ("flash2", "flash1"):
        M = gpu.default_M(name, N, d, parts=4)
        r = gpu.forward(name, Q, K, V, M=M, causal=True, count=True, threads=32)
        assert r.outputs["O"].shape == (N, d) and r.outputs["L"].shape == (N,)
        assert np.max(np.abs(r.outputs["O"] - O_ref)) < TOL
        assert _counts(r.counts) == _counts(gpu.simulated_counts(name, N, d, M, causal=True))


def test_device_arrays_in_device_arrays_out():
    """Inputs exposing __cuda_array_interface__ are used in place and the outputs stay on the device."""
    Q, K, V = _inputs(1, 1, 9, 4)
    dQ, dK, dV = (cuda.to_device(x) for x in (Q, K, V))
    r = gpu.forward("flash2", dQ, dK, dV, M=gpu.default_M("flash2", 9, 4))
    assert not isinstance(r.outputs["O"], np.ndarray)
    O_ref, _ = _reference(Q, K, V, False)
    assert np.max(np.abs(r.outputs["O"].copy_to_host() - O_ref)) < TOL


def test_layout_larger_than_M_raises_like_the_simulator():
    """The paper's tiling overflows M for M < ~4 d^2: the launcher refuses it before any launch."""
    Q, K, V = _inputs(1, 1, 64, 16)
    M = 512
    with pytest.raises(CapacityError):
        iosim.run(iosim.Schedule("flash2", tiling="paper"), N=64, d=16, M=M, count_only=True)
    with pytest.raises(CapacityError):
        gpu.forward("flash2", Q, K, V, M=M, tiling="paper")


def test_check_api_on_a_builtin_kernel():
    report = iosim.check(gpu.attention("flash2"), N=(17,), d=(7,), heads=1)
    assert report.passed, str(report)
    assert {r.output for r in report.rows} == {"O", "L", "dQ", "dK", "dV"}


def test_cli_check_quick_passes_on_the_simulator_or_gpu(capsys):
    from iosim import cli

    assert cli.main(["check", "--kernel", "flash1", "--quick", "--heads", "1"]) == 0
    out = capsys.readouterr().out
    assert "flash1: PASSED" in out


def test_cli_check_exit_codes(monkeypatch, capsys):
    from iosim import cli

    assert cli.main(["check", "--kernel", "no-such-kernel", "--quick"]) == 2
    assert cli.main(["check", "--kernel", "flash2", "--quick", "--M", "5"]) == 2  # M below any tiling

    original = gpu.attention

    def broken(name, M=None, **kw):
        fn = original(name, M, **kw)
        return lambda Q, K, V, **kws: (fn(Q, K, V, **kws)[0] * 1.01, None)  # a 1% error

    monkeypatch.setattr(gpu, "attention", broken)
    assert cli.main(["check", "--kernel", "flash1", "--N", "9", "--d", "4", "--heads", "1"]) == 1
    assert "FAILED" in capsys.readouterr().out


def test_select_target_before_numba_cuda_is_imported():
    """`iosim check` picks the simulator itself when no GPU is present, after numba (not numba.cuda) is imported."""
    code = textwrap.dedent(
        """
        import json, sys
        import iosim
        from iosim.gpu import launch as gpu
        assert "numba.cuda" not in sys.modules
        target = gpu.select_target()
        from numba.core import config
        print(json.dumps({"target": target, "sim": bool(config.ENABLE_CUDASIM), "gpu": gpu._driver_sees_a_gpu()}))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True
    ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["target"] == ("gpu" if got["gpu"] else "simulator")
    assert got["sim"] == (not got["gpu"])


def test_kernels_compile_for_sm90():
    """Every kernel compiles to PTX for compute capability 9.0 with the real CUDA target (no simulator, no GPU)."""
    code = textwrap.dedent(
        """
        from numba.cuda.cudadrv import nvvm
        if not nvvm.is_available():
            print("SKIP: libNVVM not found: install numba-cuda[cu13] (the nvidia-nvvm wheel)")
            raise SystemExit(0)
        from iosim.algorithms.cuda import ptx
        for name, text in ptx.compile_all((9, 0)).items():
            assert ".target sm_90" in text, name
            assert "mul.f64" not in text and "fma.rn.f64" not in text, name + ": float64 arithmetic"
            print("OK", name)
        """
    )
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    if p.stdout.startswith("SKIP:"):
        pytest.skip(p.stdout.strip())
    assert p.returncode == 0, p.stderr[-4000:]
    compiled = [line.split()[1] for line in p.stdout.splitlines() if line.startswith("OK ")]
    from iosim.algorithms.cuda import ptx

    assert sorted(compiled) == sorted(ptx.signatures())


# ---------------------------------------------------------------------------------------------------------------
# A real GPU (IOSIM_GPU=1 pytest -m gpu).

needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (run with IOSIM_GPU=1 on a GPU machine)")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", gpu.KERNELS)
def test_gpu_kernels_at_moderate_size(name):
    """(B, H, N, d) = (2, 3, 203, 59): numerics under the FlashAttention rule and counter equality on the device."""
    report = iosim.check(gpu.attention(name, lambda N, d: 4 * d * d), N=(203,), d=(59,), batch=2, heads=3)
    assert report.passed, str(report)
    Q, K, V = _inputs(2, 3, 203, 59)
    M = 4 * 59 * 59
    r = gpu.forward(name, Q, K, V, M=M, causal=True, count=True)
    assert _counts(r.counts) == _counts(gpu.simulated_counts(name, 203, 59, M, causal=True, batch=6))


@pytest.mark.gpu
@needs_gpu
def test_gpu_shared_memory_above_48_kib():
    """M = 20000 words (80 KB) needs the dynamic shared-memory opt-in; the result is still right."""
    Q, K, V = _inputs(1, 2, 512, 64)
    r = gpu.forward("flash2", Q, K, V, M=20000, count=True)
    assert r.shared_words * 4 > 48 * 1024
    O_ref, _ = _reference(Q, K, V, False)
    assert np.max(np.abs(r.outputs["O"] - O_ref)) < 1e-4


@pytest.mark.gpu
@needs_gpu
def test_gpu_full_check_flash2():
    report = iosim.check(gpu.attention("flash2"), scale=default_scale(64))
    assert report.passed, str(report)


def test_flash2_kernel_block_mask_matches_reference_and_simulator_counts():
    """A block mask on the kernel's own tiles (skip policy): an all-empty row block loads nothing and writes O = 0,
    L = -inf; the counters equal the simulator's with iosim.masking.masks.FromBlocks(blocks, (Br, Bc))."""
    from iosim.masking.masks import FromBlocks

    B, H, N, d = 1, 2, 17, 7
    Q, K, V = _inputs(B, H, N, d)
    M = gpu.default_M("flash2", N, d)
    t = gpu.tiling_for("flash2", N, d, M)
    blocks = np.random.default_rng(3).random((-(-N // t.Br), -(-N // t.Bc))) < 0.5
    blocks[1, :] = False  # an all-empty row block
    blocks[0, 0] = True
    r = gpu.forward("flash2", Q, K, V, M=M, block_mask=blocks, count=True)
    mask = FromBlocks(blocks, (t.Br, t.Bc))
    allowed = mask.compile(N).dense()
    for h in range(H):
        O_ref, L_ref = attention_forward(Q[0, h], K[0, h], V[0, h], mask=allowed)
        assert np.max(np.abs(r.outputs["O"][0, h] - O_ref)) < TOL
        finite = np.isfinite(L_ref)
        assert (np.isneginf(r.outputs["L"][0, h]) == ~finite).all()
        assert np.max(np.abs(r.outputs["L"][0, h][finite] - L_ref[finite])) < TOL
    sim = gpu.simulated_counts("flash2", N, d, M, batch=B * H, mask=mask, kv_policy="skip")
    assert _counts(r.counts) == _counts(sim)
    with pytest.raises(iosim.InputError, match="block_mask"):
        gpu.forward("flash2", Q, K, V, M=M, block_mask=blocks[:1])
