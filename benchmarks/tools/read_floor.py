"""The read floor of a decode row: how fast can *any* kernel read its K and V under
bench.py's L2 flush?  A kernel that only reads K and V (16-byte loads, XOR of the
words, one word per thread written) is timed in the same process and rounds as ours
and cuDNN, over a few launch shapes, access patterns and L2 policies; the best of
them bounds what an attention kernel could reach on this machine and flush.

    python benchmarks/tools/read_floor.py [--flush zero|clean] [--reps 30] [--shape B,HQ,HKV,SQ,SK,D ...]

Needs cupy (the read kernel is compiled with NVRTC).  Every read configuration is
checked once: the XOR of its outputs must equal the XOR of K and V computed on the host.
"""
import argparse
import itertools
import os
import sys

import cupy as cp
import numpy as np
import torch

import fmha_native

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import bench  # noqa: E402

SOURCE = r"""
typedef unsigned long long u64;
__device__ __forceinline__ uint4 load16(const uint4 *p, u64 policy) {
    uint4 v;
#if EVICT_FIRST
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
#else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#endif
    return v;
}

// K (na chunks of 16 bytes) then V (nb chunks) as one index space.  CHUNKED: block b
// reads the contiguous range b/grid of it (a split's pattern); else a grid-stride walk.
extern "C" __global__ void read_kv(const uint4 *a, long long na, const uint4 *b, long long nb,
                                   unsigned *out) {
    u64 policy = 0;
#if EVICT_FIRST
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
    const long long n = na + nb;
#if CHUNKED
    const long long per = (n + gridDim.x - 1) / gridDim.x;
    const long long begin = blockIdx.x * per, end = min(n, begin + per);
    long long i = begin + threadIdx.x;
    const long long stride = blockDim.x;
#else
    const long long end = n;
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
#endif
    unsigned acc = 0;
    for (; i < end; i += stride * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const long long j = i + u * stride;
            v[u] = j < end ? load16(j < na ? a + j : b + (j - na), policy) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    out[blockIdx.x * (long long)blockDim.x + threadIdx.x] = acc;
}
"""

# (chunked, evict_first, blocks per SM, threads, unroll)
CONFIGS = list(itertools.product((0, 1), (0, 1), (2, 4), (512,), (4, 8)))


def host_xor(*tensors):
    acc = np.uint32(0)
    for t in tensors:
        acc ^= np.bitwise_xor.reduce(t.contiguous().view(torch.int32).cpu().numpy().view(np.uint32).ravel())
    return int(acc)


def read_fns(k, v, sms):
    """name -> fn for every read configuration, each checked against the host XOR once."""
    want = host_xor(k, v)
    na, nb = k.numel() * 2 // 16, v.numel() * 2 // 16
    fns = {}
    for chunked, evict, per_sm, threads, unroll in CONFIGS:
        kern = cp.RawKernel(SOURCE, "read_kv", options=(
            f"-DCHUNKED={chunked}", f"-DEVICT_FIRST={evict}", f"-DUNROLL={unroll}"))
        grid = sms * per_sm
        out = cp.empty(grid * threads, dtype=cp.uint32)
        args = (cp.uint64(k.data_ptr()), cp.int64(na), cp.uint64(v.data_ptr()), cp.int64(nb), out)

        def run(kern=kern, grid=grid, threads=threads, args=args):
            kern((grid,), (threads,), args)

        run()
        cp.cuda.runtime.deviceSynchronize()
        got = int(np.bitwise_xor.reduce(out.get()))
        name = f"read_{'chunk' if chunked else 'stride'}_{'ef' if evict else 'n'}_{per_sm}x{threads}u{unroll}"
        assert got == want, f"{name}: XOR {got:#x} != host {want:#x}"
        fns[name] = run
    return fns


def row(shape, reps, sms):
    b, hq, hkv, sq, sk, d = shape
    q, k, v, out, lse = bench.make_problem(b, hq, hkv, sq, sk, d)
    fns = {"ours": lambda: fmha_native.forward(q, k, v, out=out, lse=lse)}
    peers = bench.peer_fns({}, q, k, v, False)
    if "cudnn" in peers:
        fns["cudnn"] = peers["cudnn"]
    kc, vc = torch.empty_like(k), torch.empty_like(v)

    def copy():
        kc.copy_(k)
        vc.copy_(v)

    fns["copy"] = copy
    fns.update(read_fns(k, v, sms))
    times = bench.time_all(fns, reps, True)
    kv = 2 * k.numel() * 2
    reads = {n: t for n, t in times.items() if n.startswith("read_")}
    best = min(reads, key=reads.get)
    print(f"{str(shape):28s} K+V {kv / 1e6:6.0f} MB  ours {times['ours'] * 1e3:6.1f} us  "
          f"cudnn {times.get('cudnn', float('nan')) * 1e3:6.1f}  read floor {reads[best] * 1e3:6.1f} "
          f"({kv / reads[best] / 1e6:4.0f} GB/s, {best})  copy {times['copy'] * 1e3:6.1f} "
          f"({2 * kv / times['copy'] / 1e6:4.0f} GB/s read+write)", flush=True)
    print("   " + "  ".join(f"{n[5:]} {t * 1e3:.1f}" for n, t in sorted(reads.items())), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flush", choices=["zero", "clean"], default="zero")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--shape", action="append", metavar="B,HQ,HKV,SQ,SK,D")
    args = ap.parse_args()
    bench.FLUSH_MODE = args.flush
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape] if args.shape else \
        [s[:6] for s in bench.DECODE_SHAPES if s[3] == 1]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device: {torch.cuda.get_device_name()}  flush {args.flush}  reps {args.reps}  "
          f"cuDNN {torch.backends.cudnn.version()}  (times: median us)")
    for s in shapes:
        row(s, args.reps, sms)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
