"""SageAttention 1.0.6's Triton attention (PyPI ``sageattention==1.0.6``), counted in place from the installed
package under Triton's interpreter: nothing of it is copied here. The launcher calls the library's own host
functions: ``per_block_int8`` (two launches of ``quant_per_block_int8_kernel``: Q in blocks of 128 rows, K in
blocks of 64, each block scaled to int8 with one float scale per block) and ``attn_qk_int8_per_block.forward``
(``_attn_fwd``, non-causal), as ``sageattn`` does after its smoothing of K (``sageattn`` itself asserts CUDA
tensors, so it is not called). The quantization runs uncounted (``paused``): what is counted is the attention
kernel, beside flash2's closed form.

``_attn_fwd`` is FlashAttention-2's forward on int8 Q and K: one program per (block of BLOCK_M = 128 query rows,
head, batch) loads its Q block (int8) and its scale once, steps over every key block of BLOCK_N = 64 keys (K int8
and its scale, V fp16), and stores O once; it stores no logsumexp. Q and K are named by the kernel's parameters
(the int8 arrays it reads); the numerics are not checked (int8 inputs are SageAttention's own approximation, not
iosim.check's floating-point rule). Counts: docs/kernels-library.md.
"""

from __future__ import annotations

import torch
from sageattention.attn_qk_int8_per_block import forward
from sageattention.quant_per_block import per_block_int8

from iosim.kernels.counting import paused


def launch(N: int, d: int = 64, B: int = 1, H: int = 2, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, d, generator=g).to(torch.float16) for _ in range(3))
    with paused():  # the quantization kernels: not the attention's traffic
        q_int8, q_scale, k_int8, k_scale = per_block_int8(q, k, sm_scale=d**-0.5, tensor_layout="HND")
    o = forward(q_int8, k_int8, v, q_scale, k_scale, tensor_layout="HND", output_dtype=torch.float16)
    return {"V": v, "O": o, "B": B, "H": H, "layout": "BHND"}


def launch_with_quantization(N: int, d: int = 64, B: int = 1, H: int = 2, seed: int = 0) -> dict:
    """All three launches counted: Q and K read in fp16 and written in int8 by the quantization, then the attention."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, d, generator=g).to(torch.float16) for _ in range(3))
    q_int8, q_scale, k_int8, k_scale = per_block_int8(q, k, sm_scale=d**-0.5, tensor_layout="HND")
    o = forward(q_int8, k_int8, v, q_scale, k_scale, tensor_layout="HND", output_dtype=torch.float16)
    return {"Q_fp16": q, "K_fp16": k, "Q_int8": q_int8, "K_int8": k_int8, "Q_scale": q_scale, "K_scale": k_scale,
            "V": v, "O": o}  # fmt: skip
