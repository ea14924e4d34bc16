"""Triton backend: count a kernel's global-memory accesses under Triton's interpreter (``TRITON_INTERPRET=1``).

Under the interpreter every global access of a kernel reaches a method of
``triton.runtime.interpreter.InterpreterBuilder``: ``create_masked_load`` / ``create_masked_store`` (plain loads
and stores, tensor descriptors, atomic loads and stores) and ``create_atomic_rmw`` / ``create_atomic_cas``. Their
pointers are host addresses of the (CPU) torch tensors handed to the kernel, so an access is attributed to the
argument whose storage holds it; masked-off lanes move nothing. The programs of a launch run one after another
(``set_grid_idx`` marks each), so a kernel that waits for another program may never finish (the caller's time
limit catches it). These are private APIs: their signatures are checked at run time and a version whose hooks do
not match is refused with one line naming the supported range. Autotuned kernels need one config pinned (the
autotuner needs a GPU driver). ``TRITON_INTERPRET=1`` must be set before ``triton`` is first imported: the counting
subprocess (:func:`iosim.kernels.count_file`) does that.
"""

from __future__ import annotations

import contextlib
import inspect
import os

import numpy as np

from iosim.errors import InputError

SUPPORTED = "triton 3.9 to 3.x (tested with 3.9.0; the hooks are checked at run time)"
# positional parameters (after self) each hook needs to see, by name
_HOOKS = {
    "create_masked_load": ("ptrs", "mask"),
    "create_masked_store": ("ptrs", "value", "mask"),
    "create_atomic_rmw": ("rmwOp", "ptr", "val", "mask"),
    "create_atomic_cas": ("ptr", "cmp", "val"),
}


def require() -> None:
    """Raise InputError unless triton (and torch) are importable in interpreter mode with hooks this module knows."""
    try:
        import torch  # noqa: F401
        import triton
    except ImportError as e:
        raise InputError("backend triton", 'needs the extra: pip install "iosim[triton]"', str(e)) from None
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise InputError(
            "backend triton",
            "needs TRITON_INTERPRET=1 set before triton is imported (iosim.kernels.count_file does it)",
        )
    from triton.runtime import interpreter

    builder = getattr(interpreter, "InterpreterBuilder", None)
    for name, wanted in _HOOKS.items():
        fn = getattr(builder, name, None)
        params = list(inspect.signature(fn).parameters)[1 : 1 + len(wanted)] if fn else []
        if tuple(params) != wanted:
            raise InputError(
                "backend triton",
                f"supports {SUPPORTED}: this version's interpreter hook {name}{tuple(params)} is not {name}{wanted}",
                triton.__version__,
            )
    if not hasattr(interpreter, "GridExecutor") or not hasattr(builder, "set_grid_idx"):
        raise InputError("backend triton", f"supports {SUPPORTED}: no GridExecutor / set_grid_idx", triton.__version__)


def _extent(t) -> tuple[int, int, int]:
    """(start, nbytes, itemsize) of the memory a torch tensor's elements occupy."""
    n = t.element_size()
    if t.numel() == 0:
        return t.data_ptr(), 0, n
    span = 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), span * n, n


def array_range(x) -> tuple[int, int] | None:
    """(start, nbytes) of a torch tensor, for naming the arrays a launcher returns."""
    if hasattr(x, "data_ptr") and hasattr(x, "element_size"):
        s, nb, _ = _extent(x)
        return s, nb
    return None


def _itemsize(handle) -> int:
    ty = handle.get_element_ty()
    return max(1, int(getattr(ty, "primitive_bitwidth", 8)) // 8)


def _lanes(ptr, mask) -> np.ndarray:
    data = np.asarray(ptr.data)
    if mask is None:
        return data.ravel()
    m = np.broadcast_to(np.asarray(mask.data, dtype=bool), data.shape)
    return data[m]


@contextlib.contextmanager
def hooks(recorder):
    """Install the counting hooks for the duration of the block (the interpreter must be active)."""
    require()
    from triton.runtime import interpreter

    B, G = interpreter.InterpreterBuilder, interpreter.GridExecutor
    saved = {name: getattr(B, name) for name in (*_HOOKS, "set_grid_idx")}
    saved_call = G.__call__

    def load(self, ptrs, mask, *rest, **kw):
        recorder.access(_lanes(ptrs, mask), "r", _itemsize(ptrs))
        return saved["create_masked_load"](self, ptrs, mask, *rest, **kw)

    def store(self, ptrs, value, mask, *rest, **kw):
        recorder.access(_lanes(ptrs, mask), "w", _itemsize(ptrs))
        return saved["create_masked_store"](self, ptrs, value, mask, *rest, **kw)

    def rmw(self, op, ptr, val, mask, *rest, **kw):
        recorder.access(_lanes(ptr, mask), "a", _itemsize(ptr))
        return saved["create_atomic_rmw"](self, op, ptr, val, mask, *rest, **kw)

    def cas(self, ptr, cmp, val, *rest, **kw):
        recorder.access(_lanes(ptr, None), "a", _itemsize(ptr))
        return saved["create_atomic_cas"](self, ptr, cmp, val, *rest, **kw)

    def set_grid_idx(self, *a, **kw):
        out = saved["set_grid_idx"](self, *a, **kw)
        recorder.begin_program()
        return out

    def call(self, *args, **kwargs):
        try:
            named = inspect.getcallargs(self.fn, *args, **kwargs)
        except TypeError:
            named = {}
        for name, arg in named.items():
            base = getattr(arg, "base", None) if type(arg).__name__ == "TensorDescriptor" else arg
            if hasattr(base, "data_ptr") and hasattr(base, "element_size"):
                recorder.register(name, *_extent(base))
            elif not (arg is None or isinstance(arg, (int, float, bool, str, tuple))) and not hasattr(arg, "value"):
                raise InputError(
                    f"argument {name}", "must be a torch tensor, a number or a constexpr", type(arg).__name__
                )
        recorder.begin_launch(getattr(self.fn, "__name__", "kernel"))
        if not recorder.paused:
            specs = getattr(recorder, "launch_specs", None)
            if specs is None:
                specs = recorder.launch_specs = []
            specs.append((self.fn, named, list(getattr(self, "constexprs", []))))
        return saved_call(self, *args, **kwargs)

    B.create_masked_load, B.create_masked_store = load, store
    B.create_atomic_rmw, B.create_atomic_cas, B.set_grid_idx = rmw, cas, set_grid_idx
    G.__call__ = call
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(B, name, fn)
        G.__call__ = saved_call
        recorder.end_program()


def to_numpy(x) -> np.ndarray | None:
    if hasattr(x, "detach") and hasattr(x, "float"):
        return x.detach().cpu().double().numpy()
    return None


_TYPES = {"float16": "fp16", "float32": "fp32", "bfloat16": "bf16", "float64": "fp64", "int32": "i32",
          "int64": "i64", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}  # fmt: skip


def _type(x) -> str | None:
    if hasattr(x, "data_ptr") and hasattr(x, "dtype"):
        t = _TYPES.get(str(x.dtype).removeprefix("torch."))
        return None if t is None else "*" + t
    if isinstance(x, bool):
        return "i1"
    if isinstance(x, int):
        return "i32" if -(2**31) <= x < 2**31 else "i64"
    if isinstance(x, float):
        return "fp32"
    return None


def launch_specs(recorder) -> list[dict]:
    """What is needed to compile each kernel launched (not paused) again: its module and name, the signature and
    the constexpr values of the launch (JSON)."""
    out, seen = [], set()
    for fn, named, constexprs in getattr(recorder, "launch_specs", []):
        name = getattr(fn, "__name__", "kernel")
        if name in seen:
            continue
        seen.add(name)
        sig, consts = {}, {}
        for k, v in named.items():
            t = None if k in constexprs else _type(v)
            sig[k] = t or "constexpr"
            if t is None:
                v = getattr(v, "value", v)
                if not isinstance(v, (int, float, bool, str)) and v is not None:
                    break  # a constexpr JSON cannot carry: leave this kernel out
                consts[k] = v
        else:
            out.append({"kernel": name, "module": fn.__module__, "file": fn.__code__.co_filename, "signature": sig,
                        "constexprs": consts})  # fmt: skip
    return out


def compile_shared_memory(specs: list[dict], cc: int = 90) -> dict[str, int | str]:
    """Compile each kernel of ``specs`` for sm_``cc`` with Triton's real compiler (no GPU needed; run in a process
    *without* TRITON_INTERPRET) and return the shared memory in bytes it allocates per program, or why not."""
    import importlib
    import importlib.util
    import warnings

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    out: dict[str, int | str] = {}
    for sp in specs:
        try:
            try:
                module = importlib.import_module(sp["module"])
            except ImportError:
                spec = importlib.util.spec_from_file_location(f"iosim_compile_{sp['kernel']}", sp["file"])
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            fn = getattr(module, sp["kernel"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                src = ASTSource(fn=fn, signature=sp["signature"], constexprs=sp["constexprs"])
                out[sp["kernel"]] = int(compile(src, target=GPUTarget("cuda", cc, 32)).metadata.shared)
        except Exception as e:  # a second figure only: say why it is missing
            first = str(e).strip().splitlines()[-1][:120] if str(e).strip() else ""
            out[sp["kernel"]] = f"not compiled: {type(e).__name__}: {first}"
    return out


if __name__ == "__main__":  # python -m iosim.kernels.triton_backend SPECS.json CC: print {kernel: bytes} as JSON
    import json
    import sys

    print(json.dumps(compile_shared_memory(json.loads(open(sys.argv[1]).read()), int(sys.argv[2]))))
