"""CPU benchmark: fmha_native's CPU backend against torch SDPA on the CPU and the
float64 NumPy reference, in one process, with the same thread count.

Each library gets its own native layout, contiguous: fmha_native [batch, seqlen,
heads, head_dim] (FlashAttention's), torch SDPA [batch, heads, seqlen, head_dim].
GQA shapes use SDPA's enable_gqa=True when this torch has it, else k/v expanded
with repeat_interleave before timing (the header line says which).

Timing: wall clock around each call after warm-up; the two libraries alternate
run by run (a machine shared with other work slows both alike), and the table
shows the median of --reps runs.  --clock cpu times process CPU time instead,
which ignores time spent descheduled on a busy machine; it is a fair comparison
only with --threads 1 (OpenMP workers spin while they wait, which bills torch
for CPU time that does no work).  The reference (fmha_native.reference.forward,
float64 NumPy) is slow, so it runs --ref-reps times.  "err" is our relative
Frobenius error against the reference.  TFLOP/s counts 4*B*Hq*Sq*Sk*D, halved for
causal square problems.

    python benchmarks/bench_cpu.py [--threads N] [--reps R] [--json out.json]
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads for both libraries (default: all CPUs)")
    ap.add_argument("--reps", type=int, default=9, help="timed runs per library and shape")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs first")
    ap.add_argument("--ref-reps", type=int, default=1,
                    help="timed runs of the NumPy reference (0 skips it)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall clock (default) or process CPU time (use with --threads 1)")
    ap.add_argument("--shapes", help="comma list of row numbers of SHAPES to run (default: all)")
    ap.add_argument("--json", help="write the rows here as JSON")
    return ap.parse_args()


ARGS = parse_args()
# The CPU backend sizes its pool from FMHA_NUM_THREADS once, at its first job.
os.environ["FMHA_NUM_THREADS"] = str(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fmha_native  # noqa: E402
from fmha_native import reference  # noqa: E402

# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal)
SHAPES = [
    (1, 8, 8, 2048, 2048, 64, True),
    (1, 8, 8, 2048, 2048, 64, False),
    (1, 8, 8, 1024, 1024, 128, False),
    (4, 32, 8, 1, 16384, 128, False),
]
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def flops(b, hq, hkv, sq, sk, d, causal):
    f = 4.0 * b * hq * sq * sk * d
    return f / 2 if causal and sq == sk else f


def torch_has_enable_gqa():
    q = torch.zeros(1, 2, 1, 4)
    kv = torch.zeros(1, 1, 1, 4)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        return True
    except TypeError:
        return False


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def timed(fn):
    clock = time.process_time if ARGS.clock == "cpu" else time.perf_counter
    t0 = clock()
    fn()
    return (clock() - t0) * 1e3


def bench_shape(shape, dtype_name, gqa_native):
    b, hq, hkv, sq, sk, d, causal = shape
    dt = TORCH_DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(0)
    # fmha_native layout [batch, seqlen, heads, head_dim]
    q = torch.randn(b, sq, hq, d, generator=gen).to(dt)
    k = torch.randn(b, sk, hkv, d, generator=gen).to(dt)
    v = torch.randn(b, sk, hkv, d, generator=gen).to(dt)
    # torch layout [batch, heads, seqlen, head_dim], contiguous
    tq = q.transpose(1, 2).contiguous()
    tk = k.transpose(1, 2).contiguous()
    tv = v.transpose(1, 2).contiguous()
    kw = {}
    if hq != hkv:
        if gqa_native:
            kw["enable_gqa"] = True
        else:
            tk = tk.repeat_interleave(hq // hkv, dim=1)
            tv = tv.repeat_interleave(hq // hkv, dim=1)

    def run_torch():
        return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, **kw)

    def run_ours():
        return fmha_native.forward(q, k, v, causal=causal, device="cpu")

    for _ in range(ARGS.warmup):
        run_torch()
        run_ours()
    t_torch, t_ours = [], []
    for _ in range(ARGS.reps):
        t_torch.append(timed(run_torch))
        t_ours.append(timed(run_ours))

    out, _ = run_ours()
    ref_ms = err = None
    if ARGS.ref_reps > 0:
        qn, kn, vn = (x.float().numpy() for x in (q, k, v))
        times = []
        for _ in range(ARGS.ref_reps):
            t0 = time.perf_counter()
            ref_out, _ = reference.forward(qn, kn, vn, causal=causal)
            times.append((time.perf_counter() - t0) * 1e3)
        ref_ms = statistics.median(times)
        diff = out.double().numpy() - ref_out
        err = float(np.linalg.norm(diff) / max(np.linalg.norm(ref_out), 1e-300))

    plan = fmha_native.explain(q, k, v, causal=causal, device="cpu")
    ms_t, ms_o = statistics.median(t_torch), statistics.median(t_ours)
    return {
        "shape": list(shape[:6]), "dtype": dtype_name, "causal": causal,
        "torch_ms": ms_t, "ours_ms": ms_o, "speedup": ms_t / ms_o,
        "ref_ms": ref_ms, "vs_ref": (ref_ms / ms_o) if ref_ms else None, "err": err,
        "tflops": flops(*shape) / (ms_o * 1e-3) / 1e12, "num_splits": plan["num_splits"],
        "torch_gqa": ("enable_gqa" if gqa_native else "repeat_interleave") if hq != hkv else "-",
    }


def main():
    torch.set_num_threads(ARGS.threads)
    gqa_native = torch_has_enable_gqa()
    info = fmha_native.info()
    print(f"# {cpu_name()}, {ARGS.threads} threads (fmha_native pool {info.get('cpu_threads')}, "
          f"torch {torch.get_num_threads()}), simd {info.get('cpu_simd')}, "
          f"torch {torch.__version__}")
    print(f"# GQA in torch: {'enable_gqa=True' if gqa_native else 'k/v repeat_interleave'}; "
          f"median of {ARGS.reps} alternating runs after {ARGS.warmup} warm-up; "
          f"{'process CPU time' if ARGS.clock == 'cpu' else 'wall clock'}")
    head = (f"{'shape (B,Hq,Hkv,Sq,Sk,D)':<30} {'dtype':<9} {'causal':<6} {'torch ms':>9} "
            f"{'ours ms':>9} {'speedup':>8} {'ref ms':>9} {'vs ref':>7} {'TFLOP/s':>8} "
            f"{'splits':>6} {'err':>8}")
    print(head)
    print("-" * len(head))
    rows = []
    picked = ([SHAPES[int(i)] for i in ARGS.shapes.split(",")] if ARGS.shapes else SHAPES)
    for shape in picked:
        for dtype_name in ARGS.dtypes.split(","):
            r = bench_shape(shape, dtype_name.strip(), gqa_native)
            rows.append(r)
            ref = f"{r['ref_ms']:9.1f}" if r["ref_ms"] is not None else f"{'-':>9}"
            vs = f"{r['vs_ref']:6.0f}x" if r["vs_ref"] is not None else f"{'-':>7}"
            err = f"{r['err']:8.1e}" if r["err"] is not None else f"{'-':>8}"
            print(f"{str(tuple(r['shape'])):<30} {r['dtype']:<9} {str(r['causal']):<6} "
                  f"{r['torch_ms']:9.2f} {r['ours_ms']:9.2f} {r['speedup']:7.2f}x {ref} {vs} "
                  f"{r['tflops']:8.3f} {r['num_splits']:6d} {err}", flush=True)
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump({"cpu": cpu_name(), "threads": ARGS.threads, "clock": ARGS.clock,
                       "simd": info.get("cpu_simd"),
                       "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
