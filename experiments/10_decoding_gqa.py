# ruff: noqa: N999 - numbered experiment scripts, loaded by file or by importlib
"""Experiment 10: decoding I/O against the GQA group size g, per-head vs packed.

Question (issue 22; a Metal kernel library's fix): in decoding (N_q = 1 against a KV cache of N_k tokens) with
grouped-query heads, a kernel that runs every query head as its own problem reads K/V once per *query* head; one
that packs the g query heads of a group into the row dimension of one tile reads it once per KV head. By how much
do they differ, and where does packing stop helping? flash2 forward, count-only, exact against io_model: B = 1,
H_q = 32 query heads, H_kv = 32 / g, d = 128, M = 65,536 words (256 KiB of fp32), N_k from 4k to 1M, and, at
N_k = 32k, N_q = 1..64 query rows (speculative decoding / chunked prefill) to find where g N_q rows outgrow a row
block.

Run: ``iosim experiments run decoding-gqa`` (``--quick``: N_k up to 64k).
"""

from __future__ import annotations

import sys
from pathlib import Path

from iosim.experiments import _common
from iosim.experiments._common import Verdict

import iosim
from iosim import Problem

NAME = "decoding-gqa"
TITLE = "Decoding I/O against the GQA group size: per-head vs packed"
CLAIM = (
    "At N_q = 1 a per-head GQA schedule moves g times the K/V words of a packed one (K/V read once per query head "
    "instead of once per KV head); packing stays at the compulsory floor until g N_q rows outgrow a row block."
)
NEEDS = ("plot",)
H_Q, D, M = 32, 128, 65536
GROUPS = (1, 2, 4, 8, 16, 32)


def run(out: Path, quick: bool = False) -> Verdict:
    nks = [4096, 16384, 65536] if quick else [4096, 16384, 65536, 262144, 1048576]
    rows = []
    for nk in nks:
        for g in GROUPS:
            p = Problem(H_q=H_Q, H_kv=H_Q // g, N_q=1, N_k=nk, d=D)
            for gqa in ("per-head", "packed"):
                r = iosim.run("flash2", problem=p, M=M, gqa=gqa, count_only=True, allow_long=True)
                assert r.main.exact
                floor = sum(p.compulsory().values())
                kv = r.stats.per_array["K"].reads + r.stats.per_array["V"].reads
                rows.append(dict(N_q=1, N_k=nk, g=g, gqa=gqa, tiling=str(r.tiling), total=r.stats.total,
                                 kv_words=kv, floor=floor, over_floor=r.stats.total / floor,
                                 bytes_bf16=2 * r.stats.total))  # fmt: skip
    nqs = [1, 2, 4, 8, 16, 32, 64]
    for nq in nqs:
        g = 8
        p = Problem(H_q=H_Q, H_kv=H_Q // g, N_q=nq, N_k=32768, d=D)
        for gqa in ("per-head", "packed"):
            r = iosim.run("flash2", problem=p, M=M, gqa=gqa, count_only=True)
            assert r.main.exact
            floor = sum(p.compulsory().values())
            rows.append(dict(N_q=nq, N_k=32768, g=g, gqa=gqa, tiling=str(r.tiling), total=r.stats.total,
                             kv_words=r.stats.per_array["K"].reads + r.stats.per_array["V"].reads, floor=floor,
                             over_floor=r.stats.total / floor, bytes_bf16=2 * r.stats.total))  # fmt: skip

    def get(nq, nk, g, gqa):
        return next(x for x in rows if (x["N_q"], x["N_k"], x["g"], x["gqa"]) == (nq, nk, g, gqa))

    ratios = {
        (nk, g): get(1, nk, g, "per-head")["kv_words"] / get(1, nk, g, "packed")["kv_words"]
        for nk in nks
        for g in GROUPS
    }
    factor_g = all(abs(v - g) < 1e-9 for (nk, g), v in ratios.items())
    packed_floor = max(get(1, nk, g, "packed")["over_floor"] for nk in nks for g in GROUPS)
    stop = [x for x in rows if x["N_k"] == 32768 and x["gqa"] == "packed" and x["N_q"] in nqs and x["g"] == 8]
    first_over = next((x for x in stop if x["over_floor"] > 1.01), None)
    table = [[str(nk), str(g), f"{get(1, nk, g, 'per-head')['over_floor']:.2f}",
              f"{get(1, nk, g, 'packed')['over_floor']:.3f}", f"{ratios[(nk, g)]:.0f}"]
             for nk in nks for g in GROUPS]  # fmt: skip
    v = Verdict(
        NAME,
        CLAIM,
        measured=(
            f"per-head / packed K/V words = g exactly at every N_k ({len(ratios)} points); packed within "
            f"{packed_floor:.4f}x of the compulsory floor at N_q = 1"
        ),
        figure=(
            "packing stops reaching the floor at g N_q = "
            + (f"{8 * first_over['N_q']} rows ({first_over['tiling']})" if first_over else "never in the range")
        ),
        holds=factor_g and packed_floor < 1.01,
    )
    v.notes.append(
        "N_k = 32,768, g = 8: packed/floor = "
        + ", ".join(f"N_q={x['N_q']}: {x['over_floor']:.2f}" for x in stop)
        + ". Beyond one row block of g N_q rows the K/V tiles are loaded once per row block: the packed schedule "
        "costs ceil(g N_q / B_r) K/V passes, the per-head one g ceil(N_q / B_r)."
    )
    return _common.write_outputs(
        out, "10_decoding_gqa", rows, table, ["N_k", "g", "per-head/floor", "packed/floor", "per-head/packed K/V"], v,
        fig=_plot(rows, nks),
    )  # fmt: skip


def _plot(rows, nks):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for nk in nks:
        for gqa, ls in (("per-head", "-"), ("packed", "--")):
            sel = [x for x in rows if x["N_k"] == nk and x["gqa"] == gqa and x["N_q"] == 1]
            a.plot([x["g"] for x in sel], [x["over_floor"] for x in sel], ls=ls, marker="o", label=f"{gqa}, N_k={nk}")
    a.set_xscale("log", base=2)
    a.set_yscale("log", base=2)
    a.set_xlabel("group size g = H_q / H_kv")
    a.set_ylabel("words / compulsory floor")
    a.set_title("decoding, N_q = 1, H_q = 32, d = 128")
    a.legend(fontsize=6)
    for gqa, ls in (("per-head", "-"), ("packed", "--")):
        sel = [x for x in rows if x["N_k"] == 32768 and x["gqa"] == gqa and x["g"] == 8]
        b.plot([x["N_q"] for x in sel], [x["over_floor"] for x in sel], ls=ls, marker="o", label=gqa)
    b.set_xscale("log", base=2)
    b.set_xlabel("N_q (g = 8, N_k = 32k)")
    b.set_title("where packing stops helping")
    b.legend()
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    return _common.script_main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
