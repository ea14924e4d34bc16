"""The backward under per-head GQA launches its group sum: a KV head's g query heads write dK, dV partials, and the
declared "GQA group sum" kernel reads and adds them after the main kernel; with no L2 the hierarchy's DRAM words
equal iosim run's count of the same problem, per array."""

from __future__ import annotations

import pytest

import iosim
from iosim import Problem, Schedule
from iosim.hierarchy import Machine


@pytest.mark.parametrize("algorithm", ["flash1", "flash2"])
@pytest.mark.parametrize(("B", "H_q", "H_kv", "N", "causal"), [(1, 4, 2, 37, False), (2, 6, 2, 20, True)])
def test_group_sum_is_launched_and_counted(algorithm, B, H_q, H_kv, N, causal):  # noqa: N803
    p = Problem(B=B, H_q=H_q, H_kv=H_kv, N=N, d=8, causal=causal)
    s = Schedule(algorithm, backward=True, Br=5, Bc=7)
    h = iosim.hierarchy(p, s, 4096, device=Machine(C=0, P=3))
    r = iosim.run(p, s, 4096, count_only=True)
    kernels = [k["kernel"] for k in h.as_dict()["launches"]]
    assert kernels[-1] == "GQA group sum"
    assert h.dram == r.stats.total
    per = h.as_dict()["per_array"]
    for name, c in r.stats.per_array.items():
        assert per[name]["dram_read"] + per[name]["dram_update"] == c.reads + c.writes, name  # writes hold the init


def test_without_groups_no_group_sum():
    h = iosim.hierarchy(Problem(H_q=2, H_kv=2, N=20, d=8), Schedule("flash2", backward=True), 4096, device=Machine(C=0))
    assert "GQA group sum" not in [k["kernel"] for k in h.as_dict()["launches"]]
