"""iosim show: the pictures come from the trace (heat maps sum to the counts), every view draws, --text needs no
matplotlib."""

import numpy as np
import pytest
from iosim.memory_model.core import LOAD, STORE

import iosim
from iosim import InputError
from iosim.cli import main
from iosim.cli import show as show_cmd
from iosim.views import show


@pytest.fixture(scope="module")
def run():
    return iosim.run("flash1", N=40, d=6, M=300, count_only=True, trace=True, causal=True)


def test_heat_maps_sum_to_the_per_array_counts(run):
    for name in show.slow_arrays(run.trace):
        c = run.stats.per_array[name]
        assert show.heat(run.trace, name, LOAD).sum() == c.reads
        assert show.heat(run.trace, name, STORE).sum() == c.writes  # initialisation included


def test_aggregated_heat_map_keeps_the_total(monkeypatch, run):
    monkeypatch.setattr(show, "MAX_CELLS", 7)
    h = show.heat(run.trace, "K", LOAD)
    assert h.shape[0] <= 7
    gr, gc, fr, fc = show._grid(run.trace.shapes["K"])
    assert np.isclose(h.sum() * fr * fc, run.stats.per_array["K"].reads)
    monkeypatch.setattr(show, "EXACT_WORDS", 0)  # the path for arrays too large to count per word
    assert np.isclose(show.heat(run.trace, "K", LOAD).sum() * fr * fc, run.stats.per_array["K"].reads)


def test_residency_timeline_ends_empty_and_peaks_at_the_peak(run):
    names, res = show.residency(run.trace)
    assert res[-1].sum() == 0
    assert res.sum(axis=1).max() == run.stats.peak <= 300


def test_stepper_totals_equal_the_counts_at_the_end(run):
    st = show.Stepper(run.trace)
    st.advance(len(run.trace) - 1)
    assert (st.reads, st.writes) == (run.stats.reads, run.stats.writes) and not st.live


@pytest.mark.parametrize("view", ["tiles", "timeline", "step"])
def test_every_view_draws(view, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "x.png"
    assert main(["show", "square-tiling", "--N", "24", "--d", "4", "--M", "200", "--view", view, "-o", str(out)]) == 0
    assert out.stat().st_size > 1000


def test_animation_is_a_gif(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(show, "MAX_FRAMES", 4)
    out = tmp_path / "a.gif"
    assert main(["show", "flash2", "--N", "16", "--d", "4", "--M", "200", "--view", "animate", "-o", str(out)]) == 0
    assert out.read_bytes()[:3] == b"GIF"


def test_text_step_through(capsys):
    assert main(["show", "flash2", "--N", "32", "--d", "4", "--M", "200", "--text", "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert "step 0: load Q[0:" in out and "more events" in out
    assert main(["show", "flash2", "--N", "32", "--d", "4", "--M", "200", "--text", "--step", "6"]) == 0
    assert "#" in capsys.readouterr().out


def test_bad_step_and_missing_output():
    with pytest.raises(SystemExit) as e:
        main(["show", "flash2", "--N", "32", "--d", "4", "--M", "200", "--text", "--step", "x"])
    assert e.value.code == 2
    assert main(["show", "flash2", "--N", "32", "--d", "4", "--M", "200", "--text", "--step", "100000"]) == 2
    assert main(["show", "flash2", "--N", "32", "--d", "4", "--M", "200"]) == 2
    with pytest.raises(InputError):
        show_cmd.command(type("A", (), {"text": False, "output": None})())


def test_every_array_of_a_backward_has_its_own_colour():
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    from iosim.views.show import array_colours

    r = iosim.run("flash2", N=32, d=8, M=600, backward=True, trace=True, count_only=True)
    colours = array_colours(r.trace.names)
    assert len(r.trace.names) >= 12 and len(set(colours.values())) == len(r.trace.names)


def test_the_tiles_view_has_one_scale_per_row(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    import matplotlib.axes

    seen = []
    real = matplotlib.axes.Axes.imshow

    def imshow(self, X, *args, **kwargs):
        seen.append(kwargs.get("vmax"))
        return real(self, X, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", imshow)
    r = iosim.run("flash1", N=64, d=8, M=600, causal=True, trace=True, count_only=True)
    from iosim.views.show import draw_tiles

    draw_tiles(r, tmp_path / "t.png")
    n = len(seen) // 2
    assert len(set(seen[:n])) == 1 and len(set(seen[n:])) == 1  # reads on one scale, writes on one scale
    top = max(show.heat(r.trace, a, LOAD).max() for a in show.slow_arrays(r.trace))
    assert seen[0] == top > show.heat(r.trace, "K", LOAD).max() == 1  # K (read once) is drawn on Q's scale
