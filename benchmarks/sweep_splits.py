"""Split-heuristic sweep: fmha_native's num_splits=0 against the best forced split count.

For each shape (bf16, torch CUDA tensors, [batch, seqlen, heads, head_dim]) this times the
heuristic's plan and every distinct forced split count, then reports the regret
    regret = time(num_splits=0) / min over forced counts of time(num_splits=s)
per shape, the geometric mean over shapes, the worst shape and how many exceed 1.15.
Targets (reported, not asserted): geomean <= 1.05, no shape above 1.15.

Candidates: num_splits in {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128}, each mapped
to its effective count by explain() and deduplicated, plus the heuristic (num_splits=0).

Timing: CUDA events on the current stream, outputs preallocated (out=, lse=).  For
shapes with few query rows per kv head (seqlen_q * heads_q / heads_kv <= 64, memory-bound)
a 256 MB buffer is zeroed before every timed run to flush the L2; other runs start after
a short device spin, so that the events time kernels rather than the Python call.  Two
phases keep the sweep short:
  1. screening: the heuristic first, then the unsplit plan, then the other forced counts
     nearest to the heuristic's count; a count whose first run is hopeless (> 20x the
     best so far and > 5 ms, or a timed probe > 3x) is dropped after it, the others get
     3 warm-up and 3 timed runs;
  2. final: the heuristic and the forced counts within 1.3x of the screening best (at
     most 6, always the best one) get one warm-up round and then --reps interleaved
     rounds (each round runs every finalist once, in a rotated order, so clock drift
     hits all alike); the medians of these rounds give the regret.
Every distinct plan's output is also compared with the unsplit plan's (relative
Frobenius difference; above 1e-2 is flagged), a free check that forced splits are right.

Shapes: a fixed list by family (decode, speculative decoding, chunked prefill, prefill,
causal, wave-quantisation boundaries, short keys), then --random shapes drawn with a fixed
seed.  A shape whose single run is estimated above ~20 ms (max(4*B*Hq*Sq*Sk*D / 300e12,
bytes / 3e12)) is trimmed (batch halved, then seqlen_q, then seqlen_k) and marked *; a
wall-clock budget (--budget-s) skips what would not finish in time.  Progress goes to
stderr, one JSON line per shape; the table, the worst shapes and the summary (last line)
go to stdout; --json writes everything (device, versions, date, every candidate's
times), rewritten after every shape so a killed run keeps what it measured (SIGTERM
also prints the report).

    python benchmarks/sweep_splits.py [--json sweep.json] [--quick] [--shapes N]
                                      [--only 3,7] [--reps 20] [--budget-s 210]
    python benchmarks/sweep_splits.py --dry-run     # shapes, trims, time estimate; no GPU
    python benchmarks/sweep_splits.py --cpu-smoke   # the whole flow on the CPU backend

Exit status: 0, or 1 when a shape raised (the table and JSON are still written) or no
GPU is usable.
"""
import argparse
import collections
import datetime
import json
import math
import os
import random
import signal
import statistics
import sys
import time
import traceback

# Forced split counts tried on every shape (before clamping by explain()).
CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)

# Cost model used only to trim shapes and budget the sweep (not the heuristic's).
PEAK_FLOPS = 300e12
PEAK_BYTES_PER_S = 3e12
RUN_CAP_S = 20e-3              # a shape's single run is kept under this estimate
MIN_TRIM_SEQLEN_Q = 256        # trimming halves seqlen_q down to this, then seqlen_k
MIN_TRIM_SEQLEN_K = 1024

# Timing.
L2_FLUSH_BYTES = 256 << 20
MEMORY_BOUND_ROWS = 64         # seqlen_q * group at or below this: flush the L2
WARMUP_RUNS = 3
SCREEN_RUNS = 3
DEFAULT_REPS = 20
HEAVY_RUN_S = 5e-3             # shapes estimated above this get at most HEAVY_REPS rounds
HEAVY_REPS = 10
QUICK_REPS = 10
SINGLE_CTA_BYTES_PER_S = 50e9  # budget guess for one CTA streaming K/V alone (unsplit)
# Runs without a flush start after a short device spin instead, so that the host has
# queued the call before the device reaches it: the events then time the kernels,
# not the Python call (a tiny problem's kernels are shorter than its host overhead).
GPU_CUSHION_CYCLES = 200_000
HOPELESS_FACTOR = 20.0         # untimed first run this much slower than the best: drop
HOPELESS_FLOOR_S = 5e-3        # ... but only if it also took at least this long
PROBE_FACTOR = 3.0             # timed probe this much slower than the best: drop
KEEP_WITHIN = 1.3              # screening median within this of the best: a finalist
MAX_FINALISTS = 6              # forced finalists per shape (plus the heuristic)
SCRATCH_CAP_BYTES = 2 << 30    # forced counts whose fp32 partials exceed this are skipped

# Reporting.
REGRET_LIMIT = 1.15
GEOMEAN_TARGET = 1.05
DIFF_LIMIT = 1e-2              # relative difference between two plans' outputs
DEFAULT_BUDGET_S = 210.0

Shape = collections.namedtuple("Shape", "batch heads_q heads_kv seqlen_q seqlen_k head_dim causal")


def S(b, hq, hkv, sq, sk, d, causal=False):
    return Shape(b, hq, hkv, sq, sk, d, causal)


K = 1024
# The sweep's shapes, by family; heads_kv is heads_q (MHA) or heads_q / 8 (GQA group 8).
# Tile counts below are for H200 (132 SMs), decode tiles 16 x 32/64 (about 3 CTAs per
# SM), prefill tiles 128 x 64/128 (about 2 CTAs per SM); the library measures the real
# occupancy, so these are only a guide to what each row probes.
SHAPES = [
    # Decode (seqlen_q = 1): memory-bound, few tiles; the heuristic splits hard.
    S(1, 32, 4, 1, 128 * K, 128),      # long-context GQA decode: 4 packed tiles
    S(1, 8, 1, 1, 32 * K, 128),        # MQA-like: 1 tile
    S(1, 16, 16, 1, 64 * K, 64),
    S(2, 32, 32, 1, 16 * K, 128),
    S(4, 32, 4, 1, 8 * K, 128),
    S(8, 32, 4, 1, 4 * K, 128),
    S(8, 32, 32, 1, 8 * K, 128),       # 256 tiles: ~2/3 of the decode slots
    S(8, 16, 16, 1, 1 * K, 64),        # tiny work: combine launch vs. gain
    S(1, 2, 2, 1, 1 * K, 64),          # the smallest problem
    S(4, 8, 8, 1, 128 * K, 64),
    S(8, 16, 2, 1, 32 * K, 128),
    S(2, 4, 4, 1, 4 * K, 128),
    S(3, 32, 32, 1, 32 * K, 64),
    S(5, 32, 32, 1, 16 * K, 128),
    # Speculative decoding / multi-token prediction (seqlen_q 2..16).
    S(1, 32, 4, 2, 64 * K, 128),       # 16 packed rows: decode tiles
    S(4, 32, 4, 4, 16 * K, 128),       # 32 packed rows: prefill tiles, pack_gqa
    S(2, 16, 16, 8, 32 * K, 64),
    S(8, 8, 1, 16, 8 * K, 128),        # 128 packed rows, 8 tiles: partials ~ K/V bytes
    S(1, 16, 2, 16, 128 * K, 64),
    S(4, 2, 2, 4, 4 * K, 64),
    S(8, 32, 32, 2, 8 * K, 128),
    S(1, 32, 4, 8, 2 * K, 128),        # 64 packed rows, short keys
    # Chunked prefill (seqlen_q 64..1024) over long caches.
    S(1, 32, 4, 64, 64 * K, 128),
    S(1, 8, 8, 128, 128 * K, 128),     # 8 tiles
    S(2, 16, 2, 256, 32 * K, 64),
    S(1, 32, 32, 512, 16 * K, 128),    # 128 tiles: ~half the prefill slots
    S(4, 8, 8, 512, 8 * K, 64),
    S(1, 4, 4, 1024, 64 * K, 128),
    S(2, 32, 4, 1024, 4 * K, 128),     # 512 tiles: ~2 full waves
    S(8, 2, 2, 256, 16 * K, 64),
    S(6, 4, 4, 512, 8 * K, 128),
    S(1, 12, 12, 1024, 16 * K, 64),
    # Prefill (seqlen_q 2048..8192).
    S(1, 16, 16, 2048, 32 * K, 64),    # 256 tiles: ~1 wave
    S(2, 8, 8, 2048, 16 * K, 128),
    S(1, 8, 1, 4096, 8 * K, 64),
    S(1, 2, 2, 8192, 128 * K, 64),     # 128 tiles, longest keys
    S(1, 4, 4, 8192, 64 * K, 128),
    S(2, 16, 2, 4096, 8 * K, 128),     # 1024 tiles: several waves
    S(8, 32, 4, 8192, 8 * K, 64),      # the biggest: trimmed
    S(4, 4, 4, 2048, 4 * K, 64),
    # Causal (bottom-right aligned).
    S(1, 16, 16, 4096, 4 * K, 128, True),
    S(1, 8, 8, 2048, 2 * K, 64, True),
    S(2, 32, 4, 1024, 32 * K, 128, True),
    S(1, 32, 4, 16, 64 * K, 128, True),
    S(1, 4, 4, 8192, 8 * K, 128, True),
    # Wave-quantisation boundaries: tiles just under / just over whole waves.
    S(1, 26, 26, 1024, 16 * K, 64),    # 208 tiles
    S(1, 28, 28, 1024, 16 * K, 64),    # 224 tiles
    S(1, 18, 18, 2048, 16 * K, 64),    # 288 tiles: one wave and a bit
    S(2, 20, 20, 1024, 8 * K, 128),    # 320 tiles
    S(3, 16, 16, 1024, 8 * K, 128),    # 384 tiles: 1.5 waves
    S(5, 16, 16, 1024, 8 * K, 64),     # 640 tiles: 2.4 waves
    S(1, 24, 3, 4096, 8 * K, 64),      # 768 tiles: ~3 waves
    # Short keys with few tiles: many tiny splits against the combine's fixed cost.
    S(1, 8, 1, 1, 1 * K, 128),
    S(1, 4, 4, 64, 1 * K, 128),
    S(2, 8, 8, 256, 2 * K, 64),
    S(1, 16, 2, 4, 1 * K, 64),
]

# After the fixed list: shapes drawn from the whole space with a fixed seed (seqlen_k
# log-uniform, so mostly not a multiple of any tile), to catch what the families miss.
RANDOM_SEED = 20250611
DEFAULT_RANDOM = 24
RANDOM_HEADS_Q = (2, 4, 6, 8, 12, 16, 20, 24, 28, 32)
RANDOM_SEQLEN_Q = (1, 1, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
RANDOM_LOG2_SEQLEN_K = (10.0, 17.0)
RANDOM_CAUSAL_SHARE = 0.2


def random_shapes(n):
    rng = random.Random(RANDOM_SEED)
    shapes = []
    for _ in range(n):
        heads_q = rng.choice(RANDOM_HEADS_Q)
        group = 8 if heads_q % 8 == 0 and rng.random() < 0.5 else 1
        seqlen_q = rng.choice(RANDOM_SEQLEN_Q)
        seqlen_k = int(round(2.0 ** rng.uniform(*RANDOM_LOG2_SEQLEN_K)))
        causal = seqlen_q > 1 and rng.random() < RANDOM_CAUSAL_SHARE
        shapes.append(S(rng.randint(1, 8), heads_q, heads_q // group, seqlen_q, seqlen_k,
                        rng.choice((64, 128)), causal))
    return shapes


# --quick: one or two shapes per family.
QUICK_INDICES = (0, 6, 7, 14, 17, 23, 25, 35, 42, 47, 49, 52)

# --cpu-smoke: tiny problems that exercise the flow on the CPU backend.
CPU_SHAPES = [
    S(1, 8, 1, 1, 2 * K, 64),
    S(1, 4, 4, 16, 1 * K, 64),
    S(2, 2, 2, 64, 1 * K, 128, True),
]


# ----------------------------------------------------------------------------- shapes

def causal_fraction(s):
    """Share of the score matrix a bottom-right-aligned causal mask keeps."""
    if not s.causal:
        return 1.0
    if s.seqlen_q <= s.seqlen_k:
        return 1.0 - s.seqlen_q / (2.0 * s.seqlen_k)
    return s.seqlen_k / (2.0 * s.seqlen_q)


def flops(s):
    return 4.0 * s.batch * s.heads_q * s.seqlen_q * s.seqlen_k * s.head_dim * causal_fraction(s)


def nbytes(s, elem=2):
    """Q + K + V + O, each read or written once."""
    return elem * s.head_dim * s.batch * (2 * s.seqlen_q * s.heads_q + 2 * s.seqlen_k * s.heads_kv)


def est_run_s(s):
    return max(flops(s) / PEAK_FLOPS, nbytes(s) / PEAK_BYTES_PER_S)


def memory_bound(s):
    return s.seqlen_q * s.heads_q // s.heads_kv <= MEMORY_BOUND_ROWS


def trim(s):
    """The shape cut until its estimated run fits RUN_CAP_S, or None if it cannot be."""
    while est_run_s(s) > RUN_CAP_S:
        if s.batch > 1:
            s = s._replace(batch=s.batch // 2)
        elif s.seqlen_q > MIN_TRIM_SEQLEN_Q:
            # Keep causal squares square: both sides shrink together.
            square = s.causal and s.seqlen_q == s.seqlen_k
            s = s._replace(seqlen_q=s.seqlen_q // 2,
                           seqlen_k=s.seqlen_k // 2 if square else s.seqlen_k)
        elif s.seqlen_k > MIN_TRIM_SEQLEN_K:
            s = s._replace(seqlen_k=s.seqlen_k // 2)
        else:
            return None
    return s


def shape_label(s):
    return "{},{},{},{},{},{}{}".format(s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k,
                                       s.head_dim, ",c" if s.causal else "")


def select(args):
    """[(index in the list, requested shape, shape to run or None)]."""
    base = CPU_SHAPES if args.cpu_smoke else SHAPES + random_shapes(args.random)
    idx = list(range(len(base)))
    if args.only:
        idx = [int(i) for i in args.only.split(",")]
        bad = [i for i in idx if not 0 <= i < len(base)]
        if bad:
            raise SystemExit(f"--only: indices {bad} outside 0..{len(base) - 1}")
    elif args.quick and not args.cpu_smoke:
        idx = list(QUICK_INDICES)
    if args.shapes is not None and args.shapes < len(idx):
        n = max(args.shapes, 1)
        # Evenly spaced, so that every family keeps a representative.
        picks = sorted({round(i * (len(idx) - 1) / max(n - 1, 1)) for i in range(n)})
        idx = [idx[p] for p in picks]
    chosen = []
    for i in idx:
        s = base[i]
        chosen.append((i, s, s if args.cpu_smoke else trim(s)))
    return chosen


def reps_for(s, args):
    reps = args.reps
    if est_run_s(s) > HEAVY_RUN_S:
        reps = min(reps, HEAVY_REPS)
    return max(reps, 1)


def est_unsplit_s(s):
    """Guess of an unsplit run: with few tiles one CTA streams a whole K/V head alone."""
    return max(est_run_s(s), 4.0 * s.seqlen_k * s.head_dim / SINGLE_CTA_BYTES_PER_S)


def est_shape_cost_s(s, args):
    """Rough wall time of one shape's measurement, for the budget (pessimistic x2 kernel)."""
    per_run = 2.0 * est_run_s(s) + (1.5e-4 if memory_bound(s) else 0.0) + 5e-5
    screening = (len(CANDIDATES) + 1) * (1 + SCREEN_RUNS) + WARMUP_RUNS
    final = (MAX_FINALISTS + 1) * (reps_for(s, args) + 1)
    # The few-split counts of a few-tile shape are dropped after one slow run each
    # (1 + 1/2 + 1/3 + ... of the unsplit time), plus the reference run.
    slow_first_runs = 3.0 * est_unsplit_s(s)
    return per_run * (screening + final) + slow_first_runs + 0.05


# ----------------------------------------------------------------------------- timing

class CudaTimer:
    """CUDA events on the current stream; an L2 flush (or a short spin) before each run."""

    def __init__(self, torch):
        self.torch = torch
        self.flush_buf = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        self.spin = getattr(torch.cuda, "_sleep", None)

    def sync(self):
        self.torch.cuda.synchronize()

    def rounds(self, fns, n, flush):
        """Run every fn once per round, n rounds, order rotated each round: {key: [ms]}."""
        torch = self.torch
        pending = []
        for r in range(n):
            order = fns[r % len(fns):] + fns[:r % len(fns)]
            for key, fn in order:
                if flush:
                    self.flush_buf.zero_()
                elif self.spin is not None:
                    self.spin(GPU_CUSHION_CYCLES)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                pending.append((key, start, end))
            # Bound the queue; the host is ahead of the device within a round.
            torch.cuda.synchronize()
        times = {key: [] for key, _ in fns}
        for key, start, end in pending:
            times[key].append(start.elapsed_time(end))
        return times


class WallTimer:
    """Host wall clock, for --cpu-smoke (the CPU backend is synchronous)."""

    def sync(self):
        pass

    def rounds(self, fns, n, flush):
        times = {key: [] for key, _ in fns}
        for r in range(n):
            order = fns[r % len(fns):] + fns[:r % len(fns)]
            for key, fn in order:
                t0 = time.perf_counter()
                fn()
                times[key].append((time.perf_counter() - t0) * 1e3)
        return times


def untimed_ms(timer, fn):
    """One synchronised run, host wall time in ms (cold effects included)."""
    timer.sync()
    t0 = time.perf_counter()
    fn()
    timer.sync()
    return (time.perf_counter() - t0) * 1e3


# ----------------------------------------------------------------------------- one shape

def tiles_slots(plan):
    """(tiles, slots) from the plan's split numbers (explain()['split']), else (None, None)."""
    split = plan.get("split") or {}
    return split.get("tiles"), split.get("slots")


def kernel_short(plan):
    name = plan.get("kernel", "")
    kind = "decode" if "decode" in name else ("mma" if "mma" in name else name.split("<")[0])
    return kind + ("+pack" if plan.get("pack_gqa") else "")


def rel_diff(torch, a, ref):
    a, ref = a.float(), ref.float()
    denom = ref.norm().item()
    num = (a - ref).norm().item()
    if not math.isfinite(num):
        return float("inf")
    return num / denom if denom > 0 else num


def measure_shape(fmha_native, torch, timer, s, args, device):
    """One shape's row: the heuristic, the forced candidates, the regret."""
    gen = torch.Generator(device=device).manual_seed(0)
    opts = dict(device=device, dtype=torch.bfloat16, generator=gen)
    q = torch.randn(s.batch, s.seqlen_q, s.heads_q, s.head_dim, **opts)
    k = torch.randn(s.batch, s.seqlen_k, s.heads_kv, s.head_dim, **opts)
    v = torch.randn(s.batch, s.seqlen_k, s.heads_kv, s.head_dim, **opts)
    out = torch.empty_like(q)
    lse = torch.empty(s.batch, s.heads_q, s.seqlen_q, device=device, dtype=torch.float32)
    kw = dict(causal=s.causal)
    if args.cpu_smoke:
        kw["device"] = "cpu"
    flush = memory_bound(s) and not args.cpu_smoke
    row = {"est_ms": est_run_s(s) * 1e3, "flush": flush}

    heur = fmha_native.explain(q, k, v, num_splits=0, **kw)
    want = "cpu" if args.cpu_smoke else "gpu"
    if heur.get("backend") != want:
        raise RuntimeError(f"planned on {heur.get('backend')!r}, not {want}: {heur.get('reason')}")
    h_splits = int(heur["num_splits"])
    row.update(kernel=heur.get("kernel"), kernel_short=kernel_short(heur),
               reason=heur.get("reason"), pack_gqa=bool(heur.get("pack_gqa")),
               block_m=heur.get("block_m"), block_n=heur.get("block_n"),
               heuristic_splits=h_splits)
    row["tiles"], row["slots"] = tiles_slots(heur)

    # Distinct effective forced counts, and which requests map to each.
    requested = collections.OrderedDict()
    for c in CANDIDATES:
        eff = int(fmha_native.explain(q, k, v, num_splits=c, **kw)["num_splits"])
        requested.setdefault(eff, []).append(c)
    row_bytes = s.batch * s.seqlen_q * s.heads_q * (s.head_dim + 1) * 4
    cands = {eff: {"requested": reqs} for eff, reqs in requested.items()}
    for eff, c in cands.items():
        if eff > 1 and eff * row_bytes > SCRATCH_CAP_BYTES:
            c["skipped"] = f"partials {eff * row_bytes / 2**30:.1f} GiB > cap"

    def runner(splits):
        def run():
            fmha_native.forward(q, k, v, num_splits=splits, out=out, lse=lse, **kw)
        return run

    max_diff = 0.0

    def check(tag, ref_out, got=None):
        nonlocal max_diff
        timer.sync()
        d = rel_diff(torch, out if got is None else got, ref_out)
        max_diff = max(max_diff, d)
        if d > DIFF_LIMIT:
            row.setdefault("mismatch", []).append({"splits": tag, "rel_diff": d})
        return d

    # Phase 1, screening: the heuristic first (the baseline the others are pruned
    # against), then the unsplit plan, whose output is the reference for every plan's
    # check, then the other forced counts nearest to the heuristic's count.
    h_run = runner(0)
    for _ in range(WARMUP_RUNS):
        h_run()
    h_screen = statistics.median(timer.rounds([("h", h_run)], SCREEN_RUNS, flush)["h"])
    timer.sync()
    h_out = out.clone()
    cands[1]["first_ms"] = untimed_ms(timer, runner(1))
    ref_out = out.clone()
    row["heuristic_rel_diff"] = check("heuristic", ref_out, h_out)
    del h_out
    best = h_screen
    order = sorted((e for e, c in cands.items() if "skipped" not in c),
                   key=lambda e: (abs(math.log(e) - math.log(max(h_splits, 1))), e))
    for eff in order:
        c = cands[eff]
        fn = runner(eff)
        if "first_ms" not in c:
            c["first_ms"] = untimed_ms(timer, fn)
        first = c["first_ms"]
        if first > HOPELESS_FLOOR_S * 1e3 and first > HOPELESS_FACTOR * best:
            c["pruned"] = "first run"
            continue
        probe = timer.rounds([(eff, fn)], 1, flush)[eff][0]
        if probe > PROBE_FACTOR * best:
            c["screen_ms"] = probe
            c["pruned"] = "probe"
            continue
        for _ in range(WARMUP_RUNS - 2):
            fn()
        c["screen_ms"] = statistics.median(timer.rounds([(eff, fn)], SCREEN_RUNS, flush)[eff])
        c["rel_diff"] = check(eff, ref_out)
        best = min(best, c["screen_ms"])

    screened = sorted((c["screen_ms"], e) for e, c in cands.items() if "screen_ms" in c)
    if not screened:
        raise RuntimeError("no forced split count could be measured")
    finalists = [e for t, e in screened if t <= KEEP_WITHIN * best][:MAX_FINALISTS]
    if screened[0][1] not in finalists:
        finalists.insert(0, screened[0][1])

    # Phase 2, final: interleaved rounds of the heuristic and the finalists.
    fns = [("h", h_run)] + [(e, runner(e)) for e in finalists]
    reps = reps_for(s, args)
    timer.rounds(fns, 1, flush)
    times = timer.rounds(fns, reps, flush)
    for e in finalists:
        cands[e]["ms"] = statistics.median(times[e])
        cands[e]["runs_ms"] = times[e]
    h_ms = statistics.median(times["h"])
    best_eff = min(finalists, key=lambda e: cands[e]["ms"])
    row.update(heuristic_ms=h_ms, heuristic_runs_ms=times["h"], heuristic_screen_ms=h_screen,
               best_splits=best_eff, best_ms=cands[best_eff]["ms"],
               regret=h_ms / cands[best_eff]["ms"], reps=reps, max_rel_diff=max_diff,
               candidates={str(e): c for e, c in cands.items()})
    if h_splits in finalists:
        # The same plan timed twice: how far apart two measurements of one plan land.
        row["self_ratio"] = h_ms / cands[h_splits]["ms"]
    return row


# ----------------------------------------------------------------------------- report

HEADER = (f"{'#':>3s} {'shape B,Hq,Hkv,Sq,Sk,D[,c]':30s} {'kernel':12s} {'tiles/slots':>11s} "
          f"{'heur':>5s} {'best':>5s} {'heur ms':>9s} {'best ms':>9s} {'regret':>7s}")


def row_line(r):
    ts = f"{r['tiles']}/{r['slots']}" if r.get("tiles") is not None else "-"
    label = r["label"] + ("*" if r.get("trimmed_from") else "")
    if "regret" not in r:
        why = r.get("error") or r.get("skipped") or "not finished"
        return f"{r['index']:3d} {label:30s} {why}"
    flag = ""
    if r["regret"] > REGRET_LIMIT:
        flag += "  <-- over %.2f" % REGRET_LIMIT
    if r.get("mismatch"):
        flag += "  MISMATCH %.1e" % r["max_rel_diff"]
    return (f"{r['index']:3d} {label:30s} {r.get('kernel_short', ''):12s} {ts:>11s} "
            f"{r['heuristic_splits']:5d} {r['best_splits']:5d} {r['heuristic_ms']:9.4f} "
            f"{r['best_ms']:9.4f} {r['regret']:7.3f}{flag}")


def summarize(rows):
    done = [r for r in rows if "regret" in r]
    out = {"shapes": len(done), "errors": sum(1 for r in rows if r.get("error")),
           "skipped": sum(1 for r in rows if r.get("skipped")),
           "mismatches": sum(1 for r in done if r.get("mismatch"))}
    if done:
        regrets = [r["regret"] for r in done]
        worst = max(done, key=lambda r: r["regret"])
        out.update(geomean_regret=math.exp(sum(math.log(x) for x in regrets) / len(regrets)),
                   max_regret=worst["regret"], max_regret_shape=worst["label"],
                   max_regret_index=worst["index"],
                   over_limit=sum(1 for x in regrets if x > REGRET_LIMIT),
                   heuristic_is_best=sum(1 for r in done
                                         if r["heuristic_splits"] == r["best_splits"]))
        selfs = [abs(r["self_ratio"] - 1.0) for r in done if "self_ratio" in r]
        if selfs:
            out["noise_median"] = statistics.median(selfs)
            out["noise_max"] = max(selfs)
            out["noise_shapes"] = len(selfs)
    return out


def summary_line(sm):
    if not sm["shapes"]:
        return (f"sweep_splits: 0 shapes measured ({sm['errors']} errors, {sm['skipped']} "
                f"skipped)")
    return (f"sweep_splits: {sm['shapes']} shapes, geomean regret {sm['geomean_regret']:.3f} "
            f"(target <= {GEOMEAN_TARGET}), max regret {sm['max_regret']:.3f} at "
            f"#{sm['max_regret_index']} ({sm['max_regret_shape']}), {sm['over_limit']} shapes > "
            f"{REGRET_LIMIT} (target 0); heuristic count = best count in "
            f"{sm['heuristic_is_best']}/{sm['shapes']}; {sm['errors']} errors, {sm['skipped']} "
            f"skipped, {sm['mismatches']} output mismatches")


def noise_line(sm):
    if "noise_median" not in sm:
        return "noise: no shape timed the heuristic's count as a forced finalist"
    return (f"noise: where the heuristic's count was also a forced finalist ({sm['noise_shapes']} "
            f"shapes), the two timings of that one plan differ by {100 * sm['noise_median']:.1f}% "
            f"(median), {100 * sm['noise_max']:.1f}% (max)")


def print_report(rows, sm):
    print(HEADER)
    for r in rows:
        print(row_line(r))
    if any(r.get("trimmed_from") for r in rows):
        print("* trimmed to fit the per-run cap; the JSON has the requested shape")
    done = sorted((r for r in rows if "regret" in r), key=lambda r: -r["regret"])
    if done:
        print("worst regrets:")
        for r in done[:5]:
            close = sorted(((c["ms"], e) for e, c in r["candidates"].items() if "ms" in c))
            alts = ", ".join(f"{e}:{t:.4f}" for t, e in close)
            print(f"  #{r['index']} {r['label']} regret {r['regret']:.3f}; finalists {alts}; "
                  f"plan: {r.get('reason', '')}")
    if sm["shapes"]:
        print(noise_line(sm))
    print(summary_line(sm), flush=True)


def write_json(path, meta, rows, sm):
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(meta, rows=rows, summary=sm), f, indent=1)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring for the method.")
    ap.add_argument("--json", help="write all rows, device, versions and date here")
    ap.add_argument("--shapes", type=int, help="at most N shapes, evenly spaced over the list")
    ap.add_argument("--quick", action="store_true", help="a dozen shapes, one or two per family")
    ap.add_argument("--only", help="comma list of shape indices (as printed in the # column)")
    ap.add_argument("--random", type=int, default=DEFAULT_RANDOM,
                    help=f"seeded random shapes after the fixed list (default {DEFAULT_RANDOM})")
    ap.add_argument("--reps", type=int, default=DEFAULT_REPS,
                    help=f"final interleaved rounds per shape (default {DEFAULT_REPS}; "
                         f"at most {HEAVY_REPS} for shapes estimated above "
                         f"{HEAVY_RUN_S * 1e3:.0f} ms)")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help="skip shapes that would not finish within this many seconds "
                         f"of sweeping (default {DEFAULT_BUDGET_S:.0f})")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the shapes, trims and the time estimate; touch no GPU")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run the whole flow on the CPU backend with tiny shapes (a test of "
                         "this script, not a measurement)")
    args = ap.parse_args(argv)
    if args.quick and args.reps == DEFAULT_REPS:
        args.reps = QUICK_REPS
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    return args


def dry_run(chosen, args):
    total = 0.0
    print(f"{'#':>3s} {'shape':30s} {'run to':30s} {'est ms':>8s} {'flush':>5s} {'cost s':>7s}")
    for i, s, run in chosen:
        if run is None:
            print(f"{i:3d} {shape_label(s):30s} {'(cannot be trimmed: skipped)':30s}")
            continue
        cost = est_shape_cost_s(run, args)
        total += cost
        note = shape_label(run) if run != s else "="
        print(f"{i:3d} {shape_label(s):30s} {note:30s} {est_run_s(run) * 1e3:8.3f} "
              f"{'yes' if memory_bound(run) else 'no':>5s} {cost:7.2f}")
    print(f"{len(chosen)} shapes; pessimistic time estimate {total:.0f} s "
          f"(budget {args.budget_s:.0f} s; the budget skips what does not fit)")
    return 0


def interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    chosen = select(args)
    if args.dry_run:
        return dry_run(chosen, args)

    import torch

    import fmha_native

    if args.cpu_smoke:
        device, timer = "cpu", WallTimer()
        dev_name = "cpu"
    else:
        if not torch.cuda.is_available():
            print("sweep_splits: torch sees no CUDA device (use --dry-run or --cpu-smoke)",
                  file=sys.stderr)
            return 1
        device, timer = "cuda", CudaTimer(torch)
        dev_name = torch.cuda.get_device_name()
    # Preflight: a build without GPU kernels would plan every shape on the CPU.
    probe = torch.zeros(1, 1, 1, 64, device=device, dtype=torch.bfloat16)
    plan = fmha_native.explain(probe, probe, probe, **({"device": "cpu"} if args.cpu_smoke else {}))
    if plan.get("backend") != ("cpu" if args.cpu_smoke else "gpu"):
        print(f"sweep_splits: fmha_native plans on {plan.get('backend')!r} here: "
              f"{plan.get('reason')}", file=sys.stderr)
        return 1
    info = fmha_native.info()
    meta = {"device": dev_name, "torch": torch.__version__,
            "fmha_native": info.get("version"), "backends": info.get("backends"),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "candidates": list(CANDIDATES), "regret_limit": REGRET_LIMIT,
            "geomean_target": GEOMEAN_TARGET, "argv": sys.argv[1:] if argv is None else argv,
            "sm_count": plan.get("sm_count"), "arch": plan.get("arch")}
    sms = f" ({meta['sm_count']} SMs)" if meta["sm_count"] else ""
    print(f"device: {dev_name}{sms}  torch {torch.__version__}  "
          f"fmha_native {meta['fmha_native']}  {len(chosen)} shapes", flush=True)

    # A wall-clock limit (timeout sends SIGTERM) still gets the table and the JSON.
    signal.signal(signal.SIGTERM, interrupt)
    rows = []
    t0 = time.monotonic()
    broken = None
    try:
        for i, s, run in chosen:
            r = {"index": i, "label": shape_label(run or s),
                 "shape": list(run or s)}
            if run is not None and run != s:
                r["trimmed_from"] = list(s)
            rows.append(r)
            if run is None:
                r["skipped"] = "over the per-run cap even when trimmed"
                continue
            if broken:
                r["skipped"] = f"not run: {broken}"
                continue
            elapsed = time.monotonic() - t0
            if elapsed + est_shape_cost_s(run, args) > args.budget_s:
                r["skipped"] = f"budget: {elapsed:.0f} s of {args.budget_s:.0f} s spent"
                continue
            start = time.monotonic()
            try:
                r.update(measure_shape(fmha_native, torch, timer, run, args, device))
            except Exception as exc:  # one shape's failure must not lose the others
                first_line = str(exc).splitlines()[0][:160] if str(exc) else ""
                r["error"] = f"{type(exc).__name__}: {first_line}"
                r["traceback"] = traceback.format_exc()
                print(r["traceback"], file=sys.stderr, flush=True)
                try:
                    timer.sync()
                except Exception as sync_exc:
                    broken = f"device unusable after #{i}: {type(sync_exc).__name__}"
            r["wall_s"] = time.monotonic() - start
            if device == "cuda" and not broken:
                torch.cuda.empty_cache()
            brief = {key: r.get(key) for key in ("index", "label", "heuristic_splits",
                                                 "best_splits", "heuristic_ms", "best_ms",
                                                 "regret", "error", "wall_s")}
            print(json.dumps(brief), file=sys.stderr, flush=True)
            write_json(args.json, meta, rows, summarize(rows))
    except KeyboardInterrupt:
        print("sweep_splits: interrupted; reporting what was measured", file=sys.stderr)
        broken = broken or "interrupted"
        for r in rows:
            if not any(key in r for key in ("regret", "error", "skipped")):
                r["skipped"] = "interrupted"
    meta["sweep_s"] = time.monotonic() - t0
    sm = summarize(rows)
    write_json(args.json, meta, rows, sm)
    print_report(rows, sm)
    failed = sm["errors"] > 0 or sm["shapes"] == 0 or broken == "interrupted"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
