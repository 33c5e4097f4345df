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


if __name__ == "__main__":
    main()
