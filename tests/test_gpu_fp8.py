"""FP8 (float8 e4m3fn) KV cache (issue 22) on the GPU: the tensor-core tiles widen the
codes in shared memory (decode tiles for few packed rows, the prefill tiles otherwise,
never the sm90 kernel).  Against the float64 reference on the dequantized values only:
every GPU head dim, float16 and bfloat16 q, each scale granularity (numbers and device
arrays), KV cache with ragged device lengths (0 and full included), paged caches whose
unused slots hold NaN codes, the quantize-on-write append (bitwise against the
reference's quantizer and the CPU backend), forced splits, window / softcap / sinks,
speculative-decode shapes, NaN codes inside the visible keys, bitwise determinism, and
the refusal of fp8 rows the kernels cannot read in place.  Inputs go over as torch CUDA
tensors (float8_e4m3fn views of the codes) when torch has CUDA, else as host uint8 codes
with kv_dtype="e4m3fn" and device="gpu".  Every test skips, saying so, without a GPU."""
import numpy as np
import pytest

import fmha_native
from fmha_native import reference
from _harness import (NO_GPU_REASON, as_f64, assert_close, bits, gpu_devices, paged_cache, randn,
                      torch_cuda)
from test_fp8 import expected_cache, factors_of

try:
    import torch
except ImportError:
    torch = None

pytestmark = pytest.mark.gpu

GPU_HEAD_DIMS = (32, 64, 80, 96, 128, 192, 256)
DTYPES = ("f16", "bf16")


@pytest.fixture(autouse=True)
def _need_gpu():
    if not gpu_devices():
        pytest.skip(NO_GPU_REASON)


def codes_of(rng, shape, scale=2.0):
    return reference.quantize_e4m3(rng.standard_normal(shape).astype(np.float32) * scale)


def on_gpu(x, kind=None):
    """x where the GPU reads it: codes (uint8) as float8_e4m3fn CUDA tensors, 16-bit
    values as CUDA tensors of their dtype, int32/float32 arrays as CUDA tensors; host
    arrays unchanged when torch has no CUDA."""
    if x is None or not isinstance(x, np.ndarray) or not torch_cuda():
        return x
    if str(x.dtype) == "bfloat16":
        return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).cuda()
    t = torch.from_numpy(np.ascontiguousarray(x)).cuda()
    return t.view(torch.float8_e4m3fn) if x.dtype == np.uint8 else t


def run(q, k, v, **kw):
    """fmha_native.forward on the GPU with fp8 K/V codes; float64 (out, lse)."""
    extra = {} if torch_cuda() else {"device": "gpu", "kv_dtype": "e4m3fn"}
    args = {n: on_gpu(x) for n, x in kw.items()}
    out, lse = fmha_native.forward(on_gpu(q), on_gpu(k), on_gpu(v), **extra, **args)
    return as_f64(out), as_f64(lse)


def explain(q, k, v, **kw):
    extra = {} if torch_cuda() else {"device": "gpu", "kv_dtype": "e4m3fn"}
    return fmha_native.explain(on_gpu(q), on_gpu(k), on_gpu(v), **extra,
                               **{n: on_gpu(x) for n, x in kw.items()})


def check(q, k, v, dtype, **kw):
    ref = reference.forward(q, k, v, kv_dtype="e4m3fn",
                            **{n: x for n, x in kw.items() if n != "num_splits"})
    out, lse = run(q, k, v, **kw)
    assert_close(out, lse, ref[0], ref[1], dtype,
                 what=str({n: kw.get(n) for n in ("causal", "num_splits", "window")}))
    return out, lse


def scale(rng, kind, batch, heads_kv):
    if kind == "number":
        return float(rng.uniform(0.1, 3.0))
    if kind == "head":
        return rng.uniform(0.1, 3.0, heads_kv).astype(np.float32)
    return rng.uniform(0.1, 3.0, (batch, heads_kv)).astype(np.float32)


# ---------------------------------------------------------------- every head dim, both tiles

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", GPU_HEAD_DIMS)
def test_decode_each_head_dim_with_ragged_device_lengths(head_dim, dtype):
    rng = np.random.default_rng(100 + head_dim)
    q = randn(rng, (3, 1, 8, head_dim), dtype)
    kc, vc = codes_of(rng, (3, 333, 2, head_dim)), codes_of(rng, (3, 333, 2, head_dim))
    check(q, kc, vc, dtype, cache_seqlens=np.int32([333, 0, 129]), k_scale=0.5, v_scale=1.5)
    plan = explain(q, kc, vc, cache_seqlens=np.int32([333, 0, 129]))
    assert "kv=float8_e4m3fn" in plan["kernel"] and "sm90" not in plan["kernel"], plan["kernel"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", GPU_HEAD_DIMS)
def test_prefill_each_head_dim_causal_both_ways(head_dim, dtype):
    rng = np.random.default_rng(200 + head_dim)
    for sq, sk in ((127, 200), (129, 17)):
        q = randn(rng, (1, sq, 4, head_dim), dtype)
        kc, vc = codes_of(rng, (1, sk, 2, head_dim)), codes_of(rng, (1, sk, 2, head_dim))
        check(q, kc, vc, dtype, causal=True, k_scale=0.25)
    plan = explain(q, kc, vc, causal=True)
    assert plan["kernel"].startswith("fwd_mma<") and "kv=float8_e4m3fn" in plan["kernel"]


# ---------------------------------------------------------------- scales, GQA, splits

@pytest.mark.parametrize("k_kind, v_kind", [("number", "head"), ("batch_head", "number"),
                                            ("head", "batch_head")])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_scale_granularities_and_gqa(k_kind, v_kind, group):
    rng = np.random.default_rng(300 + group)
    batch, heads_kv, dim = 2, 2, 128
    q = randn(rng, (batch, 1, heads_kv * group, dim), "bf16")
    kc, vc = codes_of(rng, (batch, 700, heads_kv, dim)), codes_of(rng, (batch, 700, heads_kv, dim))
    check(q, kc, vc, "bf16", cache_seqlens=np.int32([700, 517]),
          k_scale=scale(rng, k_kind, batch, heads_kv), v_scale=scale(rng, v_kind, batch, heads_kv))


@pytest.mark.parametrize("num_splits", [1, 2, 7])
@pytest.mark.parametrize("seqlen_q", [1, 16])
def test_forced_splits_agree(num_splits, seqlen_q):
    """Decode and speculative verify (16 queries x GQA 4 = 64 packed rows: the prefill
    tiles), causal, each split count against the reference."""
    rng = np.random.default_rng(400 + num_splits)
    q = randn(rng, (2, seqlen_q, 16, 64), "f16")
    kc, vc = codes_of(rng, (2, 1500, 4, 64)), codes_of(rng, (2, 1500, 4, 64))
    check(q, kc, vc, "f16", causal=True, num_splits=num_splits,
          cache_seqlens=np.int32([1500, 1001]), k_scale=np.float32([0.5, 1.0, 2.0, 0.25]))


def test_deterministic_bits():
    rng = np.random.default_rng(450)
    q = randn(rng, (1, 4, 32, 128), "bf16")
    kc, vc = codes_of(rng, (1, 4096, 8, 128)), codes_of(rng, (1, 4096, 8, 128))
    kw = dict(causal=True, k_scale=0.3, v_scale=0.7)
    extra = {} if torch_cuda() else {"device": "gpu", "kv_dtype": "e4m3fn"}
    a = fmha_native.forward(on_gpu(q), on_gpu(kc), on_gpu(vc), **extra, **kw)
    b = fmha_native.forward(on_gpu(q), on_gpu(kc), on_gpu(vc), **extra, **kw)
    assert bits(a[0]) == bits(b[0]) and bits(a[1]) == bits(b[1])


# ---------------------------------------------------------------- paged, NaN codes

@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_paged_cache_nan_codes_in_unused_slots(page_size):
    rng = np.random.default_rng(500 + page_size)
    lengths, heads_kv, dim = [0, 300, 513], 2, 128
    max_blocks = -(-max(lengths) // page_size)
    kf, vf, table = paged_cache(rng, lengths, page_size, max_blocks, heads_kv, dim, "f32")
    kc, vc = reference.quantize_e4m3(kf * 2), reference.quantize_e4m3(vf * 2)  # NaN -> 0x7f
    q = randn(rng, (3, 2, 8, dim), "bf16")
    out, _ = check(q, kc, vc, "bf16", causal=True, cache_seqlens=np.int32(lengths),
                   block_table=table, k_scale=0.5, v_scale=np.float32([1.0, 2.0]))
    assert not np.isnan(out).any()


def test_nan_code_inside_the_visible_keys_makes_those_rows_nan():
    rng = np.random.default_rng(600)
    q = randn(rng, (2, 1, 4, 64), "f16")
    kc, vc = codes_of(rng, (2, 256, 2, 64)), codes_of(rng, (2, 256, 2, 64))
    kc[0, 100, 1, 7] = 0x7F  # sequence 0, kv head 1: query heads 2 and 3 see it
    out, lse = run(q, kc, vc, cache_seqlens=np.int32([256, 256]))
    assert np.isnan(out[0, 0, 2:]).all() and np.isnan(lse[0, 2:, 0]).all()
    assert not np.isnan(out[0, 0, :2]).any() and not np.isnan(out[1]).any()
    # past the length the same code is never read
    out, _ = run(q, kc, vc, cache_seqlens=np.int32([100, 256]))
    assert not np.isnan(out).any()


# ---------------------------------------------------------------- append

@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_append_quantizes_on_write_like_the_reference_and_the_cpu(dtype, paged):
    rng = np.random.default_rng(700 + paged)
    batch, heads_kv, dim, cap, new = 3, 2, 64, 320, 3
    lengths = [0, 150, cap - new]
    q = randn(rng, (batch, new, 8, dim), dtype)
    k_new = randn(rng, (batch, new, heads_kv, dim), dtype, scale=40.0)  # some saturate at 448
    v_new = randn(rng, (batch, new, heads_kv, dim), dtype, scale=3.0)
    if paged:
        kf, vf, table = paged_cache(rng, lengths, 64, cap // 64, heads_kv, dim, "f32",
                                    reach=[n + new for n in lengths])
        kc, vc = reference.quantize_e4m3(kf), reference.quantize_e4m3(vf)
        extra = dict(block_table=table)
    else:
        kc, vc = codes_of(rng, (batch, cap, heads_kv, dim)), codes_of(rng, (batch, cap, heads_kv, dim))
        extra = {}
    ks = rng.uniform(0.1, 0.5, (batch, heads_kv)).astype(np.float32)
    kw = dict(causal=True, cache_seqlens=np.int32(lengths), k_new=k_new, v_new=v_new,
              k_scale=ks, v_scale=0.02, **extra)
    ref = reference.forward(q, kc.copy(), vc.copy(), kv_dtype="e4m3fn", **kw)
    table = extra.get("block_table")
    want_k = expected_cache(kc, k_new.astype(np.float32), ks, np.int32(lengths), table)
    want_v = expected_cache(vc, v_new.astype(np.float32), factors_of(0.02, batch, heads_kv),
                            np.int32(lengths), table)
    cpu_k, cpu_v = kc.copy(), vc.copy()
    fmha_native.forward(q, cpu_k, cpu_v, device="cpu", kv_dtype="e4m3fn", **kw)
    if torch_cuda():
        dk, dv = on_gpu(kc), on_gpu(vc)
        out, lse = fmha_native.forward(on_gpu(q), dk, dv, **{n: on_gpu(x) for n, x in kw.items()})
        gpu_k = dk.view(torch.uint8).cpu().numpy()
        gpu_v = dv.view(torch.uint8).cpu().numpy()
    else:
        gpu_k, gpu_v = kc.copy(), vc.copy()
        out, lse = fmha_native.forward(q, gpu_k, gpu_v, device="gpu", kv_dtype="e4m3fn", **kw)
    assert_close(as_f64(out), as_f64(lse), ref[0], ref[1], dtype)
    for got, want, cpu in ((gpu_k, want_k, cpu_k), (gpu_v, want_v, cpu_v)):
        assert np.array_equal(got, want) and np.array_equal(got, cpu)


# ---------------------------------------------------------------- model features

@pytest.mark.parametrize("seqlen_q", [1, 16, 200])
def test_window_softcap_sinks_with_fp8(seqlen_q):
    rng = np.random.default_rng(800 + seqlen_q)
    q = randn(rng, (2, seqlen_q, 8, 128), "bf16")
    kc, vc = codes_of(rng, (2, 900, 2, 128)), codes_of(rng, (2, 900, 2, 128))
    sinks = (rng.standard_normal(8) * 2).astype(np.float32)
    check(q, kc, vc, "bf16", causal=True, window=(257, 0), softcap=5.0, sinks=sinks,
          k_scale=0.7, v_scale=1.3)


# ---------------------------------------------------------------- rows the kernels cannot read

def test_fp8_rows_off_16_byte_boundaries_are_refused():
    if not torch_cuda():
        pytest.skip("needs torch CUDA tensors to build a strided device view")
    rng = np.random.default_rng(900)
    q = on_gpu(randn(rng, (1, 1, 4, 64), "f16"))
    wide = on_gpu(codes_of(rng, (1, 64, 2, 72)))
    k = wide[..., :64]  # rows 72 codes apart: not 16-byte multiples
    with pytest.raises(NotImplementedError, match="16-byte"):
        fmha_native.forward(q, k, k)
