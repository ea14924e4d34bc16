"""The block-sparse kernels' schedule (iosim.masking.block_sparse): simulated counts equal the closed form per array
and in
peak on ragged problems, for mask_mods (per (b, h) too), torch BlockMasks, their index tensors and iosim masks;
block classes equal torch's create_block_mask; hand counts; the dense kernel; bad input in one line."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from iosim import Problem
from iosim.base.errors import InputError
from iosim.masking import mask_mod as mm
from iosim.masking import masks
from iosim.masking.block_sparse import Buffer, block_sparse, blocks_of

torch = pytest.importorskip("torch")
from torch.nn.attention.flex_attention import create_block_mask  # noqa: E402

BUFFERS = [Buffer("doc", "q+kv", "mask", "int32"), Buffer("bias", "bhqkv", "score", "bf16"),
           Buffer("pos", "kv", "score", "fp16"), Buffer("qpos", "q", "mask"), Buffer("shared", "qkv", "score"),
           Buffer("slope", "h", "score")]  # fmt: skip


def doc_of(N):  # noqa: N803
    return np.arange(N) * 3 // N + (np.arange(N) > N // 2)


def _fns(N):  # noqa: N803
    doc = doc_of(N)

    def document(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    def window(b, h, q, kv):  # NumPy and torch alike
        return (q - kv < 23) & (kv - q < 23)

    def per_head(b, h, q, kv):  # a different window per (b, h)
        return (q - kv >= 0) & (q - kv < 9 + 20 * h + 7 * b)

    return document, window, per_head


PROBLEMS = [dict(B=1, H_q=1, N_q=100, N_k=100, d_qk=8, d_v=8), dict(B=2, H_q=4, H_kv=2, N_q=77, N_k=77, d_qk=6, d_v=5),
            dict(B=1, H_q=2, H_kv=1, N_q=30, N_k=91, d_qk=4, d_v=3)]  # fmt: skip


@pytest.mark.parametrize("kw, block, dense, indices", [
    (kw, block, dense, "once") for kw, block, dense in itertools.product(PROBLEMS, [(16, 16), (32, 16), (7, 20)],
                                                                         [False, True])
] + [(kw, block, dense, "template") for kw, block, dense in [(kw, (16, 16), False) for kw in PROBLEMS] + [
    (PROBLEMS[1], (32, 16), False), (PROBLEMS[2], (7, 20), True), (PROBLEMS[2], (64, 128), False)]])  # fmt: skip
def test_counts_equal_closed_form(kw, block, dense, indices):
    p = Problem(**kw)
    document, window, per_head = _fns(p.N_k)
    for mask, mB, mH in ((document, None, None), (window, None, None), (per_head, p.B, p.H_q), ("causal", None, None),
                         ("window:9", None, None), ("random-blocks:0.4:8x8:3", None, None)):  # fmt: skip
        r = block_sparse(p, mask, block=block, buffers=BUFFERS, dense=dense, mask_B=mB, mask_H=mH, indices=indices)
        assert r.exact, (mask, r.stats.per_array, r.predicted.per_array)
        assert not r.stats.overflowed and r.stats.peak == r.predicted.M
        words = r.words
        assert words["Q"] == p.B * p.H_q * p.N_q * p.d_qk and words["O"] == p.B * p.H_q * p.N_q * p.d_v
        assert ("kv_indices" in words or words.get("kv_num_blocks", 0) > 0) != dense


def test_classes_equal_torch_create_block_mask():
    """A mask_mod classified here equals torch's create_block_mask on the CPU (ragged last blocks partial)."""
    for N, BQ, BKV in ((300, 64, 64), (333, 128, 64), (200, 32, 128)):
        document, window, per_head = _fns(N)
        doc = torch.from_numpy(doc_of(N))

        def tdoc(b, h, q, kv, doc=doc):
            return (doc[q] == doc[kv]) & (q >= kv)

        for fn, tfn in ((document, tdoc), (window, window)):
            bm = create_block_mask(tfn, None, None, N, N, device="cpu", BLOCK_SIZE=(BQ, BKV))
            theirs = mm.block_index(bm).classes(-(-N // BKV))
            ours = blocks_of(Problem(N=N, d=4), fn, (BQ, BKV)).classes(-(-N // BKV))
            assert (theirs == ours).all(), (N, BQ, BKV, fn.__name__)
            # the BlockMask itself and its mask_mod counted alike
            r1 = block_sparse(Problem(N=N, d=4), bm, buffers=BUFFERS)
            r2 = block_sparse(Problem(N=N, d=4), fn, block=(BQ, BKV), buffers=BUFFERS)
            assert r1.exact and r1.stats.per_array == r2.stats.per_array


def test_template_reads_buffers_at_a_ragged_blocks_padded_positions():
    """N = 40, blocks of 32, causal: row block 1 (8 rows) sees column blocks 0 (8 x 32) and 1 (8 x 8), both partial
    (a ragged block is never full), row block 0 the diagonal block. The
    template reads captured buffers at all 32 x 32 positions of each block, indices wrapped mod N (row block 1's
    rows 32..39 then 0..23); the default schedule at the block's own rows and columns."""
    p = Problem(N=40, d=8)
    bufs = [Buffer("doc", "q+kv", "mask", "int32"), Buffer("bias", "qkv", "score"), Buffer("slope", "h", "score")]
    once = block_sparse(p, "causal", block=32, buffers=bufs)
    tmpl = block_sparse(p, "causal", block=32, buffers=bufs, indices="template")
    assert once.exact and tmpl.exact
    assert once.words["doc"] == (32 + 32) + (8 + 32) + (8 + 8) and tmpl.words["doc"] == 3 * (32 + 32)
    assert once.words["bias"] == 32 * 32 + 8 * 32 + 8 * 8 and tmpl.words["bias"] == 3 * 32 * 32
    assert once.words["slope"] == tmpl.words["slope"] == 3
    assert {k: v for k, v in tmpl.words.items() if k not in ("doc", "bias", "kv_indices", "full_kv_indices")} == {
        k: v for k, v in once.words.items() if k not in ("doc", "bias", "kv_indices", "full_kv_indices")
    }
    whole = Problem(N=64, d=8)  # N a multiple of the block: the two agree on the buffers
    a, b = (block_sparse(whole, "causal", block=32, buffers=bufs, indices=i) for i in ("once", "template"))
    assert (a.words["doc"], a.words["bias"]) == (b.words["doc"], b.words["bias"])


def test_hand_count_documents_on_block_boundaries():
    """Two documents of 256 and 128 tokens, blocks of 128, causal inside documents: row blocks see 1, 2, 1 blocks
    (the diagonal ones partial, block (1, 0) full); the dense kernel sees 3 each."""
    doc = np.repeat([0, 1], [256, 128])
    p = Problem(N=384, d=64)

    def document(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    bufs = [Buffer("doc", "q+kv", "mask", "int32"), Buffer("bias", "qkv", "score", "fp16")]
    r = block_sparse(p, document, block=128, buffers=bufs)
    w = r.words
    assert (w["kv_num_blocks"], w["kv_indices"], w["full_kv_indices"]) == (3, 3, 1)
    assert w["K"] == 4 * 128 * 64 and w["V"] == 4 * 128 * 64
    assert w["doc"] == 3 * (128 + 128) and w["bias"] == 4 * 128 * 128
    assert r.bytes["doc"] == 4 * w["doc"] and r.bytes["bias"] == 2 * w["bias"] and r.bytes["K"] == 8 * w["K"]
    d = block_sparse(p, document, block=128, buffers=bufs, dense=True)
    assert d.words["K"] == 9 * 128 * 64 and d.words["doc"] == 9 * 256 and "kv_indices" not in d.words
    assert d.exact and r.exact


def test_block_mask_index_tensors_and_refusals():
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 256, 256, device="cpu", BLOCK_SIZE=64)
    raw = mm.block_index(kv_num_blocks=bm.kv_num_blocks, kv_indices=bm.kv_indices,
                         full_kv_num_blocks=bm.full_kv_num_blocks, full_kv_indices=bm.full_kv_indices,
                         block_size=64)  # fmt: skip
    a = block_sparse(Problem(N=256, d=8), raw)
    b = block_sparse(Problem(N=256, d=8), bm)
    assert a.exact and a.stats.per_array == b.stats.per_array
    for call, param in (
        (lambda: block_sparse(Problem(N=200, d=8), bm), "block_mask"),
        (lambda: block_sparse(Problem(N=256, d=8), raw, block=32), None),
        (
            lambda: block_sparse(
                Problem(B=3, N=256, d=8),
                mm.block_index(
                    kv_num_blocks=np.zeros((2, 1, 4), int), kv_indices=np.zeros((2, 1, 4, 4), int), block_size=64
                ),
            ),
            "block_mask",
        ),  # fmt: skip
        (lambda: Buffer("bias", "qk"), "buffer index"),
        (lambda: Buffer("bias", "q", "both"), "buffer scope"),
        (lambda: block_sparse(Problem(N=64, d=8), "causal", buffers=[Buffer("K", "q")]), "buffers"),
        (lambda: block_sparse(Problem(N=64, d=8), "causal", block=0), "block"),
        (lambda: block_sparse(Problem(N=64, d=8), "causal", block=32, M=1000), "M"),
        (
            lambda: mm.block_index(kv_num_blocks=np.full((1, 1, 4), 9), kv_indices=np.zeros((1, 1, 4, 4), int)),
            "kv_num_blocks",
        ),
        (lambda: block_sparse(Problem(N=64, d=8), lambda q, kv: q >= kv), "mask_mod"),
        (lambda: block_sparse(Problem(B=2, N=64, d=8), _fns(64)[2], mask_B=3), "mask_B"),
        (
            lambda: block_sparse(
                Problem(B=2, H_q=2, N=64, d=8), "causal", buffers=[Buffer("bias", "bhqkv", shape=(2, 1, 64, 64))]
            ),
            "buffer bias shape",
        ),
    ):
        if param is None:  # the block size is the BlockMask's own: a different one is ignored, not an error
            assert call().block == (64, 64)
            continue
        with pytest.raises(InputError) as e:
            call()
        assert e.value.parameter == param and "\n" not in str(e.value)


def test_buffer_shapes_that_match():
    p = Problem(B=2, H_q=2, N=64, d=8)
    for index, shape in (("bhqkv", (2, 2, 64, 64)), ("qkv", (1, 1, 64, 64)), ("h", (2,)), ("kv", (1, 64))):
        assert block_sparse(p, "causal", buffers=[Buffer("x", index, shape=shape)]).exact


def test_sparse_beats_dense_and_naive_is_blind_to_the_mask():
    """Sliding window 256 at N = 4096, blocks of 128: K/V words fall by the fraction of blocks visited."""
    p = Problem(N=4096, d=64, dtype_q="bf16")
    s = block_sparse(p, "window:256", block=128)
    d = block_sparse(p, "window:256", block=128, dense=True)
    visited = s.census["partial"] + s.census["full"]
    assert s.words["K"] * 32 * 32 == d.words["K"] * visited
    assert s.bytes_total < d.bytes_total and s.naive_bytes == d.naive_bytes


def test_mask_conversion_reuses_iosim_masks():
    p = Problem(N=100, d=4)
    assert (blocks_of(p, masks.Causal(), 32).classes(4) == blocks_of(p, "causal", 32).classes(4)).all()


def test_module_example():
    import doctest

    import iosim.masking.block_sparse

    assert doctest.testmod(iosim.masking.block_sparse).failed == 0


def test_random_index_tensors_per_batch_and_head():
    """Index tensors read directly: per (b, h) (and broadcast), unsorted indices, padding beyond the counts."""
    rng = np.random.default_rng(7)
    for trial in range(12):
        B, H, Nq, Nk = (
            int(rng.integers(1, 3)),
            int(rng.integers(1, 4)),
            int(rng.integers(1, 90)),
            int(rng.integers(1, 90)),
        )
        BQ, BKV = int(rng.integers(1, 20)), int(rng.integers(1, 20))
        Tr, Tc = -(-Nq // BQ), -(-Nk // BKV)
        Bm, Hm = (B, H) if trial % 2 else (1, 1)
        cls = rng.integers(0, 3, (Bm, Hm, Tr, Tc))
        num = (cls == 1).sum(-1)
        fnum = (cls == 2).sum(-1)
        idx = np.argsort(rng.random(cls.shape) - 2.0 * (cls == 1), axis=-1)  # listed first, in a random order
        fidx = np.argsort(rng.random(cls.shape) - 2.0 * (cls == 2), axis=-1)
        bi = mm.block_index(kv_num_blocks=num, kv_indices=idx, full_kv_num_blocks=fnum, full_kv_indices=fidx,
                            block_size=(BQ, BKV))  # fmt: skip
        assert (bi.classes(Tc) == cls).all()
        p = Problem(B=B, H_q=H, N_q=Nq, N_k=Nk, d_qk=int(rng.integers(1, 9)), d_v=int(rng.integers(1, 9)))
        sparse = block_sparse(p, bi, buffers=BUFFERS)
        dense = block_sparse(p, bi, buffers=BUFFERS, dense=True)
        assert sparse.exact and dense.exact, trial
        heads = (B // Bm) * (H // Hm)
        widths = np.minimum(BKV, Nk - np.arange(Tc) * BKV)
        assert sparse.words.get("K", 0) == p.d_qk * int(((cls != 0) * widths).sum()) * heads
        assert dense.words["K"] == p.d_qk * Nk * Tr * B * H
        assert sparse.words.get("kv_indices", 0) == int((cls == 1).sum()) * heads
