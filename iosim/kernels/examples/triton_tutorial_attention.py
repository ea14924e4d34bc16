"""The Triton tutorial's fused-attention forward (``_attn_fwd`` / ``_attn_fwd_inner``, autotuned, the log2-domain
logsumexp stored as ``M``), counted in place under Triton's interpreter: nothing of it is copied here.

Where the kernel comes from:

- ``IOSIM_TUTORIAL_ATTENTION=PATH`` (a Triton checkout's ``python/tutorials/06-fused-attention.py``, or any file
  laid out like it): the file is imported by its path, after iosim's CPU stand-in for the GPU (the tutorial asks
  Triton's active driver for its device when imported);
- otherwise the packaged copy in PyPI's ``flash-mlm`` (``flash_mlm.kernel``, MIT): the tutorial's forward in its
  recent tensor-descriptor form, reformatted (``pip install --no-deps flash-mlm==1.2.3``); it imports on a CPU as
  it is.

The launcher calls the module's own host function, ``_attention.forward`` (what the tutorial's ``attention`` runs),
with a small object in place of autograd's context that keeps what it saves for the backward: the logsumexp ``M``
it allocated.
The kernel has one program per (block of BLOCK_M query rows, batch x head): it loads its Q block once, steps over
the key blocks (all of them; causal: those left of the diagonal, then the diagonal's, masked), stores O once and
``M`` = m_i + log2(l_i) for its rows, unmasked. Nothing masks the rows, so N must be a multiple of BLOCK_M (at
another N the last block's ``M`` store runs past the array: iosim reports it). The autotuner has up to 36 configs:
name one with ``--config`` (``BLOCK_M=128,BLOCK_N=64,num_stages=2,num_warps=4``). Counts: docs/kernels-library.md.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from types import SimpleNamespace

import torch

ENV = "IOSIM_TUTORIAL_ATTENTION"


def tutorial_module():
    """The module holding ``_attn_fwd`` and its host function ``_attention``: the file ``$IOSIM_TUTORIAL_ATTENTION``
    names, or flash-mlm's packaged copy."""
    path = os.environ.get(ENV)
    if not path:
        return importlib.import_module("flash_mlm.kernel")
    from iosim.base.errors import InputError
    from iosim.kernels.standin import install

    if not os.path.isfile(path):
        raise InputError(ENV, "must name the tutorial's file (python/tutorials/06-fused-attention.py)", path)
    install()  # the tutorial asks Triton's active driver for its torch device at import
    spec = importlib.util.spec_from_file_location("iosim_tutorial_fused_attention", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # a tutorial written for another Triton (block pointers, experimental descriptors)
        raise InputError(ENV, "must name a file that imports under this Triton", f"{type(e).__name__}: {e}") from None
    if not hasattr(module, "_attention") or not hasattr(module, "_attn_fwd"):
        raise InputError(ENV, "must name a file defining _attn_fwd and its host function _attention", path)
    return module


def launch(N: int, d: int = 64, B: int = 1, H: int = 2, causal: bool = False, seed: int = 0) -> dict:
    module = tutorial_module()
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, d, generator=g).to(torch.float16) for _ in range(3))
    saved = SimpleNamespace()
    ctx = SimpleNamespace(save_for_backward=lambda *t: setattr(saved, "tensors", t))
    forward = module._attention.forward
    scale = d**-0.5
    args = (ctx, q, k, v, causal, scale)
    if "warp_specialize" in inspect.signature(forward).parameters:
        args += (False,)  # host-side tensor descriptors where the file's checks allow them
    o = forward(*args)
    M = saved.tensors[-1]  # the logsumexp the forward keeps for its backward: (B, H, N), log2 domain
    layout = {"Q": "BHND", "K": "BHND", "V": "BHND", "O": "BHND", "L": "BHN"}
    return {"Q": q, "K": k, "V": v, "O": o, "L": M, "scale": scale, "causal": causal, "B": B, "H": H,
            "layout": layout, "logsumexp": "log2"}  # fmt: skip
