"""Quantized KV caches as serving engines store them: each component of a cache row as an array with its own dtype,
so that a counted run's K/V reads come out in bytes per component.

A *row* is one token of one key/value head of K (or of V; under MLA one latent row, V inside it). A
:class:`KVFormat` lists its :class:`Part` s (values at a dtype, each with its scales) and the padding bytes a row
carries. A part's scales are per tensor (one scale for the whole array: one word per array per run, a kernel
argument), per token (one scale shared by the token's heads; a row read loads it, so H_kv row reads of a token read
it H_kv times), per (token, head) (one per row) or per block of ``scale_block`` values (16 for NVFP4, 32 for MXFP8 /
MXFP4, 64 or 128 in DeepSeek's layouts), inline (inside the row: the row's bytes include them) or in a separate
array (the same words and bytes, named apart). Words count entries (one value or one scale = one word, the memory
model's unit, whatever its dtype); bytes count storage: fp8 / mxfp8 values 1 byte, nvfp4 / mxfp4 values half a
byte, bf16 / fp16 2, fp32 4; scales fp32 4 bytes, NVFP4's e4m3 and MX's ue8m0 1 byte.

Presets (bytes per row; the layouts as their projects describe them):

* ``fp8_ds_mla`` (vLLM's DeepSeek-V4 sparse-MLA cache, the layout of FlashMLA's V4 kernels): 448 NoPE values in
  fp8 e4m3 with one ue8m0 scale per 64 values (7 bytes) and 1 byte of padding, 64 RoPE values in bf16 (128 bytes):
  448 + 8 + 128 = 584 bytes per token (rows of d_qk = 512). Described on TensorRT-LLM's tracker ("584 B = 448
  (nope FP8 E4M3) + 128 (rope BF16) + 7 (UE8M0 per-tile scale) + 1 (pad)").
* ``flashmla_v32`` (DeepSeek-V3.2's "FP8 with scale" cache of FlashMLA's sparse decoding kernel): 512 NoPE values
  in fp8 e4m3, 4 fp32 scales (one per 128 values, 16 bytes), 64 RoPE values in bf16 (128 bytes): 656 bytes per
  token (rows of d_qk = 576). Described in vLLM's ``vllm/v1/attention/backends/mla/flashmla_sparse.py`` (v0.11.0
  docs: "each token's KV cache is 656 Bytes").
* ``flashinfer_fp8`` (FlashInfer's per-(token, head) fp8 cache, ``fp8_token_head_quantize_append_paged_kv_cache_
  with_slot_mapping``): head_dim fp8 values, one fp32 scale inline and 12 bytes of padding: head_dim + 16 bytes
  ("[head_dim FP8][4-byte scale][12-byte pad]", FlashInfer's documentation).

Any other format by name: ``DTYPE[:SCALES[:PLACEMENT]][+ropeN:DTYPE]``, DTYPE one of :data:`VALUE_BITS`, SCALES one of
``none``, ``tensor``, ``token``, ``token-head``, ``blockN`` (default: nvfp4 block16 with e4m3 scales, mxfp8 /
mxfp4 block32 with ue8m0 scales, fp8 per tensor, the others none), PLACEMENT ``inline`` or ``separate`` (default
separate); ``+ropeN:DTYPE``: the row's last N values are a RoPE part of their own, unquantized at DTYPE (MLA's
decoupled key), the values before it the NoPE part. A scale block that does not divide the part's width is refused
in one line.
"""

from __future__ import annotations

from dataclasses import dataclass

from iosim.base.errors import InputError

VALUE_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "mxfp8": 8, "nvfp4": 4, "mxfp4": 4}
SCALE_BYTES = {"fp32": 4, "e4m3": 1, "ue8m0": 1}
GRANULARITIES = ("none", "tensor", "token", "token-head", "block")
DEFAULT_SCALES = {"nvfp4": ("block", 16, "e4m3"), "mxfp8": ("block", 32, "ue8m0"), "mxfp4": ("block", 32, "ue8m0"),
                  "fp8": ("tensor", 0, "fp32")}  # fmt: skip


@dataclass(frozen=True)
class Part:
    """One part of a row: ``width`` values (None: the row's width less the other parts') at ``dtype``, and their
    scales (``scale``: a granularity of :data:`GRANULARITIES`; ``scale_block`` values per scale for ``block``)."""

    name: str
    width: int | None
    dtype: str
    scale: str = "none"
    scale_block: int = 0
    scale_dtype: str = "fp32"
    inline: bool = False

    def scales_per_row(self, width: int) -> int:
        """Scale words a row read loads for this part (a per-tensor scale is counted once per run instead)."""
        if self.scale in ("none", "tensor"):
            return 0
        if self.scale == "block":
            return width // self.scale_block
        return 1


@dataclass(frozen=True)
class Component:
    """A component of a row as an array: its name, words per row and bytes per row (bits: values of 4 bits)."""

    name: str
    words: int
    bits: int
    placement: str  # "values", "inline", "separate", "padding", "per tensor"


@dataclass(frozen=True)
class KVFormat:
    """A KV cache row's layout (module docstring): ``parts``, ``pad`` bytes per row, the source describing it."""

    name: str
    parts: tuple[Part, ...]
    pad: int = 0
    source: str = ""
    row_width: int | None = None  # the row width (values) the layout is fixed for; None: any

    def components(self, width: int, array: str = "K") -> list[Component]:
        """The components of one row of ``width`` values (``array`` names them: K.nope, K.nope_scale, ...)."""
        if self.row_width is not None and width != self.row_width:
            raise InputError("kv-format", f"{self.name} describes rows of {self.row_width} values "
                             f"({' + '.join(str(p.width) for p in self.parts)}); this problem's {array} rows hold "
                             f"{width}", self.name)  # fmt: skip
        fixed = sum(p.width for p in self.parts if p.width is not None)
        out = []
        for part in self.parts:
            w = width - fixed if part.width is None else part.width
            if w <= 0:
                raise InputError("kv-format", f"{self.name}: the {part.name} part needs a row wider than {fixed}",
                                 width)  # fmt: skip
            if VALUE_BITS[part.dtype] == 4 and w % 2:
                raise InputError("kv-format", f"{self.name}: 4-bit values pack two per byte; the {part.name} part's "
                                 f"width {w} is odd", width)  # fmt: skip
            if part.scale == "block" and w % part.scale_block:
                raise InputError("kv-format", f"{self.name}: a scale block of {part.scale_block} values must divide "
                                 f"the {part.name} part's width {w}", part.scale_block)  # fmt: skip
            out.append(Component(f"{array}.{part.name}", w, VALUE_BITS[part.dtype], "values"))
            n = part.scales_per_row(w)
            if n:
                where = "inline" if part.inline else "separate"
                out.append(Component(f"{array}.{part.name}_scale", n, 8 * SCALE_BYTES[part.scale_dtype], where))
        if self.pad:
            out.append(Component(f"{array}.pad", 0, 8 * self.pad, "padding"))
        return out

    def row_bytes(self, width: int) -> float:
        """Bytes of one row of ``width`` values, scales and padding included (per-tensor scales excluded)."""
        return sum(component_bytes(c, 1) for c in self.components(width))

    def tensor_scales(self) -> int:
        """Scale words of the per-tensor scales (one per part that has one)."""
        return sum(1 for p in self.parts if p.scale == "tensor")


def component_bytes(c: Component, rows: int) -> float:
    """Bytes of ``rows`` rows of component ``c`` (padding: its bytes per row)."""
    if c.placement == "padding":
        return rows * c.bits // 8
    return rows * c.words * c.bits / 8


PRESETS = {
    "fp8_ds_mla": KVFormat(
        "fp8_ds_mla",
        (Part("nope", 448, "fp8", "block", 64, "ue8m0", True), Part("rope", 64, "bf16")),
        pad=1,
        source="TensorRT-LLM's tracker (DeepSeek-V4's FlashMLA/SGLang layout); vLLM kv_cache_dtype fp8_ds_mla",
        row_width=512,
    ),
    "flashmla_v32": KVFormat(
        "flashmla_v32",
        (Part("nope", 512, "fp8", "block", 128, "fp32", True), Part("rope", 64, "bf16")),
        source="vLLM vllm/v1/attention/backends/mla/flashmla_sparse.py (FlashMLA's FP8-with-scale sparse cache)",
        row_width=576,
    ),
    "flashinfer_fp8": KVFormat(
        "flashinfer_fp8",
        (Part("values", None, "fp8", "token-head", 0, "fp32", True),),
        pad=12,
        source="FlashInfer fp8_token_head_quantize_append_paged_kv_cache_with_slot_mapping (head_dim + 16 bytes)",
    ),
}
FORMS = f"{', '.join(PRESETS)} or DTYPE[:none|tensor|token|token-head|blockN[:inline|separate]][+ropeN:DTYPE]"


def kv_format(spec) -> KVFormat:
    """A :class:`KVFormat` from a preset's name or ``DTYPE[:SCALES[:PLACEMENT]][+ropeN:DTYPE]`` (module
    docstring)."""
    if isinstance(spec, KVFormat):
        return spec
    if not isinstance(spec, str):
        raise InputError("kv-format", f"must be {FORMS}", spec)
    if spec in PRESETS:
        return PRESETS[spec]
    spec_values, plus, rope = spec.partition("+")
    rope_part = _rope(rope, spec) if plus else None
    fields = spec_values.split(":")
    dtype = fields[0]
    if dtype not in VALUE_BITS or len(fields) > 3:
        raise InputError("kv-format", f"must be {FORMS} (DTYPE one of {', '.join(VALUE_BITS)})", spec)
    gran, block, sdtype = DEFAULT_SCALES.get(dtype, ("none", 0, "fp32"))
    if len(fields) > 1:
        g = fields[1]
        if g.startswith("block") and g[5:].isdigit() and int(g[5:]) > 0:
            gran, block = "block", int(g[5:])
        elif g in GRANULARITIES and g != "block":
            gran, block = g, 0
        else:
            raise InputError("kv-format", "scales must be none, tensor, token, token-head or blockN (N values per "
                             "scale)", spec)  # fmt: skip
    inline = False
    if len(fields) > 2:
        if fields[2] not in ("inline", "separate"):
            raise InputError("kv-format", "placement must be inline or separate", spec)
        inline = fields[2] == "inline"
    if rope_part is None:
        return KVFormat(spec, (Part("values", None, dtype, gran, block, sdtype, inline),))
    return KVFormat(spec, (Part("nope", None, dtype, gran, block, sdtype, inline), rope_part))


def _rope(text: str, spec: str) -> Part:
    """The RoPE part of ``...+ropeN:DTYPE``: the last N values of the row, unquantized at DTYPE."""
    width, _, dtype = text.partition(":")
    if not (width.startswith("rope") and width[4:].isdigit() and int(width[4:]) > 0 and dtype in VALUE_BITS):
        raise InputError("kv-format", f"a RoPE part must be +ropeN:DTYPE (N values at one of {', '.join(VALUE_BITS)})",
                         spec)  # fmt: skip
    return Part("rope", int(width[4:]), dtype)


def kv_bytes(fmt: KVFormat, problem, reads: dict[str, int]) -> list[tuple[str, int, float, str]]:
    """(component, words, bytes, placement) of the K/V reads of a run: ``reads`` = words read of K and V (V absent
    under MLA's latent, whose rows are K's). Rows read = words / width (d_qk for K, d_v for V); every row read loads
    its values, its scales and its padding; per-tensor scales one word per array."""
    out = []
    for array, width in (("K", problem.d_qk), ("V", problem.d_v)):
        words = reads.get(array, 0)
        if not words or (array == "V" and problem.latent):
            continue
        if words % width:
            raise InputError("kv-format", f"applies to runs that read whole rows of {array} ({words:,} words is not "
                             f"a multiple of {width})", fmt.name)  # fmt: skip
        rows = words // width
        for c in fmt.components(width, array):
            out.append((c.name, rows * c.words, component_bytes(c, rows), c.placement))
        for part in fmt.parts:
            if part.scale == "tensor":
                out.append((f"{array}.{part.name}_scale", 1, SCALE_BYTES[part.scale_dtype], "per tensor"))
    return out
