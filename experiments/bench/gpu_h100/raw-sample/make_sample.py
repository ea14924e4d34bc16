"""How the files in this folder were made (run once from the repository root; they are committed).

The first lease's raw ncu CSV was not kept: only its repacked ncu-*.json. To test the repacking on a raw file, this
writes ncu's ``--csv --print-units base`` layout (the columns ncu_raw.COLUMNS, one row per launch and metric) for a
few stored launches: the marker before each label (kernel ``iosim_marker``, grid x = label + 1) and the launches the
stored file gives that label, each metric's stored value printed with thousands separators. The process id, host,
context, stream and the markers' metric values are placeholders: repack drops markers and reads none of those.
"""

import json
import pathlib
import sys

sys.path.insert(0, "experiments/bench")
import ncu_raw  # noqa: E402

DATA = pathlib.Path("experiments/bench/gpu_h100")
OUT = DATA / "raw-sample"
UNITS = {"dram__bytes": "byte", "gpu__time_duration": "nsecond", "lts__t_bytes": "byte", "lts__t_sectors": "sector",
         "l1tex__t_bytes": "byte", "sm__cycles_elapsed": "cycle/second"}  # fmt: skip
MARKER = "gpu_evidence::_marker_kernel::<locals>::iosim_marker[v1](Array<float, 1, C, mutable, aligned>)"
KEEP = {"ncu-sweep": (0, 1), "ncu-triton": (3, 4)}


def unit(metric: str) -> str:
    return next(u for k, u in UNITS.items() if metric.startswith(k))


def value(v: float) -> str:
    whole, frac = repr(v).split(".")
    return f"{int(whole):,}" + ("" if frac == "0" else "." + frac)


def row(i: int, name: str, grid: str, block: str, metric: str, val: str) -> str:
    cells = [str(i), "4711", "python3", "127.0.0.1", name, "1", "7", block, grid, "0", "9.0",
             "Command line profiler metrics", metric, unit(metric), val]  # fmt: skip
    return ",".join(f'"{c}"' for c in cells)


def sample(part: str, keep) -> None:
    stored = json.loads((DATA / f"{part}.json").read_text())
    lines = ["==PROF== Connected to process 4711 (/usr/bin/python3.12)", "==PROF== Disconnected from process 4711"]
    lines.append(",".join(f'"{c}"' for c in ncu_raw.COLUMNS))
    i = 0
    for lab in keep:
        for m in sorted(stored["metrics"]):
            if m != "l1tex__t_bytes_pipe_lsu_mem_global_op_ldgsts.sum":  # absent from every stored launch
                lines.append(row(i, MARKER, f"({lab + 1}, 1, 1)", "(32, 1, 1)", m, "0"))
        i += 1
        for launch in (x for x in stored["launches"] if x["label"] == lab):
            for m in sorted(k for k in launch if "__" in k):
                lines.append(row(i, launch["kernel"], launch["grid"], launch["block"], m, value(launch[m])))
            i += 1
    ncu_raw.store_raw(OUT, part, "\n".join(lines) + "\n", 0, "", stored["labels"])


if __name__ == "__main__":
    for part, keep in KEEP.items():
        sample(part, keep)
