"""Quick GPU parity sweep for a device session: fmha_native on torch CUDA tensors
against a float64 softmax(QK^T)V computed by torch on the same GPU, over dtypes,
head dims, causal, GQA/MQA, odd lengths, seqlen_q > seqlen_k and forced splits.
Prints one line per case and a summary; exits 1 on any failure. (The pytest suite
is the contract; this is the fast first look after a kernel change.)

    python benchmarks/gpu_check.py [--quick]
"""
import itertools
import math
import sys

import torch

import fmha_native

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def reference(q, k, v, causal, scale, seqlens_k=None):
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    kd = kd.repeat_interleave(hq // hkv, dim=1)
    vd = vd.repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("bhid,bhjd->bhij", qd, kd) * scale
    lens = seqlens_k if seqlens_k is not None else torch.full((b,), sk, device=q.device)
    j = torch.arange(sk, device=q.device)
    i = torch.arange(sq, device=q.device)
    visible = j[None, None, :] < lens[:, None, None]
    if causal:
        visible = visible & (j[None, None, :] <= i[None, :, None] + lens[:, None, None] - sq)
    s = s.masked_fill(~visible[:, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("bhij,bhjd->bhid", p, vd).transpose(1, 2)
    return out, lse


def case(dtype, d, causal, b, hq, hkv, sq, sk, splits, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    out, lse = fmha_native.forward(q, k, v, causal=causal, num_splits=splits)
    plan = fmha_native.explain(q, k, v, causal=causal, num_splits=splits)
    torch.cuda.synchronize()
    ref, ref_lse = reference(q, k, v, causal, 1.0 / math.sqrt(d))
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    finite = torch.isfinite(ref_lse)
    lse_err = (lse.double()[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
    empty_ok = bool((lse[~finite] == float("-inf")).all() and (out.transpose(1, 2)[~finite] == 0).all())
    ok = err <= TOL[dtype] and lse_err <= 1e-2 and empty_ok and not torch.isnan(out).any()
    return ok, err, lse_err, plan


def main():
    cases = []
    for dtype, d, causal in itertools.product((torch.bfloat16, torch.float16), (64, 128), (False, True)):
        for (b, hq, hkv, sq, sk) in ((2, 4, 4, 113, 1000), (1, 8, 2, 1, 4097), (2, 8, 1, 17, 300),
                                     (1, 4, 4, 300, 100), (1, 16, 2, 1000, 1000), (3, 4, 4, 1, 77),
                                     (2, 8, 2, 16, 2000), (1, 4, 4, 50, 700)):
            for splits in (0, 1, 2, 3, 256):
                cases.append((dtype, d, causal, b, hq, hkv, sq, sk, splits))
    if "--quick" in sys.argv:
        cases = cases[::7]
    fails = 0
    for i, c in enumerate(cases):
        ok, err, lse_err, plan = case(*c, seed=i)
        fails += not ok
        if not ok or i % 10 == 0:
            print(f"{'ok  ' if ok else 'FAIL'} {str(c[0])[6:]:8s} d={c[1]:3d} causal={c[2]:d} "
                  f"b,hq,hkv,sq,sk={c[3:8]} splits={c[8]}->{plan['num_splits']} {plan['kernel']:34s} "
                  f"err={err:.2e} lse_err={lse_err:.2e}", flush=True)
    print(f"gpu_check: {len(cases) - fails} passed, {fails} failed")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
