# ruff: noqa: N999 - numbered experiment scripts, loaded by file or by importlib
"""Experiment 09: real kernels against the model. Triton, Pallas and numba.cuda kernels counted on the CPU (their
interpreters and simulator: iosim.kernels), beside iosim's closed form of the schedule each implements and the
lower bound at the working set its block sizes imply.

Claim: a kernel that implements a schedule moves exactly that schedule's closed form, array by array
(FlashAttention-2 forward and backward in Triton, split-KV decoding, jax's Pallas TPU flash-attention op, iosim's
own numba.cuda kernel); a kernel that masks the causal upper triangle instead of skipping its blocks reads about
twice the closed form's K and V as N grows (1.78x in all at N = 1024 with 64 x 32 blocks); and the numerics of
every kernel are within ``iosim.check``'s bound of the float64 reference.

Run: ``iosim experiments run kernels`` (or ``python experiments/09_kernels.py``). Kernels: the Triton examples of
``iosim/kernels/examples`` at N = 128 .. 1024, d = 32, 64, blocks 32 x 32, 64 x 32, 64 x 64, causal and not;
Pallas at N = 256, 512; numba.cuda at N = 48 (the simulator is slow). ``--quick``: Triton only, small N.
"""

from __future__ import annotations

from pathlib import Path

from iosim.experiments import runner
from iosim.experiments._common import Verdict

from iosim.base.errors import install_hint

NAME = "kernels"
TITLE = "Real kernels against the model: counted on the CPU, beside the closed forms and bounds"
CLAIM = (
    "Kernels implementing flash2's schedule (Triton forward and backward, split-KV decode, Pallas TPU flash "
    "attention, iosim's numba.cuda kernel) move exactly its closed form per array; the masked (not skipped) causal "
    "kernel reads ~1.78x the closed form at N = 1024 (64 x 32 blocks); every kernel's outputs pass iosim.check."
)
NEEDS = ("plot",)  # the triton / pallas / cuda extras: a backend not installed is skipped and named
EXAMPLES = Path(__file__).resolve().parents[1] / "iosim" / "kernels" / "examples"
if not EXAMPLES.is_dir():  # installed: the examples ship inside the package
    import iosim.kernels

    EXAMPLES = Path(iosim.kernels.__file__).parent / "examples"


FULL: dict = {}
QUICK: dict = {}  # the job lists below depend only on quick (Triton only, small N)


def jobs(quick: bool) -> list[tuple[str, str, str, dict]]:
    """(backend, example file, like, params)."""
    out = []
    Ns = [128, 256] if quick else [128, 256, 512, 1024]
    blocks = [(64, 32)] if quick else [(32, 32), (64, 32), (64, 64)]
    ds = [32] if quick else [32, 64]
    for N in Ns:
        for d in ds:
            for Br, Bc in blocks:
                for causal in (False, True):
                    out.append(("triton", "triton_flash2", "flash2", dict(N=N, d=d, Br=Br, Bc=Bc, causal=causal)))
    for N in Ns if not quick else [256]:
        out.append(("triton", "triton_flash2_masked", "flash2", dict(N=N, d=64, Br=64, Bc=32, causal=True)))
    for N in [64, 128] if quick else [64, 128, 256]:
        out.append(("triton", "triton_flash2_bwd", "flash2-backward", dict(N=N, d=32, Br=32, Bc=32, causal=True)))
        out.append(("triton", "triton_flash2_bwd", "flash2-backward", dict(N=N, d=32, Br=32, Bc=32, causal=False)))
    for N, S in [(256, 4)] if quick else [(1024, 4), (1024, 16), (4096, 8)]:
        out.append(("triton", "triton_decode_splitkv", "decode-splitkv", dict(N=N, d=64, Bc=64, splits=S, H=2)))
    if not quick:
        for N, Br, Bc, causal in [(256, 128, 128, False), (512, 128, 128, True), (512, 64, 128, True)]:
            out.append(("pallas", "pallas_tpu_flash", "flash2", dict(N=N, d=64, Br=Br, Bc=Bc, causal=causal)))
        for N, Br, Bc, causal in [(256, 64, 64, False), (512, 64, 64, True), (512, 64, 32, True)]:
            out.append(("pallas", "pallas_gpu_mha", "flash2", dict(N=N, d=64, Br=Br, Bc=Bc, causal=causal)))
        for N, S in [(1024, 4), (1024, 8)]:
            out.append(("pallas", "pallas_gpu_decode", "decode-splitkv", dict(N=N, d=64, Bc=64, splits=S)))
        for causal in (False, True):
            out.append(("numba-cuda", "numba_cuda_flash2", "flash2", dict(N=48, d=8, Br=16, Bc=16, causal=causal)))
    return out


def _available(backend: str) -> bool:
    from iosim.base.errors import InputError
    from iosim.kernels.counting import require_extra

    try:
        require_extra(backend)
    except InputError:
        return False
    return True


def measure(g) -> list[dict]:
    """Every job of every installed backend; a backend whose extra is missing goes to ``g.skipped``."""
    from iosim.kernels import compare, count_batch

    rows = []
    todo = jobs(g.quick)
    for backend in ("triton", "pallas", "numba-cuda"):
        mine = [j for j in todo if j[0] == backend]
        if not mine:
            continue
        if not _available(backend):
            extra = "cuda" if backend == "numba-cuda" else backend
            g.skipped.append(f"{backend}: extra not installed ({install_hint(extra)})")
            continue
        batch = [(EXAMPLES / f"{f}.py", None, p) for _, f, _, p in mine]
        for (_, f, like, p), (counts, numbers, arrays) in zip(mine, count_batch(batch, backend), strict=True):
            cmp = compare(
                counts, like, p["N"], p["d"], p.get("Br"), p.get("Bc"), p.get("causal", False),
                heads=p.get("H", 1), splits=p.get("splits"), arrays=arrays, scale=numbers.get("scale"),
                dtype=numbers.get("dtype"),
            )  # fmt: skip
            inm = [r for r in cmp.rows if r.model_reads is not None]
            kernel_words = sum(r.reads + r.writes for r in inm)
            rows.append(
                {
                    "kernel": f, "backend": backend, "like": like, "N": p["N"], "d": p["d"], "Br": p.get("Br", ""),
                    "Bc": p.get("Bc", ""), "causal": p.get("causal", False), "splits": p.get("splits", ""),
                    "M": cmp.M, "counted": kernel_words, "closed_form": cmp.model_total,
                    "ratio": kernel_words / cmp.model_total, "lower_bound": cmp.lower_bound,
                    "over_bound": kernel_words / cmp.lower_bound, "equal": cmp.equal,
                    "equal_where_moved": cmp.equal_where_moved(),
                    "verdict": cmp.summary(),
                    "numerics_ok": cmp.numerics_ok, "programs": counts.programs, "seconds": round(counts.seconds, 3),
                }
            )  # fmt: skip
    return rows


def verdict(rows, g) -> runner.Summary:
    """Equal per array where the kernel implements the schedule; the masked kernel above it; numerics within
    check's bound."""
    if not rows:
        v = Verdict(NAME, CLAIM, measured="no backend installed", figure="0 runs", holds=None)
        v.notes += [f"not run: {s}" for s in g.skipped]
        return runner.Summary(v, [], ["kernel"])
    implements = [r for r in rows if r["kernel"] != "triton_flash2_masked"]
    pallas_square = [r for r in implements if r["backend"] != "pallas" or r["Br"] == r["Bc"]]
    masked = [r for r in rows if r["kernel"] == "triton_flash2_masked"]
    holds = (
        all(r["equal"] or (r["backend"] == "pallas" and r["equal_where_moved"]) for r in pallas_square)
        and all(r["ratio"] > 1 for r in masked)
        and all(r["numerics_ok"] is not False for r in rows)
    )
    biggest = max(masked, key=lambda r: r["N"]) if masked else None
    v = Verdict(
        NAME,
        CLAIM,
        measured=(
            f"{sum(r['equal'] for r in implements)} of {len(implements)} kernel runs equal to their closed form per "
            f"array; masked causal kernel at N = {biggest['N']}: {biggest['ratio']:.3f}x"
            if biggest
            else f"{sum(r['equal'] for r in implements)} of {len(implements)} kernel runs equal per array"
        ),
        figure=f"{len(rows)} runs; numerics within check's bound: {sum(r['numerics_ok'] is True for r in rows)}",
        holds=holds,
    )
    off = [r for r in implements if not r["equal"]]
    for r in off:
        v.notes.append(
            f"{r['kernel']} ({r['backend']}) N={r['N']} Br={r['Br']} Bc={r['Bc']} causal={r['causal']}: {r['verdict']}."
        )
    if any(r["backend"] == "pallas" for r in rows):
        v.notes.append(
            "Pallas TPU flash attention writes no L (no residuals in the forward). With Br < Bc under the causal mask "
            "it reads fewer K, V words than flash2's per-program closed form: consecutive row blocks ask for the "
            "same last key block, and the pipeline does not copy a block whose index did not change between grid "
            "steps, so K_j stays resident from one row block to the next."
        )
    v.notes += [f"not run: {s}" for s in g.skipped]
    table = [
        [r["kernel"], r["backend"], r["N"], r["d"], f"{r['Br']}x{r['Bc']}" if r["Br"] else r["Bc"], r["causal"],
         f"{r['counted']:,}", f"{r['closed_form']:,}", f"{r['ratio']:.3f}", f"{r['over_bound']:.2f}", r["verdict"],
         {True: "ok", False: "FAIL", None: "-"}[r["numerics_ok"]]]
        for r in rows
    ]  # fmt: skip
    headers = ["kernel", "backend", "N", "d", "blocks", "causal", "counted", "closed form", "ratio", "/ bound",
               "verdict", "numerics"]  # fmt: skip
    return runner.Summary(v, table, headers)


def plot(rows, g):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    groups: dict = {}
    for r in rows:
        key = (r["kernel"], r["backend"], r["causal"])
        groups.setdefault(key, []).append(r)
    for (kernel, backend, causal), rs in sorted(groups.items(), key=str):
        rs = sorted(rs, key=lambda r: r["N"])
        ax.plot([r["N"] for r in rs], [r["ratio"] for r in rs], "o-", label=f"{kernel} ({backend}){' causal' * causal}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N")
    ax.set_ylabel("counted words / closed form")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_title("Real kernels against the model (counted on the CPU)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


main = runner.script(globals())
if __name__ == "__main__":
    raise SystemExit(main())
