"""FlexAttention's own Triton forward kernel: torch's installed template (torch/_inductor/kernel/flex/templates,
``flex_attention.py.jinja`` with ``utilities.py.jinja`` and ``common.py.jinja``), rendered here with iosim's own
hooks in place of inductor's and run on CPU tensors under the Triton interpreter.

Inductor renders this template only for a CUDA device (a CPU query lowers to its C++ template, and its Triton
backend on the CPU needs a Triton CPU driver), so the launcher renders it itself. The hooks (:func:`render`) fill
what inductor's ``TritonTemplateKernel`` fills: the signature (``def_kernel``, ``gen_argdefs``), the tensors'
sizes and strides as literals, the kernel options as module constants (``gen_defines``), the store of O
(``store_output``) and the two ``modification`` subgraphs, written as inductor writes a mask_mod that reads
captured document ids: ``score_mod`` the identity (``bias=True``: plus a captured (q, kv) bias, one load),
``mask_mod`` ``doc[q] == doc[kv] and q >= kv`` with the two loads of ``doc`` inductor emits. Everything else,
the BlockMask walk included, is torch's source as installed.

The kernel options are those of a forward that keeps the logsumexp (``OUTPUT_LOGSUMEXP``, no ``OUTPUT_MAX``), with
``BLOCK_M`` = ``BLOCK_N`` = the BlockMask's block (one program per sparse row block, one step per sparse block).
Counted under the interpreter it moves, array by array, what ``iosim.block_sparse(..., indices="template")``
counts for the same BlockMask: the template reads each list's first index before its loop and, after each block,
that block's index and the next one's, and when N is not a multiple of the block it evaluates mask_mod and
score_mod at every padded position of the block, its indices wrapped mod N (tests/test_flex_kernel.py). The
hooks follow the template of torch :data:`TORCH` (another torch's template may take other hooks or options:
refused in one line).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile

import triton

TORCH = "2.13"  # the torch whose template the hooks were written against
TEMPLATES = ("flex_attention.py.jinja", "utilities.py.jinja", "common.py.jinja")
ARGS = ("Q", "K", "V", "LSE", "MAX", "KV_NUM_BLKS", "KV_IDX", "FULL_KV_NUM_BLKS", "FULL_KV_IDX")


def template_dir() -> str:
    import torch

    from iosim.errors import InputError

    path = os.path.join(os.path.dirname(torch.__file__), "_inductor", "kernel", "flex", "templates")
    if not torch.__version__.startswith(TORCH + ".") or not all(
        os.path.exists(os.path.join(path, t)) for t in TEMPLATES
    ):
        raise InputError("torch", f"must be {TORCH}, whose FlexAttention Triton templates ({', '.join(TEMPLATES)}) "
                         "the hooks were written against", torch.__version__)  # fmt: skip
    return path


def render(tensors: dict, out, options: dict, bias: bool = False) -> str:
    """The template's source for these tensors (names of :data:`ARGS`, plus ``doc``, and ``bias``: a (q, kv) bias
    that score_mod adds) and kernel options."""
    import jinja2

    names = [f"arg_{a}" for a in ARGS] + ["in_ptr_doc"] + (["in_ptr_bias"] if bias else []) + ["out_ptr0"]

    def def_kernel(*args):
        return "@triton.jit\ndef flex_fwd(" + ", ".join(names) + "):\n" + "".join(f"    {a} = arg_{a}\n" for a in args)

    def stride(name, i=None):
        s = tensors[name].stride()
        return str(s[i]) if i is not None else ", ".join(map(str, s))

    def size(name, i):
        return str(tensors[name].shape[i])

    def modification(subgraph_number, output_name, score, b, h, m, n, **kw):
        if subgraph_number == 0:  # score_mod: the identity, or plus bias[q, kv]
            if not bias:
                return f"{output_name} = ({score})"
            return f"tmp_b = tl.load(in_ptr_bias + ({n}) + {size('K', 2)} * ({m}))\n{output_name} = ({score}) + tmp_b"
        return (f"tmp_dq = tl.load(in_ptr_doc + ({m}))\ntmp_dk = tl.load(in_ptr_doc + ({n}))\n"
                f"{output_name} = (tmp_dq == tmp_dk) & (({m}) >= ({n}))")  # fmt: skip

    def store_output(indices, val, mask, val_shape=None):
        z, h, m, d = indices
        st = out.stride()
        return f"tl.store(out_ptr0 + ({z} * {st[0]} + {h} * {st[1]} + {m} * {st[2]} + {d} * {st[3]}), {val}, {mask})"

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(template_dir()), undefined=jinja2.StrictUndefined)
    env.filters["indent_except_first"] = lambda s, k: s.replace("\n", "\n" + "    " * k)
    hooks = dict(def_kernel=def_kernel, gen_argdefs=lambda: ", ".join(names), gen_defines=lambda: "", stride=stride,
                 size=size, modification=modification, store_output=store_output)  # fmt: skip
    body = "".join(env.get_template(t).render(**hooks, **options) for t in TEMPLATES)
    head = "import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n\n"
    head += "INDEX_DTYPE = tl.int32\n" + "".join(f"{k} = {v!r}\n" for k, v in options.items())
    return head + body


def documents(N: int):  # noqa: N803
    """Document ids of N tokens: three documents of N/4, N/2 and the rest."""
    import torch

    return torch.repeat_interleave(torch.arange(3), torch.tensor([N // 4, N // 2, N - N // 4 - N // 2]))


def launch(
    N: int,
    d: int,
    block: int = 32,
    H: int = 1,
    dtype: str = "float32",
    seed: int = 0,  # noqa: N803
    bias: bool = False,
) -> dict:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from iosim.kernels.examples._common import default_scale, inputs

    doc = documents(N)

    def causal_document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    bm = create_block_mask(causal_document, None, None, N, N, device="cpu", BLOCK_SIZE=block)
    Q, K, V = (x.reshape(1, H, N, d) for x in inputs("QKV", (H, N, d), dtype, seed))
    tensors = {"Q": Q, "K": K, "V": V, "LSE": torch.empty((1, H, N), dtype=torch.float32),
               "MAX": torch.empty((1, H, N), dtype=torch.float32), "KV_NUM_BLKS": bm.kv_num_blocks.contiguous(),
               "KV_IDX": bm.kv_indices.contiguous(), "FULL_KV_NUM_BLKS": bm.full_kv_num_blocks.contiguous(),
               "FULL_KV_IDX": bm.full_kv_indices.contiguous()}  # fmt: skip
    O = torch.empty_like(Q)
    doc32 = doc.to(torch.int32).contiguous()
    options = dict(PRESCALE_QK=False, ROWS_GUARANTEED_SAFE=False, BLOCKS_ARE_CONTIGUOUS=False, OUTPUT_LOGSUMEXP=True,
                   OUTPUT_MAX=False, FLOAT32_PRECISION="ieee", IS_DIVISIBLE=N % block == 0, SM_SCALE=default_scale(d),
                   GQA_SHARED_HEADS=1, HAS_FULL_BLOCKS=True, QK_HEAD_DIM=d, QK_HEAD_DIM_ROUNDED=d, V_HEAD_DIM=d,
                   V_HEAD_DIM_ROUNDED=d, SAFE_HEAD_DIM=True, USE_TMA=False, BLOCK_M=block, BLOCK_N=block,
                   SPARSE_Q_BLOCK_SIZE=block, SPARSE_KV_BLOCK_SIZE=block, WRITE_DQ=True)  # fmt: skip
    src = render(tensors, O, options, bias)
    with tempfile.NamedTemporaryFile("w", suffix="_flex_template.py", delete=False) as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("iosim_flex_template", f.name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    extra = [inputs("B", (N, N), "float32", seed + 1)[0].contiguous()] if bias else []
    mod.flex_fwd[(triton.cdiv(N, block), 1, H)](*(tensors[a] for a in ARGS), doc32, *extra, O)
    os.unlink(f.name)
    return {**({"bias": extra[0]} if bias else {}),
            "Q": Q, "K": K, "V": V, "O": O, "L": tensors["LSE"], "kv_num_blocks": tensors["KV_NUM_BLKS"],
            "kv_indices": tensors["KV_IDX"], "full_kv_num_blocks": tensors["FULL_KV_NUM_BLKS"],
            "full_kv_indices": tensors["FULL_KV_IDX"], "doc": doc32, "scale": default_scale(d), "H": H,
            "buffers": {"doc": ("q+kv", "mask", "int32"), **({"bias": ("qkv", "score")} if bias else {})}}  # fmt: skip
