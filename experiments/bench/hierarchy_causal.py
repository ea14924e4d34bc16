"""The causal forward's gap, hypothesis by hypothesis (a modelled mechanism, or open with the hypotheses ruled out):
FlashAttention-2's causal forward (PyTorch SDPA, fp16, B = 1, H = 32, N = 32,768, d = 128, Br = 128, Bc = 64) read
5,742 MB of DRAM on an H100 and 2,630 MB on an H200; the hierarchy with every mechanism (kernel bytes, two L2
partitions, 2 CTAs per SM from the binary's 255 registers, FA2's descending walk in FA2's grid order) predicts 2,309
MB and 815 MB. Each hypothesis below changes one thing of that model, with the value a source gives it or, where no
source gives one, over a band with nothing chosen; nothing is fitted to the measurements.

The source (FlashAttention-2 as PyTorch 2.11 vendors it: ``pytorch_flash::flash_fwd_kernel``, whose template
arguments Nsight Compute stored, ``..., 0, 1, 0, 0, 1, 1, 0, 0>``: Is_dropout, Is_causal, Is_local, Has_alibi,
Is_even_MN, Is_even_K, Is_softcap, Return_softmax, the layout of github.com/Dao-AILab/flash-attention@0251105a,
csrc/flash_attn/src/):

* flash_fwd_launch_template.h, run_flash_fwd, lines 63-64: ``num_m_block = ceil(seqlen_q / kBlockM)``, ``dim3
  grid(num_m_block, params.b, params.h)``; Nsight stored the grid as (256, 1, 32), 8,192 CTAs on 264 resident slots:
  not persistent;
* flash_fwd_kernel.h, compute_attn, lines 1084-1088: ``m_block = blockIdx.x``, ``bidb = blockIdx.y``, ``bidh =
  blockIdx.z``: the row block ascends fastest, then the batch, then the head (the model's ``head-grouped`` order);
* compute_attn_1rowblock, lines 91-94: causal ``n_block_max = min(ceil(N / kBlockN), ceil((m_block + 1) kBlockM /
  kBlockN))``: row block i reads column blocks 0..2i+1 and skips the rest (the model's causal schedule: its global
  loads equal the measured 69,256 MB to the byte);
* lines 274, 309, 341-344, 385: ``n_block = n_block_max - 1``, the masking steps and the main loop count it down, V_j
  then K_(j-1) prefetched inside each iteration: the request stream Q_i, K_max, V_max, K_max-1, ... , V_0 (the
  model's ``descending`` walk).

Beside the DRAM read, each run's launch time on the model's clock, causal over non-causal under the same stalls
(:func:`noncausal_end`), is held against the measured durations' ratio (:func:`measured_durations`); and one row is
an estimate outside the model (:func:`probe_estimate`: the H200 probe's measured miss curve on the model's LRU reuse
profile from the capacity scan).

Run: ``python experiments/bench/hierarchy_causal.py compute`` (every variant not stored yet, stored after each run:
10-12 s a full-size causal run on this machine, ``home_lines = 1`` 2 minutes, 60 runs in 14 minutes; ``--only KEY ...``
reruns those), ``... table [--write]`` (the docs block from the stored runs, written between the markers in
docs/hierarchy-hardware.md).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hierarchy_h100 as h100  # noqa: E402

STORED = HERE / "gpu_h100" / "hierarchy-causal.json"
BLOCK = ("<!-- hierarchy-causal -->", "<!-- /hierarchy-causal -->")
LAUNCH = "forward causal"
MB = 1e6
MIB = 1 << 20
WORD_BYTES = 2  # fp16: the L2's C is given in words of 2 bytes
ITER = 2 * 64 * 128  # words one iteration of the column loop moves (K_j and V_j, Bc x d each): the stalls' unit
BAND = "a band, nothing chosen"
CLOSE = 0.15  # a variant closes the gap when measured / predicted is within 15 % of 1 (the goal)
TIME = 0.05  # a variant agrees with the durations when its causal / non-causal time is within 5 % of the measured
RANK = ("explains", "closes only at an unsourced value", "narrows", "ruled out", "excluded by the durations")
NARROW = 0.9  # it narrows the gap when |log(measured / predicted)| falls below 0.9 of the source model's
# FA2's causal forward's stack frame (gpu_h100/fa2-resources.json, from PyTorch's binary) and its resident CTAs
STACK_BYTES, THREADS, CTAS_PER_SM = 136, 128, 2


@dataclass(frozen=True)
class Variant:
    """One run of the model: the source model (every mechanism at 2 CTAs per SM) with one thing changed."""

    key: str
    hyp: str
    what: str
    source: str
    device: str = "H100"
    heads: int = 32
    home_lines: int = h100.HOME_LINES
    far_copy: str = "both"
    l2_bytes: int | None = None  # None: the preset's
    l2_less_per_partition: int = 0  # bytes of each partition held by something else
    sectors: bool = False
    stall: int = 0  # iterations (ITER words): each CTA waits a random 0..stall before its first request
    seed: int = 0
    start: int = 0  # iterations: every CTA waits exactly this long before its first request
    causal: bool = True  # False: the non-causal forward (5e's check of 5d's estimate)
    N: int = 32768  # the measured launch's; other sizes for the predictions of the next lease (hierarchy_next.py)

    @property
    def baseline(self) -> str:
        """The key of the source model this variant is compared with (same device, same problem size)."""
        if not self.causal:
            return "nc-l2-50MiB"
        return "scaled-source" if self.heads != 32 else f"source-{self.device}"


SRC = "flash_fwd_launch_template.h 63-64, flash_fwd_kernel.h 91-94, 274, 385, 1084-1088; grid (256, 1, 32)"
FRAME = (f"{STACK_BYTES} B stack frame x {THREADS} threads x {CTAS_PER_SM} CTAs per SM (gpu_h100/fa2-resources.json), "
         "placed as far_copy=both places a line: written at its home, read by its SM")  # fmt: skip


def _frame_bytes(sms: int) -> int:
    return STACK_BYTES * THREADS * CTAS_PER_SM * sms


HYPOTHESES = {
    "1": "FA2's grid order and m_block, its column walk (the source)",
    "2a": "CTAs not in lock-step: a random stall before each CTA",
    "2b": "a fixed start-up time per CTA (launch, prologue)",
    "3": "the partitions' address hash: runs of home_lines lines",
    "4": "where a line read from the far partition is kept",
    "5a": "the L2 shared with the spilled stack frames",
    "5b": "32-byte sector fills",
    "5c": "the L2 capacity the model would need",
    "5d": "the L2 is not LRU: the H200 probe's miss curve on the model's reuse profile (an estimate, not a run)",
    "5e": "5d's estimate on the non-causal forward, which the model matches (a check of the estimate)",
}
NC_SCAN_MIB = (20, 30, 40, 45, 50, 55, 60, 70)  # the non-causal forward's L2 sizes (50 MiB: its source model)
SCAN_MIB = (25, 30, 35, 40, 42, 45, 48, 52, 55, 57, 60, 65, 70)  # the L2 sizes of 5c (50 MiB: the source model)
PROBE = HERE / "gpu_h200_2" / "predictions.json"  # the second H200 lease: the probe at 8 to 96 MiB
PROBE_SOURCE = "the H200's probe, read twice at 8-96 MiB (gpu_h200_2/predictions.json): not this launch"


def variants() -> list[Variant]:
    """Every run, grouped by hypothesis."""
    v = [
        Variant("source-H100", "1", "as FA2 launches it: head-grouped, descending, 2 CTAs/SM", SRC),
        Variant("source-H200", "1", "as FA2 launches it: head-grouped, descending, 2 CTAs/SM", SRC, device="H200"),
    ]
    for w in (1, 4, 16, 64, 256, 512):
        v.append(Variant(f"stall-{w}", "2a", f"stall 0..{w} iterations, seed 0", BAND, stall=w))
    for w in (16, 64, 256):
        v.append(Variant(f"stall-{w}-seed1", "2a", f"stall 0..{w} iterations, seed 1", BAND, stall=w, seed=1))
        v.append(Variant(f"stall-{w}-H200", "2a", f"stall 0..{w} iterations, seed 0", BAND, device="H200", stall=w))
    for s in (1, 4, 16, 64):
        v.append(Variant(f"start-{s}", "2b", f"every CTA starts {s} iterations late", BAND, start=s))
    v.append(Variant("start-4-H200", "2b", "every CTA starts 4 iterations late", BAND, device="H200", start=4))
    for hl in (1, 4, 64):
        v.append(Variant(f"home-{hl}", "3", f"home_lines {hl}", BAND, home_lines=hl))
    for hl in (1, 4, 16, 64):
        key = "scaled-source" if hl == 16 else f"scaled-home-{hl}"
        v.append(Variant(key, "3", f"H = 8: home_lines {hl}", BAND, heads=8, home_lines=hl))
    for fc in ("near", "home", "shared"):
        for dev in ("H100", "H200"):
            v.append(Variant(f"far-{fc}-{dev}", "4", f"far_copy={fc}", "NVIDIA does not publish it: each named "
                             "placement", device=dev, far_copy=fc))  # fmt: skip
    frames = ((66, "its own SMs' frames", BAND), (99, "its SMs' frames and the far SMs' frames it homes", FRAME),
              (132, "every SM's frames", BAND))  # fmt: skip
    for dev in ("H100", "H200"):
        for sms, what, source in frames:
            v.append(Variant(f"frames-{sms}-{dev}", "5a", f"each partition less {what} ({_frame_bytes(sms) / MB:.2f} "
                             "MB)", source, device=dev, l2_less_per_partition=_frame_bytes(sms)))  # fmt: skip
    v.append(Variant("sectors", "5b", "sector_bytes = 32", "the H100 preset (Nsight's memory tables)", sectors=True))
    for mib in SCAN_MIB:
        v.append(Variant(f"l2-{mib}MiB", "5c", f"L2 of {mib} MiB (two of {mib / 2:g})", BAND, l2_bytes=mib * MIB))
    for mib in NC_SCAN_MIB:
        v.append(Variant(f"nc-l2-{mib}MiB", "5e", f"non-causal, L2 of {mib} MiB", BAND, l2_bytes=mib * MIB,
                         causal=False))  # fmt: skip
    return v


class FixedStart:
    """A scheduler that plans each launch as ``base`` does (its order and walk), then holds every CTA ``words`` of
    idle time before its first request: a start-up time per CTA that the word clock does not see (the launch, the
    prologue's latency). The first wave starts together, so only the dispatches after a CTA finishes shift."""

    def __init__(self, base, words: int):
        self.base, self.words = base, int(words)

    def plan(self, launch_index, blocks, cut, declared, slots=None):
        ordered, request_order, _, static = self.base.plan(launch_index, blocks, cut, declared, slots=slots)
        return ordered, request_order, np.full(len(ordered), self.words, np.int64), static


def problem(heads: int = 32, causal: bool = True, N: int = 32768):  # noqa: N803
    """The launch's problem: the measured one (32 heads, N = 32,768), or a scaled one with fewer heads (each head as
    measured) or another N."""
    from iosim import Problem

    return Problem(B=1, H_q=heads, N=N, d=128, dtype_q="fp16", causal=causal)


def _launch(v: Variant) -> str:
    return LAUNCH if v.causal else "forward"


def machine(v: Variant):
    """The variant's machine: the preset's SMs and L2 in two partitions, the kernel's resident CTAs from its
    registers (hierarchy_h100.main_kernel_resources), and what the variant changes."""
    from iosim.hierarchy import Machine
    from iosim.hierarchy import device as preset

    total = v.l2_bytes if v.l2_bytes is not None else preset(v.device).l2_bytes
    total -= 2 * v.l2_less_per_partition
    kernel = h100.main_kernel_resources(_launch(v))
    return Machine(v.device, C=total // WORD_BYTES, partitions=2, home_lines=v.home_lines, far_copy=v.far_copy,
                   sector_bytes="device" if v.sectors else None, kernel=kernel)  # fmt: skip


def scheduler(v: Variant):
    """FA2's order and walk (head-grouped, descending), with the variant's stalls or start-up time."""
    from iosim.hierarchy.scheduler import Scheduler

    base = Scheduler(order="head-grouped", walk="descending", stall=v.stall * ITER, seed=v.seed)
    return FixedStart(base, v.start * ITER) if v.start else base


def run(v: Variant):
    """The hierarchy's result for one variant (fp16 words: the L2's C in words is its bytes over 2)."""
    from iosim import Schedule
    from iosim.hierarchy.simulate import hierarchy

    spec = h100.LAUNCHES[_launch(v)]
    return hierarchy(Schedule("flash2", Br=spec["Br"], Bc=spec["Bc"]), problem=problem(v.heads, v.causal, v.N),
                     M=h100._working_set(_launch(v)), device=machine(v), scheduler=scheduler(v), element_bytes="kernel",
                     allow_long=True)  # fmt: skip


def cta_words(heads: int, causal: bool) -> np.ndarray:
    """The words each CTA moves, in FA2's grid order (row block fastest, then head): Q_i (Br x d), each column
    block's K_j and V_j (ITER words; 2i + 2 of them for row block i under the causal mask, N / Bc without), O_i
    (Br x d) and L_i (Br fp32 words): the length of its run on the model's clock, which advances by words."""
    br, d, n_blocks = 128, 128, 32768 // 64
    loops = 2 * np.arange(256) + 2 if causal else np.full(256, n_blocks)
    return np.tile(2 * br * d + br + ITER * loops, heads).astype(np.int64)


def compulsory_bytes(heads: int = 32) -> int:
    """Q, K and V once each (fp16): what an L2 that never evicted would read from DRAM."""
    return 3 * heads * 32768 * 128 * WORD_BYTES


def load_bytes(heads: int = 32, causal: bool = True) -> int:
    """Every load of the launch (Q_i once per CTA, K_j and V_j once per iteration): the bytes the L2 serves."""
    return int(np.sum(cta_words(heads, causal) - 128 * 128 - 128)) * WORD_BYTES


def probe_curve(path: pathlib.Path = PROBE) -> tuple[np.ndarray, np.ndarray]:
    """The H200 probe's miss curve: per buffer of S bytes read twice, x = S / the H200's L2 and the fraction of the
    second read that missed, DRAM read / S - 1 (an LRU L2 would miss none below x = 1 and all of it above)."""
    import hierarchy_h200 as h200

    from iosim.hierarchy import device as preset

    cap = preset("H200").l2_bytes
    got = h200.measured_by_id(path)
    pts = sorted((int(k[len("l2-probe-") : -len("MiB")]) * MIB, v["dram__bytes_read.sum"]) for k, v in got.items()
                 if k.startswith("l2-probe-"))  # fmt: skip
    return np.array([b / cap for b, _ in pts]), np.array([max(r / b - 1, 0.0) for b, r in pts])


def reuse_profile(stored: dict, causal: bool = True) -> list[tuple[int, float]]:
    """The model's LRU reuse profile: (L2 bytes, DRAM read beyond the compulsory) at 0 (every load past the first of
    each line misses), at each size of 5c's scan and at the H100's 50 MiB (the source model), ascending; the
    non-causal forward's from its own scan (5e)."""
    runs, comp = stored["runs"], compulsory_bytes()
    pts = [(0, load_bytes(causal=causal) - comp)]
    if causal:
        pts += [(50 * MIB, runs["source-H100"]["dram_read"] - comp)]
        pts += [(mib * MIB, runs[f"l2-{mib}MiB"]["dram_read"] - comp) for mib in SCAN_MIB]
    else:
        pts += [(mib * MIB, runs[f"nc-l2-{mib}MiB"]["dram_read"] - comp) for mib in NC_SCAN_MIB]
    return sorted(pts)


def probe_estimate(stored: dict, device: str, causal: bool = True) -> float:
    """An estimate outside the model: the compulsory bytes, plus for each bin of the reuse profile (sizes a < b) the
    reuses whose LRU distance falls in it (misses at a less misses at b) times the probe's miss fraction at the bin's
    middle over the device's L2 (linear between the probe's points, its end values beyond them), plus the reuses
    beyond the last size times the probe's last fraction."""
    from iosim.hierarchy import device as preset

    xs, miss = probe_curve()
    cap = preset(device).l2_bytes
    prof = reuse_profile(stored, causal)
    est = float(compulsory_bytes())
    for (a, ma), (b, mb) in zip(prof, prof[1:], strict=False):
        est += (ma - mb) * float(np.interp((a + b) / 2 / cap, xs, miss))
    return est + prof[-1][1] * float(miss[-1])


def dispatch_end(lengths: np.ndarray, delays: np.ndarray, slots: int) -> int:
    """When the launch ends on the model's clock (iosim.hierarchy.l2, "The clock"): the first ``slots`` CTAs start
    at 0, each runs its delay and then its length, and a finished CTA's slot takes the next CTA in order."""
    import heapq

    n = len(lengths)
    busy = [(int(delays[i] + lengths[i]), i) for i in range(min(slots, n))]
    heapq.heapify(busy)
    nxt, end = len(busy), 0
    while busy:
        t, _ = heapq.heappop(busy)
        end = max(end, t)
        if nxt < n:
            heapq.heappush(busy, (t + int(delays[nxt] + lengths[nxt]), nxt))
            nxt += 1
    return end


def noncausal_end(v: Variant, slots: int) -> int:
    """The non-causal forward's end on the model's clock under the variant's stalls or start-up time (its CTAs all
    of one length, so their order does not matter): the same delays the scheduler draws for launch 0."""
    lengths = cta_words(v.heads, causal=False)
    n = len(lengths)
    if v.stall:
        delays = np.random.default_rng([v.seed, 0]).integers(0, v.stall * ITER + 1, n).astype(np.int64)
    else:
        delays = np.full(n, v.start * ITER, np.int64)
    return dispatch_end(lengths, delays, slots)


def measured_durations() -> dict:
    """The causal forward's duration over the non-causal forward's (gpu__time_duration.sum), H100 and H200 (the
    first H200 lease)."""
    import hierarchy_h200 as h200

    ncu = {x["label"]: x for x in h100._ncu()["launches"] if "flash_fwd_kernel" in x["kernel"]}
    ids = h200.measured_by_id()
    t = "gpu__time_duration.sum"
    return {"H100": ncu[2][t] / ncu[0][t], "H200": ids["fa2-fwd-causal"][t] / ids["fa2-fwd"][t]}


def measured(causal: bool = True) -> dict:
    """DRAM read bytes measured: the H100's (gpu_h100/ncu-torch.json) and the H200's (gpu_h200/predictions.json, the
    first H200 lease, entry fa2-fwd-causal or fa2-fwd), each summed over the launch's kernels without PyTorch's
    copies."""
    import hierarchy_h200 as h200

    entry = "fa2-fwd-causal" if causal else "fa2-fwd"
    return {"H100": h100.measured(LAUNCH if causal else "forward")["dram_read"],
            "H200": h200.measured_by_id()[entry]["dram__bytes_read.sum"]}  # fmt: skip


def compute(only=None, path: pathlib.Path = STORED) -> dict:
    """Every variant not stored yet (or those in ``only``), each stored as soon as it has run."""
    from iosim.base.version import __version__

    data = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    for v in variants():
        if (only and v.key not in only) or (not only and v.key in data["runs"]):
            continue
        t0 = time.perf_counter()
        r = run(v)
        got = h100.levels(r)
        data["runs"][v.key] = {"variant": asdict(v), "dram_read": got["dram_read"], "dram_write": got["dram_write"],
                               "l2_read_from_fabric": got["fabric_reads_only"], "blocks_per_sm": r.blocks_per_sm,
                               "clock_words": int(r.clock[0]),
                               "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
        data["iosim_version"] = __version__
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"{v.key}: DRAM read {got['dram_read'] / MB:,.1f} MB ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
              flush=True)  # fmt: skip
    return data


def verdict(ratios: list[tuple[float, bool]], base: float) -> str:
    """A hypothesis's verdict from its variants' measured / predicted on the H100 (each with whether a source gives
    its parameter), against the source model's ``base``: **explains** where a sourced variant is within CLOSE of 1;
    **closes only at an unsourced value** where only a band's is; **narrows** where some variant's |log ratio| is
    below NARROW times the source model's; else **ruled out**."""
    if any(abs(r - 1) <= CLOSE for r, sourced in ratios if sourced):
        return "explains"
    if any(abs(r - 1) <= CLOSE for r, _ in ratios):
        return "closes only at an unsourced value"
    if any(abs(math.log(r)) < NARROW * abs(math.log(base)) for r, _ in ratios):
        return "narrows"
    return "ruled out"


def _rows(stored: dict, meas: dict, dur: dict) -> tuple[list, dict]:
    """The table's rows and, per (hypothesis, device), its variants' (measured / predicted, sourced, duration ratio):
    a scaled run counts for the H100 as the source model's measured / predicted divided by its factor over its own
    baseline; the non-causal scan (5e) counts for no verdict."""
    runs, meas_nc = stored["runs"], measured(causal=False)
    rows, per = [], {}
    for v in variants():
        got = runs.get(v.key)
        if got is None:
            continue
        factor = got["dram_read"] / runs[v.baseline]["dram_read"]
        full, m = v.heads == 32, meas if v.causal else meas_nc
        ratio = m[v.device] / got["dram_read"] if full else None
        counted = ratio if full else meas["H100"] / runs["source-H100"]["dram_read"] / factor
        time_ratio = got["clock_words"] / noncausal_end(v, 132 * got["blocks_per_sm"]) if v.causal else None
        if v.causal:
            per.setdefault((v.hyp, v.device), []).append((counted, v.source != BAND, time_ratio if full else None))
        rows.append([v.hyp, v.what, v.source, v.device if full else f"{v.device}, H = {v.heads}", got["blocks_per_sm"],
                     f"{got['dram_read'] / MB:,.0f}", f"{m[v.device] / MB:,.0f}" if full else "-",
                     f"{ratio:.2f}" if ratio else "-", f"{factor:.2f}", "-" if time_ratio is None else
                     f"{time_ratio:.3f}", f"{dur[v.device]:.3f}" if full and v.causal else "-"])  # fmt: skip
    return rows + _estimate_rows(stored, meas, meas_nc, dur, per), per


def _estimate_rows(stored: dict, meas: dict, meas_nc: dict, dur: dict, per: dict) -> list:
    """The rows of :func:`probe_estimate`, the causal forward's (5d, counted for its verdict) and the non-causal
    forward's (5e, beside its measurement and its own source model's run: 50 MiB on the H100, 60 on the H200)."""
    runs, rows = stored["runs"], []
    for hyp, causal, keys in (("5d", True, [f"l2-{m}MiB" for m in SCAN_MIB]),
                              ("5e", False, [f"nc-l2-{m}MiB" for m in NC_SCAN_MIB])):  # fmt: skip
        if not all(k in runs for k in keys):
            continue
        m = meas if causal else meas_nc
        for dev in ("H100", "H200"):
            est = probe_estimate(stored, dev, causal)
            ratio = m[dev] / est
            if causal:
                per.setdefault((hyp, dev), []).append((ratio, True, None))
            base = runs[f"source-{dev}" if causal else f"nc-l2-{50 if dev == 'H100' else 60}MiB"]["dram_read"]
            what = "the probe's miss fraction at (LRU reuse footprint / L2)" + ("" if causal else ", non-causal")
            rows.append([hyp, what, PROBE_SOURCE, dev, 2, f"{est / MB:,.0f}", f"{m[dev] / MB:,.0f}", f"{ratio:.2f}",
                         f"{est / base:.2f}", "-", f"{dur[dev]:.3f}" if causal else "-"])  # fmt: skip
    return rows


def _span(values, digits: int = 2) -> str:
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return lo if lo == hi else f"{lo} - {hi}"


def in_time(time_ratio: float | None, measured_ratio: float) -> bool:
    """Whether a variant's launch time (causal over non-causal, on the model's clock) is within TIME of the measured
    durations' ratio; an estimate or a scaled run (None) is not held to it."""
    return time_ratio is None or abs(time_ratio / measured_ratio - 1) <= TIME


def verdicts(stored: dict, meas: dict, dur: dict, per: dict) -> list[list]:
    """Per hypothesis and device: measured / predicted over all its variants and over those whose launch time agrees
    with the measured durations (:func:`in_time`), the verdict on those (:func:`verdict`, against that device's
    source model; none in time: excluded by the durations), and the weaker of the two devices' verdicts."""
    out = []
    for hyp, name in HYPOTHESES.items():
        if not any((hyp, dev) in per for dev in ("H100", "H200")):
            continue
        row, got_verdicts = [hyp, name], []
        for dev in ("H100", "H200"):
            got = per.get((hyp, dev))
            if not got:
                row += ["-", "-", "not run"]
                continue
            kept = [(r, s) for r, s, t in got if in_time(t, dur[dev])]
            base = meas[dev] / stored["runs"][f"source-{dev}"]["dram_read"]
            v = verdict(kept, base) if kept else "excluded by the durations"
            got_verdicts.append(v)
            row += [_span([r for r, _, _ in got]), _span([r for r, _ in kept]) if kept else "-", v]
        out.append([*row, max(got_verdicts, key=RANK.index)])
    return out


def table(stored: dict | None = None, meas: dict | None = None, dur: dict | None = None) -> str:
    """The docs block: every variant's DRAM read and duration ratio beside the measurements, then each hypothesis's
    verdict on each device."""
    from tabulate import tabulate

    stored = stored or json.loads(STORED.read_text())
    meas, dur = meas or measured(), dur or measured_durations()
    rows, per = _rows(stored, meas, dur)
    head = ["#", "variant", "parameter's source", "device", "CTAs/SM", "DRAM read MB: iosim", "measured",
            "measured / iosim", "iosim / its source model", "time causal / non-causal: iosim", "measured"]  # fmt: skip
    vhead = ["#", "hypothesis", "H100: measured / iosim", "in time", "verdict", "H200: measured / iosim", "in time",
             "verdict", "on both"]  # fmt: skip
    first = tabulate(rows, headers=head, tablefmt="github", disable_numparse=True)
    second = tabulate(verdicts(stored, meas, dur, per), headers=vhead, tablefmt="github", disable_numparse=True)
    return f"{first}\n\n{second}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("compute", "table"))
    ap.add_argument("--only", nargs="+", choices=[v.key for v in variants()], help="compute: (re)run only these")
    ap.add_argument("--write", action="store_true", help="table: also write it into docs/hierarchy-hardware.md")
    args = ap.parse_args(argv)
    if args.what == "compute":
        compute(args.only)
        print(f"wrote {STORED}")
        return 0
    print(table())
    if args.write:
        h100.write_block(table(), BLOCK)
        print(f"wrote the table into {h100.DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
