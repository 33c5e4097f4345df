"""Which kernels one call launches, with their launch shapes: for ours and for
torch SDPA's cuDNN backend on the decode rows (or the shapes given), under the
torch profiler, L2 flushed before each call.  Prints, per kernel of the last
call: name, grid, block, registers per thread, shared memory, duration in us, and the
gap since the kernel before; then the call's span on the GPU (first kernel's start to the
last one's end), at the clocks the benchmarks run at (ncu's durations are at base clocks).
--kv fp8 adds our call on the same K/V rounded to e4m3fn (device cache_seqlens at full
length, as bench_features.py and fp8_splits.py run it) beside our bf16 call with the same
cache_seqlens (issue 22: where does an fp8 call's time go besides its producer).

    python benchmarks/tools/kernel_grid.py [--shape B,HQ,HKV,SQ,SK,D ...] [--calls N] [--kv fp8]
"""
import argparse
import json
import os
import sys
import tempfile

import torch
from torch.nn.attention import SDPBackend
from torch.profiler import ProfilerActivity, profile

import fmha_native

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from bench import DECODE_SHAPES, L2_FLUSH_BYTES, make_problem, peer_fn, walkers_per_split  # noqa: E402


def kernels_of(fn, calls, flush):
    """Kernel events (name, grid, block, regs, smem, us) of the last of `calls` calls."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            torch.cuda.synchronize()
            fn()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    kernels.sort(key=lambda e: e["ts"])
    # The flush's kernel opens every call; keep what follows the last one.
    flush_at = [i for i, e in enumerate(kernels) if "elementwise" in e["name"] or "fill" in e["name"].lower()]
    last = kernels[flush_at[-1] + 1:] if flush_at else kernels
    return [(e["name"], e["args"].get("grid"), e["args"].get("block"), e["args"].get("registers per thread"),
             e["args"].get("shared memory"), e["ts"], e["dur"]) for e in last]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", action="append", help="B,HQ,HKV,SQ,SK,D (non-causal)")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--kv", choices=["bf16", "fp8"], default="bf16",
                    help="fp8: also our call on an e4m3fn cache (and bf16 with the same cache_seqlens)")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape] if args.shape else \
        [s[:6] for s in DECODE_SHAPES]
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for shape in shapes:
        q, k, v, out, lse = make_problem(*shape)
        plan = fmha_native.explain(q, k, v)
        cudnn, _ = peer_fn(SDPBackend.CUDNN_ATTENTION, q, k, v, False)
        runs = {f"ours ({plan['num_splits']}x{walkers_per_split(plan)})":
                lambda: fmha_native.forward(q, k, v, out=out, lse=lse), "cudnn": cudnn}
        if args.kv == "fp8":
            kw = {"cache_seqlens": torch.full((shape[0],), shape[4], dtype=torch.int32, device="cuda")}
            k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
            p16, p8 = fmha_native.explain(q, k, v, **kw), fmha_native.explain(q, k8, v8, **kw)
            runs[f"bf16 lens ({p16['num_splits']}x{walkers_per_split(p16)})"] = \
                lambda: fmha_native.forward(q, k, v, out=out, lse=lse, **kw)
            runs[f"fp8 lens ({p8['num_splits']}x{walkers_per_split(p8)})"] = \
                lambda: fmha_native.forward(q, k8, v8, out=out, lse=lse, **kw)
        print(f"== {shape}")
        for who, fn in runs.items():
            kernels = kernels_of(fn, args.calls, flush)
            end = None
            for name, grid, block, regs, smem, ts, us in kernels:
                gap = f" gap {ts - end:5.1f}" if end is not None else ""
                print(f"  {who:18s} {name[:56]:56s} grid={grid} block={block} regs={regs} smem={smem} "
                      f"{us:.1f} us{gap}")
                end = ts + us
            if kernels:
                print(f"  {who:18s} span {end - kernels[0][5]:.1f} us over {len(kernels)} kernels")


if __name__ == "__main__":
    main()
