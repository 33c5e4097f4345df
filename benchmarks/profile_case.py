"""Run one attention problem a few times (for ncu / compute-sanitizer): the
first runs warm up, ncu then profiles the launches it is told to.

    python benchmarks/profile_case.py B HQ HKV SQ SK D causal [num_splits] [reps]
"""
import sys

import torch

import fmha_native

b, hq, hkv, sq, sk, d, causal = (int(x) for x in sys.argv[1:8])
splits = int(sys.argv[8]) if len(sys.argv) > 8 else 0
reps = int(sys.argv[9]) if len(sys.argv) > 9 else 3
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
print(fmha_native.explain(q, k, v, causal=bool(causal), num_splits=splits)["reason"])
for _ in range(reps):
    fmha_native.forward(q, k, v, causal=bool(causal), num_splits=splits)
torch.cuda.synchronize()
