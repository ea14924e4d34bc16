"""The hierarchy against what the H100 measured, mechanism by mechanism, and the predictions registered for the next
lease. Nothing here is fitted to a measurement: every parameter is a device preset's (experiments/data/devices.csv,
each with its source), a kernel's own (FlashAttention-2's tiles, warps and shared memory read off the kernel names
Nsight Compute stored, iosim.hierarchy.resident), or a stated choice of the model (the L2 partitions' address hash).

Measured: ``experiments/bench/gpu_h100/ncu-torch.json`` (PyTorch SDPA on an H100 SXM: FlashAttention-2's kernels,
fp16, B·H = 32, N = 32768, d = 128, forward and backward, causal and not; cuDNN's GQA decode, bf16, B = 4, 32
query heads on 8 KV heads, N_k = 32768). A launch's measured bytes are the sum over its kernels, PyTorch's own
``at::`` copies left out (gpu_predictions.measured_kernel). Nsight Compute flushes the caches before each kernel.

Each launch is predicted under models that add one mechanism at a time:

* ``one L2, 2 B`` - the prediction the docs gave before: one 50 MiB L2, every array at 2 bytes, the device's
  shared memory per block as M (so one CTA per SM);
* ``+ bytes`` - each array at its kernel dtype (fp16 operands, fp32 statistics, dQ's fp32 accumulator reduced by
  4-byte atomics);
* ``+ partitions`` - the L2 as two partitions of 25 MiB, each caching for its half of the SMs (devices.csv);
* ``+ resident CTAs`` - blocks per SM from the kernel's threads, shared memory and registers, computed by
  ``hierarchy(..., device=Machine("H100", kernel=<its resources>))`` (iosim.hierarchy.resident; the registers per
  thread as PyTorch 2.11.0+cu130's sm_90 binary has them, read by fa2_resources.py into gpu_h100/fa2-resources.json:
  255 for the forward and the backward's main kernel) and M = the two-level working set of its tiles;
* ``+ FA2's walk`` - the forward's column blocks walked from the last down (flash_fwd_kernel.h), the order of the
  grid as FlashAttention-2 launches it (row blocks fastest, then batch, then head: head-grouped).

Run: ``python experiments/bench/hierarchy_h100.py compute`` (the full-size launches; minutes on 2 cores, results to
gpu_h100/hierarchy-mechanisms.json), ``... table`` (the docs table from the stored results), ``... predictions``
(the predictions file of the next lease, experiments/bench/predictions/h100.json).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
STORED = HERE / "gpu_h100" / "hierarchy-mechanisms.json"
NCU = HERE / "gpu_h100" / "ncu-torch.json"
PREDICTIONS = HERE / "predictions" / "h100.json"
DOC = HERE.parents[1] / "docs" / "hierarchy-hardware.md"
BLOCK = ("<!-- hierarchy-h100 -->", "<!-- /hierarchy-h100 -->")
MB = 1e6
MIB = 1 << 20

# The five launches of the first lease (labels of ncu-torch.json) and FlashAttention-2's tiles for them (read off the
# kernel names: Flash_fwd_kernel_traits<128, 128, 64, 4> forward, Flash_bwd_kernel_traits<128, 64, 128, 8> backward).
LAUNCHES = {
    "forward": dict(label=0, backward=False, causal=False, Br=128, Bc=64),
    "forward causal": dict(label=2, backward=False, causal=True, Br=128, Bc=64),
    "backward": dict(label=1, backward=True, causal=False, Br=64, Bc=128),
    "backward causal": dict(label=3, backward=True, causal=True, Br=64, Bc=128),
    "decode GQA": dict(label=6, backward=False, causal=False, Br=None, Bc=None),
}
# The partitions' address hash is not published: lines alternate between the two partitions in runs of HOME_LINES
# (16 lines = 2 KiB), a stated choice of the model (iosim.hierarchy.simulate, "partitions"); runs of 1 line cost a
# request per line (about 10^9 at these sizes), runs of 16 let the L2 move whole segments.
HOME_LINES = 16
MODELS = ("one L2, 2 B", "+ bytes", "+ partitions", "+ resident CTAs", "+ FA2's walk")
# Beside the steps, for the causal forward: FA2's walk with none of the other mechanisms (kernel bytes, one L2, one
# CTA per SM), to tell what the walk does by itself.
WALK_ALONE = "FA2's walk alone"
# And for the forward: every mechanism with the registers left unknown, the bound the threads and shared memory
# allow (3 CTAs per SM: what the predictions registered before the binary was read took; the binary's 255 registers
# per thread allow 2).
THREE_CTAS = "every mechanism, registers unknown (3 CTAs/SM)"
EXTRA = {WALK_ALONE: ("forward causal",), THREE_CTAS: ("forward", "forward causal")}
RESOURCES = HERE / "gpu_h100" / "fa2-resources.json"


def _problem(name: str):
    from iosim import Problem

    if name == "decode GQA":
        return Problem(B=4, H_q=32, H_kv=8, N_q=1, N_k=32768, d=128, dtype_q="bf16")
    return Problem(B=1, H_q=32, N=32768, d=128, dtype_q="fp16", causal=LAUNCHES[name]["causal"])


def main_kernel(name: str) -> str:
    """The name of the launch's main kernel as Nsight Compute stored it (FA2's carry their traits: Machine(kernel=)
    computes their blocks per SM from them)."""
    main = ("dq_dk_dv", "flash_fwd", "cudnn_generated")
    label = LAUNCHES[name]["label"]
    rows = _ncu()["launches"]
    return next(x["kernel"] for x in rows if x["label"] == label and any(m in x["kernel"] for m in main))


def main_kernel_resources(name: str):
    """The launch's main kernel's resources (:func:`iosim.hierarchy.resident.parse_kernel_name` of its Nsight name)
    with its registers per thread as the binary the lease ran has them (gpu_h100/fa2-resources.json, matched by the
    name Nsight stored); a kernel the record does not hold (cuDNN's) keeps its name, registers unknown."""
    from iosim.hierarchy.resident import parse_kernel_name

    ncu = main_kernel(name)
    regs = {k["ncu_name"]: k["registers"] for k in json.loads(RESOURCES.read_text())["kernels"]}
    return parse_kernel_name(ncu, registers=regs[ncu]) if ncu in regs else ncu


def run(name: str, model: str):
    """The hierarchy's result for one launch under one model (module docstring)."""
    from iosim import Schedule
    from iosim.hierarchy import Machine
    from iosim.hierarchy.scheduler import Scheduler
    from iosim.hierarchy.simulate import hierarchy

    spec = LAUNCHES[name]
    p = _problem(name)
    step = MODELS.index(model) if model in MODELS else None
    tiles = dict(Br=spec["Br"], Bc=spec["Bc"]) if spec["Br"] else {}
    flash2 = Schedule("flash2", gqa="packed" if name == "decode GQA" else "per-head", **tiles)
    kw = dict(problem=p, backward=spec["backward"], allow_long=True)
    one = Machine("H100", partitions=1)
    if model == WALK_ALONE:
        kw.update(element_bytes="kernel", scheduler=Scheduler(order="head-grouped", walk="descending"))
        return hierarchy(flash2, device=one, **kw)
    if step == 0:
        return hierarchy(flash2, device=one, **kw)
    kw.update(element_bytes="kernel")
    if step == 1:
        return hierarchy(flash2, device=one, **kw)
    if step == 2:
        return hierarchy(flash2, device=Machine("H100", partitions=2, home_lines=HOME_LINES), **kw)
    if name == "decode GQA" or (step == 4 and spec["backward"]):  # cuDNN's resources are not in its name; the
        return None  # backward's walk is not modelled: the steps above are the model there
    step = 4 if model == THREE_CTAS else step
    # the H100 preset's machine in fp16 words; its blocks per SM from the kernel's resources, inside hierarchy()
    kernel = main_kernel(name) if model == THREE_CTAS else main_kernel_resources(name)
    machine = Machine("H100", partitions=2, home_lines=HOME_LINES, kernel=kernel)
    if step == 4 and not spec["backward"]:
        kw.update(scheduler=Scheduler(order="head-grouped", walk="descending"))
    return hierarchy(flash2, M=_working_set(name), device=machine, **kw)


def _working_set(name: str) -> int:
    """The two-level working set of the launch's tiles (what its M must hold): the schedule's own peak, from one head
    (the peak does not depend on N once N holds a tile)."""
    import iosim

    spec = LAUNCHES[name]
    r = iosim.run(
        iosim.Schedule("flash2", Br=spec["Br"], Bc=spec["Bc"]),
        N=1024,
        d=128,
        M=1 << 20,
        backward=spec["backward"],
        count_only=True,
    )
    return int(r.main.stats.peak)


def levels(r) -> dict:
    """Bytes per level of a hierarchy result, named as gpu_predictions.LEVELS names them."""
    pa = r.per_array.values()
    during = sum(w["during_bytes"] for w in r.dram_writes) if r.dram_writes else None
    return {
        "dram_read": sum(c.bytes("dram_read") for c in pa),
        "dram_write": during,
        "dram_write_with_flush": sum(c.bytes("dram_update") for c in pa),
        "global_load": sum(c.bytes("l2_read") for c in pa),
        "global_store": sum(c.bytes("l2_update") for c in pa),
        "l2_reduction": sum(c.bytes("l2_reduce") for c in pa),
        "l2_read_from_fabric": sum(c.bytes("fabric") for c in pa),
        "fabric_reads_only": sum(c.bytes("fabric_read") for c in pa),
        "fabric_reductions": sum(c.bytes("fabric_reduce") for c in pa),
    }


def _ncu() -> dict:
    return json.loads(NCU.read_text())


def measured(name: str) -> dict:
    """The launch's measured bytes per level (its kernels summed, PyTorch's at:: copies left out)."""
    sys.path.insert(0, str(HERE))
    import gpu_predictions

    rows = [x for x in _ncu()["launches"] if x["label"] == LAUNCHES[name]["label"]
            and gpu_predictions.measured_kernel(x["kernel"])]  # fmt: skip
    total: dict = {}
    for x in rows:
        for k, v in x.items():
            if isinstance(v, float):
                total[k] = total.get(k, 0.0) + v
    return gpu_predictions.measured(total)


def compute(names=None, models=(*MODELS, *EXTRA)) -> dict:
    """Every (launch, model) prediction, with the time each took."""
    from iosim.base.version import __version__

    out = {"iosim_version": __version__, "runs": {}}
    for name in names or LAUNCHES:
        for model in models:
            t0 = time.perf_counter()
            if model in EXTRA and name not in EXTRA[model]:
                continue
            r = run(name, model)
            if r is None:
                continue
            out["runs"][f"{name} | {model}"] = {**levels(r), "blocks_per_sm": r.blocks_per_sm, "M": r.M,
                                                "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
            print(f"{name} | {model}: DRAM read {levels(r)['dram_read'] / MB:,.1f} MB", file=sys.stderr, flush=True)
    return out


def table(stored: dict | None = None) -> str:
    """The docs table: DRAM read and write (during the kernels) per launch and model, beside the measurement."""
    from tabulate import tabulate

    stored = stored or json.loads(STORED.read_text())
    rows = []
    for name in LAUNCHES:
        m = measured(name)
        for model in (*MODELS, *EXTRA):
            got = stored["runs"].get(f"{name} | {model}")
            if got is None:
                continue
            rd, wr = got["dram_read"], got["dram_write"]
            rows.append([name, model, got["blocks_per_sm"], f"{rd / MB:,.0f}", f"{m['dram_read'] / MB:,.0f}",
                         f"{m['dram_read'] / rd:.2f}" if rd else "-", "-" if wr is None else f"{wr / MB:,.0f}",
                         f"{m['dram_write'] / MB:,.0f}", f"{m['dram_write'] / wr:.2f}" if wr else "-"])  # fmt: skip
    head = ["launch", "model", "CTAs/SM", "DRAM read MB: iosim", "measured", "measured / iosim",
            "DRAM write MB (during): iosim", "measured", "measured / iosim"]  # fmt: skip
    return tabulate(rows, headers=head, tablefmt="github", disable_numparse=True)


def write_block(text: str, block: tuple[str, str] = BLOCK) -> None:
    """Put ``text`` between ``block``'s two markers in docs/hierarchy-hardware.md (every generated table there)."""
    doc = DOC.read_text()
    head, rest = doc.split(block[0], 1)
    _, tail = rest.split(block[1], 1)
    DOC.write_text(f"{head}{block[0]}\n{text}\n{block[1]}{tail}")


def write_docs() -> None:
    """Put :func:`table` between the doc's markers."""
    write_block(table())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("compute", "table", "predictions"))
    ap.add_argument("--launch", nargs="+", choices=list(LAUNCHES), help="compute only these launches")
    ap.add_argument("--write", action="store_true", help="table: also write it into docs/hierarchy-hardware.md")
    ap.add_argument("--force", action="store_true", help="predictions: write over the registered file")
    args = ap.parse_args(argv)
    if args.what == "compute":
        data = compute(args.launch)
        if STORED.exists() and args.launch:
            old = json.loads(STORED.read_text())
            old["runs"].update(data["runs"])
            data = {**old, "iosim_version": data["iosim_version"]}
        STORED.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {STORED}")
    elif args.what == "table":
        print(table())
        if args.write:
            write_docs()
            print(f"wrote the table into {DOC}")
    else:
        import gpu_predictions

        if gpu_predictions.registered(PREDICTIONS, args.force):
            return 2
        PREDICTIONS.parent.mkdir(parents=True, exist_ok=True)
        PREDICTIONS.write_text(json.dumps(predictions(), indent=1) + "\n")
        print(f"wrote {PREDICTIONS}")
    return 0


# ------------------------------------------------------------------------------------ the L2 capacity probe
COPY_CTAS, COPY_THREADS = 132 * 8, 256  # gpu_predictions._copy: 8 blocks of 256 threads on each of 132 SMs


def copy_trace(nbytes: int):
    """The trace of gpu_predictions' ``read_twice`` kernel as the model sees it: a float32 buffer of ``nbytes`` as rows
    of 32 words (one 128-byte line each); CTA b's 8 warps read rows 8b..8b+7 of every grid stride (each warp one
    line per iteration), the whole share twice; a one-word accumulator keeps the CTA one piece (count-only)."""
    from iosim.memory_model import Memory, TwoLevelMemory

    rows, warps = nbytes // 128, COPY_THREADS // 32
    stride = COPY_CTAS * warps
    steps = -(-rows // stride)
    model = TwoLevelMemory(warps * 32 + 1, trace=True, trace_capacity=COPY_CTAS * (4 * steps + 2) + 16)
    mem = Memory.wrap(model, count_only=True)
    x, acc = mem.slow("X", shape=(rows, 32)), mem.slow("acc", shape=(COPY_CTAS, 1))
    for b in range(COPY_CTAS):
        a = mem.alloc(acc, rows=(b, b + 1))
        for _ in range(2):
            for r0 in range(b * warps, rows, stride):
                mem.free(mem.load(x, rows=(r0, min(r0 + warps, rows))))
        mem.free(a)
    return mem.trace()


def copy_probe(nbytes: int, partitions: int, device: str = "H100", far_copy: str = "both"):
    """The hierarchy's levels of the probe on a device preset's SMs and L2 (fp32 words: lines of 32), one or two
    partitions, a far-homed line kept as ``far_copy`` says (iosim.hierarchy.l2)."""
    from iosim.hierarchy import Machine
    from iosim.hierarchy import device as preset
    from iosim.hierarchy.simulate import hierarchy

    t = copy_trace(nbytes)
    dev = preset(device)
    machine = Machine(P=dev.sms, C=dev.l2_bytes // 4, L=dev.l2_line_bytes // 4, blocks_per_sm=8,
                      partitions=partitions, home_lines=HOME_LINES, far_copy=far_copy)  # fmt: skip
    r = hierarchy("read twice", N=1, d=1, M=t.M, device=machine, bytes_per_word=4, _trace=t, allow_long=True)
    return levels(r)


# ------------------------------------------------------------------------------------ the registered predictions
PROBE_MB = (8, 16, 24, 32, 40, 48, 64)  # the buffer read twice: one L2 of 50 MiB holds them all up to 48


def _iosim_causal():
    """iosim's own numba.cuda flash2 forward, causal, float32 (B = 1, 32 heads, N = 8192, d = 64, M = 16,384 words):
    its walk ascends (algorithms/cuda/flash.py), its grid is (row block, head) with the row block fastest, 128
    threads, 173 registers per thread (the driver's figure for flash2_forward_kernel, gpu_h100/occupancy.json)."""
    from iosim import Problem
    from iosim.hierarchy import Machine
    from iosim.hierarchy.simulate import hierarchy

    M = 16384
    p = Problem(B=1, H_q=32, N=8192, d=64, dtype_q="fp32", causal=True)
    machine = Machine("H100", partitions=2, home_lines=HOME_LINES, kernel=IOSIM_FLASH2_FORWARD)
    r = hierarchy("flash2", problem=p, M=M, device=machine, element_bytes="kernel", allow_long=True)
    return levels(r), r.blocks_per_sm


# iosim's numba.cuda flash2 forward at d = 64, M = 16,384 as the H100's driver gave it (gpu_h100/occupancy.json, its
# row: NUM_REGS 173, SHARED_SIZE_BYTES 0, "dynamic smem" 64,480 bytes; 128 threads per block, the launchers')
IOSIM_FLASH2_FORWARD = dict(name="flash2_forward_kernel", threads=128, registers=173, smem_bytes=64480)


def predictions() -> dict:
    """The predictions file of the next lease (gpu_predictions' format), from the stored model runs and the probes."""
    from iosim.base.version import __version__

    stored = json.loads(STORED.read_text())["runs"]
    keep = ("dram_read", "dram_write", "global_load", "global_store", "l2_reduction", "l2_read_from_fabric")
    base = dict(B=1, H_q=32, H_kv=32, N_q=32768, N_k=32768, d=128, dtype="float16", order="head-grouped")
    entries = []
    for name, eid in (("forward", "fa2-fwd"), ("forward causal", "fa2-fwd-causal"), ("backward", "fa2-bwd"),
                      ("backward causal", "fa2-bwd-causal")):  # fmt: skip
        model = next(m for m in reversed(MODELS) if f"{name} | {m}" in stored)  # every mechanism modelled for it
        last = stored[f"{name} | {model}"]
        entries.append({
            "id": eid, "what": f"SDPA FlashAttention-2 {name} (the first lease's launch), every mechanism",
            "backend": "sdpa-flash", **base, "causal": "causal" in name, "pass": name.split()[0],
            "model": model, "blocks_per_sm": last["blocks_per_sm"],
            "predicted": {k: last[k] for k in keep if last.get(k)},
            "alternatives": {m: {k: stored[f"{name} | {m}"][k] for k in ("dram_read", "dram_write")}
                             for m in (*MODELS, *EXTRA) if m != model and f"{name} | {m}" in stored},
        })  # fmt: skip
    dec = stored[f"decode GQA | {MODELS[2]}"]
    entries.append({"id": "cudnn-decode-gqa-packed", "what": "SDPA cuDNN GQA decode, K/V read once per KV head",
                    "backend": "sdpa-cudnn", "B": 4, "H_q": 32, "H_kv": 8, "N_q": 1, "N_k": 32768, "d": 128,
                    "causal": False, "dtype": "bfloat16", "order": "head-grouped", "gqa": "packed",
                    "model": MODELS[2], "predicted": {k: dec[k] for k in keep if dec.get(k)}})  # fmt: skip
    got, bps = _iosim_causal()
    entries.append({"id": "iosim-fwd-causal-ascending", "what": "iosim's numba.cuda flash2 forward, causal: its walk "
                    "ascends where FA2's descends", "backend": "iosim-cuda", "B": 1, "H_q": 32, "H_kv": 32,
                    "N_q": 8192, "N_k": 8192, "d": 64, "causal": True, "dtype": "float32", "order": "head-grouped",
                    "M": 16384, "blocks_per_sm": bps,
                    "predicted": {k: got[k] for k in keep if got.get(k)}})  # fmt: skip
    for mb in PROBE_MB:
        two, one = copy_probe(mb * MIB, 2), copy_probe(mb * MIB, 1)
        entries.append({"id": f"l2-probe-{mb}MiB", "what": f"one float32 buffer of {mb} MiB read twice (L2 capacity)",
                        "backend": "copy", "bytes": mb * MIB, "B": 1, "H_q": 1, "H_kv": 1, "N_q": 1, "N_k": 1,
                        "d": 1, "causal": False, "dtype": "float32", "order": "grid",
                        "predicted": {"dram_read": two["dram_read"]},
                        "alternatives": {"one 50 MiB L2": {"dram_read": one["dram_read"]}}})  # fmt: skip
    import hierarchy_fig2  # FlashAttention's Figure 2 on the H100 (its stored runs)

    entries += hierarchy_fig2.entries()
    return {"device": "H100 SXM", "iosim_version": __version__, "registered": time.strftime("%Y-%m-%d"),
            "note": "registered before the lease that measures it; not to be refitted (docs/hierarchy-hardware.md)",
            "entries": entries}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
