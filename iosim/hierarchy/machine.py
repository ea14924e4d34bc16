"""The machine a hierarchy launch runs on, as one object: :class:`Machine`, :func:`iosim.hierarchy.hierarchy`'s
``device``.

A machine is a device preset (a row of the devices table, :mod:`iosim.hierarchy.devices`, or none: an abstract
machine in words) and what the launch sets of it: the SMs, the L2's size and line, the resident blocks per SM (given,
or from the kernel's resources), the L2's partitions and their homes, and its sector fills. Every field is checked
where the machine is made (one line naming the field); the checks that need the launch (M against the shared memory,
the line against every array's element size, OPT against partitions and sectors) are made when it runs
(:func:`iosim.hierarchy.simulate.hierarchy`). A machine is frozen: ``dataclasses.replace(m, partitions=2)`` is
another. A device preset's name or a :class:`~iosim.hierarchy.devices.Device` given as ``device`` is ``Machine(that)``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from iosim.base.errors import InputError
from iosim.hierarchy.devices import Device
from iosim.hierarchy.devices import device as _device

MAX_P = 1 << 20
MAX_C = 1 << 40
MAX_L = 1 << 20
MAX_PARTITIONS = 64
MAX_HOME_LINES = 1 << 20
FAR_COPY = ("both", "near", "home", "shared")  # where a far-homed line read is kept (iosim.hierarchy.l2, far)
FLUSHES = (None, "per-kernel")  # the L2 kept across a problem's launches, or written back and emptied between them
MAX_BLOCKS_PER_SM = 32  # resident blocks per SM, cc 8.0 - 9.0 (iosim.hierarchy.devices)


def check_int(name: str, value, lo: int, hi: int) -> int:
    """``value`` as an int from lo to hi, else one line naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not lo <= value <= hi:
        raise InputError(name, f"must be an integer from {lo:,} to {hi:,}", value)
    return int(value)


@dataclass(frozen=True)
class Machine:
    """The machine: ``device`` (a preset's name such as ``"H100"``, a :class:`Device`, or None) and the launch's
    settings of it. None takes the preset's figure (P its SMs; C, L its L2 and line bytes over the bytes per word;
    the blocks per SM what fits its shared memory at M words a block, or ``kernel``'s occupancy), or without a
    preset the abstract machine's (P = 1, L = 1 word, one block per SM; C has no default there: 0 is no L2).

    * ``P`` SMs, ``C`` L2 words, ``L`` words per line (a power of two), ``blocks_per_sm`` resident blocks per SM;
    * ``partitions``: the L2 in that many partitions (default 1, the single shared L2; ``"device"``: the preset's
      ``l2_partitions``), a line's home partition by ``home_lines`` (its index in its array copy // home_lines);
    * ``far_copy``: where a line an SM reads from the far partition is kept, one of FAR_COPY: ``"both"`` (the
      default: the near partition's copy and the home's), ``"near"`` (only the reader's partition) or ``"home"``
      (only the home: every far access crosses) or ``"shared"`` (only the reader's partition, and a miss is served
      by any partition that holds the line before DRAM); NVIDIA does not publish it (:mod:`iosim.hierarchy.l2`);
    * ``sector_bytes``: None (whole-line fills), ``"device"`` (the preset's) or a number of bytes;
    * ``kernel`` (with a preset): the kernel whose threads, registers and shared memory give the blocks per SM
      (:func:`iosim.hierarchy.resident.kernel_of`);
    * ``flush``: None (the default: the L2 keeps its contents across a problem's launches and writes its dirty lines
      back at the end) or ``"per-kernel"`` (as Nsight Compute's ``--cache-control all`` does before every kernel it
      profiles: after each launch but the last every dirty line is written back, counted apart from the launches'
      DRAM writes, and the L2 emptied, so each launch starts from a clean L2)."""

    device: str | Device | None = None
    P: int | None = None
    C: int | None = None
    L: int | None = None
    blocks_per_sm: int | None = None
    partitions: int | str | None = None
    home_lines: int = 1
    sector_bytes: int | str | None = None
    kernel: object = None
    far_copy: str = "both"
    flush: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.device, str):
            object.__setattr__(self, "device", _device(self.device))  # the preset, or one line naming them
        elif self.device is not None and not isinstance(self.device, Device):
            raise InputError("device", "must be a device preset's name, an iosim.hierarchy.Device or None",
                             type(self.device).__name__)  # fmt: skip
        for name, value, lo, hi in (("P (SMs)", self.P, 1, MAX_P), ("C (L2 words)", self.C, 0, MAX_C),
                                    ("L (line words)", self.L, 1, MAX_L),
                                    ("blocks_per_sm", self.blocks_per_sm, 1, MAX_BLOCKS_PER_SM)):  # fmt: skip
            if value is not None:
                check_int(name, value, lo, hi)
        if self.L is not None and self.L & (self.L - 1):
            raise InputError("L (line words)", "must be a power of two", self.L)
        check_int("home_lines", self.home_lines, 1, MAX_HOME_LINES)
        if self.far_copy not in FAR_COPY:
            raise InputError("far_copy", f"must be one of {', '.join(FAR_COPY)}", self.far_copy)
        if self.flush not in FLUSHES:
            raise InputError("flush", "must be None (the L2 kept across launches) or 'per-kernel'", self.flush)
        for name, value, what in (("l2_partitions", self.partitions, "a number"),
                                  ("sector_bytes", self.sector_bytes, "a number of bytes")):  # fmt: skip
            if value == "device" and self.device is None:
                raise InputError(name, f"'device' needs a device preset (or give {what})", value)
        if self.partitions not in (None, "device"):
            check_int("l2_partitions", self.partitions, 1, MAX_PARTITIONS)
        if self.sector_bytes not in (None, "device"):
            check_int("sector_bytes", self.sector_bytes, 1, 1 << 20)
        if self.kernel is not None:
            from iosim.hierarchy import resident

            if self.device is None:
                raise InputError("kernel", "needs a device preset (its per-SM limits decide the resident blocks)")
            resident.kernel_of(self.kernel)  # a kernel it cannot read: one line naming kernel

    @property
    def name(self) -> str | None:
        """The preset's name (None for the abstract machine)."""
        return None if self.device is None else self.device.name


def machine_of(device) -> Machine:
    """``hierarchy``'s ``device``: a :class:`Machine` as it is; a preset's name or a Device as ``Machine(device)``;
    None as the abstract machine, whose C must then be given."""
    if isinstance(device, Machine):
        return device
    if device is None or isinstance(device, (str, Device)):
        return Machine(device)
    raise InputError("device", "must be an iosim.hierarchy.Machine, a device preset's name or a Device",
                     type(device).__name__)  # fmt: skip
