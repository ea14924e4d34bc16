"""Device presets: every parameter of every preset has a cited source in the devices table, the numbers parse, the
per-SM limits are the CUDA Programming Guide's, and a Device with an out-of-range field names that field."""

import csv
from dataclasses import fields

import pytest

from iosim.errors import InputError
from iosim.hierarchy.devices import SOURCES, Device, _table_path, device, presets

# The CUDA C++ Programming Guide's table "Technical Specifications per Compute Capability", written out here:
# (32-bit registers per SM, resident threads per SM, resident blocks per SM).
GUIDE = {"7.0": (65536, 2048, 32), "8.0": (65536, 2048, 32), "8.6": (65536, 1536, 16), "8.9": (65536, 1536, 24),
         "9.0": (65536, 2048, 32)}  # fmt: skip


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
