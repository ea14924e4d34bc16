# ruff: noqa: N999 - numbered experiment scripts, loaded by file or by importlib
"""Experiment 11: split-KV (Flash-Decoding): the I/O cost of parallelism, in words.

Question: Flash-Decoding splits the keys of a decoding query into s chunks so that B H_kv T_r thread
blocks become s times as many and fill the GPU's SMs; each split writes a partial O (d_v per query row, fp32) and
its logsumexp, and a combine step reads them back. What does that cost, exactly, against the parallelism it buys?
flash2 forward, count-only, exact against io_model: H_q = 32, H_kv = 8 (GQA packed), N_q = 1, d = 128,
M = 65,536 words; N_k in {4k, 32k, 256k}, B in {1, 4, 16}, s = 1..64. The SM count is a parameter, 132 by default:
NVIDIA H100 SXM5 (the H100 datasheet / CUDA device query: 132 SMs); experiments/data/devices.csv will carry an
``sms`` column later.

Run: ``iosim experiments run split-kv`` (``--quick``: fewer points).
"""

from __future__ import annotations

import math

from iosim.experiments import runner
from iosim.experiments._common import Verdict

import iosim
from iosim import Problem

NAME = "split-kv"
TITLE = "Split-KV: I/O and thread blocks against the number of splits"
CLAIM = (
    "Split-KV costs exactly (s' - 1) Q re-reads (s' <= s splits hold a key block) plus 2 s (d_v + 1) words per "
    "query row (partials written and read back) beside the O, L it replaces, a small fraction of the K/V traffic "
    "at long N_k, and it multiplies the thread blocks by s: the smallest s that fills the SMs is "
    "ceil(SMs / (B H_kv T_r))."
)
H_Q, H_KV, D = 32, 8, 128
SMS = 132  # NVIDIA H100 SXM5: 132 SMs (H100 datasheet; CUDA deviceQuery multiProcessorCount); --sms sets it
FULL = {"M": 65536, "sms": SMS, "Nks": [4096, 32768, 262144], "batches": [1, 4, 16], "splits": [1, 2, 4, 8, 16, 32, 64]}
QUICK = {"M": 65536, "sms": SMS, "Nks": [4096, 32768], "batches": [1, 16], "splits": [1, 2, 4, 8, 16, 32, 64]}


def measure(g) -> list[dict]:
    rows = []
    for nk in g.Nks:
        for b in g.batches:
            p = Problem(B=b, H_q=H_Q, H_kv=H_KV, N_q=1, N_k=nk, d=D)
            base = None
            for s in g.splits:
                r = iosim.run(iosim.Schedule("flash2", gqa="packed", splits=s), problem=p, M=g.M, count_only=True)
                R = b * H_Q  # query rows of the problem
                total = r.stats.total
                base = total if s == 1 else base
                tc = -(-nk // r.tiling.Bc)
                active = -(-tc // -(-tc // s))  # splits that hold a column block (s > T_c leaves some empty)
                formula = (active - 1) * R * D + 2 * s * R * (D + 1) if s > 1 else 0
                main_blocks = b * H_KV * s  # T_r = 1: the g N_q = 4 packed rows fit one row block
                rows.append(dict(N_k=nk, B=b, s=s, total=total, extra_words=total - base, formula=formula,
                                 extra_fraction=(total - base) / base, main_blocks=main_blocks,
                                 thread_blocks=r.schedule["thread_blocks"], sm_fill=min(1.0, main_blocks / g.sms),
                                 tiling=str(r.tiling), exact=r.main.exact))  # fmt: skip
    return rows


def verdict(rows, g) -> runner.Summary:
    exact_formula = all(x["extra_words"] == x["formula"] for x in rows)
    table = []
    for nk in g.Nks:
        for b in g.batches:
            s_star = math.ceil(g.sms / (b * H_KV))
            cand = [x for x in rows if x["N_k"] == nk and x["B"] == b and x["s"] >= s_star]
            x = cand[0] if cand else rows[-1]
            table.append([f"{nk:,}", str(b), str(s_star), str(x["s"]), f"{x['main_blocks']}", f"{x['extra_words']:,}",
                          f"{100 * x['extra_fraction']:.3f}%"])  # fmt: skip
    worst_long = max(x["extra_fraction"] for x in rows if x["N_k"] == max(g.Nks))
    v = Verdict(
        NAME,
        CLAIM,
        measured=(
            f"extra words = (s'-1) B H_q d_qk + 2 s B H_q (d_v + 1) on every point "
            f"({'yes' if exact_formula else 'NO'}); at N_k = {max(g.Nks):,} the extra is at most "
            f"{100 * worst_long:.3f}% of the s = 1 traffic up to s = {max(g.splits)}"
        ),
        figure=f"SMs = {g.sms} (H100 SXM5 by default); s* = ceil(SMs / (B H_kv)) fills them",
        holds=exact_formula,
    )
    v.notes.append(
        "The combine step is counted as part of the schedule (one block of rows that fits M at a time): it reads the "
        "s logsumexps of a row as one tile and the s partial outputs one after another."
    )
    headers = ["N_k", "B", "s* (fills SMs)", "s run", "main blocks", "extra words", "extra / s=1"]
    return runner.Summary(v, table, headers)


def plot(rows, g):
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for nk in g.Nks:
        for bb in g.batches:
            sel = [x for x in rows if x["N_k"] == nk and x["B"] == bb and x["s"] > 1]
            a.plot([x["s"] for x in sel], [x["extra_fraction"] for x in sel], marker="o", label=f"N_k={nk}, B={bb}")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("splits s")
    a.set_ylabel("extra words / words at s = 1")
    a.legend(fontsize=6)
    for bb in g.batches:
        sel = [x for x in rows if x["N_k"] == g.Nks[0] and x["B"] == bb]
        b.plot([x["s"] for x in sel], [x["main_blocks"] for x in sel], marker="o", label=f"B={bb}")
    b.axhline(g.sms, color="k", lw=0.8, ls="--", label=f"{g.sms} SMs")
    b.set_xscale("log", base=2)
    b.set_yscale("log", base=2)
    b.set_xlabel("splits s")
    b.set_ylabel("thread blocks of the main kernel")
    b.legend(fontsize=7)
    fig.suptitle("Split-KV (Flash-Decoding), H_q = 32, H_kv = 8 packed, N_q = 1, d = 128")
    fig.tight_layout()
    return fig


main = runner.script(globals())  # python experiments/NN_x.py [--quick] [--out DIR] [--sms N]

if __name__ == "__main__":
    raise SystemExit(main())
