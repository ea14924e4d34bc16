"""hierarchy()'s short keyword form (issue 43, 47): the schedule's options through iosim.Schedule, the machine's
through iosim.hierarchy.Machine, the block order through the Scheduler; a keyword that moved is one line naming the
object that takes it now (run's mechanism, iosim.runner.api.short_keywords), and the two forms are one launch."""

from __future__ import annotations

import dataclasses

import pytest

import iosim
from iosim import InputError, Problem, Schedule
from iosim.hierarchy import Machine, Scheduler, device, hierarchy
from iosim.hierarchy.simulate import MOVED

# each moved keyword, the object its line must name, and a value of it (any: the keyword is refused before any work)
MOVED_TO = {
    **dict.fromkeys(("kv_policy", "tiling", "Br", "Bc", "block", "gqa", "mla", "splits", "pages"), "iosim.Schedule("),
    **dict.fromkeys(("P", "C", "L", "blocks_per_sm", "partitions", "home_lines", "sector_bytes", "kernel"), "Machine("),
    "order": "Scheduler(order=",
}


def test_the_moved_keywords_are_the_list():
    assert set(MOVED) == set(MOVED_TO)


@pytest.mark.parametrize("keyword", sorted(MOVED_TO))
@pytest.mark.parametrize("form", ["keywords", "objects"])
def test_a_moved_keyword_is_one_line_naming_its_object(keyword, form):
    p = Problem(H_q=2, N=16, d=4)
    with pytest.raises(InputError) as e:
        if form == "keywords":
            hierarchy("flash2", N=16, d=4, M=600, device=Machine(C=0), **{keyword: object()})
        else:
            hierarchy(p, Schedule("flash2"), 600, device=Machine(C=0), **{keyword: object()})
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"hierarchy(): {keyword} is ") and MOVED_TO[keyword] in text
    if keyword == "block":  # the square tile is the Schedule's B (hierarchy's B is the batch)
        assert "iosim.Schedule(algorithm, B=...)" in text


def test_an_unknown_keyword_is_one_line():
    with pytest.raises(InputError, match=r"^hierarchy takes .*unexpected keyword argument 'devic'$"):
        hierarchy("flash2", N=16, d=4, M=600, devic="H100")


def _same(a, b) -> None:
    timeless = {**a.as_dict(), "seconds": 0}
    assert timeless == {**b.as_dict(), "seconds": 0}


@pytest.mark.parametrize(
    ("problem", "schedule", "machine", "M"),
    [
        (Problem(B=2, H_q=2, N=48, d=8), Schedule("flash2", Br=8, Bc=16), Machine(P=3, C=256, L=4), 2000),
        (Problem(H_q=2, N=40, d=8, causal=True), Schedule("flash2", backward=True, Br=8, Bc=8),
         Machine(P=2, C=128, L=4), 2000),
        (Problem(B=2, H_q=4, H_kv=2, N_q=6, N_k=40, d=8), Schedule("flash1", gqa="packed", Br=4, Bc=8),
         Machine(P=2, C=512, L=8, blocks_per_sm=2), 4000),
        (Problem(H_q=4, H_kv=1, N_q=1, N_k=300, d=16), Schedule("flash2", splits=3, Bc=32),
         Machine(P=4, C=1024, L=8, partitions=2, home_lines=2), 20_000),
    ],
    ids=["forward", "backward", "gqa-packed", "split-kv"],
)  # fmt: skip
def test_the_keyword_form_and_the_objects_form_are_one_launch(problem, schedule, machine, M):  # noqa: N803
    """hierarchy(schedule, problem=, M=, device=) and hierarchy(problem, schedule, device or M): the same result;
    with no L2 (C = 0) its DRAM is iosim.run's two-level count of the same schedule, word for word."""
    a = hierarchy(schedule, problem=problem, M=M, device=machine)
    b = hierarchy(problem, schedule, M, device=machine)
    c = hierarchy(problem, schedule, machine, M=M)
    _same(a, b)
    _same(a, c)
    assert a.gqa == schedule.gqa and a.splits == schedule.splits and a.backward == schedule.backward
    flat = hierarchy(problem, schedule, M, device=dataclasses.replace(machine, C=0, partitions=None))
    run = iosim.run(problem, schedule, M, count_only=True)
    assert (
        flat.schedule_dram == flat.two_level == run.passes["backward" if schedule.backward else "forward"].stats.total
    )


def test_a_name_or_a_device_is_the_preset_machine():
    kw = dict(N=64, d=16, M=4096)
    h = hierarchy("flash2", **kw, device="H100")
    _same(h, hierarchy("flash2", **kw, device=Machine("H100")))
    _same(h, hierarchy("flash2", **kw, device=device("H100")))
    assert (h.P, h.C, h.L, h.device) == (132, 50 * 1024 * 1024 // 2, 64, "H100")


def test_a_scheduler_that_only_orders_is_the_order():
    """Scheduler(order=X) with nothing else is block order X (no plan), reported as the result's order."""
    kw = dict(N=32, d=8, M=2000, B=2, H_q=2, device=Machine(P=3, C=128, L=4))
    for order in ("grid", "head-grouped", "swizzled"):
        assert hierarchy("flash2", **kw, scheduler=Scheduler(order=order)).order == order
    _same(hierarchy("flash2", **kw), hierarchy("flash2", **kw, scheduler=Scheduler()))


@pytest.mark.parametrize(
    ("make", "parameter"),
    [
        (lambda: Machine(P=0, C=16), "P (SMs)"),
        (lambda: Machine(C=-1), "C (L2 words)"),
        (lambda: Machine(C=16, L=3), "L (line words)"),
        (lambda: Machine(C=16, L=True), "L (line words)"),
        (lambda: Machine(C=16, blocks_per_sm=33), "blocks_per_sm"),
        (lambda: Machine("Z80"), "device"),
        (lambda: Machine(3.5), "device"),
        (lambda: Machine(C=16, partitions="device"), "l2_partitions"),
        (lambda: Machine(C=16, partitions=0), "l2_partitions"),
        (lambda: Machine(C=16, home_lines=0), "home_lines"),
        (lambda: Machine(C=16, sector_bytes="device"), "sector_bytes"),
        (lambda: Machine(C=16, sector_bytes=0), "sector_bytes"),
        (lambda: Machine(C=16, kernel=dict(threads=128, smem_bytes=0)), "kernel"),  # no preset
        (lambda: Machine("H100", kernel=5), "kernel"),
        (lambda: Scheduler(order="zigzag"), "order"),
        (lambda: Scheduler(walk="sideways"), "walk"),
        (lambda: hierarchy("flash2", N=16, d=4, M=600, device=5), "device"),
        (lambda: hierarchy("flash2", N=16, d=4, M=600, device=Machine(C=0), scheduler=object()), "scheduler"),
        (lambda: hierarchy(Problem(N=16, d=4), "flash2", "H100", device="A100"), "device"),
        (lambda: hierarchy(Problem(N=16, d=4), "flash2", 600, M=600, device=Machine(C=0)), "M"),
        (lambda: hierarchy("flash2", N=16, d=4, M=600, device=Machine(P=2, C=16, partitions=4)), "l2_partitions"),
    ],
)
def test_a_bad_machine_or_scheduler_is_one_line_naming_it(make, parameter):
    with pytest.raises(InputError) as e:
        make()
    assert e.value.parameter == parameter and "\n" not in str(e.value)
