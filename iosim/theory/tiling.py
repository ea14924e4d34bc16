"""Block sizes from the fast-memory capacity M.

Two rules:

* ``fit`` (default): the largest blocks whose working set (exactly as the memory model counts it, see
  :mod:`iosim.theory.io_model`) fits in M, keeping the paper's block shape. FlashAttention 1: maximise Bc with
  Br = min(Bc, d) (its I/O falls with Tc = ceil(N/Bc)); FlashAttention-2: maximise Br with Bc = min(Br, d) (its I/O
  falls with Tr). Standard attention: the largest square tile B whose products fit.
* ``paper``: the published formula. FlashAttention: Bc = ceil(M/(4d)), Br = min(Bc, d); FlashAttention-2 has
  no formula in its paper, so the mirror image Br = ceil(M/(4d)), Bc = min(Br, d) (docs/theory.md, F2). Under this
  model's accounting that working set exceeds M for every M <= 4d^2 and first fits at M = 8d^2 + 8d (e.g. N=1024,
  d=64, M=4096 needs 4384 words; docs/theory-model.md#tiling-rules-fit-and-paper), so with ``strict=True`` such a run
  raises CapacityError: a finding about the published constant 4, not a bug. Standard attention has no published
  tiling; ``paper`` uses the same square tile as ``fit``.

Square tiling (Saha & Ye, :func:`saha_ye_tiling`): ``fit`` takes the largest B whose working set
B^2 + 2B min(B, d) + 2B fits; ``paper`` takes their B = floor(sqrt(M/4)), which fits for B >= 2.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from iosim.base.errors import InputError
from iosim.theory import io_model

RULES = ("fit", "paper")


@dataclass(frozen=True)
class Tiling:
    rule: str
    Br: int | None = None
    Bc: int | None = None
    B: int | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.as_dict().items())


def _largest(lo: int, hi: int, fits) -> int | None:
    """Largest x in [lo, hi] with fits(x), for a predicate that is monotone (true then false)."""
    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _check_rule(rule: str) -> None:
    if rule not in RULES:
        raise InputError("tiling", f"must be one of {', '.join(RULES)}", rule)


def _too_small(algorithm: str, M: int, minimum: int, what: str) -> InputError:
    return InputError("M", f"must be at least {minimum} words for any tiling of {algorithm} ({what})", M, exit_code=2)


def flash_min_M(d: int) -> int:
    return io_model.flash_working_set(d, 1, 1)


def flash_tiling(algorithm: str, N: int, d: int, M: int, rule: str) -> Tiling:
    """Tiling of flash1 (K/V outer: Bc is the large block) or flash2 (Q outer: Br is the large block)."""
    _check_rule(rule)
    outer_is_kv = algorithm.startswith("flash1")
    if rule == "paper":
        big = io_model.cdiv(M, 4 * d)
        small = min(big, d)
    else:
        if M < flash_min_M(d):
            raise _too_small(algorithm, M, flash_min_M(d), "Br = Bc = 1 needs 4d + 3")

        def fits(b: int) -> bool:
            s = min(b, d, N)
            br, bc = (s, b) if outer_is_kv else (b, s)
            return io_model.flash_working_set(d, br, bc) <= M

        big = _largest(1, N, fits)
        small = min(big, d, N)
    return Tiling(rule, Br=small, Bc=big) if outer_is_kv else Tiling(rule, Br=big, Bc=small)


def square_tiling(
    algorithm: str, N: int, d: int, M: int, rule: str, N_k: int | None = None, d_v: int | None = None
) -> Tiling:
    """Square tile B for standard attention: both products and the softmax fit in M (N_q = N rows against N_k
    keys, V and O of width d_v, when given)."""
    _check_rule(rule)
    if M < 3:
        raise _too_small(algorithm, M, 3, "1x1 tiles of a product need 3 words")
    Nk = N if N_k is None else N_k
    dv = d if d_v is None else d_v

    def fits(b: int) -> bool:
        return max(io_model.matmul_peak(N, d, Nk, b), io_model.matmul_peak(N, Nk, dv, b)) <= M

    return Tiling(rule, B=_largest(1, max(N, Nk, d, dv), fits))


def saha_ye_tiling(N: int, d: int, M: int, rule: str) -> Tiling:
    """Square tile B of Saha & Ye's square tiling (forward and the small-cache backward share it).

    ``fit``: the largest B whose exact working set B^2 + 2B min(B, d) + 2B (:func:`io_model.square_tiling_peak`)
    fits in M (about sqrt(M/3) when B <= d). ``paper``: B = floor(sqrt(M/4)) (Saha & Ye, Algorithm 1), which fits
    for every B >= 2 (3B^2 + 2B <= 4B^2).
    """
    _check_rule(rule)
    minimum = io_model.square_tiling_peak(N, d, 1)
    if rule == "paper":
        B = math.isqrt(M // 4)
        if B < 1:
            raise _too_small("square-tiling", M, 4, "the paper's B = floor(sqrt(M/4)) must be at least 1")
        return Tiling(rule, B=B)
    if M < minimum:
        raise _too_small("square-tiling", M, minimum, "a 1x1 accumulator, two 1x1 operand tiles and two row statistics")
    return Tiling(rule, B=_largest(1, max(N, d), lambda b: io_model.square_tiling_peak(N, d, b) <= M))


def flash_backward_working_set(algorithm: str, d: int, Br: int, Bc: int) -> int:
    """Words resident in one inner step of the flash1 or flash2 backward (see :mod:`iosim.theory.io_model`)."""
    if algorithm.startswith("flash1"):
        return io_model.flash1_backward_working_set(d, Br, Bc)
    return io_model.flash2_backward_working_set(d, Br, Bc)


def flash_backward_min_M(algorithm: str, d: int) -> int:
    return flash_backward_working_set(algorithm, d, 1, 1)


def flash_backward_tiling(algorithm: str, N: int, d: int, M: int, rule: str) -> Tiling:
    """Tiling of the flash1 / flash2 backward. Both keep K/V outer (Algorithm 4; FlashAttention-2 Algorithm 2), so
    their I/O falls with Tc = ceil(N/Bc) alone: ``fit`` maximises Bc with the paper's shape Br = min(Bc, d) under
    the backward's own working set (about twice the forward's, so the blocks are smaller than the forward's).
    ``paper``: Algorithm 4 reuses the forward's Bc = ceil(M/(4d)), Br = min(Bc, d) (FlashAttention-2 states no
    formula; the same is used), whose backward working set is about 3M: under strict capacity it raises.
    """
    _check_rule(rule)
    if rule == "paper":
        Bc = io_model.cdiv(M, 4 * d)
        return Tiling(rule, Br=min(Bc, d), Bc=Bc)
    minimum = flash_backward_min_M(algorithm, d)
    if M < minimum:
        formula = "8d + 5" if algorithm.startswith("flash1") else "7d + 4"
        raise _too_small(f"{algorithm} backward", M, minimum, f"Br = Bc = 1 needs {formula}")

    def fits(b: int) -> bool:
        return flash_backward_working_set(algorithm, d, min(b, d, N), b) <= M

    Bc = _largest(1, N, fits)
    return Tiling(rule, Br=min(Bc, d, N), Bc=Bc)


def problem_backward_tiling(problem, M: int, rule: str, rows: int, Br: int | None = None,
                            Bc: int | None = None, algorithm: str = "flash2") -> Tiling:  # fmt: skip
    """Tiling of the flash2 (flash1) backward over a problem (K/V outer, thread blocks of ``rows`` query rows against
    N_k keys) under :func:`io_model.flash2_backward_problem_working_set` (``flash1_...``). ``fit``: the largest
    B_c <= N_k with
    B_r = min(B_c, d_qk, rows), as :func:`flash_backward_tiling` (which it is for one head with N_q = N_k and
    d_qk = d_v); ``paper``: B_c = ceil(M / 4 d_qk), B_r = min(B_c, d_qk). One explicit block: the other is the
    largest that fits."""
    _check_rule(rule)
    p = problem

    def ws(br: int, bc: int) -> int:
        if algorithm == "flash1":
            return io_model.flash1_backward_problem_working_set(p.d_qk, p.d_v, br, bc)
        return io_model.flash2_backward_problem_working_set(p.d_qk, p.d_v, br, bc)

    if Br is not None and Bc is not None:
        return Tiling("explicit", Br=Br, Bc=Bc)
    if Br is not None:
        return Tiling("explicit", Br=Br, Bc=_largest(1, p.N_k, lambda b: ws(min(Br, rows), b) <= M) or 1)
    if Bc is not None:
        return Tiling("explicit", Br=_largest(1, rows, lambda b: ws(b, min(Bc, p.N_k)) <= M) or 1, Bc=Bc)
    if rule == "paper":
        big = io_model.cdiv(M, 4 * p.d_qk)
        return Tiling(rule, Br=min(big, p.d_qk), Bc=big)
    if ws(1, 1) > M:
        need = "4 d_qk + 4 d_v + 5" if algorithm == "flash1" else "4 d_qk + 3 d_v + 4"
        raise _too_small(f"{algorithm} backward", M, ws(1, 1), f"Br = Bc = 1 needs {need}")
    bc = _largest(1, p.N_k, lambda b: ws(min(b, p.d_qk, rows), b) <= M)
    return Tiling(rule, Br=min(bc, p.d_qk, rows), Bc=bc)


def problem_tiling(algorithm: str, problem, M: int, rule: str, rows: int, shared: bool = False,
                   Br: int | None = None, Bc: int | None = None) -> Tiling:  # fmt: skip
    """Tiling of flash1 / flash2 over a problem whose thread blocks hold ``rows`` query rows (N_q per-head, g N_q
    packed) against N_k keys, under the working set :func:`io_model.problem_working_set` (d_qk, d_v; no V tile
    under MLA shared).

    ``fit``: the rule of :func:`flash_tiling` with the rows and keys in place of N (flash1 maximises B_c with
    B_r = min(B_c, d_qk, rows); flash2 maximises B_r <= rows with B_c = min(B_r, d_qk, N_k)); when flash2's row
    blocks hold every row and the rows are fewer than the keys (decoding), B_c then grows to the largest that
    fits: the square shape would leave fast memory idle (one key per step at N_q = 1). For one head with
    N_q = N_k this is :func:`flash_tiling` exactly. ``paper``: B_c = ceil(M / 4 d_qk), B_r = min(B_c, d_qk) (flash2:
    mirrored). Explicit ``Br`` / ``Bc`` replace the rule's (the other is chosen by it) and must fit in M.
    """
    from iosim.base.errors import InputError

    _check_rule(rule)
    p = problem
    dqk, dv, Nk = p.d_qk, p.d_v, p.N_k

    def ws(br: int, bc: int) -> int:
        return io_model.problem_working_set(dqk, dv, br, bc, shared)

    kv_outer = algorithm.startswith("flash1")
    if Br is not None and Bc is not None:
        br, bc = Br, Bc
    elif rule == "paper" and Br is None and Bc is None:
        big = io_model.cdiv(M, 4 * dqk)
        br, bc = (min(big, dqk), big) if kv_outer else (big, min(big, dqk))
    elif Br is not None:  # the rule picks Bc for the given Br: the largest that fits
        br = Br
        bc = _largest(1, Nk, lambda b: ws(br, b) <= M) or 1
    elif Bc is not None:
        bc = Bc
        br = _largest(1, rows, lambda b: ws(b, bc) <= M) or 1
    else:
        if ws(1, 1) > M:
            raise _too_small(
                algorithm, M, ws(1, 1), "Br = Bc = 1 needs 2 d_qk + 2 d_v + 3 (MLA shared: 2 d_qk + d_v + 3)"
            )
        if kv_outer:
            bc = _largest(1, Nk, lambda b: ws(min(b, dqk, rows), b) <= M)
            br = min(bc, dqk, rows)
        else:
            br = _largest(1, rows, lambda b: ws(b, min(b, dqk, Nk)) <= M)
            bc = min(br, dqk, Nk)
            if br == rows and rows < Nk:
                bc = _largest(bc, Nk, lambda b: ws(br, b) <= M)
    explicit = Br is not None or Bc is not None
    if explicit and ws(min(br, rows), min(bc, Nk)) > M:
        raise InputError(
            "Br, Bc",
            f"give a working set of {ws(min(br, rows), min(bc, Nk)):,} words (Br (d_qk + d_v + 2) + Bc (d_qk"
            f"{'' if shared else ' + d_v'}) + Br Bc) above M = {M:,}: choose smaller tiles",
            (Br, Bc),
        )
    return Tiling("explicit" if explicit else rule, Br=br, Bc=bc)


def saha_ye_problem_tiling(problem, M: int, rule: str) -> Tiling:
    """Square tile B of square tiling on one head of N_q x N_k, widths d_qk and d_v: ``fit`` the largest B whose
    working set :func:`io_model.square_tiling_rect_peak` fits; ``paper`` B = floor(sqrt(M/4))."""
    _check_rule(rule)
    p = problem
    if rule == "paper":
        B = math.isqrt(M // 4)
        if B < 1:
            raise _too_small("square-tiling", M, 4, "the paper's B = floor(sqrt(M/4)) must be at least 1")
        return Tiling(rule, B=B)

    def peak(b: int) -> int:
        return io_model.square_tiling_rect_peak(p.N_q, p.N_k, p.d_qk, p.d_v, b)

    if M < peak(1):
        raise _too_small("square-tiling", M, peak(1), "a 1x1 accumulator, two 1x1 operand tiles and two row statistics")
    return Tiling(rule, B=_largest(1, max(p.N_q, p.N_k, p.d_qk, p.d_v), lambda b: peak(b) <= M))
