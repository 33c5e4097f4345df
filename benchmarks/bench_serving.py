"""Serving benchmark (issue 20): paged-KV decode against the same decode on a contiguous
cache, and packed (varlen) prefill against the equivalent dense call, in one process,
bf16, with cuDNN (torch SDPA) on the dense problem as the outside reference.

Timing as in bench.py (CUDA events, median of --reps, calls interleaved round by round,
L2 flushed before memory-bound runs).  Lengths, block tables and cu_seqlens live in
device memory, as an engine has them, so every plan is the length-independent one.

    python benchmarks/bench_serving.py [--reps 30] [--json out.json]

Rows:
  paged decode  (B,Hq,Hkv,1,L,D) at full length L: contiguous cache vs pages of 16 and 64
                keys (physical pages shuffled); target paged / contiguous <= 1.05
  varlen        B sequences packed into one call vs the dense [B, S, H, D] call;
                target varlen TFLOP/s >= 0.95x dense; plus a ragged pack (lengths
                uniform in [S/4, S]) reported with its own TFLOP/s
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (timing and peers shared with bench.py)

import fmha_native  # noqa: E402

PAGED_SHAPES = [
    (1, 32, 8, 131072, 128),
    (16, 32, 8, 8192, 128),
    (64, 32, 8, 4096, 128),
    (1, 16, 16, 65536, 64),
]
PAGE_SIZES = (16, 64)
# (batch, heads_q, heads_kv, seqlen, head_dim, causal)
VARLEN_SHAPES = [
    (8, 32, 8, 4096, 128, True),
    (8, 32, 32, 4096, 128, False),
    (16, 16, 16, 2048, 64, True),
]


def randn(*shape, gen):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)


def bench_paged(shape, reps):
    b, hq, hkv, length, d = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = randn(b, 1, hq, d, gen=gen)
    k = randn(b, length, hkv, d, gen=gen)
    v = randn(b, length, hkv, d, gen=gen)
    lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    lse = torch.empty(b, hq, 1, device="cuda", dtype=torch.float32)
    row = {"kind": "paged", "shape": [b, hq, hkv, 1, length, d, False],
           "contiguous_plan": fmha_native.explain(q, k, v, cache_seqlens=lens)["kernel"]}
    fns = {"contiguous": lambda: fmha_native.forward(q, k, v, cache_seqlens=lens, out=out, lse=lse)}
    pages = {}
    for ps in PAGE_SIZES:
        blocks = length // ps
        perm = torch.randperm(b * blocks, generator=torch.Generator().manual_seed(ps)).cuda()
        table = perm.view(b, blocks).to(torch.int32).contiguous()
        kp = torch.empty(b * blocks, ps, hkv, d, device="cuda", dtype=torch.bfloat16)
        vp = torch.empty_like(kp)
        kp[perm] = k.view(b * blocks, ps, hkv, d)
        vp[perm] = v.view(b * blocks, ps, hkv, d)
        pages[ps] = (kp, vp, table)
        row[f"page{ps}_plan"] = fmha_native.explain(q, kp, vp, cache_seqlens=lens, block_table=table)["kernel"]
        fns[f"page{ps}"] = (lambda kp=kp, vp=vp, table=table: fmha_native.forward(
            q, kp, vp, cache_seqlens=lens, block_table=table, out=out, lse=lse))
    fns.update(bench.peer_fns(row, q, k, v, False))
    for name, ms in bench.time_all(fns, reps, True).items():
        row[name + "_ms"] = ms
    # the paged results must equal the contiguous ones (same keys, same order)
    fns["contiguous"]()
    want = out.clone()
    for ps in PAGE_SIZES:
        fns[f"page{ps}"]()
        row[f"page{ps}_max_diff"] = (out.float() - want.float()).abs().max().item()
    kv_bytes = 2 * b * length * hkv * d * 2
    for name in ["contiguous"] + [f"page{ps}" for ps in PAGE_SIZES]:
        row[name + "_gbs"] = kv_bytes / row[name + "_ms"] / 1e6
    for ps in PAGE_SIZES:
        row[f"page{ps}_over_contiguous"] = row[f"page{ps}_ms"] / row["contiguous_ms"]
    return row


def bench_varlen(shape, reps):
    b, hq, hkv, s, d, causal = shape
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = randn(b, s, hq, d, gen=gen)
    k = randn(b, s, hkv, d, gen=gen)
    v = randn(b, s, hkv, d, gen=gen)
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device="cuda")
    qp, kp, vp = (x.reshape(b * s, x.shape[2], d) for x in (q, k, v))
    out = torch.empty_like(q)
    outp = torch.empty_like(qp)
    lse = torch.empty(b, hq, s, device="cuda", dtype=torch.float32)
    lsep = torch.empty(hq, b * s, device="cuda", dtype=torch.float32)
    # a ragged pack with the same total: lengths uniform in [s/4, s], rescaled to the total
    g = torch.Generator().manual_seed(2)
    raw = torch.randint(s // 4, s + 1, (b,), generator=g).double()
    lens = (raw / raw.sum() * b * s).long()
    lens[-1] += b * s - int(lens.sum())
    cu_r = torch.zeros(b + 1, dtype=torch.int32)
    cu_r[1:] = torch.cumsum(lens, 0)
    cu_r = cu_r.cuda()
    row = {"kind": "varlen", "shape": [b, hq, hkv, s, s, d, causal],
           "dense_plan": fmha_native.explain(q, k, v, causal=causal)["kernel"],
           "varlen_plan": fmha_native.explain(qp, kp, vp, causal=causal, cu_seqlens_q=cu,
                                              cu_seqlens_k=cu, max_seqlen_q=s, max_seqlen_k=s)["kernel"],
           "ragged_lengths": [int(x) for x in lens]}
    fns = {
        "dense": lambda: fmha_native.forward(q, k, v, causal=causal, out=out, lse=lse),
        "varlen": lambda: fmha_native.forward(qp, kp, vp, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                              max_seqlen_q=s, max_seqlen_k=s, out=outp, lse=lsep),
        "ragged": lambda: fmha_native.forward(qp, kp, vp, causal=causal, cu_seqlens_q=cu_r, cu_seqlens_k=cu_r,
                                              max_seqlen_q=int(lens.max()), max_seqlen_k=int(lens.max()),
                                              out=outp, lse=lsep),
    }
    fns.update(bench.peer_fns(row, q, k, v, causal))
    for name, ms in bench.time_all(fns, reps, False).items():
        row[name + "_ms"] = ms
    fns["dense"]()
    fns["varlen"]()
    row["varlen_max_diff"] = (outp.view_as(out).float() - out.float()).abs().max().item()
    f = bench.flops(b, hq, hkv, s, s, d, causal)
    ragged_f = sum(bench.flops(1, hq, hkv, int(n), int(n), d, causal) for n in lens)
    row["dense_tflops"] = f / row["dense_ms"] / 1e9
    row["varlen_tflops"] = f / row["varlen_ms"] / 1e9
    row["ragged_tflops"] = ragged_f / row["ragged_ms"] / 1e9
    row["varlen_over_dense_tflops"] = row["varlen_tflops"] / row["dense_tflops"]
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for shape in PAGED_SHAPES:
        rows.append(bench_paged(shape, args.reps))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
    for shape in VARLEN_SHAPES:
        rows.append(bench_varlen(shape, args.reps))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"cuDNN {torch.backends.cudnn.version()}  fmha_native {fmha_native.info()['version']}")
    print(f"{'paged decode (B,Hq,Hkv,L,D)':30s} {'contig ms':>9s} {'p16 ms':>8s} {'p64 ms':>8s} "
          f"{'p16/c':>6s} {'p64/c':>6s} {'c GB/s':>7s} {'cudnn ms':>8s} {'max diff':>8s}")
    for r in rows:
        if r["kind"] != "paged":
            continue
        b, hq, hkv, _, length, d, _ = r["shape"]
        diff = max(r[f"page{ps}_max_diff"] for ps in PAGE_SIZES)
        print(f"{str((b, hq, hkv, length, d)):30s} {r['contiguous_ms']:9.4f} {r['page16_ms']:8.4f} "
              f"{r['page64_ms']:8.4f} {r['page16_over_contiguous']:6.3f} {r['page64_over_contiguous']:6.3f} "
              f"{r['contiguous_gbs']:7.0f} {bench.fmt(r.get('cudnn_ms'), '8.4f')} {diff:8.1e}")
    print(f"{'varlen (B,Hq,Hkv,S,D,causal)':30s} {'dense ms':>9s} {'varlen ms':>9s} {'v/d TF':>7s} "
          f"{'dense TF':>8s} {'ragged TF':>9s} {'cudnn ms':>8s} {'max diff':>8s}  plans (dense / varlen)")
    for r in rows:
        if r["kind"] != "varlen":
            continue
        b, hq, hkv, s, _, d, causal = r["shape"]
        print(f"{str((b, hq, hkv, s, d, int(causal))):30s} {r['dense_ms']:9.4f} {r['varlen_ms']:9.4f} "
              f"{r['varlen_over_dense_tflops']:7.3f} {r['dense_tflops']:8.1f} {r['ragged_tflops']:9.1f} "
              f"{bench.fmt(r.get('cudnn_ms'), '8.4f')} {r['varlen_max_diff']:8.1e}  "
              f"{r['dense_plan']} / {r['varlen_plan']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
