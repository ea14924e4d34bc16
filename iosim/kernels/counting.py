"""Count the global-memory traffic of a real kernel launch, exactly, on a machine without a GPU.

A backend runs the kernel in its interpreter or simulator (Triton's ``TRITON_INTERPRET=1``, Pallas's interpret
mode, numba-cuda's CUDA simulator) and sees every global-memory access as it is issued. Each access is attributed
to the kernel argument whose storage holds its address and counted per lane:

* **reads / writes**: elements moved slow -> fast / fast -> slow, as issued (a lane masked off moves nothing), and
  the same in bytes (elements x the element size of the access);
* **atomics**: a read-modify-write (atomic add, CAS, ...) is one read and one write per enabled lane, also
  counted on their own;
* **distinct**: the elements each program touched at least once, summed over programs: issued > distinct means a
  program loaded (or stored) some data more than once;
* **per program**: the words each program (Triton program, CUDA thread block, Pallas grid step) read and wrote,
  and the number of programs.

Semantics: counts are per program, like the model's fast memory per thread block: an element read by two programs
counts twice. There is no coalescing, no cache line, no L2: the count is an upper bound on DRAM traffic and
exactly the quantity the two-level model (and the papers' I/O bounds) count, one word per element whatever its
dtype. Arguments that are not the attention arrays (sequence lengths, page tables, counters) are counted under
their own names. Elements of an array are named by the launcher (the dict it returns) or, failing that, by the
kernel's parameter name at its first launch.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from iosim.errors import InputError

BACKENDS = ("triton", "pallas", "numba-cuda")
UNKNOWN = "<unattributed>"


@dataclass(frozen=True)
class ArrayTraffic:
    """One array's traffic: elements (words) and bytes read and written as issued, atomics, distinct elements."""

    reads: int = 0
    writes: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    atomics: int = 0  # enabled lanes of read-modify-write operations (each also counted as a read and a write)
    distinct_reads: int = 0  # sum over programs of the elements that program read at least once
    distinct_writes: int = 0

    @property
    def total(self) -> int:
        return self.reads + self.writes

    @property
    def reloads(self) -> int:
        """Reads beyond the first of each element within its program: data a program loaded more than once."""
        return self.reads - self.distinct_reads


@dataclass
class KernelCounts:
    """The counted traffic of one launcher run (one or more kernel launches): see the module docstring."""

    backend: str
    per_array: dict[str, ArrayTraffic]
    programs: int
    launches: int
    per_program: np.ndarray  # (programs, 2): words read and written by each program, in launch order
    seconds: float = 0.0
    kernels: list[str] = field(default_factory=list)  # kernel name of each launch
    shared_memory: dict = field(default_factory=dict)  # kernel -> bytes of shared memory its compiler allocates

    @property
    def reads(self) -> int:
        return sum(a.reads for a in self.per_array.values())

    @property
    def writes(self) -> int:
        return sum(a.writes for a in self.per_array.values())

    @property
    def total(self) -> int:
        return self.reads + self.writes

    def to_dict(self) -> dict:
        return {
            "backend": self.backend,
            "programs": self.programs,
            "launches": self.launches,
            "kernels": list(self.kernels),
            "shared_memory": dict(self.shared_memory),
            "seconds": self.seconds,
            "per_array": {k: _asdict(v) for k, v in self.per_array.items()},
            "per_program": self.per_program.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> KernelCounts:
        return cls(
            backend=d["backend"],
            per_array={k: ArrayTraffic(**v) for k, v in d["per_array"].items()},
            programs=int(d["programs"]),
            launches=int(d["launches"]),
            per_program=np.asarray(d["per_program"], dtype=np.int64).reshape(-1, 2),
            seconds=float(d["seconds"]),
            kernels=list(d.get("kernels", [])),
            shared_memory=dict(d.get("shared_memory", {})),
        )


def _asdict(x) -> dict:
    return {k: getattr(x, k) for k in x.__dataclass_fields__}


@dataclass
class _Range:
    name: str
    start: int
    end: int
    itemsize: int


class Recorder:
    """Backend-independent bookkeeping: address ranges of the arrays, the current program, lane-level accesses."""

    def __init__(self) -> None:
        self.ranges: list[_Range] = []
        self._order: list[int] = []  # range ids, tightest first (a view inside a larger argument wins)
        self.issued: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(5, dtype=np.int64))  # r, w, rb, wb, atomics
        self.distinct: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(2, dtype=np.int64))
        self._touched: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)
        self.per_program: list[list[int]] = []
        self.launches = 0
        self.kernels: list[str] = []
        self._in_program = False
        self.paused = False  # inside ``paused()``: launches run uncounted

    # --- arrays ---------------------------------------------------------------------------------------------
    def register(self, name: str, start: int, nbytes: int, itemsize: int) -> None:
        """Name the bytes [start, start + nbytes) after a kernel parameter; a range already known keeps its name."""
        if nbytes <= 0:
            return
        start, end = int(start), int(start) + int(nbytes)
        if any(r.start == start and r.end == end for r in self.ranges):
            return
        self.ranges.append(_Range(name, start, end, int(itemsize)))
        self._order = sorted(range(len(self.ranges)), key=lambda i: self.ranges[i].end - self.ranges[i].start)

    # --- programs -------------------------------------------------------------------------------------------
    def begin_launch(self, kernel: str) -> None:
        self.end_program()
        if self.paused:
            return
        self.launches += 1
        self.kernels.append(kernel)

    def begin_program(self) -> None:
        self.end_program()
        if self.paused:
            return
        self.per_program.append([0, 0])
        self._in_program = True

    def end_program(self) -> None:
        if not self._in_program:
            return
        for (rid, col), chunks in self._touched.items():
            self.distinct[rid][col] += np.unique(np.concatenate(chunks)).size
        self._touched.clear()
        self._in_program = False

    # --- accesses -------------------------------------------------------------------------------------------
    def access(self, addresses: np.ndarray, kind: str, nbytes: int) -> None:
        """Lanes that moved data: their byte addresses (enabled lanes only), kind "r", "w" or "a" (atomic: a read and
        a write), the bytes one lane moves."""
        if self.paused:
            return
        if not self._in_program:
            self.begin_program()
        addr = np.asarray(addresses, dtype=np.uint64).ravel()
        if addr.size == 0:
            return
        left = np.ones(addr.size, dtype=bool)
        for rid in self._order:
            r = self.ranges[rid]
            sel = left & (addr >= np.uint64(r.start)) & (addr < np.uint64(r.end))
            n = int(np.count_nonzero(sel))
            if n:
                left &= ~sel
                self._add(rid, kind, n, nbytes, (addr[sel] - np.uint64(r.start)) // np.uint64(r.itemsize))
                if not left.any():
                    return
        self._add(-1, kind, int(np.count_nonzero(left)), nbytes, addr[left])

    def _add(self, rid: int, kind: str, n: int, nbytes: int, elements: np.ndarray) -> None:
        c, prog = self.issued[rid], self.per_program[-1]
        if kind in ("r", "a"):
            c[0] += n
            c[2] += n * nbytes
            prog[0] += n
            self._touched[(rid, 0)].append(elements)
        if kind in ("w", "a"):
            c[1] += n
            c[3] += n * nbytes
            prog[1] += n
            self._touched[(rid, 1)].append(elements)
        if kind == "a":
            c[4] += n

    def result(self, backend: str, seconds: float, names: dict[str, tuple[int, int]] | None = None) -> KernelCounts:
        """The counts; ``names`` (name -> (start, nbytes)) renames the ranges of the arrays the launcher named."""
        self.end_program()
        label = {-1: UNKNOWN}
        for rid, r in enumerate(self.ranges):
            label[rid] = r.name
        for name, (start, nbytes) in (names or {}).items():
            for rid, r in enumerate(self.ranges):
                if r.start == start and r.end == start + nbytes:
                    label[rid] = name
        per: dict[str, ArrayTraffic] = {}
        taken: dict[str, int] = {}
        for rid in sorted(self.issued, key=lambda i: (i < 0, i)):
            c, dist = self.issued[rid], self.distinct[rid]
            name = label[rid]
            if name in taken and taken[name] != rid:  # two different arrays behind one parameter name
                k = 2
                while f"{name}#{k}" in taken:
                    k += 1
                name = f"{name}#{k}"
            taken[name] = rid
            per[name] = ArrayTraffic(*(int(x) for x in c), int(dist[0]), int(dist[1]))
        pp = np.asarray(self.per_program, dtype=np.int64).reshape(-1, 2)
        return KernelCounts(backend, per, len(pp), self.launches, pp, seconds, list(self.kernels))


# ---------------------------------------------------------------------------------------------------------------
# Running a launcher: in this process (the backend's mode already on) or in a fresh one (count_file)
# ---------------------------------------------------------------------------------------------------------------
ENV = {  # what each backend needs set before its package is first imported
    "triton": {"TRITON_INTERPRET": "1"},
    "numba-cuda": {"NUMBA_ENABLE_CUDASIM": "1"},
    "pallas": {"JAX_PLATFORMS": "cpu"},
}
EXTRA = {"triton": ("triton", ("triton", "torch")), "pallas": ("pallas", ("jax",)), "numba-cuda": ("cuda", ("numba",))}


def backend_module(backend: str):
    if backend == "triton":
        from iosim.kernels import triton_backend as m
    elif backend == "numba-cuda":
        from iosim.kernels import numba_cuda_backend as m
    elif backend == "pallas":
        from iosim.kernels import pallas_backend as m
    else:
        raise InputError("backend", f"must be one of {', '.join(BACKENDS)}", backend)
    return m


def require_extra(backend: str) -> None:
    """InputError naming the extra when the backend's packages are not installed (checked without importing)."""
    import importlib.util

    if backend not in BACKENDS:
        raise InputError("backend", f"must be one of {', '.join(BACKENDS)}", backend)
    extra, modules = EXTRA[backend]
    for m in modules:
        if importlib.util.find_spec(m) is None:
            raise InputError(f"backend {backend}", f'needs the extra: pip install "iosim[{extra}]" ({m} is missing)')


_ACTIVE: list[Recorder] = []
LAST_RECORDER: list[Recorder | None] = [None]  # the recorder of the last count() (its launches, for compiling)


@contextlib.contextmanager
def paused():
    """Launches inside this block are not counted (a launcher's setup, e.g. the forward before a backward)."""
    saved = [r.paused for r in _ACTIVE]
    for r in _ACTIVE:
        r.end_program()
        r.paused = True
    try:
        yield
    finally:
        for r, p in zip(_ACTIVE, saved, strict=True):
            r.paused = p


def count(launch, backend: str = "triton") -> tuple[KernelCounts, dict]:
    """Count the traffic of ``launch()`` (a callable that launches one or more kernels) in this process.

    ``launch`` may return a dict naming the arrays (name -> array, as the model names them: Q, K, V, O, L, ...)
    and numbers (``scale``); arrays it does not name are counted under the kernel's parameter names. The backend's
    mode must already be on in this process (``TRITON_INTERPRET=1`` / ``NUMBA_ENABLE_CUDASIM=1`` set before the
    package was imported); :func:`count_file` starts a fresh process that sets it. Returns the counts and the dict
    ``launch`` returned (or {}).
    """
    mod = backend_module(backend)
    rec = Recorder()
    t0 = time.perf_counter()
    _ACTIVE.append(rec)
    try:
        with mod.hooks(rec):
            out = launch()
    finally:
        _ACTIVE.remove(rec)
    seconds = time.perf_counter() - t0
    out = {} if out is None else out
    if not isinstance(out, dict):
        raise InputError("launcher", "must return a dict of named arrays (or None)", type(out).__name__)
    names, rename = {}, out.get("names") or {}
    if not isinstance(rename, dict):
        raise InputError("launcher result 'names'", "must be a dict (kernel's name -> model's name)", rename)
    for name, x in out.items():
        if isinstance(x, (int, float, bool, str)) or x is None or name == "names":
            continue
        r = mod.array_range(x)
        if r is None and not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise InputError(f"launcher result {name!r}", "must be an array or a number", type(x).__name__)
        if r is not None:
            names[name] = r
    if hasattr(mod, "name_arrays"):
        mod.name_arrays(rec, out)
    counts = rec.result(backend, seconds, names)
    LAST_RECORDER[0] = rec
    if rename:
        counts.per_array = {str(rename.get(k, k)): v for k, v in counts.per_array.items()}
    return counts, out


def detect_backend(path) -> str:
    """The backend a launcher file needs, from what it imports: triton, pallas (jax), or numba-cuda."""
    from pathlib import Path

    text = Path(path).read_text(errors="replace")
    if "triton" in text:
        return "triton"
    if "pallas" in text:
        return "pallas"
    if "cuda.jit" in text or "numba" in text:
        return "numba-cuda"
    raise InputError("--backend", f"could not be told from {path} (imports none of triton, pallas, numba): name one")


def count_file(
    path: str,
    launcher: str | None = None,
    backend: str | None = None,
    params: dict | None = None,
    timeout: float = 300.0,
    arrays: bool = True,
    shared_memory: int | None = None,
) -> tuple[KernelCounts, dict, dict]:
    """Count a launcher file's kernels in a fresh process with the backend's mode on.

    ``path`` defines the launcher (``launcher`` or ``launch``), called with the keywords of ``params`` it declares.
    Returns (counts, numbers the launcher returned, arrays it returned as float64 NumPy when ``arrays``). Raises
    InputError (one line) for a missing file or launcher, a kernel that raises, a non-array argument or result, a
    backend not installed or not supported, or a run longer than ``timeout`` seconds. ``shared_memory=90``
    (Triton only) also compiles each kernel for sm_90 with the real compiler (no GPU needed) and records the shared
    memory it allocates per program in ``counts.shared_memory``.
    """
    return count_batch([(path, launcher, params or {})], backend, timeout, arrays, shared_memory)[0]


def count_batch(
    jobs, backend: str | None = None, timeout: float = 300.0, arrays: bool = True, shared_memory: int | None = None
) -> list[tuple]:
    """:func:`count_file` for several (path, launcher, params) jobs in one fresh process (one import of the backend's
    packages): a list of (counts, numbers, arrays). ``timeout`` bounds the whole batch."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    reqs = []
    for path, launcher, params in jobs:
        p = Path(path)
        if not p.is_file():
            raise InputError("FILE", "must be an existing Python file defining a launcher", str(path))
        reqs.append({"path": str(p.resolve()), "launcher": launcher or None, "params": dict(params),
                     "shared_memory": shared_memory})  # fmt: skip
    backend = backend or detect_backend(reqs[0]["path"])
    require_extra(backend)
    with tempfile.TemporaryDirectory(prefix="iosim-kernel-") as tmp:
        req = {"jobs": reqs, "backend": backend, "arrays": bool(arrays)}
        Path(tmp, "request.json").write_text(json.dumps(req))
        env = dict(os.environ, **ENV[backend])
        cmd = [sys.executable, "-m", "iosim.kernels._worker", tmp]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise InputError(
                "kernel", f"did not finish within {timeout:g} s (a program waiting on another never returns under "
                "the interpreter, which runs programs one at a time; or raise --timeout)"
            ) from None  # fmt: skip
        results = []
        for i in range(len(reqs)):
            res_file = Path(tmp, f"result_{i}.json")
            if not res_file.exists():
                tail = (proc.stderr or proc.stdout or "").strip().splitlines()
                got = tail[-1] if tail else f"exit {proc.returncode}"
                raise InputError("kernel process", "ended without a result", got)
            res = json.loads(res_file.read_text())
            if not res["ok"]:
                raise InputError(res["parameter"], res["accepted"], res.get("got"))
            out = {}
            if arrays and Path(tmp, f"arrays_{i}.npz").exists():
                with np.load(Path(tmp, f"arrays_{i}.npz")) as z:
                    out = {k: z[k] for k in z.files}
            counts = KernelCounts.from_dict(res["counts"])
            if shared_memory and res.get("launch_specs"):
                counts.shared_memory = _compile_shared(res["launch_specs"], int(shared_memory), tmp, i, timeout)
            results.append((counts, res["numbers"], out))
        return results


def _compile_shared(specs: list[dict], cc: int, tmp: str, i: int, timeout: float) -> dict:
    """Triton's compiler for sm_``cc``, in a process without TRITON_INTERPRET (the interpreter's patches of
    triton.language would break it): shared memory per program of each kernel."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = Path(tmp, f"specs_{i}.json")
    path.write_text(json.dumps(specs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "iosim.kernels.triton_backend", str(path), str(cc)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as e:  # a second figure only
        return {s["kernel"]: f"not compiled: {type(e).__name__}" for s in specs}
