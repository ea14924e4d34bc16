"""``--fast``: count a Triton kernel without computing the values no count depends on.

What a kernel moves depends only on the addresses and masks of its loads, stores and atomics, on the branches it
takes and the bounds of its loops, and on the launches the host code makes. The value arithmetic of an attention
kernel (``tl.dot``, the softmax's exponentials and reductions, the rescaled accumulator) feeds none of these: it
feeds stored values only. Under ``--fast`` such values are *not computed*: a value that is never computed is a
**stand-in** (its type is exact; its elements are never read), and every value computed from a stand-in is one too.

Where stand-ins start: ``tl.dot`` of floating-point blocks returns one (its type, the product's, computed from the
operands' types; the multiplication skipped), and so does a load from memory a stand-in was stored to. Where they
spread, cheaply: elementwise float32 arithmetic and comparisons, ``tl.where``, ``exp``/``exp2``/``log``/``log2``/
``sqrt``, casts between float types, ``[:, None]``, ``tl.trans``/``.T``, and ``tl.max``/``tl.min``/``tl.sum`` over an
axis; each of these takes its result type from its operands as Triton's semantics do. Any other Triton operation
given a stand-in runs as usual (on zeros of the stand-in's type, so its result type is Triton's own) and its result
is a stand-in: every interpreter builder call with a stand-in operand returns one, and so does every patched
``triton.language`` function.

Why the counts are those of the full run: every value that is not a stand-in is computed exactly as the full run
computes it, because no stand-in ever reaches it. A stand-in that would have to become a number is refused (one
line naming the use, exit 2): an address or a mask of a load, store or atomic (and a descriptor's offsets), a branch
condition or loop bound (``bool``, ``int``, ``range``), a scalar, a print, an assertion, an atomic's operand. A
stored stand-in is counted like any store (its addresses and mask are real) but writes nothing: its bytes are marked
*not computed*, a later load of any of them returns a stand-in, and a later real store over them makes them real
again. Host code is checked too: once memory holds values not computed, any torch operation outside a launch that
reads a tensor overlapping them (``.item()``, ``.max()``, ``.numpy()``, a copy) is refused; taking shapes, strides,
views and allocating is not reading. The outputs are not computed, so ``--fast`` checks no numerics. What this guard
cannot see: host code that reads an output through a NumPy array or a raw pointer it took *before* the launch (torch
is not asked again); a launcher that does so must be counted without ``--fast``.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from iosim.base.errors import InputError

ENABLED = [False]  # set by triton_backend.hooks(fast=True)
AUDIT = [False]  # IOSIM_FAST_AUDIT=1: every cheap rule's type is checked against Triton's own (the tests set it)
_FP32 = "fp32"
_FLOATS = ("fp16", "bf16", "fp32", "fp64")


class FastRefusedError(InputError):
    """A value --fast skipped is needed as a number: the kernel cannot be counted fast (count it without --fast)."""

    def __init__(self, use: str) -> None:
        super().__init__("--fast", "counts only kernels whose addresses, masks, branches and loop bounds never "
                         "depend on the values it skips (count without --fast)", use)  # fmt: skip


def _interp():
    from triton.runtime import interpreter

    return interpreter


class _State:
    """Per count: the bytes holding values not computed (sorted, disjoint, coalesced [start, end) intervals of host
    addresses), and whether a launch is running."""

    def __init__(self) -> None:
        self.starts = np.zeros(0, dtype=np.int64)
        self.ends = np.zeros(0, dtype=np.int64)
        self.in_launch = False
        self.fakes = 0  # stand-ins made (a count of skipped operations, for the report)
        self.loaded_fakes = 0  # loads of memory a stand-in was stored to
        self.cache: dict = {}  # (dtype, shape) -> the stand-in of that type
        self.types: dict = {}  # (dtype, shape) -> its block type

    @property
    def any(self) -> bool:
        return self.starts.size > 0

    @staticmethod
    def _runs(lanes: np.ndarray, itemsize: int) -> tuple[np.ndarray, np.ndarray]:
        """The lanes' bytes as coalesced [start, end) intervals."""
        a = np.unique(np.asarray(lanes, dtype=np.int64))
        if a.size == 0:
            return a, a
        cut = np.flatnonzero(np.diff(a) > itemsize) + 1
        first = np.concatenate(([0], cut))
        last = np.concatenate((cut - 1, [a.size - 1]))
        return a[first], a[last] + itemsize

    @staticmethod
    def _coalesce(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        reach = np.maximum.accumulate(e)
        new = np.concatenate(([True], s[1:] > reach[:-1]))
        starts = s[new]
        ends = reach[np.concatenate((np.flatnonzero(new)[1:] - 1, [s.size - 1]))]
        return starts, ends

    def _hits(self, a: np.ndarray, itemsize: int) -> np.ndarray:
        i = np.searchsorted(self.ends, a, side="right")
        ok = i < self.starts.size
        hit = np.zeros(a.shape, dtype=bool)
        hit[ok] = self.starts[i[ok]] < a[ok] + itemsize
        return hit

    def poisoned(self, lanes: np.ndarray, itemsize: int) -> bool:
        if not self.any or lanes.size == 0:
            return False
        return bool(self._hits(np.asarray(lanes, dtype=np.int64), itemsize).any())

    def mark(self, lanes: np.ndarray, itemsize: int) -> None:
        s, e = self._runs(lanes, itemsize)
        if s.size:
            self.starts, self.ends = self._coalesce(np.concatenate((self.starts, s)), np.concatenate((self.ends, e)))

    def clear(self, lanes: np.ndarray, itemsize: int) -> None:
        """A real store: its bytes hold computed values again."""
        if not self.poisoned(lanes, itemsize):
            return
        bytes_ = (np.asarray(lanes, dtype=np.int64).reshape(-1, 1) + np.arange(itemsize)).ravel()
        s, e = self._runs(bytes_, 1)
        keep_s, keep_e = [], []
        for a, b in zip(self.starts.tolist(), self.ends.tolist(), strict=True):
            j = np.searchsorted(e, a, side="right")
            if j >= s.size or s[j] >= b:  # untouched
                keep_s.append(a)
                keep_e.append(b)
                continue
            inside = np.arange(a, b)
            left = inside[~self._in(inside, s, e)]
            ls, le = self._runs(left, 1)
            keep_s += ls.tolist()
            keep_e += le.tolist()
        self.starts = np.asarray(keep_s, dtype=np.int64)
        self.ends = np.asarray(keep_e, dtype=np.int64)

    @staticmethod
    def _in(x: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
        i = np.searchsorted(e, x, side="right")
        ok = i < s.size
        out = np.zeros(x.shape, dtype=bool)
        out[ok] = s[i[ok]] <= x[ok]
        return out

    def overlaps(self, start: int, nbytes: int) -> bool:
        if not self.any or nbytes <= 0:
            return False
        i = int(np.searchsorted(self.ends, start, side="right"))
        return i < self.starts.size and int(self.starts[i]) < start + nbytes


STATE = [_State()]


def stand_in_handle():
    I = _interp()
    cls = getattr(I, "_IosimStandIn", None)
    if cls is None:

        class _IosimStandIn(I.TensorHandle):  # noqa: N801  (a value --fast did not compute)
            pass

        I._IosimStandIn = cls = _IosimStandIn
    return cls


def mark(h) -> bool:
    """Make an interpreter TensorHandle a stand-in's (True), or say it is none (False)."""
    I = _interp()
    if isinstance(h, I.TensorHandle):
        if type(h) is I.TensorHandle:
            h.__class__ = stand_in_handle()
        return True
    return False


def _mark_all(out) -> bool:
    """Mark every handle of a builder call's result (a handle, a tuple of them, or None) as a stand-in's."""
    if out is None:
        return True
    if isinstance(out, (tuple, list)):
        return all(_mark_all(o) for o in out)
    return mark(out)


def is_fake(x) -> bool:
    h = getattr(x, "handle", x)
    return type(h).__name__ == "_IosimStandIn"


def _any_fake(args, kwargs) -> bool:
    for a in args:
        if is_fake(a) or (isinstance(a, (tuple, list)) and _any_fake(a, {})):
            return True
    for a in kwargs.values():
        if is_fake(a) or (isinstance(a, (tuple, list)) and _any_fake(a, {})):
            return True
    return False


def stand_in(ty):
    """A tl.tensor of type ``ty`` (a block type or a scalar dtype) whose value is not computed. Nothing reads a
    stand-in's elements or changes them, so one object serves every stand-in of a type within a count."""
    import triton.language as tl

    st = STATE[0]
    st.fakes += 1
    key = (ty.scalar.name, tuple(int(d) for d in ty.shape)) if isinstance(ty, tl.block_type) else (ty.name, None)
    out = st.cache.get(key)
    if out is None:
        scalar = ty.scalar if hasattr(ty, "scalar") else ty
        shape = key[1] or (1,)
        out = tl.tensor(stand_in_handle()(np.zeros(shape, dtype=_interp()._get_np_dtype(scalar)), scalar), ty)
        st.cache[key] = out
    return out


def _block(scalar, shape):
    """tl.block_type(scalar, shape), made once per count."""
    import triton.language as tl

    st = STATE[0]
    key = (scalar.name, tuple(shape))
    ty = st.types.get(key)
    if ty is None:
        ty = st.types[key] = tl.block_type(scalar, list(shape))
    return ty


def stand_in_values(ptrs):
    """A TensorHandle of the values ``ptrs`` point to, not computed (an atomic's old values under --fast)."""
    I = _interp()
    ty = ptrs.get_element_ty()
    h = stand_in_handle()(np.zeros(np.shape(ptrs.data), dtype=I._get_np_dtype(ty)), ty)
    STATE[0].fakes += 1
    return h


def _taint(out, use: str):
    """Mark every tensor of ``out`` (a result computed from a stand-in) as a stand-in; refuse a plain value."""
    import triton.language as tl

    if out is None or isinstance(out, (tl.constexpr, tl.dtype)):
        return out
    if isinstance(out, tl.tensor) and (out.handle is None or mark(out.handle)):  # None: a store's void result
        return out
    if isinstance(out, (tuple, list)):
        for o in out:
            _taint(o, use)
        return out
    if hasattr(out, "handle") and mark(out.handle):  # a descriptor or another handle-backed value
        return out
    raise FastRefusedError(f"{use} computed from a value it skipped")


# --- result types, as Triton's semantics give them, for the cheap cases ----------------------------------------------
def _ty(x):
    return getattr(x, "type", None)


def _shape(ty):
    import triton.language as tl

    return list(ty.shape) if isinstance(ty, tl.block_type) else None


def _fp32_operands(xs) -> list | None:
    """The shapes of fp32 tensor operands and Python numbers (None: a number), or None if another type is among them."""
    import triton.language as tl

    shapes = []
    for x in xs:
        if isinstance(x, bool):
            return None
        if isinstance(x, (int, float)):
            shapes.append(None)
            continue
        if not isinstance(x, tl.tensor) or x.type.scalar.name != _FP32:
            return None
        shapes.append(_shape(x.type) or [])
    return shapes


def _broadcast(shapes: list) -> list | None:
    blocks = [s for s in shapes if s]
    if not blocks:
        return None
    rank = len(blocks[0])
    if any(len(s) != rank for s in blocks):
        return None
    out = []
    for dims in zip(*blocks, strict=True):
        big = {d for d in dims if d != 1}
        if len(big) > 1:
            return None
        out.append(big.pop() if big else 1)
    return out


def _elementwise(xs, result: str):
    import triton.language as tl

    shapes = _fp32_operands(xs)
    if shapes is None or not any(s for s in shapes if s is not None):
        return None
    shape = _broadcast([s for s in shapes if s is not None])
    if shape is None:
        return None
    return stand_in(_block(tl.int1 if result == "int1" else tl.float32, shape))


_ARITH = {"__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__"}
_COMPARE = {"__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"}
_UNARY = {"exp", "exp2", "log", "log2", "sqrt", "abs", "__neg__"}


def _fast(name: str, args: tuple, kwargs: dict):
    """The stand-in result of the cheap cases, or None (then the operation runs as usual on the stand-ins)."""
    import triton.language as tl

    if name in _ARITH or name in ("maximum", "minimum"):
        return None if kwargs else _elementwise(args, "fp32")
    if name in _COMPARE:
        return None if kwargs else _elementwise(args, "int1")
    if name in _UNARY and len(args) == 1 and not kwargs:
        return _elementwise(args, "fp32")
    if name == "where" and len(args) == 3 and not kwargs:
        cond, x, y = args
        if not isinstance(cond, tl.tensor) or cond.type.scalar.name != "int1" or _fp32_operands((x, y)) is None:
            return None
        shapes = [_shape(cond.type) or []] + [s for s in _fp32_operands((x, y)) if s is not None]
        shape = _broadcast(shapes)
        return None if shape is None else stand_in(_block(tl.float32, shape))
    if name == "to" and len(args) == 2 and not kwargs:
        x, dt = args
        dt = getattr(dt, "value", dt)
        if not (isinstance(x, tl.tensor) and isinstance(dt, tl.dtype) and x.type.scalar.name in _FLOATS
                and dt.name in _FLOATS and _shape(x.type)):  # fmt: skip
            return None
        return stand_in(_block(dt, _shape(x.type)))
    if name == "__getitem__" and len(args) == 2 and not kwargs:
        x, sl = args
        sl = sl if isinstance(sl, tuple) else (sl,)
        shape = _shape(_ty(x)) if isinstance(x, tl.tensor) else None
        if shape is None or any(not (s is None or s == slice(None)) for s in sl):
            return None
        if sum(1 for s in sl if s is not None) != len(shape):
            return None
        it, out = iter(shape), []
        for s in sl:
            out.append(1 if s is None else next(it))
        return stand_in(_block(x.type.scalar, out))
    if name in ("trans", "T") and len(args) == 1 and not kwargs:
        x = args[0]
        shape = _shape(_ty(x)) if isinstance(x, tl.tensor) else None
        if shape is None or len(shape) != 2:
            return None
        return stand_in(_block(x.type.scalar, shape[::-1]))
    if name == "dot":
        return _dot(args, kwargs)
    return None


def _dot(args, kwargs):
    import triton.language as tl

    a, b = (list(args) + [kwargs.get("input"), kwargs.get("other")])[:2]
    acc = args[2] if len(args) > 2 else kwargs.get("acc")
    out_dtype = getattr(kwargs.get("out_dtype"), "value", kwargs.get("out_dtype"))
    if len(args) > 3 or set(kwargs) - {"acc", "input_precision", "allow_tf32", "max_num_imprecise_acc", "out_dtype"}:
        return None
    if not (isinstance(a, tl.tensor) and isinstance(b, tl.tensor)):
        return None
    sa, sb = _shape(a.type), _shape(b.type)
    if not sa or not sb or len(sa) != 2 or len(sb) != 2 or sa[1] != sb[0] or min(sa[0], sa[1], sb[1]) < 16:
        return None
    if a.type.scalar.name != b.type.scalar.name or a.type.scalar.name not in ("fp16", "bf16", "fp32"):
        return None
    if out_dtype is not None and getattr(out_dtype, "name", None) != _FP32:
        return None
    if acc is not None and not (isinstance(acc, tl.tensor) and acc.type.scalar.name == _FP32
                                and _shape(acc.type) == [sa[0], sb[1]]):  # fmt: skip
        return None
    return stand_in(_block(tl.float32, [sa[0], sb[1]]))


_REDUCE = {"max": "max", "min": "min", "sum": "sum"}


def reduction(args, kwargs):
    """``tl.max``/``tl.min``/``tl.sum`` of an fp32 stand-in over one axis: its stand-in result, or None."""
    import triton.language as tl

    if not args or not is_fake(args[0]) or len(args) > 2:
        return None
    if set(kwargs) - {"axis", "keep_dims"} or kwargs.get("keep_dims", False):
        return None
    x = args[0]
    axis = args[1] if len(args) > 1 else kwargs.get("axis")
    axis = getattr(axis, "value", axis)
    shape = _shape(x.type)
    if x.type.scalar.name != _FP32 or not isinstance(axis, int) or shape is None or len(shape) < 2:
        return None
    if not 0 <= axis < len(shape):
        return None
    return stand_in(_block(tl.float32, shape[:axis] + shape[axis + 1 :]))


def reduction_kind(fn) -> str | None:
    import triton.language.standard as std

    for name in _REDUCE:
        f = getattr(std, name, None)
        if f is not None and getattr(f, "fn", None) is fn:
            return name
    return None


# --- the patches -----------------------------------------------------------------------------------------------------
_ADDRESS_OPS = {  # builder calls whose every operand is an address, a mask, an offset or a condition
    "create_make_tensor_descriptor", "create_descriptor_load", "create_descriptor_gather", "create_assert",
    "create_atomic_rmw", "create_atomic_cas", "create_advance", "create_make_block_ptr", "create_tensor_pointer_load",
    "create_tensor_pointer_store", "create_print", "create_descriptor_scatter",
}  # fmt: skip


def _transposed(x, fget):
    out = _fast("T", (x,), {})
    if out is None:
        return _taint(fget(x), "T")
    if AUDIT[0]:
        audit("T", out, fget(x))
    return out


def audit(name: str, fake, real) -> None:
    """IOSIM_FAST_AUDIT: the stand-in's type must be the type Triton's own operation gives."""
    if getattr(real, "type", None) != fake.type:
        raise AssertionError(f"--fast's rule for {name} gives {fake.type}, Triton gives {getattr(real, 'type', real)}")


def _wrap_builtin(name: str, member):
    def wrapped(*args, **kwargs):
        fake = _any_fake(args, kwargs)
        if not fake and name != "dot":
            return member(*args, **kwargs)
        out = _fast(name, args, {k: v for k, v in kwargs.items() if k != "_semantic"})
        if out is not None:
            if AUDIT[0]:
                audit(name, out, member(*args, **kwargs))
            return out
        if not fake:
            return member(*args, **kwargs)
        return _taint(member(*args, **kwargs), f"{name}()")

    return wrapped


def _wrap_dunder(name: str, member):
    def wrapped(self, *args, **kwargs):
        if is_fake(self):
            what = name.strip("_")
            raise FastRefusedError(
                f"a branch condition, loop bound or scalar ({what}) computed from a value it skipped"
            )
        return member(self, *args, **kwargs)

    return wrapped


def _wrap_builder(name: str, method):
    def wrapped(self, *args, **kwargs):
        st = STATE[0]
        if not _any_fake(args, kwargs):
            before = st.loaded_fakes
            out = method(self, *args, **kwargs)
            if st.loaded_fakes != before:
                mark(out)  # a descriptor load of memory a stand-in was stored to
            return out
        if name in _ADDRESS_OPS or (name == "create_descriptor_store" and _any_fake((args[0], args[2]), {})):
            raise FastRefusedError(f"{name.removeprefix('create_')} given a value computed from one it skipped")
        out = method(self, *args, **kwargs)
        if not _mark_all(out):
            raise FastRefusedError(f"{name.removeprefix('create_')} computed from a value it skipped")
        return out

    return wrapped


@contextlib.contextmanager
def active(span):
    """Install --fast in this process for the block: the builder's and the language patches' stand-in rules, and the
    host-read guard (``span(tensor)``: the (start, nbytes) of a torch tensor's elements). Restores everything
    after."""
    import triton.language as tl
    from torch.overrides import TorchFunctionMode

    I = _interp()
    B = I.InterpreterBuilder
    skip = {"create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas"}  # counted hooks
    saved_builder = {n: getattr(B, n) for n in dir(B) if n.startswith("create_") and n not in skip}
    saved_set_attr = I._LangPatchScope.set_attr
    STATE[0] = _State()

    def set_attr(scope, obj, name, value):
        if name in ("__bool__", "__index__", "__repr__", "__str__") and obj is tl.tensor:
            value = _wrap_dunder(name, value)
        elif isinstance(value, property) and name == "T":
            fget = value.fget
            value = property(lambda self: _transposed(self, fget) if is_fake(self) else fget(self))
        elif callable(value) and not isinstance(value, type) and name not in ("range", "static_range"):
            value = _wrap_builtin(name, value)
        return saved_set_attr(scope, obj, name, value)

    class HostGuard(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            st = STATE[0]
            name = getattr(func, "__name__", "")
            if st.any and not st.in_launch and name not in _METADATA:
                touched = [t for t in _tensors(args, kwargs) if st.overlaps(*(span(t) or (0, 0)))]
                if touched and name in _VIEW_OR_COPY:  # a view reads nothing; a copy would
                    out = func(*args, **kwargs)
                    if all(_shares(out, t) for t in touched):
                        return out
                if touched:
                    raise FastRefusedError(f"host code's torch {name or func}() reading an output it did not compute")
            return func(*args, **kwargs)

    for n, m in saved_builder.items():
        setattr(B, n, _wrap_builder(n, m))
    I._LangPatchScope.set_attr = set_attr
    ENABLED[0] = True
    AUDIT[0] = os.environ.get("IOSIM_FAST_AUDIT") == "1"
    try:
        with HostGuard(), np.errstate(all="ignore"):
            yield STATE[0]
    finally:
        ENABLED[0] = False
        I._LangPatchScope.set_attr = saved_set_attr
        for n, m in saved_builder.items():
            setattr(B, n, m)


_METADATA = {  # torch functions that read no element: shapes, strides, addresses, views, allocations
    "__get__", "data_ptr", "size", "stride", "dim", "numel", "element_size", "is_contiguous", "storage_offset",
    "untyped_storage", "empty_like", "new_empty", "view", "transpose", "permute", "unsqueeze", "squeeze", "expand",
    "as_strided", "select", "narrow", "__len__", "__hash__", "detach", "is_floating_point", "is_complex", "get_device",
    "t", "movedim", "swapaxes", "swapdims", "diagonal",
}  # fmt: skip


_VIEW_OR_COPY = {  # a view where they can be (then allowed), else a copy (then refused)
    "reshape", "flatten", "contiguous", "view_as", "reshape_as", "unflatten", "__getitem__", "to", "cpu", "float",
    "half", "double", "bfloat16",
}  # fmt: skip


def _shares(out, t) -> bool:
    """Whether the torch tensor ``out`` is a view of ``t``'s storage (no element was read to make it)."""
    try:
        return out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    except (AttributeError, RuntimeError):
        return False


def _tensors(args, kwargs):
    for a in (*args, *kwargs.values()):
        if hasattr(a, "data_ptr") and hasattr(a, "element_size"):
            yield a
        elif isinstance(a, (tuple, list)):
            yield from _tensors(a, {})
