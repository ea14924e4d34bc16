"""Nsight Compute's raw output, stored as it came, and the one step that repacks it into the files the report reads.

A profiled part of ``gpu_evidence.py`` leaves, under ``DIR/raw/``:

    <part>.csv          ncu's ``--csv --print-units base`` log, byte for byte (``==PROF==`` lines included)
    <part>.rc           ncu's return code (one integer; -9 when the part's budget stopped it)
    <part>.stderr       ncu's standard error
    <part>.labels.json  one label per marker, in launch order (what each profiled launch was)
    <part>.metrics.txt  ``ncu --query-metrics`` of that device, asked before the part ran

``repack`` turns the CSV and the labels into ``DIR/<part>.json``: ``{"labels", "launches", "metrics", "ncu",
"absent metrics", "rc", "stderr"}``, each launch ``{"label", "kernel", "grid", "block", metric: value, ...}`` with
the marker launches taken out and every other launch given the index of the marker before it. The report reads only
that shape; ``rebuild`` makes it again from ``raw/`` so that every table can be traced to the profiler's own bytes.

The CSV layout is ncu's (one row per launch and metric; the columns ``gpu.py``'s parser reads are "ID", "Kernel
Name", "Grid Size", "Block Size", "Metric Name", "Metric Unit", "Metric Value"). A marker is a launch whose kernel
name contains ``iosim_marker``; its grid's x is the index + 1 of the label of the launches after it.
"""

from __future__ import annotations

import csv
import io
import json
import pathlib

MARKER = "iosim_marker"
NAME_CHARS = 200  # a launch keeps the first 200 characters of its kernel name (Triton's and CUTLASS's run to kB)
STDERR_CHARS = 3000
COMMAND = "ncu --csv --print-units base --profile-from-start off --clock-control none --metrics ..."
# ncu's columns, in its order (Nsight Compute 2025.3, --csv --page details); the parser below reads them by name
COLUMNS = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
           "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value")  # fmt: skip


def parse(text: str) -> list[dict]:
    """ncu --csv rows grouped by launch, in launch order: [{"id", "name", "grid", "block", metric: value}]; a value
    that is not a number (ncu prints ``n/a`` for a metric it cannot collect) is kept as its text."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    launches: dict[str, dict] = {}
    for rec in csv.DictReader(io.StringIO("\n".join(lines))):
        lid = rec.get("ID")
        if lid is None or not lid.isdigit():
            continue
        r = launches.setdefault(lid, {"id": int(lid), "name": rec.get("Kernel Name", ""), "grid": rec.get("Grid Size"),
                                      "block": rec.get("Block Size")})  # fmt: skip
        value = (rec.get("Metric Value") or "").replace(",", "")
        try:
            r[rec["Metric Name"]] = float(value)
        except (ValueError, KeyError):
            r[rec.get("Metric Name", "?")] = value
    return sorted(launches.values(), key=lambda r: r["id"])


def marker_index(launch: dict) -> int | None:
    """The label index a marker launch announces (grid x - 1), or None for a launch that is not a marker."""
    if MARKER not in launch["name"]:
        return None
    return int(str(launch["grid"]).strip("()").split(",")[0]) - 1


def repack(raw_csv_text: str, labels: list[dict], metrics=(), rc: int | None = None, stderr: str = "",
           command: str = COMMAND) -> dict:  # fmt: skip
    """The report's file from ncu's raw CSV: markers dropped, each launch labelled by the marker before it.

    Launches before the first marker, or after a marker whose index has no label, are not kept and are counted in
    ``"unlabelled launches"``. A requested metric that no launch reports, or that is not a number in every launch,
    is listed in ``"absent metrics"`` with what ncu printed for it (so a missing column has a recorded reason).
    """
    out, cur, unlabelled = [], None, 0
    printed: dict[str, set] = {}
    for r in parse(raw_csv_text):
        k = marker_index(r)
        if k is not None:
            cur = k if 0 <= k < len(labels) else None
            continue
        if cur is None:
            unlabelled += 1
            continue
        rec = {"label": cur, "kernel": r["name"][:NAME_CHARS], "grid": r["grid"], "block": r["block"]}
        for m, v in sorted(r.items()):
            if m in ("id", "name", "grid", "block"):
                continue
            if isinstance(v, float):
                rec[m] = v
            else:
                printed.setdefault(m, set()).add(v)
        out.append(rec)
    absent = {}
    for m in metrics:
        if not out or any(m not in rec for rec in out):
            absent[m] = sorted(printed.get(m, set())) or ["not in ncu's output"]
    return {"labels": list(labels), "launches": out, "metrics": list(metrics), "ncu": command,
            "absent metrics": absent, "unlabelled launches": unlabelled, "rc": rc,
            "stderr": stderr[-STDERR_CHARS:]}  # fmt: skip


def store_raw(raw: pathlib.Path, part: str, csv_text: str, rc: int, stderr: str, labels: list[dict]) -> None:
    """Write the profiler's output of ``part`` under ``raw/`` as it came (see the module's docstring)."""
    raw.mkdir(parents=True, exist_ok=True)
    (raw / f"{part}.csv").write_text(csv_text)
    (raw / f"{part}.rc").write_text(f"{rc}\n")
    (raw / f"{part}.stderr").write_text(stderr)
    (raw / f"{part}.labels.json").write_text(json.dumps(labels, indent=0))


def rebuild(raw: pathlib.Path, part: str, metrics=(), command: str = COMMAND) -> dict:
    """``repack`` of what ``store_raw`` kept for ``part``."""
    rc_text = (raw / f"{part}.rc").read_text().strip() if (raw / f"{part}.rc").exists() else ""
    stderr = (raw / f"{part}.stderr").read_text() if (raw / f"{part}.stderr").exists() else ""
    labels = json.loads((raw / f"{part}.labels.json").read_text())
    rc = int(rc_text) if rc_text.lstrip("-").isdigit() else None
    return repack((raw / f"{part}.csv").read_text(), labels, metrics, rc, stderr, command)


def base_metric(name: str) -> str:
    """A metric's name without its roll-up and ratio suffixes: ``dram__bytes_read.sum`` -> ``dram__bytes_read``
    (``ncu --query-metrics`` lists base names)."""
    return name.split(".", 1)[0]


def offered(query_text: str) -> set[str]:
    """The base metric names in ``ncu --query-metrics`` output (its first column, after the header line)."""
    names = set()
    for line in query_text.splitlines():
        word = line.split(maxsplit=1)[0] if line.strip() else ""
        if "__" in word and not word.startswith("-"):
            names.add(word)
    return names


def split_offered(metrics, query_text: str) -> tuple[list[str], list[str]]:
    """(metrics this ncu offers, metrics it does not) by base name; all offered when the query gave no list. The
    launch statistics (``launch__*``: registers per thread, occupancy limits) are not hardware counters and
    ``--query-metrics`` does not list them (the H200 lease's list has none), so they are always asked for."""
    names = offered(query_text)
    if not names:
        return list(metrics), []
    ok = [m for m in metrics if base_metric(m) in names or m.startswith("launch__")]
    return ok, [m for m in metrics if m not in ok]
