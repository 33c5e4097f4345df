"""Decode with device lengths (the plan never sees them) against the same call with
the lengths in host memory (a plan sized by the real lengths), over several spreads
of lengths: issue 20's device/host ratio (target <= 1.03) and the plans' splits.

    python benchmarks/tools/ragged_check.py [--reps 15] [--json rows.json]

Trees side by side (device ms per tree, ratios to the first):
    BENCH=benchmarks/tools/ragged_check.py BENCH_FIXED_ARGS= \
        bash benchmarks/tools/compare_trees.sh "--reps 13" 2 trees/main .
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import bench  # noqa: E402  (time_all: interleaved rounds, zeroing L2 flush)

import fmha_native  # noqa: E402


def lengths_of(kind, batch, capacity, gen):
    if kind == "uniform":
        return torch.randint(1, capacity + 1, (batch,), generator=gen, dtype=torch.int32)
    if kind == "full":
        return torch.full((batch,), capacity, dtype=torch.int32)
    if kind == "quarter":
        return torch.full((batch,), capacity // 4, dtype=torch.int32)
    if kind == "one_long":
        lens = torch.randint(1, capacity // 16 + 1, (batch,), generator=gen, dtype=torch.int32)
        lens[0] = capacity
        return lens
    if kind == "half_empty":
        lens = torch.randint(capacity // 2, capacity + 1, (batch,), generator=gen, dtype=torch.int32)
        lens[batch // 2:] = 0
        return lens
    raise ValueError(kind)


CASES = [  # (batch, heads_q, heads_kv, capacity, head_dim, spread)
    (32, 32, 8, 32768, 128, "uniform"),
    (32, 32, 8, 32768, 128, "full"),
    (32, 32, 8, 32768, 128, "quarter"),
    (32, 32, 8, 32768, 128, "one_long"),
    (32, 32, 8, 32768, 128, "half_empty"),
    (8, 32, 8, 65536, 128, "uniform"),
    (128, 32, 8, 4096, 128, "uniform"),
    (16, 16, 16, 16384, 64, "uniform"),
    (16, 16, 16, 16384, 64, "full"),
    (16, 32, 8, 8192, 128, "full"),
    (16, 32, 8, 8192, 128, "uniform"),
    (64, 32, 8, 4096, 128, "full"),
    (64, 32, 8, 4096, 128, "uniform"),
    (4, 32, 8, 32768, 128, "one_long"),
    (1, 32, 8, 131072, 128, "full"),
    (1, 32, 8, 131072, 128, "uniform"),
]


def kernel_times(fn, calls=20):
    """Mean device time per call of each kernel fn launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return [(e.key, e.device_time_total / calls) for e in prof.key_averages()
            if e.device_time_total > 0 and e.count >= calls]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", help="also write the rows here (compare_trees.sh reads ours_ms)")
    ap.add_argument("--kernels", metavar="SPREAD",
                    help="also time each kernel (torch.profiler) of the rows of this spread")
    ap.add_argument("--only", metavar="SPREAD", help="only the rows of this spread")
    args = ap.parse_args()
    rows = []
    print(f"{'case (B,Hq,Hkv,cap,D) spread':40s} {'sum':>9s} {'dev plan':>9s} {'host plan':>9s} "
          f"{'device ms':>10s} {'host ms':>9s} {'dev/host':>8s}")
    for batch, hq, hkv, cap, d, spread in CASES:
        if args.only and spread != args.only:
            continue
        gen = torch.Generator().manual_seed(batch * 7 + cap)
        lens = lengths_of(spread, batch, cap, gen)
        q = torch.randn(batch, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, cap, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        out = torch.empty_like(q)
        lse = torch.empty(batch, hq, 1, device="cuda", dtype=torch.float32)
        dev = lens.cuda()
        plans = [fmha_native.explain(q, k, v, cache_seqlens=x) for x in (dev, lens)]
        fns = {"device": lambda: fmha_native.forward(q, k, v, cache_seqlens=dev, out=out, lse=lse),
               "host": lambda: fmha_native.forward(q, k, v, cache_seqlens=lens, out=out, lse=lse)}
        ms = bench.time_all(fns, args.reps, True)
        # "d": chunks sized on the device (explain's split rule "device")
        plan = [f"{e['num_splits']}x{bench.walkers_per_split(e)}{'d' * (e['split']['rule'] == 'device')}"
                for e in plans]
        name = f"({batch},{hq},{hkv},{cap},{d}) {spread}"
        print(f"{name:40s} {int(lens.sum()):9d} {plan[0]:>9s} {plan[1]:>9s} {ms['device']:10.4f} "
              f"{ms['host']:9.4f} {ms['device'] / ms['host']:8.3f}", flush=True)
        if spread == args.kernels:
            for mode, fn in fns.items():
                print(f"  {mode} lengths, kernels:")
                for name_k, us in kernel_times(fn):
                    print(f"    {us:9.2f} us  {name_k[:90]}")
        rows.append({"shape": [batch, hq, hkv, cap, d, spread], "ours_ms": ms["device"],
                     "host_ms": ms["host"], "plans": plan})
        del q, k, v
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
