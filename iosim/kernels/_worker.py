"""The counting subprocess of :func:`iosim.kernels.count_file`: ``python -m iosim.kernels._worker DIR``.

Reads DIR/request.json, imports each job's launcher file (the backend's environment variable was set by the parent
before this process imported anything), counts, and writes DIR/result_<i>.json (and DIR/arrays_<i>.npz) per job.
Every failure is written as one line (parameter, accepted, got) for the parent to raise: never a traceback.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import json
import sys
from pathlib import Path


def _fail(out: Path, parameter: str, accepted: str, got=None, i: int = 0) -> int:
    got = None if got is None else " ".join(str(got).split())[:300]
    doc = {"ok": False, "parameter": parameter, "accepted": accepted, "got": got}
    (out / f"result_{i}.json").write_text(json.dumps(doc))
    return 2


def _launcher(path: Path, name: str | None):
    spec = importlib.util.spec_from_file_location(f"iosim_launcher_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    spec.loader.exec_module(module)
    if name:
        fn = getattr(module, name, None)
        if not callable(fn):
            raise LookupError(f"{path.name} defines no launcher {name!r}")
        return fn
    if callable(getattr(module, "launch", None)):
        return module.launch
    found = [v for k, v in vars(module).items() if k.startswith("launch") and callable(v) and inspect.isfunction(v)]
    if len(found) != 1:
        raise LookupError(f"{path.name} defines no launcher (a function named launch, or name it: FILE.py:NAME)")
    return found[0]


def _untaken(fn, job: dict, kw: dict, result: dict) -> tuple[str, str] | None:
    """(option, why) for the first option of ``job["must_take"]`` given but not taken by the launcher (no parameter
    of that name, no ``**kwargs``), unless the launcher's ``result`` says it ran with that very value (a launcher may
    return what it ran instead of taking it, as a library's always-causal kernel returns ``causal``): otherwise the
    launch ran without it while the command reads it as the launch's."""
    for k in job.get("must_take", ()):
        given = job["params"].get(k)
        if given is None or k in kw:
            continue
        ran = result.get(k)
        ran = ran.item() if getattr(ran, "ndim", None) == 0 and hasattr(ran, "item") else ran  # a NumPy scalar
        ran = ran if isinstance(ran, (int, float, bool, str)) else None
        if ran is not None and isinstance(ran, bool) == isinstance(given, bool) and ran == given:
            continue
        opt = "--" + k.replace("_", "-")
        did = f"ran with {k} = {ran!r} (its result)" if ran is not None else f"ran without it (it returns no {k})"
        why = (f"is not a parameter of launcher {fn.__name__} ({Path(job['path']).name}), which {did}: declare {k} in "
               f"the launcher, or leave {opt} out")  # fmt: skip
        return opt, why
    return None


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    req = json.loads((out / "request.json").read_text())
    from iosim.base.errors import InputError
    from iosim.kernels.counting import backend_module

    try:
        mod = backend_module(req["backend"])
        mod.require()
    except InputError as e:
        return _fail(out, e.parameter, e.accepted, e.got)
    for i, job in enumerate(req["jobs"]):
        rc = _one(out, i, mod, req["backend"], job, req.get("arrays"), req.get("keep") or ())
        if rc:
            return rc
    return 0


def _one(out: Path, i: int, mod, backend: str, job: dict, want_arrays: bool, keep=()) -> int:
    from iosim.base.errors import InputError
    from iosim.kernels.counting import count_configs

    if job.get("gpu_standin"):
        from iosim.kernels.standin import install

        install()  # before the launcher (and the library it imports) is imported
    try:
        fn = _launcher(Path(job["path"]), job["launcher"])
    except LookupError as e:
        return _fail(out, "launcher", "must be defined by the file", str(e), i)
    except ModuleNotFoundError as e:
        return _fail(out, "launcher file", f"imports {e.name}, which is not installed here (pip install it)", None, i)
    except Exception as e:
        return _fail(out, "launcher file", "must import cleanly", f"{type(e).__name__}: {e}", i)
    sig = inspect.signature(fn)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    kw = {k: v for k, v in job["params"].items() if v is not None and (takes_any or k in sig.parameters)}
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    missing = [k for k, p in sig.parameters.items() if p.default is p.empty and p.kind in named and k not in kw]
    if missing:
        return _fail(out, "launcher", f"needs {', '.join(missing)}: give them as options", fn.__name__, i)

    def launch():
        out = fn(**kw)
        if out is None:
            accepted = ("must return the dict of its arrays by name (Q, K, V, O, ...; as the model names them) for "
                        "the counts to be named and checked: it returned None")  # fmt: skip
            raise InputError(f"launcher {fn.__name__}", accepted)
        return out

    printed = io.StringIO()  # what the launcher (and the kernel's device prints) wrote: handed back, not dropped
    try:
        with contextlib.redirect_stdout(printed):
            runs = count_configs(launch, backend, job.get("config"), strict=False, fast=job.get("fast", False))
    except InputError as e:
        return _fail(out, e.parameter, e.accepted, e.got, i)
    except Exception as e:
        cause = e.__cause__ or e
        while not isinstance(cause, InputError) and cause.__cause__ is not None:
            cause = cause.__cause__
        if isinstance(cause, InputError):  # raised inside a kernel (the interpreter wraps it): --fast's refusal
            return _fail(out, cause.parameter, cause.accepted, cause.got, i)
        if isinstance(cause, NotImplementedError):
            accepted = "uses a GPU feature Triton's interpreter does not run (so it cannot be counted on a CPU)"
            return _fail(out, "kernel", accepted, str(cause), i)
        return _fail(out, "kernel", "raised", f"{type(cause).__name__}: {cause}", i)
    untaken = _untaken(fn, job, kw, runs[0][1])
    if untaken:
        return _fail(out, *untaken, None, i)
    docs = [_save_run(out, i, k, mod, counts, result, want_arrays, keep) for k, (counts, result) in enumerate(runs)]
    doc = {"ok": True, "runs": docs, "output": printed.getvalue()}
    if job.get("shared_memory") and hasattr(mod, "launch_specs"):
        from iosim.kernels.counting import LAST_RECORDER

        doc["launch_specs"] = mod.launch_specs(LAST_RECORDER[0])
    (out / f"result_{i}.json").write_text(json.dumps(doc))
    return 0


def _save_run(out: Path, i: int, k: int, mod, counts, result: dict, want_arrays: bool, keep=()) -> dict:
    """Run ``k`` of job ``i`` as JSON (its counts and the numbers the launcher returned); its arrays as float64 in
    DIR/arrays_<i>_<k>.npz when ``want_arrays`` (those named in ``keep`` in every mode: a BlockMask's indices)."""
    from iosim.kernels.counting import DECLARATIONS

    numbers = {k: v for k, v in result.items() if isinstance(v, (int, float, bool, str))}
    for key in ("layout", "metadata", "buffers"):  # declarations per array (JSON carries them)
        if isinstance(result.get(key), dict):
            numbers[key] = {str(k): v if isinstance(v, (int, str)) else list(v) for k, v in result[key].items()}
    if "dtype" not in numbers and getattr(result.get("Q"), "dtype", None) is not None:
        numbers["dtype"] = str(result["Q"].dtype).removeprefix("torch.")  # the inputs' precision, for numerics
    if want_arrays or keep:
        import numpy as np

        arrays = {}
        for name, v in result.items():
            if (want_arrays or name in keep) and name not in numbers and v is not None and name not in DECLARATIONS:
                a = mod.to_numpy(v)
                if a is not None:
                    arrays[name] = a
        np.savez(out / f"arrays_{i}_{k}.npz", **arrays)
    return {"counts": counts.to_dict(), "numbers": numbers}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
