"""Triton backend: count a kernel's global-memory accesses under Triton's interpreter (``TRITON_INTERPRET=1``).

Under the interpreter every global access of a kernel reaches a method of
``triton.runtime.interpreter.InterpreterBuilder``: ``create_masked_load`` / ``create_masked_store`` (plain loads
and stores, tensor descriptors, atomic loads and stores) and ``create_atomic_rmw`` / ``create_atomic_cas``. Their
pointers are host addresses of the (CPU) torch tensors handed to the kernel; masked-off lanes move nothing. Each
access is attributed to the argument its pointer was derived from, not to whichever argument's storage holds the
address (arguments may share storage: K and V split from one cache tensor, V nested in K as an MLA latent's first
columns): each tensor argument enters the kernel as its address plus a tag ``(range id + 1) << 48`` in the bits
above the 48-bit user address space, the pointer arithmetic of the kernel (``addptr``, ``where``, broadcasts, casts
to integers and back) carries the tag along, and the hooks read the argument off the tag and strip it before
memory is touched. A pointer the kernel did not derive from an argument (an address loaded from memory) carries no
tag and is attributed by address. The programs of a launch run one after another
(``set_grid_idx`` marks each), so a kernel that waits for another program may never finish (the caller's time
limit catches it). These are private APIs: their signatures are checked at run time and a version whose hooks do
not match is refused with one line naming the supported range. A launch's arguments are bound as Triton's
``GridExecutor`` binds them (launch options dropped first). ``@triton.autotune`` kernels run without the
autotuner's benchmark (it needs a GPU): the config named (``--config``), the only one, or each in turn, and every
launch records which config ran. ``TRITON_INTERPRET=1`` must be set before ``triton`` is first imported: the counting
subprocess (:func:`iosim.kernels.count_file`) does that.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from iosim.base.errors import InputError, install_hint

SKIP_REPATCH = True  # see _Session.device_call (tests compare both settings: the same counts and outputs)
SUPPORTED = "triton 3.7 to 3.x (tested with 3.7.1 and 3.9.0; the hooks are checked at run time)"
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
        raise InputError("backend triton", f"needs the extra: {install_hint('triton')}", str(e)) from None
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


TAG_SHIFT = 48  # x86-64 and AArch64 user addresses lie below 2**47: the bits above carry the argument's tag
_LOW = np.uint64((1 << TAG_SHIFT) - 1)


def _untag(lanes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(addresses, origin range id per lane: -1 where untagged) of tagged pointer lanes."""
    lanes = np.asarray(lanes, dtype=np.uint64)
    return lanes & _LOW, (lanes >> np.uint64(TAG_SHIFT)).astype(np.int64) - 1


def _lanes(ptr, mask) -> np.ndarray:
    data = np.asarray(ptr.data)
    if mask is None:
        return data.ravel()
    m = np.broadcast_to(np.asarray(mask.data, dtype=bool), data.shape)
    return data[m]


def bind(fn, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """The kernel's arguments by parameter name, bound as Triton's ``GridExecutor`` binds them: keywords that are not
    parameters of the kernel (launch options: ``num_warps``, ``num_stages``, ``num_ctas``, ``maxnreg``, ... the
    autotuner adds them from its config) are dropped first. Returns (arguments, launch options)."""
    spec = inspect.getfullargspec(fn)
    params = set(spec.args) | set(spec.kwonlyargs)
    options = {k: _plain(v) for k, v in kwargs.items() if k not in params}
    try:
        named = inspect.getcallargs(fn, *args, **{k: v for k, v in kwargs.items() if k in params})
    except TypeError as e:
        name = getattr(fn, "__name__", "kernel")
        raise InputError(
            f"kernel {name}", "must be launched with arguments that bind to its parameters", str(e)
        ) from None
    return named, options


def _plain(v):
    """A constexpr or option value as JSON carries it."""
    v = getattr(v, "value", v)
    return v if v is None or isinstance(v, (int, float, bool, str)) else repr(v)


def config_label(config) -> str:
    """An autotune config as ``BLOCK_M=128,BLOCK_N=64,num_warps=4,num_stages=3`` (what ``--config`` accepts)."""
    return ",".join(f"{k}={v}" for k, v in config.all_kwargs().items() if k != "ir_override")


def choose_config(kernel: str, labels: list[str], wanted) -> int:
    """The index of the config to count among an autotuned kernel's ``labels``: ``wanted`` is an index (counting
    each config in turn), a label or part of one (``BLOCK_M=64,num_warps=4``), or None with a single config."""
    n = len(labels)
    if isinstance(wanted, int):
        if 0 <= wanted < n:
            return wanted
        raise InputError("--config", f"autotuned kernel {kernel} has {n} configs, not {wanted + 1}")
    if wanted is None:
        return 0
    pairs = [p.strip() for p in str(wanted).split(",") if p.strip()]
    found = [i for i, lab in enumerate(labels) if all(p in lab.split(",") for p in pairs)]
    if len(found) != 1:
        accepted = f"must name one config of autotuned kernel {kernel} (K=V,... matching exactly one of: "
        raise InputError("--config", accepted + "; ".join(labels) + ")", wanted)
    return found[0]


def _method(hook):
    """A plain function that calls ``hook`` (a bound method of a :class:`_Session`) with the instance first: set on
    one of Triton's classes, it receives that class's instance (the builder, the grid executor, ...) as ``self``."""

    def method(obj, *args, **kwargs):
        return hook(obj, *args, **kwargs)

    return method


@dataclass(eq=False)
class _Session:
    """The state the hooks share while installed: the recorder, the interpreter's own functions they wrap, and the
    argument tags of the launch in progress.

    ``tags``: this launch's parameter name -> its tag ((range id + 1) << TAG_SHIFT); ``host``: id(host tensor) ->
    (the tensor, its tag), for the interpreter's conversion of the same object to a pointer; ``patched``: within the
    current launch, the triton.language modules a helper call has patched; ``pending``: the config an autotuner is
    launching (its label)."""

    recorder: object
    config: object
    interpreter: object  # triton.runtime.interpreter
    tl: object  # triton.language
    fast_mode: object  # iosim.kernels.fast
    triton_dir: str
    own_files: set
    saved: dict = field(default_factory=dict)
    in_launch: bool = False
    tags: dict = field(default_factory=dict)
    host: dict = field(default_factory=dict)
    patched: set = field(default_factory=set)
    pending: list = field(default_factory=list)

    # --- installing ---------------------------------------------------------------------------------------------

    def targets(self) -> dict:
        """What the hooks replace while counting: label -> (owner, attribute, hook)."""
        from triton.runtime import autotuner

        interp = self.interpreter
        B, G = interp.InterpreterBuilder, interp.GridExecutor
        F, T = interp.InterpretedFunction, autotuner.Autotuner
        descriptors = {  # a tensor descriptor's load and store (gathers and scatters go through them), where they exist
            f"descriptor_{op}": (B, f"create_descriptor_{op}", _method(self.descriptor(op)))
            for op in ("load", "store") if hasattr(B, f"create_descriptor_{op}")
        }  # fmt: skip
        return {
            **descriptors,
            "load": (B, "create_masked_load", _method(self.load)),
            "store": (B, "create_masked_store", _method(self.store)),
            "rmw": (B, "create_atomic_rmw", _method(self.rmw)),
            "cas": (B, "create_atomic_cas", _method(self.cas)),
            "set_grid_idx": (B, "set_grid_idx", _method(self.set_grid_idx)),
            "set_grid_dim": (B, "set_grid_dim", _method(self.set_grid_dim)),
            "launch": (G, "__call__", _method(self.launch)),
            "init_args": (G, "_init_args_hst", _method(self.init_args)),
            "tuned_run": (T, "run", _method(self.tuned_run)),
            "device_call": (F, "__call__", _method(self.device_call)),
            "tagged_cvt": (interp, "_implicit_cvt", self.tagged_cvt),
        }

    def install(self) -> None:
        """Keep each original (``saved``, by the label of its hook) and set its hook in its place."""
        targets = self.targets()
        self.saved = {label: getattr(owner, name) for label, (owner, name, _) in targets.items()}
        for owner, name, hook in targets.values():
            setattr(owner, name, hook)

    def restore(self) -> None:
        """Put every original back."""
        for label, (owner, name, _) in self.targets().items():
            setattr(owner, name, self.saved[label])

    # --- the accesses -------------------------------------------------------------------------------------------

    def guard(self, ptrs, mask, oob):
        """The mask with the out-of-bounds lanes switched off: they are reported (exit 1) and never touch memory,
        which the interpreter would otherwise read or write at a host address outside the arrays."""
        if oob is None:
            return mask
        shape = np.shape(ptrs.data)
        m = np.ones(shape, dtype=bool) if mask is None else np.broadcast_to(np.asarray(mask.data, bool), shape).copy()
        flat = m.reshape(-1)
        flat[np.flatnonzero(flat)[oob]] = False
        return self.interpreter.TensorHandle(flat.reshape(shape), self.tl.int1)

    def site(self) -> tuple | None:
        """The access's site: the kernel's source lines (and call instructions) on the stack, kernel first, down
        to the ``tl.load`` (or store, atomic) that issued it; the interpreter runs a kernel and its jitted helpers as
        Python code compiled with their own file and line numbers. Frames of Triton and of this module are skipped
        (None: a kernel living inside Triton, whose sites cannot be told apart this way); the walk stops at the
        launch (:meth:`launch`)."""
        frames, f = [], sys._getframe(2)
        stop = _Session.launch.__code__
        while f is not None and f.f_code is not stop:
            name = f.f_code.co_filename
            if not name.startswith(self.triton_dir) and name not in self.own_files:
                frames.append((name, f.f_lineno, f.f_lasti))  # f_lasti: two calls on one line are two sites
            f = f.f_back
        return tuple(reversed(frames)) or None

    def real(self, what: str, *handles) -> None:
        """Under --fast: an address or a mask must be a computed value."""
        fm = self.fast_mode
        if fm.ENABLED[0] and any(fm.is_fake(h) for h in handles if h is not None):
            raise fm.FastRefusedError(f"the {what}, computed from a value it skipped")

    def access(self, ptrs, mask, kind: str):
        """Record the enabled lanes of a pointer block, each lane for the argument whose tag its pointer carries
        (an access mixing pointers of several arguments, as ``tl.where`` of two can, is one access per argument;
        an untagged lane is attributed by address). Returns (the lanes' addresses, their size, the out-of-bounds
        lanes or None, the pointers with the tags stripped)."""
        lanes, size = _lanes(ptrs, mask), _itemsize(ptrs)
        addr, origin = _untag(lanes)
        data = np.asarray(ptrs.data)
        if data.size and (np.asarray(data, dtype=np.uint64) >> np.uint64(TAG_SHIFT)).any():
            ptrs = self.interpreter.TensorHandle(np.asarray(data, dtype=np.uint64) & _LOW, ptrs.dtype)
        where, record = self.site(), self.recorder.access
        if origin.size == 0 or (origin == origin[0]).all():
            o = int(origin[0]) if origin.size else -1
            return addr, size, record(addr, kind, size, np.shape(data), where, o if o >= 0 else None), ptrs
        oob = np.zeros(addr.size, dtype=bool)
        for o in np.unique(origin):
            sel = origin == o
            got = record(addr[sel], kind, size, np.shape(data), where, int(o) if o >= 0 else None)
            if got is not None:
                oob[np.flatnonzero(sel)[got]] = True
        return addr, size, (oob if oob.any() else None), ptrs

    def descriptor(self, op: str):
        """The hook of ``create_descriptor_load`` / ``_store``: the masked load or store it issues, counted as one
        through a tensor descriptor (its sectors apart from the LSU's: counting.sectors_of)."""

        def hook(builder, *args, **kw):
            rec, outer = self.recorder, self.recorder.descriptor
            rec.descriptor = True
            try:
                return self.saved[f"descriptor_{op}"](builder, *args, **kw)
            finally:
                rec.descriptor = outer

        return hook

    def load(self, builder, ptrs, mask, *rest, **kw):
        """``tl.load`` (``create_masked_load``): record the words a masked pointer block reads, attributed to the
        argument whose address tag the pointer carries, then load with the tags stripped and out-of-bounds lanes
        off; under --fast, a load of memory a stand-in was stored to (or with a stand-in ``other``) yields one."""
        fm = self.fast_mode
        self.real("address or mask of a load", ptrs, mask)
        lanes, size, oob, ptrs = self.access(ptrs, mask, "r")
        out = self.saved["load"](builder, ptrs, self.guard(ptrs, mask, oob), *rest, **kw)
        if fm.ENABLED[0]:
            st = fm.STATE[0]
            if (rest and fm.is_fake(rest[0])) or st.poisoned(lanes, size):  # memory a stand-in was stored to
                fm.mark(out)
                st.loaded_fakes += 1
        return out

    def store(self, builder, ptrs, value, mask, *rest, **kw):
        """``tl.store`` (``create_masked_store``): record the words a masked pointer block writes, attributed to
        the argument whose address tag the pointer carries; under --fast, a stand-in value is counted and not
        written (its bytes are marked as holding one)."""
        fm = self.fast_mode
        self.real("address or mask of a store", ptrs, mask)
        lanes, size, oob, ptrs = self.access(ptrs, mask, "w")
        if fm.ENABLED[0]:
            if fm.is_fake(value):  # counted; nothing written; the bytes hold a value not computed
                fm.STATE[0].mark(lanes, size)
                return None
            fm.STATE[0].clear(lanes, size)
        return self.saved["store"](builder, ptrs, value, self.guard(ptrs, mask, oob), *rest, **kw)

    def rmw(self, builder, op, ptr, val, mask, *rest, **kw):
        """``tl.atomic_add`` and the other read-modify-writes (``create_atomic_rmw``): record each enabled lane as
        an atomic access; under --fast, one on a value not computed is counted and not performed."""
        fm = self.fast_mode
        self.real("address or mask of an atomic", ptr, mask)
        lanes, size, oob, ptr = self.access(ptr, mask, "a")
        if fm.ENABLED[0] and (fm.is_fake(val) or fm.STATE[0].poisoned(lanes, size)):
            # an add (max, ...) of a value not computed, or into memory holding one: counted, not performed; the
            # memory and the old values it returns are not computed
            fm.STATE[0].mark(lanes, size)
            return fm.stand_in_values(ptr)
        return self.saved["rmw"](builder, op, ptr, val, self.guard(ptr, mask, oob), *rest, **kw)

    def cas(self, builder, ptr, cmp, val, *rest, **kw):
        """``tl.atomic_cas`` (``create_atomic_cas``): record every lane as an atomic access (no mask); --fast refuses
        one whose operands or memory hold a value it skipped (the swap's outcome would be unknown)."""
        fm = self.fast_mode
        self.real("address, mask or operands of a compare-and-swap", ptr, None, cmp, val)
        if fm.ENABLED[0] and fm.STATE[0].poisoned(_untag(_lanes(ptr, None))[0], _itemsize(ptr)):
            raise fm.FastRefusedError("a compare-and-swap on memory holding a value it skipped")
        _, _, _, ptr = self.access(ptr, None, "a")
        return self.saved["cas"](builder, ptr, cmp, val, *rest, **kw)

    # --- programs and launches ----------------------------------------------------------------------------------

    def set_grid_idx(self, builder, x, y, z, *a, **kw):
        """The interpreter starts the program at grid index (x, y, z): a new program for the recorder."""
        out = self.saved["set_grid_idx"](builder, x, y, z, *a, **kw)
        self.recorder.begin_program((x, y, z))
        return out

    def set_grid_dim(self, builder, *grid, **kw):
        """The launch's grid, recorded with the launch (an uncounted launch records nothing)."""
        rec = self.recorder
        if rec.launch_info and not rec.paused:
            rec.launch_info[-1]["grid"] = [int(g) for g in grid]
        return self.saved["set_grid_dim"](builder, *grid, **kw)

    def launch(self, executor, *args, **kwargs):
        """``kernel[grid](...)`` (``GridExecutor.__call__``): begin a launch, tag each tensor argument with its
        range, keep what recompiling it needs, then run it as Triton does."""
        named, options = bind(executor.fn, args, kwargs)
        constexprs = list(getattr(executor, "constexprs", []))
        info = {"constexprs": {k: _plain(named[k]) for k in constexprs if k in named}, "options": options,
                "config": self.pending[-1] if self.pending else None}  # fmt: skip
        self.recorder.begin_launch(getattr(executor.fn, "__name__", "kernel"), info)  # (before the arguments)
        self.tag_arguments(named)
        self.keep_spec(executor.fn, named, constexprs)
        fm = self.fast_mode
        outer, self.in_launch = self.in_launch, True
        fm.STATE[0].in_launch = True
        self.patched.clear()
        try:
            return self.saved["launch"](executor, *args, **kwargs)
        finally:
            self.in_launch = fm.STATE[0].in_launch = outer

    def tag_arguments(self, named: dict) -> None:
        """Register each tensor argument's memory (a tensor descriptor's base tensor) as a named range and keep its
        tag; refuse an argument that is neither a tensor, a number nor a constexpr."""
        rec = self.recorder
        self.tags.clear()
        for name, arg in named.items():
            base = getattr(arg, "base", None) if type(arg).__name__ == "TensorDescriptor" else arg
            if hasattr(base, "data_ptr") and hasattr(base, "element_size"):
                if not rec.paused:  # an uncounted launch names nothing
                    rid = rec.register_argument(name, *_extent(base))
                    if rid is not None:
                        self.tags[name] = np.uint64((rid + 1) << TAG_SHIFT)
            elif not (arg is None or isinstance(arg, (int, float, bool, str, tuple))) and not hasattr(arg, "value"):
                raise InputError(
                    f"argument {name}", "must be a torch tensor, a number or a constexpr", type(arg).__name__
                )

    def keep_spec(self, fn, named: dict, constexprs: list) -> None:
        """Keep (kernel, arguments, constexpr names) of a counted launch for :func:`launch_specs`."""
        rec = self.recorder
        if not rec.paused:
            specs = getattr(rec, "launch_specs", None)
            if specs is None:
                specs = rec.launch_specs = []
            specs.append((fn, named, constexprs))

    def init_args(self, executor, args_dev, kwargs):
        """Triton's copy of the arguments to the host, then which host tensor is which parameter (the interpreter
        binds the same objects next and converts each to a pointer: :meth:`tagged_cvt`)."""
        args_hst, kwargs_hst = self.saved["init_args"](executor, args_dev, kwargs)
        self.host.clear()
        if self.tags:
            try:
                bound = inspect.getcallargs(executor.fn, *args_hst, **kwargs_hst)
            except TypeError:
                bound = {}
            for name, arg in bound.items():
                base = getattr(arg, "base", None) if type(arg).__name__ == "TensorDescriptor" else arg
                if name in self.tags and base is not None:
                    self.host[id(base)] = (base, self.tags[name])
        return args_hst, kwargs_hst

    def tagged_cvt(self, arg):
        """The interpreter's conversion of an argument to a pointer, with the argument's tag in its high bits."""
        out = self.saved["tagged_cvt"](arg)
        hit = self.host.get(id(arg)) if hasattr(arg, "data_ptr") else None
        if hit is not None and hit[0] is arg:
            out.handle.data = np.asarray(out.handle.data, dtype=np.uint64) + hit[1]
        return out

    def device_call(self, helper, *args, **kwargs):
        """A jitted helper called from a kernel. On every such call Triton patches the triton.language modules the
        helper's globals hold (``triton.language``, ``triton.language.core``: module objects shared by every
        function) and never restores them before the launch ends; once a module is patched in a launch, patching
        it again changes nothing, so it is skipped (a fifth of the interpreter's time in a flash kernel's
        reductions, tl.max and tl.sum being jitted helpers). The helper itself runs exactly as Triton runs it."""
        fm, tl = self.fast_mode, self.tl
        if fm.ENABLED[0] and fm.reduction_kind(helper.fn):
            out = fm.reduction(args, kwargs)
            if out is not None:
                if fm.AUDIT[0]:
                    fm.audit(helper.fn.__name__, out, self.saved["device_call"](helper, *args, **kwargs))
                return out
        langs = frozenset(id(v) for v in helper.fn.__globals__.values() if v is tl or v is tl.core)
        if not (SKIP_REPATCH and self.in_launch and langs <= self.patched):
            out = self.saved["device_call"](helper, *args, **kwargs)
            if self.in_launch:
                self.patched.update(langs)
            return out
        try:
            return helper.rewrite()(*args, **kwargs)
        except Exception as e:
            raise self.interpreter.InterpreterError(repr(e)) from e

    def tuned_run(self, tuner, *args, **kwargs):
        """The autotuner without its benchmark (which needs a GPU): the chosen config, launched as Triton does; the
        kernel's config labels are recorded in ``recorder.autotuned``."""
        kernel = getattr(tuner.base_fn, "__name__", "kernel")
        tuner.nargs = dict(zip(tuner.arg_names, args, strict=False))  # as Triton's Autotuner.run
        configs = tuner.prune_configs(kwargs) if tuner.early_config_prune else list(tuner.configs)
        labels = [config_label(c) for c in configs]
        self.recorder.autotuned[kernel] = labels
        k = choose_config(kernel, labels, self.config if len(configs) > 1 else None)
        chosen = configs[k]
        tuner.best_config = chosen
        if chosen.pre_hook is not None:
            chosen.pre_hook({**tuner.nargs, **kwargs, **chosen.all_kwargs()})
        self.pending.append(labels[k] + (f" (config {k + 1} of {len(labels)})" if len(labels) > 1 else ""))
        try:
            return tuner.fn.run(*args, **kwargs, **chosen.all_kwargs())
        finally:
            self.pending.pop()
            tuner.nargs = None


@contextlib.contextmanager
def hooks(recorder, config=None, fast: bool = False):
    """Install the counting hooks for the duration of the block (the interpreter must be active). ``config`` picks
    the config of an autotuned kernel with several (see :func:`choose_config`); each autotuned kernel's configs are
    recorded in ``recorder.autotuned`` (kernel -> labels). ``fast`` skips the values no count depends on
    (:mod:`iosim.kernels.fast`)."""
    require()
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    from iosim.kernels import fast as fast_mode

    session = _Session(
        recorder, config, interpreter, tl, fast_mode,
        triton_dir=os.path.dirname(triton.__file__) + os.sep,
        own_files={__file__, fast_mode.__file__},  # iosim's hooks and --fast's wrappers: no part of a site
    )  # fmt: skip
    recorder.autotuned = {}
    recorder.count_sectors = True  # each tl.load / tl.store of a program is one request (counting.sectors_of)
    session.install()
    try:
        with fast_mode.active(array_range) if fast else contextlib.nullcontext():
            yield
    finally:
        session.restore()
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
