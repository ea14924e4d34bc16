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
"""

from __future__ import annotations

import contextlib
import re

import numpy as np

from iosim.errors import InputError

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
        raise InputError("backend pallas", 'needs the extra: pip install "iosim[pallas]"', str(e)) from None
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

    def grid_point(token, *_):
        recorder.begin_program()
        return token

    for m, fn in (("allocate_buffer", allocate_buffer), ("get_buffer_content", get_buffer_content),
                  ("store_buffer_content", store_buffer_content)):  # fmt: skip
        setattr(S, m, fn)
    ipc.get, ipc.store = get, store
    recorder.begin_launch("pallas")
    try:
        with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(grid_point_recorder=grid_point)):
            yield
    finally:
        for m, fn in saved.items():
            setattr(S, m, fn)
        ipc.get, ipc.store = saved_get, saved_store
        recorder.end_program()
