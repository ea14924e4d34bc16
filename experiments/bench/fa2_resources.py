"""FlashAttention-2's registers and shared memory, read from the very binary PyTorch's SDPA ran on the leases (no GPU).

The registers per thread of a compiled kernel are a property of its cubin, not of the run: ``cuobjdump
--dump-resource-usage`` prints, per kernel function and per ELF (one ELF per compute capability), ``REG`` (registers
per thread), ``STACK`` (bytes of stack frame per thread, local memory), ``SHARED`` (static shared memory) and more.
PyTorch's Linux wheel ``torch-2.11.0`` (``torch/version.py``: ``2.11.0+cu130``, the version every lease recorded in
``gpu_*/env.json``) holds FlashAttention-2's kernels (namespace ``pytorch_flash``) in ``torch/lib/libtorch_cuda.so``.

This script:

1. runs cuobjdump on that library for ``sm_90`` (the H100's and H200's compute capability 9.0) and ``sm_80``, keeps
   the functions of the ELFs whose arch is exactly that (``-arch sm_90`` also lists ``sm_90a`` ELFs; none holds a
   FlashAttention-2 kernel) and demangles them with ``c++filt``, written as Nsight Compute writes a name (template
   ``bool`` arguments as 0/1, no space between closing ``>``);
2. matches each FlashAttention-2 kernel name stored in ``gpu_h100/ncu-torch.json`` (first 200 characters,
   ``ncu_raw.NAME_CHARS``) against them, exactly: a stored name equals a demangled one or is its first 200
   characters. Where the stored prefix leaves several template instantiations, the full names that the H200 lease
   stored byte for byte (``gpu_h200/raw/ncu-torch.csv``, same wheel version, same launches) pick the one that ran;
   a stored name that matches no kernel of the binary is an error (exit 2): the binary would not be the one the
   lease ran;
3. computes for each kernel the resident blocks (CTAs) per SM on the H100 and H200 presets with iosim's own
   occupancy formula (``iosim.gpu.resources.occupancy``, cuda_occupancy.h) from the binary's registers and static
   shared memory, the dynamic shared memory FlashAttention-2's launch template asks and its threads (kNWarps * 32),
   both read off the kernel's traits (``iosim.hierarchy.resident.parse_kernel_name``, sources cited there).

``SHARED`` of an sm_90 ELF includes the 1 KiB per block the system reserves (``.nv.reservedSmem``, see
``iosim.gpu.resources``): the kernel's own static shared memory is that minus 1,024 bytes, which the same kernel's
sm_80 ELF (no reserved part) reports as such; the script checks the two agree. The occupancy formula adds the
reserved 1 KiB itself.

Run (the wheel only for its name, checksum and ``torch/version.py``; libtorch_cuda.so extracted from it)::

    python experiments/bench/fa2_resources.py --lib /tmp/x/torch/lib/libtorch_cuda.so \\
        --cuobjdump /tmp/x/nvidia/cu13/bin/cuobjdump --wheel /tmp/torch-2.11.0-cp311-...whl \\
        --out experiments/bench/gpu_h100/fa2-resources.json
    python experiments/bench/fa2_resources.py --table      # the docs' table, from the stored JSON (no wheel)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import re
import subprocess
import sys
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from ncu_raw import NAME_CHARS  # noqa: E402
from ncu_raw import parse as parse_ncu_csv  # noqa: E402

NCU = HERE / "gpu_h100" / "ncu-torch.json"
FULL_NAMES = HERE / "gpu_h200" / "raw" / "ncu-torch.csv"
STORED = HERE / "gpu_h100" / "fa2-resources.json"
DOC = ROOT / "docs" / "gpu-resources.md"
BLOCK = ("<!-- fa2-resources -->", "<!-- /fa2-resources -->")
NAMESPACE = "pytorch_flash::"
DEVICES = ("H100", "H200")
RESERVED_SM90 = 1024  # bytes per block in every sm_90 ELF's SHARED (iosim.gpu.resources: .nv.reservedSmem)


class MismatchError(Exception):
    """The binary's kernels are not the ones the lease ran (or the input is not what the script reads)."""


# ------------------------------------------------------------------------------------------------ reading the binary
def parse_resource_usage(text: str, arch: str) -> list[dict]:
    """Functions of ``cuobjdump --dump-resource-usage`` output that sit in an ELF of exactly ``arch``:
    [{"mangled", "arch", "REG", "STACK", "SHARED", "LOCAL"}] in the order printed (a kernel in several ELFs appears
    once per ELF)."""
    out, cur, fn = [], None, None
    for line in text.splitlines():
        m = re.match(r"\s*arch = (\S+)\s*$", line)
        if m:
            cur, fn = m.group(1), None
            continue
        m = re.match(r"\s*Function (\S+):\s*$", line)
        if m:
            fn = m.group(1)
            continue
        if fn and "REG:" in line:
            vals = dict(re.findall(r"(\w+):(\d+)", line))
            if cur == arch:
                row = {k: int(vals[k]) for k in ("REG", "STACK", "SHARED", "LOCAL")}
                out.append({"mangled": fn, "arch": cur, **row})
            fn = None
    return out


def nsight_style(demangled: str) -> str:
    """A c++filt name written as Nsight Compute writes it: template bools as 0/1, ``>>`` without a space."""
    s = re.sub(r"\btrue\b", "1", demangled)
    s = re.sub(r"\bfalse\b", "0", s)
    while "> >" in s:
        s = s.replace("> >", ">>")
    return s


def demangle(names: list[str], cxxfilt: str = "c++filt") -> list[str]:
    """c++filt of each name, in order."""
    p = subprocess.run([cxxfilt], input="\n".join(names) + "\n", capture_output=True, text=True, check=True)
    out = p.stdout.splitlines()
    if len(out) != len(names):
        raise MismatchError(f"c++filt returned {len(out)} lines for {len(names)} names")
    return out


def binary_kernels(lib: str, cuobjdump: str, arch: str, cxxfilt: str = "c++filt") -> list[dict]:
    """FlashAttention-2's functions in ``lib``'s ``arch`` ELFs, each with its Nsight-style name."""
    p = subprocess.run([cuobjdump, "--dump-resource-usage", "-arch", arch, lib], capture_output=True, text=True)
    if p.returncode != 0:
        raise MismatchError(f"cuobjdump failed on {lib} ({p.returncode}): {p.stderr.strip()[:200]}")
    rows = [r for r in parse_resource_usage(p.stdout, arch) if "pytorch_flash" in r["mangled"]]
    for r, name in zip(rows, demangle([r["mangled"] for r in rows], cxxfilt), strict=True):
        r["name"] = nsight_style(name)
    return rows


# ------------------------------------------------------------------------------------------- the launches to match
def stored_launches(ncu: dict) -> list[dict]:
    """FlashAttention-2's kernels in an ncu JSON of a lease (``gpu_*/ncu-torch.json``), one entry per distinct name:
    {"ncu_name", "labels", "grid", "block"}."""
    by_name: dict[str, dict] = {}
    for r in ncu["launches"]:
        if NAMESPACE not in r["kernel"]:
            continue
        e = by_name.setdefault(r["kernel"], {"ncu_name": r["kernel"], "labels": [], "grid": r["grid"],
                                             "block": r["block"]})  # fmt: skip
        if r["label"] not in e["labels"]:
            e["labels"].append(r["label"])
    return list(by_name.values())


def full_names(csv_text: str) -> set[str]:
    """Every FlashAttention-2 kernel name, in full, of a lease's raw ncu CSV."""
    return {r["name"] for r in parse_ncu_csv(csv_text) if NAMESPACE in r["name"]}


def names_match(stored: str, name: str) -> bool:
    """A stored name is the kernel's name, or its first NAME_CHARS characters when the kernel's is longer."""
    return stored == name or (len(stored) == NAME_CHARS and name.startswith(stored))


def match(stored: str, kernels: list[dict], full: set[str]) -> tuple[dict, list[dict]]:
    """(the kernel that ran, every candidate) for one stored name. Candidates: the binary's kernels whose name
    matches; several: the one whose name the full-name set holds. Identical names in several ELFs must agree."""
    cands = [k for k in kernels if names_match(stored, k["name"])]
    if not cands:
        raise MismatchError(f"no kernel of the binary is named {stored[:120]}...: not the binary the lease ran")
    names = sorted({k["name"] for k in cands})
    ran = names if len(names) == 1 else [n for n in names if n in full]
    if len(ran) != 1:
        raise MismatchError(f"{len(names)} kernels match {stored[:100]}... and the full names pick {len(ran)}")
    same = [k for k in cands if k["name"] == ran[0]]
    if any((k["REG"], k["STACK"], k["SHARED"]) != (same[0]["REG"], same[0]["STACK"], same[0]["SHARED"]) for k in same):
        raise MismatchError(f"{ran[0][:100]}... has different resources in different ELFs")
    return same[0], cands


# ------------------------------------------------------------------------------------- resources and occupancy
def device_limits(name: str) -> dict:
    """The per-SM limits iosim's occupancy formula uses for a device preset (iosim.hierarchy.devices, devices.csv)."""
    from iosim.hierarchy.devices import device

    arch = device(name).arch()
    keys = ("regs_per_sm", "regs_per_block", "max_regs_per_thread", "reg_unit", "sub_partitions",
            "max_threads_per_sm", "max_blocks_per_sm", "smem_per_sm", "smem_optin_per_block",
            "reserved_smem_per_block", "smem_unit")  # fmt: skip
    return {k: getattr(arch, k) for k in keys}


def resident(name: str, registers: int, static_smem: int, dynamic_smem: int, threads: int) -> dict:
    """Blocks per SM on a device preset by iosim.gpu.resources.occupancy (cuda_occupancy.h), and the most registers
    per thread that would let one more block be resident (None where registers do not bind)."""
    from iosim.gpu.resources import occupancy
    from iosim.hierarchy.devices import device

    arch = device(name).arch()
    occ = occupancy(arch, registers, static_smem, dynamic_smem, threads)
    more = [r for r in range(1, arch.max_regs_per_thread + 1)
            if occupancy(arch, r, static_smem, dynamic_smem, threads)["blocks_per_sm"]
            > occ["blocks_per_sm"]]  # fmt: skip
    keys = ("blocks_per_sm", "limiter", "blocks_by_threads", "blocks_by_registers", "blocks_by_smem", "blocks_by_hw")
    return {**{k: occ[k] for k in keys}, "max_registers_for_one_more_block": max(more) if more else None}


def block_threads(block: str) -> int:
    """Threads of an ncu block size ``(x, y, z)``."""
    x, y, z = (int(v) for v in str(block).strip("()").split(","))
    return x * y * z


def kernel_entry(launch: dict, ran: dict, cands: list[dict], sm80: dict | None, labels: list[dict]) -> dict:
    """One kernel's record: the names, the binary's figures, the launch template's, blocks per SM per device."""
    from iosim.hierarchy.resident import parse_kernel_name

    k = parse_kernel_name(launch["ncu_name"])
    static = ran["SHARED"] - RESERVED_SM90
    if sm80 is not None and sm80["SHARED"] != static:
        raise MismatchError(f"{ran['name'][:80]}...: sm_90 SHARED - 1 KiB = {static}, sm_80 SHARED = {sm80['SHARED']}")
    if block_threads(launch["block"]) != k.threads:
        raise MismatchError(f"{ran['name'][:80]}...: ncu block {launch['block']} is not kNWarps * 32 = {k.threads}")
    return {
        "ncu_name": launch["ncu_name"],
        "name": ran["name"],
        "mangled": ran["mangled"],
        "launches": [dict(labels[i], label=i) for i in launch["labels"]],
        "grid": launch["grid"],
        "block": launch["block"],
        "candidates": [
            dict(name=n, registers=r, stack_bytes=st)
            for n, r, st in sorted({(c["name"], c["REG"], c["STACK"]) for c in cands})
        ],  # fmt: skip
        "registers": ran["REG"],
        "stack_bytes": ran["STACK"],
        "local_bytes": ran["LOCAL"],
        "shared_sm90": ran["SHARED"],
        "shared_sm80": None if sm80 is None else sm80["SHARED"],
        "registers_sm80": None if sm80 is None else sm80["REG"],
        "static_smem": static,
        "dynamic_smem": k.smem_bytes,
        "dynamic_smem_source": k.source,
        "traits": k.traits,
        "warps": k.warps,
        "threads": k.threads,
        "resident": {d: resident(d, ran["REG"], static, k.smem_bytes, k.threads) for d in DEVICES},
    }


def count_local_access(sass: str) -> dict:
    """Local-memory instructions in one function's SASS: STL (stores) and LDL (loads), what a stack frame is
    written and read with (register spills, or arrays the compiler keeps in local memory)."""
    return {"STL": len(re.findall(r"\bSTL(?:\.\w+)*\b", sass)), "LDL": len(re.findall(r"\bLDL(?:\.\w+)*\b", sass))}


def local_access(lib: str, cuobjdump: str, nvdisasm: str, mangled: list[str]) -> dict[str, dict]:
    """{mangled name: its STL and LDL count} from the SASS of the sm_90 ELF that holds it (extracted to a temporary
    folder; cuobjdump disassembles with nvdisasm, pip's nvidia-cuda-nvdisasm)."""
    import os
    import tempfile

    env = dict(os.environ, PATH=str(pathlib.Path(nvdisasm).resolve().parent) + os.pathsep + os.environ["PATH"])
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([cuobjdump, "-arch", "sm_90", "-xelf", "all", str(pathlib.Path(lib).resolve())], cwd=tmp,
                       capture_output=True, check=True)  # fmt: skip
        cubins = [(f, f.read_bytes()) for f in sorted(pathlib.Path(tmp).glob("*.sm_90.cubin"))]
        for m in mangled:
            f = next(f for f, data in cubins if m.encode() + b"\0" in data)
            p = subprocess.run([cuobjdump, "-sass", "-fun", m, str(f)], capture_output=True, text=True, env=env)
            if p.returncode != 0 or "Function :" not in p.stdout:
                raise MismatchError(f"no SASS for {m[:80]}...: {p.stderr.strip()[:200]}")
            out[m] = {"elf": f.name, **count_local_access(p.stdout)}
    return out


# -------------------------------------------------------------------------------------------------- provenance
def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def wheel_info(path: str) -> dict:
    """The wheel's file name, sha256 and torch/version.py's version, git_version and cuda."""
    with zipfile.ZipFile(path) as z:
        text = z.read("torch/version.py").decode()
    fields = dict(re.findall(r"^(__version__|git_version|cuda)\s*(?::[^=]*)?=\s*'([^']*)'", text, re.M))
    return {"name": pathlib.Path(path).name, "sha256": sha256(path), "torch_version": fields.get("__version__"),
            "git_version": fields.get("git_version"), "cuda": fields.get("cuda")}  # fmt: skip


def ptx_files(lib: str, cuobjdump: str) -> int:
    """How many PTX files the library's fatbins hold (``cuobjdump --list-ptx``): with none, the driver cannot
    compile a kernel itself and loads the ELF's SASS as built, with the ELF's register count."""
    p = subprocess.run([cuobjdump, "--list-ptx", lib], capture_output=True, text=True)
    return sum(line.startswith("PTX file") for line in (p.stdout + p.stderr).splitlines())


def tool_version(cmd: list[str], pattern: str) -> str:
    """The first line of a tool's --version output that contains ``pattern``."""
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    return next((line.strip() for line in out.splitlines() if pattern in line), out.strip()[:200])


# ---------------------------------------------------------------------------------------------------- the record
def collect(
    lib: str, cuobjdump: str, wheel: str | None, cxxfilt: str, command: str, nvdisasm: str | None = None
) -> dict:
    """The whole record (the JSON this script stores); with ``nvdisasm``, each kernel's local-memory instructions."""
    ncu = json.loads(NCU.read_text())
    full = full_names(FULL_NAMES.read_text())
    sm90 = binary_kernels(lib, cuobjdump, "sm_90", cxxfilt)
    sm80 = {k["name"]: k for k in binary_kernels(lib, cuobjdump, "sm_80", cxxfilt)}
    kernels = []
    for launch in stored_launches(ncu):
        ran, cands = match(launch["ncu_name"], sm90, full)
        kernels.append(kernel_entry(launch, ran, cands, sm80.get(ran["name"]), ncu["labels"]))
    if nvdisasm:
        sass = local_access(lib, cuobjdump, nvdisasm, [k["mangled"] for k in kernels])
        for k in kernels:
            k["local_memory_instructions"] = sass[k["mangled"]]
    return {
        "what": "FlashAttention-2's registers and shared memory read from PyTorch's binary (cuobjdump), matched to "
        "the kernels Nsight Compute recorded on the H100 lease; blocks per SM by iosim.gpu.resources.occupancy",
        "command": command,
        "wheel": wheel_info(wheel) if wheel else None,
        "library": {
            "path_in_wheel": "torch/lib/libtorch_cuda.so",
            "bytes": pathlib.Path(lib).stat().st_size,
            "sha256": sha256(lib),
        },  # fmt: skip
        "cuobjdump": tool_version([cuobjdump, "--version"], "release"),
        "c++filt": tool_version([cxxfilt, "--version"], "filt"),
        "nvdisasm": tool_version([nvdisasm, "--version"], "release") if nvdisasm else None,
        "arch": "sm_90 (ELF arch exactly sm_90; sm_80 read for the static shared memory's check)",
        "ncu": str(NCU.relative_to(ROOT)),
        "full_names": str(FULL_NAMES.relative_to(ROOT)),
        "name_chars": NAME_CHARS,
        "sm90_pytorch_flash_functions": len(sm90),
        "ptx_files": ptx_files(lib, cuobjdump),
        "devices": {d: device_limits(d) for d in DEVICES},
        "kernels": kernels,
    }


# ------------------------------------------------------------------------------------------------------ the table
def launch_text(launches: list[dict]) -> str:
    """The launches a kernel ran in, as the lease labelled them ("forward", "backward causal", ...)."""
    out = []
    for lab in launches:
        what = lab["what"].replace("sdpa flash ", "").replace(" fp16", "").replace("sdpa ", "")
        out.append(what + (" causal" if lab.get("causal") else ""))
    return ", ".join(out)


def table(stored: dict) -> str:
    """The docs' table from a stored record: one row per kernel the lease ran."""
    head = ("| kernel | launches | registers | stack B | STL / LDL | static smem B | dynamic smem B | threads "
            "| CTAs/SM H100 (limiter) | CTAs/SM H200 | one more CTA at registers <= |")  # fmt: skip
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for k in stored["kernels"]:
        fn = re.search(r"pytorch_flash::(\w+)<", k["name"]).group(1)
        traits = k["traits"].split("<", 1)[1].split(", cutlass")[0]
        lm = k.get("local_memory_instructions")
        local = f"{lm['STL']} / {lm['LDL']}" if lm else "-"
        h100, h200 = k["resident"]["H100"], k["resident"]["H200"]
        more = h100["max_registers_for_one_more_block"]
        lines.append(
            f"| {fn} <{traits}> | {launch_text(k['launches'])} "
            f"| {k['registers']} | {k['stack_bytes']} | {local} | {k['static_smem']:,} | {k['dynamic_smem']:,} "
            f"| {k['threads']} "
            f"| {h100['blocks_per_sm']} ({h100['limiter']}) | {h200['blocks_per_sm']} "
            f"| {'-' if more is None else more} |"
        )
    return "\n".join(lines)


def write_block(text: str, path: pathlib.Path = DOC, block: tuple[str, str] = BLOCK) -> None:
    """Put ``text`` between the block's two markers in ``path``."""
    doc = path.read_text()
    i, j = doc.index(block[0]) + len(block[0]), doc.index(block[1])
    path.write_text(doc[:i] + "\n" + text + "\n" + doc[j:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", help="path to torch/lib/libtorch_cuda.so (extracted from the wheel)")
    ap.add_argument("--cuobjdump", help="path to cuobjdump (pip: nvidia-cuda-cuobjdump)")
    ap.add_argument("--wheel", help="the torch wheel the library came from (its name, sha256, torch/version.py)")
    ap.add_argument("--cxxfilt", default="c++filt", help="the demangler (default c++filt, binutils)")
    ap.add_argument("--nvdisasm", help="optional: nvdisasm, to count each kernel's local-memory instructions")
    ap.add_argument("--out", help="write the record here (JSON) instead of printing it")
    ap.add_argument("--table", action="store_true", help="print the docs' table from the stored record (no binary)")
    ap.add_argument("--write", action="store_true", help="--table: also write it into docs/gpu-resources.md")
    args = ap.parse_args(argv)
    try:
        if args.table:
            text = table(json.loads(STORED.read_text()))
            print(text)
            if args.write:
                write_block(text)
            return 0
        if not args.lib or not args.cuobjdump:
            raise MismatchError("--lib and --cuobjdump are both needed (or --table)")
        argv_text = " ".join(sys.argv[1:] if argv is None else argv)
        rec = collect(args.lib, args.cuobjdump, args.wheel, args.cxxfilt,
                      f"python experiments/bench/fa2_resources.py {argv_text}", args.nvdisasm)  # fmt: skip
    except (MismatchError, OSError, subprocess.CalledProcessError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(rec, indent=1) + "\n"
    if args.out:
        pathlib.Path(args.out).write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
