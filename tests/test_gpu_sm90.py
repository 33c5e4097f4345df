"""The Hopper prefill kernel (kernels/fwd_sm90.h) through fmha_native.forward on torch CUDA
tensors, against the float64 reference: odd lengths, seqlen_q above and far below
seqlen_k, causal and not, GQA ratios 1/4/8/16, head_dim 32/64/80/96/128/192/256, float16/bfloat16, strided
views, strides TMA cannot address (the tensor-core tiles run those), bitwise determinism,
FMHA_GPU_PREFILL_KERNEL, and the model features (window, softcap, sinks: issue 21).  Every
sm90 case first checks that explain() names the sm90 kernel for its tensors, so none passes
on another kernel.  Everything skips, saying why,
without a cc 9.x GPU, torch with CUDA, or sm_90a code in this build."""
import json
import math
import os
import subprocess
import sys

import pytest

import _fmha_native
import fmha_native
from fmha_native import reference
from _harness import NO_GPU_REASON, as_f64, assert_close, bits, gpu_devices, torch_cuda

pytestmark = pytest.mark.gpu

SM90 = "fwd_sm90<"
MMA = "fwd_mma<"
TORCH_DTYPE = {"f16": "float16", "bf16": "bfloat16"}

# A described Hopper without archs_built: the planner then asks this build's archs.
_HOPPER = dict(name="described H100", arch="sm_90", cc=(9, 0), sm_count=132,
               l2_bytes=50 << 20, max_smem_per_block=227 << 10, max_smem_per_sm=228 << 10)
_PREFILL = dict(batch=2, seqlen_q=4096, seqlen_k=4096, heads_q=16, heads_kv=16, head_dim=128,
                dtype="bfloat16", causal=0)


def _skip_reason():
    devices = gpu_devices()
    if not devices:
        return NO_GPU_REASON
    if not torch_cuda():
        return "needs torch with CUDA"
    dev = devices[0]
    if dev.get("platform") != "cuda" or dev.get("cc_major") != 9:
        return f"needs a cc 9.x GPU as device 0 (it is {dev.get('name')}, {dev.get('arch')})"
    if "no sm_90a code" in _fmha_native._plan_for_device(_PREFILL, _HOPPER)["reason"]:
        return "this build has no sm_90a code (FMHA_CUDA_ARCHS without 90a)"
    if os.environ.get("FMHA_GPU_PREFILL_KERNEL", "") not in ("", "auto", "sm90"):
        return "FMHA_GPU_PREFILL_KERNEL turns the sm90 kernel off in this process"
    return None


@pytest.fixture(scope="module")
def torch():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    import torch as torch_module
    return torch_module


def randn(torch, shape, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32)
    return x.to(getattr(torch, TORCH_DTYPE[dtype]))


def qkv(torch, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, seed):
    return (randn(torch, (batch, seqlen_q, heads_q, head_dim), dtype, seed),
            randn(torch, (batch, seqlen_k, heads_kv, head_dim), dtype, seed + 1),
            randn(torch, (batch, seqlen_k, heads_kv, head_dim), dtype, seed + 2))


def batch_for(seqlen_q, heads_q):
    """Batch entries giving at least two waves of 128-row tiles on 132 SMs, so the split
    rule keeps every case below in one split (the sm90 kernel's condition)."""
    return max(1, math.ceil(2 * 132 / (heads_q * math.ceil(seqlen_q / 128))))


def check(q, k, v, dtype, kernel=SM90, **kw):
    """explain() names `kernel` for these tensors; forward matches the reference."""
    plan = fmha_native.explain(q, k, v, **kw)
    assert plan["kernel"].startswith(kernel), f"{plan['kernel']}: {plan['reason']}"
    out, lse = fmha_native.forward(q, k, v, **kw)
    ref_kw = {key: kw[key] for key in ("causal", "softmax_scale") if key in kw}
    ref_out, ref_lse = reference.forward(q, k, v, **ref_kw)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype, what=plan["kernel"])
    return plan, out, lse


# (seqlen_q, seqlen_k): lengths that are not tile multiples, seqlen_q above seqlen_k
# (causal rows that see no key) and far below it
LENGTHS = [(1003, 1), (1003, 17), (1003, 127), (1003, 129), (1003, 1003), (17, 1003),
           (127, 1003), (129, 1003), (129, 2049)]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", LENGTHS)
def test_lengths(torch, seqlen_q, seqlen_k, causal, head_dim, dtype):
    heads_q, heads_kv = 8, 2
    batch = batch_for(seqlen_q, heads_q)
    q, k, v = qkv(torch, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype,
                  seed=seqlen_q * 7 + seqlen_k + head_dim)
    check(q, k, v, dtype, causal=causal)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("group", [1, 4, 8, 16])
def test_gqa_ratios(torch, group, causal, head_dim, dtype):
    heads_kv = 2
    heads_q = heads_kv * group
    batch = batch_for(257, heads_q)
    q, k, v = qkv(torch, batch, 257, 515, heads_q, heads_kv, head_dim, dtype, seed=group * 31)
    check(q, k, v, dtype, causal=causal)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_custom_scale(torch, head_dim):
    q, k, v = qkv(torch, 4, 300, 700, 8, 8, head_dim, "bf16", seed=77)
    check(q, k, v, "bf16", causal=True, softmax_scale=0.3)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_slices_of_a_packed_qkv(torch, head_dim):
    """q, k and v as slices of one [batch, seqlen, heads_q + 2 heads_kv, head_dim] tensor:
    non-contiguous, with 16-byte strides and bases, so TMA reads them in place."""
    batch, seqlen, heads_q, heads_kv = 4, 515, 16, 4
    packed = randn(torch, (batch, seqlen, heads_q + 2 * heads_kv, head_dim), "bf16", seed=5)
    q = packed[:, :, :heads_q]
    k = packed[:, :, heads_q:heads_q + heads_kv]
    v = packed[:, :, heads_q + heads_kv:]
    assert not q.is_contiguous() and not k.is_contiguous()
    check(q, k, v, "bf16", causal=True)


def test_sdpa_layout_transposed(torch):
    """[batch, heads, seqlen, head_dim] tensors transposed to the library's layout."""
    batch, seqlen, heads = 4, 777, 8
    q, k, v = (randn(torch, (batch, heads, seqlen, 128), "f16", seed=s).transpose(1, 2)
               for s in (1, 2, 3))
    check(q, k, v, "f16")


@pytest.mark.parametrize("what", ["head_stride", "base_8_bytes"])
def test_inputs_tma_cannot_address_run_on_the_old_kernel(torch, what):
    batch, seqlen, heads, head_dim = 4, 300, 8, 128
    pad, start = (4, 0) if what == "head_stride" else (8, 4)
    bufs = [randn(torch, (batch, seqlen, heads, head_dim + pad), "bf16", seed=s) for s in (1, 2, 3)]
    q, k, v = (b[..., start:start + head_dim] for b in bufs)
    plan, _, _ = check(q, k, v, "bf16", kernel=MMA, causal=True)
    assert "not fwd_sm90" in plan["reason"] and "16-byte multiples" in plan["reason"], \
        plan["reason"]


def test_out_tma_cannot_address_runs_on_the_old_kernel(torch):
    """An out that starts 4 bytes past a 16-byte boundary: written in place by the
    tensor-core tiles (element pairs), which TMA stores could not do."""
    batch, seqlen, heads, head_dim = 4, 300, 8, 64
    q, k, v = qkv(torch, batch, seqlen, seqlen, heads, heads, head_dim, "f16", seed=9)
    buf = torch.full((batch, seqlen, heads, head_dim + 8), 7.0, device="cuda",
                     dtype=torch.float16)
    out = buf[..., 2:2 + head_dim]
    plan = fmha_native.explain(q, k, v, out=out)
    assert plan["kernel"].startswith(MMA), f"{plan['kernel']}: {plan['reason']}"
    res, lse = fmha_native.forward(q, k, v, out=out)
    assert res is out
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16")
    # nothing outside out was written
    assert bool((buf[..., :2] == 7.0).all()) and bool((buf[..., 2 + head_dim:] == 7.0).all())


@pytest.mark.parametrize("dtype,head_dim,causal,want", [
    ("bf16", 128, True, "fwd_sm90<bfloat16,d128,causal,"),
    ("f16", 64, False, "fwd_sm90<float16,d64,pingpong>"),  # 32 key blocks per row: ping-pong
])
def test_explain_names_the_sm90_kernel(torch, dtype, head_dim, causal, want):
    q, k, v = qkv(torch, 2, 4096, 4096, 16, 4, head_dim, dtype, seed=3)
    plan = fmha_native.explain(q, k, v, causal=causal)
    assert plan["kernel"].startswith(want), plan["kernel"]
    assert plan["kernel_id"] == 3 and plan["num_splits"] == 1
    assert plan["block_m"] == {64: 192, 128: 128}[head_dim] and plan["pack_gqa"] is False
    assert plan["reason"].startswith("Hopper prefill"), plan["reason"]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bitwise_deterministic(torch, causal):
    q, k, v = qkv(torch, 2, 2048, 2048, 16, 4, 128, "bf16", seed=12)
    plan, out1, lse1 = check(q, k, v, "bf16", causal=causal)
    out2, lse2 = fmha_native.forward(q, k, v, causal=causal)
    assert bits(out1) == bits(out2) and bits(lse1) == bits(lse2), plan["kernel"]


# --------------------------------------------- FMHA_GPU_PREFILL_KERNEL (read once per process)

_SCRIPT = """
import json, sys
import torch
import fmha_native
from fmha_native import reference
from _harness import as_f64, assert_close
results = []
for case in json.loads(sys.argv[1]):
    b, sq, sk, hq, hkv, d, dtype, causal = case
    gen = torch.Generator(device="cuda").manual_seed(sq * 1000 + sk + d)
    tdtype = getattr(torch, {"f16": "float16", "bf16": "bfloat16"}[dtype])
    q, k, v = (torch.randn(shape, generator=gen, device="cuda").to(tdtype)
               for shape in ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d)))
    plan = fmha_native.explain(q, k, v, causal=causal)
    out, lse = fmha_native.forward(q, k, v, causal=causal)
    ref_out, ref_lse = reference.forward(q, k, v, causal=causal)
    error = None
    try:
        assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype)
    except AssertionError as exc:
        error = str(exc)
    results.append({"case": case, "kernel": plan["kernel"], "reason": plan["reason"],
                    "num_splits": plan["num_splits"], "error": error})
print(json.dumps(results))
"""


def _run_with(value, cases):
    env = dict(os.environ, FMHA_GPU_PREFILL_KERNEL=value)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(fmha_native.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_parent, tests_dir, env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(cases)], capture_output=True,
                         text=True, env=env, cwd=tests_dir, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_env_mma_keeps_the_old_kernel(torch):
    cases = [[2, 1024, 1024, 16, 4, 128, "bf16", True], [2, 1024, 1024, 16, 16, 64, "f16", False]]
    for r in _run_with("mma", cases):
        assert r["kernel"].startswith(MMA), r
        assert "FMHA_GPU_PREFILL_KERNEL=mma" in r["reason"], r
        assert r["error"] is None, r


def test_env_sm90_runs_the_shapes_auto_gives_other_kernels(torch):
    """Under FMHA_GPU_PREFILL_KERNEL=sm90 the kernel takes one-row queries (the decode
    tiles' shapes), packable query heads and few tiles over long keys (which the split
    rule would split), unsplit: tiles of one to a few valid rows."""
    cases = [[1, 1, 1003, 4, 4, 128, "bf16", False],     # 1 row, MHA
             [2, 1, 1003, 32, 2, 64, "f16", True],       # 1 row, GQA 16
             [1, 1, 1, 8, 8, 64, "bf16", True],          # one query, one key
             [3, 17, 17, 8, 2, 128, "f16", True],        # 68 packable rows
             [1, 129, 16384, 2, 1, 128, "bf16", True],   # 4 tiles, 128 key blocks
             [1, 1003, 129, 4, 4, 64, "f16", True]]      # causal rows with no key
    results = _run_with("sm90", cases)
    assert len(results) == len(cases)
    for r in results:
        assert r["kernel"].startswith(SM90) and r["num_splits"] == 1, r
        assert r["error"] is None, r


# ----------------------------------------------------- packed (varlen) sequences on sm90

def packed(torch, lengths, heads, head_dim, dtype, seed):
    """A packed [total, heads, head_dim] tensor and its int32 cu_seqlens on the GPU."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    x = randn(torch, (cu[-1], heads, head_dim), dtype, seed)
    return x, torch.tensor(cu, dtype=torch.int32, device="cuda")


def check_packed(q, k, v, dtype, **kw):
    """explain() names the sm90 kernel for this packed call; forward matches the reference,
    sequence by sequence (the reference splits the packed rows itself)."""
    plan = fmha_native.explain(q, k, v, **kw)
    assert plan["kernel"].startswith(SM90), f"{plan['kernel']}: {plan['reason']}"
    out, lse = fmha_native.forward(q, k, v, **kw)
    ref_kw = {key: kw[key] for key in ("causal", "cu_seqlens_q", "cu_seqlens_k") if key in kw}
    ref_out, ref_lse = reference.forward(q, k, v, **ref_kw)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype, what=plan["kernel"])
    return plan, out, lse


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_packed_sequences(torch, causal, head_dim, dtype):
    """Ragged sequences, one empty and some shorter than one warpgroup's 64 rows, so tiles
    end mid-warpgroup (stored row by row) and tiles start past short sequences."""
    lengths = [1000, 517, 2049, 0, 63, 1, 130]
    q, cu = packed(torch, lengths, 16, head_dim, dtype, seed=head_dim + causal)
    k, _ = packed(torch, lengths, 4, head_dim, dtype, seed=head_dim + causal + 1)
    v, _ = packed(torch, lengths, 4, head_dim, dtype, seed=head_dim + causal + 2)
    check_packed(q, k, v, dtype, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu,
                 max_seqlen_q=max(lengths), max_seqlen_k=max(lengths))


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_packed_queries_and_keys_of_other_lengths(torch, causal, head_dim):
    """Per sequence seqlen_q != seqlen_k (bottom-right causal per sequence, rows that see
    no key), and cu_seqlens_q against dense [batch, seqlen_k] keys."""
    q_len, k_len = [300, 1000, 5, 777], [1000, 300, 700, 129]
    q, cu_q = packed(torch, q_len, 8, head_dim, "bf16", seed=40)
    k, cu_k = packed(torch, k_len, 8, head_dim, "bf16", seed=41)
    v, _ = packed(torch, k_len, 8, head_dim, "bf16", seed=42)
    check_packed(q, k, v, "bf16", causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                 max_seqlen_q=max(q_len), max_seqlen_k=max(k_len))
    kd = randn(torch, (len(q_len), 900, 2, head_dim), "bf16", seed=43)
    vd = randn(torch, (len(q_len), 900, 2, head_dim), "bf16", seed=44)
    check_packed(q, kd, vd, "bf16", causal=causal, cu_seqlens_q=cu_q, max_seqlen_q=max(q_len))


# With FMHA_SM90_PERSISTENT (fmha_config.h) unmasked instances run a persistent grid
# (fwd_sm90.h persistent_tiles): one CTA per SM, each walking tiles blockIdx.x,
# blockIdx.x + gridDim.x, ... in launch order; without it, one tile per CTA, through the
# same producer and consumer code and barriers.  Between
# long sequences sit ones without keys (tiles that load no Q, yet store 0 and lse -inf
# through the same buffer), with few or no queries (tiles past len_q, which every warp
# group skips alike) and with keys but a handful of queries; with 8 query heads there are
# several times as many tiles as SMs, so each CTA walks through every kind in turn.
# "pingpong": one long key sequence puts the call on the ping-pong schedule, whose turn
# barriers then run across tiles with and without key blocks.
PERSISTENT_Q = [1000, 37, 0, 700, 1, 999, 64, 513, 5, 1000, 200, 129]
PERSISTENT_K = {"interleaved": [1000, 0, 300, 0, 77, 1000, 0, 513, 1003, 0, 450, 129],
                "pingpong": [1000, 0, 300, 0, 77, 3000, 0, 2600, 1003, 0, 2100, 129]}


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("schedule", ["interleaved", "pingpong"])
def test_persistent_tiles_with_keyless_sequences(torch, schedule, head_dim, dtype):
    q_len, k_len = PERSISTENT_Q, PERSISTENT_K[schedule]
    heads_q, heads_kv = 8, 2
    block_m = {64: 192, 128: 128}[head_dim]
    assert len(q_len) * heads_q * math.ceil(max(q_len) / block_m) > 2 * 132  # tiles per CTA > 2
    seed = head_dim + 3 * len(schedule) + (dtype == "bf16")
    q, cu_q = packed(torch, q_len, heads_q, head_dim, dtype, seed=seed)
    k, cu_k = packed(torch, k_len, heads_kv, head_dim, dtype, seed=seed + 1)
    v, _ = packed(torch, k_len, heads_kv, head_dim, dtype, seed=seed + 2)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(q_len), max_seqlen_k=max(k_len))
    plan = fmha_native.explain(q, k, v, **kw)
    assert plan["kernel"].endswith(f",{schedule}>"), f"{plan['kernel']}: {plan['reason']}"
    _, out, lse = check_packed(q, k, v, dtype, **kw)
    # rows of sequences without keys: exactly 0, lse -inf
    for b, (start, n) in enumerate(zip(cu_q.tolist(), q_len)):
        if k_len[b] == 0 and n > 0:
            assert bool((out[start:start + n] == 0).all()), f"sequence {b}"
            assert bool(torch.isneginf(lse[:, start:start + n]).all()), f"sequence {b}"


@pytest.mark.parametrize("head_dim", [64, 128])
def test_persistent_tiles_bitwise_deterministic(torch, head_dim):
    """A dense unmasked call of many tiles per SM (the persistent grid): two calls give the
    same bits, whichever CTA computes which tile."""
    q, k, v = qkv(torch, 2, 4096, 4096, 16, 4, head_dim, "bf16", seed=14 + head_dim)
    plan, out1, lse1 = check(q, k, v, "bf16")
    out2, lse2 = fmha_native.forward(q, k, v)
    assert bits(out1) == bits(out2) and bits(lse1) == bits(lse2), plan["kernel"]


def test_packed_device_cu_seqlens_out_of_range_gives_nan_rows(torch):
    """A device cu_seqlens_q whose last sequence runs past total_q: that sequence's rows
    (clamped to the tensor) come out NaN, the others are right, and no row past total_q
    nor any lse column outside is written."""
    lengths, head_dim = [700, 400, 500], 128
    q, cu = packed(torch, lengths, 8, head_dim, "bf16", seed=50)
    k, _ = packed(torch, lengths, 8, head_dim, "bf16", seed=51)
    v, _ = packed(torch, lengths, 8, head_dim, "bf16", seed=52)
    total = q.shape[0]
    bad = cu.clone()
    bad[-1] = total + 50
    kw = dict(causal=True, cu_seqlens_q=bad, cu_seqlens_k=cu, max_seqlen_q=max(lengths),
              max_seqlen_k=max(lengths))
    plan = fmha_native.explain(q, k, v, **kw)
    assert plan["kernel"].startswith(SM90), f"{plan['kernel']}: {plan['reason']}"
    out_buf = torch.full((total + 8, 8, head_dim), 7.0, device="cuda", dtype=torch.bfloat16)
    lse_buf = torch.full((8, total + 8), 7.0, device="cuda", dtype=torch.float32)
    out, lse = out_buf[:total], lse_buf[:, :total]
    fmha_native.forward(q, k, v, out=out, lse=lse, **kw)
    good = lengths[0] + lengths[1]
    ref_out, ref_lse = reference.forward(q[:good], k[:good], v[:good], causal=True,
                                         cu_seqlens_q=cu[:3], cu_seqlens_k=cu[:3])
    assert_close(as_f64(out[:good]), as_f64(lse[:, :good]), ref_out, ref_lse, "bf16")
    assert bool(torch.isnan(out[good:]).all()) and bool(torch.isnan(lse[:, good:]).all())
    assert bool((out_buf[total:] == 7.0).all()) and bool((lse_buf[:, total:] == 7.0).all())


# ------------------------------------------------- window, softcap and sinks on sm90 (issue 21)

def sinks_for(torch, heads_q):
    """Sink logits [heads_q] on the GPU: below, near and far above typical row maxima."""
    return torch.tensor([9.0 if h % 5 == 4 else -3.0 + 1.25 * (h % 5) for h in range(heads_q)],
                        dtype=torch.float32, device="cuda")


def check_features(q, k, v, dtype, **kw):
    """explain() names the sm90 kernel; forward matches the reference, which takes every
    keyword used here with the same meaning."""
    plan = fmha_native.explain(q, k, v, **kw)
    assert plan["kernel"].startswith(SM90), f"{plan['kernel']}: {plan['reason']}"
    out, lse = fmha_native.forward(q, k, v, **kw)
    ref_out, ref_lse = reference.forward(q, k, v, **kw)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype, what=f"{plan['kernel']} {kw}")
    return out, lse


# (seqlen_q, seqlen_k, causal, window): windows under one 128-key block, left = 0 (only the
# row's own position, plus the right side), one side open, Sq above and below Sk, bounds past
# the sequence, and rows that see no key (Sq > Sk without causal: positions below 0)
WINDOWS = [(1003, 1003, True, (100, -1)), (515, 515, True, (0, 0)), (515, 1003, False, (0, 0)),
           (515, 515, False, (37, 5)), (1003, 300, False, (-1, 64)), (129, 1003, False, (200, -1)),
           (1003, 17, False, (10, 10)), (300, 300, False, (5000, 5000)), (257, 2049, True, (700, -1))]

# the mask logic is the same for every type and tile: two of the four instances here, the
# others in test_all_features_together_with_gqa
DTYPE_DIMS = [("bf16", 128), ("f16", 64)]


@pytest.mark.parametrize("dtype,head_dim", DTYPE_DIMS)
@pytest.mark.parametrize("seqlen_q,seqlen_k,causal,window", WINDOWS)
def test_windows(torch, seqlen_q, seqlen_k, causal, window, head_dim, dtype):
    heads_q, heads_kv = 8, 2
    q, k, v = qkv(torch, batch_for(seqlen_q, heads_q), seqlen_q, seqlen_k, heads_q, heads_kv,
                  head_dim, dtype, seed=seqlen_q + seqlen_k + window[0])
    check_features(q, k, v, dtype, causal=causal, window=window)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("softcap,scale", [(30.0, None), (2.0, 0.3)], ids=["cap30", "cap2-past"])
def test_softcap(torch, softcap, scale, causal, head_dim, dtype):
    """A cap far above the scores, and one that most scores pass (scaled up)."""
    q, k, v = qkv(torch, batch_for(517, 16), 517, 1003, 16, 4, head_dim, dtype,
                  seed=int(softcap) + head_dim)
    kw = dict(causal=causal, softcap=softcap)
    if scale is not None:
        kw["softmax_scale"] = scale
    check_features(q, k, v, dtype, **kw)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("softcap", [50.0, 51.0, 12.0])
def test_softcap_scores_at_the_bounds(torch, softcap, causal, dtype):
    """Scores pushed against both bounds of the cap: the bfloat16 kernel shifts capped
    scores by a fixed amount up to a cap of 50 (fmha_config.h), by the running max above
    it and in float16.  Rows of the first half score about -0.92 c against every key (the
    smallest weights the fixed shift gives), the others about +0.92 c; each half is held
    to the bounds on its own, so neither hides in the other's error."""
    seqlen, heads_q, heads_kv, head_dim = 600, 8, 2, 128
    batch = batch_for(seqlen, heads_q)
    q, k, v = qkv(torch, batch, seqlen, seqlen, heads_q, heads_kv, head_dim, dtype, seed=int(softcap))
    q, k = q * 0.3, k * 0.3
    k[..., 0] = 4.0 + k[..., 0]
    q[:, : seqlen // 2, :, 0] = -20.0
    q[:, seqlen // 2:, :, 0] = 20.0
    kw = dict(causal=causal, softcap=softcap, softmax_scale=1.0)
    plan = fmha_native.explain(q, k, v, **kw)
    assert plan["kernel"].startswith(SM90), f"{plan['kernel']}: {plan['reason']}"
    out, lse = (as_f64(x) for x in fmha_native.forward(q, k, v, **kw))
    ref_out, ref_lse = reference.forward(q, k, v, **kw)
    for rows, what in ((slice(0, seqlen // 2), "low"), (slice(seqlen // 2, seqlen), "high")):
        assert_close(out[:, rows], lse[:, :, rows], ref_out[:, rows], ref_lse[:, :, rows], dtype,
                     what=f"{what} rows, softcap {softcap}")


@pytest.mark.parametrize("dtype,head_dim", DTYPE_DIMS)
@pytest.mark.parametrize("seqlen_q,seqlen_k,causal", [(1003, 1003, True), (300, 700, False),
                                                      (1003, 17, True)])
def test_sinks(torch, seqlen_q, seqlen_k, causal, head_dim, dtype):
    """Sinks; (1003, 17) causal has rows that see no key: out 0, lse = the sink."""
    heads_q = 10
    q, k, v = qkv(torch, batch_for(seqlen_q, heads_q), seqlen_q, seqlen_k, heads_q, 2, head_dim,
                  dtype, seed=seqlen_q + 3 * seqlen_k)
    sinks = sinks_for(torch, heads_q)
    out, lse = check_features(q, k, v, dtype, causal=causal, sinks=sinks)
    if seqlen_q > seqlen_k and causal:
        empty = seqlen_q - seqlen_k  # rows 0 .. empty-1 see no key
        assert bool((out[:, :empty] == 0).all())
        expect = sinks.view(1, heads_q, 1).expand(lse.shape[0], heads_q, empty)
        assert bool((lse[:, :, :empty] == expect).all())


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_all_features_together_with_gqa(torch, causal, head_dim, dtype):
    heads_q, heads_kv = 16, 2
    q, k, v = qkv(torch, batch_for(700, heads_q), 700, 1003, heads_q, heads_kv, head_dim, dtype,
                  seed=head_dim + causal)
    check_features(q, k, v, dtype, causal=causal, window=(150, -1 if causal else 20), softcap=5.0,
                   softmax_scale=0.2, sinks=sinks_for(torch, heads_q))


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_packed_sequences_with_features(torch, causal, head_dim):
    """Packed sequences (one empty, some under one warpgroup) with Sq != Sk per sequence:
    windows count from each sequence's own positions."""
    q_len, k_len = [300, 1000, 5, 0, 777, 63], [1000, 300, 700, 129, 777, 63]
    q, cu_q = packed(torch, q_len, 8, head_dim, "bf16", seed=60)
    k, cu_k = packed(torch, k_len, 4, head_dim, "bf16", seed=61)
    v, _ = packed(torch, k_len, 4, head_dim, "bf16", seed=62)
    check_features(q, k, v, "bf16", causal=causal, window=(90, -1 if causal else 40), softcap=8.0,
                   sinks=sinks_for(torch, 8), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                   max_seqlen_q=max(q_len), max_seqlen_k=max(k_len))


def test_window_tiles_skip_blocks_and_stay_deterministic(torch):
    """A narrow window over long keys gives the dense call's numbers over its few keys:
    matching the reference, bitwise repeatable."""
    q, k, v = qkv(torch, 1, 4096, 4096, 16, 4, 128, "bf16", seed=70)
    kw = dict(causal=True, window=(256, -1), sinks=sinks_for(torch, 16), softcap=20.0)
    out1, lse1 = check_features(q, k, v, "bf16", **kw)
    out2, lse2 = fmha_native.forward(q, k, v, **kw)
    assert bits(out1) == bits(out2) and bits(lse1) == bits(lse2)


# ------------------------------------ d128 ping-pong tiles: 176-key blocks (fmha_config.h)

def explain_pingpong_176(q, k, v, **kw):
    """The call runs the sm90 kernel's d128 ping-pong tiles, whose key blocks are 176 wide."""
    plan = fmha_native.explain(q, k, v, **kw)
    assert plan["kernel"].startswith(SM90) and plan["kernel"].endswith(",pingpong>"), \
        f"{plan['kernel']}: {plan['reason']}"
    assert plan["block_n"] == 176, plan
    return plan


# (seqlen_q, seqlen_k, causal): rows that see >= 16 blocks of 128 keys on average (ping-pong),
# lengths that are not multiples of 176 or of the 128-row tiles, causal with Sq < Sk and with
# Sq > Sk (the first rows see no key), so diagonal blocks cross tile edges at every offset
PINGPONG_LENGTHS = [(2100, 4000, False), (5003, 5003, True), (1000, 4500, True),
                    (4500, 4400, True), (129, 2113, False)]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("seqlen_q,seqlen_k,causal", PINGPONG_LENGTHS)
def test_d128_pingpong_lengths(torch, seqlen_q, seqlen_k, causal, dtype):
    q, k, v = qkv(torch, batch_for(seqlen_q, 8), seqlen_q, seqlen_k, 8, 2, 128, dtype,
                  seed=seqlen_q + 7 * seqlen_k)
    explain_pingpong_176(q, k, v, causal=causal)
    check(q, k, v, dtype, causal=causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_d128_pingpong_features_and_packed(torch, causal):
    """A window (wide enough for ping-pong) with sinks on the wide tiles, then with a
    softcap too (ping-pong on 128-key blocks); packed sequences of other lengths (one
    empty, one under a block)."""
    kw = dict(causal=causal, window=(2300, -1 if causal else 150), sinks=sinks_for(torch, 8))
    q, k, v = qkv(torch, 1, 5003, 5003, 8, 2, 128, "bf16", seed=80 + causal)
    explain_pingpong_176(q, k, v, **kw)
    check_features(q, k, v, "bf16", **kw)
    kw["softcap"] = 6.0
    plan = fmha_native.explain(q, k, v, **kw)
    assert plan["kernel"].endswith(",pingpong>") and plan["block_n"] == 128, plan
    check_features(q, k, v, "bf16", **kw)
    lengths = [2500, 4133, 0, 100]
    q, cu = packed(torch, lengths, 8, 128, "bf16", seed=82)
    k, _ = packed(torch, lengths, 2, 128, "bf16", seed=83)
    v, _ = packed(torch, lengths, 2, 128, "bf16", seed=84)
    pkw = dict(causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths),
               max_seqlen_k=max(lengths))
    explain_pingpong_176(q, k, v, **pkw)
    check_packed(q, k, v, "bf16", **pkw)


def test_d128_pingpong_bitwise_deterministic(torch):
    q, k, v = qkv(torch, 2, 4096, 4096, 16, 4, 128, "bf16", seed=90)
    explain_pingpong_176(q, k, v, causal=True)
    out1, lse1 = fmha_native.forward(q, k, v, causal=True)
    out2, lse2 = fmha_native.forward(q, k, v, causal=True)
    assert bits(out1) == bits(out2) and bits(lse1) == bits(lse2)


def test_narrow_window_takes_the_interleaved_schedule(torch):
    """A row of a (100, 0) window sees 101 keys however long the sequence: too few key
    blocks for ping-pong (plan.c sm90_schedule), which the plain causal call takes."""
    q, k, v = qkv(torch, 2, 4096, 4096, 16, 4, 128, "bf16", seed=3)
    assert fmha_native.explain(q, k, v, causal=True)["kernel"].endswith(",pingpong>")
    plan = fmha_native.explain(q, k, v, causal=True, window=(100, -1))
    assert plan["kernel"].startswith(SM90) and plan["kernel"].endswith(",interleaved>"), \
        plan["kernel"]


# --------------------------------------- head_dim 32, 80, 96, 192 and 256 (issue 21)
# d192 walks 112-key blocks (so block edges fall off the 128-row tiles' edges); d96 and d80 run
# two 64-column panels whose last 32 / 48 columns TMA fills with zeros and drops on the store,
# d32 one panel (on the 192-row d64 tiles) whose last 32 columns are those zeros; d256
# walks 80-key blocks with O at 128 registers a thread (N = 256 products), and has no other
# GPU kernel: these tests are its only GPU coverage.

NEW_DIMS = [("bf16", 192), ("f16", 192), ("bf16", 96), ("f16", 96), ("bf16", 256), ("f16", 256),
            ("bf16", 80), ("f16", 80), ("bf16", 32), ("f16", 32)]
# the head dims of NEW_DIMS, for the tests that run one dtype
NEW_HEAD_DIMS = [96, 192, 256, 80, 32]
# tiles (block_m, block_n) of these tests' plans (narrow blocks: interleaved or softcapped)
NEW_DIM_TILES = {32: (192, 128), 80: (128, 128), 96: (128, 128), 192: (128, 112), 256: (128, 80)}


@pytest.mark.parametrize("dtype,head_dim", NEW_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1003, 1), (1003, 17), (1003, 129), (129, 1003),
                                               (1003, 1003), (17, 1003), (113, 2049)])
def test_new_dims_lengths_gqa4(torch, seqlen_q, seqlen_k, causal, head_dim, dtype):
    heads_q, heads_kv = 8, 2
    q, k, v = qkv(torch, batch_for(seqlen_q, heads_q), seqlen_q, seqlen_k, heads_q, heads_kv,
                  head_dim, dtype, seed=seqlen_q * 5 + seqlen_k + head_dim)
    plan, _, _ = check(q, k, v, dtype, causal=causal)
    assert f",d{head_dim}," in plan["kernel"], plan["kernel"]
    assert (plan["block_m"], plan["block_n"]) == NEW_DIM_TILES[head_dim]


@pytest.mark.parametrize("dtype,head_dim", NEW_DIMS)
@pytest.mark.parametrize("seqlen_q,seqlen_k,causal,window", [
    (1003, 1003, True, (100, -1)), (515, 515, False, (37, 5)), (129, 1003, False, (200, -1))])
def test_new_dims_windows(torch, seqlen_q, seqlen_k, causal, window, head_dim, dtype):
    q, k, v = qkv(torch, batch_for(seqlen_q, 8), seqlen_q, seqlen_k, 8, 2, head_dim, dtype,
                  seed=seqlen_q + seqlen_k + window[0] + head_dim)
    check_features(q, k, v, dtype, causal=causal, window=window)


@pytest.mark.parametrize("dtype,head_dim", NEW_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_new_dims_window_softcap_sinks(torch, causal, head_dim, dtype):
    heads_q, heads_kv = 16, 4
    q, k, v = qkv(torch, batch_for(700, heads_q), 700, 1003, heads_q, heads_kv, head_dim, dtype,
                  seed=head_dim + causal + 40)
    check_features(q, k, v, dtype, causal=causal, window=(150, -1 if causal else 20), softcap=5.0,
                   softmax_scale=0.2, sinks=sinks_for(torch, heads_q))


@pytest.mark.parametrize("head_dim", NEW_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_new_dims_packed_sequences(torch, causal, head_dim):
    """Tiles ending mid-warpgroup store row by row from registers: at d32, d80 and d96 those
    stores must stop at column head_dim."""
    lengths = [1000, 517, 0, 63, 1, 130]
    q, cu = packed(torch, lengths, 16, head_dim, "bf16", seed=head_dim + causal + 60)
    k, _ = packed(torch, lengths, 4, head_dim, "bf16", seed=head_dim + causal + 61)
    v, _ = packed(torch, lengths, 4, head_dim, "bf16", seed=head_dim + causal + 62)
    check_packed(q, k, v, "bf16", causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu,
                 max_seqlen_q=max(lengths), max_seqlen_k=max(lengths))


@pytest.mark.parametrize("head_dim", NEW_HEAD_DIMS)
def test_new_dims_out_columns_past_head_dim_untouched(torch, head_dim):
    """out as a view into wider rows: the TMA store of the last panel must not write past
    head_dim (d96: columns 96..127 of the box are outside the tensor map; d32: 32..63)."""
    batch, seqlen, heads = 4, 300, 8
    q, k, v = qkv(torch, batch, seqlen, seqlen, heads, heads, head_dim, "bf16", seed=head_dim + 70)
    buf = torch.full((batch, seqlen, heads, head_dim + 64), 7.0, device="cuda",
                     dtype=torch.bfloat16)
    out = buf[..., :head_dim]
    plan = fmha_native.explain(q, k, v, out=out)
    assert plan["kernel"].startswith(SM90), f"{plan['kernel']}: {plan['reason']}"
    res, lse = fmha_native.forward(q, k, v, out=out)
    assert res is out
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "bf16", what=plan["kernel"])
    assert bool((buf[..., head_dim:] == 7.0).all())


@pytest.mark.parametrize("head_dim", NEW_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_new_dims_bitwise_deterministic(torch, causal, head_dim):
    q, k, v = qkv(torch, 2, 2048, 2048, 16, 4, head_dim, "bf16", seed=12 + head_dim)
    plan, out1, lse1 = check(q, k, v, "bf16", causal=causal)
    out2, lse2 = fmha_native.forward(q, k, v, causal=causal)
    assert bits(out1) == bits(out2) and bits(lse1) == bits(lse2), plan["kernel"]
