"""The hierarchy's replacement policies beside LRU and OPT (iosim.hierarchy.replacement): random replacement and
set-associative LRU, each held against an independent line cache written here, over the line stream expanded here
from the L2's record (lines of one word, so a request's lines are its words)."""

from __future__ import annotations

import numpy as np
import pytest

from iosim import InputError
from iosim.hierarchy import Machine, hierarchy
from iosim.hierarchy import replacement as rp

A, C, M64 = 6364136223846793005, 1442695040888963407, (1 << 64) - 1


def stream(r):
    """(lines, writes, each launch's end) of a recorded run: every request's words in order (row by row, columns
    left to right; a tile of whole rows as one range), word (row, col) of array a's copy at line lbase + copy x
    lines per copy + (row x row stride + column) // words per line, each line once per range."""
    lay, req, blocks, lw = r.layout, r.cut.requests, r.blocks, r.line_words
    ctas = np.cumsum([k["ctas"] for k in r.launches])
    lines, writes, ends = [], [], []
    for i, k in r.record:
        w, a, r0, nr, c0, nc = (int(x) for x in req[k, :6])
        if w < 0 or nr <= 0 or nc <= 0:
            continue
        launch = int(np.searchsorted(ctas, i, side="right"))
        while len(ends) < launch:
            ends.append(len(lines))
        b = int(lay.base[a])
        first = int(lay.lbase[b]) + int(blocks[i, 1 + lay.kv[a]]) * int(lay.nl[b])
        assert w in (0, 1)
        ca, per = int(lay.stride[a]), int(lw[b])
        ranges = (
            [(r0 * ca, (r0 + nr) * ca)] if nc == ca else [(x * ca + c0, x * ca + c0 + nc) for x in range(r0, r0 + nr)]
        )
        for w0, w1 in ranges:
            got = []
            for word in range(w0, w1):
                if not got or got[-1] != first + word // per:
                    got.append(first + word // per)
            lines += got
            writes += [w == 1] * len(got)
    while len(ends) < len(r.launches):
        ends.append(len(lines))
    return lines, writes, ends


def cache(lines, writes, ends, sets, ways, victim, seed=0, xor=False, flush=False):
    """An independent write-back, write-validate line cache: ``sets`` lists of at most ``ways`` lines, LRU order
    (``victim`` "lru": the front is the oldest) or slot order (``random``: the victim slot is the LCG's draw);
    per launch (fetched, written during, written by the flush after it), the final flush last."""
    content = [[] for _ in range(sets)]
    dirty, x = set(), seed
    fetched = written = 0
    per = []
    for n, (ln, wr) in enumerate(zip(lines, writes, strict=True)):
        q = ((ln ^ (ln // sets)) if xor else ln) % sets
        s = content[q]
        if ln in s:
            if victim == "lru":
                s.remove(ln)
                s.append(ln)
        else:
            fetched += not wr
            if len(s) == ways:
                if victim == "lru":
                    old = s.pop(0)
                else:
                    x = (x * A + C) & M64
                    old = s[(x >> 33) % ways]
                    s[s.index(old)] = None
                written += old in dirty
                dirty.discard(old)
            if None in s:
                s[s.index(None)] = ln
            else:
                s.append(ln)
        if wr:
            dirty.add(ln)
        for k, e in enumerate(ends):
            if e == n + 1 and len(per) == k:
                per.append([fetched, written, 0])
                if flush and k + 1 < len(ends):
                    per[-1][2] = len(dirty)
                    written += len(dirty)
                    dirty.clear()
                    content = [[] for _ in range(sets)]
    while len(per) < len(ends):
        per.append([fetched, written, 0])
    return per, written + len(dirty)


def run(policy, backward=False, C=96, flush=None, algorithm="flash2"):  # noqa: N803
    machine = Machine(P=2, C=C, L=1, blocks_per_sm=2, flush=flush)
    return hierarchy(algorithm, N=40, d=6, M=160, device=machine, policy=policy, backward=backward, record=True)


def check(r, per, total):
    """The hierarchy's DRAM against the cache's: reads and writes per launch, the final flush, the totals."""
    rows, lb = r.dram_writes, r.L * r.bytes_per_word  # every array at bytes_per_word: a line of L words
    got = [(w["read_bytes"], w["during_bytes"], w["flush_after_bytes"]) for w in rows]
    want, f0, w0 = [], 0, 0
    for f, w, fl in per:
        want.append((lb * (f - f0), lb * (w - w0), lb * fl))
        f0, w0 = f, w + fl
    assert got == want
    assert r.dram_read == per[-1][0] * r.L and r.dram_update == total * r.L
    assert sum(w["with_flush_bytes"] for w in rows) == 2 * r.dram_update


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("seed", [0, 5])
def test_random_equals_a_hand_cache_with_the_same_generator(backward, seed):
    r = run(f"random:{seed}" if seed else "random", backward)
    lines, writes, ends = stream(r)
    check(r, *cache(lines, writes, ends, 1, 96, "random", seed))


@pytest.mark.parametrize("policy", ["sets:1", "sets:4", "sets:8:xor", "sets:32"])
@pytest.mark.parametrize("backward", [False, True])
def test_set_associative_equals_a_per_set_lru(policy, backward):
    w = int(policy.split(":")[1])
    r = run(policy, backward)
    lines, writes, ends = stream(r)
    check(r, *cache(lines, writes, ends, 96 // w, w, "lru", xor=policy.endswith("xor")))


@pytest.mark.parametrize("backward", [False, True])
def test_one_set_of_every_line_is_the_fully_associative_lru(backward):
    a, b = run("sets:96", backward), run("lru", backward)
    assert (a.dram_read, a.dram_update) == (b.dram_read, b.dram_update)
    assert a.dram_writes == b.dram_writes
    assert {n: (c.l2_fill, c.l2_writeback) for n, c in a.per_array.items()} == {
        n: (c.l2_fill, c.l2_writeback) for n, c in b.per_array.items()
    }


def test_random_differs_from_lru_and_its_seed_matters():
    """A check that can fail: the random victims change the counts (the launch thrashes a 96-word L2)."""
    got = {p: run(p).dram_read for p in ("lru", "random", "random:1")}
    assert got["random"] != got["lru"] and got["random"] != got["random:1"]


def test_hand_simulated_random_victims():
    """Two slots, lines 0 1 2 0: the third miss draws x1 = C (seed 0), (C >> 33) mod 2 = 1 (C >> 33 = 167,951,807,
    odd), so line 2 replaces line 1 in slot 1; line 0 then hits. Fetches 3, nothing written."""
    assert (C >> 33) == 167951807 and (C >> 33) % 2 == 1
    lines = np.array([0, 1, 2, 0, 1], np.int64)
    flags = np.array([0, 3, 0, 0, 0], np.int8)  # line 1 written (allocated dirty, not fetched)
    f, w = np.zeros(1, np.int64), np.zeros(1, np.int64)
    at = [np.zeros((1, 1), np.int64) for _ in range(3)]
    tag, dirty = rp.replay(lines, flags, np.array([5]), 1, 2, rp.VICTIM_RANDOM, 0, 0, np.zeros(3, np.int64), 3, 0,
                           f, w, *at)  # fmt: skip
    # misses: 0 (fetch), 1 (write: no fetch), 2 (evicts dirty 1: a write-back), 0 hits, 1 misses (fetch) and the
    # second draw x2 = C A + C picks its victim
    x2 = (C * A + C) & M64
    victim_line = 0 if (x2 >> 33) % 2 == 0 else 2
    assert f[0] == 3 and w[0] == 1
    assert sorted(tag.tolist()) == sorted({0, 2, 1} - {victim_line})


@pytest.mark.parametrize("bad", ["LRU", "sets", "sets:0", "sets:x", "sets:4:hash", "random:x", "fifo", 3, None])
def test_a_bad_policy_is_one_line_naming_the_accepted(bad):
    with pytest.raises(InputError, match="policy.*lru, opt, random.*sets:W"):
        run(bad)


def test_ways_must_divide_the_lines_and_partitions_and_sectors_are_refused():
    with pytest.raises(InputError, match="divide the L2's 96 lines"):
        run("sets:7")
    with pytest.raises(InputError, match="one cache"):
        hierarchy("flash2", N=40, d=6, M=160, device=Machine(P=2, C=96, L=1, partitions=2), policy="random")
    with pytest.raises(InputError, match="line cache"):
        hierarchy("flash2", N=40, d=8, M=160, device=Machine(P=2, C=96, L=4, sector_bytes=4), policy="sets:4")


def test_cli_policy_and_a_bad_one(capsys):
    from iosim.cli import main

    assert main(["hierarchy", "flash2", "--N", "40", "--d", "6", "--M", "160", "--C", "96", "--policy", "sets:4"]) == 0
    assert "sets:4" in capsys.readouterr().out
    assert main(["hierarchy", "flash2", "--N", "40", "--d", "6", "--M", "160", "--C", "96", "--policy", "lfu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "policy" in err[0] and "sets:W" in err[0]


def test_the_hypotheses_page_tables_are_the_stored_runs():
    """docs/hierarchy-hypotheses.md's tables are experiments/bench/hierarchy_hypotheses.py's output from the stored
    runs (gpu_h100/ and gpu_h200_2/hierarchy-hypotheses.json), each between its markers."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments" / "bench"))
    import hierarchy_hypotheses as hh

    doc = hh.DOC.read_text()
    for key, table in hh.TABLES.items():
        start, end = hh.BLOCKS[key]
        assert doc.split(start, 1)[1].split(end, 1)[0].strip() == table().strip(), key
