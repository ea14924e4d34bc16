"""Resident thread blocks (CTAs) per SM from a kernel's resources, for iosim's kernels and third-party ones.

:func:`resident_ctas` is the CUDA occupancy calculation (:func:`iosim.gpu.resources.occupancy`, cuda_occupancy.h)
on a device preset's per-SM limits (:meth:`iosim.hierarchy.devices.Device.arch`): blocks per SM are the least of
the limits by threads, registers, shared memory and the hardware's blocks per SM.

:data:`FA2_KERNELS` lists the FlashAttention-2 kernels whose launches PyTorch's SDPA made on the H100
(``experiments/bench/gpu_h100/ncu-torch.json``): threads, tiles and dynamic shared memory follow from the kernel
traits by the expressions of FlashAttention-2's own source (github.com/Dao-AILab/flash-attention at commit
``0251105a``, files and lines cited per entry; PyTorch vendors the same kernels as ``pytorch_flash::``). No
``__launch_bounds__`` or minimum blocks per multiprocessor is declared on these kernels
(``DEFINE_FLASH_FORWARD_KERNEL`` / ``DEFINE_FLASH_BACKWARD_KERNEL`` in the launch templates), so nothing in the
source fixes their registers per thread: ``registers`` stays an explicit input, unknown (None) until measured
(:data:`TO_MEASURE`); with None, :func:`resident_ctas` gives the bound the other limits allow and says so.

:func:`parse_kernel_name` reads the traits off a kernel name as Nsight Compute prints it (``Flash_fwd_kernel_traits
<128, 128, 64, 4, 0, 0, cutlass::half_t, ...>``), so a stored launch's tiles and warps come from its own name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from iosim.base.errors import InputError
from iosim.hierarchy.devices import Device
from iosim.hierarchy.devices import device as _device

FA2_SOURCE = "github.com/Dao-AILab/flash-attention@0251105a, csrc/flash_attn/src/"
TO_MEASURE = (
    "registers per thread of FA2's kernels (Nsight: launch__registers_per_thread)",
    "FA2's resident blocks per SM as the driver computes them (Nsight: launch__occupancy_limit_registers, "
    "launch__occupancy_limit_shared_mem, launch__occupancy_limit_warps)",
)


def resident_ctas(device: Device | str, threads: int, registers: int | None, smem_bytes: int) -> tuple[int, str]:
    """(blocks per SM, limiter) of a kernel with ``threads`` per block, ``registers`` per thread and ``smem_bytes``
    of shared memory per block (static + dynamic) on ``device``. Limiter: which of threads, registers, shared,
    blocks binds (several joined by commas when equal). ``registers=None`` (not known): the register limit is left
    out, the count is an upper bound and the limiter ends with "; registers unknown (upper bound)"."""
    from iosim.gpu.resources import occupancy

    dev = device if isinstance(device, Device) else _device(device)
    arch = dev.arch()
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
        raise InputError("threads", "must be an integer in 1..1024 (threads per block)", threads)
    if registers is not None and (
        isinstance(registers, bool) or not isinstance(registers, int) or not 1 <= registers <= arch.max_regs_per_thread
    ):
        raise InputError("registers", f"must be None or an integer in 1..{arch.max_regs_per_thread}", registers)
    if (
        isinstance(smem_bytes, bool)
        or not isinstance(smem_bytes, int)
        or not 0 <= smem_bytes <= dev.smem_per_block_bytes
    ):
        raise InputError("smem_bytes", f"must be an integer in 0..{dev.smem_per_block_bytes} on {dev.name}", smem_bytes)
    occ = occupancy(arch, registers or 1, 0, smem_bytes, threads)
    if registers is not None:
        return occ["blocks_per_sm"], occ["limiter"]
    limits = (("threads", occ["blocks_by_threads"]), ("shared", occ["blocks_by_smem"]), ("blocks", occ["blocks_by_hw"]))
    blocks = min(v for _, v in limits)
    limiter = ",".join(n for n, v in limits if v == blocks)
    return blocks, f"{limiter}; registers unknown (upper bound)"


# ------------------------------------------------------------------------------ FlashAttention-2's shared memory
def fa2_fwd_smem(head_dim: int, block_m: int, block_n: int, elem_bytes: int, share_qk: bool = False) -> int:
    """Flash_fwd_kernel_traits::kSmemSize (kernel_traits.h, lines 107-109): kSmemQSize = kBlockM kHeadDim
    elements, kSmemKVSize = 2 kBlockN kHeadDim elements (K and V); Share_Q_K_smem ? max : sum."""
    q = block_m * head_dim * elem_bytes
    kv = 2 * block_n * head_dim * elem_bytes
    return max(q, kv) if share_qk else q + kv


def fa2_bwd_smem_1colblock(
    head_dim: int, block_m: int, block_n: int, elem_bytes: int, v_in_regs: bool = False, no_double_buffer: bool = False
) -> int:
    """Flash_bwd_kernel_traits::kSmemSize1colblock (kernel_traits.h, lines 278-290), what the seqk-parallel
    backward launches with (flash_bwd_launch_template.h, line 95): Q and dO tiles, double-buffered Q (3 tiles of
    kBlockM x kHeadDim, 2 with No_double_buffer), K and V (2 kBlockN kHeadDim), dS and P (kBlockM kBlockN each)."""
    qdo = block_m * head_dim * (2 if no_double_buffer else 3) * elem_bytes
    kv = 2 * block_n * head_dim * elem_bytes
    ds = p = block_m * block_n * elem_bytes
    return qdo + (max(kv, kv // 2 + ds + p) if v_in_regs else kv + ds + p)


def fa2_bwd_dq_smem(head_dim: int, block_m: int, elem_bytes: int) -> int:
    """Flash_bwd_kernel_traits::kSmemdQSize (kernel_traits.h, line 282): one kBlockM x kHeadDim tile, the dynamic
    shared memory of flash_bwd_convert_dq_kernel (flash_bwd_launch_template.h, line 124)."""
    return block_m * head_dim * elem_bytes


ELEM_BYTES = {"half_t": 2, "bfloat16_t": 2, "float": 4}
_FWD = re.compile(r"Flash_fwd_kernel_traits<(\d+), (\d+), (\d+), (\d+), (\d+), (\d+), cutlass::(\w+)")
_BWD = re.compile(
    r"Flash_bwd_kernel_traits<(\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+), cutlass::(\w+)"
)
_KERNEL = re.compile(r"(flash_\w+_kernel)<")
# Dynamic shared memory of each FA2 kernel: (function of the parsed traits, where the source says so).
_LAUNCH = {
    "flash_fwd_kernel": (
        lambda t: fa2_fwd_smem(t["head_dim"], t["block_m"], t["block_n"], t["elem_bytes"], t["share_qk"]),
        "flash_fwd_launch_template.h, run_flash_fwd: smem_size = Kernel_traits::kSmemSize (line 56), "
        "kernel<<<grid, Kernel_traits::kNThreads, smem_size>>> (line 91)",
    ),
    "flash_fwd_splitkv_kernel": (
        lambda t: fa2_fwd_smem(t["head_dim"], t["block_m"], t["block_n"], t["elem_bytes"], t["share_qk"]),
        "flash_fwd_launch_template.h, run_flash_splitkv_fwd: smem_size = Kernel_traits::kSmemSize (line 105), "
        "kernel<<<grid, Kernel_traits::kNThreads, smem_size>>> (line 127)",
    ),
    "flash_fwd_splitkv_combine_kernel": (
        lambda t: 0,
        "flash_fwd_launch_template.h, run_flash_splitkv_fwd: <<<grid_combine, Kernel_traits::kNThreads, 0>>> "
        "(lines 144-156)",
    ),
    "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel": (
        lambda t: fa2_bwd_smem_1colblock(
            t["head_dim"], t["block_m"], t["block_n"], t["elem_bytes"], t["v_in_regs"], t["no_double_buffer"]
        ),
        "flash_bwd_launch_template.h, run_flash_bwd_seqk_parallel: smem_size_dq_dk_dv = "
        "Kernel_traits::kSmemSize1colblock (line 95), kernel<<<grid_n, Kernel_traits::kNThreads, "
        "smem_size_dq_dk_dv>>> (line 111)",
    ),
    "flash_bwd_dot_do_o_kernel": (
        lambda t: 0,
        "flash_bwd_launch_template.h, run_flash_bwd_seqk_parallel: <<<grid_m, Kernel_traits::kNThreads, 0>>> "
        "(lines 85-87)",
    ),
    "flash_bwd_convert_dq_kernel": (
        lambda t: fa2_bwd_dq_smem(t["head_dim"], t["block_m"], t["elem_bytes"]),
        "flash_bwd_launch_template.h, run_flash_bwd_seqk_parallel: <<<grid_m, Kernel_traits::kNThreads, "
        "Kernel_traits::kSmemdQSize>>> (line 124)",
    ),
}


@dataclass(frozen=True)
class KernelResources:
    """One third-party kernel's launch resources: tiles, warps and shared memory from its traits (cited), registers
    per thread as given (None: unknown, not fixed by the source)."""

    kernel: str
    traits: str
    head_dim: int
    block_m: int
    block_n: int
    warps: int
    elem_bytes: int
    smem_bytes: int
    source: str
    registers: int | None = None

    @property
    def threads(self) -> int:
        """kNThreads = kNWarps * 32 (kernel_traits.h, lines 63-64 and 179-180)."""
        return self.warps * 32

    def resident(self, device: Device | str = "H100") -> tuple[int, str]:
        return resident_ctas(device, self.threads, self.registers, self.smem_bytes)


GIVEN_KEYS = ("threads", "smem_bytes", "registers", "name")


def kernel_of(kernel) -> KernelResources:
    """The kernel a hierarchy launch names (``Machine(kernel=...)``), as :class:`KernelResources`: one already made
    (:data:`FA2_KERNELS`, :func:`parse_kernel_name`), a FlashAttention-2 kernel name as Nsight Compute prints it, or a
    dict ``threads`` (per block), ``smem_bytes`` (static + dynamic shared memory per block), ``registers`` (per
    thread; None or absent: unknown) and an optional ``name`` (iosim's own kernels: the driver's figures, as
    ``experiments/bench/gpu_h100/occupancy.json`` stores them). Threads count in whole warps, as the occupancy
    calculation counts them. Anything else is one line naming ``kernel``."""
    if isinstance(kernel, KernelResources):
        return kernel
    if isinstance(kernel, str):
        return parse_kernel_name(kernel)
    if not isinstance(kernel, dict) or not {"threads", "smem_bytes"} <= set(kernel) or set(kernel) - set(GIVEN_KEYS):
        raise InputError(
            "kernel",
            "must be a FlashAttention-2 kernel name, iosim.hierarchy.resident.KernelResources or a dict with threads, "
            "smem_bytes and optionally registers, name",
            kernel if isinstance(kernel, dict) else type(kernel).__name__,
        )
    threads, smem, regs = kernel["threads"], kernel["smem_bytes"], kernel.get("registers")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
        raise InputError("kernel threads", "must be an integer in 1..1024 (threads per block)", threads)
    return KernelResources(kernel=str(kernel.get("name", "given kernel")), traits="given", head_dim=0, block_m=0,
                           block_n=0, warps=-(-threads // 32), elem_bytes=0, smem_bytes=smem, source="given",
                           registers=regs)  # fmt: skip


def _traits(name: str) -> tuple[dict, str]:
    m = _FWD.search(name)
    if m:
        hd, bm, bn, w, q_regs, share, elem = m.groups()
        flags = dict(q_in_regs=q_regs != "0", share_qk=share != "0", v_in_regs=False, no_double_buffer=False)
    else:
        m = _BWD.search(name)
        if not m:
            raise InputError("kernel name", "must contain Flash_fwd_kernel_traits<...> or Flash_bwd_kernel_traits<...>")
        hd, bm, bn, w, _, _, _, v_regs, ndb, elem = m.groups()
        flags = dict(q_in_regs=False, share_qk=False, v_in_regs=v_regs != "0", no_double_buffer=ndb != "0")
    if elem not in ELEM_BYTES:
        raise InputError("kernel name", f"element type must be one of {', '.join(ELEM_BYTES)}", elem)
    t = dict(head_dim=int(hd), block_m=int(bm), block_n=int(bn), warps=int(w), elem_bytes=ELEM_BYTES[elem], **flags)
    return t, m.group(0) + ">"


def parse_kernel_name(name: str, registers: int | None = None) -> KernelResources:
    """A FlashAttention-2 launch's resources read off its kernel name (Nsight Compute's demangled name, possibly
    truncated after the traits): the function (flash_fwd_kernel, ...) and its kernel traits' head dimension,
    kBlockM, kBlockN, kNWarps and element type; shared memory by the source's expression for that function."""
    k = _KERNEL.search(name)
    if not k or k.group(1) not in _LAUNCH:
        raise InputError("kernel name", f"must name one of {', '.join(_LAUNCH)}", name[:80])
    t, traits = _traits(name)
    smem, where = _LAUNCH[k.group(1)]
    return KernelResources(
        kernel=k.group(1),
        traits=traits,
        head_dim=t["head_dim"],
        block_m=t["block_m"],
        block_n=t["block_n"],
        warps=t["warps"],
        elem_bytes=t["elem_bytes"],
        smem_bytes=smem(t),
        source=FA2_SOURCE + where + "; traits: kernel_traits.h",
        registers=registers,
    )


# The kernels of the H100 launches (ncu-torch.json), traits as FA2 chooses them for head dim 128 on sm90:
# run_mha_fwd_hdim128 (flash_fwd_launch_template.h, line 262), run_mha_fwd_splitkv_dispatch (lines 181-191:
# kBlockM 64, kBlockN 128 for head dim <= 128), run_mha_bwd_hdim128 (flash_bwd_launch_template.h, line 248).
FA2_KERNELS = {
    k.kernel: k
    for k in map(
        parse_kernel_name,
        (
            "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, 0, 0, cutlass::half_t>",
            "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, 0, 0, "
            "cutlass::half_t>",
            "flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, 0, 0, cutlass::bfloat16_t>",
        ),
    )
}


def table(device: Device | str = "H100", names=None) -> str:
    """Markdown table: each kernel's traits, threads, shared memory and resident blocks per SM on ``device``."""
    ks = [parse_kernel_name(n) for n in names] if names else list(FA2_KERNELS.values())
    dev = device if isinstance(device, Device) else _device(device)
    lines = [
        f"| kernel | traits | threads | shared memory (B) | registers | blocks per SM on {dev.name} | limiter |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    seen = set()
    for k in ks:
        if (k.kernel, k.traits) in seen:
            continue
        seen.add((k.kernel, k.traits))
        blocks, limiter = k.resident(dev)
        regs = "unknown" if k.registers is None else str(k.registers)
        lines.append(f"| {k.kernel} | {k.traits} | {k.threads} | {k.smem_bytes:,} | {regs} | {blocks} | {limiter} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse
    import json
    import sys

    p = argparse.ArgumentParser(prog="python -m iosim.hierarchy.resident", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="H100", help="a preset of the devices table (default H100)")
    p.add_argument("--ncu", help="an Nsight Compute JSON of the GPU evidence (ncu-torch.json): its FA2 launches")
    args = p.parse_args(argv)
    try:
        names = None
        if args.ncu:
            with open(args.ncu) as f:
                names = [r["kernel"] for r in json.load(f)["launches"] if "Flash_" in r["kernel"]]
        print(table(args.device, names))
    except (InputError, OSError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
