"""Pallas backend: count a Pallas kernel's HBM traffic under jax's TPU interpret mode (on the CPU).

TPU interpret mode (``jax._src.pallas.mosaic.interpret``) keeps every memory space as explicit buffers in a
simulated shared memory: a block spec's copy of an input block from HBM into VMEM, the copy of an output block back,
and every DMA are explicit reads and writes of an HBM buffer (``SharedMemory.get_buffer_content`` /
``store_buffer_content``), and, as on the hardware, a block is not copied again when its block index does not
change between grid steps. Each HBM read or write is counted here element by element (the in-bounds part of its
range); each HBM buffer gets its own address range, named after the kernel parameter that reads or writes it (or
``hbm<N>``); a launcher may rename them with a ``"names"`` entry (kernel name -> model name). Grid steps are the
programs (the interpreter's grid-point recorder marks each). The whole launch is run under
``force_tpu_interpret_mode``: kernels written for TPUs (such as jax's own
``jax.experimental.pallas.ops.tpu.flash_attention``) run unchanged. Private APIs: checked at run time.

**GPU ops** (kernels whose compiler params are Triton's, such as ``jax.experimental.pallas.ops.gpu.attention.mha``
and ``decode_attention.mqa``) fail under the TPU interpreter; they run under the generic one
(``hlo_interpreter.pallas_call_hlo_interpret``), which copies each grid step's blocks out of the whole arrays and
discharges the kernel's state primitives (pallas ``load_p``/``swap_p``, state ``get_p``/``swap_p``) into array ops.
Semantics as for Triton: under the Triton lowering a kernel's refs are global memory (a BlockSpec'd ref is a view
into its array), so every load/get and store/swap the kernel issues on a ref of a pallas_call operand is global
traffic, element by element, masked-off lanes moving nothing; the interpreter's own block copies are not counted.
How: the discharge rules are wrapped; each access on an operand's ref (the ref is identified by its position among
the kernel's invars, which follows in_specs then out_specs, followed into loop and cond bodies) is replayed on an
index array of the block's shape, giving the block-local element of each lane, and reported with its mask through
a ``jax.debug.callback``; the interpreter's block copy of each grid step reports the block's start (an
``io_callback`` the kernel's accesses depend on), so each element is placed in its whole array and each grid step
is one program. Operands are named after the kernel's parameters (``q_ref`` -> ``q``; the launcher's ``"names"``
renames them). Triton's atomics (``atomic_rmw``, ``atomic_cas``) are a read and a write per lane. Not
supported: scalar prefetch, dynamic grids, strided slices.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from dataclasses import dataclass, field

import numpy as np

from iosim.base.errors import InputError, install_hint

SUPPORTED = "jax 0.10 (TPU interpret mode: SharedMemory.get/store_buffer_content, grid_point_recorder)"
HBM = ("hbm", "any")
_SPAN = 1 << 40  # synthetic address space: one span per HBM buffer allocation


def _modules():
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    from jax._src.pallas.mosaic.interpret import shared_memory as sm

    return ipc, sm


def require() -> None:
    try:
        import jax
    except ImportError as e:
        raise InputError("backend pallas", f"needs the extra: {install_hint('pallas')}", str(e)) from None
    try:
        ipc, sm = _modules()
        from jax.experimental.pallas import tpu as pltpu

        ok = all(hasattr(sm.SharedMemory, m) for m in ("get_buffer_content", "store_buffer_content", "allocate_buffer"))
        ok = ok and hasattr(ipc, "get") and hasattr(ipc, "store") and hasattr(pltpu, "force_tpu_interpret_mode")
        ok = ok and "grid_point_recorder" in getattr(pltpu.InterpretParams, "__dataclass_fields__", {})
    except ImportError:
        ok = False
    if not ok:
        raise InputError("backend pallas", f"supports {SUPPORTED}", jax.__version__)


def array_range(x) -> tuple[int, int] | None:
    return None  # jax arrays are copied into the interpreter's buffers: name them with "names" instead


def to_numpy(x):
    try:
        a = np.asarray(x)
    except Exception:
        return None
    return a.astype(np.float64) if a.dtype.kind in "fiu" or a.dtype.name == "bfloat16" else None


def name_arrays(recorder, out: dict) -> None:
    """Name the HBM buffers after the launcher's arrays whose values they hold (jax copies arrays into them)."""
    for rid, buff in getattr(recorder, "hbm_buffers", []):
        content = np.asarray(buff.content)
        logical = content[tuple(slice(0, n) for n in buff.logical_shape)] if buff.logical_shape else content
        for name, x in out.items():
            if isinstance(x, (int, float, bool, str, dict)) or x is None or not hasattr(x, "shape"):
                continue
            a = np.asarray(x)
            if a.shape == logical.shape and a.dtype == logical.dtype and np.array_equal(a, logical, equal_nan=True):
                recorder.ranges[rid].name = name
                break


def _clean(name: str) -> str:
    return re.sub(r"(_tile)?_ref$", "", name)


def _function(hook):
    """A plain function calling ``hook`` (a bound method): what a module attribute or a class attribute must be
    where the caller reads attributes off it (``__wrapped__``) or expects the instance as ``self``."""

    def function(*args, **kwargs):
        return hook(*args, **kwargs)

    return function


@dataclass(eq=False)
class _TpuSession:
    """The state the TPU-interpreter hooks share while installed: the recorder, the interpreter's functions they
    wrap (``saved``), each HBM buffer's address range (``buffers``: key -> [range id, base, shape, itemsize]), the
    next address span (``next_span``), whether pallas_call is handing its outputs back (``handing_back``: those
    reads are not the kernel's) and whether the launch has begun (``started``)."""

    recorder: object
    ipc: object  # jax._src.pallas.mosaic.interpret.interpret_pallas_call
    gpu_error: InputError | None = None  # why GPU kernels cannot be counted here (TPU kernels still are)
    saved: dict = field(default_factory=dict)
    buffers: dict = field(default_factory=dict)
    next_span: int = 1
    handing_back: bool = False
    started: bool = False

    def targets(self, S) -> dict:
        """What the hooks replace while counting: label -> (owner, attribute, hook)."""
        ipc = self.ipc
        return {
            "allocate_buffer": (S, "allocate_buffer", _function(self.allocate_buffer)),
            "get_buffer_content": (S, "get_buffer_content", _function(self.get_buffer_content)),
            "store_buffer_content": (S, "store_buffer_content", _function(self.store_buffer_content)),
            "get": (ipc, "get", _function(self.get)),
            "store": (ipc, "store", _function(self.store)),
            "interpret_pallas_call": (ipc, "interpret_pallas_call", self.interpret_pallas_call),
        }

    def install(self, S) -> None:
        """Keep each original (by the label of its hook) and set its hook in its place; the DMAs call the
        undecorated get and store (``__wrapped__``), which stay the originals'."""
        targets = self.targets(S)
        self.saved = {label: getattr(owner, name) for label, (owner, name, _) in targets.items()}
        for label in ("get", "store"):
            hook, orig = targets[label][2], self.saved[label]
            hook.__wrapped__ = getattr(orig, "__wrapped__", orig)
        for owner, name, hook in targets.values():
            setattr(owner, name, hook)

    def restore(self, S) -> None:
        """Put every original back."""
        for label, (owner, name, _) in self.targets(S).items():
            setattr(owner, name, self.saved[label])

    def hbm_key(self, memory_space, buffer_id, device_id):
        """The shared memory's key of an HBM buffer."""
        name = self.ipc.TPU_MEMORY_SPACE_NAMES[int(memory_space)]
        return (name, int(buffer_id), int(device_id), 0)

    def allocate_buffer(self, memory, key, ref_count, value, *rest, **kw):
        """A new HBM buffer: its own address span, registered as a range named ``hbm<N>`` until a get or store
        names it (:meth:`name`)."""
        new = key not in memory.mem
        out = self.saved["allocate_buffer"](memory, key, ref_count, value, *rest, **kw)
        if new and key[0] in HBM:
            rec, v = self.recorder, np.asarray(value)
            base = self.next_span * _SPAN
            self.next_span += 1
            rec.register(f"hbm{key[1]}", base, v.size * v.itemsize, v.itemsize)
            self.buffers[key] = [len(rec.ranges) - 1, base, v.shape, v.itemsize]
            rec.hbm_buffers.append((len(rec.ranges) - 1, memory.mem[key]))
        return out

    def touched(self, key, rnge) -> np.ndarray | None:
        """The flat element indices a range (a tuple of slices) selects in buffer ``key`` (None: not an HBM
        buffer of ours; empty: a range outside it)."""
        info = self.buffers.get(key)
        if info is None:
            return None
        idx = np.arange(int(np.prod(info[2])), dtype=np.int64).reshape(info[2])
        try:
            sel = idx[tuple(rnge)] if rnge else idx
        except IndexError:
            return np.zeros(0, dtype=np.int64)
        return np.asarray(sel).ravel()

    def note(self, key, rnge, kind):
        """Record the elements of HBM buffer ``key`` a read or write of ``rnge`` touches (in bounds)."""
        info = self.buffers.get(key)
        if info is None:
            return
        el = self.touched(key, rnge)
        if el is not None and el.size:
            self.tpu_launch()
            self.recorder.access(np.uint64(info[1]) + el.astype(np.uint64) * np.uint64(info[3]), kind, info[3])

    def get_buffer_content(self, memory, key, rnge, *rest, **kw):
        """A read of a buffer: counted when it is HBM's and not pallas_call handing an output back."""
        if key[0] in HBM and not self.handing_back:
            self.note(key, rnge, "r")
        return self.saved["get_buffer_content"](memory, key, rnge, *rest, **kw)

    def store_buffer_content(self, memory, key, rnge, value, *rest, **kw):
        """A write of a buffer: counted when it is HBM's."""
        if key[0] in HBM:
            self.note(key, rnge, "w")
        return self.saved["store_buffer_content"](memory, key, rnge, value, *rest, **kw)

    def name(self, memory_space, buffer_id, device_id, label):
        """Name an HBM buffer still called ``hbm<N>`` after the kernel parameter that reads or writes it."""
        info = self.buffers.get(self.hbm_key(memory_space, buffer_id, device_id))
        if info is not None and label and label != "unknown":
            r = self.recorder.ranges[info[0]]
            if r.name.startswith("hbm"):
                r.name = _clean(label)

    def get(self, token, device_id, local_core_id, memory_space, buffer_id, *rest, **kw):
        """The interpreter's get of a buffer: names it after the input; a bare get (no keywords) is pallas_call
        handing an output back to jax, not the kernel's read."""
        self.name(memory_space, buffer_id, device_id, kw.get("input_name"))
        self.handing_back = not kw
        try:
            return self.saved["get"](token, device_id, local_core_id, memory_space, buffer_id, *rest, **kw)
        finally:
            self.handing_back = False

    def store(self, token, device_id, local_core_id, memory_space, buffer_id, *rest, **kw):
        """The interpreter's store to a buffer: names it after the output."""
        self.name(memory_space, buffer_id, device_id, kw.get("output_name"))
        return self.saved["store"](token, device_id, local_core_id, memory_space, buffer_id, *rest, **kw)

    def tpu_launch(self):
        """Begin the launch (once) at its first counted access or grid point."""
        if not self.started:
            self.started = True
            self.recorder.begin_launch("pallas")

    def grid_point(self, token, *_):
        """The interpreter's grid-point recorder: each grid step is a program."""
        self.tpu_launch()
        self.recorder.begin_program()
        return token

    def interpret_pallas_call(self, *args, interpret_params=None, **params):
        """A pallas_call: a kernel for GPUs goes to the generic interpreter (counted by :func:`gpu_hooks`), or
        fails with the line saying why it cannot be counted; a TPU kernel runs under the TPU interpreter."""
        if _is_gpu_call(params):
            if self.gpu_error is not None:
                raise self.gpu_error
            from jax._src.pallas import hlo_interpreter as hi

            return hi.pallas_call_hlo_interpret(*args, **params)
        return self.saved["interpret_pallas_call"](*args, interpret_params=interpret_params, **params)


@contextlib.contextmanager
def hooks(recorder):
    """Count the HBM traffic of the Pallas kernels run in the block: TPU kernels under the TPU interpreter, GPU
    kernels (Triton compiler params) under the generic one (:func:`gpu_hooks`)."""
    require()
    ipc, sm = _modules()
    from jax.experimental.pallas import tpu as pltpu

    recorder.hbm_buffers = []
    session = _TpuSession(recorder, ipc)
    try:
        require_gpu()
    except InputError as e:  # TPU kernels are still counted; a GPU kernel then fails with this one line
        session.gpu_error = e
    session.install(sm.SharedMemory)
    try:
        gpu = gpu_hooks(recorder) if session.gpu_error is None else contextlib.nullcontext()
        with gpu, pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(grid_point_recorder=session.grid_point)):
            yield
    finally:
        session.restore(sm.SharedMemory)
        recorder.end_program()


# ---------------------------------------------------------------------------------------------------------------
# Pallas GPU (Triton-lowered) kernels under the generic interpreter
# ---------------------------------------------------------------------------------------------------------------
SUPPORTED_GPU = (
    "jax 0.10 (generic Pallas interpreter: hlo_interpreter.pallas_call_hlo_interpret / kernel_to_hlo_jaxpr, "
    "state discharge rules of pallas load_p/swap_p and state get_p/swap_p)"
)


def _gpu_modules():
    from jax._src.pallas import core as pallas_core
    from jax._src.pallas import hlo_interpreter as hi
    from jax._src.pallas import primitives as pp
    from jax._src.state import discharge as sd
    from jax._src.state import primitives as sp

    return hi, sd, pp, sp, pallas_core


def require_gpu() -> None:
    import jax

    try:
        hi, sd, pp, sp, pallas_core = _gpu_modules()
        ok = all(hasattr(hi, f) for f in ("pallas_call_hlo_interpret", "kernel_to_hlo_jaxpr", "_dynamic_slice"))
        ok = ok and hasattr(sd, "discharge_state") and isinstance(getattr(sd, "_discharge_rules", None), dict)
        ok = ok and all(p in sd._discharge_rules for p in (pp.load_p, pp.swap_p, sp.get_p, sp.swap_p))
        ok = ok and hasattr(pp, "program_id_p") and hasattr(pallas_core.BlockMapping, "compute_start_indices_interpret")
        fields = getattr(pallas_core.GridMapping, "__dataclass_fields__", {})
        ok = ok and all(f in fields for f in ("vmapped_dims", "num_index_operands", "block_mappings", "grid"))
    except (ImportError, AttributeError):
        ok = False
    if not ok:
        raise InputError("backend pallas (GPU ops)", f"supports {SUPPORTED_GPU}", jax.__version__)


def _is_gpu_call(params: dict) -> bool:
    """A pallas_call written for GPUs: its compiler params are Triton's or Mosaic GPU's."""
    cp = params.get("compiler_params")
    mod = type(cp).__module__ if cp is not None else ""
    return ".triton" in mod or ".mosaic_gpu" in mod


def _sub_jaxprs(eqn):
    from jax._src import core as jc

    for name, p in eqn.params.items():
        for x in p if isinstance(p, (tuple, list)) else (p,):
            if isinstance(x, jc.ClosedJaxpr):
                yield name, x.jaxpr
            elif isinstance(x, jc.Jaxpr):
                yield name, x


def _tag_refs(jaxpr, tag_of_var: dict, tags: dict) -> None:
    """tags[id(aval)] = operand for every ref var the operand reaches (discharge identifies refs by their aval)."""
    from jax._src import core as jc

    for v, t in tag_of_var.items():
        tags[id(v.aval)] = t
    for eqn in jaxpr.eqns:
        ins = list(eqn.invars)
        for name, sub in _sub_jaxprs(eqn):
            n = len(sub.invars)
            if eqn.primitive.name == "while":
                cn, bn = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
                outer = ins[:cn] + ins[cn + bn :] if name == "cond_jaxpr" else ins[cn:]
            elif n == len(ins):
                outer = ins
            elif eqn.primitive.name == "cond":
                outer = ins[1:]
            else:  # closed-over operands first, the sub-jaxpr's own binders last (or the other way round)
                outer = ins[len(ins) - n :] if n <= len(ins) else [None] * (n - len(ins)) + ins
            sub_tags = {
                s: tag_of_var[o]
                for s, o in zip(sub.invars, outer, strict=False)
                if isinstance(o, jc.Var) and o in tag_of_var and _same_type(s.aval, o.aval)
            }
            if eqn.primitive.name == "run_scoped":  # its own binders are scratch allocations: not global memory
                for s in sub.invars:
                    sub_tags.setdefault(s, -1)
            _tag_refs(sub, sub_tags, tags)


def _same_type(a, b) -> bool:
    return getattr(a, "shape", None) == getattr(b, "shape", None) and getattr(a, "dtype", 0) == getattr(b, "dtype", 0)


class _Launch:
    """One pallas_call: its operands' names, shapes, block shapes, and the block start of each grid point."""

    def __init__(self, lid, name, grid_mapping, names):
        self.lid, self.name, self.gm = lid, name, grid_mapping
        self.names = names
        self.cur = [None] * len(names)  # the start of each operand's block in the current grid step
        self.ds = self.marks = 0
        self.shapes = [tuple(bm.array_aval.shape) for bm in grid_mapping.block_mappings]
        self.itemsize = [np.dtype(bm.array_aval.dtype).itemsize for bm in grid_mapping.block_mappings]
        self.squeezed = []
        self.block = []
        for bm in grid_mapping.block_mappings:
            sq = [type(b).__name__ == "Squeezed" for b in bm.block_shape]
            sizes = [1 if s else int(getattr(b, "block_size", 1)) for b, s in zip(bm.block_shape, sq, strict=True)]
            self.squeezed.append(sq)
            self.block.append(sizes)


def _iota(aval):
    """The flat element index of each element of a ref's block (what a replayed access reads in place of data)."""
    import jax.numpy as jnp

    shape = tuple(aval.shape)
    return jnp.arange(int(np.prod(shape)) if shape else 1, dtype=jnp.int32).reshape(shape)


def _names_of(jaxpr, gm) -> list[str]:
    """The operands' names: the kernel's parameter names (``q_ref`` -> ``q``), else each block mapping's origin."""
    arg_names = list(getattr(getattr(jaxpr, "debug_info", None), "arg_names", None) or [])
    n0 = gm.num_index_operands
    out = []
    for k, bm in enumerate(gm.block_mappings):
        nm = arg_names[n0 + k] if n0 + k < len(arg_names) and arg_names[n0 + k] else str(bm.origin)
        nm = _clean(re.sub(r"\W+", "_", str(nm)).strip("_")) or f"arg{k}"
        out.append(nm)
    return out


def _block_elements(L: _Launch, k: int, idx: np.ndarray) -> tuple[np.ndarray, tuple]:
    """The whole-array flat element of each block-local lane ``idx`` of operand k in the current grid step, lanes
    outside the block or in the padding of a partial block dropped; and the array's shape."""
    kshape = [b for b, s in zip(L.block[k], L.squeezed[k], strict=True) if not s]
    size = int(np.prod(kshape)) if kshape else 1
    idx = idx[(idx >= 0) & (idx < size)]
    local = np.unravel_index(idx, kshape) if kshape else ()
    start = L.cur[k]
    coords, j = [], 0
    for dim, sq in enumerate(L.squeezed[k]):
        if sq:
            coords.append(np.full(idx.shape, int(start[dim]), dtype=np.int64))
        else:
            coords.append(int(start[dim]) + np.asarray(local[j], dtype=np.int64))
            j += 1
    shape = L.shapes[k]
    inside = np.ones(idx.shape, dtype=bool)
    for c, n in zip(coords, shape, strict=True):
        inside &= (c >= 0) & (c < n)  # the padding of a partial block is no element of the array
    flat = np.ravel_multi_index(tuple(c[inside] for c in coords), shape) if shape else np.zeros(int(inside.sum()))
    return flat, shape


@dataclass(eq=False)
class _GpuSession:
    """The state the generic-interpreter hooks share while installed: the recorder, the functions and discharge
    rules they wrap (``saved``, ``rules``), Triton's atomic primitives (``atomics``), every pallas_call seen
    (``launches``), each operand's address base by name (``bases``), the launch being traced (``launch``), its
    refs' operand tags (``tags``: id(aval) -> operand, -1 for scratch; None until its jaxpr is tagged), whether the
    next discharge is the kernel's own jaxpr (``top``) and the launch the last block copy belonged to (``last``)."""

    recorder: object
    jax: object
    hi: object  # jax._src.pallas.hlo_interpreter
    sd: object  # jax._src.state.discharge
    pp: object  # jax._src.pallas.primitives
    sp: object  # jax._src.state.primitives
    io_callback: object
    rules: dict = field(default_factory=dict)
    atomics: list = field(default_factory=list)
    saved: dict = field(default_factory=dict)
    launches: list = field(default_factory=list)
    bases: dict = field(default_factory=dict)
    launch: _Launch | None = None
    tags: dict | None = None
    top: bool = False
    last: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # XLA runs host callbacks on several threads

    # --- installing ---------------------------------------------------------------------------------------------

    def keep_rules(self) -> None:
        """Keep the discharge rules of the state primitives (and of Triton's atomics: a read and a write per
        lane) that the hooks replace."""
        pp, sp, sd = self.pp, self.sp, self.sd
        self.rules = {p: sd._discharge_rules[p] for p in (pp.load_p, pp.swap_p, sp.get_p, sp.swap_p)}
        try:
            from jax._src.pallas.triton import primitives as tp

            self.atomics = [
                p for p in (getattr(tp, "atomic_rmw_p", None), getattr(tp, "atomic_cas_p", None)) if p is not None
            ]
        except ImportError:
            self.atomics = []
        self.rules.update({p: sd._discharge_rules[p] for p in self.atomics if p in sd._discharge_rules})

    def install(self) -> None:
        """Wrap the interpreter's pallas_call, its kernel lowering, its block copy and state discharge, and replace
        the discharge rules of the loads and stores; clear jax's caches so that no launch lowered before runs
        without the callbacks."""
        hi, sd, pp, sp = self.hi, self.sd, self.pp, self.sp
        self.saved = {"call": hi.pallas_call_hlo_interpret, "k2h": hi.kernel_to_hlo_jaxpr,
                      "discharge": sd.discharge_state, "ds": hi._dynamic_slice}  # fmt: skip
        hi.pallas_call_hlo_interpret = self.pallas_call_hlo_interpret
        hi.kernel_to_hlo_jaxpr = self.kernel_to_hlo_jaxpr
        hi._dynamic_slice = self.dynamic_slice
        sd.discharge_state = self.discharge_state
        new_rules = {pp.load_p: self.load_rule, pp.swap_p: self.swap_rule, sp.get_p: self.get_rule,
                     sp.swap_p: self.state_swap_rule}  # fmt: skip
        for p, rule in zip(self.atomics, (self.atomic_rmw_rule, self.atomic_cas_rule), strict=False):
            if p in self.rules:
                new_rules[p] = rule
        sd._discharge_rules.update(new_rules)
        self.jax.clear_caches()  # a launch compiled before (without the callbacks) must be lowered again

    def restore(self) -> None:
        """Put the originals and the discharge rules back and clear jax's caches again."""
        hi, sd = self.hi, self.sd
        hi.pallas_call_hlo_interpret, hi.kernel_to_hlo_jaxpr = self.saved["call"], self.saved["k2h"]
        sd.discharge_state, hi._dynamic_slice = self.saved["discharge"], self.saved["ds"]
        sd._discharge_rules.update(self.rules)
        self.jax.clear_caches()

    # --- host side: block starts and accesses -------------------------------------------------------------------

    def base_of(self, name, nbytes, itemsize):
        """The base address of the operand called ``name``, registering its range on first use."""
        if name not in self.bases:
            self.bases[name] = (len(self.bases) + 1) * _SPAN
            self.recorder.register(name, self.bases[name], nbytes, itemsize)
        return self.bases[name]

    def mark(self, lid, k, *vals):
        """The interpreter copied operand k's block of this grid step (its start), before the kernel ran."""
        with self.lock:
            return self._mark(lid, k, *vals)

    def host(self, lid, k, kind, _dep, idx, mask):
        """A replayed access reaches the host: its block-local lanes and mask (``_dep`` only orders it)."""
        with self.lock:
            self._host(lid, k, kind, idx, mask)

    def _mark(self, lid, k, *vals):
        """Note operand k's block start; a new launch begins when another launch's copies interleave or the grid
        is done, a new program with the first of a grid step's block copies."""
        *start, block = vals
        L = self.launches[lid]
        nb = len(L.names)
        steps = int(np.prod([int(g) for g in L.gm.grid]))  # one execution of the launch: its grid's steps
        if self.last != lid or L.marks % (nb * max(steps, 1)) == 0:
            self.recorder.begin_launch(L.name)
            self.last, L.marks = lid, 0
        if L.marks % nb == 0:  # a grid step's n block copies all come after the previous step's accesses
            self.recorder.begin_program()
        L.marks += 1
        L.cur[k] = tuple(int(x) for x in start)
        return block

    def _host(self, lid, k, kind, idx, mask):
        """Record the enabled lanes of an access on operand k at their elements of the whole array."""
        L = self.launches[lid]
        idx = np.asarray(idx, dtype=np.int64)
        if mask is not None:
            idx = idx[np.broadcast_to(np.asarray(mask, dtype=bool), idx.shape)]
        flat, shape = _block_elements(L, k, idx.ravel())
        item = L.itemsize[k]
        nbytes = int(np.prod(shape)) * item if shape else item
        base = self.base_of(L.names[k], nbytes, item)
        self.recorder.access(np.uint64(base) + np.asarray(flat, dtype=np.uint64) * np.uint64(item), kind, item)

    # --- traced side: the kernel's accesses ---------------------------------------------------------------------

    def report(self, in_avals, kind, ref, block_index, mask):
        """In the discharge trace: a callback with the block-local element of each lane and the mask; it takes one
        element of the ref's value too, so that it runs after this grid step's block copy (``mark``)."""
        import jax.numpy as jnp

        tags, L = self.tags, self.launch
        if L is None or tags is None:
            return
        k = tags.get(id(in_avals[0]))
        if k == -1:
            return  # scratch (the kernel's scratch operands, run_scoped allocations): not global memory
        if k is None:  # no silent undercount: an access the counter cannot place fails the count
            raise InputError("pallas kernel", "loads/stores on refs traced to a pallas_call operand", str(in_avals[0]))
        dep = jnp.ravel(ref)[:1]
        m = None if mask is None else jnp.broadcast_to(mask, jnp.shape(block_index))
        self.jax.debug.callback(functools.partial(self.host, L.lid, k, kind), dep, block_index, m)

    def dynamic_slice(self, start_idx, block_shape, value, is_squeeze):
        """The interpreter's copy of an operand's block for a grid step: reports the block's start to the host
        (an ``io_callback`` the kernel's accesses depend on)."""
        import jax.numpy as jnp

        out = self.saved["ds"](start_idx, block_shape, value, is_squeeze)
        L = self.launch
        if L is None:
            return out
        k = L.ds % len(L.names)
        L.ds += 1
        spec = self.jax.ShapeDtypeStruct(jnp.shape(out), out.dtype)
        return self.io_callback(functools.partial(self.mark, L.lid, k), spec, *start_idx, out, ordered=False)

    def load_rule(self, in_avals, out_avals, *args, args_tree, **kw):
        """pallas ``load``: replayed on the block's element indices to report each lane's element (a read)."""
        rule = self.rules[self.pp.load_p]
        ref, transforms, mask, other = args_tree.unflatten(args)
        flat, tree = self.jax.tree_util.tree_flatten((_iota(in_avals[0]), transforms, None, None))
        _, where = rule(in_avals, out_avals, *flat, args_tree=tree, **kw)
        self.report(in_avals, "r", ref, where, mask)
        return rule(in_avals, out_avals, *args, args_tree=args_tree, **kw)

    def swap_rule(self, in_avals, out_avals, *args, args_tree, **kw):
        """pallas ``store``/``swap``: replayed on the block's element indices to report each lane's element (a
        write)."""
        import jax.numpy as jnp

        rule = self.rules[self.pp.swap_p]
        ref, transforms, val, mask = args_tree.unflatten(args)
        flat, tree = self.jax.tree_util.tree_flatten(
            (_iota(in_avals[0]), transforms, jnp.zeros(jnp.shape(val), jnp.int32), None)
        )
        _, where = rule(in_avals, out_avals, *flat, args_tree=tree, **kw)
        self.report(in_avals, "w", ref, where, mask)
        return rule(in_avals, out_avals, *args, args_tree=args_tree, **kw)

    def get_rule(self, in_avals, out_avals, x, *idx, tree, **kw):
        """state ``get`` (``ref[...]``): a read of every element it selects."""
        rule = self.rules[self.sp.get_p]
        _, where = rule(in_avals, out_avals, _iota(in_avals[0]), *idx, tree=tree, **kw)
        self.report(in_avals, "r", x, where, None)
        return rule(in_avals, out_avals, x, *idx, tree=tree, **kw)

    def state_swap_rule(self, in_avals, out_avals, x, val, *idx, tree, **kw):
        """state ``swap`` (``ref[...] = v``): a write of every element it selects."""
        import jax.numpy as jnp

        rule = self.rules[self.sp.swap_p]
        zeros = jnp.zeros(jnp.shape(val), jnp.int32)
        _, where = rule(in_avals, out_avals, _iota(in_avals[0]), zeros, *idx, tree=tree, **kw)
        self.report(in_avals, "w", x, where, None)
        return rule(in_avals, out_avals, x, val, *idx, tree=tree, **kw)

    def atomic_rmw_rule(self, in_avals, out_avals, *args, args_tree, **kw):
        """Triton's ``atomic_rmw``: its lanes located as a load's, one atomic access (a read and a write) each."""
        ref, transforms, val, mask = args_tree.unflatten(args)
        flat, tree = self.jax.tree_util.tree_flatten((_iota(in_avals[0]), transforms, None, None))
        _, where = self.rules[self.pp.load_p](in_avals, out_avals, *flat, args_tree=tree)
        self.report(in_avals, "a", ref, where, mask)
        return self.rules[self.atomics[0]](in_avals, out_avals, *args, args_tree=args_tree, **kw)

    def atomic_cas_rule(self, in_avals, out_avals, ref, cmp, val):
        """Triton's ``atomic_cas``: an atomic access of every element of the ref."""
        self.report(in_avals, "a", ref, _iota(in_avals[0]), None)
        return self.rules[self.atomics[1]](in_avals, out_avals, ref, cmp, val)

    # --- launches -----------------------------------------------------------------------------------------------

    def discharge_state(self, closed, *a, **kw):
        """State discharge; on the kernel's own jaxpr (its invars: index operands, blocks, scratch) the refs are
        tagged first with the operand each reaches (-1: scratch)."""
        if self.top:
            self.top = False
            gm = self.launch.gm
            n0, nb = gm.num_index_operands, len(gm.block_mappings)
            self.tags = {}
            invars = closed.jaxpr.invars
            top = {v: -1 for v in invars[n0 + nb :]}  # scratch operands
            top.update({invars[n0 + k]: k for k in range(nb)})
            _tag_refs(closed.jaxpr, top, self.tags)
        return self.saved["discharge"](closed, *a, **kw)

    def kernel_to_hlo_jaxpr(self, jaxpr, consts, grid_mapping):
        """The kernel's lowering: its next state discharge is the kernel's own jaxpr."""
        self.top = True
        try:
            return self.saved["k2h"](jaxpr, consts, grid_mapping)
        finally:
            self.top = False

    def pallas_call_hlo_interpret(self, *args, jaxpr, grid_mapping, **params):
        """A GPU pallas_call under the generic interpreter: a new :class:`_Launch` for its trace (scalar prefetch
        and dynamic grids refused)."""
        gm = grid_mapping
        if gm.num_index_operands or getattr(gm, "num_dynamic_grid_bounds", 0):
            raise InputError("pallas_call", "counted without scalar prefetch or a dynamic grid", gm.num_index_operands)
        L = _Launch(len(self.launches), str(params.get("name") or "pallas_call"), gm, _names_of(jaxpr, gm))
        self.launches.append(L)
        prev = self.launch
        self.launch, self.tags = L, None
        try:
            return self.saved["call"](*args, jaxpr=jaxpr, grid_mapping=grid_mapping, **params)
        finally:
            self.launch, self.tags = prev, None


@contextlib.contextmanager
def gpu_hooks(recorder):
    """Count GPU-targeted pallas_calls (Triton compiler params) run with ``interpret=True``: every load/get and
    store/swap the kernel issues on a ref of a pallas_call operand (global memory under the Triton lowering;
    BlockSpec'd refs are views into it) is counted per enabled lane at its element of the whole array."""
    require_gpu()
    import jax

    hi, sd, pp, sp, pallas_core = _gpu_modules()
    from jax.experimental import io_callback

    session = _GpuSession(recorder, jax, hi, sd, pp, sp, io_callback)
    session.keep_rules()
    session.install()
    try:
        yield
        jax.effects_barrier()
    finally:
        session.restore()
