"""Sweeps: run any grid of (algorithm, pass, N, d, M, causal, mask, kv_policy, tiling); one record per point.

>>> from iosim.runner.sweep import sweep
>>> recs = sweep({"algorithm": ["flash2"], "N": [64], "d": [8], "M": [512, 1024]}, executor="serial", as_frame=False)
>>> [r["status"] for r in recs], recs[0]["exact"]
(['ok', 'ok'], True)

* **Grid.** A mapping from the keys of :data:`GRID_KEYS` to a value or a list of values (the Cartesian product is
  taken; missing keys take :data:`DEFAULTS`), or a list of such mappings (their expansions are concatenated).
  An unknown key is an :class:`~iosim.base.errors.InputError` for the whole grid; a bad *value* (N = 0, an unknown
  algorithm, an M too small for any tiling, a pass the algorithm lacks) makes that one point ``status="invalid"``
  with the reason in ``error``, and the rest still run.
* **Records.** One dict per point in grid order (a pandas DataFrame when pandas is installed and ``as_frame`` is
  not False), with the counts of the requested pass (reads, writes, total, init_writes, peak), the io_model
  prediction and whether it equals the simulation (``exact``), the largest applicable lower bound and its name.
  ``out=`` writes them as CSV (no extra needed), JSON lines, or Parquet (the ``sweep`` extra).
* **Cache.** ``cache=PATH`` (a JSON-lines file) stores every finished point under a key made of its configuration
  and a fingerprint of iosim's source files, so a rerun computes only what is new and a code change recomputes
  everything. Lines are appended as chunks finish; a torn last line (a killed run) is ignored on reading.
* **Executors.** ``executor="processes"`` (default; ``jobs`` workers, os.cpu_count() by default), ``"serial"``,
  any :class:`concurrent.futures.Executor`, or ``"dask:ADDRESS"`` for a Dask scheduler (the ``dask``
  extra; ``dask:local`` starts a local cluster of ``jobs`` worker processes). Points are sent in chunks
  and put back in grid order, so every executor returns the same records. An unreachable scheduler raises
  InputError before anything is computed or written. ``dask:local`` starts worker processes by spawning, so a
  script that uses it needs the usual ``if __name__ == "__main__":`` guard (the ``iosim`` command has it).
"""

from __future__ import annotations

import concurrent.futures as cf
import csv
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from iosim.base import outputs
from iosim.base.errors import InputError, install_hint
from iosim.memory_model import CapacityError
from iosim.runner import api, registry, validate

GRID_KEYS = ("algorithm", "pass", "N", "d", "M", "causal", "mask", "kv_policy", "tiling", "count_only", "dtype", "seed")
# A problem beyond one head (iosim.Problem; flash1, flash2): N and d stand for N_q = N_k and d_qk unless N_q, N_k,
# d_v are given; the schedule keys gqa, splits, mla and the explicit tiles Br, Bc, B.
PROBLEM_KEYS = (
    "batch",
    "heads",
    "kv_heads",
    "N_q",
    "N_k",
    "d_v",
    "page_size",
    "latent",
    "gqa",
    "splits",
    "mla",
    "dtype_q",
    "dtype_kv",
    "dtype_o",
)  # the storage dtypes (iosim.Problem's): bytes per array
TILE_KEYS = ("Br", "Bc", "B")
GRID_KEYS = GRID_KEYS + PROBLEM_KEYS + TILE_KEYS
DEFAULTS = {
    "batch": 1,
    "heads": 1,
    "kv_heads": None,
    "N_q": None,
    "N_k": None,
    "d_v": None,
    "page_size": None,
    "latent": False,
    "dtype_q": None,  # iosim.Problem's defaults: fp64, and K, V, O at Q's
    "dtype_kv": None,
    "dtype_o": None,
    "gqa": "per-head",
    "splits": 1,
    "mla": "shared",
    "Br": None,
    "Bc": None,
    "B": None,
    "pass": "forward",
    "causal": False,
    "mask": "none",  # a --mask string (iosim.masking.masks.parse)
    "kv_policy": None,  # iosim.run's default: paper for one head, skip over a problem (the record says which ran)
    "tiling": "fit",
    "count_only": True,
    "dtype": "float64",
    "seed": 0,
}
PASSES = ("forward", "backward")
RESULT_FIELDS = (
    "status",
    "error",
    "regime",
    "blocks",
    "reads",
    "writes",
    "total",
    "init_writes",
    "peak",
    "predicted_total",
    "exact",
    "lower_bound",
    "lower_bound_name",
    "total_over_lb",
    "max_abs_error",
    "total_bytes",
    "thread_blocks",
    "iosim_version",  # the version that counted the point (a cached record keeps the one that computed it)
)
FIELDS = GRID_KEYS + RESULT_FIELDS
OUT_FORMATS = (".csv", ".jsonl", ".parquet")


# --------------------------------------------------------------------------------------------------- the grid
def expand(grid: Mapping | Sequence[Mapping]) -> list[dict]:
    """The points of ``grid`` in order: the Cartesian product of each mapping's values (in GRID_KEYS order)."""
    if isinstance(grid, Mapping):
        grid = [grid]
    elif not isinstance(grid, Sequence) or isinstance(grid, str | bytes):
        raise InputError("grid", "must be a mapping of parameter -> values, or a list of such mappings", type(grid))
    points: list[dict] = []
    for g in [flat for entry in grid for flat in _objects_as_keys(entry)]:
        unknown = sorted(set(g) - set(GRID_KEYS))
        if unknown:
            raise InputError("grid", f"keys must be among {', '.join(GRID_KEYS)}", ", ".join(map(str, unknown)))
        if "algorithm" not in g:
            g = {**g, "algorithm": registry.algorithms()}
        missing = [k for k in ("N", "d", "M") if k not in g]
        if missing:
            raise InputError("grid", "must give N, d and M (a value or a list each)", f"missing {', '.join(missing)}")
        axes = []
        for key in GRID_KEYS:
            v = g.get(key, DEFAULTS.get(key))
            vals = list(v) if isinstance(v, Iterable) and not isinstance(v, str | bytes | Mapping) else [v]
            if not vals:
                raise InputError("grid", f"{key} must have at least one value", "[]")
            axes.append(vals)
        points += [dict(zip(GRID_KEYS, combo, strict=True)) for combo in itertools.product(*axes)]
    return points


def _values(v) -> list:
    return list(v) if isinstance(v, Iterable) and not isinstance(v, str | bytes | Mapping) else [v]


def _objects_as_keys(g) -> list[Mapping]:
    """A grid mapping whose ``problem`` and ``schedule`` values are :class:`iosim.Problem` and :class:`iosim.Schedule`
    objects (one or a list each), as the plain mappings of its keys: one per (problem, schedule) pair, the object's
    fields as single values (its dtypes too: the records hold them and the bytes)."""
    from iosim.spec.problem import Problem
    from iosim.spec.schedule import Schedule

    if not isinstance(g, Mapping):
        raise InputError("grid", "entries must be mappings of parameter -> values", type(g))
    if "problem" not in g and "schedule" not in g:
        return [g]
    rest = {k: v for k, v in g.items() if k not in ("problem", "schedule")}
    problems, schedules = _values(g.get("problem", [None])), _values(g.get("schedule", [None]))
    out = []
    for pr in problems:
        for sc in schedules:
            flat = dict(rest)
            if pr is not None:
                if not isinstance(pr, Problem):
                    raise InputError("problem", "values must be iosim.Problem objects", type(pr).__name__)
                keys = dict(N=pr.N_k, d=pr.d_qk, N_q=pr.N_q, N_k=pr.N_k, d_v=pr.d_v, batch=pr.B, heads=pr.H_q,
                            kv_heads=pr.H_kv, page_size=pr.page_size, latent=pr.latent, causal=pr.causal,
                            dtype_q=pr.dtype_q, dtype_kv=pr.dtype_kv, dtype_o=pr.dtype_o)  # fmt: skip
                clash = sorted(set(keys) & set(rest))
                if clash:
                    raise InputError(clash[0], "belongs to the Problem when problem objects are given", rest[clash[0]])
                flat.update(keys)
            if sc is not None:
                if isinstance(sc, str):
                    sc = Schedule(sc)
                if not isinstance(sc, Schedule):
                    raise InputError("schedule", "values must be iosim.Schedule objects", type(sc).__name__)
                keys = dict(algorithm=sc.algorithm, tiling=sc.tiling, Br=sc.Br, Bc=sc.Bc, B=sc.B, gqa=sc.gqa,
                            splits=sc.splits, mla=sc.mla, kv_policy=sc.kv_policy)  # fmt: skip
                keys["pass"] = "backward" if sc.backward else "forward"
                clash = sorted(set(keys) & set(rest))
                if clash:
                    raise InputError(
                        clash[0], "belongs to the Schedule when schedule objects are given", rest[clash[0]]
                    )
                flat.update(keys)
            out.append(flat)
    return out


def _check_point(p: dict) -> None:
    """Per-point checks iosim.run does not make itself (it validates N, d, M, algorithm, tiling and dtype)."""
    if p["pass"] not in PASSES:
        raise InputError("pass", f"must be one of {', '.join(PASSES)}", p["pass"])
    for key in ("causal", "count_only"):
        if not isinstance(p[key], bool):
            raise InputError(key, "must be True or False", p[key])
    if not isinstance(p["mask"], str):
        raise InputError("mask", "must be a --mask string in a sweep (for example window:128)", type(p["mask"]))
    if isinstance(p["seed"], bool) or not isinstance(p["seed"], int):
        raise InputError("seed", "must be an integer", p["seed"])


def run_point(p: dict) -> dict:
    """Run one point; never raises for bad input: the record says ``status`` ok / invalid / capacity / error."""
    from iosim.base.version import __version__

    rec = {k: p[k] for k in GRID_KEYS} | {k: None for k in RESULT_FIELDS} | {"iosim_version": __version__}
    try:
        _check_point(p)
        problem = _problem_of(p)
        r = api.run_keywords(
            p["algorithm"],
            M=p["M"],
            N=None if problem else p["N"],
            d=None if problem else p["d"],
            problem=problem,
            gqa=p["gqa"],
            splits=p["splits"],
            mla=p["mla"],
            Br=p["Br"],
            Bc=p["Bc"],
            B=p["B"],
            backward=p["pass"] == "backward",
            causal=False if problem else p["causal"],
            mask=None if p["mask"] == "none" else p["mask"],
            kv_policy=p["kv_policy"],
            count_only=p["count_only"],
            tiling=p["tiling"],
            dtype=p["dtype"],
            seed=p["seed"],
            allow_long=p.get("_allow_long", False),  # the sweep as a whole was estimated (and consented to)
        )
    except InputError as e:
        rec.update(status="invalid", error=str(e))
        return rec
    except CapacityError as e:
        rec.update(status="capacity", error=str(e))
        return rec
    except Exception as e:  # a bug, not a user mistake: keep the sweep going, say what happened at this point
        rec.update(status="error", error=f"{type(e).__name__}: {e}")
        return rec
    m, s = r.main, r.main.stats
    rec.update(
        status="ok",
        error="",
        regime="large" if r.M >= r.d * r.d else "small",
        blocks=str(m.tiling or r.tiling),
        reads=s.reads,
        writes=s.writes,
        total=s.total,
        init_writes=s.init_writes,
        peak=s.peak,
        predicted_total=m.predicted.total,
        exact=m.exact,
        lower_bound=float(m.lower_bound),
        lower_bound_name=m.lower_bound_name,
        total_over_lb=s.total / m.lower_bound if m.lower_bound > 0 else math.nan,
        max_abs_error=r.max_abs_error,
        total_bytes=r.total_bytes,
        thread_blocks=r.schedule.get("thread_blocks"),
        kv_policy=r.kv_policy,
    )
    return rec


def _problem_of(p: dict):
    """The iosim.Problem of a point that names one (any problem key off its default), else None."""
    from iosim.spec.problem import Problem

    keys = ("batch", "heads", "kv_heads", "N_q", "N_k", "d_v", "page_size", "latent")
    dtypes = {k: p[k] for k in ("dtype_q", "dtype_kv", "dtype_o") if p[k] is not None}
    if all(p[k] == DEFAULTS[k] for k in keys) and set(dtypes.values()) <= {"fp64"}:  # one head of N x d, in words
        return None
    N_q = p["N"] if p["N_q"] is None else p["N_q"]
    N_k = p["N"] if p["N_k"] is None else p["N_k"]
    return Problem(
        B=p["batch"], H_q=p["heads"], H_kv=p["kv_heads"], N_q=N_q, N_k=N_k, d_qk=p["d"], d_v=p["d_v"],
        causal=p["causal"], latent=p["latent"], page_size=p["page_size"], **dtypes,
    )  # fmt: skip


def point_seconds(p: dict) -> float:
    """The estimated time of one point (iosim.runner.estimate; a mask counts as dense: an upper bound); 0 for a point
    that is invalid (it will be reported, not run)."""
    from iosim.runner import estimate, registry

    try:
        algo = registry.get(p["algorithm"])
        backward = p["pass"] == "backward"
        N, d, M = (
            validate.positive_int(k, p[k], lim) for k, lim in (("N", api.MAX_N), ("d", api.MAX_D), ("M", api.MAX_M))
        )
        t = algo.backward_tiling(N, d, M, p["tiling"]) if backward else algo.choose_tiling(N, d, M, p["tiling"])
        steps = validate.estimated_steps(t, N, d, backward)
        counting = 0.0
        if p.get("mask") not in (None, "none", "dense", "causal"):  # a random mask: counted three times
            from iosim.masking.masks import compile_mask

            counting = estimate.mask_seconds(compile_mask(p["mask"], N), passes=3)
    except Exception:
        return 0.0
    if p["count_only"] is not False:
        return estimate.count_only_seconds(steps, estimate.count_step(algo.name, backward, t)) + counting
    return estimate.numeric_seconds(N, d, steps, backward) + counting


def _check_duration(points: list[dict], workers: int, allow_long) -> None:
    """The long-run rule for the sweep as a whole: the points' estimates summed, over the workers."""
    from iosim.runner import estimate

    seconds = sum(point_seconds(p) for p in points) / max(1, workers)
    what = f"a sweep of {len(points):,} points on {workers} worker(s)"
    estimate.check(seconds, what, allow_long=allow_long, parameter="grid", value=f"{len(points):,} points",
                   remedy="use fewer or smaller points, or more workers")  # fmt: skip


def _run_chunk(points: list[dict]) -> list[dict]:
    return [run_point(p) for p in points]


# ---------------------------------------------------------------------------------------------------- the cache
_FINGERPRINT: str | None = None


def code_fingerprint() -> str:
    """A hash of the source files of iosim, iosim.algorithms and iosim.memory_model: part of every cache key."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        import iosim.algorithms
        import iosim.memory_model

        h = hashlib.sha256()
        for pkg in (api, iosim.algorithms, iosim.memory_model):
            root = Path(pkg.__file__).resolve().parent
            for f in sorted(root.rglob("*.py")):
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
        _FINGERPRINT = h.hexdigest()[:16]
    return _FINGERPRINT


def point_key(p: dict) -> str:
    """The cache key of a point: its configuration, the code fingerprint and, for a mask read from a file
    (``mod:FILE.py:NAME``, ``file:MASK.npy``), a hash of that file's bytes (an edited file is a new point)."""
    key = {**{k: p[k] for k in GRID_KEYS}, "code": code_fingerprint()}
    path = _mask_file(p["mask"])
    if path is not None:
        key["mask_file"] = _digest([path, *_MASK_READS.get(p["mask"], ())])
    return json.dumps(key, sort_keys=True, default=str)


# The files a mask file opened while it was read (:func:`_check_mask_files`): a data file it loads, a module of the
# user's it imports. Each is in the key of the points that use the mask, so an edit to any of them is a new point.
_MASK_READS: dict[str, tuple[str, ...]] = {}
_RECORDING: list[list[str]] = []  # the open-event recorder's target while a mask file runs, else empty


def _audit(event: str, args) -> None:
    if _RECORDING and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _RECORDING[-1].append(os.fsdecode(args[0]))


def _reads_of(mask: str) -> tuple[str, ...]:
    """Parse ``mask`` (it runs the mask file), recording the files it opens other than Python's own and iosim's (the
    standard library and installed packages, which no edit of the user's changes; iosim's sources, which the code
    fingerprint covers)."""
    from iosim.masking.masks import parse

    if not getattr(_audit, "installed", False):
        sys.addaudithook(_audit)  # audit hooks cannot be removed: this one records only while _RECORDING is set
        _audit.installed = True
    seen: list[str] = []
    _RECORDING.append(seen)
    try:
        parse(mask)
    finally:
        _RECORDING.pop()
    system = tuple(str(Path(x).resolve()) for x in {sys.prefix, sys.base_prefix, sys.exec_prefix, *site_dirs(),
                                                         *_own_dirs()})  # fmt: skip
    mine = str(Path(_mask_file(mask)).resolve())
    out = []
    for f in dict.fromkeys(seen):
        r = Path(f).resolve()
        if r.is_file() and str(r) != mine and not str(r).startswith(system) and r.suffix != ".pyc":
            out.append(str(r))
    return tuple(out)


def _own_dirs() -> list[str]:
    """iosim's own source folders (an editable install's are outside site-packages): the code fingerprint keys them."""
    import importlib.util

    here = (
        Path(__file__).resolve().parents[1]
    )  # iosim/; its algorithms and memory model may live beside it (a checkout)
    found = [importlib.util.find_spec(f"iosim.{m}") for m in ("algorithms", "memory_model")]
    return [str(here), *(str(Path(next(iter(f.submodule_search_locations)))) for f in found if f is not None)]


def site_dirs() -> list[str]:
    import site

    return [*site.getsitepackages(), site.getusersitepackages()]


def _digest(paths) -> str:
    """A hash of the files' bytes (an unreadable one hashes as such)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(str(path).encode() + b"\0")
        try:
            h.update(Path(path).read_bytes())
        except OSError:
            h.update(b"unreadable")
    return h.hexdigest()[:16]


def _mask_file(mask) -> str | None:
    """The file a ``mod:`` or ``file:`` mask string reads, else None."""
    if isinstance(mask, str) and mask.partition(":")[0] in ("mod", "file"):
        return mask.split(":")[1] if mask.count(":") >= 1 else None
    return None


def _check_mask_files(points: list[dict]) -> None:
    """A mask read from a file (``mod:FILE.py:NAME``, ``file:MASK.npy``) that is wrong whatever the point (a
    missing file, a missing function, one of the wrong arity, an unreadable array): one line for the whole grid,
    before any work. A mask_mod that fails on its index arrays is a point's own error. The files each mask file
    opens while it is read are recorded for the cache key (:func:`point_key`); files its mask_mod opens only when
    called are not seen here, so a mask_mod that reads data should load it when its file is read."""
    for mask in dict.fromkeys(p["mask"] for p in points if _mask_file(p["mask"]) is not None):
        # a module of the user's is opened only when first imported: what an earlier read of this process saw stays
        _MASK_READS[mask] = tuple(dict.fromkeys([*_MASK_READS.get(mask, ()), *_reads_of(mask)]))


def _load_cache(path: Path) -> dict[str, dict]:
    found: dict[str, dict] = {}
    if not path.exists():
        return found
    with open(path) as f:
        for line in f:
            try:
                entry = json.loads(line)
                found[entry["key"]] = entry["record"]
            except (json.JSONDecodeError, KeyError, TypeError):  # a torn line from a killed run
                continue
    return found


def _append_cache(path: Path, keyed: list[tuple[str, dict]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for key, rec in keyed:
            f.write(json.dumps({"key": key, "record": rec}, default=_json_default) + "\n")


def _json_default(x):
    if hasattr(x, "item"):  # NumPy scalars
        return x.item()
    return str(x)


# ------------------------------------------------------------------------------------------------ the executors
def _missing_extra(extra: str, module: str) -> InputError:
    return InputError(module, f"is needed here: {install_hint(extra)}", "not installed")


class _DaskExecutor:
    """A Dask client (and, for ``dask:local``, its local cluster) seen as a concurrent.futures executor."""

    def __init__(self, address: str, jobs: int | None, timeout: float) -> None:
        try:
            import distributed
        except ImportError:
            raise _missing_extra("dask", "distributed") from None
        self.cluster = None
        try:
            if address == "local":
                self.cluster = distributed.LocalCluster(
                    n_workers=jobs or os.cpu_count() or 1, threads_per_worker=1, processes=True, dashboard_address=None
                )
                self.client = distributed.Client(self.cluster, timeout=timeout)
            else:
                self.client = distributed.Client(address, timeout=timeout)
        except (OSError, TimeoutError, ValueError) as e:
            raise InputError(
                "--executor", f"dask:ADDRESS must name a reachable Dask scheduler ({type(e).__name__}: {e})", address
            ) from None
        self.executor = self.client.get_executor(pure=False)

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def _open_executor(executor, jobs: int | None, n_points: int, timeout: float):
    """(executor or None for serial, closer). A None executor means: run in this process."""
    if isinstance(executor, cf.Executor):
        return executor, lambda: None
    if executor is None:
        executor = "processes"
    if not isinstance(executor, str):
        raise InputError("executor", "must be 'processes', 'serial', 'dask:ADDRESS' or a concurrent.futures.Executor")
    if executor == "serial":
        return None, lambda: None
    if executor == "processes":
        workers = min(jobs or os.cpu_count() or 1, n_points)
        if workers <= 1:
            return None, lambda: None
        # Fork is the fast start (workers inherit the compiled kernels), but forking a process that runs threads of
        # its own (JAX, PyTorch: imported by iosim.kernels or the caller) can deadlock the child: spawn there.
        threaded = any(m in sys.modules for m in ("jax", "torch", "tensorflow"))
        context = multiprocessing.get_context("spawn" if threaded or os.name != "posix" else "fork")
        pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=context)
        return pool, pool.shutdown
    if executor.startswith("dask:") and len(executor) > 5:
        d = _DaskExecutor(executor[5:], jobs, timeout)
        return d.executor, d.close
    raise InputError(
        "executor",
        "must be 'processes', 'serial', 'dask:ADDRESS' (or dask:local) or a concurrent.futures.Executor",
        executor,
    )


def _workers_of(ex) -> int:
    for attr in ("_max_workers",):
        if hasattr(ex, attr):
            return int(getattr(ex, attr))
    client = getattr(ex, "_client", None)
    if client is not None:
        try:
            return max(1, sum(client.nthreads().values()))
        except Exception:
            return 1
    return os.cpu_count() or 1


# -------------------------------------------------------------------------------------------------- the outputs
def _check_out(out: Path) -> str:
    suffix = out.suffix.lower()
    if suffix not in OUT_FORMATS:
        raise InputError("out", f"must end in one of {', '.join(OUT_FORMATS)}", str(out))
    if suffix == ".parquet":
        for module in ("pandas", "pyarrow"):
            try:
                __import__(module)
            except ImportError:
                raise _missing_extra("sweep", module) from None
    return suffix


def write_records(records: list[dict], out: Path) -> None:
    """Write records as CSV, JSON lines or Parquet (by suffix), atomically: a temporary file renamed into place."""
    out = Path(out)
    suffix = _check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if suffix == ".csv":
            with open(tmp, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(FIELDS))
                w.writeheader()
                w.writerows(records)
        elif suffix == ".jsonl":
            with open(tmp, "w") as f:
                for r in records:
                    f.write(json.dumps(r, default=_json_default) + "\n")
        else:
            import pandas as pd

            pd.DataFrame.from_records(records, columns=list(FIELDS)).to_parquet(tmp, index=False)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 is for the temporary name only: the mode open() gives
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _umask() -> int:
    """The process's umask (read by setting it and setting it back: Python has no getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _as_frame(records: list[dict], as_frame: bool | None):
    if as_frame is False:
        return records
    try:
        import pandas as pd
    except ImportError:
        if as_frame:
            raise _missing_extra("sweep", "pandas") from None
        return records
    return pd.DataFrame.from_records(records, columns=list(FIELDS))


class _Progress:
    def __init__(self, total: int, enabled: bool | None) -> None:
        if enabled is None:
            enabled = total >= 50 and sys.stderr.isatty()
        self.bar = None
        self.enabled, self.total, self.done, self.shown = enabled, total, 0, 0
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="point", desc="iosim sweep", file=sys.stderr)
            except ImportError:
                pass

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled and (self.done == self.total or self.done - self.shown >= max(1, self.total // 10)):
            self.shown = self.done
            print(f"iosim sweep: {self.done}/{self.total} points", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ------------------------------------------------------------------------------------------------------ sweep()
def sweep(
    grid: Mapping | Sequence[Mapping],
    *,
    executor=None,
    jobs: int | None = None,
    cache: str | Path | None = None,
    out: str | Path | None = None,
    as_frame: bool | None = None,
    progress: bool | None = None,
    chunk_size: int | None = None,
    dask_timeout: float = 10.0,
    stats: dict | None = None,
    allow_long: bool = False,
):
    """Run every point of ``grid`` and return one record per point, in grid order (see the module docstring).

    ``stats``, when a dict is given, receives ``points``, ``computed``, ``cached`` and ``invalid`` counts.
    The points still to compute are estimated first (:mod:`iosim.runner.estimate`): over a minute in all needs
    ``allow_long=True``, over an hour is refused.
    """
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise InputError("jobs", "must be a positive integer", jobs)
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise InputError("chunk_size", "must be None (chosen from the grid) or a positive integer", chunk_size)
    points = expand(grid)
    _check_mask_files(points)
    if out is not None:
        _check_out(Path(out))  # before any work: a missing extra or a bad suffix fails fast, nothing written
        outputs.file("out", out, OUT_FORMATS, create_parent=True)
    if cache is not None:
        outputs.file("cache", cache, (".jsonl",), create_parent=True)
    if as_frame:
        try:
            import pandas  # noqa: F401
        except ImportError:
            raise _missing_extra("sweep", "pandas") from None
    cache_path = Path(cache) if cache is not None else None
    cached = _load_cache(cache_path) if cache_path else {}
    keys = [point_key(p) for p in points] if cache_path else [None] * len(points)
    records: list[dict | None] = [cached.get(k) if k is not None else None for k in keys]
    todo = [i for i, r in enumerate(records) if r is None]
    if todo:
        workers = jobs or (os.cpu_count() or 1) if not isinstance(executor, str) or executor == "processes" else 1
        _check_duration([points[i] for i in todo], workers, allow_long)
        if allow_long:
            for i in todo:
                points[i]["_allow_long"] = True

    if todo:
        ex, close = _open_executor(executor, jobs, len(todo), dask_timeout)  # may raise: nothing written yet
        bar = _Progress(len(todo), progress)
        try:
            if ex is None:
                size = chunk_size or max(1, min(64, len(todo) // 20 or 1))
                chunks = [todo[k : k + size] for k in range(0, len(todo), size)]
                for idx in chunks:
                    _store(records, idx, _run_chunk([points[i] for i in idx]), keys, cache_path)
                    bar.update(len(idx))
            else:
                size = chunk_size or max(1, math.ceil(len(todo) / (4 * _workers_of(ex))))
                chunks = [todo[k : k + size] for k in range(0, len(todo), size)]
                futures = {ex.submit(_run_chunk, [points[i] for i in idx]): idx for idx in chunks}
                for fut in cf.as_completed(futures):
                    idx = futures[fut]
                    _store(records, idx, fut.result(), keys, cache_path)
                    bar.update(len(idx))
        finally:
            bar.close()
            close()

    final = [r for r in records if r is not None]
    if stats is not None:
        stats.update(
            points=len(final),
            computed=len(todo),
            cached=len(final) - len(todo),
            invalid=sum(r["status"] != "ok" for r in final),
        )
    if out is not None:
        write_records(final, Path(out))
    return _as_frame(final, as_frame)


def _store(records: list, idx: list[int], recs: list[dict], keys: list, cache_path: Path | None) -> None:
    for i, r in zip(idx, recs, strict=True):
        records[i] = r
    if cache_path is not None:
        _append_cache(cache_path, [(keys[i], r) for i, r in zip(idx, recs, strict=True) if r["status"] != "error"])
