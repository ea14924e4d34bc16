"""Property tests (hypothesis): peak <= M, counts == io_model, and I/O non-increasing in M where theory says so."""

from hypothesis import given, settings
from hypothesis import strategies as st

import iosim
from iosim.runner import registry

sizes = st.tuples(st.integers(1, 300), st.integers(1, 70), st.integers(0, 30000), st.booleans())


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["standard", "flash1", "flash2"]), size=sizes)
def test_peak_within_M_and_counts_exact(name, size):
    N, d, extra, causal = size
    M = registry.get(name).min_M(N, d) + extra
    r = iosim.run(name, N=N, d=d, M=M, causal=causal, count_only=True)
    assert r.stats.peak <= M
    assert r.main.exact


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["standard", "flash1", "flash2"]), size=sizes, more=st.integers(1, 20000))
def test_io_non_increasing_in_M(name, size, more):
    """Non-causal: larger fast memory never costs more words (larger blocks, fewer passes)."""
    N, d, extra, _ = size
    M = registry.get(name).min_M(N, d) + extra
    small = iosim.run(name, N=N, d=d, M=M, count_only=True)
    large = iosim.run(name, N=N, d=d, M=M + more, count_only=True)
    assert large.stats.total <= small.stats.total
