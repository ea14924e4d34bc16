# ruff: noqa: N999 - numbered experiment scripts, loaded by file or by importlib
"""Experiment 12: MLA (DeepSeek-V2/V3, absorbed form) on every device of the devices table.

Question (an MLA bandwidth finding that was a 1.89x byte-count error): MLA decodes against one latent
cache per token, K = [c_KV, k_rope] (d_qk = 512 + 64 = 576) and V = c_KV (its first d_v = 512 columns), shared by
all H_q = 128 query heads (H_kv = 1). FlashMLA reads V from the resident K tile (``Share_KV``); a naive kernel
loads V separately. On each device (M = its shared memory per thread block in words of the cache dtype, bf16 and
fp8), which regime is it in (M against d_qk^2 = 576^2 = 331,776), and how far are the shared and naive schedules
from the compulsory floor (read Q, the latent once, write O)? flash2 forward, GQA packed (as FlashMLA packs the
128 heads), count-only, exact against io_model; B = 1, N_q = 1 (and N_q = 2, multi-token prediction), N_k = 32k.

Run: ``iosim experiments run mla``.
"""

from __future__ import annotations

import csv
from pathlib import Path

from iosim.experiments import runner
from iosim.experiments._common import Verdict

import iosim
from iosim import InputError, Problem

NAME = "mla"
TITLE = "MLA: shared latent vs naive K/V loads on every device"
CLAIM = (
    "Loading V separately instead of reading it from the resident latent K tile (FlashMLA's Share_KV) moves "
    "1 + d_v / d_qk = 1.89x the cache words per pass over the cache (the size of the published byte-count error), "
    "and its larger working set shrinks the tiles, so the cache is passed over more often."
)
DATA = Path(__file__).resolve().parent / "data" / "devices.csv"
DQK, DV, HQ = 576, 512, 128
DTYPES = {"bf16": 2, "fp8": 1}
FULL = {"N_k": 32768}
QUICK = {"N_k": 4096}


def devices() -> list[dict]:
    with open(DATA, newline="") as f:
        return list(csv.DictReader(f))


def measure(g) -> list[dict]:
    nk = g.N_k
    rows = []
    for dev in devices():
        for dt, nbytes in DTYPES.items():
            M = int(dev["smem_per_block_KiB"]) * 1024 // nbytes
            for nq in (1, 2):
                p = Problem(H_q=HQ, H_kv=1, N_q=nq, N_k=nk, d_qk=DQK, d_v=DV, latent=True, dtype_q=dt)
                rec = dict(device=dev["device"], dtype=dt, M=M, M_over_dqk2=M / DQK**2, N_q=nq, N_k=nk,
                           regime="large" if M >= DQK**2 else "small")  # fmt: skip
                floor = sum(p.compulsory().values())
                for mla in ("shared", "naive"):
                    try:
                        r = iosim.run(iosim.Schedule("flash2", gqa="packed", mla=mla), problem=p, M=M, count_only=True)
                    except InputError:
                        rec[f"{mla}_over_floor"] = None
                        rec[f"{mla}_tiling"] = "does not fit"
                        continue
                    rec[f"{mla}_exact"] = r.main.exact
                    rec[f"{mla}_total"] = r.stats.total
                    rec[f"{mla}_over_floor"] = r.stats.total / floor
                    rec[f"{mla}_tiling"] = str(r.tiling).replace("rule=", "")
                    rec[f"{mla}_bytes"] = r.total_bytes
                    passes = -(-(HQ * nq) // r.tiling.Br)  # row blocks of the packed rows: passes over the cache
                    kv = r.stats.per_array["K"].reads + (r.stats.per_array["V"].reads if mla == "naive" else 0)
                    rec[f"{mla}_passes"] = passes
                    rec[f"{mla}_cache_words_per_pass"] = kv / passes
                rec["exact"] = all(rec.get(f"{m}_exact", True) for m in ("shared", "naive"))
                rows.append(rec)
    return rows


def verdict(rows, g) -> runner.Summary:
    table = [
        [x["device"], x["dtype"], f"{x['M']:,}", f"{x['M_over_dqk2']:.3f}", x["regime"], str(x["N_q"]),
         "-" if x["shared_over_floor"] is None else f"{x['shared_over_floor']:.2f}",
         "-" if x["naive_over_floor"] is None else f"{x['naive_over_floor']:.2f}", x["shared_tiling"]]
        for x in rows
    ]  # fmt: skip
    ok = [x for x in rows if x["shared_over_floor"] is not None and x["naive_over_floor"] is not None]
    ratio = [x["naive_over_floor"] / x["shared_over_floor"] for x in ok if x["N_q"] == 1]
    per_pass = [x["naive_cache_words_per_pass"] / x["shared_cache_words_per_pass"] for x in ok]
    small = sorted({x["device"] for x in rows if x["regime"] == "small"})
    best_shared = min(x["shared_over_floor"] for x in ok)
    v = Verdict(
        NAME,
        CLAIM,
        measured=(
            f"naive / shared cache words per pass: {min(per_pass):.4f}-{max(per_pass):.4f}; "
            f"naive / shared total words at N_q = 1: {min(ratio):.2f}-{max(ratio):.2f}; "
            f"shared within {best_shared:.3f}x of the floor at best; every device is small-cache for MLA "
            f"(M < 576^2): {len(small)} of {len({x['device'] for x in rows})}"
        ),
        figure=f"1 + d_v/d_qk = {1 + DV / DQK:.3f}",
        holds=bool(per_pass) and all(abs(r - (1 + DV / DQK)) < 1e-12 for r in per_pass),
    )
    v.notes.append(
        "Even shared, the 128 packed heads need 128 (d_qk + d_v + 2) = 139,520 words for Q_i and O_i alone, more "
        "than any device's M: the row blocks hold fewer heads and the latent is read once per row block (FlashMLA "
        "likewise runs 64 rows per thread block, so 128 heads read the cache twice)."
    )
    v.notes.append(
        "M is the device's shared memory per thread block in words of the cache dtype (devices.csv); "
        "every device here has M < d_qk^2, so the papers' large-cache theorems do not apply to MLA decoding: only "
        "the compulsory floor does (iosim bounds)."
    )
    headers = ["device", "dtype", "M", "M/576^2", "regime", "N_q", "shared/floor", "naive/floor", "shared tiles"]
    table = [
        [*t, str(x.get("shared_passes", "-")), str(x.get("naive_passes", "-"))]
        for t, x in zip(table, rows, strict=True)
    ]
    headers += ["shared passes", "naive passes"]
    return runner.Summary(v, table, headers)


def plot(rows, g):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    sel = [x for x in rows if x["N_q"] == 1 and x["dtype"] == "bf16"]
    xs = range(len(sel))
    for k, (mla, colour) in enumerate((("shared", "tab:blue"), ("naive", "tab:red"))):
        ys = [x[f"{mla}_over_floor"] or 0 for x in sel]
        ax.bar([i + 0.4 * k for i in xs], ys, width=0.4, color=colour, label=mla)
    ax.set_xticks([i + 0.2 for i in xs], [x["device"] for x in sel], rotation=45, ha="right", fontsize=7)
    ax.axhline(1, color="k", lw=0.8)
    ax.set_ylabel("words / compulsory floor")
    ax.set_title("MLA decoding (d_qk 576, d_v 512, 128 heads packed, N_q 1), bf16 cache, M = shared memory per block")
    ax.legend()
    fig.tight_layout()
    return fig


main = runner.script(globals())  # python experiments/NN_x.py [--quick] [--out DIR]

if __name__ == "__main__":
    raise SystemExit(main())
