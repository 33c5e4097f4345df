"""Model-features benchmark (issue 21): sliding windows, logit softcap and attention sinks
on the GPU against the plain kernels, bf16, one process.

Timing as in bench.py (CUDA events, median of --reps, calls interleaved round by round,
L2 flushed before the memory-bound decode rows).  torch SDPA has no window, softcap or
sink, so the peers (cuDNN, FA2) are timed on the plain problem of each row only, as the
outside reference.

    python benchmarks/bench_features.py [--reps 20] [--json out.json]

Rows:
  window   a windowed call against a dense call over the same number of visible keys per
           row: prefill (B,H,H,S,S,D) causal with window (W, 0) against the non-causal
           (B,H,H,S,W,D); decode (B,Hq,Hkv,1,L,D) at full length with window (W, 0)
           against dense decode over W + 1 keys.  Target: windowed / dense <= 1.10.
  cost     the same problem plain, with softcap 30, with sinks, and with both.  Target:
           each feature / plain <= 1.05.
  head_dim prefill (B,H,H,S,S,D) causal at every GPU head_dim against cuDNN and FA2 on
           the same problem (TFLOP/s; target for 96/192/256: >= cuDNN).
  fp8      (issue 22) decode and speculative verify against a KV cache at full length
           (device cache_seqlens): our bf16 cache, the same values as an fp8 e4m3fn cache
           with a per-tensor and a per-kv-head scale, and cuDNN (bf16) on the plain
           problem; GB/s counted on the bytes each reads, next to a device copy's.
           Targets: decode fp8 / bf16 <= 0.55, speculative bf16 / fp8 >= 1.6.
Every windowed and feature result is checked against the plain kernel run on the keys
it sees (max_diff).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (timing and peers shared with bench.py)

import fmha_native  # noqa: E402

# (batch, heads_q, heads_kv, seqlen, head_dim, window)
WINDOW_PREFILL = [
    (1, 16, 16, 32768, 128, 4096),
    (4, 32, 8, 16384, 128, 1024),
    (2, 16, 16, 32768, 64, 4096),
]
# (batch, heads_q, heads_kv, cache length, head_dim, window)
WINDOW_DECODE = [
    (1, 32, 8, 131072, 128, 4096),
    (16, 32, 8, 8192, 128, 1024),
]
# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal)
COST = [
    (4, 32, 32, 8192, 8192, 128, True),
    (8, 16, 16, 8192, 8192, 64, False),
    (1, 32, 8, 1, 131072, 128, False),
    (4, 32, 8, 16, 16384, 128, True),
]
SOFTCAP = 30.0
# (batch, heads_q, heads_kv, seqlen_q, cache length, head_dim)
FP8 = [
    (1, 32, 8, 1, 131072, 128),
    (16, 32, 8, 1, 8192, 128),
    (64, 32, 8, 1, 4096, 128),
    (1, 16, 16, 1, 65535, 64),
    (4, 32, 8, 16, 16384, 128),
]
# (batch, heads, seqlen, causal) at each head_dim
HEAD_DIM_PROBLEM = (4, 16, 4096, True)
HEAD_DIMS = (32, 64, 80, 96, 128, 192, 256)


def randn(*shape, gen):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)


def max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def bench_window_prefill(shape, reps):
    b, hq, hkv, s, d, w = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = randn(b, s, hq, d, gen=gen), randn(b, s, hkv, d, gen=gen), randn(b, s, hkv, d, gen=gen)
    # The dense problem: every row sees w keys (the windowed rows see w + 1 at most).
    kd, vd = k[:, :w].contiguous(), v[:, :w].contiguous()
    row = {"kind": "window_prefill", "shape": [b, hq, hkv, s, s, d, True], "window": [w, 0],
           "windowed_plan": fmha_native.explain(q, k, v, causal=True, window=(w, 0))["kernel"],
           "dense_plan": fmha_native.explain(q, kd, vd)["kernel"]}
    fns = {"windowed": lambda: fmha_native.forward(q, k, v, causal=True, window=(w, 0)),
           "dense": lambda: fmha_native.forward(q, kd, vd)}
    for name, ms in bench.time_all(fns, reps, False).items():
        row[name + "_ms"] = ms
    # Check: the last query row sees keys [s - 1 - w, s - 1]: the plain kernel on them.
    got = fmha_native.forward(q[:, -1:], k, v, causal=True, window=(w, 0))[0]
    want = fmha_native.forward(q[:, -1:], k[:, s - 1 - w:], v[:, s - 1 - w:])[0]
    row["max_diff"] = max_diff(got, want)
    visible = b * hq * sum(min(i + 1, w + 1) for i in range(s))
    row["windowed_tflops"] = 4.0 * visible * d / row["windowed_ms"] / 1e9
    row["dense_tflops"] = bench.flops(b, hq, hkv, s, w, d, False) / row["dense_ms"] / 1e9
    row["windowed_over_dense"] = row["windowed_ms"] / row["dense_ms"]
    return row


def bench_window_decode(shape, reps):
    b, hq, hkv, length, d, w = shape
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = randn(b, 1, hq, d, gen=gen)
    k, v = randn(b, length, hkv, d, gen=gen), randn(b, length, hkv, d, gen=gen)
    lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
    kd, vd = k[:, length - 1 - w:].contiguous(), v[:, length - 1 - w:].contiguous()
    lens_d = torch.full((b,), w + 1, dtype=torch.int32, device="cuda")
    row = {"kind": "window_decode", "shape": [b, hq, hkv, 1, length, d, True], "window": [w, 0],
           "windowed_plan": fmha_native.explain(q, k, v, causal=True, window=(w, 0),
                                                cache_seqlens=lens)["kernel"],
           "dense_plan": fmha_native.explain(q, kd, vd, cache_seqlens=lens_d)["kernel"]}
    fns = {"windowed": lambda: fmha_native.forward(q, k, v, causal=True, window=(w, 0), cache_seqlens=lens),
           "dense": lambda: fmha_native.forward(q, kd, vd, cache_seqlens=lens_d)}
    for name, ms in bench.time_all(fns, reps, True).items():
        row[name + "_ms"] = ms
    row["max_diff"] = max_diff(fns["windowed"]()[0], fns["dense"]()[0])
    row["windowed_over_dense"] = row["windowed_ms"] / row["dense_ms"]
    return row


def bench_cost(shape, reps):
    b, hq, hkv, sq, sk, d, causal = shape
    gen = torch.Generator(device="cuda").manual_seed(2)
    q = randn(b, sq, hq, d, gen=gen)
    k, v = randn(b, sk, hkv, d, gen=gen), randn(b, sk, hkv, d, gen=gen)
    sinks = torch.randn(hq, device="cuda", dtype=torch.float32, generator=gen)
    kw = {"causal": causal}
    if sq == 1 or sq < sk:  # decode and speculative verify run against a cache
        kw["cache_seqlens"] = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    variants = {"plain": {}, "softcap": {"softcap": SOFTCAP}, "sinks": {"sinks": sinks},
                "both": {"softcap": SOFTCAP, "sinks": sinks}}
    row = {"kind": "cost", "shape": [b, hq, hkv, sq, sk, d, causal],
           "plans": {n: fmha_native.explain(q, k, v, **kw, **x)["kernel"] for n, x in variants.items()}}
    fns = {n: (lambda x=x: fmha_native.forward(q, k, v, **kw, **x)) for n, x in variants.items()}
    fns.update(bench.peer_fns(row, q, k, v, causal and sq == sk))
    for name, ms in bench.time_all(fns, reps, sq <= 16).items():
        row[name + "_ms"] = ms
    for n in ("softcap", "sinks", "both"):
        row[n + "_over_plain"] = row[n + "_ms"] / row["plain_ms"]
    # sinks change only the denominator: out_sinks = out_plain * e^{lse - lse_sinks}
    out_p, lse_p = fns["plain"]()
    out_s, lse_s = fns["sinks"]()
    want = out_p.float() * torch.exp(lse_p - lse_s).transpose(1, 2).unsqueeze(-1)
    row["sinks_max_diff"] = max_diff(out_s, want)
    return row


def bench_head_dim(head_dim, reps):
    b, h, s, causal = HEAD_DIM_PROBLEM
    q, k, v, out, lse = bench.make_problem(b, h, h, s, s, head_dim)
    row = {"kind": "head_dim", "shape": [b, h, h, s, s, head_dim, causal]}
    plan = fmha_native.explain(q, k, v, causal=causal)
    fns = {}
    if plan["supported"]:
        row["plan"] = plan["kernel"]
        fns["ours"] = lambda: fmha_native.forward(q, k, v, causal=causal, out=out, lse=lse)
    else:
        row["plan"] = "refused: " + plan["reason"][:60]
    fns.update(bench.peer_fns(row, q, k, v, causal))
    for name, ms in bench.time_all(fns, reps, False).items():
        row[name + "_ms"] = ms
    f = bench.flops(b, h, h, s, s, head_dim, causal)
    for name in ("ours", "cudnn", "flash"):
        if row.get(name + "_ms"):
            row[name + "_tflops"] = f / row[name + "_ms"] / 1e9
    if row.get("ours_ms") and row.get("cudnn_ms"):
        row["ours_vs_cudnn"] = row["cudnn_ms"] / row["ours_ms"]
    return row


def copy_gbps(reps, nbytes=1 << 30):
    """A device-to-device copy of nbytes: bytes read plus written per second, in GB/s."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench.time_all({"copy": lambda: dst.copy_(src)}, reps, False)["copy"]
    return 2 * nbytes / ms / 1e6


def bench_fp8(shape, reps):
    b, hq, hkv, sq, sk, d = shape
    gen = torch.Generator(device="cuda").manual_seed(3)
    q = randn(b, sq, hq, d, gen=gen)
    k, v = randn(b, sk, hkv, d, gen=gen), randn(b, sk, hkv, d, gen=gen)
    k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    head_scale = torch.full((hkv,), 1.0, dtype=torch.float32, device="cuda")
    causal = sq > 1
    kw = {"causal": causal, "cache_seqlens": torch.full((b,), sk, dtype=torch.int32, device="cuda")}
    variants = {"bf16": (k, v, {}), "fp8": (k8, v8, {"k_scale": 1.0, "v_scale": 1.0}),
                "fp8_head": (k8, v8, {"k_scale": head_scale, "v_scale": head_scale})}
    row = {"kind": "fp8", "shape": [b, hq, hkv, sq, sk, d],
           "plans": {n: fmha_native.explain(q, kk, vv, **kw, **x)["kernel"]
                     for n, (kk, vv, x) in variants.items()}}
    fns = {n: (lambda kk=kk, vv=vv, x=x: fmha_native.forward(q, kk, vv, **kw, **x))
           for n, (kk, vv, x) in variants.items()}
    fns.update(bench.peer_fns(row, q, k, v, False))
    for name, ms in bench.time_all(fns, reps, True).items():
        row[name + "_ms"] = ms
    qo_bytes = 2 * 2 * b * sq * hq * d
    for name, elem in (("bf16", 2), ("fp8", 1), ("fp8_head", 1)):
        row[name + "_gbps"] = (elem * 2 * b * sk * hkv * d + qo_bytes) / row[name + "_ms"] / 1e6
    row["fp8_over_bf16"] = row["fp8_ms"] / row["bf16_ms"]
    row["fp8_head_over_bf16"] = row["fp8_head_ms"] / row["bf16_ms"]
    # the fp8 cache holds k rounded to e4m3: compare with the bf16 call on those values
    want, _ = fmha_native.forward(q, k8.to(torch.bfloat16), v8.to(torch.bfloat16), **kw)
    row["max_diff"] = max_diff(fns["fp8"]()[0], want)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--only", choices=("window", "cost", "head_dim", "fp8"), action="append",
                    help="run only these row kinds (repeatable)")
    args = ap.parse_args()
    groups = {"window": ((bench_window_prefill, WINDOW_PREFILL), (bench_window_decode, WINDOW_DECODE)),
              "cost": ((bench_cost, COST),), "head_dim": ((bench_head_dim, HEAD_DIMS),),
              "fp8": ((bench_fp8, FP8),)}
    rows = []
    for fn, shapes in (g for kind in args.only or list(groups) for g in groups[kind]):
        for shape in shapes:
            try:
                rows.append(fn(shape, args.reps))
            except (NotImplementedError, RuntimeError, ValueError) as exc:
                rows.append({"kind": fn.__name__, "shape": [shape] if isinstance(shape, int) else list(shape),
                             "error": str(exc)[:200]})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
    copy = copy_gbps(args.reps) if "fp8" in (args.only or groups) else None
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"cuDNN {torch.backends.cudnn.version()}  fmha_native {fmha_native.info()['version']}")
    print(f"{'window (B,Hq,Hkv,Sq,Sk,D) W':38s} {'win ms':>8s} {'dense ms':>8s} {'w/d':>6s} "
          f"{'max diff':>8s}  plans (windowed / dense)")
    for r in rows:
        if "error" in r:
            print(f"{r['kind']} {tuple(r['shape'])}: {r['error']}")
        elif r["kind"].startswith("window"):
            print(f"{str(tuple(r['shape'][:6])) + ' ' + str(r['window'][0]):38s} {r['windowed_ms']:8.4f} "
                  f"{r['dense_ms']:8.4f} {r['windowed_over_dense']:6.3f} {r['max_diff']:8.1e}  "
                  f"{r['windowed_plan']} / {r['dense_plan']}")
    print(f"{'cost (B,Hq,Hkv,Sq,Sk,D,causal)':38s} {'plain ms':>8s} {'cap/p':>6s} {'sink/p':>6s} "
          f"{'both/p':>6s} {'cudnn ms':>8s} {'fa2 ms':>8s} {'sink diff':>9s}  plan")
    for r in rows:
        if r["kind"] == "cost" and "error" not in r:
            b, hq, hkv, sq, sk, d, c = r["shape"]
            print(f"{str((b, hq, hkv, sq, sk, d, int(c))):38s} {r['plain_ms']:8.4f} "
                  f"{r['softcap_over_plain']:6.3f} {r['sinks_over_plain']:6.3f} {r['both_over_plain']:6.3f} "
                  f"{bench.fmt(r.get('cudnn_ms'), '8.4f')} {bench.fmt(r.get('flash_ms'), '8.4f')} "
                  f"{r['sinks_max_diff']:9.1e}  {r['plans']['plain']} / {r['plans']['both']}")
    print(f"{'head_dim (B,H,H,S,S,D,causal)':38s} {'ours ms':>8s} {'cudnn ms':>8s} {'fa2 ms':>8s} "
          f"{'ours TF':>7s} {'cudnn TF':>8s} {'vs cuDNN':>8s}  plan")
    for r in rows:
        if r["kind"] == "head_dim" and "error" not in r:
            b, h, _, s, _, d, c = r["shape"]
            print(f"{str((b, h, h, s, s, d, int(c))):38s} {bench.fmt(r.get('ours_ms'), '8.4f')} "
                  f"{bench.fmt(r.get('cudnn_ms'), '8.4f')} {bench.fmt(r.get('flash_ms'), '8.4f')} "
                  f"{bench.fmt(r.get('ours_tflops'), '7.1f')} {bench.fmt(r.get('cudnn_tflops'), '8.1f')} "
                  f"{bench.fmt(r.get('ours_vs_cudnn'), '8.3f')}  {r['plan']}")
    if copy:
        print(f"{'fp8 (B,Hq,Hkv,Sq,Sk,D)':30s} {'bf16 ms':>8s} {'fp8 ms':>8s} {'fp8/bf16':>8s} "
              f"{'head/bf16':>9s} {'cudnn ms':>8s} {'bf16 GB/s':>9s} {'fp8 GB/s':>8s} {'diff':>7s}  "
              f"(device copy {copy:.0f} GB/s)")
    for r in rows:
        if r["kind"] == "fp8" and "error" not in r:
            print(f"{str(tuple(r['shape'])):30s} {r['bf16_ms']:8.4f} {r['fp8_ms']:8.4f} "
                  f"{r['fp8_over_bf16']:8.3f} {r['fp8_head_over_bf16']:9.3f} "
                  f"{bench.fmt(r.get('cudnn_ms'), '8.4f')} {r['bf16_gbps']:9.0f} {r['fp8_gbps']:8.0f} "
                  f"{r['max_diff']:7.1e}  {r['plans']['fp8']}")
    print("command: python benchmarks/bench_features.py " + " ".join(sys.argv[1:]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "copy_gbps": copy, "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
