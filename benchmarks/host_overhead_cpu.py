"""Host-side cost of one fmha_native call, measured without a GPU.

The parse / validate / tensor-view / plan path that dominates the per-call
cost of a decode step on a GPU is the same code on the CPU: torch CPU tensors
go through DLPack, NumPy arrays through the buffer protocol, and explain()
runs everything up to the plan without running a kernel.  forward() here runs
the CPU backend on a problem so small (one query row, a handful of keys) that
the arithmetic is negligible, so what remains is call overhead plus the CPU
backend's dispatch.  The last rows plan GPU decodes for a described H100 through
the planner tests' hook (plan plus its dict and reason text, no launch).

    python benchmarks/host_overhead_cpu.py [--calls N] [--repeats R] [--device cuda]

Prints per-call microseconds (median over R repeats of N calls each), and how
many times a torch forward call went through torch.Tensor.__dlpack__ (0 when
the C module's torch fast path took every tensor).  --device cuda runs the
torch rows on CUDA tensors (host time only: nothing waits for the GPU inside
the timed loop), for a GPU machine.
"""
import argparse
import statistics
import time

import numpy as np

import fmha_native

try:
    import torch
except ImportError:  # the NumPy rows still run
    torch = None


def per_call_us(fn, calls, repeats):
    for _ in range(min(calls, 200)):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


# Decode-like shapes: one query row per sequence, GQA 4:1, a few keys.
BATCH, SEQLEN_Q, HEADS_Q, HEADS_KV, SEQLEN_K, HEAD_DIM = 1, 1, 4, 1, 8, 16
GPU_HEAD_DIM = 64  # the smallest head_dim the GPU kernels cover


def numpy_rows():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((BATCH, SEQLEN_Q, HEADS_Q, HEAD_DIM)).astype(np.float16)
    k = rng.standard_normal((BATCH, SEQLEN_K, HEADS_KV, HEAD_DIM)).astype(np.float16)
    v = rng.standard_normal((BATCH, SEQLEN_K, HEADS_KV, HEAD_DIM)).astype(np.float16)
    out = np.empty_like(q)
    lse = np.empty((BATCH, HEADS_Q, SEQLEN_Q), dtype=np.float32)
    return [
        ("numpy explain", lambda: fmha_native.explain(q, k, v)),
        ("numpy forward (allocates out/lse)", lambda: fmha_native.forward(q, k, v)),
        ("numpy forward(out=, lse=)", lambda: fmha_native.forward(q, k, v, out=out, lse=lse)),
        ("numpy forward(out=, lse=, num_splits=1)",
         lambda: fmha_native.forward(q, k, v, out=out, lse=lse, num_splits=1)),
        ("numpy memoryview(q) (reference)", lambda: memoryview(q)),
    ]


def torch_inputs(device):
    gen = torch.Generator().manual_seed(0)
    dt = torch.bfloat16
    d = GPU_HEAD_DIM if device != "cpu" else HEAD_DIM
    q = torch.randn(BATCH, SEQLEN_Q, HEADS_Q, d, generator=gen).to(device, dt)
    k = torch.randn(BATCH, SEQLEN_K, HEADS_KV, d, generator=gen).to(device, dt)
    v = torch.randn(BATCH, SEQLEN_K, HEADS_KV, d, generator=gen).to(device, dt)
    out = torch.empty_like(q)
    lse = torch.empty(BATCH, HEADS_Q, SEQLEN_Q, dtype=torch.float32, device=device)
    return q, k, v, out, lse


def dlpack_calls_per_forward(device):
    """torch.Tensor.__dlpack__ calls made by one forward(out=, lse=)."""
    q, k, v, out, lse = torch_inputs(device)
    calls = []
    original = torch.Tensor.__dlpack__

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    torch.Tensor.__dlpack__ = counting
    try:
        fmha_native.forward(q, k, v, out=out, lse=lse)
    finally:
        torch.Tensor.__dlpack__ = original
    return len(calls)


def torch_rows(device="cpu"):
    if torch is None:
        return []
    q, k, v, out, lse = torch_inputs(device)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return [
        ("torch explain", lambda: fmha_native.explain(q, k, v)),
        ("torch _C.explain", lambda: fmha_native._C.explain(q, k, v)),
        ("torch forward (glue allocates out/lse)", lambda: fmha_native.forward(q, k, v)),
        ("torch forward(out=, lse=)", lambda: fmha_native.forward(q, k, v, out=out, lse=lse)),
        ("torch forward(out=, lse=, num_splits=1)",
         lambda: fmha_native.forward(q, k, v, out=out, lse=lse, num_splits=1)),
        ("torch _C.forward(out=, lse=)",
         lambda: fmha_native._C.forward(q, k, v, out=out, lse=lse)),
        ("torch q.__dlpack__() (reference)", lambda: q.__dlpack__()),
        ("torch SDPA (reference)", lambda: torch.nn.functional.scaled_dot_product_attention(
            qt, kt, vt, enable_gqa=True)),
    ]


# The GPU planner on a described H100 (the private hook the planner tests use): the
# split search is on the host path of every GPU call and grows with the keys.
H100 = dict(name="NVIDIA H100 80GB HBM3", arch="sm_90", cc=(9, 0), sm_count=132,
            l2_bytes=50 << 20, max_smem_per_block=227 << 10, max_smem_per_sm=228 << 10)


def planner_rows():
    import _fmha_native

    def decode(batch, seqlen_k, **kw):
        return dict(batch=batch, seqlen_q=1, seqlen_k=seqlen_k, heads_q=32, heads_kv=8,
                    head_dim=128, dtype="bfloat16", causal=0, **kw)

    rows = [("(1,32,8,1,4096,128)", decode(1, 4096)),
            ("(1,32,8,1,131072,128)", decode(1, 131072)),
            ("(32,32,8,1,32768,128) dev lens", decode(32, 32768, device_lengths=1))]
    return [(f"GPU plan (hook) {name}", lambda p=p: _fmha_native._plan_for_device(p, H100))
            for name, p in rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="device of the torch rows")
    args = parser.parse_args()
    if torch is not None:
        torch.set_num_threads(1)
    print(f"fmha_native {fmha_native.__version__}, torch "
          f"{torch.__version__ if torch is not None else 'absent'}, numpy {np.__version__}; "
          f"q [{BATCH},{SEQLEN_Q},{HEADS_Q},{HEAD_DIM}], k/v [{BATCH},{SEQLEN_K},{HEADS_KV},"
          f"{HEAD_DIM}]")
    for name, fn in numpy_rows() + torch_rows(args.device) + planner_rows():
        print(f"{name:44s} {per_call_us(fn, args.calls, args.repeats):8.2f} us/call")
    if torch is not None:
        print(f"torch.Tensor.__dlpack__ calls per forward(out=, lse=) on {args.device}: "
              f"{dlpack_calls_per_forward(args.device)}")


if __name__ == "__main__":
    main()
