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

import numpy as np

from iosim.errors import InputError, install_hint

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


@contextlib.contextmanager
def hooks(recorder):
    require()
    ipc, sm = _modules()
    from jax.experimental.pallas import tpu as pltpu

    S = sm.SharedMemory
    saved = {m: getattr(S, m) for m in ("allocate_buffer", "get_buffer_content", "store_buffer_content")}
    saved_get, saved_store = ipc.get, ipc.store
    buffers: dict = {}  # key -> [range id, base, shape, itemsize]
    handing_back = [False]
    recorder.hbm_buffers = []
    nxt = [1]

    def hbm_key(memory_space, buffer_id, device_id):
        name = ipc.TPU_MEMORY_SPACE_NAMES[int(memory_space)]
        return (name, int(buffer_id), int(device_id), 0)

    def allocate_buffer(self, key, ref_count, value, *rest, **kw):
        new = key not in self.mem
        out = saved["allocate_buffer"](self, key, ref_count, value, *rest, **kw)
        if new and key[0] in HBM:
            v = np.asarray(value)
            base = nxt[0] * _SPAN
            nxt[0] += 1
            recorder.register(f"hbm{key[1]}", base, v.size * v.itemsize, v.itemsize)
            buffers[key] = [len(recorder.ranges) - 1, base, v.shape, v.itemsize]
            recorder.hbm_buffers.append((len(recorder.ranges) - 1, self.mem[key]))
        return out

    def touched(key, rnge, shape) -> np.ndarray | None:
        info = buffers.get(key)
        if info is None:
            return None
        idx = np.arange(int(np.prod(info[2])), dtype=np.int64).reshape(info[2])
        try:
            sel = idx[tuple(rnge)] if rnge else idx
        except IndexError:
            return np.zeros(0, dtype=np.int64)
        return np.asarray(sel).ravel()

    def note(key, rnge, kind):
        info = buffers.get(key)
        if info is None:
            return
        el = touched(key, rnge, info[2])
        if el is not None and el.size:
            tpu_launch()
            recorder.access(np.uint64(info[1]) + el.astype(np.uint64) * np.uint64(info[3]), kind, info[3])

    def get_buffer_content(self, key, rnge, *rest, **kw):
        if key[0] in HBM and not handing_back[0]:
            note(key, rnge, "r")
        return saved["get_buffer_content"](self, key, rnge, *rest, **kw)

    def store_buffer_content(self, key, rnge, value, *rest, **kw):
        if key[0] in HBM:
            note(key, rnge, "w")
        return saved["store_buffer_content"](self, key, rnge, value, *rest, **kw)

    def name(memory_space, buffer_id, device_id, label):
        info = buffers.get(hbm_key(memory_space, buffer_id, device_id))
        if info is not None and label and label != "unknown":
            r = recorder.ranges[info[0]]
            if r.name.startswith("hbm"):
                r.name = _clean(label)

    def get(token, device_id, local_core_id, memory_space, buffer_id, *rest, **kw):
        name(memory_space, buffer_id, device_id, kw.get("input_name"))
        # pallas_call hands its outputs back to jax with a bare get of each whole output buffer: not the kernel's
        handing_back[0] = not kw
        try:
            return saved_get(token, device_id, local_core_id, memory_space, buffer_id, *rest, **kw)
        finally:
            handing_back[0] = False

    def store(token, device_id, local_core_id, memory_space, buffer_id, *rest, **kw):
        name(memory_space, buffer_id, device_id, kw.get("output_name"))
        return saved_store(token, device_id, local_core_id, memory_space, buffer_id, *rest, **kw)

    get.__wrapped__ = getattr(saved_get, "__wrapped__", saved_get)  # DMAs call the undecorated get
    store.__wrapped__ = getattr(saved_store, "__wrapped__", saved_store)

    started = [False]

    def tpu_launch():
        if not started[0]:
            started[0] = True
            recorder.begin_launch("pallas")

    def grid_point(token, *_):
        tpu_launch()
        recorder.begin_program()
        return token

    for m, fn in (("allocate_buffer", allocate_buffer), ("get_buffer_content", get_buffer_content),
                  ("store_buffer_content", store_buffer_content)):  # fmt: skip
        setattr(S, m, fn)
    ipc.get, ipc.store = get, store
    saved_call = ipc.interpret_pallas_call

    try:
        require_gpu()
        gpu_error = None
    except InputError as e:  # TPU kernels are still counted; a GPU kernel then fails with this one line
        gpu_error = e

    def interpret_pallas_call(*args, interpret_params=None, **params):
        if _is_gpu_call(params):  # a kernel for GPUs: the generic interpreter (counted by gpu_hooks)
            if gpu_error is not None:
                raise gpu_error
            from jax._src.pallas import hlo_interpreter as hi

            return hi.pallas_call_hlo_interpret(*args, **params)
        return saved_call(*args, interpret_params=interpret_params, **params)

    ipc.interpret_pallas_call = interpret_pallas_call
    try:
        gpu = gpu_hooks(recorder) if gpu_error is None else contextlib.nullcontext()
        with gpu, pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(grid_point_recorder=grid_point)):
            yield
    finally:
        for m, fn in saved.items():
            setattr(S, m, fn)
        ipc.get, ipc.store = saved_get, saved_store
        ipc.interpret_pallas_call = saved_call
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


@contextlib.contextmanager
def gpu_hooks(recorder):
    """Count GPU-targeted pallas_calls (Triton compiler params) run with ``interpret=True``: every load/get and
    store/swap the kernel issues on a ref of a pallas_call operand (global memory under the Triton lowering;
    BlockSpec'd refs are views into it) is counted per enabled lane at its element of the whole array."""
    require_gpu()
    import jax
    import jax.numpy as jnp

    hi, sd, pp, sp, pallas_core = _gpu_modules()
    from jax.experimental import io_callback

    saved_call, saved_k2h, saved_dis = hi.pallas_call_hlo_interpret, hi.kernel_to_hlo_jaxpr, sd.discharge_state
    saved_ds = hi._dynamic_slice
    rules = {p: sd._discharge_rules[p] for p in (pp.load_p, pp.swap_p, sp.get_p, sp.swap_p)}
    try:  # Triton's atomics: a read and a write per lane
        from jax._src.pallas.triton import primitives as tp

        atomics = [p for p in (getattr(tp, "atomic_rmw_p", None), getattr(tp, "atomic_cas_p", None)) if p is not None]
    except ImportError:
        atomics = []
    rules.update({p: sd._discharge_rules[p] for p in atomics if p in sd._discharge_rules})
    launches: list[_Launch] = []
    bases: dict[str, int] = {}
    state = {"launch": None, "tags": None, "top": False, "last": None}

    def base_of(name, nbytes, itemsize):
        if name not in bases:
            bases[name] = (len(bases) + 1) * _SPAN
            recorder.register(name, bases[name], nbytes, itemsize)
        return bases[name]

    lock = threading.Lock()  # XLA runs host callbacks on several threads: one at a time into the recorder

    def mark(lid, k, *vals):
        """The interpreter copied operand k's block of this grid step (its start), before the kernel ran."""
        with lock:
            return _mark(lid, k, *vals)

    def host(lid, k, kind, _dep, idx, mask):
        with lock:
            _host(lid, k, kind, idx, mask)

    def _mark(lid, k, *vals):
        *start, block = vals
        L = launches[lid]
        nb = len(L.names)
        steps = int(np.prod([int(g) for g in L.gm.grid]))  # one execution of the launch: its grid's steps
        if state["last"] != lid or L.marks % (nb * max(steps, 1)) == 0:
            recorder.begin_launch(L.name)
            state["last"], L.marks = lid, 0
        if L.marks % nb == 0:  # a grid step's n block copies all come after the previous step's accesses
            recorder.begin_program()
        L.marks += 1
        L.cur[k] = tuple(int(x) for x in start)
        return block

    def _host(lid, k, kind, idx, mask):
        L = launches[lid]
        idx = np.asarray(idx, dtype=np.int64)
        if mask is not None:
            idx = idx[np.broadcast_to(np.asarray(mask, dtype=bool), idx.shape)]
        idx = idx.ravel()
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
        item = L.itemsize[k]
        nbytes = int(np.prod(shape)) * item if shape else item
        base = base_of(L.names[k], nbytes, item)
        recorder.access(np.uint64(base) + np.asarray(flat, dtype=np.uint64) * np.uint64(item), kind, item)

    def report(in_avals, kind, ref, block_index, mask):
        """In the discharge trace: a callback with the block-local element of each lane and the mask; it takes one
        element of the ref's value too, so that it runs after this grid step's block copy (``mark``)."""
        tags, L = state["tags"], state["launch"]
        if L is None or tags is None:
            return
        k = tags.get(id(in_avals[0]))
        if k == -1:
            return  # scratch (the kernel's scratch operands, run_scoped allocations): not global memory
        if k is None:  # no silent undercount: an access the counter cannot place fails the count
            raise InputError("pallas kernel", "loads/stores on refs traced to a pallas_call operand", str(in_avals[0]))
        dep = jnp.ravel(ref)[:1]
        m = None if mask is None else jnp.broadcast_to(mask, jnp.shape(block_index))
        jax.debug.callback(functools.partial(host, L.lid, k, kind), dep, block_index, m)

    def dynamic_slice(start_idx, block_shape, value, is_squeeze):
        out = saved_ds(start_idx, block_shape, value, is_squeeze)
        L = state["launch"]
        if L is None:
            return out
        k = L.ds % len(L.names)
        L.ds += 1
        spec = jax.ShapeDtypeStruct(jnp.shape(out), out.dtype)
        return io_callback(functools.partial(mark, L.lid, k), spec, *start_idx, out, ordered=False)

    def iota(aval):
        shape = tuple(aval.shape)
        return jnp.arange(int(np.prod(shape)) if shape else 1, dtype=jnp.int32).reshape(shape)

    def load_rule(in_avals, out_avals, *args, args_tree, **kw):
        ref, transforms, mask, other = args_tree.unflatten(args)
        flat, tree = jax.tree_util.tree_flatten((iota(in_avals[0]), transforms, None, None))
        _, where = rules[pp.load_p](in_avals, out_avals, *flat, args_tree=tree, **kw)
        report(in_avals, "r", ref, where, mask)
        return rules[pp.load_p](in_avals, out_avals, *args, args_tree=args_tree, **kw)

    def swap_rule(in_avals, out_avals, *args, args_tree, **kw):
        ref, transforms, val, mask = args_tree.unflatten(args)
        flat, tree = jax.tree_util.tree_flatten(
            (iota(in_avals[0]), transforms, jnp.zeros(jnp.shape(val), jnp.int32), None)
        )
        _, where = rules[pp.swap_p](in_avals, out_avals, *flat, args_tree=tree, **kw)
        report(in_avals, "w", ref, where, mask)
        return rules[pp.swap_p](in_avals, out_avals, *args, args_tree=args_tree, **kw)

    def get_rule(in_avals, out_avals, x, *idx, tree, **kw):
        _, where = rules[sp.get_p](in_avals, out_avals, iota(in_avals[0]), *idx, tree=tree, **kw)
        report(in_avals, "r", x, where, None)
        return rules[sp.get_p](in_avals, out_avals, x, *idx, tree=tree, **kw)

    def atomic_rmw_rule(in_avals, out_avals, *args, args_tree, **kw):
        ref, transforms, val, mask = args_tree.unflatten(args)
        flat, tree = jax.tree_util.tree_flatten((iota(in_avals[0]), transforms, None, None))
        _, where = rules[pp.load_p](in_avals, out_avals, *flat, args_tree=tree)
        report(in_avals, "a", ref, where, mask)
        return rules[atomics[0]](in_avals, out_avals, *args, args_tree=args_tree, **kw)

    def atomic_cas_rule(in_avals, out_avals, ref, cmp, val):
        report(in_avals, "a", ref, iota(in_avals[0]), None)
        return rules[atomics[1]](in_avals, out_avals, ref, cmp, val)

    def state_swap_rule(in_avals, out_avals, x, val, *idx, tree, **kw):
        zeros = jnp.zeros(jnp.shape(val), jnp.int32)
        _, where = rules[sp.swap_p](in_avals, out_avals, iota(in_avals[0]), zeros, *idx, tree=tree, **kw)
        report(in_avals, "w", x, where, None)
        return rules[sp.swap_p](in_avals, out_avals, x, val, *idx, tree=tree, **kw)

    def discharge_state(closed, *a, **kw):
        if state["top"]:  # the kernel's own jaxpr (its invars: index operands, blocks, scratch): tag the refs
            state["top"] = False
            gm = state["launch"].gm
            n0, nb = gm.num_index_operands, len(gm.block_mappings)
            state["tags"] = {}
            invars = closed.jaxpr.invars
            top = {v: -1 for v in invars[n0 + nb :]}  # scratch operands
            top.update({invars[n0 + k]: k for k in range(nb)})
            _tag_refs(closed.jaxpr, top, state["tags"])
        return saved_dis(closed, *a, **kw)

    def kernel_to_hlo_jaxpr(jaxpr, consts, grid_mapping):
        state["top"] = True
        try:
            return saved_k2h(jaxpr, consts, grid_mapping)
        finally:
            state["top"] = False

    def names_of(jaxpr, gm):
        arg_names = list(getattr(getattr(jaxpr, "debug_info", None), "arg_names", None) or [])
        n0 = gm.num_index_operands
        out = []
        for k, bm in enumerate(gm.block_mappings):
            nm = arg_names[n0 + k] if n0 + k < len(arg_names) and arg_names[n0 + k] else str(bm.origin)
            nm = _clean(re.sub(r"\W+", "_", str(nm)).strip("_")) or f"arg{k}"
            out.append(nm)
        return out

    def pallas_call_hlo_interpret(*args, jaxpr, grid_mapping, **params):
        gm = grid_mapping
        if gm.num_index_operands or getattr(gm, "num_dynamic_grid_bounds", 0):
            raise InputError("pallas_call", "counted without scalar prefetch or a dynamic grid", gm.num_index_operands)
        L = _Launch(len(launches), str(params.get("name") or "pallas_call"), gm, names_of(jaxpr, gm))
        launches.append(L)
        prev = state["launch"]
        state["launch"], state["tags"] = L, None
        try:
            return saved_call(*args, jaxpr=jaxpr, grid_mapping=grid_mapping, **params)
        finally:
            state["launch"], state["tags"] = prev, None

    hi.pallas_call_hlo_interpret = pallas_call_hlo_interpret
    hi.kernel_to_hlo_jaxpr = kernel_to_hlo_jaxpr
    hi._dynamic_slice = dynamic_slice
    sd.discharge_state = discharge_state
    new_rules = {pp.load_p: load_rule, pp.swap_p: swap_rule, sp.get_p: get_rule, sp.swap_p: state_swap_rule}
    for p, rule in zip(atomics, (atomic_rmw_rule, atomic_cas_rule), strict=False):
        if p in rules:
            new_rules[p] = rule
    sd._discharge_rules.update(new_rules)
    jax.clear_caches()  # a launch compiled before (without the callbacks) must be lowered again
    try:
        yield
        jax.effects_barrier()
    finally:
        hi.pallas_call_hlo_interpret, hi.kernel_to_hlo_jaxpr, sd.discharge_state = saved_call, saved_k2h, saved_dis
        hi._dynamic_slice = saved_ds
        sd._discharge_rules.update(rules)
        jax.clear_caches()
