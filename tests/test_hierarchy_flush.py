"""Machine(flush="per-kernel"): the L2 written back and emptied between a problem's launches (Nsight Compute's cache
control), each launch's DRAM reads, its writes during the kernel and the flush after it, held against an independent
line cache with the same flush (tests/test_hierarchy_policies.py's, over the line stream expanded from the record)."""

from __future__ import annotations

import pytest
from test_hierarchy_policies import cache, check, stream  # tests/ is on the path (rootless test modules)

from iosim import InputError
from iosim.hierarchy import Machine, hierarchy

LAUNCHES = [("square-tiling", False), ("square-tiling", True), ("flash2", True)]


def run(algorithm, backward, policy="lru", flush="per-kernel", L=1, C=96, **machine):  # noqa: N803
    m = Machine(P=2, C=C, L=L, blocks_per_sm=2, flush=flush, **machine)
    return hierarchy(algorithm, N=40, d=8, M=160, device=m, policy=policy, backward=backward, record=True)


@pytest.mark.parametrize(("algorithm", "backward"), LAUNCHES)
@pytest.mark.parametrize("L", [1, 4])
def test_lru_with_the_flush_equals_a_line_lru_flushed_between_launches(algorithm, backward, L):  # noqa: N803
    r = run(algorithm, backward, L=L)
    assert len(r.launches) >= 2
    lines, writes, ends = stream(r)
    per, total = cache(lines, writes, ends, 1, 96 // L, "lru", flush=True)
    assert any(p[2] for p in per)  # some launch leaves dirty lines for the flush (the check can fail)
    check(r, per, total)


@pytest.mark.parametrize("policy", ["random:3", "sets:4"])
def test_replayed_policies_with_the_flush(policy):
    r = run("square-tiling", False, policy)
    lines, writes, ends = stream(r)
    victim, w = ("random", 96) if policy.startswith("random") else ("lru", 4)
    check(r, *cache(lines, writes, ends, 96 // w, w, victim, seed=3, flush=True))


@pytest.mark.parametrize(("algorithm", "backward"), LAUNCHES)
def test_the_flush_moves_writes_out_of_the_next_launch_and_changes_nothing_before_it(algorithm, backward):
    """With partitions and sectors: the first launch runs as without the flush; the total written is the stores'
    lines either way or more (a line flushed is written back again if re-dirtied); the flush's bytes are apart."""
    kw = dict(partitions=2, sector_bytes=4, L=4, C=128)
    a, b = run(algorithm, backward, **kw), run(algorithm, backward, flush=None, **kw)
    wa, wb = a.dram_writes, b.dram_writes
    assert (wa[0]["read_bytes"], wa[0]["during_bytes"]) == (wb[0]["read_bytes"], wb[0]["during_bytes"])
    assert all(w["flush_after_bytes"] == 0 for w in wb) and wa[-1]["flush_after_bytes"] == 0
    assert sum(w["with_flush_bytes"] for w in wa) == a.level_bytes("dram_update")
    assert a.level_bytes("dram_read") >= b.level_bytes("dram_read")  # an empty L2 at each launch: no reuse across
    assert a.as_dict()["flush"] == "per-kernel" and b.as_dict()["flush"] is None


@pytest.mark.parametrize("bad", ["always", "per_kernel", 1, True])
def test_a_bad_flush_is_one_line(bad):
    with pytest.raises(InputError, match="flush.*per-kernel"):
        Machine(P=2, C=96, L=1, flush=bad)


def test_opt_refuses_the_flush_and_the_cli_takes_it(capsys):
    with pytest.raises(InputError, match="policy opt"):
        run("square-tiling", False, "opt")
    from iosim.cli import main

    args = ["hierarchy", "square-tiling", "--N", "40", "--d", "8", "--M", "160", "--C", "96", "--json"]
    assert main([*args, "--flush", "per-kernel"]) == 0
    assert '"flush": "per-kernel"' in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # argparse's choices: one line, exit 2
        main([*args, "--flush", "always"])
    assert e.value.code == 2 and "--flush" in capsys.readouterr().err
