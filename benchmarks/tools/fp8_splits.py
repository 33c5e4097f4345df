"""FP8 KV decode (issue 22) at forced split counts: is the heuristic's split count the
fastest for an fp8 cache, whose plans (two CTAs per SM) split twice as finely as bf16's?
Per row: the bf16 call and the fp8 call under the heuristic, then the fp8 call at each
forced count (as explain() clamps it), all timed in the same interleaved rounds with the L2
flushed (bench.time_all); device cache_seqlens at full length, as bench_features.py does.

    python benchmarks/tools/fp8_splits.py [--reps 10] [--splits 4,8,16,24,32,48,64]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import bench  # noqa: E402

import fmha_native  # noqa: E402

ROWS = [(1, 32, 8, 1, 131072, 128), (16, 32, 8, 1, 8192, 128), (64, 32, 8, 1, 4096, 128),
        (1, 16, 16, 1, 65535, 64)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--splits", default="4,8,16,24,32,48,64")
    args = ap.parse_args()
    forced = [int(x) for x in args.splits.split(",")]
    for b, hq, hkv, sq, sk, d in ROWS:
        gen = torch.Generator(device="cuda").manual_seed(3)
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        kw = {"causal": sq > 1, "cache_seqlens": torch.full((b,), sk, dtype=torch.int32, device="cuda")}
        fns, plans = {"bf16": lambda: fmha_native.forward(q, k, v, **kw)}, {}
        plans["bf16"] = fmha_native.explain(q, k, v, **kw)
        for n in [0] + forced:
            plan = fmha_native.explain(q, k8, v8, num_splits=n, **kw)
            name = f"fp8/{n}" if n else "fp8/auto"
            if n and plan["num_splits"] in [plans[x]["num_splits"] for x in plans if x.startswith("fp8/")]:
                continue  # clamped to a count already timed
            plans[name] = plan
            fns[name] = lambda n=n: fmha_native.forward(q, k8, v8, num_splits=n, **kw)
        ms = bench.time_all(fns, args.reps, True)
        print(f"({b},{hq},{hkv},{sq},{sk},{d})")
        for name, t in ms.items():
            p = plans[name]
            print(f"  {name:10s} {p['num_splits']:4d} x {p.get('walkers_per_split', 1)}  {t:8.4f} ms  "
                  f"/bf16 {t / ms['bf16']:6.3f}")


if __name__ == "__main__":
    main()
