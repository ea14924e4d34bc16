"""How flash1 reads a paged cache is a schedule option: ``Schedule(pages="gather")``, ``iosim.run(..., pages=)``,
``--pages gather`` on run and hierarchy. Gathering a column block's keys from their pages costs the page-table words
over the contiguous cache and nothing else; one outer step per page piece costs a round trip of Q_i, O_i, l_i, m_i
per piece."""

from __future__ import annotations

import json

import numpy as np
import pytest

import iosim
from iosim import Problem, Schedule
from iosim.base.errors import InputError
from iosim.cli import main
from iosim.hierarchy import Machine
from iosim.theory import io_model


def _paged(P):  # noqa: N802
    return Problem(B=2, H_q=4, H_kv=2, N_q=3, N_k=41, d=8, page_size=P)


@pytest.mark.parametrize("P", [1, 3, 16])
@pytest.mark.parametrize("mask", [None, "window:7"])
def test_gather_pays_the_table_words_only(P, mask):  # noqa: N803
    kw = dict(count_only=True, **({"mask": mask} if mask else {}))
    gather = iosim.run(_paged(P), Schedule("flash1", gqa="packed", Br=4, Bc=8, pages="gather"), 4096, **kw)
    pieces = iosim.run(_paged(P), Schedule("flash1", gqa="packed", Br=4, Bc=8), 4096, **kw)
    flat = iosim.run(_paged(None), Schedule("flash1", gqa="packed", Br=4, Bc=8), 4096, **kw)
    for r in (gather, pieces):
        assert r.main.exact and r.stats.total == r.predicted.total
    table = gather.stats.per_array["page_table"].reads
    assert gather.stats.total - flat.stats.total == table > 0
    assert gather.schedule["pages"] == "gather" and pieces.schedule["pages"] == "pieces"
    if P < 8:  # a tile straddles pages: each piece its own outer step
        assert pieces.stats.total > gather.stats.total
    pred = io_model.flash1_problem(_paged(P), 4, 8, "packed", "shared", None if mask is None else gather_mask(mask),
                                   gather=True)  # fmt: skip
    assert pred.total == gather.stats.total


def gather_mask(spec):
    from iosim.masking.masks import compile_mask

    return compile_mask(spec, 41, policy="skip")


def test_gather_numerics_match_the_reference():
    r = iosim.run(_paged(3), Schedule("flash1", Br=4, Bc=8, pages="gather"), 4096, seed=2)
    assert r.main.exact and max(r.errors.values()) < 1e-12
    assert r.as_dict()["schedule_spec"]["pages"] == "gather"


def test_gather_is_refused_where_it_means_nothing():
    with pytest.raises(InputError, match="pages"):
        Schedule("flash1", pages="gathered")
    with pytest.raises(InputError, match="flash1 over a paged cache"):
        iosim.run(_paged(3), Schedule("flash2", pages="gather"), 4096, count_only=True)
    with pytest.raises(InputError, match="flash1 over a paged cache"):
        iosim.run(_paged(None), Schedule("flash1", pages="gather"), 4096, count_only=True)
    with pytest.raises(InputError, match="flash1 over a paged cache"):  # one head: not the plain run, refused too
        iosim.run(iosim.Schedule("flash1", pages="gather"), N=64, d=8, M=4096, count_only=True)


def test_command_line(capsys):
    shape = ["--batch", "2", "--heads", "4", "--kv-heads", "2", "--Nq", "3", "--Nk", "41", "--d", "8"]
    assert main(["run", "flash1", *shape, "--page-size", "3", "--M", "4096", "--count-only", "--pages", "gather",
                 "--json"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["schedule_spec"]["pages"] == "gather" and doc["exact"]
    for argv in (["run", "flash2", *shape, "--page-size", "3"], ["run", "flash1", *shape]):
        assert main([*argv, "--M", "4096", "--count-only", "--pages", "gather"]) == 2
        assert "pages" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # argparse's one line, exit 2
        main(["run", "flash1", *shape, "--M", "4096", "--pages", "all"])
    assert e.value.code == 2 and "--pages" in capsys.readouterr().err


def test_hierarchy_without_l2_equals_the_run():
    p = _paged(3)
    h = iosim.hierarchy(p, Schedule("flash1", gqa="packed", Br=4, Bc=8, pages="gather"), 4096, device=Machine(C=0, P=2))
    r = iosim.run(p, Schedule("flash1", gqa="packed", Br=4, Bc=8, pages="gather"), 4096, count_only=True)
    assert h.dram == r.stats.total
    assert not np.isnan(h.dram)
