"""Masks: every kind's tile oracle (nnz, element test, row/column ranges, tile summary) against the dense array."""

import numpy as np
import pytest
from iosim.algorithms import tile_masks as am

import iosim
from iosim import InputError
from iosim.masking import masks as im

N = 53  # ragged against every tiling below


def kinds(n=N):
    return {
        "none": im.Dense(),
        "causal": im.Causal(),
        "window": im.SlidingWindow(7),
        "window-causal": im.SlidingWindow(5, causal=True),
        "dilated": im.Dilated(4, 3),
        "dilated-causal": im.Dilated(3, 5, causal=True),
        "blockdiag": im.BlockDiagonal((10, 1, 25, n - 36)),
        "prefix": im.PrefixLM(9),
        "bigbird": im.BigBird(6, 1, 1, 1, seed=3),
        "random-blocks": im.RandomBlocks(0.3, (4, 11), seed=1),
        "random": im.RandomElements(0.2, seed=2),
        "array": im.FromArray(np.random.default_rng(5).random((n, n)) < 0.1),
    }


def brute(mask, n=N):
    """The dense array from the element test alone (no ranges)."""
    t = mask.compile(n)
    return np.array([[am.mask_allows(t.kind, t.params, t.table, r, c) for c in range(n)] for r in range(n)])


@pytest.mark.parametrize("name", list(kinds()))
def test_tile_oracle_matches_dense(name):
    mask = kinds()[name]
    t = mask.compile(N)
    A = brute(mask)
    assert (t.dense() == A).all()  # the ranges drop nothing
    rng = np.random.default_rng(0)
    for _ in range(300):
        r0, c0 = rng.integers(0, N, 2)
        nr, nc = rng.integers(1, N - r0 + 1), rng.integers(1, N - c0 + 1)
        assert am.mask_nnz(t.kind, t.params, t.table, r0, nr, c0, nc) == A[r0 : r0 + nr, c0 : c0 + nc].sum()
        lo, hi = am.mask_cols(t.kind, t.params, t.table, r0, nr, N)
        assert not A[r0 : r0 + nr, :lo].any() and not A[r0 : r0 + nr, hi:].any()
        lo, hi = am.mask_rows(t.kind, t.params, t.table, c0, nc, N)
        assert not A[:lo, c0 : c0 + nc].any() and not A[hi:, c0 : c0 + nc].any()
    for Br, Bc in ((5, 7), (16, 3), (N, N), (1, 64)):
        sums, row_ne, col_ne = am.tile_summary(t.kind, t.params, t.table, N, Br, Bc)
        tiles = [
            (i, j, A[i : i + Br, j : j + Bc])
            for i in range(0, N, Br)
            for j in range(0, N, Bc)
            if A[i : i + Br, j : j + Bc].any()
        ]
        assert sums[0] == len(tiles)
        assert sums[1] == sum(x.shape[0] for _, _, x in tiles)
        assert sums[2] == sum(x.shape[1] for _, _, x in tiles)
        assert sums[3] == sum(x.size for _, _, x in tiles)
        assert sums[4] == A.sum()
        assert list(row_ne) == [A[i : i + Br].any() for i in range(0, N, Br)]
        assert list(col_ne) == [A[:, j : j + Bc].any() for j in range(0, N, Bc)]


def test_causal_flag_is_the_causal_mask():
    assert (am.causal_mask(N).dense() == np.tril(np.ones((N, N), bool))).all()
    assert am.resolve(True, N).is_causal and not am.resolve(False, N).is_causal


@pytest.mark.parametrize(
    "text",
    ["causal", "window:12", "window:12:causal", "dilated:3:4", "blockdiag:20,33", "prefix:5", "bigbird:8:1:1:2",
     "random-blocks:0.25:4x8", "random:0.1:7", "none"],
)  # fmt: skip
def test_parse_round_trip(text):
    m = im.parse(text)
    t = m.compile(N)
    assert t.dense().shape == (N, N)
    assert im.parse(m.label).compile(N).dense().tolist() == t.dense().tolist()


@pytest.mark.parametrize(
    "make, parameter",
    [
        (lambda: im.SlidingWindow(0), "mask window"),
        (lambda: im.Dilated(3, 0), "mask dilation"),
        (lambda: im.RandomBlocks(0.0), "mask density"),
        (lambda: im.RandomElements(1.5), "mask density"),
        (lambda: im.RandomBlocks(0.5, (0, 4)), "mask block shape"),
        (lambda: im.BlockDiagonal((10, 10)).compile(N), "mask document lengths"),
        (lambda: im.BlockDiagonal(()), "mask document lengths"),
        (lambda: im.PrefixLM(N + 1).compile(N), "mask prefix"),
        (lambda: im.FromArray(np.ones((N, N))), "mask"),
        (lambda: im.FromArray(np.ones((N, N - 1), bool)), "mask"),
        (lambda: im.FromArray(np.ones((4, 4), bool)).compile(N), "mask"),
        (lambda: im.FromBlocks(np.ones((3, 3), bool), (4, 4)).compile(N), "mask blocks"),
        (lambda: im.parse("window:x"), "mask window"),
        (lambda: im.parse("window:-3"), "mask window"),
        (lambda: im.parse("random-blocks:0.5:16"), "mask block shape"),
        (lambda: im.parse("file:/nonexistent.npy"), "mask file"),
        (lambda: im.parse("nonsense"), "mask"),
        (lambda: im.compile_mask("causal", N, causal=True), "causal"),
        (lambda: im.compile_mask("causal", N, policy="lazy"), "kv_policy"),
    ],
)
def test_bad_masks_name_their_parameter(make, parameter):
    with pytest.raises(InputError) as e:
        make()
    assert e.value.parameter == parameter


def test_mask_files(tmp_path):
    """file:X.npy loads a boolean N x N array or a block mask; a non-boolean or unreadable file names the mask."""
    A = np.random.default_rng(1).random((N, N)) < 0.3
    np.save(tmp_path / "a.npy", A)
    assert (im.parse(f"file:{tmp_path / 'a.npy'}").compile(N).dense() == A).all()
    blocks = np.random.default_rng(2).random((14, 6)) < 0.5
    np.save(tmp_path / "b.npy", blocks)
    t = im.parse(f"file:{tmp_path / 'b.npy'}:4x9").compile(N)
    assert (t.dense() == np.kron(blocks, np.ones((4, 9), bool))[:N, :N]).all()
    np.save(tmp_path / "f.npy", A.astype(float))
    (tmp_path / "junk.npy").write_text("not numpy")
    for name, parameter in (("f.npy", "mask"), ("junk.npy", "mask file")):
        with pytest.raises(InputError) as e:
            im.parse(f"file:{tmp_path / name}")
        assert e.value.parameter == parameter


# ------------------------------------------------------------------------------- random masks: no table, per tile
RANDOM_SPECS = ["random:0.3:7", "random-blocks:0.4:3x5:2", "bigbird:4:1:1:2:5", "random:0.5:18446744073709551615"]


@pytest.mark.parametrize("spec", RANDOM_SPECS)
def test_random_masks_hold_no_table_and_answer_per_tile(spec):
    """Any tile is reproducible on its own: the nnz of a tiling's tiles, each counted alone, sum to the whole mask's
    on every tiling; the compiled generator equals its plain-Python form element by element."""
    t = im.compile_mask(spec, N)
    assert t.table.size == 1  # nothing of N x N (or blocks x blocks) is held
    A = t.dense()
    for Br, Bc in ((5, 7), (13, 2), (N, 1)):
        total = sum(
            am.mask_nnz(t.kind, t.params, t.table, r0, min(Br, N - r0), c0, min(Bc, N - c0))
            for r0 in range(0, N, Br)
            for c0 in range(0, N, Bc)
        )
        assert total == A.sum() == t.nnz()
    plain = am._mask_allows.py_func
    assert all(plain(t.kind, t.params, t.table, r, c) == A[r, c] for r in range(N) for c in range(N))


@pytest.mark.parametrize("spec", ["random:0.3", "random-blocks:0.4:3x5"])
def test_random_pattern_depends_on_position_not_on_n(spec):
    """An element's (a block's) draw is keyed by (seed, position): the top-left corner of the mask at N = 2^20 is
    the mask at N = 53, and compiling at 2^20 allocates nothing of that size."""
    big = im.compile_mask(spec, 2**20)
    assert (big.rows(0, N)[:, :N] == im.compile_mask(spec, N).dense()).all()


def test_random_seeds_reproduce_and_differ():
    a, b, c = (im.compile_mask(f"random:0.5:{s}", 64).dense() for s in (1, 1, 2))
    assert (a == b).all() and (a != c).any()


@pytest.mark.parametrize(("spec", "n", "density"), [("random:0.1", 2048, 0.1), ("random:0.73", 1024, 0.73),
                                                    ("random-blocks:0.25:4x4", 4096, 0.25)])  # fmt: skip
def test_random_density(spec, n, density):
    """Bernoulli(density) per element (per block): the share allowed is within 5 standard deviations."""
    t = im.compile_mask(spec, n)
    draws = n * n if spec.startswith("random:") else (n // 4) ** 2
    sd = (density * (1 - density) / draws) ** 0.5
    assert abs(t.nnz() / (n * n) - density) < 5 * sd


def test_bigbird_draws_r_distinct_random_blocks_per_block_row():
    """With no global blocks and no window beyond the diagonal, a block row holds its r random blocks (distinct)
    and the diagonal block, which may be one of them: r or r + 1 blocks."""
    b, r, n = 4, 3, 40
    blocks = im.compile_mask(f"bigbird:{b}:0:0:{r}:9", b * n).dense()[::b, ::b]
    per_row = blocks.sum(axis=1)
    assert ((per_row == r) | (per_row == r + 1)).all() and (per_row == r + 1).any()
    assert blocks.diagonal().all()


# --------------------------------------------------------------- BigBird per block row; random masks at N = 2^20
BIGBIRD_SPECS = [
    "bigbird:5:0:0:3:1",  # random blocks only (and the diagonal)
    "bigbird:4:2:1:2:4",
    "bigbird:7:0:2:6:2",  # r close to the n = 8 block columns: many repeated draws
    "bigbird:2:0:0:26:8",  # r = n - 1
    "bigbird:1:0:0:50:5",  # one-element blocks
    "bigbird:3:20:0:1",  # more global blocks than blocks: all allowed
    "bigbird:6:1:0:9:3",  # r >= n: all allowed
]


@pytest.mark.parametrize("spec", BIGBIRD_SPECS)
def test_bigbird_counts_per_block_row_equal_the_element_test(spec):
    """A tile's BigBird count (global columns and window in closed form, the block row's r random columns drawn
    once) equals the element test summed over the tile, on random tiles and on whole tilings."""
    t = im.compile_mask(spec, N)
    A = brute(im.parse(spec))
    assert (t.dense() == A).all()
    rng = np.random.default_rng(3)
    for _ in range(200):
        r0, c0 = rng.integers(0, N, 2)
        nr, nc = rng.integers(1, N - r0 + 1), rng.integers(1, N - c0 + 1)
        assert am.mask_nnz(t.kind, t.params, t.table, r0, nr, c0, nc) == A[r0 : r0 + nr, c0 : c0 + nc].sum()
    for Br, Bc in ((1, 1), (5, 7), (N, N), (2, 64), (64, 3)):
        sums, _, _ = am.tile_summary(t.kind, t.params, t.table, N, Br, Bc)
        assert sums[4] == A.sum()
        assert sums[0] == sum(A[i : i + Br, j : j + Bc].any() for i in range(0, N, Br) for j in range(0, N, Bc))


def test_bigbird_summary_with_and_without_a_row_blocks_shared_draws():
    """tile_summary draws a row block's random columns once for its tiles unless that table is large (here 4202
    block rows x 256 columns); both ways give the same sums."""
    n = 4200
    t = im.compile_mask("bigbird:1:0:0:256:1", n)
    a, _, _ = am.tile_summary(t.kind, t.params, t.table, n, n, 1400)  # 4202 x 256 > 2^20: tile by tile
    b, _, _ = am.tile_summary(t.kind, t.params, t.table, n, 2100, 1400)  # drawn once per row block
    assert a[4] == b[4] == t.nnz() == n * 257 - sum(_random_hit(t, r) for r in range(n))


def _random_hit(t, r):
    """Whether row r's own (diagonal) block is one of its random blocks (then it is counted once, not twice)."""
    return am._bigbird_random(t.params[2], r, r, t.params[6], t.params[5])


BIG = 2**20
BIG_SPECS = ["random:0.01:3", "random-blocks:0.1:16x16:3", "bigbird:16:1:1:3:3", "bigbird:1:0:0:2:3"]


@pytest.mark.parametrize("spec", BIG_SPECS)
def test_random_masks_at_n_2_20_answer_per_tile(spec):
    """At N = 2^20 nothing of N x N (or blocks x blocks) is allocated: a tile anywhere is counted on its own, its
    count equals its rows' element test, and sub-tiles on two tilings sum to it."""
    t = im.compile_mask(spec, BIG)
    assert t.table.size == 1 and t.params.size <= 8
    for r0, c0 in ((0, 0), (BIG // 2 + 5, 12345), (BIG - 40, BIG - 300)):
        nnz = am.mask_nnz(t.kind, t.params, t.table, r0, 40, c0, 300)
        for Br, Bc in ((7, 13), (40, 1)):
            parts = sum(
                am.mask_nnz(t.kind, t.params, t.table, r, min(Br, r0 + 40 - r), c, min(Bc, c0 + 300 - c))
                for r in range(r0, r0 + 40, Br)
                for c in range(c0, c0 + 300, Bc)
            )
            assert parts == nnz
        top = am.mask_nnz(t.kind, t.params, t.table, r0, 4, c0, 300)
        assert top == t.rows(r0, r0 + 4)[:, c0 : c0 + 300].sum()  # 4 x 2^20 booleans: 4 MiB


def test_bigbird_tile_summary_at_n_2_20():
    """BigBird at N = 2^20 on 16 x 16 blocks (65,536 block rows): the whole-mask count and a tile summary on a
    coarse tiling, in closed form per block row (3 random blocks, one global block row and column, a window of
    one block each side: at most 1 + 3 + 3 blocks a block row)."""
    t = im.compile_mask("bigbird:16:1:1:3:3", BIG)
    n = BIG // 16
    nnz = t.nnz()
    sums, row_ne, col_ne = am.tile_summary(t.kind, t.params, t.table, BIG, 1 << 16, 1 << 17)
    assert sums[4] == nnz and row_ne.all() and col_ne.all()
    blocks, base = nnz // 256, 3 + 4 * (n - 3) + 3  # block row 0 is global; then column 0 and the window
    assert nnz % 256 == 0 and n + base <= blocks <= n + base + 3 * (n - 1)
    for bi in (1, n // 3, n - 1):  # a block row's count is its rows' element test
        rows = t.rows(16 * bi, 16 * bi + 16)
        assert am.mask_nnz(t.kind, t.params, t.table, 16 * bi, 16, 0, BIG) == rows.sum()


def test_a_count_only_run_with_a_random_mask_at_an_allowed_size():
    """random:0.01 at N = 2^14 (2^28 draws a count, under a second): the run's counts equal the closed form."""
    r = iosim.run("flash2", N=2**14, d=64, M=16384, mask="random:0.01", count_only=True)
    p = r.passes["forward"]
    assert p.stats.per_array == p.predicted.per_array and p.stats.peak == p.predicted.peak


@pytest.mark.parametrize("kind", ["random:0.5:{}", "random-blocks:0.5:3x2:{}", "bigbird:4:0:0:3:{}"])
def test_every_random_kind_seeds_reproduce_and_differ(kind):
    a, b, c = (im.compile_mask(kind.format(s), 64).dense() for s in (11, 11, 12))
    assert (a == b).all() and (a != c).any()
    assert (im.compile_mask(kind.format(11), 64).dense() == a).all()


@pytest.mark.parametrize(
    "make",
    [
        lambda: im.FromArray(np.ones((N, N), bool)).compile(N),
        lambda: im.FromBlocks(np.ones((14, 6), bool), (4, 9)).compile(N),
    ],
)
def test_a_table_that_does_not_fit_is_refused_in_one_line(make, monkeypatch):
    """A user's array (or block array) is answered from a 2-D prefix-sum table; one that would not fit in memory is
    refused up front, naming the mask and the size."""
    from iosim.runner import estimate

    monkeypatch.setattr(estimate, "available_bytes", lambda: 1000)
    with pytest.raises(InputError) as e:
        make()
    assert e.value.parameter == "mask" and "GiB" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("spec", ["random:0.01:1", "random:0.5:2", "random:0.995:3", "random-blocks:0.4:3x5:2"])
def test_drivers_tile_answer_is_empty_full_or_partial(spec):
    """What a driver asks of a tile (tile_nnz) is 0 exactly when the tile is empty, its area exactly when it is full
    and a number in between otherwise (random elements stop at the first allowed and forbidden element)."""
    t = im.compile_mask(spec, N)
    rng = np.random.default_rng(4)
    for _ in range(400):
        r0, c0 = rng.integers(0, N, 2)
        nr, nc = rng.integers(1, min(8, N - r0) + 1), rng.integers(1, min(8, N - c0) + 1)
        exact = am.mask_nnz(t.kind, t.params, t.table, r0, nr, c0, nc)
        got = am._tile_nnz(t.kind, t.params, t.table, r0, nr, c0, nc)
        assert (got == 0) == (exact == 0) and (got == nr * nc) == (exact == nr * nc) and 0 <= got <= nr * nc


def _cli(argv, capsys):
    from iosim.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, [x for x in out.err.splitlines() if x.strip() and not x.startswith("iosim: compiling")]


def test_bounds_of_random_elements_at_n_2_22_are_priced_not_allocated(capsys):
    """random:0.01 at N = 2^22 holds no table; counting it three times (the nnz bound and Proposition 4 on two
    tilings) is 3 x 2^44 draws: refused up front in one line naming the mask, never a MemoryError."""
    rc, _, err = _cli(["bounds", "--N", "4194304", "--d", "64", "--M", "65536", "--mask", "random:0.01"], capsys)
    assert rc == 2 and len(err) == 1, err
    assert "mask" in err[0] and "random:0.01" in err[0] and "hour" in err[0] and "Memory" not in err[0]


@pytest.mark.slow
@pytest.mark.parametrize("mask", ["bigbird:256:1:1:3", "random-blocks:0.1:256x256"])
def test_bounds_of_block_masks_at_n_2_20_run(mask, capsys):
    """BigBird and random blocks at N = 2^20 (4,096 block rows): the sparse bounds are computed (5-7 s) with no
    N x N or blocks x blocks array; the process stays far below N^2 bytes."""
    import resource

    rc, out, err = _cli(["bounds", "--N", "1048576", "--d", "64", "--M", "65536", "--mask", mask], capsys)
    assert rc == 0, err
    assert "sparse nnz lower bound" in out and "Proposition 4 (flash2)" in out
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 < 2**33  # N^2 bytes would be 2^40


def test_the_long_run_rule_prices_a_random_masks_tile_tests():
    """A random mask leaves no tile out of a schedule's ranges: at N = 2^24 BigBird with 4096-wide blocks has only
    4,096 block rows to draw, but a count-only run tests ~10^10 tiles. The rule prices those tests and refuses up
    front, in one line naming the mask, before any tile is visited."""
    from iosim.runner import estimate
    from iosim.theory.tiling import Tiling

    t = im.compile_mask("bigbird:4096:1:1:3", 2**24)
    assert estimate.mask_seconds(t, 3) < 2  # the draws alone
    assert estimate.mask_seconds(t, 3, Tiling("fit", 295, 64)) > estimate.MAX_SECONDS
    with pytest.raises(InputError) as e:
        iosim.run("flash2", N=2**24, d=64, M=65536, mask=t, count_only=True, allow_long=True)
    assert e.value.parameter == "mask" and "hour" in str(e.value)
