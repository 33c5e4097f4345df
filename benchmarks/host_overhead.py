"""Host-side cost of one fmha_native.forward call on torch CUDA tensors (tiny
problem, so the GPU is never the bottleneck), split into its Python-visible
parts, against torch SDPA's call overhead.

    python benchmarks/host_overhead.py
"""
import time

import torch
import torch.nn.functional as F

import fmha_native


def per_call_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main():
    q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 256, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    lse = torch.empty(1, 32, 1, device="cuda", dtype=torch.float32)
    stream = torch.cuda.current_stream().cuda_stream
    # A small prefill: on an sm_90a build and a Hopper GPU it runs the TMA kernel, whose
    # tensor maps are cached per (pointer, shape, strides), so a repeated call encodes none.
    pq = torch.randn(1, 128, 8, 128, device="cuda", dtype=torch.bfloat16)
    pk, pv, pout = torch.randn_like(pq), torch.randn_like(pq), torch.empty_like(pq)
    plse = torch.empty(1, 8, 128, device="cuda", dtype=torch.float32)
    print(f"prefill row runs {fmha_native.explain(pq, pk, pv)['kernel']}")
    rows = [
        ("prefill forward(out=, lse=)", lambda: fmha_native.forward(pq, pk, pv, out=pout, lse=plse)),
        ("forward (glue allocates out/lse)", lambda: fmha_native.forward(q, k, v)),
        ("forward(out=, lse=)", lambda: fmha_native.forward(q, k, v, out=out, lse=lse)),
        ("forward(out=, lse=, num_splits=1)", lambda: fmha_native.forward(q, k, v, out=out, lse=lse, num_splits=1)),
        ("_C.forward(out=, lse=, stream=)", lambda: fmha_native._C.forward(q, k, v, out=out, lse=lse, stream=stream)),
        ("explain", lambda: fmha_native.explain(q, k, v)),
        ("q.__dlpack__()", lambda: q.__dlpack__()),
        ("torch.cuda.current_stream()", lambda: torch.cuda.current_stream(q.device).cuda_stream),
        ("torch SDPA (flash)", lambda: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)),
    ]
    for name, fn in rows:
        print(f"{name:40s} {per_call_us(fn):8.1f} us/call")

    # A decode step with device lengths, captured once and replayed (issue 20): the
    # replay's host cost is the graph launch's, next to a graph of torch SDPA's step.
    kc = torch.randn(4, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q4 = torch.randn(4, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    out4 = torch.empty_like(q4)
    lse4 = torch.empty(4, 32, 1, device="cuda", dtype=torch.float32)
    lens = torch.full((4,), 3000, dtype=torch.int32, device="cuda")
    graphs = {
        "graph replay: forward(cache_seqlens=)": lambda: fmha_native.forward(
            q4, kc, vc, cache_seqlens=lens, out=out4, lse=lse4),
        "graph replay: torch SDPA": lambda: F.scaled_dot_product_attention(
            q4.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2), enable_gqa=True),
    }
    for name, step in graphs.items():
        step()  # warm-up outside the capture (first-call attributes, workspaces)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        print(f"{name:40s} {per_call_us(graph.replay):8.1f} us/call")


if __name__ == "__main__":
    main()
