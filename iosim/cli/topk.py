"""``iosim run topk-sparse --indices ...``: sparse attention by top-k indices, its counts per array beside the closed
form and the compulsory floor (iosim.masking.topk_sparse)."""

from __future__ import annotations

import json

from tabulate import tabulate

from iosim.base.errors import InputError
from iosim.cli.options import fmt_err, fmt_int, kv_format_rows, problem_of

# Options of iosim run that the top-k schedule does not read, with their defaults: given, they are refused.
UNUSED = {"backward": False, "mask": None, "kv_policy": None, "splits": 1, "page_size": None,
          "gqa": "per-head", "Br": None, "Bc": None, "B": None, "pages": "pieces", "tiling": "fit", "dtype": "float64",
          "bytes": False}  # fmt: skip


# The options only topk-sparse reads, with their defaults: given to another algorithm, they are refused.
OWN = {"policy": "per-query", "index_block": 1, "q_block": 1, "workspace_tile": 64, "invalid_index": None,
       "indexer": None}  # fmt: skip


def refuse_own_options(args) -> None:
    """One line if an option of topk-sparse (:data:`OWN`) is given to another algorithm (never silently ignored)."""
    for name, default in OWN.items():
        if getattr(args, name, default) != default:
            raise InputError(f"--{name.replace('_', '-')}", "is read by topk-sparse (iosim run topk-sparse --indices "
                             f"...), not by {args.algorithm}", getattr(args, name))  # fmt: skip


def _check(args) -> None:
    from iosim.runner import registry

    if args.algorithm not in registry.INDEX_SCHEDULES:
        raise InputError("--indices", f"are read by {', '.join(registry.INDEX_SCHEDULES)} (iosim run topk-sparse "
                         "--indices ...), not by " + args.algorithm, args.indices)  # fmt: skip
    if args.indices is None:
        raise InputError("--indices", f"are needed by {args.algorithm}: file:PATH.npy or mod:FILE.py:NAME")
    for name, default in UNUSED.items():
        if getattr(args, name, default) != default:
            raise InputError(f"--{name.replace('_', '-')}", f"is not read by {args.algorithm} (the indices are the "
                             "selection; counts are per array, bytes always shown)", getattr(args, name))  # fmt: skip


def command(args) -> int:
    from iosim.runner import registry
    from iosim.spec.problem import Problem

    _check(args)
    p = problem_of(args) or Problem(N=args.N, d=args.d, causal=bool(args.causal))
    registry.index_schedule(args.algorithm)
    from iosim.masking.topk_sparse import topk_sparse

    count_only = bool(args.count_only or args.no_reference)
    if args.kv_format is not None:
        from iosim.spec.kv_format import kv_format

        kv_format(args.kv_format)
    r = topk_sparse(p, args.indices, policy=args.policy, block=args.index_block, q_block=args.q_block,
                    Bc=args.workspace_tile, M=args.M, count_only=count_only, seed=args.seed,
                    scale=args.scale, invalid=args.invalid_index, indexer=args.indexer)  # fmt: skip
    s = r.stats
    kv = kv_format_rows(p, {n: c.reads for n, c in s.per_array.items()}, args.kv_format) if args.kv_format else []
    floor_kv = r.floor["K"] + r.floor.get("V", 0)
    if args.json:
        out = {"algorithm": args.algorithm, "problem": p.as_dict(), "policy": r.policy, "block": r.block,
               "q_block": r.q_block, "programs": r.programs, "exact": r.exact, "peak": s.peak, "M": s.M,
               "words": r.words, "bytes": r.bytes, "predicted": {k: v.reads + v.writes for k, v in
                                                                   r.predicted.per_array.items()},
               "floor": r.floor, "errors": r.errors, "invalid_index": r.invalid, "indexer": r.indexer,
               "kv_format": {row[0]: row[1] for row in kv}}  # fmt: skip
        print(json.dumps(out, indent=2))
        return 0
    rows = [
        ["algorithm", args.algorithm],
        ["problem", str(p)],
        ["policy", r.policy],
        ["index block, query block", f"{r.block}, {r.q_block}"],
        *([["invalid index (selects no block)", str(r.invalid)]] if r.invalid is not None else []),
        *([["indexer H_I, d_I, keys per scoring program", ", ".join(map(str, r.indexer))]] if r.indexer else []),
        ["programs (thread blocks)", fmt_int(r.programs)],
        ["total", fmt_int(s.total)],
        [f"predicted total (io_model{' + indexer_closed_form' if r.indexer else ''})", fmt_int(r.predicted.total)],
        ["exact (per array and peak)", "yes" if r.exact else "NO"],
        ["peak / M", f"{s.peak} / {s.M}"],
        ["compulsory floor (selected keys once per KV head, Q, O)", fmt_int(r.floor_words)],
        ["K/V words read / their floor", f"{fmt_int(r.kv_words)} / {fmt_int(floor_kv)} = {r.kv_words / floor_kv:.2f}"],
        ["max abs error vs float64 (O)", fmt_err(r.errors.get("O"))],
        *kv,
    ]
    print(tabulate(rows, tablefmt=args.format))
    per = [[n, fmt_int(c.reads), fmt_int(c.writes), fmt_int(r.bytes[n])] for n, c in s.per_array.items()]
    print()
    print(tabulate(per, headers=["array", "reads", "writes", "bytes"], tablefmt=args.format,
                   colalign=("left", "right", "right", "right")))  # fmt: skip
    return 0
