"""Run one attention problem a few times (for ncu / compute-sanitizer): the
first runs warm up, ncu then profiles the launches it is told to.  PEER=cudnn
or PEER=flash in the environment runs torch SDPA with that backend instead of
fmha_native (same tensors, its [B, H, S, D] views), to profile a peer's kernels.
KV=fp8 gives fmha_native K/V as float8_e4m3fn (an fp8 KV cache, factors 1).
WINDOW=left runs fmha_native with window=(left, 0) (a sliding window; peers ignore it).
SOFTCAP=c runs fmha_native with softcap=c (peers ignore it).
LENS=device passes cache_seqlens = SK on the device (the length-independent plan, as
bench_features.py's decode rows do).

    python benchmarks/tools/profile_case.py B HQ HKV SQ SK D causal [num_splits] [reps]
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha_native

b, hq, hkv, sq, sk, d, causal = (int(x) for x in sys.argv[1:8])
splits = int(sys.argv[8]) if len(sys.argv) > 8 else 0
reps = int(sys.argv[9]) if len(sys.argv) > 9 else 3
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
peer = os.environ.get("PEER")
if peer:
    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[peer]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    print(f"torch SDPA, {peer} backend")
    for _ in range(reps):
        with sdpa_kernel(backend):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal), enable_gqa=hq != hkv)
else:
    if os.environ.get("KV") == "fp8":
        k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    kw = {"causal": bool(causal), "num_splits": splits}
    if os.environ.get("WINDOW"):
        kw["window"] = (int(os.environ["WINDOW"]), 0)
    if os.environ.get("SOFTCAP"):
        kw["softcap"] = float(os.environ["SOFTCAP"])
    if os.environ.get("LENS") == "device":
        kw["cache_seqlens"] = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    print(fmha_native.explain(q, k, v, **kw)["reason"])
    for _ in range(reps):
        fmha_native.forward(q, k, v, **kw)
torch.cuda.synchronize()
