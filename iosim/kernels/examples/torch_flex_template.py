"""FlexAttention's own Triton forward kernel: torch's installed template (torch/_inductor/kernel/flex/templates,
``flex_attention.py.jinja`` with ``utilities.py.jinja`` and ``common.py.jinja``), rendered here with iosim's own
hooks in place of inductor's and run on CPU tensors under the Triton interpreter.

Inductor renders this template only for a CUDA device (a CPU query lowers to its C++ template, and its Triton
backend on the CPU needs a Triton CPU driver), so the launcher renders it itself. The hooks (:func:`render`) fill
what inductor's ``TritonTemplateKernel`` fills: the signature (``def_kernel``, ``gen_argdefs``), the tensors'
sizes and strides as literals, the kernel options as module constants (``gen_defines``), the store of O
(``store_output``) and the two ``modification`` subgraphs, written as inductor writes a mod that reads a captured
tensor (``tl.load(in_ptr + (index))``, the index each dimension's variable times its stride, a literal). mask_mod
reads a captured tensor of the index ``mask`` names (:data:`MASKS`): ``q+kv``, document ids read at q and at kv
(``doc[q] == doc[kv] and q >= kv``), ``kv`` or ``q``, a per-key or per-query validity vector (``valid[kv] and q >=
kv``, a padding mask), or ``h``, a window per head (``q - kv < window[h] and q >= kv``, a BlockMask per head), or
a user's own, ``mod:FILE.py:NAME`` (loaded as ``iosim run --mask mod:`` loads it): traced as FlexAttention traces a
mask_mod for inductor (``make_fx`` over 0-d int32 indices under ``TransformGetItemToIndex``) and each aten op of the
graph written as a Triton expression, a captured tensor's read as a ``tl.load`` at its index times its strides
(:func:`mod_lines`: comparisons, + - *, & | ^ ~ and ``torch.where``; any other op refused in one line), its
BlockMask per (b, h) if it reads b or h, and each captured tensor declared to the model at the index it is read at
when that is q, kv, both, (q, kv), (b, h, q, kv) or h (:func:`declared`; tests/test_flex_template_user_mask.py);
score_mod is the identity or, with ``score`` naming the index it reads at (:data:`SCORES`), adds a (q, kv)
bias (``qkv``), a per-query or per-key vector (``q``, ``kv``), a full (b, h, q, kv) bias (``bhqkv``) or ALiBi's
per-head slope times kv - q (``h``). With ``kv_heads`` < H (GQA, as ``flex_attention(..., enable_gqa=True)``) K
and V have kv_heads heads and ``GQA_SHARED_HEADS`` is H / kv_heads, as inductor sets it; the template still
launches one program per (row block, b, query head), each loading the K/V tiles of its key/value head
(``off_hkv = off_hq // GQA_SHARED_HEADS``) and giving the query head to the mods and the BlockMask. Everything
else, the BlockMask walk included, is torch's source as installed.

The kernel options are those of a forward that keeps the logsumexp (``OUTPUT_LOGSUMEXP``, no ``OUTPUT_MAX``), with
``BLOCK_M`` = ``BLOCK_N`` = the BlockMask's block (one program per sparse row block, one step per sparse block).
Counted under the interpreter it moves, array by array, what ``iosim.masking.block_sparse(..., indices="template")``
counts for the same BlockMask and those buffers (:class:`iosim.masking.block_sparse.Buffer`, as the launcher's
``buffers`` declares them): the template reads each list's first index before its loop and, after each block,
that block's index and the next one's, and when N is not a multiple of the block it evaluates mask_mod and
score_mod at every padded position of the block, its indices wrapped mod N (tests/test_flex_kernel.py,
tests/test_flex_template_buffers.py). The hooks follow the template of torch :data:`TORCH` (another torch's
template may take other hooks or options: refused in one line).
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

    from iosim.base.errors import InputError

    path = os.path.join(os.path.dirname(torch.__file__), "_inductor", "kernel", "flex", "templates")
    if not torch.__version__.startswith(TORCH + ".") or not all(
        os.path.exists(os.path.join(path, t)) for t in TEMPLATES
    ):
        raise InputError("torch", f"must be {TORCH}, whose FlexAttention Triton templates ({', '.join(TEMPLATES)}) "
                         "the hooks were written against", torch.__version__)  # fmt: skip
    return path


# the captured tensor's name, by the index iosim.masking.block_sparse.Buffer reads it at: score_mod's (what each adds:
# score_mod) and mask_mod's (with its dtype; what each allows: mask_mod)
SCORES = {"qkv": "bias", "q": "bias", "kv": "bias", "bhqkv": "bias", "h": "slope"}
MASKS = {"q+kv": ("doc", "int32"), "kv": ("valid", "bool"), "q": ("valid", "bool"), "h": ("window", "int32")}
AT = {"q": "m", "kv": "n", "qkv": "mn", "bhqkv": "bhmn", "h": "h"}  # the index variables of each


def score_mod(kind: str, t):
    """The score_mod of ``kind`` (:data:`SCORES`) reading the captured tensor ``t``, as a FlexAttention user writes
    it: score plus bias[q, kv], bias[q], bias[kv], bias[b, h, q, kv], or ALiBi's slope[h] * (kv - q)."""
    return {
        "qkv": lambda s, b, h, q, kv: s + t[q, kv],
        "q": lambda s, b, h, q, kv: s + t[q],
        "kv": lambda s, b, h, q, kv: s + t[kv],
        "bhqkv": lambda s, b, h, q, kv: s + t[b, h, q, kv],
        "h": lambda s, b, h, q, kv: s + t[h] * (kv - q),
    }[kind]


def mask_mod(kind: str, t):
    """The mask_mod of ``kind`` (:data:`MASKS`) reading the captured tensor ``t``, causal and: within documents
    (doc[q] == doc[kv]), over the valid keys (valid[kv], a padding mask), for the valid queries (valid[q]: the
    others see no key), or within a window per head (q - kv < window[h])."""
    return {
        "q+kv": lambda b, h, q, kv: (t[q] == t[kv]) & (q >= kv),
        "kv": lambda b, h, q, kv: t[kv] & (q >= kv),
        "q": lambda b, h, q, kv: t[q] & (q >= kv),
        "h": lambda b, h, q, kv: (q - kv < t[h]) & (q >= kv),
    }[kind]


def block_mask(kind: str, t, N: int, H: int, block: int):  # noqa: N803
    """The BlockMask of :func:`mask_mod` (one per head when it reads h) on N x N, blocks of ``block``."""
    from torch.nn.attention.flex_attention import create_block_mask

    heads = H if kind == "h" else None
    return create_block_mask(mask_mod(kind, t), None, heads, N, N, device="cpu", BLOCK_SIZE=block)


# A user's own mask_mod (``mask="mod:FILE.py:NAME"``): traced as FlexAttention traces it for inductor (make_fx on
# 0-d int32 index tensors under TransformGetItemToIndex, so ``t[q]`` is aten.index), and each aten op of that graph
# written as the Triton expression inductor's pointwise codegen gives it; a captured tensor's read is a ``tl.load`` at
# its index times its strides, as :func:`render`'s ``load`` writes them.
BINARY = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "add": "+", "sub": "-", "mul": "*",
          "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^", "logical_and": "&", "logical_or": "|"}  # fmt: skip
UNARY = {"bitwise_not": "~", "logical_not": "~", "neg": "-"}


def user_mask(spec: str):
    """The mask_mod a ``mod:FILE.py:NAME`` names, loaded as ``iosim run --mask`` loads it (iosim.masking.masks)."""
    from iosim.masking import masks

    return masks.parse(spec).fn


def trace_mask(fn):
    """FlexAttention's graph of ``fn`` (make_fx over 0-d int32 b, h, q_idx, kv_idx) and its captured tensors by
    name: the name of the global or closure variable of ``fn`` holding it, else the graph's constant's name."""
    import torch
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    from torch.fx.experimental.proxy_tensor import make_fx

    with TransformGetItemToIndex():
        g = make_fx(fn)(*(torch.zeros((), dtype=torch.int32) for _ in range(4)))
    scope = {**getattr(fn, "__globals__", {})}
    for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
        scope[var] = cell.cell_contents
    held = {}
    for node in g.graph.nodes:
        if node.op == "get_attr":
            t = getattr(g, node.target)
            name = next((k for k, v in scope.items() if v is t), node.target.lstrip("_"))
            held.setdefault(name, t.contiguous())
            node.meta["iosim_name"] = name
    return g, held


KINDS = {("m",): "q", ("n",): "kv", ("m", "n"): "qkv", ("b", "h", "m", "n"): "bhqkv", ("h",): "h"}


def declared(g) -> dict:
    """The index (iosim.masking.block_sparse.Buffer's) each captured tensor of graph ``g`` is read at, when every
    read of it indexes by the bare index variables: q, kv, both (q+kv), (q, kv), (b, h, q, kv) or h; a tensor read
    at any other index is left undeclared (not in the model)."""
    names = {n: v for n, v in zip([x for x in g.graph.nodes if x.op == "placeholder"], "bhmn", strict=False)}
    reads: dict = {}
    for node in g.graph.nodes:
        if node.op == "call_function" and node.target._schema.name == "aten::index":
            at = tuple(names.get(i, "?") for i in node.args[1])
            reads.setdefault(node.args[0].meta["iosim_name"], set()).add(KINDS.get(at, "?"))
    out = {}
    for name, kinds in reads.items():
        kind = "q+kv" if kinds == {"q", "kv"} else next(iter(kinds)) if len(kinds) == 1 else "?"
        if kind != "?":
            out[name] = kind
    return out


def _storage(t) -> str | None:
    """The dtype name iosim.masking.block_sparse.Buffer takes for tensor ``t`` (None: one it does not size)."""
    from iosim.masking.block_sparse import INT_BYTES
    from iosim.spec.problem import ALIASES, BYTES

    name = str(t.dtype).removeprefix("torch.")
    name = ALIASES.get(name, name)
    return name if name in BYTES or name in INT_BYTES else None


def mod_lines(g, held: dict, output_name: str, at: dict) -> str:
    """The Triton lines of graph ``g``'s mask (:func:`trace_mask`), index variables ``at`` (b, h, m, n)."""
    from iosim.base.errors import InputError

    env, lines = {}, []
    places = iter(("b", "h", "m", "n"))
    for node in g.graph.nodes:
        val = lambda a: env[a] if a in env else repr(a)  # noqa: E731
        if node.op == "placeholder":
            env[node] = f"({at[next(places)]})"
        elif node.op == "get_attr":
            env[node] = node.meta["iosim_name"]
        elif node.op == "output":
            lines.append(f"{output_name} = {val(node.args[0])}")
        else:
            op = node.target._schema.name.split("::")[1]
            if op == "index":
                t = held[env[node.args[0]]]
                terms = [f"{val(i)}*{s}" for i, s in zip(node.args[1], t.stride(), strict=False)]
                env[node] = f"tmp_{len(lines)}"
                lines.append(f"tmp_{len(lines)} = tl.load(in_ptr_{env[node.args[0]]} + ({' + '.join(terms)}))")
            elif op in BINARY:
                env[node] = f"({val(node.args[0])} {BINARY[op]} {val(node.args[1])})"
            elif op in UNARY:
                env[node] = f"({UNARY[op]}{val(node.args[0])})"
            elif op == "where":
                env[node] = f"tl.where({', '.join(val(a) for a in node.args)})"
            else:
                raise InputError("mask", "must be a mask_mod of comparisons, + - *, & | ^ ~, torch.where and "
                                 "captured tensors indexed by b, h, q_idx, kv_idx (what the launcher renders)",
                                 f"{node.target}")  # fmt: skip
    return "\n".join(lines)


def own_block_mask(fn, N: int, B: int, H: int, block: int):  # noqa: N803
    """The BlockMask of a user's mask_mod: one per (b, h) if it reads b or h, else one for all (as iosim's
    ``--mask mod:`` classifies it, iosim.masking.mask_mod.reads_b_or_h)."""
    from torch.nn.attention.flex_attention import create_block_mask

    from iosim.masking.mask_mod import reads_b_or_h

    per = reads_b_or_h(fn, N)
    return create_block_mask(fn, B if per else None, H if per else None, N, N, device="cpu", BLOCK_SIZE=block)


def captured(kind: str, N: int, B: int, H: int, seed: int):  # noqa: N803
    """score_mod's (``kind`` a key of :data:`SCORES`) or mask_mod's (``mask:`` and a key of :data:`MASKS`) captured
    tensor at N keys, B batch items, H heads: standard-normal biases, ALiBi's slopes 2^(-8 (h + 1) / H), the
    document ids of :func:`documents`, keys (or queries) valid up to N - N // 4, windows of N / 2^(h + 1) keys."""
    import torch

    from iosim.kernels.examples._common import inputs

    if kind == "mask:q+kv":
        return documents(N).to(torch.int32).contiguous()
    if kind in ("mask:kv", "mask:q"):
        return torch.arange(N) < N - N // 4
    if kind == "mask:h":
        return torch.tensor([max(1, N >> (h + 1)) for h in range(H)], dtype=torch.int32)
    if kind == "h":
        return torch.exp2(-8.0 * torch.arange(1, H + 1, dtype=torch.float64) / H).to(torch.float32)
    shape = {"qkv": (N, N), "q": (N,), "kv": (N,), "bhqkv": (B, H, N, N)}[kind]
    return inputs("B", shape, "float32", seed + 1)[0].contiguous()


def render(tensors: dict, out, options: dict, score: str | None = None, mask: str = "q+kv") -> str:
    """The template's source for these tensors (names of :data:`ARGS`, plus mask_mod's captured tensor and, with
    ``score`` a key of :data:`SCORES`, score_mod's, under the names :data:`MASKS` and :data:`SCORES` give them) and
    kernel options."""
    import jinja2

    user = mask if not isinstance(mask, str) else None  # (graph, captured tensors) of a user's mask_mod
    mask_names = list(user[1]) if user else [MASKS[mask][0]]
    mask_name, score_kind = mask_names[0] if mask_names else None, score
    score_name = SCORES[score] if score else None
    names = (
        [f"arg_{a}" for a in ARGS] + [f"in_ptr_{n}" for n in mask_names] + ([f"in_ptr_{score_name}"] if score else [])
    )
    names += ["out_ptr0"]

    def def_kernel(*args):
        return "@triton.jit\ndef flex_fwd(" + ", ".join(names) + "):\n" + "".join(f"    {a} = arg_{a}\n" for a in args)

    def stride(name, i=None):
        s = tensors[name].stride()
        return str(s[i]) if i is not None else ", ".join(map(str, s))

    def size(name, i):
        return str(tensors[name].shape[i])

    def load(name, kind, **at):
        """A captured tensor's load as inductor's ``modification`` writes it, ``tl.load(in_ptr + (index))``: each
        index variable its kind reads (:data:`AT`) times the tensor's stride there, a literal (a dimension of size
        1, which inductor broadcasts, adds nothing)."""
        t = tensors[name]
        terms = [
            at[v] if s == 1 else f"{s}*{at[v]}" for v, s, n in zip(AT[kind], t.stride(), t.shape, strict=True) if n > 1
        ]
        return f"tl.load(in_ptr_{name} + ({' + '.join(terms) or '0'}))"

    def modification(subgraph_number, output_name, score, b, h, m, n, **kw):
        at = dict(b=b, h=h, m=m, n=n)
        if subgraph_number == 1 and user:  # a user's mask_mod, as traced
            return mod_lines(*user, output_name, at)
        if subgraph_number == 1:  # mask_mod
            if mask == "q+kv":  # two loads of the document ids, at q and at kv
                return (f"tmp_dq = {load(mask_name, 'q', **at)}\ntmp_dk = {load(mask_name, 'kv', **at)}\n"
                        f"{output_name} = (tmp_dq == tmp_dk) & (({m}) >= ({n}))")  # fmt: skip
            held = f"tmp_v = {load(mask_name, mask, **at)}\n"
            if mask == "h":  # the head's window
                return held + f"{output_name} = ((({m}) - ({n})) < tmp_v) & (({m}) >= ({n}))"
            return held + f"{output_name} = tmp_v & (({m}) >= ({n}))"
        if not score_kind:  # score_mod: the identity
            return f"{output_name} = ({score})"
        tmp = f"tmp_s = {load(score_name, score_kind, **at)}\n"
        if score_kind == "h":  # ALiBi: the head's slope times (kv - q)
            return tmp + f"tmp_d = (({n}) - ({m})).to(tl.float32)\n{output_name} = ({score}) + tmp_s * tmp_d"
        return tmp + f"{output_name} = ({score}) + tmp_s"

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
    B: int = 1,
    dtype: str = "float32",
    seed: int = 0,  # noqa: N803
    score: str | None = None,
    mask: str = "q+kv",
    kv_heads: int | None = None,
) -> dict:
    """The template on B x H query heads of N tokens (head dimension d) and ``kv_heads`` key/value heads (default
    H; fewer: GQA, as ``flex_attention(..., enable_gqa=True)``), blocks of ``block``, with the mask_mod of ``mask``
    and the score_mod of ``score`` (:data:`MASKS`, :data:`SCORES`; None: the identity)."""
    import torch

    from iosim.base.errors import InputError
    from iosim.kernels.examples._common import default_scale, inputs

    if score is not None and score not in SCORES:
        raise InputError("score", f"must be None or one of {', '.join(SCORES)} (the index score_mod's captured "
                         "tensor is read at)", score)  # fmt: skip
    own = isinstance(mask, str) and mask.startswith("mod:")
    if mask not in MASKS and not own:
        raise InputError("mask", f"must be one of {', '.join(MASKS)} (the index mask_mod's captured tensor is read "
                         "at) or mod:FILE.py:NAME (your own mask_mod)", mask)  # fmt: skip
    H_kv = H if kv_heads is None else kv_heads
    if isinstance(H_kv, bool) or not isinstance(H_kv, int) or H_kv < 1 or H % H_kv:
        raise InputError("kv_heads", f"must be None or a divisor of H = {H} (GQA: H / kv_heads query heads share "
                         "one key/value head)", kv_heads)  # fmt: skip
    if own:
        fn = user_mask(mask)
        graph, mine = trace_mask(fn)
        bm = own_block_mask(fn, N, B, H, block)
    else:
        mask_name, mask_dtype = MASKS[mask]
        mine = {mask_name: captured("mask:" + mask, N, B, H, seed)}
        bm = block_mask(mask, mine[mask_name], N, H, block)
    Q, K, V = (x.reshape(B, H, N, d) for x in inputs("QKV", (B * H, N, d), dtype, seed))
    K, V = K[:, :H_kv].contiguous(), V[:, :H_kv].contiguous()  # (B, H_kv, N, d), as inductor takes them
    tensors = {"Q": Q, "K": K, "V": V, "LSE": torch.empty((B, H, N), dtype=torch.float32),
               "MAX": torch.empty((B, H, N), dtype=torch.float32), "KV_NUM_BLKS": bm.kv_num_blocks.contiguous(),
               "KV_IDX": bm.kv_indices.contiguous(), "FULL_KV_NUM_BLKS": bm.full_kv_num_blocks.contiguous(),
               "FULL_KV_IDX": bm.full_kv_indices.contiguous(), **mine}  # fmt: skip
    extra = {}
    if score:
        extra[SCORES[score]] = captured(score, N, B, H, seed)
        tensors.update(extra)
    O = torch.empty_like(Q)
    options = dict(PRESCALE_QK=False, ROWS_GUARANTEED_SAFE=False, BLOCKS_ARE_CONTIGUOUS=False, OUTPUT_LOGSUMEXP=True,
                   OUTPUT_MAX=False, FLOAT32_PRECISION="ieee", IS_DIVISIBLE=N % block == 0, SM_SCALE=default_scale(d),
                   GQA_SHARED_HEADS=H // H_kv, HAS_FULL_BLOCKS=True, QK_HEAD_DIM=d, QK_HEAD_DIM_ROUNDED=d, V_HEAD_DIM=d,
                   V_HEAD_DIM_ROUNDED=d, SAFE_HEAD_DIM=True, USE_TMA=False, BLOCK_M=block, BLOCK_N=block,
                   SPARSE_Q_BLOCK_SIZE=block, SPARSE_KV_BLOCK_SIZE=block, WRITE_DQ=True)  # fmt: skip
    src = render(tensors, O, options, score, (graph, mine) if own else mask)
    with tempfile.NamedTemporaryFile("w", suffix="_flex_template.py", delete=False) as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("iosim_flex_template", f.name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.flex_fwd[(triton.cdiv(N, block), B, H)](*(tensors[a] for a in ARGS), *mine.values(), *extra.values(), O)
    os.unlink(f.name)
    if own:  # a user's tensors, at the index each is read at (iosim.masking.block_sparse.Buffer)
        buffers = {n: (k, "mask", _storage(mine[n])) for n, k in declared(graph).items() if _storage(mine[n])}
    else:
        buffers = {mask_name: (mask, "mask", mask_dtype)}
    buffers.update({name: (score, "score") for name in extra})
    return {**extra, **mine,
            "Q": Q, "K": K, "V": V, "O": O, "L": tensors["LSE"], "kv_num_blocks": tensors["KV_NUM_BLKS"],
            "kv_indices": tensors["KV_IDX"], "full_kv_num_blocks": tensors["FULL_KV_NUM_BLKS"],
            "full_kv_indices": tensors["FULL_KV_IDX"], "scale": default_scale(d), "B": B, "H": H,
            "kv_heads": H_kv,
            "buffers": buffers}  # fmt: skip
