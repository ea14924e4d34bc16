"""Writing and reading event traces (:class:`iosim.memory_model.Trace`): CSV, NumPy ``.npy`` and Parquet.

One row per event, in order: ``op`` (load, store, alloc, free, init), ``array`` (its name), the region
``r0, nr, c0, nc`` (rows [r0, r0 + nr) x columns [c0, c0 + nc); a vector is n x 1), ``words``, ``resident`` (words
in fast memory after the event) and ``handle`` (the tile's handle; -1 for an initialisation). CSV and Parquet carry
the names; ``.npy`` holds the int64 event matrix (op and array as their codes) and a sidecar ``.json`` with the
names, shapes and M, so :func:`read_trace` can rebuild the :class:`Trace` from any of the three.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from iosim.base import outputs
from iosim.base.errors import InputError, install_hint
from iosim.memory_model import Trace
from iosim.memory_model.core import OPS, TRACE_COLUMNS

SUFFIXES = (".csv", ".npy", ".parquet")


def _check(path: Path) -> None:
    if path.suffix not in SUFFIXES:
        raise InputError("output", f"must end in one of {', '.join(SUFFIXES)}", str(path))
    if path.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise InputError(
                "output", f"as .parquet needs pyarrow: {install_hint('parquet')} (or use .csv or .npy)", str(path)
            ) from None
    outputs.file("output", path, SUFFIXES)


def _meta(trace: Trace) -> dict:
    return {"names": trace.names, "shapes": {k: list(v) for k, v in trace.shapes.items()}, "M": trace.M}


def write_trace(trace: Trace, path) -> Path:
    """Write ``trace`` to ``path`` (.csv, .npy with a .json sidecar, or .parquet); returns the path."""
    path = Path(path)
    _check(path)
    if path.suffix == ".npy":
        np.save(path, trace.events)
        path.with_suffix(".json").write_text(json.dumps(_meta(trace)))
    elif path.suffix == ".csv":
        with path.open("w", newline="") as f:
            f.write(f"# iosim trace {json.dumps(_meta(trace))}\n")
            w = csv.writer(f)
            w.writerow(TRACE_COLUMNS)
            for rec in trace.records():
                w.writerow(rec[c] for c in TRACE_COLUMNS)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = {c: trace.events[:, i] for i, c in enumerate(TRACE_COLUMNS)}
        cols["op"] = np.array([OPS[int(x)] for x in cols["op"]])
        cols["array"] = np.array([trace.names[int(x)] for x in cols["array"]])
        table = pa.table(cols).replace_schema_metadata({"iosim": json.dumps(_meta(trace))})
        pq.write_table(table, path)
    return path


def read_trace(path) -> Trace:
    """Read a trace written by :func:`write_trace`."""
    path = Path(path)
    if path.suffix not in SUFFIXES or not path.exists():
        raise InputError("trace", f"must be an existing {', '.join(SUFFIXES)} file", str(path))
    try:
        return _read(path)
    except (ValueError, KeyError, TypeError, IndexError, OSError, UnicodeDecodeError) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(
            "trace", f"must be a trace iosim wrote (its header or rows do not read: {type(e).__name__}: {e})", str(path)
        ) from None


def _read(path: Path) -> Trace:
    codes = {v: k for k, v in OPS.items()}
    if path.suffix == ".npy":
        meta = json.loads(path.with_suffix(".json").read_text())
        events = np.load(path)
    elif path.suffix == ".csv":
        with path.open() as f:
            meta = json.loads(f.readline().removeprefix("# iosim trace "))
            rows = list(csv.DictReader(f))
        idx = {n: i for i, n in enumerate(meta["names"])}
        events = np.array(
            [[codes[r["op"]], idx[r["array"]], *(int(r[c]) for c in TRACE_COLUMNS[2:])] for r in rows], dtype=np.int64
        ).reshape(-1, len(TRACE_COLUMNS))
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        meta = json.loads(table.schema.metadata[b"iosim"])
        idx = {n: i for i, n in enumerate(meta["names"])}
        cols = table.to_pydict()
        cols["op"] = [codes[x] for x in cols["op"]]
        cols["array"] = [idx[x] for x in cols["array"]]
        events = np.array([cols[c] for c in TRACE_COLUMNS], dtype=np.int64).T.reshape(-1, len(TRACE_COLUMNS))
    shapes = {k: tuple(v) for k, v in meta["shapes"].items()}
    return Trace(events, meta["names"], shapes, meta["M"])
