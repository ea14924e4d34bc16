"""iosim.check on PyTorch's scaled_dot_product_attention (CPU), forward and backward through autograd, in every dtype
torch offers: the README's recipe. Skipped where torch is not installed (CI does not install it)."""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import iosim  # noqa: E402


def sdpa(Q, K, V, *, causal, scale):
    """torch SDPA with FlashAttention's bottom-right causal alignment (is_causal is top-left when N_q != N_k)."""
    mask = None
    if causal:
        N_q, N_k = Q.shape[-2], K.shape[-2]
        mask = torch.ones(N_q, N_k, dtype=torch.bool, device=Q.device).tril(N_k - N_q)
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, scale=scale, enable_gqa=True)


def sdpa_backward(Q, K, V, O, dO, L, *, causal, scale):
    q, k, v = (x.detach().requires_grad_() for x in (Q, K, V))
    sdpa(q, k, v, causal=causal, scale=scale).backward(dO)
    return q.grad, k.grad, v.grad


sdpa.backward = sdpa_backward


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_torch_sdpa_passes_the_quick_grid(dtype):
    report = iosim.check(sdpa, quick=True, dtype=dtype, inputs="torch")
    assert report.passed, report.table(failures_only=True)
    assert any(r.N == 1 for r in report.rows) and any(r.distribution == "masked-rows" for r in report.rows)


def test_torch_sdpa_grouped_query_heads_and_bnhd_layout():
    def bnhd(Q, K, V, *, causal, scale):
        return sdpa(*(x.transpose(1, 2) for x in (Q, K, V)), causal=causal, scale=scale).transpose(1, 2)

    report = iosim.check(bnhd, quick=True, heads=4, heads_kv=2, layout="BNHD", inputs="torch", backward=False)
    assert report.passed, report.table(failures_only=True)


def test_torch_is_causal_is_top_left():
    def is_causal(Q, K, V, *, causal, scale):
        return F.scaled_dot_product_attention(Q, K, V, is_causal=causal, scale=scale)

    assert iosim.check(is_causal, quick=True, inputs="torch", causal_align="top-left", backward=False).passed
    wrong = iosim.check(is_causal, quick=True, inputs="torch", backward=False)
    assert wrong.failures and all(r.N != r.N_k and r.causal for r in wrong.failures)


def test_broken_torch_kernel_fails():
    def no_scale(Q, K, V, *, causal, scale):
        return sdpa(Q, K, V, causal=causal, scale=1.0)

    report = iosim.check(no_scale, quick=True, inputs="torch", dtype="float16", backward=False)
    assert not report.passed


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_torch_sdpa_passes_the_default_grid(dtype):
    """Every default shape and distribution, forward and backward (float64 about a minute: extended golden)."""
    report = iosim.check(sdpa, dtype=dtype, inputs="torch")
    assert report.passed, report.table(failures_only=True)
