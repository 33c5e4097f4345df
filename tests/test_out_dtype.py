"""forward(..., out_dtype=float32): float32 out for float16/bfloat16 inputs.

A partial state that is merged later (combine, the context-parallel ring) must not be
rounded to 16 bits first.  The CPU computes in fp32 and writes the rows in float32, so its
float32 out meets the float32 accuracy bound against the float64 reference (on the same
rounded inputs), far inside the bound its bfloat16/float16 out meets.  The GPU runs the
producers' split variant (fp32 partials) and the combine writes float32, even with one
split; its tiles round P to the inputs' dtype for the second matmul, so its float32 out
cannot reach the float32 bound: there the tests check that it is the unrounded form of the
16-bit result (that result is it rounded, within one unit in the last place) and closer
to the reference.  GPU cases skip without a GPU.  Also: out= float32 buffers, the
spellings of out_dtype and the errors, explain, the GPU planner, the torch ops.
"""
import os
import sys

import numpy as np
import pytest

import fmha_native
from fmha_native import reference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import OUT_RTOL, as_f64, make_qkv, packed, paged_cache, randn, rel_fro  # noqa: E402

import _fmha_native  # noqa: E402

try:
    import torch
except ImportError:  # the torch cases skip
    torch = None

DTYPES = ("bf16", "f16")
# Units in the last place of the 16-bit formats (relative, at 1.0).
ULP = {"bf16": 2.0 ** -7, "f16": 2.0 ** -10}


def _errors(out, ref):
    """Relative Frobenius error of a result against the reference (NaN rows excluded)."""
    out = as_f64(out)
    finite = ~np.isnan(ref)
    assert np.array_equal(np.isnan(out), ~finite), "NaN pattern differs from the reference"
    return rel_fro(np.where(finite, out, 0.0), np.where(finite, ref, 0.0))


def _rounded_to(x, dtype):
    """float64 x rounded to a 16-bit dtype and back."""
    import ml_dtypes
    target = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
    return x.astype(np.float32).astype(target).astype(np.float64)


def _check(backend, dtype, q, k, v, fresh=None, **kw):
    """Run one problem with out_dtype=float32 and with q's dtype on backend and hold both
    to the reference: float32 out to the float32 bound (CPU) or as the unrounded 16-bit
    result (GPU); lse float32 both ways.  fresh(kw) copies inputs a call writes (the KV
    cache of an append) so both calls see the same cache."""
    backend.skip_unsupported(dtype)
    ref_kw = {key: val for key, val in kw.items() if key != "num_splits"}
    ref_out, ref_lse = reference.forward(q, k, v, **ref_kw)
    fresh = fresh or (lambda kw: (k, v, kw))
    k1, v1, kw1 = fresh(kw)
    out32, lse32 = backend.forward_native(q, k1, v1, out_dtype="float32", **kw1)
    k2, v2, kw2 = fresh(kw)
    out16, lse16 = backend.forward_native(q, k2, v2, **kw2)
    assert str(out32.dtype).endswith("float32"), out32.dtype
    assert not str(out16.dtype).endswith("float32"), out16.dtype
    err32, err16 = _errors(out32, ref_out), _errors(out16, ref_out)
    finite = np.isfinite(ref_lse)
    for lse in (lse32, lse16):
        assert np.abs(as_f64(lse)[finite] - ref_lse[finite]).max() <= 1e-4
    if not backend.is_gpu:
        # The float32 bound, an order of magnitude inside what the 16-bit out reaches.
        assert err32 <= OUT_RTOL["f32"], f"float32 out error {err32:.3g} > {OUT_RTOL['f32']:g}"
        assert err32 * 10 < err16, (err32, err16)
        # The 16-bit out is the float32 one rounded: the same rows, same bits after rounding.
        np.testing.assert_array_equal(_rounded_to(as_f64(out32), dtype), as_f64(out16))
        return
    assert err32 <= OUT_RTOL[dtype] and err32 < err16, (err32, err16)
    # Where both outs come from one producer (the 16-bit one may run the sm90 kernel,
    # which writes no partials), the 16-bit out is the float32 one rounded.
    plans = [fmha_native.explain(backend.put(q), backend.put(k), backend.put(v),
                                 **backend.device_kw(), **extra,
                                 **{key: backend.put(val) for key, val in kw.items()})
             for extra in ({"out_dtype": "float32"}, {})]
    if plans[0]["kernel"].replace("+combine", "") != plans[1]["kernel"].replace("+combine", ""):
        return
    o32, o16 = as_f64(out32), as_f64(out16)
    ok = ~np.isnan(o32)
    diff = np.abs(_rounded_to(o32, dtype) - o16)[ok]
    scale = np.maximum(np.abs(o32[ok]), 2.0 ** -14)
    assert (diff <= ULP[dtype] * scale).all(), "the 16-bit out is not the float32 out rounded"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 2, 7])
@pytest.mark.parametrize("causal", [False, True])
def test_dense(backend, dtype, splits, causal):
    rng = np.random.default_rng(splits * 10 + causal)
    q, k, v = make_qkv(rng, 2, 37, 200, 4, 2, 64, dtype)
    _check(backend, dtype, q, k, v, causal=causal, num_splits=splits)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 2, 7])
def test_kv_cache_append(backend, dtype, splits):
    rng = np.random.default_rng(40 + splits)
    q, k, v = make_qkv(rng, 3, 2, 160, 8, 2, 64, dtype)
    k_new, v_new = randn(rng, (3, 2, 2, 64), dtype), randn(rng, (3, 2, 2, 64), dtype)
    seqlens = np.array([0, 57, 158], np.int32)

    def fresh(kw):
        return k.copy(), v.copy(), kw

    _check(backend, dtype, q, k, v, fresh, causal=True, cache_seqlens=seqlens, k_new=k_new,
           v_new=v_new, num_splits=splits)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 2, 7])
def test_packed(backend, dtype, splits):
    rng = np.random.default_rng(50 + splits)
    q, cu_q = packed(rng, [5, 0, 33], 4, 64, dtype)
    k, cu_k = packed(rng, [40, 9, 120], 2, 64, dtype)
    v = randn(rng, k.shape, dtype)
    _check(backend, dtype, q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
           num_splits=splits)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 2, 7])
def test_paged(backend, dtype, splits):
    rng = np.random.default_rng(60 + splits)
    lengths = [70, 3, 128]
    k, v, table = paged_cache(rng, lengths, 16, 9, 2, 64, dtype)
    q = randn(rng, (3, 1, 8, 64), dtype)
    _check(backend, dtype, q, k, v, cache_seqlens=np.array(lengths, np.int32),
           block_table=table, num_splits=splits)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_out_buffer_float32(backend, dtype, layout):
    """A float32 out= for 16-bit q means out_dtype=float32 (with or without saying so);
    a strided buffer (rows of a wider one) is written in place, nothing else."""
    backend.skip_unsupported(dtype)
    rng = np.random.default_rng(70)
    q, k, v = make_qkv(rng, 2, 19, 90, 4, 2, 64, dtype)
    expected, _ = backend.forward(q, k, v, causal=True, out_dtype="float32")
    for given in ({}, {"out_dtype": "float32"}):
        wide = np.full((2, 19, 4, 3 * 64), 7.0, np.float32)
        buf = wide if layout == "strided" else np.full((2, 19, 4, 64), 7.0, np.float32)
        buf = backend.put(buf)
        out = buf[..., 64:128] if layout == "strided" else buf
        got, _ = backend.forward_native(q, k, v, causal=True, out=out, **given)
        assert got is out
        np.testing.assert_array_equal(as_f64(out), expected)
        if layout == "strided":
            rest = as_f64(buf)
            assert (rest[..., :64] == 7.0).all() and (rest[..., 128:] == 7.0).all()


def test_float32_inputs_take_float32():
    rng = np.random.default_rng(80)
    q, k, v = make_qkv(rng, 1, 9, 30, 2, 1, 32, "f32")
    a, _ = fmha_native.forward(q, k, v, device="cpu")
    b, _ = fmha_native.forward(q, k, v, device="cpu", out_dtype=np.float32)
    assert b.dtype == np.float32
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("spelling", ["float32", "np.float32", "np.dtype", "torch"])
def test_spellings(spelling):
    rng = np.random.default_rng(81)
    q, k, v = make_qkv(rng, 1, 5, 20, 2, 2, 32, "bf16")
    value = {"float32": "float32", "np.float32": np.float32,
             "np.dtype": np.dtype("float32"), "torch": None}[spelling]
    if spelling == "torch":
        if torch is None:
            pytest.skip("torch is not installed")
        value = torch.float32
    out, _ = fmha_native.forward(q, k, v, device="cpu", out_dtype=value)
    assert out.dtype == np.float32
    assert fmha_native.explain(q, k, v, device="cpu", out_dtype=value)["out_dtype"] == "float32"


@pytest.mark.parametrize("value", ["float16", "bfloat16", "f32", np.float64, np.float16, 3,
                                   True, "torch.float32"])
def test_bad_out_dtype(value):
    rng = np.random.default_rng(82)
    q, k, v = make_qkv(rng, 1, 5, 20, 2, 2, 32, "bf16")
    with pytest.raises(ValueError, match="out_dtype"):
        fmha_native.forward(q, k, v, device="cpu", out_dtype=value)


def test_bad_torch_out_dtype():
    if torch is None:
        pytest.skip("torch is not installed")
    q = torch.randn(1, 5, 2, 32).bfloat16()
    for value in (torch.bfloat16, torch.float64):
        with pytest.raises(ValueError, match="out_dtype"):
            fmha_native.forward(q, q, q, out_dtype=value)


def test_out_and_out_dtype_must_agree():
    rng = np.random.default_rng(83)
    q, k, v = make_qkv(rng, 1, 5, 20, 2, 2, 32, "bf16")
    with pytest.raises(ValueError, match="out has dtype bfloat16 but out_dtype is float32"):
        fmha_native.forward(q, k, v, device="cpu", out_dtype="float32", out=np.empty_like(q))
    with pytest.raises(ValueError, match="out must have q's dtype bfloat16 or float32, got "
                                         "float16"):
        fmha_native.forward(q, k, v, device="cpu", out=np.empty(q.shape, np.float16))
    f32 = make_qkv(rng, 1, 5, 20, 2, 2, 32, "f32")
    with pytest.raises(ValueError, match="out must have q's dtype float32, got float16"):
        fmha_native.forward(*f32, device="cpu", out=np.empty(q.shape, np.float16))


def test_explain_shows_out_dtype():
    rng = np.random.default_rng(84)
    q, k, v = make_qkv(rng, 1, 5, 20, 2, 2, 32, "f16")
    assert fmha_native.explain(q, k, v, device="cpu")["out_dtype"] == "float16"
    plan = fmha_native.explain(q, k, v, device="cpu", out_dtype="float32")
    assert plan["out_dtype"] == "float32" and plan["dtype"] == "float16"
    assert plan["partials"] is False  # the CPU rows write float32 themselves


# ---------------------------------------------------------------- the GPU planner (no GPU)

H100_SM90 = dict(name="NVIDIA H100 80GB HBM3", arch="sm_90", cc=(9, 0), sm_count=132,
                 l2_bytes=50 << 20, max_smem_per_block=227 << 10, max_smem_per_sm=228 << 10,
                 archs_built=["80", "90a"])


@pytest.mark.parametrize("prefill_kernel", ["auto", "sm90"])
def test_gpu_plan_takes_partials_and_the_mma_tiles(prefill_kernel):
    problem = dict(batch=4, seqlen_q=4096, seqlen_k=4096, heads_q=32, heads_kv=8, head_dim=128,
                   dtype="bfloat16", causal=1)
    plan = _fmha_native._plan_for_device(problem, H100_SM90, prefill_kernel=prefill_kernel)
    assert plan["kernel"].startswith("fwd_sm90<") and not plan["partials"], plan["reason"]
    plan = _fmha_native._plan_for_device(dict(problem, out_dtype="float32"), H100_SM90,
                                         prefill_kernel=prefill_kernel)
    assert plan["kernel"].startswith("fwd_mma<bfloat16") and plan["kernel"].endswith("+combine")
    assert plan["partials"] and plan["num_splits"] == 1 and plan["out_dtype"] == "float32"
    assert "not fwd_sm90: out_dtype float32 needs fp32 partials" in plan["reason"]
    assert "combine writes out in float32, even with one split" in plan["reason"]


def test_gpu_plan_decode_keeps_its_splits():
    problem = dict(batch=1, seqlen_q=1, seqlen_k=1 << 16, heads_q=32, heads_kv=8, head_dim=128,
                   dtype="float16")
    a = _fmha_native._plan_for_device(problem, H100_SM90)
    b = _fmha_native._plan_for_device(dict(problem, out_dtype="float32"), H100_SM90)
    assert a["num_splits"] == b["num_splits"] > 1 and a["partials"] and b["partials"]
    assert a["kernel"] == b["kernel"]
    with pytest.raises(ValueError, match="out_dtype"):
        _fmha_native._plan_for_device(dict(problem, out_dtype="bfloat16"), H100_SM90)


# ------------------------------------------------------------------------- torch ops

def _torch_or_skip():
    if torch is None:
        pytest.skip("torch is not installed")
    return torch


def test_torch_eager_allocates_float32():
    torch = _torch_or_skip()
    q = torch.randn(2, 7, 4, 32).bfloat16()
    k = torch.randn(2, 30, 2, 32).bfloat16()
    # device="cpu": host tensors would run on a visible GPU, whose tiles round P
    out, lse = fmha_native.forward(q, k, k, causal=True, out_dtype=torch.float32, device="cpu")
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    ref_out, _ = reference.forward(q, k, k, causal=True)
    assert rel_fro(out.double().numpy(), ref_out) <= OUT_RTOL["f32"]


def test_torch_fake_gives_float32_out():
    torch = _torch_or_skip()
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(2, 7, 4, 32, dtype=torch.bfloat16)
        out, lse = fmha_native.forward(q, q, q, out_dtype="float32")
        assert out.dtype == torch.float32 and tuple(out.shape) == (2, 7, 4, 32)
        out = fmha_native.forward(q, q, q, return_lse=False)
        assert out.dtype == torch.bfloat16
        with pytest.raises(ValueError, match="out_dtype"):
            fmha_native.forward(q, q, q, out_dtype="float16")


def test_torch_opcheck_out_dtype():
    torch = _torch_or_skip()
    ops = torch.ops.fmha_native
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 7, 4, 32, generator=gen).bfloat16()
    k = torch.randn(2, 30, 2, 32, generator=gen).bfloat16()
    scalars = dict(cache_seqlens=None, block_table=None, cu_seqlens_q=None, cu_seqlens_k=None,
                   causal=True, softmax_scale=None, num_splits=0, return_lse=True,
                   max_seqlen_q=None, max_seqlen_k=None, device="cpu", stream=None,
                   out_dtype=torch.float32)
    torch.library.opcheck(ops.forward.default, (q, k, k), scalars)
    out = torch.full(q.shape, 7.0)
    lse = torch.full((2, 4, 7), 7.0)
    torch.library.opcheck(ops.forward_out.default, (q, k, k, out, lse), scalars)


def test_torch_compile_out_dtype():
    torch = _torch_or_skip()
    q = torch.randn(1, 9, 2, 32).bfloat16()
    k = torch.randn(1, 40, 2, 32).bfloat16()

    @torch.compile(fullgraph=True, backend="eager")
    def step(q, k):
        out, lse = fmha_native.forward(q, k, k, causal=True, out_dtype=torch.float32,
                                       device="cpu")
        return out * 2, lse

    out2, _ = step(q, k)
    assert out2.dtype == torch.float32
    direct, _ = fmha_native.forward(q, k, k, causal=True, out_dtype="float32", device="cpu")
    torch.testing.assert_close(out2 / 2, direct, rtol=0, atol=0)
