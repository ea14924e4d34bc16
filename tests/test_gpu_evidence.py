"""The GPU evidence (experiments/bench/gpu_evidence*.py): the ncu CSV plumbing, the sweep's configurations, and the
tables the README and docs/gpu.md show, printed again from the stored H100 measurements (no GPU needed)."""

import importlib.util
import pathlib

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


SAMPLE = BENCH / "gpu_h100" / "raw-sample"
KEPT = {"ncu-sweep": {0, 1}, "ncu-triton": {3, 4}}  # the labels whose launches the raw sample holds


@pytest.fixture(scope="module")
def ncu_raw(evidence):
    import ncu_raw

    return ncu_raw


@pytest.mark.parametrize("part", sorted(KEPT))
def test_repack_of_a_raw_ncu_csv_equals_the_stored_records(ncu_raw, part):
    """The raw sample (ncu's CSV layout, made from the stored launches by raw-sample/make_sample.py) repacks to
    exactly the stored records of its labels: markers dropped, labels from the marker's grid, names cut at 200."""
    import json

    stored = json.loads((BENCH / "gpu_h100" / f"{part}.json").read_text())
    got = ncu_raw.rebuild(SAMPLE, part, stored["metrics"])
    assert got["labels"] == stored["labels"]
    assert got["launches"] == [r for r in stored["launches"] if r["label"] in KEPT[part]]
    assert got["rc"] == 0 and got["stderr"] == "" and got["unlabelled launches"] == 0
    # the requested metric no stored launch has is named, with why
    assert got["absent metrics"] == {"l1tex__t_bytes_pipe_lsu_mem_global_op_ldgsts.sum": ["not in ncu's output"]}


def _raw(*launches) -> str:
    """An ncu CSV log: (id, kernel, grid, metric, unit, value) rows in ncu's 15 columns."""
    head = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]  # fmt: skip
    rows = [[i, 9, "p", "h", k, 1, 7, "(128, 1, 1)", g, 0, "9.0", "s", m, u, v] for i, k, g, m, u, v in launches]
    return "==PROF== Connected to process 9\n" + "\n".join(",".join(f'"{c}"' for c in r) for r in [head, *rows])


RAW = _raw(
    (0, "k_before_any_marker", "(1, 1, 1)", "dram__bytes_read.sum", "byte", "5"),
    (1, "x::iosim_marker[v1]", "(2, 1, 1)", "dram__bytes_read.sum", "byte", "8"),
    (2, "NAME", "(4, 2, 1)", "dram__bytes_read.sum", "byte", "1,048,576"),
    (2, "NAME", "(4, 2, 1)", "lts__t_sectors_srcunit_tex_op_read.sum", "sector", "n/a"),
    (3, "x::iosim_marker[v1]", "(9, 1, 1)", "dram__bytes_read.sum", "byte", "8"),
    (4, "after_a_marker_without_label", "(1, 1, 1)", "dram__bytes_read.sum", "byte", "5"),
)


def test_repack_drops_markers_and_names_what_it_could_not_keep(ncu_raw):
    text = RAW.replace("NAME", "k" * 250)
    wanted = ["dram__bytes_read.sum", "lts__t_sectors_srcunit_tex_op_read.sum", "launch__registers_per_thread"]
    got = ncu_raw.repack(text, [{"a": 1}, {"b": 2}], wanted, rc=3, stderr="x" * 4000)
    assert got["launches"] == [{"label": 1, "kernel": "k" * 200, "grid": "(4, 2, 1)", "block": "(128, 1, 1)",
                                "dram__bytes_read.sum": 1048576.0}]  # fmt: skip
    assert got["unlabelled launches"] == 2  # one before any marker, one after a marker with no label (index 8)
    assert got["absent metrics"] == {"lts__t_sectors_srcunit_tex_op_read.sum": ["n/a"],
                                     "launch__registers_per_thread": ["not in ncu's output"]}  # fmt: skip
    assert got["rc"] == 3 and got["stderr"] == "x" * 3000


def test_metrics_ncu_does_not_offer_are_set_apart(ncu_raw):
    query = """Device GH100 (gh100)
------------------------------------------------------------------------------
Metric Name                                 Metric Description
dram__bytes_read                            # of bytes read from DRAM
lts__t_sectors_srcunit_tex_op_read          # of LTS sectors from unit TEX for reads
"""
    wanted = ["dram__bytes_read.sum", "lts__t_sectors_srcunit_tex_op_read.sum"]
    wanted += ["lts__t_sectors_srcunit_ltcfabric_op_read.sum"]
    assert ncu_raw.split_offered(wanted, query) == (wanted[:2], wanted[2:])
    assert ncu_raw.split_offered(wanted, "") == (wanted, [])  # no list: ask for all, ncu's own output says
    # launch statistics are not in the counters' list (the H200 lease dropped FA2's registers that way): kept
    launch = ["launch__registers_per_thread", "launch__occupancy_limit_registers"]
    assert ncu_raw.split_offered(wanted + launch, query) == (wanted[:2] + launch, wanted[2:])


def test_part_ncu_stores_the_raw_output_and_the_report_reads_its_file(evidence, report, tmp_path, monkeypatch):
    """What part_ncu writes is what the report reads (it once wrote a shape the report could not: KeyError
    'labels'), and the profiler's CSV, return code and stderr are kept byte for byte under raw/."""
    import json
    import types

    text = (SAMPLE / "ncu-triton.csv").read_text()
    labels = json.loads((SAMPLE / "ncu-triton.labels.json").read_text())
    (tmp_path / "labels-triton.json").write_text("[]")  # an earlier run's: removed before ncu starts

    def fake_ncu(part, args, metrics, timeout=None):  # ncu's child writes the labels as it launches
        (tmp_path / "labels-triton.json").write_text(json.dumps(labels))
        return text, "out", "warn\n", 0

    monkeypatch.setattr(evidence, "query_metrics", lambda part, args: "")
    monkeypatch.setattr(evidence, "run_ncu", fake_ncu)
    args = types.SimpleNamespace(out=tmp_path, predictions=tmp_path / "none.json", budget=60)
    (tmp_path / "raw").mkdir()
    data = evidence.part_ncu("ncu-triton", args)
    assert (tmp_path / "raw" / "ncu-triton.csv").read_text() == text
    assert (tmp_path / "raw" / "ncu-triton.rc").read_text() == "0\n"
    assert (tmp_path / "raw" / "ncu-triton.stderr").read_text() == "warn\n"
    rows = report.per_label(data)
    assert [r["label"] for r in data["launches"]] == [3, 4, 4, 4]
    assert rows[3]["kernels"] == ["parallel_attn_fwd_kernel"] and len(rows[4]["kernels"]) == 3


def test_a_part_past_its_budget_is_killed_with_its_children(evidence):
    """ncu runs the profiled Python as its child: at the budget both go, or the pipes stay open and the part hangs."""
    import subprocess

    p = subprocess.Popen(["bash", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    grandchild = int(p.stdout.readline())
    evidence._kill_tree(p.pid)
    assert p.wait(timeout=10) == -9
    stat = pathlib.Path(f"/proc/{grandchild}/stat")
    for _ in range(50):  # killed: gone, or a zombie until its new parent reaps it
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        __import__("time").sleep(0.1)
    else:
        raise AssertionError(f"process {grandchild} still running")


def test_the_lease_plan_dry_run_needs_no_gpu(evidence, capsys):
    assert evidence.main(["run-all", "--dry-run"]) == 0
    out = capsys.readouterr().out
    for part in evidence.DEFAULT_PLAN:
        assert f" {part} " in out
    steps = evidence.plan(evidence.DEFAULT_PLAN, evidence.DEFAULT_LIMIT)
    start = {p: t for p, _, t in steps}
    # the parts that answer this issue start within the first nine minutes even if every earlier one runs to its limit
    for part in ("ncu-query", "predictions", "ncu-fa2", "tests", "m-top", "sweep-backward"):
        assert start[part] + evidence.CATALOG[part][0] <= evidence.DEFAULT_LIMIT, part
    assert evidence.part_argv("tests", 70, None)[-2:] == ["tests/test_cuda.py", "tests/test_cuda_fast.py"]


def test_the_lease_script_dry_run(tmp_path):
    import os
    import subprocess

    p = subprocess.run(["bash", str(BENCH / "gpu_evidence.sh"), "--dry-run"], capture_output=True, text=True,
                       cwd=ROOT, env={"PATH": os.environ["PATH"], "W": str(tmp_path)}, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("plan: ") and "predictions" in p.stdout
    assert not any(tmp_path.iterdir())  # a dry run writes nothing


def test_backward_sweep_covers_the_forward_grid_largest_m_first(evidence):
    top = 58112 - 256
    back = evidence.backward_configs(top)
    fwd = {(c["d"], c["M"]) for c in evidence.sweep_configs(top) if c["kernel"] == "flash2"}
    assert {(c["d"], c["M"]) for c in back} == fwd and len(back) == len(fwd)
    ratios = [c["M"] / c["d"] ** 2 for c in back]
    assert ratios == sorted(ratios, reverse=True) and {c["kernel"] for c in back} == {"flash2-backward"}


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
    assert "with iosim's own register count (the resource report) 36 of 52, each miss off by 1 block" in text
    # every Triton kernel both sides: iosim kernel's read bytes equal the hardware's global load bytes
    rows = report.triton_table().splitlines()[2:]
    assert len(rows) == 4
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] == cells[2] and cells[3] == "1.0000", line


def test_readme_and_docs_generated_blocks_are_the_reports(report):
    """Every table and every number of the prose in docs/gpu.md's "Measured on an H100" and the README's "Measured
    on a GPU" sits in a generated block; each block equals what the report prints from the stored files."""
    for name, blocks in report.BLOCKS.items():
        text = (ROOT / name).read_text()
        for start, end, make in blocks:
            assert report.block(text, start, end) == make().strip(), (name, start)
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Measured on a GPU") : readme.index("## Python API")]
    assert report.block(readme, "<!-- gpu-evidence: readme -->", "<!-- /gpu-evidence -->") in section


def _stored(name):
    import json

    return json.loads((BENCH / "gpu_h100" / f"{name}.json").read_text())


def test_prose_numbers_against_the_stored_files_read_here(report):
    """The corrected sentences, each figure recomputed here from the stored JSON without the report's code."""
    prose = " ".join(report.prose().split())  # the bullets are wrapped at 116 characters
    # fla's stores: the launch's global store bytes less iosim kernel's counted write bytes = 7 copies of L
    ncu, counts = _stored("ncu-triton"), _stored("cpu-side")["kernel counts"]["fla parallel_attn causal"]
    fla = next(r for r in ncu["launches"] if ncu["labels"][r["label"]].get("dtype") == "float16"
               and r["kernel"].startswith("parallel_attn"))  # fmt: skip
    written = sum(a["write_bytes"] for a in counts["per_array"].values())
    extra = fla["l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum"] - written
    assert extra == 7 * counts["per_array"]["L"]["write_bytes"] == 1_835_008
    assert f"{extra:,.0f} bytes more, 7 extra copies" in prose
    # flash2 from Br = 7 up: DRAM bytes above Q, K, V, O, L (4 B H N (4 d + 1) bytes) exactly once
    sweep = {(r["kernel"], r["d"], r["M"]): r for r in _stored("sweep")["rows"]}
    over = []
    ncu = _stored("ncu-sweep")
    for lab_i, lab in enumerate(ncu["labels"]):
        r = sweep[(lab["kernel"], lab["d"], lab["M"])]
        if lab["kernel"] != "flash2" or int(r["tiling"].split("Br=")[1].split(",")[0]) < 7:
            continue
        dram = sum(
            x["dram__bytes_read.sum"] + x["dram__bytes_write.sum"] for x in ncu["launches"] if x["label"] == lab_i
        )
        if dram > 4 * lab["BH"] * lab["N"] * (4 * lab["d"] + 1):
            over.append((lab["d"], lab["M"], round(dram / 1e6, 1)))
    assert over == [(256, 8192, 68.1)] and "above them once (68.1 against 67.2 MB at d = 256, M = 8,192)" in prose
    # no sweep launch above 2 % of 3.35 TB/s nor 2.5 % of 67 TFLOP/s
    for lab_i, lab in enumerate(ncu["labels"]):
        ks = [x for x in ncu["launches"] if x["label"] == lab_i]
        gbs = sum(x["dram__bytes_read.sum"] + x["dram__bytes_write.sum"] for x in ks) / sum(
            x["gpu__time_duration.sum"] for x in ks)  # fmt: skip
        tflops = 4 * lab["BH"] * lab["N"] ** 2 * lab["d"] / sweep[(lab["kernel"], lab["d"], lab["M"])]["ms"] / 1e9
        assert gbs < 0.02 * 3350 and tflops < 0.025 * 67, lab
    assert "1.8 % of the H100's HBM bandwidth" in prose and "2.5 % of its FP32 peak" in prose
    assert "Below d², the algorithm that moves fewer words is faster" not in (ROOT / "docs" / "gpu.md").read_text()


def test_figure_is_written(report, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "sweep.png"
    report.figure(out)
    assert out.stat().st_size > 10_000


@pytest.fixture(scope="module")
def predictions(evidence):
    import gpu_predictions

    return gpu_predictions


def _entry(**kw):
    e = {"id": "fa2-fwd", "what": "FA2 forward", "backend": "sdpa-flash", "B": 1, "H_q": 4, "H_kv": 2, "N_q": 256,
         "N_k": 256, "d": 64, "causal": True, "dtype": "float16", "order": "ascending",
         "predicted": {"dram_read": 1_000_000, "l2_read_from_sm": 3_200_000}}  # fmt: skip
    return {**e, **kw}


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"backend": "triton"}, "backend"),
        ({"dtype": "int8"}, "dtype"),
        ({"H_kv": 3}, "H_kv"),
        ({"N_q": 0}, "N_q"),
        ({"predicted": {"hbm": 1}}, "predicted"),
        ({"backend": "iosim-cuda", "dtype": "float32", "H_kv": 4}, "M"),
        ({"backend": "copy"}, "bytes"),
        ({"pass": "both"}, "pass"),
    ],
)
def test_a_bad_predictions_entry_names_its_field(predictions, bad, field):
    from iosim.base.errors import InputError

    with pytest.raises(InputError, match=f"'fa2-fwd': {field}"):
        predictions.check(_entry(**bad))


def test_predictions_file_and_the_metrics_it_asks_for(predictions, tmp_path):
    import json

    from iosim.base.errors import InputError

    assert predictions.load(tmp_path / "absent.json") == []
    path = tmp_path / "h100.json"
    path.write_text(json.dumps({"device": "H100", "entries": [_entry(), _entry(id="copy-40MB", backend="copy",
                                bytes=40_000_000, predicted={"dram_read": 40_000_000})]}))  # fmt: skip
    entries = predictions.load(path)
    assert entries[0]["pass"] == "forward" and entries[0]["gqa"] == "packed"
    assert predictions.metrics_for(entries) == ["gpu__time_duration.sum", "dram__bytes_read.sum",
                                                "lts__t_sectors_srcunit_tex_op_read.sum"]  # fmt: skip
    path.write_text(json.dumps({"entries": [_entry(), _entry()]}))
    with pytest.raises(InputError, match="unique"):
        predictions.load(path)


def test_predictions_are_compared_as_measured(evidence, report, predictions, tmp_path, monkeypatch):
    """A lease's raw predictions output (ncu's CSV) through the report: bytes per level from the metrics, 32 bytes a
    sector, summed over the launch's kernels; an entry that did not launch reads 'not measured'."""
    import json

    entries = [predictions.check(_entry()), predictions.check(_entry(id="never-ran"))]
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "predictions.entries.json").write_text(json.dumps(entries))
    (raw / "predictions.labels.json").write_text(json.dumps([{"id": "fa2-fwd"}]))
    (raw / "predictions.csv").write_text(_raw(
        (0, "iosim_marker", "(1, 1, 1)", "dram__bytes_read.sum", "byte", "0"),
        (1, "flash_fwd_kernel", "(8, 4, 1)", "dram__bytes_read.sum", "byte", "900,000"),
        (1, "flash_fwd_kernel", "(8, 4, 1)", "lts__t_sectors_srcunit_tex_op_read.sum", "sector", "50,000"),
        (2, "flash_fwd_combine", "(4, 1, 1)", "dram__bytes_read.sum", "byte", "100,000"),
        (2, "flash_fwd_combine", "(4, 1, 1)", "lts__t_sectors_srcunit_tex_op_read.sum", "sector", "25,000"),
        (3, "void at::elementwise_kernel<128, 4>", "(9, 1, 1)", "dram__bytes_read.sum", "byte", "7,000,000"),
    ))  # fmt: skip
    monkeypatch.setattr(report, "DATA", tmp_path)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in report.predictions_table().splitlines()[2:]]
    assert rows == [
        ["fa2-fwd", "dram_read", "1.0", "1.0", "1.00", "2"],  # 900,000 + 100,000 bytes; PyTorch's copy left out
        ["fa2-fwd", "l2_read_from_sm", "3.2", "2.4", "0.75", "2"],  # 32 x 75,000 sectors
        ["never-ran", "dram_read", "1.0", "not measured", "-", "0"],
        ["never-ran", "l2_read_from_sm", "3.2", "not measured", "-", "0"],
    ]


def _brute_sectors(c0, nr, nc, row):
    """Distinct 32-byte sectors per warp of 32 consecutive elements of an nr x nc tile from column c0 (rows of
    ``row`` words), element by element: one request per 32 elements, no unroll split."""
    per_warp = {}
    for e in range(nr * nc):
        r, c = divmod(e, nc)
        per_warp.setdefault(e // 32, set()).add((r * row + c0 + c) * 4 // 32)
    return sum(len(s) for s in per_warp.values())


def test_sector_section_equals_the_stored_lsu_bytes_on_every_launch(report):
    """The report's LSU section (iosim.hierarchy.lsu): on every stored launch, flash2's and both square tiling
    kernels', the model's load and store bytes equal Nsight Compute's, read here from ncu-sweep.json. flash2's
    model is also held against a closed form written here: Q once, K and V per tile pair, whole rows of d words (d a
    multiple of 8: no rounding, no split), the block mask read twice per tile pair by each warp (one sector), O in
    rows and L as a vector of Br words per row block."""
    ncu, cfg = _stored("ncu-sweep"), _stored("sweep")
    sweep = {(r["kernel"], r["d"], r["M"]): r for r in cfg["rows"]}
    rows = report.sector_rows()
    assert len(rows) == len(ncu["launches"]) == 62
    parts = {"flash2_forward_kernel": "forward", "square_phase1_kernel": "phase 1", "square_phase2_kernel": "phase 2"}
    warps = cfg["threads"] // 32
    for r, k in zip(rows, ncu["launches"], strict=True):
        lab = ncu["labels"][k["label"]]
        name = next(p for p in parts if f"::{p}[" in k["kernel"])
        assert (r["kernel"], r["part"], r["d"], r["M"]) == (lab["kernel"], parts[name], lab["d"], lab["M"])
        got = (k["l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"], k["l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum"])
        assert (r["ld"], r["st"]) == got and (r["ld model"], r["st model"]) == got, (lab, name)
        if name == "flash2_forward_kernel":
            N, d, BH, tiling = lab["N"], lab["d"], lab["BH"], sweep[(lab["kernel"], lab["d"], lab["M"])]["tiling"]
            Br, Bc = (int(tiling.split(f"{t}=")[1].split(",")[0]) for t in ("Br", "Bc"))
            Tr, Tc = -(-N // Br), -(-N // Bc)
            assert got[0] == BH * (4 * (N * d + 2 * Tr * N * d) + 32 * 2 * warps * Tr * Tc), lab
            L = sum(_brute_sectors(i * Br % 8, 1, min(Br, N - i * Br), N) for i in range(Tr))
            assert got[1] == BH * (4 * N * d + 32 * L), lab
    text = report.report()
    table = text[text.index("| kernel                | launches") :].split("\n\n")[0].splitlines()[2:]
    cells = [[c.strip() for c in line.strip("|").split("|")][:3] for line in table]
    want = [["flash2", "20", "20"], ["square-tiling phase 1", "21", "21"], ["square-tiling phase 2", "21", "21"]]
    assert cells == want  # launches, and launches whose load and store bytes equal the model
    prose = " ".join(report.prose().split())
    assert "exactly in 62 of 62 kernel launches (20 of 20 flash2, 42 of 42 square tiling)" in prose
    assert "hierarchy-hardware.md#the-lsu-level" in prose
    for name in ("README.md", "docs/gpu.md"):  # the sector model lives in one place
        assert "gpu_sectors" not in (ROOT / name).read_text() and "never less" not in (ROOT / name).read_text()


def test_report_of_a_lease_that_stored_only_some_parts(report, tmp_path, monkeypatch):
    """--data of a later lease: the sections whose files are stored, the rest left out (no KeyError, no crash)."""
    import shutil

    for name in ("env", "sweep", "ncu-sweep", "occupancy"):
        shutil.copy(BENCH / "gpu_h100" / f"{name}.json", tmp_path)
    monkeypatch.setattr(report, "DATA", tmp_path)
    text = report.report()
    assert "### flash2 against square tiling as M shrinks" in text and "### The driver's figures" in text
    assert "SDPA (float32)" not in text and "Triton" not in text and "registered predictions" not in text
    row = next(line for line in text.splitlines() if line.startswith("| 128 | 16,384"))
    assert row.split("|")[4].strip() == "-"  # no scalar-build run stored: its column is empty


def test_bad_command_lines_are_one_line_and_exit_2(evidence, report, capsys, tmp_path):
    assert evidence.main(["run-all", "--dry-run", "--parts", "env", "nope"]) == 2
    assert evidence.main(["nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("gpu_evidence.py: error: ") for line in err)
    assert "--parts" in err[0] and "'nope'" in err[0]
    with pytest.raises(SystemExit) as e:
        report.main(["--data", str(tmp_path)])
    assert e.value.code == 2 and "--data must be a folder" in capsys.readouterr().err


def test_the_forward_sweep_runs_largest_m_first_with_both_kernels_of_a_point_together(evidence):
    configs = evidence.sweep_configs(58112 - 256)
    ratios = [c["M"] / c["d"] ** 2 for c in configs]
    assert ratios == sorted(ratios, reverse=True)
    for a, b in zip(configs[::2], configs[1::2], strict=True):  # flash2 and square tiling of one (d, M) adjacent
        assert (a["d"], a["M"]) == (b["d"], b["M"]) and {a["kernel"], b["kernel"]} == set(evidence.SWEEP_KERNELS)


def test_a_part_may_carry_its_own_limit(evidence):
    steps = evidence.plan(["env", "tests=150", "m-top=40"], 300)
    assert steps == [("env", 20, 0), ("tests", 150, 20), ("m-top", 40, 170)]
    for bad in ("tests=5", "tests=601", "tests=x"):
        with pytest.raises(evidence.InputError, match="name=SECONDS"):
            evidence.plan([bad], 300)
    with pytest.raises(evidence.InputError, match="must name parts"):
        evidence.plan(["nope=30"], 300)


def test_a_profiling_child_stops_launching_at_its_budget(evidence, tmp_path, monkeypatch):
    """Marked profiles nothing past its budget (so ncu, whose CSV comes when the child ends, prints what it has)."""

    class FakeCuda:  # what Marked uses of numba.cuda: no profiler (as the CUDA simulator)
        def synchronize(self):
            pass

        def to_device(self, a):
            return a

    calls = []

    class Grid:  # the marker kernel: kernel[grid, block](buf)
        def __getitem__(self, key):
            return lambda buf: calls.append(("marker", key[0]))

    monkeypatch.setattr(evidence, "_cuda", FakeCuda)
    monkeypatch.setattr(evidence, "_marker_kernel", lambda cuda: Grid())
    mk = evidence.Marked(tmp_path / "labels.json", budget=1e9)
    mk.run({"id": 1}, lambda: calls.append("launch"))
    assert not mk.expired() and calls[-2:] == [("marker", 1), "launch"]
    mk.deadline = evidence.time.monotonic() - 1  # the budget spent
    mk.run({"id": 2}, lambda: calls.append("launch"))
    assert mk.expired() and calls.count("launch") == 1
    assert [x["id"] for x in __import__("json").loads((tmp_path / "labels.json").read_text())] == [1]


def test_a_profiled_child_keeps_most_of_a_short_budget(evidence):
    assert evidence.child_budget(100) == 85  # the margin
    assert evidence.child_budget(17) == 17 * 0.75  # a short part: a quarter at most (the margin would leave 2 s)
    assert evidence.child_budget(1) == 1.0


def test_the_predictions_part_asks_for_the_metrics_of_the_file_it_measures(evidence, tmp_path):
    import json
    import types

    h200 = BENCH / "predictions" / "h200.json"
    wanted = evidence.NCU_PARTS["predictions"][1](types.SimpleNamespace(predictions=h200))
    levels = {lv for e in json.loads(h200.read_text())["entries"] for lv in e["predicted"]}
    assert "l1_reduction" in levels and "l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum" in wanted
