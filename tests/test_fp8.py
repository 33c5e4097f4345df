"""FP8 (float8 e4m3fn) KV cache (issue 22) on the CPU backend: dense, KV cache with the
quantize-on-write append, paged, packed, splits 1/2/7, every scale granularity, GQA and
ragged lengths, the ways a cache can be handed over (torch float8_e4m3fn, ml_dtypes
float8_e4m3fn NumPy arrays, uint8 codes with kv_dtype="e4m3fn"), bad input (inputs
unchanged after a refusal), explain(), the torch ops, and the GPU gate.

Expected values come from fmha_native.reference only: it decodes the codes from their
bit fields and quantizes with its own nearest-value search, and both are checked here
against ml_dtypes where it is installed.  The GPU gate and plan are checked on CPU CI
through _plan_for_device; one GPU run here (skipped without a GPU), the GPU paths one by
one in test_gpu_fp8.py."""
import numpy as np
import pytest

import _fmha_native
import fmha_native
from fmha_native import reference
from _harness import (NO_GPU_REASON, as_f64, assert_close, gpu_devices, make_qkv, packed,
                      paged_cache, randn)

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

try:
    import torch
except ImportError:
    torch = None

E4M3_MAX = 448.0
SPLITS = (1, 2, 7)


def codes_of(rng, shape, scale=2.0):
    """uint8 e4m3fn codes of normal values times scale (NaN codes where a value was NaN)."""
    return reference.quantize_e4m3(rng.standard_normal(shape).astype(np.float32) * scale)


def as_fp8(codes, kind):
    """codes (uint8) in the form forward takes: 'ml' (ml_dtypes float8_e4m3fn, a view),
    'u8' (uint8 with kv_dtype), 'torch' (torch float8_e4m3fn, shares memory)."""
    if kind == "ml":
        if ml_dtypes is None:
            pytest.skip("ml_dtypes is not installed: no NumPy float8_e4m3fn")
        return codes.view(ml_dtypes.float8_e4m3fn)
    if kind == "u8":
        return codes
    if kind == "torch":
        if torch is None:
            pytest.skip("torch is not installed")
        return torch.from_numpy(codes).view(torch.float8_e4m3fn)
    raise ValueError(kind)


def kv_kw(kind):
    return {"kv_dtype": "e4m3fn"} if kind == "u8" else {}


def scale_arg(rng, kind, batch, heads_kv):
    """A scale of the given granularity: None, a number, 0-d, [heads_kv], [batch, heads_kv]."""
    if kind == "none":
        return None
    if kind == "number":
        return float(rng.uniform(0.05, 3.0))
    if kind == "0d":
        return np.float32(rng.uniform(0.05, 3.0)).reshape(())
    if kind == "head":
        return rng.uniform(0.05, 3.0, heads_kv).astype(np.float32)
    if kind == "batch_head":
        return rng.uniform(0.05, 3.0, (batch, heads_kv)).astype(np.float32)
    raise ValueError(kind)


def scale_kw(k_scale, v_scale):
    kw = {}
    if k_scale is not None:
        kw["k_scale"] = k_scale
    if v_scale is not None:
        kw["v_scale"] = v_scale
    return kw


def check(q, k, v, dtype, **kw):
    """forward on the CPU against the reference (which gets the same fp8 inputs)."""
    ref_out, ref_lse = reference.forward(q, k, v, **{n: x for n, x in kw.items()
                                                     if n not in ("num_splits",)})
    out, lse = fmha_native.forward(q, k, v, device="cpu", **kw)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype,
                 what=str({n: kw.get(n) for n in ("num_splits", "causal")}))
    return out, lse


# ---------------------------------------------------------------- the oracle itself

def test_reference_table_and_quantizer_agree_with_ml_dtypes():
    if ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed: nothing independent to compare with")
    codes = np.arange(256, dtype=np.uint8)
    ours = reference.e4m3_values(codes)
    theirs = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    assert np.array_equal(ours[~np.isnan(ours)], theirs[~np.isnan(theirs)])
    assert np.isnan(ours[0x7F]) and np.isnan(ours[0xFF]) and ours[0x7E] == E4M3_MAX
    rng = np.random.default_rng(2200)
    x = np.concatenate([rng.standard_normal(50000).astype(np.float32) * 40,
                        (rng.standard_normal(5000) * 2.0 ** -8).astype(np.float32),
                        np.float32([0.0, -0.0, 448, 449, 463.99, 464, 500, 1e30, np.inf,
                                    -np.inf, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -6, 17.0, 19.0])])
    got = reference.quantize_e4m3(x)
    # ml_dtypes turns overflow into NaN (e4m3fn has no infinity); saturation is ours.
    want = np.clip(x, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(got, want)


def test_every_code_decodes_exactly():
    """One key: out = v_scale * v, exactly in float32, for all 256 codes (NaN codes NaN)."""
    codes = np.arange(256, dtype=np.uint8).reshape(1, 1, 1, 256)
    q = np.ones((1, 1, 1, 256), np.float32)
    k = np.zeros_like(codes)
    for v_scale in (None, 0.25, 3.0):
        out, _ = fmha_native.forward(q, k, codes, device="cpu", kv_dtype="e4m3fn",
                                     **scale_kw(None, v_scale))
        want = reference.e4m3_values(codes) * (1.0 if v_scale is None else v_scale)
        assert np.array_equal(np.isnan(out), np.isnan(want))
        fin = ~np.isnan(want)
        assert np.array_equal(out[fin].astype(np.float64), want[fin])


# ---------------------------------------------------------------- dense

@pytest.mark.parametrize("k_kind, v_kind", [("none", "none"), ("number", "number"),
                                            ("0d", "head"), ("head", "batch_head"),
                                            ("batch_head", "number")])
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_dense_every_scale_granularity(k_kind, v_kind, dtype):
    rng = np.random.default_rng(2300)
    batch, heads_q, heads_kv = 3, 8, 2
    q, _, _ = make_qkv(rng, batch, 4, 1, heads_q, heads_kv, 64, dtype)
    k = as_fp8(codes_of(rng, (batch, 77, heads_kv, 64)), "u8")
    v = as_fp8(codes_of(rng, (batch, 77, heads_kv, 64)), "u8")
    ks = scale_arg(rng, k_kind, batch, heads_kv)
    vs = scale_arg(rng, v_kind, batch, heads_kv)
    for causal in (False, True):
        check(q, k, v, dtype, causal=causal, kv_dtype="e4m3fn", **scale_kw(ks, vs))


def test_scales_change_the_result_as_the_contract_says():
    """A per-head k_scale is the same problem as float32 K with each head multiplied out
    (the fold into the softmax scale is exact up to float32 rounding)."""
    rng = np.random.default_rng(2310)
    q, _, _ = make_qkv(rng, 2, 3, 1, 4, 2, 32)
    kc, vc = codes_of(rng, (2, 40, 2, 32)), codes_of(rng, (2, 40, 2, 32))
    ks = np.float32([0.5, 1.75])
    vs = np.float32([[2.0, 0.125], [0.75, 1.5]])
    out, lse = fmha_native.forward(q, kc, vc, device="cpu", kv_dtype="e4m3fn", k_scale=ks,
                                   v_scale=vs)
    kf = (reference.e4m3_values(kc) * ks[None, None, :, None]).astype(np.float32)
    vf = (reference.e4m3_values(vc) * vs[:, None, :, None]).astype(np.float32)
    out32, lse32 = fmha_native.forward(q, kf, vf, device="cpu")
    np.testing.assert_allclose(out, out32, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, lse32, rtol=1e-6, atol=1e-5)
    plain, _ = fmha_native.forward(q, kc, vc, device="cpu", kv_dtype="e4m3fn")
    assert not np.allclose(plain, out, atol=1e-3)


@pytest.mark.parametrize("num_splits", SPLITS)
def test_dense_splits_and_gqa(num_splits):
    rng = np.random.default_rng(2320 + num_splits)
    q, _, _ = make_qkv(rng, 2, 1, 1, 16, 4, 128, "bf16")
    k, v = codes_of(rng, (2, 700, 4, 128)), codes_of(rng, (2, 700, 4, 128))
    ks = scale_arg(rng, "batch_head", 2, 4)
    check(q, k, v, "bf16", kv_dtype="e4m3fn", k_scale=ks, v_scale=0.8, num_splits=num_splits)


# ---------------------------------------------------------------- input kinds

@pytest.mark.parametrize("kind", ["ml", "u8", "torch"])
def test_every_input_kind_gives_the_same_bits(kind):
    rng = np.random.default_rng(2400)
    q, _, _ = make_qkv(rng, 2, 3, 1, 4, 2, 64, "f16")
    kc, vc = codes_of(rng, (2, 50, 2, 64)), codes_of(rng, (2, 50, 2, 64))
    ks = scale_arg(rng, "head", 2, 2)
    base = fmha_native.forward(q, kc, vc, device="cpu", kv_dtype="e4m3fn", k_scale=ks,
                               v_scale=0.5)
    k, v = as_fp8(kc, kind), as_fp8(vc, kind)
    qq = torch.from_numpy(q) if kind == "torch" else q
    kss = torch.from_numpy(ks) if kind == "torch" else ks
    out, lse = fmha_native.forward(qq, k, v, device="cpu", k_scale=kss, v_scale=0.5,
                                   **kv_kw(kind))
    out, lse = np.asarray(out), np.asarray(lse)
    assert np.array_equal(out.view(np.uint16), base[0].view(np.uint16))
    assert np.array_equal(lse, base[1])
    if kind != "u8":  # float8_e4m3fn arrays may also name kv_dtype
        again = fmha_native.forward(qq, k, v, device="cpu", k_scale=kss, v_scale=0.5,
                                    kv_dtype="e4m3fn")
        assert np.array_equal(np.asarray(again[0]).view(np.uint16), base[0].view(np.uint16))


def test_torch_uint8_storage_with_kv_dtype():
    if torch is None:
        pytest.skip("torch is not installed")
    rng = np.random.default_rng(2410)
    q, _, _ = make_qkv(rng, 1, 2, 1, 4, 4, 32, "f32")
    kc, vc = codes_of(rng, (1, 20, 4, 32)), codes_of(rng, (1, 20, 4, 32))
    ref = check(q, kc, vc, "f32", kv_dtype="e4m3fn", k_scale=0.3)
    out, lse = fmha_native.forward(torch.from_numpy(q), torch.from_numpy(kc),
                                   torch.from_numpy(vc), device="cpu", kv_dtype="e4m3fn",
                                   k_scale=torch.tensor(0.3))
    assert np.array_equal(out.numpy(), ref[0]) and np.array_equal(lse.numpy(), ref[1])


# ---------------------------------------------------------------- KV cache and append

def expected_cache(codes, new, factors, seqlens, block_table=None):
    """codes with sequence b's new rows quantized at seqlens[b] + t (through the table)."""
    out = codes.copy()
    page = codes.shape[1]
    for b in range(new.shape[0]):
        for t in range(new.shape[1]):
            pos = int(seqlens[b]) + t
            row = reference.quantize_e4m3(new[b, t].astype(np.float32), factors[b][:, None])
            if block_table is None:
                out[b, pos] = row
            else:
                out[block_table[b, pos // page], pos % page] = row
    return out


def factors_of(scale, batch, heads_kv):
    if scale is None:
        return np.ones((batch, heads_kv), np.float32)
    return np.broadcast_to(np.asarray(scale, np.float32), (batch, heads_kv))


@pytest.mark.parametrize("num_splits", SPLITS)
@pytest.mark.parametrize("k_kind, v_kind", [("number", "head"), ("batch_head", "none")])
def test_cache_append_quantizes_on_write(num_splits, k_kind, v_kind):
    rng = np.random.default_rng(2500 + num_splits)
    batch, heads_q, heads_kv, dim, cap = 3, 8, 2, 64, 300
    q = randn(rng, (batch, 2, heads_q, dim), "f16")
    kc, vc = codes_of(rng, (batch, cap, heads_kv, dim)), codes_of(rng, (batch, cap, heads_kv, dim))
    seqlens = np.array([0, 151, 298], np.int32)  # ragged, one empty, one at capacity after
    k_new = randn(rng, (batch, 2, heads_kv, dim), "f16", scale=3.0)
    v_new = randn(rng, (batch, 2, heads_kv, dim), "f16", scale=3.0)
    ks, vs = scale_arg(rng, k_kind, batch, heads_kv), scale_arg(rng, v_kind, batch, heads_kv)
    kw = dict(cache_seqlens=seqlens, k_new=k_new, v_new=v_new, kv_dtype="e4m3fn",
              **scale_kw(ks, vs))
    ref_out, ref_lse = reference.forward(q, kc.copy(), vc.copy(), causal=True, **kw)
    k, v = kc.copy(), vc.copy()
    out, lse = fmha_native.forward(q, k, v, device="cpu", causal=True, num_splits=num_splits,
                                   **kw)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16")
    assert np.array_equal(k, expected_cache(kc, k_new, factors_of(ks, batch, heads_kv), seqlens))
    assert np.array_equal(v, expected_cache(vc, v_new, factors_of(vs, batch, heads_kv), seqlens))


def test_append_rounds_to_nearest_even_and_saturates():
    """Ties, subnormals and values beyond 448 (after the division by the scale)."""
    ties = np.float32([17.0, 19.0, -17.0, 2.0 ** -10, 3 * 2.0 ** -10, 0.0, -0.0])
    beyond = np.float32([448.0, 449.0, 463.0, 470.0, -1000.0, 65504.0, 2.0 ** -12])
    row = np.zeros((1, 1, 1, 16), np.float32)
    row[0, 0, 0, :7], row[0, 0, 0, 7:14] = ties, beyond
    k = np.zeros((1, 4, 1, 16), np.uint8)
    v = np.zeros((1, 4, 1, 16), np.uint8)
    q = np.zeros((1, 1, 1, 16), np.float32)
    fmha_native.forward(q, k, v, device="cpu", cache_seqlens=np.int32([1]), k_new=row,
                        v_new=row * 2, kv_dtype="e4m3fn", k_scale=1.0, v_scale=2.0)
    got = reference.e4m3_values(k[0, 1, 0])
    # 17 and 19 sit halfway between 16, 18 and 20: to the even mantissa (16 and 20).
    assert list(got[:7]) == [16.0, 20.0, -16.0, 0.0, 2.0 ** -8, 0.0, 0.0]
    assert np.signbit(got[6]) and not np.signbit(got[5])
    assert list(got[7:13]) == [448.0, 448.0, 448.0, 448.0, -448.0, 448.0]
    assert got[13] == 0.0  # 2^-12 is below half the smallest subnormal (2^-9)
    assert np.array_equal(v[0, 1, 0], k[0, 1, 0])  # the same values after / 2.0
    assert (k[0, [0, 2, 3]] == 0).all() and (v[0, [0, 2, 3]] == 0).all()


@pytest.mark.parametrize("num_splits", SPLITS)
def test_paged_ragged_with_append(num_splits):
    rng = np.random.default_rng(2600 + num_splits)
    lengths, page, max_blocks, heads_kv, dim = [5, 64, 129], 32, 6, 2, 64
    kf, vf, table = paged_cache(rng, lengths, page, max_blocks, heads_kv, dim, "f32",
                                reach=[l + 3 for l in lengths])
    # NaN slots (never to be read) become NaN codes.
    kc, vc = reference.quantize_e4m3(kf * 2), reference.quantize_e4m3(vf * 2)
    q = randn(rng, (3, 3, 8, dim), "bf16")
    k_new = randn(rng, (3, 3, heads_kv, dim), "bf16")
    v_new = randn(rng, (3, 3, heads_kv, dim), "bf16")
    ks = scale_arg(rng, "batch_head", 3, heads_kv)
    seqlens = np.int32(lengths)
    kw = dict(cache_seqlens=seqlens, k_new=k_new, v_new=v_new, block_table=table,
              kv_dtype="e4m3fn", k_scale=ks, v_scale=0.6)
    ref_out, ref_lse = reference.forward(q, kc.copy(), vc.copy(), causal=True, **kw)
    k, v = kc.copy(), vc.copy()
    out, lse = fmha_native.forward(q, as_fp8(k, "ml"), as_fp8(v, "ml"), device="cpu",
                                   causal=True, num_splits=num_splits,
                                   **{n: x for n, x in kw.items() if n != "kv_dtype"})
    assert not np.isnan(as_f64(out)).any()
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "bf16")
    new32 = k_new.astype(np.float32)
    assert np.array_equal(k, expected_cache(kc, new32, ks, seqlens, table))
    assert np.array_equal(v, expected_cache(vc, v_new.astype(np.float32),
                                            factors_of(0.6, 3, heads_kv), seqlens, table))


@pytest.mark.parametrize("num_splits", SPLITS)
def test_packed_varlen(num_splits):
    rng = np.random.default_rng(2700 + num_splits)
    q, cu_q = packed(rng, [3, 1, 6], 6, 32, "f16")
    kf, cu_k = packed(rng, [40, 0, 200], 3, 32, "f32")
    kc = reference.quantize_e4m3(kf * 3)
    vc = codes_of(rng, kc.shape)
    check(q, kc, vc, "f16", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True,
          kv_dtype="e4m3fn", k_scale=scale_arg(rng, "batch_head", 3, 3),
          v_scale=scale_arg(rng, "head", 3, 3), num_splits=num_splits)


def test_packed_queries_append_to_a_dense_cache():
    rng = np.random.default_rng(2750)
    q, cu_q = packed(rng, [2, 0, 3], 4, 16, "f32")
    kc, vc = codes_of(rng, (3, 12, 2, 16)), codes_of(rng, (3, 12, 2, 16))
    k_new, _ = packed(rng, [2, 0, 3], 2, 16, "f32")
    v_new, _ = packed(rng, [2, 0, 3], 2, 16, "f32")
    seqlens = np.int32([4, 7, 9])
    ks = scale_arg(rng, "batch_head", 3, 2)
    kw = dict(cu_seqlens_q=cu_q, cache_seqlens=seqlens, k_new=k_new, v_new=v_new,
              kv_dtype="e4m3fn", k_scale=ks)
    ref = reference.forward(q, kc.copy(), vc.copy(), **kw)
    k, v = kc.copy(), vc.copy()
    out, lse = fmha_native.forward(q, k, v, device="cpu", **kw)
    assert_close(as_f64(out), as_f64(lse), ref[0], ref[1], "f32")
    dense_new = np.zeros((3, 3, 2, 16), np.float32)
    for b, (s, n) in enumerate(zip(cu_q[:-1], np.diff(cu_q))):
        dense_new[b, :n] = k_new[s:s + n]
    want = kc.copy()
    for b, n in enumerate(np.diff(cu_q)):
        for t in range(n):
            want[b, seqlens[b] + t] = reference.quantize_e4m3(dense_new[b, t], ks[b][:, None])
    assert np.array_equal(k, want)


# ---------------------------------------------------------------- bad input

def _inputs(rng):
    q, _, _ = make_qkv(rng, 2, 1, 1, 4, 2, 16, "f16")
    return q, codes_of(rng, (2, 8, 2, 16)), codes_of(rng, (2, 8, 2, 16))


BAD = [
    # (keywords or a tweak, exception, message pattern)
    (dict(k_scale=0.0), ValueError, r"^k_scale must be positive and finite"),
    (dict(k_scale=-1.0), ValueError, r"^k_scale must be positive"),
    (dict(v_scale=float("nan")), ValueError, r"^v_scale must be positive"),
    (dict(v_scale=float("inf")), ValueError, r"^v_scale must be positive"),
    (dict(k_scale=1e39), ValueError, r"^k_scale must be positive and finite in float32"),
    (dict(k_scale=True), TypeError, r"^k_scale must be a real number"),
    (dict(k_scale=np.float32([1.0, 2.0, 3.0])), ValueError, r"^k_scale must be .*heads_kv"),
    (dict(v_scale=np.ones((3, 2), np.float32)), ValueError, r"^v_scale must be .*\(batch, "),
    (dict(k_scale=np.ones(2, np.float64)), TypeError, r"^k_scale must be float32.*float64"),
    (dict(k_scale=np.float32([1.0, 0.0])), ValueError, r"^k_scale\[1\] = 0: every fp8"),
    (dict(v_scale=np.float32([[1, 1], [1, np.nan]])), ValueError, r"^v_scale\[1, 1\] = nan"),
    (dict(k_scale=np.float32(-2.0).reshape(())), ValueError, r"^k_scale = -2: every fp8"),
    (dict(kv_dtype="e5m2"), ValueError, r"^kv_dtype must be None .*e4m3fn"),
    (dict(k_scale="1.0"), TypeError, r"^k_scale must be an array"),
]


@pytest.mark.parametrize("kw, exc, pattern", BAD)
def test_bad_scales_and_kv_dtype(kw, exc, pattern):
    rng = np.random.default_rng(2800)
    q, k, v = _inputs(rng)
    kw = dict(kw)
    kw.setdefault("kv_dtype", "e4m3fn")
    with pytest.raises(exc, match=pattern):
        fmha_native.forward(q, k, v, device="cpu", **kw)


def test_bad_dtypes_name_the_argument():
    rng = np.random.default_rng(2810)
    q, kc, vc = _inputs(rng)
    f16 = np.zeros(kc.shape, np.float16)
    with pytest.raises(TypeError, match=r"^v must have k's dtype uint8, got float16"):
        fmha_native.forward(q, kc, f16, kv_dtype="e4m3fn", device="cpu")
    with pytest.raises(TypeError, match=r"^v must have q's dtype float16, got uint8"):
        fmha_native.forward(q, f16, vc, device="cpu")
    with pytest.raises(TypeError, match=r"^k must have q's dtype float16 \(uint8 holding float8 "
                                        r"e4m3fn codes needs kv_dtype=\"e4m3fn\"\), got uint8"):
        fmha_native.forward(q, kc, vc, device="cpu")
    with pytest.raises(TypeError, match=r"^k must be float8_e4m3fn, or uint8 .*got float16"):
        fmha_native.forward(q, f16, f16, kv_dtype="e4m3fn", device="cpu")
    with pytest.raises(ValueError, match=r"^k_scale applies to an fp8 KV cache only .*float16"):
        fmha_native.forward(q, f16, f16, k_scale=2.0, device="cpu")
    with pytest.raises(TypeError, match=r"^q must be float16 or bfloat16 .*got uint8"):
        fmha_native.forward(kc, kc, vc, kv_dtype="e4m3fn", device="cpu")
    if ml_dtypes is not None:
        ml = kc.view(ml_dtypes.float8_e4m3fn)
        with pytest.raises(TypeError, match=r"^q must be float16 or bfloat16 .*got float8_e4m3fn"):
            fmha_native.forward(ml, ml, vc.view(ml_dtypes.float8_e4m3fn), device="cpu")
        with pytest.raises(TypeError, match=r"^v must have k's dtype float8_e4m3fn, got uint8"):
            fmha_native.forward(q, ml, vc, device="cpu")
    if torch is not None:
        tk = torch.from_numpy(kc).view(torch.float8_e4m3fn)
        with pytest.raises(TypeError, match=r"^q must be float16 .*got float8_e4m3fn"):
            fmha_native.forward(tk, tk, tk, device="cpu")


def test_refused_append_leaves_everything_unchanged():
    rng = np.random.default_rng(2820)
    q, kc, vc = _inputs(rng)
    k, v = kc.copy(), vc.copy()
    k_new = randn(rng, (2, 1, 2, 16), "f16")
    v_new = randn(rng, (2, 1, 2, 16), "f16")
    keep = [x.copy() for x in (q, k_new, v_new)]
    base = dict(cache_seqlens=np.int32([2, 3]), kv_dtype="e4m3fn")
    attempts = [
        (dict(k_new=k_new, v_new=v_new, k_scale=np.float32([1.0, -1.0])), ValueError),
        (dict(k_new=k_new, v_new=v_new, v_scale=np.ones(5, np.float32)), ValueError),
        (dict(k_new=k_new.view(np.uint16).astype(np.uint8)[..., :16], v_new=v_new), TypeError),
        (dict(k_new=k_new, v_new=v_new, kv_dtype="e5m2"), ValueError),
    ]
    if ml_dtypes is not None:  # caller-quantized rows are refused: the cache quantizes
        fp8_rows = codes_of(rng, (2, 1, 2, 16)).view(ml_dtypes.float8_e4m3fn)
        attempts.append((dict(k_new=fp8_rows, v_new=v_new), TypeError))
    for extra, exc in attempts:
        with pytest.raises(exc):
            fmha_native.forward(q, k, v, device="cpu", **dict(base, **extra))
        assert np.array_equal(k, kc) and np.array_equal(v, vc)
        for x, y in zip((q, k_new, v_new), keep):
            assert np.array_equal(x.view(np.uint16), y.view(np.uint16))


def test_fp8_k_new_is_refused_with_the_reason():
    if ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed")
    rng = np.random.default_rng(2830)
    q, kc, vc = _inputs(rng)
    rows = codes_of(rng, (2, 1, 2, 16)).view(ml_dtypes.float8_e4m3fn)
    with pytest.raises(TypeError, match=r"^k_new must have q's dtype \(an fp8 cache quantizes "
                                        r"appended rows on write\), got float8_e4m3fn"):
        fmha_native.forward(q, kc, vc, device="cpu", kv_dtype="e4m3fn",
                            cache_seqlens=np.int32([1, 1]), k_new=rows, v_new=rows)


# ---------------------------------------------------------------- explain

@pytest.mark.parametrize("k_kind, word", [("none", "none"), ("number", "per-tensor"),
                                          ("0d", "per-tensor"), ("head", "per-kv-head"),
                                          ("batch_head", "per-sequence-and-kv-head")])
def test_explain_shows_kv_dtype_and_scale_granularity(k_kind, word):
    rng = np.random.default_rng(2900)
    q, kc, vc = _inputs(rng)
    ks = scale_arg(rng, k_kind, 2, 2)
    plan = fmha_native.explain(q, kc, vc, device="cpu", kv_dtype="e4m3fn", v_scale=0.5,
                               **scale_kw(ks, None))
    assert plan["kv_dtype"] == "float8_e4m3fn" and plan["dtype"] == "float16"
    assert plan["k_scale"] == word and plan["v_scale"] == "per-tensor"
    assert "K/V float8_e4m3fn, k_scale " in plan["reason"]
    assert "dequantized" in plan["gate"]["dtype"]["why"]
    plain = fmha_native.explain(q, np.zeros(kc.shape, np.float16), np.zeros(kc.shape, np.float16),
                                device="cpu")
    assert plain["kv_dtype"] == "float16" and plain["k_scale"] == "none"
    assert "float8" not in plain["reason"]


# ---------------------------------------------------------------- torch ops

def test_torch_ops_carry_kv_dtype_and_scales():
    if torch is None:
        pytest.skip("torch is not installed")
    fmha_native._load_torch()
    rng = np.random.default_rng(3000)
    q = torch.from_numpy(randn(rng, (2, 3, 4, 16), "f32"))
    kc, vc = codes_of(rng, (2, 30, 2, 16)), codes_of(rng, (2, 30, 2, 16))
    k = torch.from_numpy(kc).view(torch.float8_e4m3fn)
    v = torch.from_numpy(vc).view(torch.float8_e4m3fn)
    ks = torch.from_numpy(scale_arg(rng, "batch_head", 2, 2))
    direct = fmha_native.forward(q, k, v, device="cpu", k_scale=ks, v_scale=0.7)
    via_ops = fmha_native._torch_ops.call_forward(q, k, v, dict(device="cpu", k_scale=ks,
                                                               v_scale=0.7))
    assert torch.equal(direct[0], via_ops[0]) and torch.equal(direct[1], via_ops[1])
    u8 = fmha_native._torch_ops.call_forward(q, torch.from_numpy(kc), torch.from_numpy(vc),
                                             dict(device="cpu", k_scale=ks, v_scale=0.7,
                                                  kv_dtype="e4m3fn"))
    assert torch.equal(direct[0], u8[0])
    from torch.fx.experimental.proxy_tensor import make_fx
    graph = make_fx(lambda q, k, v, s: fmha_native.forward(q, k, v, k_scale=s, v_scale=0.7,
                                                           device="cpu"))(q, k, v, ks)
    traced = graph(q, k, v, ks)
    assert torch.equal(traced[0], direct[0]) and torch.equal(traced[1], direct[1])
    scalars = dict(cache_seqlens=None, block_table=None, cu_seqlens_q=None, cu_seqlens_k=None,
                   causal=False, softmax_scale=None, num_splits=2, return_lse=True,
                   max_seqlen_q=None, max_seqlen_k=None, device="cpu", stream=None,
                   kv_dtype="e4m3fn", k_scale=ks, v_scale_value=0.7)
    # opcheck's schema test does arithmetic on the inputs, which torch has no fp8 CPU
    # kernels for: the uint8 storage of the same codes goes through the same op.
    torch.library.opcheck(torch.ops.fmha_native.forward.default,
                          (q, torch.from_numpy(kc), torch.from_numpy(vc)), scalars)
    with pytest.raises(ValueError, match="^v_scale must be positive"):
        fmha_native._torch_ops.call_forward(q, k, v, dict(v_scale=-1.0))


# ---------------------------------------------------------------- the GPU gate

H100 = dict(name="NVIDIA H100 80GB HBM3", arch="sm_90", cc=(9, 0), sm_count=132,
            l2_bytes=50 << 20, max_smem_per_block=227 << 10, max_smem_per_sm=228 << 10)


def test_gpu_gate_admits_an_fp8_cache_on_the_tensor_core_tiles():
    problem = dict(batch=1, seqlen_q=1, seqlen_k=8192, heads_q=32, heads_kv=8, head_dim=128,
                   dtype="bfloat16")
    plan = _fmha_native._plan_for_device(problem, H100)
    assert plan["supported"] is True and plan["kv_dtype"] == "bfloat16"
    plan = _fmha_native._plan_for_device(dict(problem, kv_dtype="float8_e4m3fn"), H100)
    assert plan["supported"] is True and plan["kv_dtype"] == "float8_e4m3fn"
    assert all(item["met"] for item in plan["gate"].values())
    assert "sm90" not in plan["kernel"], plan["kernel"]
    # Prefill too runs on the tensor-core tiles, which widen the codes; explain says why
    # the sm90 kernel does not.
    prefill = dict(problem, seqlen_q=4096, seqlen_k=4096, kv_dtype="float8_e4m3fn")
    plan = _fmha_native._plan_for_device(prefill, H100)
    assert plan["supported"] is True and "sm90" not in plan["kernel"], plan["kernel"]
    # An fp32 q has no GPU kernel with or without an fp8 cache.
    plan = _fmha_native._plan_for_device(dict(problem, dtype="float32",
                                              kv_dtype="float8_e4m3fn"), H100)
    assert plan["supported"] is False and plan["gate"]["dtype"]["met"] is False
    assert plan["reason"].startswith("float32 q with a float8_e4m3fn KV cache is not supported"
                                     ), plan["reason"]


def test_device_gpu_runs_fp8():
    """The GPU run of host arrays and of torch CUDA tensors against the reference
    (tests/test_gpu_fp8.py covers the GPU paths one by one)."""
    if not gpu_devices():
        pytest.skip(NO_GPU_REASON)
    rng = np.random.default_rng(3100)
    q, _, _ = make_qkv(rng, 2, 1, 1, 4, 2, 64, "f16")
    kc, vc = codes_of(rng, (2, 8, 2, 64)), codes_of(rng, (2, 8, 2, 64))
    ref = reference.forward(q, kc, vc, kv_dtype="e4m3fn", k_scale=0.5)
    out, lse = fmha_native.forward(q, kc, vc, kv_dtype="e4m3fn", k_scale=0.5, device="gpu")
    assert_close(as_f64(out), as_f64(lse), ref[0], ref[1], "f16")
    plan = fmha_native.explain(q, kc, vc, kv_dtype="e4m3fn", k_scale=0.5, device="gpu")
    assert plan["backend"] == "gpu" and "sm90" not in plan["kernel"], plan["kernel"]
    if torch is not None and torch.cuda.is_available():
        dev = torch.device("cuda")
        tq = torch.from_numpy(q).to(dev)
        tk = torch.from_numpy(kc).to(dev).view(torch.float8_e4m3fn)
        tv = torch.from_numpy(vc).to(dev).view(torch.float8_e4m3fn)
        scale = torch.full((2,), 0.5, device=dev)
        before = tk.clone()
        out, lse = fmha_native.forward(tq, tk, tv, k_scale=scale)
        assert_close(as_f64(out.cpu().numpy()), as_f64(lse.cpu().numpy()), ref[0], ref[1], "f16")
        assert torch.equal(tk.view(torch.uint8), before.view(torch.uint8))
