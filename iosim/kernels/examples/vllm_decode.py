"""vLLM's Triton paged decoding, the paged-KV and the MLA variants (``vllm.v1.attention.ops.triton_decode_attention``,
PyPI ``vllm`` 0.33.0), counted in place from the installed package: nothing of the kernels is copied here.

**How the module is imported.** vLLM's top-level package (``vllm/__init__.py``) and the two modules the kernel file
imports besides torch and Triton probe the machine: ``vllm.platforms`` resolves ``current_platform`` through NVML,
plugins and ``regex`` (a dependency ``pip install --no-deps`` leaves out), and ``vllm.triton_utils`` counts Triton's
active GPU drivers (``vllm/triton_utils/importing.py``: 0 on a CPU, so it hands out placeholders instead of
``triton`` and ``tl``). :func:`import_kernels` therefore skips ``vllm/__init__.py``
(:func:`iosim.kernels.standin.bare_package`) and registers two stand-ins before importing the kernel file:
``vllm.platforms`` with a ``current_platform`` whose ``is_rocm()`` is False (what a CUDA GPU answers; the kernel file
reads nothing else of it, ``triton_decode_attention.py:39``), and ``vllm.triton_utils`` exposing the installed
``triton`` and ``triton.language`` (what it exports when one driver is active). The kernels, their host functions
and every launch parameter are the package's.

**The launches** (``decode_attention_fwd``, ``triton_decode_attention.py:755``): one query row per sequence and head
(decoding), a paged cache located through ``block_table`` (B x pages per sequence, int32; vLLM's
``req_to_token``), ``seq_lens`` (B words) and ``splits`` (vLLM's ``num_kv_splits``). Stage 1 cuts each sequence into
``splits`` chunks of ceil(seq_len / splits) keys (``:116``/``:352``) and walks each chunk in blocks of BLOCK_N keys:
64 in ``_fwd_kernel_stage1`` (one program per query head, used when H_q = H_kv, ``:223``), 32 in
``_fwd_grouped_kernel_stage1`` (one program per KV head holding its g query heads, up to 16, ``:505``, ``:512``).
It stores each split's partial output and logsumexp into ONE buffer, ``attn_logits`` (B, H_q, splits, d_v + 1):
the logsumexp is the last column (``:196``-``:206``, ``:455``-``:466``). Stage 2 (``_fwd_kernel_stage2``, one
program per query head) combines the live splits and stores O and the logsumexp L.

``launch``: K and V the two halves of one cache tensor as vLLM's Triton backend splits it (``triton_attn.py:655``-
``:657``: logical (pages, H_kv, P, 2 d), transposed to (pages, P, H_kv, 2 d), ``split(d, -1)``; separate buffers
when d_v differs). ``launch_mla``: one
latent cache (pages, P, d_qk) with V its first d_v columns (``triton_mla.py:292``-``:293``: ``kv_c_cache =
kv_c_and_k_pe_cache[..., :kv_lora_rank]``), ``is_mla=True``, and the one scale tensor passed as both k_scale and
v_scale (``triton_mla.py:340``-``:341``). Counts, the models beside them and the differences:
docs/kv-cache.md ("vLLM's paged decoding, counted in place").
"""

from __future__ import annotations

import sys
import types

import numpy as np

KERNEL_MODULE = "vllm.v1.attention.ops.triton_decode_attention"


def import_kernels():
    """The installed package's kernel module, imported with the stand-ins of the module docstring (idempotent)."""
    if KERNEL_MODULE in sys.modules:
        return sys.modules[KERNEL_MODULE]
    import importlib

    import triton
    import triton.language as tl

    from iosim.kernels.standin import bare_package

    bare_package("vllm")  # its __init__ imports the engine; the kernel file needs none of it
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_rocm=lambda: False, is_cuda=lambda: True)
    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.triton, triton_utils.tl = triton, tl
    sys.modules.setdefault("vllm.platforms", platforms)
    sys.modules.setdefault("vllm.triton_utils", triton_utils)
    return importlib.import_module(KERNEL_MODULE)


def block_table(B: int, N: int, page: int, seed: int = 0) -> np.ndarray:
    """int32 (B, ceil(N / page)): each sequence's pages, drawn without repetition from a pool of B ceil(N / page)
    pages (a shuffled pool, as a serving engine's allocator leaves it)."""
    per = -(-N // page)
    return np.random.default_rng(seed).permutation(B * per).astype(np.int32).reshape(B, per)


def _common(N: int, B: int, page: int, seed: int):
    import torch

    table = torch.from_numpy(block_table(B, N, page, seed))
    seq_lens = torch.full((B,), N, dtype=torch.int32)
    return table, seq_lens, torch.Generator().manual_seed(seed), int(table.numel())


def launch(N: int, d: int, dv: int | None = None, splits: int = 4, B: int = 2, H: int = 4, kv_heads: int = 1,
           page_size: int = 16, dtype: str = "float32", seed: int = 0, one_cache: bool = True) -> dict:  # fmt: skip
    """Paged decoding: q (B, H_q, d), K and V the two halves of each (token, head) row of one cache tensor (d_v = d
    and ``one_cache``; separate buffers otherwise); H = kv_heads runs ``_fwd_kernel_stage1``, otherwise the grouped
    kernel."""
    import torch

    m = import_kernels()
    dv = d if dv is None else dv
    table, seq_lens, g, pages = _common(N, B, page_size, seed)
    dt = getattr(torch, dtype)
    q = torch.randn(B, H, d, generator=g).to(dt)
    k_cache = torch.randn(pages, page_size, kv_heads, d, generator=g).to(dt)
    v_cache = torch.randn(pages, page_size, kv_heads, dv, generator=g).to(dt)
    if dv == d and one_cache:  # one cache tensor, (pages, H_kv, P, 2d) seen as (pages, P, H_kv, 2d), split into K, V
        kv = torch.cat([k_cache, v_cache], -1).transpose(1, 2).contiguous().transpose(1, 2)
        k_cache, v_cache = kv.split(d, -1)  # triton_attn.py:655-657: K and V interleaved within each (token, head) row
    o = torch.full((B, H, dv), float("nan"), dtype=dt)
    lse = torch.full((B, H), float("nan"), dtype=torch.float32)
    logits = torch.full((B, H, splits, dv + 1), float("nan"), dtype=torch.float32)
    k_scale, v_scale = torch.tensor(1.0), torch.tensor(1.0)
    m.decode_attention_fwd(q, k_cache, v_cache, o, lse, table, seq_lens, logits, splits, d**-0.5, page_size,
                           k_scale=k_scale, v_scale=v_scale)  # fmt: skip
    return {"Q": q, "K": k_cache, "V": v_cache, "O": o, "L": lse, "attn_logits": logits, "page_table": table,
            "lengths": seq_lens, "k_scale": k_scale, "v_scale": v_scale,
            **_numbers(d, B, H, kv_heads, page_size, splits, 64 if H == kv_heads else 32)}  # fmt: skip


def launch_mla(N: int, d: int = 48, dv: int = 32, splits: int = 4, B: int = 2, H: int = 4, page_size: int = 16,
               mla: str = "shared", dtype: str = "float32", seed: int = 0) -> dict:  # fmt: skip
    """MLA decoding as vLLM's TritonMLA backend calls it: one latent cache of d = d_qk columns per token (c_KV's
    d_v and the rotary part), V = its first d_v columns, H query heads on one latent head. ``mla="shared"``:
    ``is_mla=True``, V taken from K's tile (``triton_decode_attention.py:427``-``:431``); ``"naive"``:
    ``is_mla=False``, the grouped kernel's general path loading V again through its view (``:414``-``:424``)."""
    import torch

    if mla not in ("shared", "naive"):
        raise ValueError(f"mla must be shared or naive, got {mla!r}")
    m = import_kernels()
    table, seq_lens, g, pages = _common(N, B, page_size, seed)
    dt = getattr(torch, dtype)
    q = torch.randn(B, H, d, generator=g).to(dt)
    cache = torch.randn(pages, page_size, d, generator=g).to(dt).unsqueeze(2)  # triton_mla.py:292, a head dim of 1
    kv_c = cache[..., :dv]  # triton_mla.py:293, V: the same addresses as K's first d_v columns
    o = torch.full((B, H, dv), float("nan"), dtype=dt)
    lse = torch.full((B, H), float("nan"), dtype=torch.float32)
    logits = torch.full((B, H, splits, dv + 1), float("nan"), dtype=torch.float32)
    kv_scale = torch.tensor(1.0)
    m.decode_attention_fwd(q, cache, kv_c, o, lse, table, seq_lens, logits, splits, d**-0.5, page_size,
                           k_scale=kv_scale, v_scale=kv_scale, is_mla=mla == "shared")  # fmt: skip
    return {"Q": q, "K": cache, "V": kv_c, "O": o, "L": lse, "attn_logits": logits, "page_table": table,
            "lengths": seq_lens, "k_scale": kv_scale, "v_scale": kv_scale, **_numbers(d, B, H, 1, page_size, splits,
                                                                                   32)}  # fmt: skip


def _numbers(d: int, B: int, H: int, kv_heads: int, page_size: int, splits: int, block_n: int) -> dict:
    """What a comparison needs besides the arrays: stage 2 skips an empty split and stage 1 stores nothing for it
    (``:124``, ``:611``); a split is ceil(seq_len / splits) keys, rounded to nothing (``chunk_multiple`` 1); every
    stage-1 and stage-2 program reads its sequence's length once (``:110``/``:328``, ``:594``)."""
    return {
        "scale": d**-0.5,
        "B": B,
        "H": H,
        "kv_heads": kv_heads,
        "page_size": page_size,
        "splits": splits,
        "BLOCK_N": block_n,
        "empty_splits": "skipped",
        "chunk_multiple": 1,
        "metadata": {"lengths": [1, 1]},
    }
