"""FlashAttention's Figure 2 (left) level by level, with the hierarchy's mechanisms: bytes per array as the kernels
move them, the L2 in partitions with 32-byte sectors, resident CTAs from the kernel's resources.

The figure (Dao et al., NeurIPS 2022, Fig. 2 left; experiments 03 and 15 hold it as a two-level count and as the
hierarchy's DRAM on the A100 preset): GPT-2 medium attention, batch 64, 16 heads, N = 1024, d = 64, causal, fp16,
forward + backward on an A100: standard attention 40.3 GB of HBM reads + writes, FlashAttention 4.4 GB. Only the
DRAM total was measured; the levels above it are predictions. No H100 measurement of this launch is stored
(``experiments/bench/gpu_h100/``: the SDPA launches are at N = 32,768, the sweep at N = 2,048 in float32), so the
H100 rows of FlashAttention-2 are registered in ``experiments/bench/predictions/h100.json`` for the next lease
(``python experiments/bench/hierarchy_h100.py predictions`` adds them).

Per (device, algorithm, pass), through ``hierarchy_h100_sweep.predict`` (the one call of ``iosim.hierarchy``):

* the device preset (``experiments/data/devices.csv``, each parameter with its source): A100 (108 SMs, 40 MiB of
  L2 in 2 partitions), H100 (132 SMs, 50 MiB in 2); sectors of 32 bytes; the partitions' address hash the stated
  choice ``HOME_LINES`` = 16 (``hierarchy_h100.py``);
* the kernels' dtypes (fp16 operands, fp32 statistics and dQ's accumulator, ``element_bytes="kernel"``);
* FlashAttention-2 (PyTorch's SDPA runs it on both GPUs): its tiles and warps for head dimension 64 from its
  launch templates (github.com/Dao-AILab/flash-attention, ``csrc/flash_attn/src/flash_fwd_launch_template.h``,
  ``run_mha_fwd_hdim64``: ``Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, T>`` without dropout;
  ``flash_bwd_launch_template.h``, ``run_mha_bwd_hdim64``: ``Flash_bwd_kernel_traits<64, 128, 128, 8, 4, 4, 4,
  false, false, T>`` where the block may have 144 KiB of shared memory, as on the A100 and H100), and its resident
  CTAs from those traits (``iosim.hierarchy.resident``; registers unknown: an upper bound);
* FlashAttention (flash1, the figure's measured kernel) and standard attention: the ``fit`` tiles of the device's
  largest shared memory per block, one CTA per SM (their kernels' resources are not in the repository).

Levels (bytes): two-level (the schedule's loads + stores, each array at its dtype); LSU (the global load and store
bytes Nsight Compute counts: equal to the two-level bytes wherever every tile row is whole 32-byte sectors, as
FlashAttention's d = 64 fp16 rows of 128 bytes are; the FA2 forward at N = 32,768 measured exactly that,
docs/hierarchy-hardware.md); L2 (requests: reads, stores and reductions, plus the reads that cross between the
partitions); DRAM read and write (write during the kernels, and with the final flush).

Run: ``python experiments/bench/hierarchy_fig2.py compute`` (minutes; results to ``gpu_h100/hierarchy-fig2.json``),
``... table [--write]``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hierarchy_h100_sweep as sweep  # noqa: E402  (predict: the one call of iosim.hierarchy)

STORED = HERE / "gpu_h100" / "hierarchy-fig2.json"
DOC = sweep.DOC
BLOCK = ("<!-- hierarchy-fig2 -->", "<!-- /hierarchy-fig2 -->")
BATCH, HEADS, N, D = 64, 16, 1024, 64
PAPER_GB = {"standard": 40.3, "flash1": 4.4}  # Fig. 2 left, A100, forward + backward, HBM reads + writes
GB = 1e9
# FA2's traits for head dimension 64 on the A100 and H100 (module docstring), as Nsight Compute prints them
FA2 = {
    False: ("flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, 0, 0, cutlass::half_t>", 128, 128),
    True: ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, 4, 4, 4, 0, 0, "
           "cutlass::half_t>", 128, 128),
}  # fmt: skip
# (device, algorithm, batch computed): every launch at the paper's batch (minutes on 2 cores in all)
CASES = [("H100", "flash2", BATCH), ("A100", "flash2", BATCH), ("A100", "flash1", BATCH), ("A100", "standard", BATCH)]


def problem(batch: int = BATCH, causal: bool = True):
    import iosim

    return iosim.Problem(B=batch, H_q=HEADS, N=N, d=D, causal=causal, dtype_q="fp16")


def working_set(schedule) -> int:
    """The two-level working set of a schedule's tiles at d = 64 (what its M must hold; FA2 keeps part of it in
    registers, so its resident CTAs come from its resources, not from M): the peak of one head, as
    ``hierarchy_h100._working_set`` takes it."""
    import iosim

    return int(iosim.run(schedule, N=N, d=D, M=1 << 20, count_only=True).main.stats.peak)


def run(device: str, algorithm: str, backward: bool, batch: int = BATCH, causal: bool = True) -> dict:
    """One pass on one device preset: bytes per level (module docstring)."""
    import iosim

    M = kernel = None  # noqa: N806
    if algorithm == "flash2":
        kernel, br, bc = FA2[backward]
        sched = iosim.Schedule("flash2", backward=backward, Br=br, Bc=bc)
        M = working_set(sched)  # noqa: N806
    else:
        sched = iosim.Schedule(algorithm, backward=backward)
    t0 = time.perf_counter()
    # PyTorch's standard attention in fp16 writes S, P, dP, dS in fp16 (half-precision matmul and softmax outputs,
    # as experiment 15 prices them) and stores no statistics: every array at 2 bytes, not the fp32 of kernel_dtype
    eb = "uniform" if algorithm == "standard" else "kernel"
    r = sweep.predict(problem(batch, causal), sched, device, M=M, kernel=kernel, element_bytes=eb)
    pa = r.per_array.values()
    load = sum(c.bytes("two_level_reads") for c in pa)
    store = sum(c.bytes("two_level_writes") for c in pa)
    return dict(device=device, algorithm=algorithm, backward=backward, batch=batch, causal=causal,
                tiling=r.tiling, M=r.M, blocks_per_sm=r.blocks_per_sm, resident=r.resident,
                two_level_load=load, two_level_store=store,
                l2_read=r.level_bytes("l2_read"), l2_update=r.level_bytes("l2_update"),
                l2_reduce=r.level_bytes("l2_reduce"), fabric=r.level_bytes("fabric"),
                dram_read=r.level_bytes("dram_read"),
                dram_write_during=sum(w["during_bytes"] for w in r.dram_writes),
                dram_write_with_flush=r.level_bytes("dram_update"),
                launches=[k["kernel"] for k in r.launches], seconds=round(time.perf_counter() - t0, 1))  # fmt: skip


def compute() -> dict:
    from iosim.base.version import __version__

    out = {"iosim_version": __version__, "home_lines": sweep.HOME_LINES, "runs": []}
    for device, alg, batch in CASES:
        for backward in (False, True):
            got = run(device, alg, backward, batch)
            out["runs"].append(got)
            STORED.write_text(json.dumps(out, indent=1) + "\n")  # after each run: a stopped compute loses little
            print(f"{device} {alg} {'backward' if backward else 'forward'}: {got['seconds']} s", file=sys.stderr,
                  flush=True)  # fmt: skip
    return out


def _gb(x: float) -> str:
    return f"{x / GB:.2f}"


def table(stored: dict | None = None) -> str:
    """Per device and algorithm, forward + backward summed: each level in GB, the paper's measured HBM total."""
    from tabulate import tabulate

    runs = (stored or json.loads(STORED.read_text()))["runs"]
    body = []
    for device, alg, _ in CASES:
        both = [r for r in runs if r["device"] == device and r["algorithm"] == alg]
        if len(both) != 2:
            continue
        s = {k: sum(r[k] for r in both) for k in both[0] if type(both[0][k]) is int and k != "batch"}
        scale = BATCH / both[0]["batch"]
        dram = s["dram_read"] + s["dram_write_with_flush"]
        paper = PAPER_GB.get(alg) if device == "A100" else None
        body.append([device, alg, "; ".join(f"{'bwd' if r['backward'] else 'fwd'} {r['blocks_per_sm']}" for r in both),
                     _gb(scale * (s["two_level_load"] + s["two_level_store"])),
                     _gb(scale * (s["two_level_load"] + s["two_level_store"])),
                     _gb(scale * (s["l2_read"] + s["l2_update"] + s["l2_reduce"])), _gb(scale * s["fabric"]),
                     _gb(scale * s["dram_read"]), _gb(scale * s["dram_write_during"]),
                     _gb(scale * s["dram_write_with_flush"]), _gb(scale * dram),
                     "-" if paper is None else f"{paper}",
                     "-" if paper is None else f"{paper / (scale * dram / GB):.2f}"])  # fmt: skip
    head = ["device", "algorithm", "CTAs/SM", "two-level GB", "LSU GB", "L2 requests GB", "+ fabric GB",
            "DRAM read GB", "DRAM write GB (during)", "DRAM write GB (with flush)", "DRAM total GB",
            "measured HBM GB (paper)", "measured / iosim"]  # fmt: skip
    return tabulate(body, headers=head, tablefmt="github", disable_numparse=True)


def entry_id(r: dict) -> str:
    return f"fig2-gpt2-fa2-{'bwd' if r['backward'] else 'fwd'}{'-causal' if r['causal'] else ''}"


def levels(r: dict) -> dict:
    """A stored run's predicted levels, named as gpu_predictions.LEVELS names them (global loads and stores: the
    LSU bytes, here the two-level bytes; DRAM write: during the kernels)."""
    out = {
        "dram_read": r["dram_read"],
        "dram_write": r["dram_write_during"],
        "global_load": r["two_level_load"],
        "global_store": r["two_level_store"],
        "l2_reduction": r["l2_reduce"],
        "l2_read_from_fabric": r["fabric"],
    }
    return {k: v for k, v in out.items() if v}


def entries(stored: dict | None = None) -> list[dict]:
    """The predictions-file entries of the H100 runs (gpu_predictions' format): SDPA's FlashAttention-2 at GPT-2
    medium's shape, forward and backward."""
    runs = (stored or json.loads(STORED.read_text()))["runs"]
    out = []
    for r in runs:
        if r["device"] != "H100" or r["algorithm"] != "flash2" or r["batch"] != BATCH:
            continue
        out.append({"id": entry_id(r), "what": f"FlashAttention Fig. 2 (GPT-2 medium) on the H100: SDPA "
                    f"FlashAttention-2 {'backward' if r['backward'] else 'forward'}, every mechanism",
                    "backend": "sdpa-flash", "B": BATCH, "H_q": HEADS, "H_kv": HEADS, "N_q": N, "N_k": N, "d": D,
                    "causal": r["causal"], "dtype": "float16", "order": "head-grouped",
                    "pass": "backward" if r["backward"] else "forward", "model": "every mechanism",
                    "blocks_per_sm": r["blocks_per_sm"], "predicted": levels(r)})  # fmt: skip
    return out


def register() -> None:
    """Put :func:`entries` into the predictions file, replacing entries of the same id, the others unchanged."""
    path = sweep.hierarchy_h100.PREDICTIONS
    data = json.loads(path.read_text())
    new = entries()
    ids = {e["id"] for e in new}
    data["entries"] = [e for e in data["entries"] if e["id"] not in ids] + new
    path.write_text(json.dumps(data, indent=1) + "\n")


def write_docs() -> None:
    """Put :func:`table` between the doc's Figure 2 markers."""
    sweep.hierarchy_h100.write_block(table(), BLOCK)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("compute", "table", "register"))
    ap.add_argument("--write", action="store_true", help="table: also write it into docs/hierarchy-hardware.md")
    args = ap.parse_args(argv)
    if args.what == "compute":
        compute()
        print(f"wrote {STORED}")
    elif args.what == "register":
        register()
        print(f"wrote the H100 entries into {sweep.hierarchy_h100.PREDICTIONS}")
    else:
        print(table())
        if args.write:
            write_docs()
            print(f"wrote the table into {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
