"""Sparse attention: every mask kind through every algorithm (forward and backward; flash1 and flash2 with both
policies): simulated counts == the closed form per array and in peak, numerics == the masked float64 reference,
fully masked rows."""

import numpy as np
import pytest

import iosim
from iosim.masking import masks as im

N = 45  # ragged against every tiling below


def patterns(n=N):
    rng = np.random.default_rng(7)
    holes = rng.random((n, n)) < 0.15
    holes[3:9, :] = False  # fully masked rows
    holes[19:38, :] = False  # an all-empty row block for flash2 (Br = 19 at M = 300)
    holes[:, 18:44] = False  # fully masked columns: all-empty column blocks (flash1: Bc = 21 at M = 300)
    return {
        "causal": "causal",
        "window": "window:4",
        "window-causal": "window:6:causal",
        "dilated": "dilated:3:5",
        "blockdiag": "blockdiag:7,1,20,17",
        "prefix": "prefix:5",
        "bigbird": "bigbird:5:1:1:1",
        "bigbird-random": "bigbird:4:0:1:3:2",  # no global blocks: three random blocks a block row, 2-3 per tile row
        "random-blocks": "random-blocks:0.2:3x7",
        "random": "random:0.05",
        "holes": holes,
    }


GRID = [(name, algo, policy, M) for name in patterns() for algo in ("flash1", "flash2") for policy in ("paper", "skip")
        for M in (150, 300, 1200)]  # fmt: skip


@pytest.mark.parametrize("name, algo, policy, M", GRID)
def test_counts_equal_closed_form(name, algo, policy, M):
    r = iosim.run(
        iosim.Schedule(algo, kv_policy=policy), N=N, d=4, M=M, mask=patterns()[name], backward=True, count_only=True
    )
    for p in r.passes.values():
        assert p.stats.per_array == p.predicted.per_array, p.name
        assert p.stats.peak == p.predicted.peak, p.name


@pytest.mark.parametrize("name", list(patterns()))
@pytest.mark.parametrize("algo", ["square-tiling", "standard"])
@pytest.mark.parametrize("M", [40, 150])
def test_square_and_standard_counts_equal_closed_form(name, algo, M):
    r = iosim.run(algo, N=N, d=4, M=M, mask=patterns()[name], backward=True, count_only=True)
    for p in r.passes.values():
        assert p.stats.per_array == p.predicted.per_array, p.name
        assert p.stats.peak == p.predicted.peak, p.name


@pytest.mark.parametrize("name", list(patterns()))
@pytest.mark.parametrize("algo", ["flash1", "flash2", "square-tiling", "standard"])
def test_numerics_match_masked_reference(name, algo):
    M = 300 if algo.startswith("flash") else 40
    r = iosim.run(iosim.Schedule(algo, kv_policy="skip"), N=N, d=4, M=M, mask=patterns()[name], backward=True)
    assert r.passes["forward"].exact and r.main.exact
    assert max(r.passes["forward"].errors.values()) < 1e-12
    assert max(r.errors.values()) < 1e-12
    assert r.finite


@pytest.mark.parametrize(
    "algo, policy",
    [
        ("flash1", "paper"),
        ("flash1", "skip"),
        ("flash2", "paper"),
        ("flash2", "skip"),
        ("square-tiling", "paper"),
        ("standard", "paper"),
    ],
)
def test_fully_masked_rows(algo, policy):
    allowed = patterns()["holes"]
    r = iosim.run(iosim.Schedule(algo, kv_policy=policy), N=N, d=4, M=300, mask=allowed, backward=True)
    rows = ~allowed.any(axis=1)
    assert rows.sum() >= 25
    assert (r.outputs["O"][rows] == 0).all()
    if "L" in r.outputs:
        assert np.isneginf(r.outputs["L"][rows]).all()
    assert (r.outputs["dQ"][rows] == 0).all()
    cols = ~allowed.any(axis=0)
    assert (r.outputs["dK"][cols] == 0).all() and (r.outputs["dV"][cols] == 0).all()


@pytest.mark.parametrize("algo", ["flash1", "flash2"])
def test_causal_flag_is_causal_mask(algo):
    for M in (300, 1200):
        a = iosim.run(algo, N=N, d=4, M=M, causal=True, backward=True, count_only=True)
        for mask in ("causal", im.Causal(), im.Causal().compile(N)):
            b = iosim.run(algo, N=N, d=4, M=M, mask=mask, backward=True, count_only=True)
            assert b.causal
            for name in ("forward", "backward"):
                assert a.passes[name].stats.per_array == b.passes[name].stats.per_array


def test_skip_saves_exactly_the_empty_blocks():
    """paper - skip = the outer operands of the all-empty blocks: K_j, V_j (flash1, 2 d x their widths) and Q_i
    (flash2's forward, d x their heights)."""
    allowed = patterns()["holes"]
    for algo, axis, per_word in (("flash1", 0, 2), ("flash2", 1, 1)):
        runs = {
            p: iosim.run(iosim.Schedule(algo, kv_policy=p), N=N, d=4, M=300, mask=allowed, count_only=True)
            for p in im.POLICIES
        }
        t = runs["skip"].tiling
        B = t.Bc if axis == 0 else t.Br
        seen = allowed.any(axis=axis)
        empty = [min(B, N - x0) for x0 in range(0, N, B) if not seen[x0 : x0 + B].any()]
        assert empty, algo
        assert runs["paper"].stats.total - runs["skip"].stats.total == per_word * 4 * sum(empty)


def test_structured_count_only_is_cheap_at_large_N():
    """Cost ~ nonzero tiles: a window at N = 2^20 is counted at once, and equals its closed form."""
    for mask in ("window:256", "blockdiag:" + ",".join(["4096"] * 256), "causal"):
        r = iosim.run("flash2", N=1 << 20, d=64, M=100_000, mask=mask, count_only=True, allow_long=True)
        assert r.stats.per_array == r.predicted.per_array


def test_cli_mask_on_run_compare_bounds_trace_sweep(tmp_path, capsys):
    import json

    from iosim.cli import main

    sizes = ["--N", str(N), "--d", "4", "--M", "300"]
    assert main(["run", "flash1", *sizes, "--mask", "window:3", "--kv-policy", "skip", "--backward", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mask"] == "window:3" and doc["kv_policy"] == "skip" and doc["exact"] and doc["max_abs_error"] < 1e-12
    assert main(["compare", *sizes, "--mask", "prefix:4"]) == 0
    out = capsys.readouterr().out
    assert "mask prefix:4" in out and "NO" not in out
    assert main(["bounds", *sizes, "--mask", "blockdiag:20,25"]) == 0
    out = capsys.readouterr().out
    assert "Proposition 4 (flash2)" in out and "sparse nnz lower bound" in out and "provisional" in out
    assert main(["trace", "flash2", *sizes, "--mask", "random-blocks:0.3:3x7", "-o", str(tmp_path / "t.csv")]) == 0
    assert "equal counts and peak" in capsys.readouterr().out
    rc = main(["sweep", "--algorithm", "flash1", "flash2", "--N", str(N), "--d", "4", "--M", "300", "--mask",
               "window:3", "random:0.2", "--kv-policy", "paper", "skip", "--executor", "serial", "--no-cache",
               "--out", str(tmp_path / "s.csv")])  # fmt: skip
    assert rc == 0
    text = (tmp_path / "s.csv").read_text()
    assert text.count("window:3") == 4 and text.count("random:0.2") == 4


def test_sweep_grid_has_a_mask_dimension():
    recs = iosim.sweep(
        {"algorithm": ["flash2", "square-tiling"], "N": N, "d": 4, "M": 300, "mask": ["none", "window:4", "prefix:3"],
         "kv_policy": ["paper", "skip"], "pass": ["forward", "backward"]},
        executor="serial", as_frame=False,
    )  # fmt: skip
    assert len(recs) == 2 * 3 * 2 * 2
    assert all(r["status"] == "ok" and r["exact"] for r in recs)
    by = {(r["algorithm"], r["mask"], r["kv_policy"], r["pass"]): r["total"] for r in recs}
    assert by[("flash2", "window:4", "skip", "forward")] < by[("flash2", "none", "skip", "forward")]


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    given = None

if given is not None:

    @st.composite
    def masked_points(draw):
        n = draw(st.integers(1, 40))
        kind = draw(st.sampled_from(["window", "dilated", "blockdiag", "prefix", "random-blocks", "random"]))
        if kind == "window":
            text = f"window:{draw(st.integers(1, n))}" + draw(st.sampled_from(["", ":causal"]))
        elif kind == "dilated":
            text = f"dilated:{draw(st.integers(1, 5))}:{draw(st.integers(1, 6))}"
        elif kind == "blockdiag":
            cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=4))) if n > 1 else []
            text = "blockdiag:" + ",".join(str(b - a) for a, b in zip([0, *cuts], [*cuts, n], strict=True))
        elif kind == "prefix":
            text = f"prefix:{draw(st.integers(1, n))}"
        elif kind == "random-blocks":
            h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
            text = f"random-blocks:{draw(st.sampled_from([0.1, 0.3, 1.0]))}:{h}x{w}:{draw(st.integers(0, 9))}"
        else:
            text = f"random:{draw(st.sampled_from([0.05, 0.5]))}:{draw(st.integers(0, 9))}"
        algo = draw(st.sampled_from(["flash1", "flash2", "square-tiling", "standard"]))
        return algo, n, draw(st.integers(1, 6)), draw(st.integers(60, 400)), text, draw(st.sampled_from(im.POLICIES))

    @settings(max_examples=40, deadline=None)
    @given(masked_points())
    def test_property_counts_equal_closed_form(point):
        algo, n, d, M, text, policy = point
        try:
            r = iosim.run(
                iosim.Schedule(algo, kv_policy=policy), N=n, d=d, M=M, mask=text, backward=True, count_only=True
            )
        except iosim.InputError as e:  # an M below the algorithm's smallest tiling
            assert e.parameter == "M"
            return
        for p in r.passes.values():
            assert p.stats.per_array == p.predicted.per_array and p.stats.peak == p.predicted.peak <= M
