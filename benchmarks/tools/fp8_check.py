"""A quick device look at the fp8 KV cache (issue 22): GPU against the float64
reference on a few decode / speculative / prefill / paged shapes, then fp8 against
bf16 decode times on the issue's rows (CUDA events, interleaved, median).  The full
tests are tests/test_gpu_fp8.py and the benchmark rows bench_features.py --only fp8;
this is the first look of a device call.
    python3 benchmarks/tools/fp8_check.py
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fmha_native  # noqa: E402
from fmha_native import reference  # noqa: E402
from bench import time_all  # noqa: E402

dev = torch.device("cuda")


def codes(shape, rng, scale=2.0):
    return reference.quantize_e4m3(rng.standard_normal(shape).astype(np.float32) * scale)


def check(b, hq, hkv, sq, sk, d, dtype, causal, lens=None, page=None, splits=0, kscale=0.5,
          vscale=0.25):
    rng = np.random.default_rng(b * 1000 + sq * 7 + sk + d)
    q = (rng.standard_normal((b, sq, hq, d)) * 0.5).astype(np.float32)
    kc, vc = codes((b, sk, hkv, d), rng), codes((b, sk, hkv, d), rng)
    kw = dict(causal=causal, k_scale=kscale, v_scale=vscale, num_splits=splits)
    ref_kw = dict(kw)
    if lens is not None:
        kw["cache_seqlens"] = torch.tensor(lens, dtype=torch.int32, device=dev)
        ref_kw["cache_seqlens"] = np.array(lens, dtype=np.int32)
    tq = torch.from_numpy(q).to(dev, dtype)
    qref = tq.float().cpu().numpy()
    tk = torch.from_numpy(kc).to(dev).view(torch.float8_e4m3fn)
    tv = torch.from_numpy(vc).to(dev).view(torch.float8_e4m3fn)
    if page is not None:
        nblk = b * sk // page
        perm = rng.permutation(nblk)
        bt = perm.reshape(b, sk // page).astype(np.int32)
        kp = np.empty((nblk, page, hkv, d), np.uint8)
        vp = np.empty_like(kp)
        kp[bt.reshape(-1)] = kc.reshape(nblk, page, hkv, d)
        vp[bt.reshape(-1)] = vc.reshape(nblk, page, hkv, d)
        tk = torch.from_numpy(kp).to(dev).view(torch.float8_e4m3fn)
        tv = torch.from_numpy(vp).to(dev).view(torch.float8_e4m3fn)
        kw["block_table"] = torch.from_numpy(bt).to(dev)
        kw.setdefault("cache_seqlens", torch.full((b,), sk, dtype=torch.int32, device=dev))
        ref_kw.setdefault("cache_seqlens", np.full((b,), sk, dtype=np.int32))
    out, lse = fmha_native.forward(tq, tk, tv, **kw)
    ro, rl = reference.forward(qref, kc, vc, kv_dtype="e4m3fn",
                               **{k: v for k, v in ref_kw.items() if k != "num_splits"})
    err = np.abs(out.float().cpu().numpy() - ro).max()
    lerr = np.nanmax(np.abs(lse.cpu().numpy() - rl))
    plan = fmha_native.explain(tq, tk, tv, **kw)
    ok = err < 2e-2 and lerr < 1e-3
    print(f"{'ok  ' if ok else 'FAIL'} {(b, hq, hkv, sq, sk, d)} {str(dtype)[6:]} causal={causal} "
          f"lens={lens is not None} page={page} splits={splits}: out err {err:.2e} lse err "
          f"{lerr:.2e}  {plan['kernel']}")
    return ok


def timing(reps=30):
    rows = [(1, 32, 8, 1, 131072, 128), (16, 32, 8, 1, 8192, 128), (64, 32, 8, 1, 4096, 128),
            (1, 16, 16, 1, 65535, 64), (4, 32, 8, 16, 16384, 128)]
    print(f"{'shape':32} {'bf16 ms':>9} {'fp8 ms':>9} {'fp8/bf16':>9} {'fp8 GB/s':>9}")
    for b, hq, hkv, sq, sk, d in rows:
        q = torch.randn(b, sq, hq, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, sk, hkv, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        lens = torch.full((b,), sk, dtype=torch.int32, device=dev)
        causal = sq > 1
        fns = {"bf16": lambda: fmha_native.forward(q, k, v, causal=causal, cache_seqlens=lens),
               "fp8": lambda: fmha_native.forward(q, k8, v8, causal=causal, cache_seqlens=lens,
                                                  k_scale=1.0, v_scale=1.0)}
        t = time_all(fns, reps, True)
        gb = (2 * b * sk * hkv * d + 2 * 2 * b * sq * hq * d) / t["fp8"] / 1e6
        print(f"{str((b, hq, hkv, sq, sk, d)):32} {t['bf16']:9.4f} {t['fp8']:9.4f} "
              f"{t['fp8'] / t['bf16']:9.3f} {gb:9.0f}")


def main():
    if os.environ.get("FP8_CHECK_ONLY_TIMING"):
        timing()
        return
    ok = True
    for dtype in (torch.bfloat16, torch.float16):
        ok &= check(1, 8, 2, 1, 1000, 128, dtype, False)
        ok &= check(3, 8, 2, 1, 777, 64, dtype, False, lens=[777, 5, 0])
        ok &= check(2, 16, 4, 16, 1024, 128, dtype, True, lens=[1024, 300])
        ok &= check(1, 4, 4, 300, 300, 128, dtype, True)
        ok &= check(2, 8, 2, 1, 512, 128, dtype, False, page=16)
        ok &= check(2, 8, 2, 5, 512, 64, dtype, True, page=64, splits=3)
        ok &= check(2, 32, 8, 16, 1024, 128, dtype, True, splits=2, kscale=3.0)
        for d in (32, 80, 96, 192):
            ok &= check(1, 8, 2, 3, 333, d, dtype, True)
            ok &= check(1, 4, 2, 100, 200, d, dtype, True)
    print("correctness", "ok" if ok else "FAILED")
    timing()


if __name__ == "__main__":
    main()
