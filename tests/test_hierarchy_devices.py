"""Device presets: every parameter of every preset has a cited source in the devices table, the numbers parse, the
per-SM limits are the CUDA Programming Guide's, and a Device with an out-of-range field names that field."""

import csv
import json
import pathlib
import re
from dataclasses import fields

import pytest

from iosim.base.errors import InputError
from iosim.hierarchy.devices import SOURCES, Device, _table_path, device, presets

# The CUDA C++ Programming Guide's table "Technical Specifications per Compute Capability", written out here:
# (32-bit registers per SM, resident threads per SM, resident blocks per SM).
GUIDE = {"7.0": (65536, 2048, 32), "8.0": (65536, 2048, 32), "8.6": (65536, 1536, 16), "8.9": (65536, 1536, 24),
         "9.0": (65536, 2048, 32)}  # fmt: skip


ROOT = pathlib.Path(__file__).resolve().parents[1]


def rows():
    with open(_table_path(), newline="") as f:
        return [r for r in csv.DictReader(f) if r["sms"]]


def test_every_parameter_of_every_preset_has_a_source():
    params = [f.name for f in fields(Device) if f.name != "name"]
    assert sorted(params) == sorted(SOURCES)  # no Device parameter without a source column
    seen = set()
    for r in rows():
        seen.add(r["device"])
        for p in params:
            src = r[SOURCES[p]].strip()
            assert src, (r["device"], p)
            assert "http" in src or "iosim.gpu.resources.ARCHS" in src, (r["device"], p, src)
            for cited in re.findall(r"experiments/bench/gpu_\w+/[\w.-]+", src):  # a measurement it cites is stored
                assert (ROOT / cited).is_file(), (r["device"], p, cited)
    assert {"V100", "A100", "RTX 3090", "RTX 4090", "H100", "H200"} <= seen


def test_the_tables_numbers_parse():
    for r in rows():
        for p in SOURCES:
            if p == "compute_capability":
                major, minor = r[p].split(".")
                assert major.isdigit() and minor.isdigit()
                continue
            cell = r[p]
            if cell == "":  # only the per-SM limits may be left to ARCHS, and the source says so
                assert p in ("regs_per_sm", "max_threads_per_sm", "max_blocks_per_sm"), (r["device"], p)
                assert "ARCHS" in r["sm_limits_source"]
            else:
                assert cell.isdigit() and int(cell) > 0, (r["device"], p, cell)


def test_partitions_sectors_and_limits_as_the_sources_give_them():
    table = presets()
    for name, dev in table.items():
        assert dev.sector_bytes == 32 and dev.sectors_per_line == 4, name
        assert dev.l2_partitions == (2 if name in ("A100", "H100", "H200") else 1), name
        assert (dev.regs_per_sm, dev.max_threads_per_sm, dev.max_blocks_per_sm) == GUIDE[dev.compute_capability]
    assert device("h100").l2_partitions == 2 and device("H100").arch().reserved_smem_per_block == 1024
    assert device("V100").arch().reserved_smem_per_block == 0  # the 1 KB reservation begins at cc 8.0
    assert device("RTX 4090").arch().max_threads_per_sm == 1536


GOOD = dict(name="x", sms=4, smem_per_sm_bytes=65536, smem_per_block_bytes=49152, l2_bytes=1 << 20, l2_line_bytes=128)


def test_a_device_made_by_hand():
    dev = Device(**GOOD, l2_partitions=2, sector_bytes=32, compute_capability="9.0")
    assert dev.sectors_per_line == 4 and dev.arch().max_blocks_per_sm == 32


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (dict(sms=0), "sms"),
        (dict(smem_per_block_bytes=70000), "smem_per_block_bytes"),
        (dict(l2_line_bytes=96), "l2_line_bytes"),
        (dict(sector_bytes=24), "sector_bytes"),
        (dict(sector_bytes=256), "l2_line_bytes"),
        (dict(l2_bytes=1000), "l2_bytes"),
        (dict(l2_partitions=0), "l2_partitions"),
        (dict(l2_partitions=3), "l2_partitions"),
        (dict(regs_per_sm=0), "regs_per_sm"),
        (dict(max_threads_per_sm=100), "max_threads_per_sm"),
        (dict(max_blocks_per_sm=0), "max_blocks_per_sm"),
        (dict(compute_capability="nine"), "compute_capability"),
        (dict(sms=2.5), "sms"),
    ],
)
def test_out_of_range_fields_are_named(change, field):
    with pytest.raises(InputError) as e:
        Device(**{**GOOD, **change})
    assert e.value.parameter == f"Device.{field}"
    assert str(e.value).startswith(f"Device.{field} ")


# ------------------------------------------------------------------------------------------------ resident CTAs
def blocks_model(threads, registers, smem, max_threads, max_blocks, smem_per_sm, reserved=1024):
    """Blocks per SM written from the CUDA occupancy calculator's rules (cuda_occupancy.h): whole warps; registers
    allocated per warp in units of 256 over 4 sub-partitions; shared memory plus the 1 KiB reserve in units of 128."""
    warps = -(-threads // 32)
    limits = [max_threads // 32 // warps, max_blocks, smem_per_sm // (-(-(smem + reserved) // 128) * 128)]
    if registers is not None:
        per_warp = -(-registers * 32 // 256) * 256
        limits.append((65536 // 4 // per_warp) * 4 // warps)
    return min(limits)


@pytest.mark.parametrize("name", ["H100", "A100", "RTX 4090"])
def test_resident_ctas_equals_the_occupancy_rules(name):
    from iosim.hierarchy.resident import resident_ctas

    dev = presets()[name]
    for threads in (32, 96, 128, 256, 1024):
        for registers in (None, 32, 64, 128, 173, 255):
            for smem in (0, 4096, 48 * 1024, 65536, 100 * 1024):
                if smem > dev.smem_per_block_bytes:
                    continue
                want = blocks_model(threads, registers, smem, dev.max_threads_per_sm, dev.max_blocks_per_sm,
                                    dev.smem_per_sm_bytes)  # fmt: skip
                got, limiter = resident_ctas(dev, threads, registers, smem)
                assert got == want, (name, threads, registers, smem)
                assert limiter.endswith("(upper bound)") == (registers is None)


def test_fa2_kernels_from_their_traits():
    from iosim.hierarchy.resident import FA2_KERNELS

    # kSmemSize and kSmemSize1colblock written out from kernel_traits.h for these traits (2-byte elements):
    # forward <128,128,64,4>: Q 128x128 + K, V 2x64x128; backward <128,64,128,8>: Q, dO (3 tiles 64x128),
    # K, V (2x128x128), dS, P (2x64x128); split-KV <128,64,128,4>: Q 64x128 + K, V 2x128x128.
    want = {
        "flash_fwd_kernel": (128, 128, 64, 128, 2 * (128 * 128 + 2 * 64 * 128), 3),
        "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel": (128, 64, 128, 256, 2 * (3 * 64 * 128 + 2 * 128 * 128
                                                                                  + 2 * 64 * 128), 1),
        "flash_fwd_splitkv_kernel": (128, 64, 128, 128, 2 * (64 * 128 + 2 * 128 * 128), 2),
    }  # fmt: skip
    assert set(FA2_KERNELS) == set(want)
    for name, (hd, bm, bn, threads, smem, blocks) in want.items():
        k = FA2_KERNELS[name]
        assert (k.head_dim, k.block_m, k.block_n, k.threads, k.smem_bytes) == (hd, bm, bn, threads, smem)
        assert k.registers is None and "kernel_traits.h" in k.source and "launch_template.h" in k.source
        # 228 KiB per SM over (smem + 1 KiB): an upper bound until the registers are measured
        assert k.resident("H100") == (blocks, "shared; registers unknown (upper bound)")
        assert blocks == 233472 // (smem + 1024)


def test_traits_read_off_the_stored_kernel_names():
    import json
    import pathlib

    from iosim.hierarchy.resident import parse_kernel_name

    data = json.loads((pathlib.Path(__file__).parents[1] / "experiments/bench/gpu_h100/ncu-torch.json").read_text())
    seen = 0
    for r in data["launches"]:
        if "pytorch_flash::" not in r["kernel"]:
            continue
        k = parse_kernel_name(r["kernel"])
        lab = data["labels"][r["label"]]
        grid = [int(x) for x in r["grid"].strip("()").split(",")]
        assert int(r["block"].strip("()").split(",")[0]) == k.threads
        if k.kernel == "flash_fwd_kernel" or k.kernel == "flash_bwd_dot_do_o_kernel":
            assert grid[0] == lab["N"] // k.block_m  # one CTA per kBlockM rows of Q
        if k.kernel == "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel":
            assert grid[0] == lab["N"] // k.block_n  # one CTA per kBlockN rows of K
        seen += 1
    assert seen == 10  # 2 forwards, 2 backwards of 3 kernels, the split-KV decode and its combine
    fwd = parse_kernel_name(data["launches"][0]["kernel"])
    assert (fwd.head_dim, fwd.block_m, fwd.block_n, fwd.warps, fwd.elem_bytes) == (128, 128, 64, 4, 2)


@pytest.mark.parametrize(
    ("args", "parameter"),
    [((0, 64, 0), "threads"), ((2048, 64, 0), "threads"), ((128, 0, 0), "registers"), ((128, 256, 0), "registers"),
     ((128, 64, -1), "smem_bytes"), ((128, 64, 300 * 1024), "smem_bytes")],
)  # fmt: skip
def test_resident_ctas_bad_input(args, parameter):
    from iosim.hierarchy.resident import resident_ctas

    with pytest.raises(InputError) as e:
        resident_ctas("H100", *args)
    assert e.value.parameter == parameter


def test_kernel_name_without_traits_is_refused():
    from iosim.hierarchy.resident import parse_kernel_name

    for name in ("void at::elementwise_kernel<128, 4>", "flash_fwd_kernel<Foo<1>>"):
        with pytest.raises(InputError) as e:
            parse_kernel_name(name)
        assert e.value.parameter == "kernel name"


def test_the_docs_resident_table_is_the_commands_output(capsys):
    import pathlib

    from iosim.hierarchy import resident

    root = pathlib.Path(__file__).resolve().parents[1]
    assert resident.main(["--ncu", str(root / "experiments/bench/gpu_h100/ncu-torch.json")]) == 0
    out = capsys.readouterr().out
    doc = (root / "docs" / "hierarchy-hardware.md").read_text()
    start = (
        "<!-- resident-table: python -m iosim.hierarchy.resident --ncu experiments/bench/gpu_h100/ncu-torch.json -->\n"
    )
    assert doc.split(start)[1].split("\n<!-- resident-table end -->")[0].strip() == out.strip()
    assert resident.main(["--device", "Z80"]) == 2


def test_resident_ctas_equals_the_h100_driver_on_iosims_kernels():
    """occupancy.json: for each of iosim's kernels at each (d, M) the H100's driver gave its registers, static shared
    memory and cuOccupancyMaxActiveBlocksPerMultiprocessor at 128 threads; the H100 preset reproduces every one."""
    import json
    import pathlib

    from iosim.hierarchy.resident import resident_ctas

    path = pathlib.Path(__file__).parents[1] / "experiments/bench/gpu_h100/occupancy.json"
    rows = [r for r in json.loads(path.read_text())["rows"] if "driver blocks/SM" in r]
    assert len(rows) == 52
    for r in rows:
        smem = r["driver"]["SHARED_SIZE_BYTES"] + r["dynamic smem"]
        got, _ = resident_ctas("H100", 128, r["driver"]["NUM_REGS"], smem)
        assert got == r["driver blocks/SM"], (r["kernel"], r["d"], r["M"])


def test_the_h200_l2_is_what_its_driver_reported():
    """The H200 row's L2 is the driver's CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE stored by the lease of 2026-11-28 (60 MiB),
    not the H100 SXM5's 51,200 KB it was copied from; SMs and shared memory are the driver's too."""
    env = json.loads((ROOT / "experiments/bench/gpu_h200/env.json").read_text())
    h200 = device("H200")
    assert h200.l2_bytes == env["L2_CACHE_SIZE"] == 60 * 1024 * 1024
    assert h200.sms == env["MULTIPROCESSOR_COUNT"]
    assert h200.smem_per_sm_bytes == env["MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"]
    assert h200.smem_per_block_bytes == env["MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"]
    assert device("H100").l2_bytes == 50 * 1024 * 1024
