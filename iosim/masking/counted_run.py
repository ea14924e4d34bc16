"""What every counted sparse run (:mod:`iosim.masking.block_sparse`, :mod:`iosim.masking.topk_sparse`) says of
itself: whether the simulated counts equal the closed form, and the words per array."""

from __future__ import annotations


class CountedRun:
    """A mixin for a result dataclass with ``stats`` (the simulated :class:`iosim.memory_model.core.Stats`) and
    ``predicted`` (the closed form: ``per_array`` and ``peak``)."""

    @property
    def exact(self) -> bool:
        """The simulated counts equal the closed form per array (reads and writes) and in peak."""
        return self.stats.per_array == self.predicted.per_array and self.stats.peak == self.predicted.peak

    @property
    def words(self) -> dict[str, int]:
        """Words each array moved, reads plus writes."""
        return {k: v.reads + v.writes for k, v in self.stats.per_array.items()}
