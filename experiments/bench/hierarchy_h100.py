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
* ``+ resident CTAs`` - blocks per SM from the kernel's threads and shared memory (its registers are not known:
  the bound the other limits allow, iosim.hierarchy.resident) and M = the two-level working set of its tiles;
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


def _problem(name: str):
    from iosim import Problem

    if name == "decode GQA":
        return Problem(B=4, H_q=32, H_kv=8, N_q=1, N_k=32768, d=128, dtype_q="bf16")
    return Problem(B=1, H_q=32, N=32768, d=128, dtype_q="fp16", causal=LAUNCHES[name]["causal"])


def _resident(name: str) -> tuple[int, str]:
    """Blocks per SM of the launch's main kernel from its resources (registers unknown: an upper bound)."""
    from iosim.hierarchy import resident

    main = ("dq_dk_dv", "flash_fwd", "cudnn_generated")  # the launch's main kernel
    label = LAUNCHES[name]["label"]
    rows = _ncu()["launches"]
    kernel = next(x["kernel"] for x in rows if x["label"] == label and any(m in x["kernel"] for m in main))
    try:
        k = resident.parse_kernel_name(kernel)
    except Exception:  # noqa: BLE001 (cuDNN's kernel: no traits in its name)
        return 1, "cuDNN kernel: resources not in its name (one per SM assumed)"
    threads = 32 * k.warps
    return resident.resident_ctas("H100", threads, None, k.smem_bytes)


def run(name: str, model: str):
    """The hierarchy's result for one launch under one model (module docstring)."""
    from iosim.hierarchy.scheduler import Scheduler
    from iosim.hierarchy.simulate import hierarchy

    spec = LAUNCHES[name]
    p = _problem(name)
    step = MODELS.index(model)
    kw = dict(
        problem=p, backward=spec["backward"], allow_long=True, gqa="packed" if name == "decode GQA" else "per-head"
    )
    if spec["Br"]:
        kw.update(Br=spec["Br"], Bc=spec["Bc"])
    if step == 0:
        return hierarchy("flash2", device="H100", partitions=1, **kw)
    kw.update(element_bytes="kernel")
    if step == 1:
        return hierarchy("flash2", device="H100", partitions=1, **kw)
    if step == 2:
        return hierarchy("flash2", device="H100", partitions=2, home_lines=HOME_LINES, **kw)
    if name == "decode GQA":  # cuDNN's kernel: its resources are not in its name; the steps above are the model
        return None
    bps, _ = _resident(name)
    machine = dict(P=132, C=52428800 // 2, L=64, partitions=2, home_lines=HOME_LINES, blocks_per_sm=bps)  # the H100 preset's, in fp16 words
    if step == 4 and not spec["backward"]:
        kw.update(scheduler=Scheduler(order="head-grouped", walk="descending"))
    return hierarchy("flash2", M=_working_set(name), **machine, **kw)


def _working_set(name: str) -> int:
    """The two-level working set of the launch's tiles (what its M must hold): the schedule's own peak, from one head
    (the peak does not depend on N once N holds a tile)."""
    import iosim

    spec = LAUNCHES[name]
    r = iosim.run("flash2", N=1024, d=128, M=1 << 20, Br=spec["Br"], Bc=spec["Bc"], backward=spec["backward"],
                  count_only=True)  # fmt: skip
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


def compute(names=None, models=MODELS) -> dict:
    """Every (launch, model) prediction, with the time each took."""
    from iosim.version import __version__

    out = {"iosim_version": __version__, "runs": {}}
    for name in names or LAUNCHES:
        for model in models:
            t0 = time.perf_counter()
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
        for model in MODELS:
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("compute", "table", "predictions"))
    ap.add_argument("--launch", nargs="+", choices=list(LAUNCHES), help="compute only these launches")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
