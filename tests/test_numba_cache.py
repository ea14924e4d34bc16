"""Numba's cache keys a function by its own file only; iosim drops its cached functions when any source changes."""

import os
import subprocess
import sys

from iosim.base import numba_cache as _numba_cache


def test_drop_stale_removes_only_iosim_functions_and_stamps_the_directory(tmp_path, monkeypatch):
    (tmp_path / "flash._flash2_forward-158.py311.nbi").write_text("x")
    (tmp_path / "flash._flash2_forward-158.py311.1.nbc").write_text("x")
    (tmp_path / "other_module.f-3.py311.nbi").write_text("x")  # not one of iosim's source files
    (tmp_path / "flash.cpython-311.pyc").write_text("x")  # bytecode stays
    monkeypatch.setattr(_numba_cache, "_cache_dirs", lambda: {tmp_path: {"flash", "core"}})
    monkeypatch.setattr(_numba_cache, "source_fingerprint", lambda: "new")
    _numba_cache.drop_stale()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "flash.cpython-311.pyc",
        "iosim-sources",
        "other_module.f-3.py311.nbi",
    ]
    assert (tmp_path / "iosim-sources").read_text() == "new"
    (tmp_path / "flash.g-1.py311.nbi").write_text("x")  # cached under the current sources: kept
    _numba_cache.drop_stale()
    assert (tmp_path / "flash.g-1.py311.nbi").exists()


def test_a_changed_source_fingerprint_makes_the_next_run_compile_afresh(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    run = (
        "import iosim; r = iosim.run('flash2', N=40, d=8, M=512, count_only=True); "
        "assert r.stats.total == r.predicted.total"
    )
    subprocess.run([sys.executable, "-c", run], env=env, check=True)
    stamps = list(tmp_path.rglob("iosim-sources"))
    assert stamps and any(p.suffix == ".nbi" for s in stamps for p in s.parent.iterdir())
    for s in stamps:
        s.write_text("sources as they were before a change")
    subprocess.run([sys.executable, "-c", "import iosim"], env=env, check=True)
    assert not [p for s in stamps for p in s.parent.iterdir() if p.suffix in (".nbi", ".nbc")]
    subprocess.run([sys.executable, "-c", run], env=env, check=True)  # compiles again, counts exactly


def test_a_count_only_masked_run_compiles_on_an_empty_cache(tmp_path):
    """A count-only variant is compiled without Numba's runtime; the mask helpers it calls allocate in their BigBird
    branch. On an empty cache, a causal count-only run (and a masked one over a problem) once failed to type when
    those helpers were first compiled from inside the variant (tile_masks._warm compiles them first). It failed
    too after a pebbling, whose symbolic run patches the helpers to their plain Python: a first mask made there
    skipped _warm's compilation for good."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    run = (
        "import iosim; from iosim.pebble.from_run import pebble_run; "
        "p = iosim.Problem(B=2, H_q=2, H_kv=1, N_q=2, N_k=5, d_qk=3, d_v=2, causal=True); "
        "assert pebble_run('flash1', problem=p, M=60).legal; "
        "assert iosim.run('flash1', problem=p, M=60, count_only=True).main.exact; "
        "r = iosim.run('flash2', N=64, d=8, M=400, causal=True, count_only=True); assert r.main.exact; "
        "p = iosim.Problem(B=1, H_q=2, H_kv=1, N_q=3, N_k=40, d=8); "
        "r = iosim.run('flash1', problem=p, M=900, mask='random:0.3', count_only=True); assert r.main.exact"
    )
    out = subprocess.run([sys.executable, "-c", run], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_warm_up_never_forks_after_a_threaded_library_is_loaded(monkeypatch):
    """A fork after torch (or jax, triton) is imported copies their locks held and can hang the child: the first-run
    worker is spawned then (a mask file that imports torch hung iosim compare on an empty cache), forked otherwise.
    sys.modules is saved and restored by hand: the real modules must come back exactly (a torch imported twice in
    one process registers its operator libraries twice and fails)."""
    import sys

    from iosim.runner import warmup

    real = {m: sys.modules.get(m) for m in warmup.THREADED}
    seen = []

    class Ctx:  # what start asks of multiprocessing: the method, then a process it starts
        def Process(self, **kw):  # noqa: N802
            return type("P", (), {"start": lambda self: None})()

    monkeypatch.setattr(warmup.mp, "get_context", lambda method: seen.append(method) or Ctx())
    monkeypatch.setattr(warmup, "is_warm", lambda key: False)
    try:
        for m in warmup.THREADED:
            sys.modules.pop(m, None)
        assert warmup.start_method() == "fork"
        for m in warmup.THREADED:
            sys.modules[m] = object()
            assert warmup.start_method() == "spawn", m
            del sys.modules[m]
        sys.modules["torch"] = object()
        assert warmup.start(["standard"], {"N": 8}, "k") is not None and seen == ["spawn"]
        assert warmup.start(["standard"], {"N": 8, "mask": lambda: None}, "k") is None  # does not pickle: no worker
    finally:
        for m, v in real.items():
            if v is None:
                sys.modules.pop(m, None)
            else:
                sys.modules[m] = v
