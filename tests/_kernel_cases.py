"""Count many kernel launches in one process (the backend's mode on): ``python tests/_kernel_cases.py triton``.

Started by tests/test_kernels_triton.py with TRITON_INTERPRET=1 set, so that torch and triton are imported once
for all the cases (a process per case would spend most of the test time importing them). Prints one JSON line per
case: the case, the comparison's verdicts and the numerics.
"""

from __future__ import annotations

import json
import sys


def cases(backend: str):
    if backend == "triton":
        for N, d, Br, Bc, causal in [
            (1, 16, 64, 32, False), (17, 16, 16, 16, True), (113, 59, 32, 16, False), (113, 59, 32, 16, True),
            (203, 64, 64, 32, False), (203, 64, 64, 32, True), (256, 64, 64, 32, True), (130, 16, 16, 64, True),
        ]:  # fmt: skip
            yield "triton_flash2", "flash2", dict(N=N, d=d, Br=Br, Bc=Bc, causal=causal)
        yield "triton_flash2", "flash2", dict(N=64, d=16, Br=16, Bc=16, causal=True, H=3)
        yield "triton_flash2_masked", "flash2", dict(N=256, d=64, Br=64, Bc=32, causal=True)
        yield "triton_flash2_masked", "flash2", dict(N=256, d=64, Br=64, Bc=32, causal=False)
        for N, d, Br, Bc, causal in [(100, 32, 32, 32, False), (113, 17, 16, 32, True), (64, 16, 32, 16, True)]:
            yield "triton_flash2_bwd", "flash2-backward", dict(N=N, d=d, Br=Br, Bc=Bc, causal=causal)
        for N, d, Bc, S, H in [(1000, 40, 32, 4, 2), (77, 16, 16, 3, 1), (5, 8, 16, 2, 1)]:
            yield "triton_decode_splitkv", "decode-splitkv", dict(N=N, d=d, Bc=Bc, splits=S, H=H)
    elif backend == "pallas":
        for N, d, Br, Bc, causal in [(256, 32, 128, 128, False), (256, 32, 128, 128, True), (256, 64, 64, 128, True)]:
            yield "pallas_tpu_flash", "flash2", dict(N=N, d=d, Br=Br, Bc=Bc, causal=causal)


def main(backend: str) -> int:
    import importlib

    from iosim.kernels import compare, count
    from iosim.kernels.counting import backend_module

    mod = backend_module(backend)
    for file, like, p in cases(backend):
        launcher = importlib.import_module(f"iosim.kernels.examples.{file}").launch
        counts, out = count(lambda launcher=launcher, p=p: launcher(**p), backend)
        arrays = {k: mod.to_numpy(v) for k, v in out.items() if not isinstance(v, (int, float, bool, str, dict))}
        dtype = str(getattr(out["Q"], "dtype", "float32")).removeprefix("torch.")
        cmp = compare(counts, like, p["N"], p["d"], p.get("Br"), p.get("Bc"), p.get("causal", False),
                      heads=p.get("H", 1), splits=p.get("splits"), arrays=arrays, scale=out.get("scale"),
                      dtype=dtype, layout=out.get("layout"), logsumexp=out.get("logsumexp"))  # fmt: skip
        rows = {r.array: [r.reads, r.writes, r.model_reads, r.model_writes, r.distinct_reads] for r in cmp.rows}
        print(json.dumps({"file": file, "like": like, "params": p, "rows": rows, "equal": cmp.equal,
                          "equal_where_moved": cmp.equal_where_moved(), "numerics": cmp.numerics,
                          "programs": counts.programs, "launches": counts.launches,
                          "seconds": counts.seconds}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
