"""Per-kernel GPU resources without a GPU: ``iosim gpu-resources`` or ``python -m iosim.gpu.resources``.

Every kernel of :func:`iosim.algorithms.cuda.ptx.signatures` is compiled to PTX (``numba.cuda.compile_ptx``) and
assembled to a cubin with nvJitLink (``cuda.bindings.nvjitlink`` over the ``nvidia-nvjitlink`` wheel that the
``cuda`` extra installs), the same ptxas the driver would run. Its verbose info log gives registers per thread,
spill stores and loads, stack frame (local memory) and static shared memory; the cubin's symbol table gives the
system-reserved shared memory the toolchain places in each sm_90 kernel (``.nv.reservedSmem.cap``, 1 KiB), which
the linker's "smem" figure includes and which is not the kernel's own static shared memory.

Dynamic shared memory is what the host launchers ask for at (N, d, M): the words of the layout of the tiles the
simulator chooses from M (``iosim.gpu.tiling_for``), 4 bytes each, as ``iosim.algorithms.cuda._host`` launches
it. From those figures and the threads per block, the blocks resident per SM follow the CUDA occupancy
calculator (``cuda_occupancy.h`` from the CUDA toolkit, shipped in the ``nvidia-cuda-runtime`` wheel): each of
the limits by threads, registers, shared memory and the hardware's blocks per SM, at the largest shared-memory
carveout (the default preference).

Nothing here needs a GPU; the kernels are compiled for the real target, so run it with the CUDA simulator off
(it switches the simulator off itself when ``numba.cuda`` is not yet imported).
"""

from __future__ import annotations

import re
import struct
from dataclasses import asdict, dataclass

KIB = 1024
WORD_BYTES = 4  # float32, as the launchers size dynamic shared memory


@dataclass(frozen=True)
class Arch:
    """Per-SM limits of one compute capability.

    Sources: CUDA C++ Programming Guide, "Technical Specifications per Compute Capability" (registers per SM and per
    block, 255 registers per thread, 2048 threads / 64 warps / 32 blocks per SM, shared memory per SM and per
    block) https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#features-and-technical-specifications-technical-specifications-per-compute-capability
    and its "Shared Memory" sections for compute capability 8.x and 9.0 (164 KB / 228 KB per SM, 163 KB / 227 KB
    per block with the opt-in, 48 KB without; 1 KB per block reserved for system use)
    https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#shared-memory-8-x ,
    https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#shared-memory-9-0 ;
    allocation granularities (registers: 256 per warp, 4 sub-partitions per SM; shared memory: 128 bytes) and the
    occupancy formulas: cuda_occupancy.h, CUDA 13 (cudaOccRegAllocationGranularity,
    cudaOccSubPartitionsPerMultiprocessor, cudaOccSMemAllocationGranularity, cudaOccMaxBlocksPerSMRegsLimit,
    cudaOccMaxBlocksPerSMSmemLimit).
    """

    gpu: str
    smem_per_sm: int  # bytes, the largest carveout
    smem_optin_per_block: int  # bytes a block may use with cudaFuncAttributeMaxDynamicSharedMemorySize
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    max_regs_per_thread: int = 255
    reg_unit: int = 256  # registers are allocated per warp in units of 256
    sub_partitions: int = 4
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    smem_default_per_block: int = 48 * KIB
    reserved_smem_per_block: int = 1 * KIB
    smem_unit: int = 128


ARCHS = {
    (8, 0): Arch("A100", smem_per_sm=164 * KIB, smem_optin_per_block=163 * KIB),
    (9, 0): Arch("H100", smem_per_sm=228 * KIB, smem_optin_per_block=227 * KIB),
}

DEFAULT_CC = ("8.0", "9.0")
DEFAULT_N = 4096
DEFAULT_D = (64,)
DEFAULT_M = (4096, 16384, 49152)


@dataclass
class Compiled:
    """What ptxas (through nvJitLink) reports for one kernel at one compute capability."""

    kernel: str
    cc: tuple[int, int]
    registers: int
    spill_stores: int  # bytes, summed over the kernel and any function it calls
    spill_loads: int
    stack: int  # bytes of stack frame (local memory) per thread
    static_smem: int  # bytes of the kernel's own static shared memory (the reserved part taken out)
    reserved_smem: int  # bytes of system-reserved shared memory the cubin carries (sm_90: 1024)
    barriers: int
    toolkit: str


def parse_cc(text: str) -> tuple[int, int]:
    from iosim.base.errors import InputError

    m = re.fullmatch(r"(\d+)\.(\d+)", text.strip())
    if not m or (int(m[1]), int(m[2])) not in ARCHS:
        raise InputError("--cc", f"must be one of {', '.join(f'{a}.{b}' for a, b in ARCHS)}", text)
    return int(m[1]), int(m[2])


def toolchain_missing() -> str | None:
    """None when numba-cuda and nvJitLink are usable here; otherwise one line saying what to install."""
    from iosim.gpu.launch import CUDA_HINT, cuda_missing

    why = cuda_missing()
    if why:
        return why
    try:
        from cuda.bindings import nvjitlink

        nvjitlink.version()
    except Exception as e:  # any failure to load libnvJitLink means the same to the user
        return f"nvJitLink is not usable ({type(e).__name__}: {e}): {CUDA_HINT} (it brings nvidia-nvjitlink)"
    return None


def _link(ptx: str, cc: tuple[int, int]) -> tuple[str, bytes]:
    """Assemble PTX to a cubin with nvJitLink; (verbose info log, cubin)."""
    from cuda.bindings import nvjitlink

    data = ptx.encode()
    opts = [f"-arch=sm_{cc[0]}{cc[1]}", "-verbose"]
    h = nvjitlink.create(len(opts), opts)
    try:
        nvjitlink.add_data(h, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
        try:
            nvjitlink.complete(h)
        except nvjitlink.nvJitLinkError:
            log = bytearray(nvjitlink.get_error_log_size(h))
            nvjitlink.get_error_log(h, log)
            raise RuntimeError(f"nvJitLink failed for sm_{cc[0]}{cc[1]}:\n{log.decode(errors='replace')}") from None
        info = bytearray(nvjitlink.get_info_log_size(h))
        nvjitlink.get_info_log(h, info)
        cubin = bytearray(nvjitlink.get_linked_cubin_size(h))
        nvjitlink.get_linked_cubin(h, cubin)
    finally:
        nvjitlink.destroy(h)
    return info.decode(errors="replace").rstrip("\x00"), bytes(cubin)


def elf_symbols(cubin: bytes) -> dict[str, int]:
    """{symbol name: value} of an ELF64 little-endian cubin's symbol table."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not an ELF64 cubin")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    out = {}
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        strtab = sections[link][4]
        for k in range(size // (entsize or 24)):
            name, _, _, _, value, _ = struct.unpack_from("<IBBHQQ", cubin, offset + k * (entsize or 24))
            end = cubin.index(b"\0", strtab + name)
            out[cubin[strtab + name : end].decode(errors="replace")] = value
    return out


_FINAL = re.compile(
    r"used (\d+) registers, used (\d+) barriers, (\d+) stack, (\d+) bytes smem, .*?(\d+) bytes lmem", re.IGNORECASE
)
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_info_log(log: str) -> dict:
    """Registers, barriers, stack, smem (the linker's final line for the entry) and spills (summed over functions)."""
    finals = _FINAL.findall(log)
    if not finals:
        raise RuntimeError(f"no resource line in the nvJitLink info log:\n{log}")
    regs, barriers, stack, smem, lmem = (int(x) for x in finals[-1])
    spills = [(int(a), int(b), int(c)) for a, b, c in _SPILL.findall(log)]
    return {
        "registers": regs,
        "barriers": barriers,
        "stack": max(stack, lmem, *(s[0] for s in spills)) if spills else max(stack, lmem),
        "smem": smem,
        "spill_stores": sum(s[1] for s in spills),
        "spill_loads": sum(s[2] for s in spills),
    }


def compile_kernels(cc: tuple[int, int]) -> list[Compiled]:
    """Compile and assemble every kernel for ``cc``; the figures ptxas reports for each."""
    from cuda.bindings import nvjitlink

    from iosim.algorithms.cuda import ptx

    major, minor = nvjitlink.version()
    out = []
    for name, text in ptx.compile_all(cc).items():
        log, cubin = _link(text, cc)
        r = parse_info_log(log)
        reserved = elf_symbols(cubin).get(".nv.reservedSmem.cap", 0)
        out.append(
            Compiled(
                kernel=name,
                cc=cc,
                registers=r["registers"],
                spill_stores=r["spill_stores"],
                spill_loads=r["spill_loads"],
                stack=r["stack"],
                static_smem=max(0, r["smem"] - reserved),
                reserved_smem=min(reserved, r["smem"]),
                barriers=r["barriers"],
                toolkit=f"nvJitLink {major}.{minor}",
            )
        )
    return out


def launch_words(kernel: str, N: int, d: int, M: int) -> tuple[int | None, str]:
    """(float32 words of dynamic shared memory the launcher gives ``kernel`` at (N, d, M), tiles); None: not
    launched at this (N, M). Raises InputError / CapacityError when no tiling fits M."""
    from iosim.algorithms.cuda import flash, square_tiling, standard
    from iosim.gpu.launch import tiling_for

    if kernel in ("flash2_forward_kernel", "flash1_forward_kernel"):
        t = tiling_for("flash2" if kernel.startswith("flash2") else "flash1", N, d, M)
        return flash.forward_layout.host(N, d, t.Br, t.Bc, kernel.startswith("flash1"))[-1], f"Br={t.Br} Bc={t.Bc}"
    if kernel == "logsumexp_kernel":
        tiling_for("flash1", N, d, M)
        return 0, "-"
    if kernel in ("flash2_backward_prep_kernel", "flash2_backward_kernel"):
        t = tiling_for("flash2", N, d, M, backward=True)
        if kernel == "flash2_backward_prep_kernel":
            return flash.backward_prep_layout.host(N, d, t.Br)[-1], f"Br={t.Br}"
        return flash.backward_layout.host(N, d, t.Br, t.Bc)[-1], f"Br={t.Br} Bc={t.Bc}"
    if kernel == "matmul_kernel":
        t = tiling_for("standard", N, d, M)
        return max(standard.matmul_words(N, d, N, t.B), standard.matmul_words(N, N, d, t.B)), f"B={t.B}"
    if kernel in ("softmax_rows_kernel", "softmax_chunks_kernel"):
        tiling_for("standard", N, d, M)
        R, C, words = standard.softmax_plan(N, M)
        rows = kernel == "softmax_rows_kernel"
        if rows != bool(R):
            return None, "-"
        return words, f"R={R}" if rows else f"C={C}"
    if kernel in ("square_phase1_kernel", "square_phase2_kernel"):
        t = tiling_for("square-tiling", N, d, M)
        return square_tiling.square_shared_words(N, d, t.B), f"B={t.B}"
    raise KeyError(kernel)


def occupancy(arch: Arch, registers: int, static_smem: int, dynamic_smem: int, threads: int) -> dict:
    """Blocks per SM by each limiter and the occupancy, as cuda_occupancy.h computes them (default carveout)."""
    warps = -(-threads // 32)
    by_threads = arch.max_threads_per_sm // 32 // warps
    regs_per_warp = -(-registers * 32 // arch.reg_unit) * arch.reg_unit
    assumed = regs_per_warp * (-(-warps // arch.sub_partitions) * arch.sub_partitions)
    if registers > arch.max_regs_per_thread or assumed > arch.regs_per_block:
        by_regs = 0
    else:
        by_regs = (arch.regs_per_sm // arch.sub_partitions // regs_per_warp) * arch.sub_partitions // warps
    per_block = static_smem + dynamic_smem  # what the block asks for; the opt-in limit applies to this
    allocated = -(-(per_block + arch.reserved_smem_per_block) // arch.smem_unit) * arch.smem_unit
    by_smem = 0 if per_block > arch.smem_optin_per_block else arch.smem_per_sm // allocated
    blocks = min(by_threads, by_regs, by_smem, arch.max_blocks_per_sm)
    limits = (("threads", by_threads), ("registers", by_regs), ("shared", by_smem), ("blocks", arch.max_blocks_per_sm))
    limiter = [n for n, v in limits if v == blocks]
    return {
        "blocks_by_threads": by_threads,
        "blocks_by_registers": by_regs,
        "blocks_by_smem": by_smem,
        "blocks_by_hw": arch.max_blocks_per_sm,
        "blocks_per_sm": blocks,
        "limiter": ",".join(limiter),
        "occupancy": blocks * warps / (arch.max_threads_per_sm // 32),
        "smem_allocated_per_block": allocated,
    }


def rows(ccs, Ns, ds, Ms, threads: int) -> list[dict]:
    """One row per (cc, kernel, N, d, M): ptxas's figures, the launch's shared memory, occupancy and warnings."""
    from iosim.base.errors import InputError
    from iosim.memory_model import CapacityError

    out = []
    for cc in ccs:
        arch = ARCHS[cc]
        for c in compile_kernels(cc):
            for N in Ns:
                for d in ds:
                    for M in Ms:
                        row = {**asdict(c), "cc": f"{cc[0]}.{cc[1]}", "gpu": arch.gpu, "N": N, "d": d, "M": M}
                        row["threads"] = threads
                        warnings = []
                        try:
                            words, tiles = launch_words(c.kernel, N, d, M)
                        except (InputError, CapacityError) as e:
                            words, tiles = None, "-"
                            warnings.append(f"no tiling fits M: {e}")
                        row["tiles"] = tiles
                        row["dynamic_smem"] = None if words is None else words * WORD_BYTES
                        if words is None and not warnings:
                            warnings.append("not launched at this N, M")
                        row.update(occupancy(arch, c.registers, c.static_smem, row["dynamic_smem"] or 0, threads))
                        if c.spill_stores or c.spill_loads:
                            warnings.append(f"SPILLS {c.spill_stores}/{c.spill_loads} B")
                        elif c.stack:
                            warnings.append(f"local memory: {c.stack} B stack")
                        need = c.static_smem + (row["dynamic_smem"] or 0)
                        if need > arch.smem_optin_per_block:
                            warnings.append(f"OVER the {arch.smem_optin_per_block // KIB} KiB opt-in: cannot launch")
                        elif need > arch.smem_default_per_block:
                            warnings.append("opt-in above 48 KiB")
                        if row["blocks_per_sm"] == 0 and need <= arch.smem_optin_per_block:
                            warnings.append("cannot launch")
                        row["warnings"] = "; ".join(warnings)
                        out.append(row)
    return out


HEADERS = (
    ("cc", "cc"),
    ("kernel", "kernel"),
    ("M", "M"),
    ("tiles", "tiles"),
    ("threads", "thr"),
    ("registers", "regs"),
    ("spill", "spill st/ld B"),
    ("static_smem", "static smem B"),
    ("dynamic_smem", "dyn smem B"),
    ("by", "blocks/SM by thr,reg,smem,hw"),
    ("blocks_per_sm", "blocks/SM"),
    ("occupancy", "occupancy"),
    ("warnings", "warnings"),
)


def table(rs: list[dict], fmt: str = "simple") -> str:
    from tabulate import tabulate

    def cell(r, key):
        if key == "kernel":
            return r["kernel"].removesuffix("_kernel")
        if key == "spill":
            return f"{r['spill_stores']}/{r['spill_loads']}"
        if key == "by":
            return f"{r['blocks_by_threads']},{r['blocks_by_registers']},{r['blocks_by_smem']},{r['blocks_by_hw']}"
        if key == "occupancy":
            return f"{r['occupancy']:.0%}"
        if key == "dynamic_smem":
            return "-" if r[key] is None else str(r[key])
        return str(r[key])

    body = [[cell(r, k) for k, _ in HEADERS] for r in rs]
    return tabulate(body, headers=[h for _, h in HEADERS], tablefmt=fmt, disable_numparse=True)
