"""The GPU evidence (experiments/bench/gpu_evidence*.py): the ncu CSV plumbing, the sweep's configurations, and the
tables the README and docs/gpu.md show, printed again from the stored H100 measurements (no GPU needed)."""

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "experiments" / "bench"


def _module(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def evidence():
    import sys

    sys.path.insert(0, str(BENCH))  # gpu_evidence imports its neighbour gpu.py lazily
    try:
        yield _module("gpu_evidence")
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def report():
    return _module("gpu_evidence_report")


CSV = """==PROF== Connected to process 1
"ID","Process ID","Kernel Name","Grid Size","Block Size","Metric Name","Metric Unit","Metric Value"
"0","7","iosim_marker","(1, 1, 1)","(32, 1, 1)","dram__bytes_read.sum","byte","8"
"1","7","flash2_forward_kernel","(4, 2, 1)","(128, 1, 1)","dram__bytes_read.sum","byte","1,048,576"
"1","7","flash2_forward_kernel","(4, 2, 1)","(128, 1, 1)","gpu__time_duration.sum","nsecond","2,500"
"2","7","iosim_marker","(2, 1, 1)","(32, 1, 1)","dram__bytes_read.sum","byte","8"
"3","7","square_phase1_kernel","(9, 1, 1)","(128, 1, 1)","dram__bytes_read.sum","byte","100"
"4","7","square_phase2_kernel","(9, 1, 1)","(128, 1, 1)","dram__bytes_read.sum","byte","23"
"""


def test_ncu_rows_are_grouped_by_the_marker_before_them(evidence):
    launches = evidence.parse_ncu_csv(CSV)
    assert [r["id"] for r in launches] == [0, 1, 2, 3, 4]
    assert launches[1]["dram__bytes_read.sum"] == 1048576.0 and launches[1]["grid"] == "(4, 2, 1)"
    rows = evidence.group_by_marker(launches, [{"k": "a"}, {"k": "b"}])
    assert rows[0]["kernels"] == ["flash2_forward_kernel"] and rows[0]["dram__bytes_read.sum"] == 1048576.0
    assert rows[0]["gpu__time_duration.sum"] == 2500.0
    assert rows[1]["launches"] == 2 and rows[1]["dram__bytes_read.sum"] == 123.0


def test_sweep_runs_from_d2_over_16_to_the_largest_block(evidence):
    top = 58112 - 256
    configs = evidence.sweep_configs(top)
    for d in evidence.SWEEP_D:
        Ms = sorted({c["M"] for c in configs if c["d"] == d})
        assert Ms[0] == d * d // 16 and Ms[-1] == top
        assert all(b == 2 * a for a, b in zip(Ms[:-2], Ms[1:-1], strict=True)) and Ms[-2] < top
        assert {c["kernel"] for c in configs if c["d"] == d} == {"flash2", "square-tiling"}


def test_report_prints_from_the_stored_measurements(report):
    text = report.report()
    assert "41 of 41 launches: the kernels' own counters equal the simulator's per array" in text
    assert "52 of 52 (kernel, d, M) launches" in text
    # every Triton kernel both sides: iosim kernel's read bytes equal the hardware's global load bytes
    rows = report.triton_table().splitlines()[2:]
    assert len(rows) == 4
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] == cells[2] and cells[3] == "1.0000", line


def _block(text, start, end):
    m = re.search(re.escape(start) + r"\n(.*?)\n" + re.escape(end), text, flags=re.S)
    assert m, start
    return m.group(1).strip()


def test_readme_and_docs_tables_are_the_reports(report):
    readme = (ROOT / "README.md").read_text()
    assert _block(readme, "<!-- gpu-evidence: sweep d=128 -->", "<!-- /gpu-evidence -->") == report.sweep_table(128)
    docs = (ROOT / "docs" / "gpu.md").read_text()
    assert _block(docs, "<!-- gpu-evidence-report -->", "<!-- /gpu-evidence-report -->") == report.report().strip()


def test_figure_is_written(report, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "sweep.png"
    report.figure(out)
    assert out.stat().st_size > 10_000
