"""Kernel-by-kernel GPU time of one forward (torch.profiler), after an L2 flush
as in bench.py: shows producer vs combine vs gaps for a shape, then the
event-timed median of the same call (what bench.py reports) for comparison.

    python benchmarks/anatomy.py B HQ HKV SQ SK D causal [num_splits]
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import fmha_native

b, hq, hkv, sq, sk, d, causal = (int(x) for x in sys.argv[1:8])
splits = int(sys.argv[8]) if len(sys.argv) > 8 else 0
q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
out, lse = torch.empty_like(q), torch.empty(b, hq, sq, device="cuda")
flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
for _ in range(3):
    fmha_native.forward(q, k, v, causal=bool(causal), num_splits=splits, out=out, lse=lse)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        flush.zero_()
        fmha_native.forward(q, k, v, causal=bool(causal), num_splits=splits, out=out, lse=lse)
    torch.cuda.synchronize()
events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
for e in events[-6:]:
    print(f"{e.name[:70]:70s} start {e.time_range.start:12.1f} us  dur {e.time_range.elapsed_us():8.1f} us")
times = []
for _ in range(30):
    flush.zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fmha_native.forward(q, k, v, causal=bool(causal), num_splits=splits, out=out, lse=lse)
    end.record()
    end.synchronize()
    times.append(start.elapsed_time(end) * 1e3)
print(f"event-timed after a flush: median {sorted(times)[len(times) // 2]:.1f} us, min {min(times):.1f} us")
