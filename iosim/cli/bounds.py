"""``iosim bounds --N --d --M [--mask]``: the papers' bounds at these sizes and the regime (M vs d^2)."""

from __future__ import annotations

import json

from tabulate import tabulate

from iosim.cli.compare import theory_line
from iosim.cli.options import FORMATS, add_problem_shape, add_problem_sizes, add_yes, fmt_int, problem_of
from iosim.masking import masks
from iosim.theory import bounds


def add_arguments(p) -> None:
    add_problem_sizes(p)
    add_problem_shape(p.add_argument_group("a problem (only the bounds that apply to it are shown)"))
    p.add_argument("--mla", choices=("shared", "naive"), default=None, help="MLA latent cache (V inside K)")
    p.add_argument("--mask", default=None, help=f"sparse bounds for a mask: {masks.FORMS}")
    p.add_argument("--format", choices=FORMATS, default="simple")
    p.add_argument("--json", action="store_true", help="print the bounds as JSON")
    add_yes(p, "counting a random mask")


def _problem_command(args, p) -> None:
    from iosim.runner import api

    bs = bounds.problem_bounds(p, args.M, api.problem_seen(p, args.mask, allow_long=args.yes))
    if args.json:
        from iosim.base.version import __version__

        doc = {"iosim_version": __version__, "problem": p.as_dict(), "M": args.M, "note": bounds.PROBLEM_NOTE}
        doc["bounds"] = [
            {k: getattr(b, k) for k in ("name", "kind", "value", "formula", "regime", "applies", "citation")}
            for b in bs
        ]
        print(json.dumps(doc, indent=2))
        return
    print(f"{p}; M={args.M}")
    rows = [[b.name, b.kind, fmt_int(b.value), b.formula, b.citation] for b in bs]
    print(
        tabulate(
            rows, headers=["bound", "kind", "value", "formula", "source"], tablefmt=args.format, disable_numparse=True
        )
    )
    print(f"note: {bounds.PROBLEM_NOTE}")


def command(args) -> None:
    p = problem_of(args)
    if p is not None:
        return _problem_command(args, p)
    N, d, M = args.N, args.d, args.M
    mask = None
    if args.mask is not None:  # the nnz bound and Proposition 4 on two tilings each count the mask
        from iosim.runner import estimate

        mask = masks.compile_mask(args.mask, N, allow_long=args.yes)
        estimate.check_mask(mask, passes=3, allow_long=args.yes)
    if args.json:
        from iosim.base.version import __version__

        winner, reason = bounds.theory_winner(d, M)
        doc = {"iosim_version": __version__, "N": N, "d": d, "M": M, "regime": bounds.regime(d, M)}
        doc["theory_winner"], doc["reason"] = winner, reason
        groups = [("forward", bounds.forward_bounds(N, d, M)), ("backward", bounds.backward_bounds(N, d, M))]
        if args.mask is not None:
            doc["mask"] = args.mask
            groups.append(("sparse", bounds.sparse_bounds(N, d, M, mask)))
        for title, bs in groups:
            doc[title] = [
                {k: getattr(b, k) for k in ("name", "kind", "value", "formula", "regime", "applies", "citation")}
                for b in bs
            ]
        print(json.dumps(doc, indent=2))
        return
    print(f"N={N}, d={d}, M={M}: {bounds.regime(d, M)}; d^2 = {d * d}, M/d^2 = {M / (d * d):.3g}")
    print(theory_line(d, M))
    groups = [("forward", bounds.forward_bounds(N, d, M)), ("backward", bounds.backward_bounds(N, d, M))]
    if args.mask is not None:
        groups.append((f"sparse, mask {args.mask}", bounds.sparse_bounds(N, d, M, mask)))
        sparse_note = f"note: the sparse nnz lower bound is {bounds.SPARSE_NOTE}"
    else:
        sparse_note = None
    for title, bs in groups:
        rows = [
            [b.name, b.kind, fmt_int(b.value), b.formula, b.regime, "yes" if b.applies else "no", b.citation]
            for b in bs
        ]
        print()
        print(title)
        print(
            tabulate(
                rows,
                headers=["bound", "kind", "value", "formula", "regime", "applies", "source"],
                tablefmt=args.format,
                disable_numparse=True,
            )
        )
    if sparse_note:
        print()
        print(sparse_note)
