"""The causal-document ``mask_mod`` of triton_flex_blocksparse.py at N = 200, written as FlexAttention users write
one (a captured tensor of document ids for one sequence length), for ``iosim kernel ... --like block-sparse --mask
mod:iosim/kernels/examples/flex_document_mask.py:causal_document --N 200``. Not a launcher."""

from iosim.kernels.examples.triton_flex_blocksparse import documents

doc = documents(200)


def causal_document(b, h, q_idx, kv_idx):
    return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)
