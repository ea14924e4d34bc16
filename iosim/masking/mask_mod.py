"""FlexAttention's masks as iosim input: ``mask_mod`` functions and ``BlockMask`` index tensors.

A ``mask_mod`` is a function of (b, h, q_idx, kv_idx) returning True where the score is allowed, written as
FlexAttention users write it (torch.nn.attention.flex_attention): comparisons and indexing on the index arrays,
captured tensors such as document ids allowed. iosim calls it on index arrays that broadcast, a block of rows
against a chunk of columns at a time (``q_idx`` of shape (rows, 1), ``kv_idx`` of shape (1, columns), b and h
integers), first with NumPy arrays and, when that raises, with CPU torch tensors (FlexAttention's own
``create_block_mask`` also evaluates it on broadcast index tensors). Nothing of size N x N is ever held: a chunk is
at most :data:`CHUNK` elements.

:func:`classify` turns a mask_mod into block classes (0 empty, 1 partial, 2 full) on blocks of BQ x BKV, as
``create_block_mask`` does: with ``padded`` (FlexAttention's rule) a block is full only when every one of its
BQ x BKV positions is allowed, so the ragged last blocks are partial whenever they are not empty. With ``bits`` it
also keeps, for blocks of 64 columns, each partial block's rows as 64-bit words: the element oracle of the MOD kind
of :mod:`iosim.algorithms.tile_masks`, which answers any tile of any tiling exactly.

A ``BlockMask`` (or its four index tensors with its block size) is read as block classes per (b, h)
(:func:`block_classes`); :func:`agreement` compares them with the classes of its own mask_mod, block by block.
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
import warnings
import weakref
from dataclasses import dataclass

import numpy as np

from iosim.base.errors import InputError, user_code

CHUNK = 1 << 22  # elements of mask_mod evaluated at once (rows x columns of one call)
EMPTY, PARTIAL, FULL = 0, 1, 2


def fn_label(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def check_mask_mod(fn, name: str = "mask_mod") -> None:
    """One line unless ``fn`` is a callable taking (b, h, q_idx, kv_idx)."""
    if not callable(fn):
        raise InputError(name, "must be a function of (b, h, q_idx, kv_idx)", type(fn).__name__)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C callable: its arity shows when it is called
    try:
        sig.bind(0, 0, 0, 0)
    except TypeError:
        raise InputError(name, "must take four arguments (b, h, q_idx, kv_idx)", f"{fn_label(fn)}{sig}") from None


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _as_bool(out, shape: tuple[int, int], label: str, name: str) -> np.ndarray:
    torch = _torch()
    if torch is not None and isinstance(out, torch.Tensor):
        if out.device.type != "cpu":
            raise InputError(name, "must be evaluable on the CPU (it returned a tensor on another device)",
                             f"{label}: device {out.device}")  # fmt: skip
        if out.dtype != torch.bool:
            raise InputError(name, "must return booleans (torch.bool)", f"{label}: dtype {out.dtype}")
        out = out.numpy()
    elif isinstance(out, (bool, np.bool_)):
        out = np.asarray(out)
    if not isinstance(out, np.ndarray):
        raise InputError(name, "must return a boolean array or tensor", f"{label}: {type(out).__name__}")
    if out.dtype != np.bool_:
        raise InputError(name, "must return booleans (dtype bool)", f"{label}: dtype {out.dtype}")
    try:
        return np.broadcast_to(out, shape)
    except ValueError:
        raise InputError(name, f"must return an array that broadcasts to (q_idx, kv_idx) = {shape}",
                         f"{label}: shape {out.shape}") from None  # fmt: skip


_TORCH_FNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # mask_mods that compute with torch


def _torch_call(fn, b, h, qi, ki, label, name, first):
    torch = _torch()
    try:
        with user_code(name, label):
            out = fn(torch.tensor(b), torch.tensor(h), torch.from_numpy(qi), torch.from_numpy(ki))
    except InputError:  # it exited (user_code)
        raise
    except Exception as e:  # noqa: BLE001 (the user's function: any exception becomes one line)
        text = str(e).lower()
        if "cuda" in text or "device" in text or "meta" in text:
            raise InputError(name, "must be evaluable on the CPU (it needs another device)",
                             f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:120]}") from None  # fmt: skip
        first = first if first is not None else e
        msg = str(first).splitlines()[0][:160] if str(first) else ""
        raise InputError(name, "must run on index arrays without raising",
                         f"{label} raised {type(first).__name__}: {msg}") from None  # fmt: skip
    return _as_bool(out, (qi.size, ki.size), label, name)


def call(fn, b: int, h: int, q: np.ndarray, kv: np.ndarray, name: str = "mask_mod") -> np.ndarray:
    """fn(b, h, q_idx[:, None], kv_idx[None, :]) as a (len(q), len(kv)) boolean array. NumPy index arrays first; a
    function that raises on them or answers with a torch tensor (it computes with torch: captured tensors) is
    called with CPU torch tensors instead, as FlexAttention calls it, from then on. One line when it raises, needs
    another device, or does not answer with booleans that broadcast."""
    label = fn_label(fn)
    qi, ki = q.reshape(-1, 1), kv.reshape(1, -1)
    torch = _torch()
    try:
        if torch is not None and fn in _TORCH_FNS:
            return _torch_call(fn, b, h, qi, ki, label, name, None)
    except TypeError:  # not weak-referenceable
        pass
    first = None
    try:
        with warnings.catch_warnings(), user_code(name, label):  # NumPy's warnings on torch tensors mixed with
            warnings.simplefilter("ignore", DeprecationWarning)  # index arrays
            out = fn(b, h, qi, ki)
    except InputError:  # it exited (user_code)
        raise
    except Exception as e:  # noqa: BLE001 (the user's function: any exception becomes one line)
        first = e
    if torch is not None and (first is not None or isinstance(out, torch.Tensor)):
        ans = _torch_call(fn, b, h, qi, ki, label, name, first)
        with contextlib.suppress(TypeError):
            _TORCH_FNS[fn] = True
        return ans
    if first is not None:
        msg = str(first).splitlines()[0][:160] if str(first) else ""
        raise InputError(
            name, "must run on index arrays without raising", f"{label} raised {type(first).__name__}: {msg}"
        )
    return _as_bool(out, (qi.size, ki.size), label, name)


class _Touched(BaseException):  # a BaseException: a mask_mod's own ``except Exception`` does not swallow it
    """A probe index was used."""


def _touched(*args, **kwargs):
    raise _Touched


_USES = ("__index__ __int__ __float__ __complex__ __bool__ __round__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__ "
         "__hash__ __add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ __rtruediv__ __floordiv__ "
         "__rfloordiv__ __mod__ __rmod__ __pow__ __rpow__ __and__ __rand__ __or__ __ror__ __xor__ __rxor__ "
         "__lshift__ __rlshift__ __rshift__ __rrshift__ __neg__ __pos__ __abs__ __invert__ __format__ __len__ "
         "__iter__ __contains__ __getitem__ __array__ __getattr__").split()  # fmt: skip
_Probe = type("_Probe", (), dict.fromkeys(_USES, _touched))  # an index that raises on every use


def reads_b_or_h(fn, N: int) -> bool:  # noqa: N803
    """Whether the mask_mod reads b or h. It is called on a few query and key indices spanning [0, N) with b and h
    that raise on every use (comparison, arithmetic, indexing, conversion, attributes), with NumPy and then torch
    index arrays: False when a call returns booleans without using them, True when one uses them (and when no call
    answers at all: then it is evaluated at every (b, h), which is exact either way). A mask_mod cannot branch in
    Python on the index values (FlexAttention's vmap forbids it), so one that answers here never reads b or h."""
    idx = np.unique(np.array([0, 1, N // 2, N - 1], dtype=np.int64).clip(0, N - 1))
    calls = [(idx.reshape(-1, 1), idx.reshape(1, -1))]
    torch = _torch()
    if torch is not None:
        calls.append((torch.from_numpy(idx).reshape(-1, 1), torch.from_numpy(idx).reshape(1, -1)))
    for q, kv in calls:
        try:
            with warnings.catch_warnings(), user_code("mask_mod", fn_label(fn)):
                warnings.simplefilter("ignore")
                out = fn(_Probe(), _Probe(), q, kv)
            _as_bool(out, (idx.size, idx.size), fn_label(fn), "mask_mod")
        except _Touched:
            return True
        except Exception:  # noqa: BLE001, S112 (the other array kind may answer; a true error shows when evaluated)
            continue
        return False
    return True


@dataclass(frozen=True)
class Classes:
    """A mask_mod on blocks of BQ x BKV: ``cls`` (block rows x block columns, int8: 0 empty, 1 partial, 2 full)
    and, with bits, ``words`` (K x BQ int64: the rows of the k-th partial block, in row-major block order)."""

    cls: np.ndarray
    words: np.ndarray | None
    nnz: int


def classify(fn, b: int, h: int, Nq: int, Nk: int, BQ: int, BKV: int, *, padded: bool, bits: bool = False,  # noqa: N803
             name: str = "mask_mod", q_offset: int = 0) -> Classes:  # fmt: skip
    """The block classes of fn over [0, N_q) x [0, N_k), a band of BQ rows and at most :data:`CHUNK` elements at a
    time. ``padded``: a ragged block is full only if its BQ x BKV padded area is (never: it is partial).
    ``bits`` (BKV = 64): keep each partial block's rows as int64 words. ``q_offset``: query row i is evaluated at
    q_idx = q_offset + i (N_k - N_q for a problem's queries, the last N_q rows of the sequence as in every iosim
    mask; torch's ``create_block_mask`` with Q_LEN = N_q evaluates q_idx = i)."""
    if bits and BKV != 64:
        raise ValueError("bits need blocks of 64 columns")
    nbr, nbc = -(-Nq // BQ), -(-Nk // BKV)
    cls = np.zeros((nbr, nbc), dtype=np.int8)
    words: list[np.ndarray] = []
    step = max(1, CHUNK // (BQ * BKV)) * BKV
    nnz = held = 0
    if bits:
        from iosim.runner.estimate import available_bytes

        limit = int(0.5 * available_bytes())
    for bi in range(nbr):
        r0, r1 = bi * BQ, min(Nq, (bi + 1) * BQ)
        q = np.arange(r0, r1, dtype=np.int64) + q_offset
        rows = r1 - r0
        band_words = []
        for c0 in range(0, Nk, step):
            c1 = min(Nk, c0 + step)
            A = call(fn, b, h, q, np.arange(c0, c1, dtype=np.int64), name)
            nb = -(-(c1 - c0) // BKV)
            P = np.zeros((BQ, nb * BKV), dtype=np.bool_)
            P[:rows, : c1 - c0] = A
            blocks = P.reshape(BQ, nb, BKV)
            count = blocks.sum(axis=(0, 2))
            nnz += int(count.sum())
            widths = np.minimum(BKV, (c1 - c0) - np.arange(nb) * BKV)
            area = BQ * BKV if padded else rows * widths
            c = np.where(count == 0, EMPTY, np.where(count == area, FULL, PARTIAL)).astype(np.int8)
            cls[bi, c0 // BKV : c0 // BKV + nb] = c
            if bits:
                part = np.flatnonzero(c == PARTIAL)
                if part.size:
                    packed = np.packbits(blocks[:, part, :], axis=2, bitorder="little")  # BQ x k x 8 bytes
                    w = np.ascontiguousarray(packed).view("<i8")[:, :, 0]  # BQ x k
                    band_words.append(np.ascontiguousarray(w.T))
        if band_words:
            words.extend(band_words)
            held += sum(w.nbytes for w in band_words)
            if held > limit:
                what = f"{held / 2**30:.1f} GiB of bits after {r1:,} of {Nq:,} rows ({limit / 2**30:.1f} GiB allowed)"
                raise InputError(name, f"has more partial blocks than memory holds: {what}; a structured or random "
                                 "mask needs no bits", fn_label(fn))  # fmt: skip
    W = np.concatenate(words) if words else np.zeros((0, BQ), dtype=np.int64)
    return Classes(cls, W.astype(np.int64) if bits else None, nnz)


def mod_table(c: Classes, N: int) -> tuple[tuple, np.ndarray]:  # noqa: N803
    """The MOD kind's (params, table) (:mod:`iosim.algorithms.tile_masks`) from 64 x 64 classes with bits."""
    g = 64
    cls = c.cls
    nbr, nbc = cls.shape
    K = c.words.shape[0]
    W = g * max(1, (nbc + 2) // g + 1)
    per = W // g
    R = -(-K // per)
    T = np.zeros((nbr + R + 2, W), dtype=np.int64)
    part = cls == PARTIAL
    index = np.zeros(cls.shape, dtype=np.int64)
    index[part] = np.arange(1, K + 1)  # row-major order, as classify appended them
    T[:nbr, :nbc] = np.where(cls == FULL, -1, index)
    nonempty = cls != EMPTY
    rows_any, cols_any = nonempty.any(axis=1), nonempty.any(axis=0)
    T[:nbr, nbc] = np.where(rows_any, nonempty.argmax(axis=1), 0)
    T[:nbr, nbc + 1] = np.where(rows_any, nbc - nonempty[:, ::-1].argmax(axis=1), 0)
    words = np.zeros((R * per, g), dtype=np.int64)
    words[:K] = c.words
    T[nbr : nbr + R, :] = words.reshape(R, per * g)
    T[nbr + R, :nbc] = np.where(cols_any, nonempty.argmax(axis=0), 0)
    T[nbr + R + 1, :nbc] = np.where(cols_any, nbr - nonempty[::-1, :].argmax(axis=0), 0)
    return (g, nbr, nbc, R, per), T


# --- BlockMask ----------------------------------------------------------------------------------------------------


def _int_array(name: str, a, ndim: int) -> np.ndarray:
    torch = _torch()
    if torch is not None and isinstance(a, torch.Tensor):
        if a.device.type != "cpu":
            raise InputError(name, "must be a CPU tensor (build the BlockMask with device='cpu')", str(a.device))
        a = a.numpy()
    arr = np.asarray(a)
    if arr.dtype.kind not in "iu" or arr.ndim != ndim:
        raise InputError(name, f"must be an integer array of {ndim} dimensions", f"{arr.dtype}, shape {arr.shape}")
    return arr.astype(np.int64)


@dataclass(frozen=True, eq=False)
class BlockIndex:
    """A BlockMask's four index tensors, as numpy int64: per (b, h, row block i), ``kv_num`` partial blocks listed
    first in ``kv_idx[b, h, i]`` and ``full_num`` full blocks in ``full_idx[b, h, i]``; BQ x BKV blocks; the mask_mod
    applied inside partial blocks (None: every position of a listed block allowed) and the sequence lengths."""

    kv_num: np.ndarray
    kv_idx: np.ndarray
    full_num: np.ndarray
    full_idx: np.ndarray
    BQ: int
    BKV: int
    mask_mod: object = None
    seq_lengths: tuple[int, int] | None = None

    @property
    def Tr(self) -> int:  # noqa: N802
        return self.kv_num.shape[2]

    def classes(self, Tc: int) -> np.ndarray:
        """Block classes (B', H', T_r, T_c) int8: 0 empty, 1 partial, 2 full."""
        Bm, Hm, Tr = self.kv_num.shape
        cls = np.zeros((Bm, Hm, Tr, Tc), dtype=np.int8)
        for num, idx, v in ((self.kv_num, self.kv_idx, PARTIAL), (self.full_num, self.full_idx, FULL)):
            live = np.arange(idx.shape[3]) < num[..., None]
            b, h, i, k = np.nonzero(live)
            cls[b, h, i, idx[b, h, i, k]] = v
        return cls


def block_index(block_mask=None, *, kv_num_blocks=None, kv_indices=None, full_kv_num_blocks=None,
                full_kv_indices=None, block_size=128, mask_mod=None, seq_lengths=None) -> BlockIndex:  # fmt: skip
    """A :class:`BlockIndex` from a torch BlockMask (built on the CPU) or from its four index tensors and block size;
    one line naming the tensor that is malformed."""
    if block_mask is not None:
        for attr in ("kv_num_blocks", "kv_indices", "BLOCK_SIZE"):
            if not hasattr(block_mask, attr):
                raise InputError("block_mask", "must be a torch BlockMask (torch.nn.attention.flex_attention)",
                                 type(block_mask).__name__)  # fmt: skip
        kv_num_blocks, kv_indices = block_mask.kv_num_blocks, block_mask.kv_indices
        full_kv_num_blocks, full_kv_indices = block_mask.full_kv_num_blocks, block_mask.full_kv_indices
        block_size, seq_lengths = tuple(block_mask.BLOCK_SIZE), tuple(block_mask.seq_lengths)
        mask_mod = block_mask.mask_mod
        if getattr(mask_mod, "__name__", "") == "noop_mask":
            mask_mod = None
    if isinstance(block_size, numbers.Integral) and not isinstance(block_size, bool):
        block_size = (block_size, block_size)
    if (
        not isinstance(block_size, (tuple, list))
        or len(block_size) != 2
        or not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) and 0 < x <= 1 << 20 for x in block_size)
    ):
        raise InputError("block_size", "must be a positive integer or (BQ, BKV) of positive integers", block_size)
    if kv_num_blocks is None or kv_indices is None:
        raise InputError("kv_num_blocks", "and kv_indices must both be given (or a BlockMask)", None)
    num = _int_array("kv_num_blocks", kv_num_blocks, 3)
    idx = _int_array("kv_indices", kv_indices, 4)
    if full_kv_num_blocks is None:
        fnum, fidx = np.zeros_like(num), np.zeros(num.shape + (1,), dtype=np.int64)
    else:
        fnum = _int_array("full_kv_num_blocks", full_kv_num_blocks, 3)
        fidx = _int_array("full_kv_indices", full_kv_indices, 4)
    for n, a, i, nm in (
        (num, idx, "kv_indices", "kv_num_blocks"),
        (fnum, fidx, "full_kv_indices", "full_kv_num_blocks"),
    ):
        if a.shape[:3] != num.shape or n.shape != num.shape:
            raise InputError(i, f"must have shape (B, H, T_r, ...) = {num.shape} + (...,) like kv_num_blocks",
                             f"shape {a.shape}")  # fmt: skip
        if n.min(initial=0) < 0 or n.max(initial=0) > a.shape[3]:
            raise InputError(nm, f"must be from 0 to {a.shape[3]} (the columns of {i})", int(n.max()))
    if mask_mod is not None:
        check_mask_mod(mask_mod, "block_mask mask_mod")
    return BlockIndex(num, idx, fnum, fidx, int(block_size[0]), int(block_size[1]), mask_mod,
                      None if seq_lengths is None else (int(seq_lengths[0]), int(seq_lengths[1])))  # fmt: skip


def check_shape(bi: BlockIndex, Nq: int, Nk: int, B: int = 1, H: int = 1) -> int:  # noqa: N803
    """One line unless the BlockMask fits a problem of B x H heads and N_q x N_k scores; T_c."""
    if bi.seq_lengths is not None and bi.seq_lengths != (Nq, Nk):
        raise InputError("block_mask", f"was built for (Q_LEN, KV_LEN) = {bi.seq_lengths}, not the problem's "
                         f"(N_q, N_k) = ({Nq}, {Nk})", bi.seq_lengths)  # fmt: skip
    Tr, Tc = -(-Nq // bi.BQ), -(-Nk // bi.BKV)
    if bi.Tr != Tr:
        raise InputError("block_mask", f"has {bi.Tr} row blocks of {bi.BQ}; the problem's N_q = {Nq} needs {Tr}",
                         f"block size {bi.BQ}x{bi.BKV}")  # fmt: skip
    for name, num, idx in (("kv_indices", bi.kv_num, bi.kv_idx), ("full_kv_indices", bi.full_num, bi.full_idx)):
        live = np.arange(idx.shape[3]) < num[..., None]
        if live.any() and (idx[live].min() < 0 or idx[live].max() >= Tc):
            raise InputError(name, f"must index column blocks 0 to {Tc - 1} (N_k = {Nk}, block {bi.BKV})",
                             int(idx[live].max()))  # fmt: skip
    Bm, Hm = bi.kv_num.shape[:2]
    if Bm not in (1, B) or Hm not in (1, H):
        raise InputError("block_mask", f"has (B, H) = ({Bm}, {Hm}); the problem's is ({B}, {H}) (1 broadcasts)",
                         (Bm, Hm))  # fmt: skip
    return Tc


@dataclass(frozen=True)
class Agreement:
    """How a BlockMask's classes differ from those of its mask_mod, counted over blocks of every (b, h):
    ``dropped`` blocks the BlockMask leaves out although the mask_mod allows something in them (scores lost);
    ``wrong_full`` blocks it marks full although the mask_mod forbids something in them (scores let through);
    ``extra`` blocks it visits although the mask_mod allows nothing there (loads wasted); ``unmarked_full`` blocks
    it marks partial although the mask_mod allows all of them (mask_mod work and reads wasted). ``first`` the first
    disagreeing block (b, h, i, j) of each kind."""

    blocks: int
    dropped: int
    wrong_full: int
    extra: int
    unmarked_full: int
    first: dict

    @property
    def agrees(self) -> bool:
        return self.dropped == self.wrong_full == self.extra == self.unmarked_full == 0

    def __str__(self) -> str:
        if self.agrees:
            return f"the BlockMask agrees with its mask_mod on all {self.blocks:,} blocks"
        parts = [f"{getattr(self, k):,} {k.replace('_', ' ')} (first at (b, h, i, j) = {self.first[k]})"
                 for k in ("dropped", "wrong_full", "extra", "unmarked_full") if getattr(self, k)]  # fmt: skip
        return f"the BlockMask disagrees with its mask_mod on {self.blocks:,} blocks: " + "; ".join(parts)


def agreement(bi: BlockIndex, Nq: int, Nk: int, mask_mod=None) -> Agreement:  # noqa: N803
    """Compare a BlockMask's classes with the padded classes of ``mask_mod`` (default: its own), block by block, for
    every (b, h) it holds (a whole N_q x N_k evaluation per (b, h), a chunk at a time). The queries are the last N_q
    positions of the sequence, as in every iosim mask: ``mask_mod`` is evaluated at q_idx = N_k - N_q + i, so a
    BlockMask that torch built with Q_LEN = N_q < N_k from the same function (q_idx = i) disagrees, as it should:
    its kernel computes another mask than the one iosim counts."""
    fn = mask_mod if mask_mod is not None else bi.mask_mod
    if fn is None:
        raise InputError("mask_mod", "must be given: the BlockMask has none to compare with", None)
    check_mask_mod(fn)
    Tc = check_shape(bi, Nq, Nk, *bi.kv_num.shape[:2])
    have = bi.classes(Tc)
    counts = {"dropped": 0, "wrong_full": 0, "extra": 0, "unmarked_full": 0}
    first: dict = {}
    for b in range(have.shape[0]):
        for h in range(have.shape[1]):
            want = classify(fn, b, h, Nq, Nk, bi.BQ, bi.BKV, padded=True, q_offset=Nk - Nq).cls
            got = have[b, h]
            kinds = (
                ("dropped", (got == EMPTY) & (want != EMPTY)),
                ("wrong_full", (got == FULL) & (want != FULL)),
                ("extra", (got != EMPTY) & (want == EMPTY)),
                ("unmarked_full", (got == PARTIAL) & (want == FULL)),
            )
            for k, sel in kinds:
                n = int(sel.sum())
                if n and k not in first:
                    i, j = np.argwhere(sel)[0]
                    first[k] = (b, h, int(i), int(j))
                counts[k] += n
    return Agreement(int(have.size), first=first, **counts)
