# ruff: noqa: N999 - numbered experiment scripts, loaded by file or by importlib
"""Experiment 10: decoding I/O against the GQA group size g, per-head vs packed.

Question (a Metal kernel library's fix): in decoding (N_q = 1 against a KV cache of N_k tokens) with
grouped-query heads, a kernel that runs every query head as its own problem reads K/V once per *query* head; one
that packs the g query heads of a group into the row dimension of one tile reads it once per KV head. By how much
do they differ, and where does packing stop helping? flash2 forward, count-only, exact against io_model: B = 1,
H_q = 32 query heads, H_kv = 32 / g, d = 128, M = 65,536 words (256 KiB of fp32), N_k from 4k to 1M, and, at
N_k = 32k, N_q = 1..64 query rows (speculative decoding / chunked prefill) to find where g N_q rows outgrow a row
block.

Run: ``iosim experiments run decoding-gqa`` (``--quick``: N_k up to 64k; ``--M`` sets M).
"""

from __future__ import annotations

from iosim.experiments import runner
from iosim.experiments._common import Verdict

import iosim
from iosim import Problem

NAME = "decoding-gqa"
TITLE = "Decoding I/O against the GQA group size: per-head vs packed"
CLAIM = (
    "At N_q = 1 a per-head GQA schedule moves g times the K/V words of a packed one (K/V read once per query head "
    "instead of once per KV head); packing stays at the compulsory floor until g N_q rows outgrow a row block."
)
H_Q, D = 32, 128
GROUPS = (1, 2, 4, 8, 16, 32)
FULL = {"M": 65536, "Nks": [4096, 16384, 65536, 262144, 1048576], "Nqs": [1, 2, 4, 8, 16, 32, 64], "Nk_q": 32768}
QUICK = {"M": 65536, "Nks": [4096, 16384, 65536], "Nqs": [1, 4, 16, 64], "Nk_q": 32768}


def _row(p, r, **extra) -> dict:
    floor = sum(p.compulsory().values())
    kv = r.stats.per_array["K"].reads + r.stats.per_array["V"].reads
    return dict(**extra, tiling=str(r.tiling), total=r.stats.total, kv_words=kv, floor=floor,
                over_floor=r.stats.total / floor, bytes_bf16=2 * r.stats.total, exact=r.main.exact)  # fmt: skip


def measure(g) -> list[dict]:
    rows = []
    for nk in g.Nks:
        for grp in GROUPS:
            p = Problem(H_q=H_Q, H_kv=H_Q // grp, N_q=1, N_k=nk, d=D)
            for gqa in ("per-head", "packed"):
                r = iosim.run(iosim.Schedule("flash2", gqa=gqa), problem=p, M=g.M, count_only=True, allow_long=True)
                rows.append(_row(p, r, N_q=1, N_k=nk, g=grp, gqa=gqa))
    for nq in g.Nqs:
        p = Problem(H_q=H_Q, H_kv=H_Q // 8, N_q=nq, N_k=g.Nk_q, d=D)
        for gqa in ("per-head", "packed"):
            r = iosim.run(iosim.Schedule("flash2", gqa=gqa), problem=p, M=g.M, count_only=True)
            rows.append(_row(p, r, N_q=nq, N_k=g.Nk_q, g=8, gqa=gqa))
    return rows


def verdict(rows, g) -> runner.Summary:
    def get(nq, nk, grp, gqa):
        return next(x for x in rows if (x["N_q"], x["N_k"], x["g"], x["gqa"]) == (nq, nk, grp, gqa))

    ratios = {(nk, grp): get(1, nk, grp, "per-head")["kv_words"] / get(1, nk, grp, "packed")["kv_words"]
              for nk in g.Nks for grp in GROUPS}  # fmt: skip
    factor_g = all(abs(v - grp) < 1e-9 for (nk, grp), v in ratios.items())
    packed_floor = max(get(1, nk, grp, "packed")["over_floor"] for nk in g.Nks for grp in GROUPS)
    stop = [x for x in rows if x["N_k"] == g.Nk_q and x["gqa"] == "packed" and x["g"] == 8 and x["N_q"] in g.Nqs]
    stop = sorted({x["N_q"]: x for x in stop}.values(), key=lambda x: x["N_q"])
    first_over = next((x for x in stop if x["over_floor"] > 1.01), None)
    table = [[str(nk), str(grp), f"{get(1, nk, grp, 'per-head')['over_floor']:.2f}",
              f"{get(1, nk, grp, 'packed')['over_floor']:.3f}", f"{ratios[(nk, grp)]:.0f}"]
             for nk in g.Nks for grp in GROUPS]  # fmt: skip
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
        f"N_k = {g.Nk_q:,}, g = 8, M = {g.M:,}: packed/floor = "
        + ", ".join(f"N_q={x['N_q']}: {x['over_floor']:.2f}" for x in stop)
        + ". Beyond one row block of g N_q rows the K/V tiles are loaded once per row block: the packed schedule "
        "costs ceil(g N_q / B_r) K/V passes, the per-head one g ceil(N_q / B_r)."
    )
    headers = ["N_k", "g", "per-head/floor", "packed/floor", "per-head/packed K/V"]
    return runner.Summary(v, table, headers)


def plot(rows, g):
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for nk in g.Nks:
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
        sel = [x for x in rows if x["N_k"] == g.Nk_q and x["gqa"] == gqa and x["g"] == 8 and x["N_q"] in g.Nqs]
        sel = sorted({x["N_q"]: x for x in sel}.values(), key=lambda x: x["N_q"])
        b.plot([x["N_q"] for x in sel], [x["over_floor"] for x in sel], ls=ls, marker="o", label=gqa)
    b.set_xscale("log", base=2)
    b.set_xlabel(f"N_q (g = 8, N_k = {g.Nk_q})")
    b.set_title("where packing stops helping")
    b.legend()
    fig.tight_layout()
    return fig


main = runner.script(globals())  # python experiments/NN_x.py [--quick] [--out DIR]

if __name__ == "__main__":
    raise SystemExit(main())
