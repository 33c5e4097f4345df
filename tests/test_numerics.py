"""Numerical corner cases: custom scales, huge logits, NaN isolation, strided and
broadcast inputs, decode, and the FlashAttention "at most ~2x a naive implementation" rule."""
import numpy as np
import pytest

from fmha_native import reference
from _harness import (LSE_RTOL_LARGE, assert_close, check_forward, make_qkv, np_dtype, randn,
                      rel_fro)


def _dtypes(backend):
    return ("f16", "bf16") if backend.is_gpu else ("f32", "f16", "bf16")


@pytest.mark.parametrize("scale", [0.3, 2.0, 1, 0.0, -0.5], ids=["0.3", "2.0", "int1", "zero", "neg"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_custom_softmax_scale(backend, scale, causal):
    rng = np.random.default_rng(5000)
    for dtype in _dtypes(backend):
        q, k, v = make_qkv(rng, 2, 40, 150, 4, 2, 64, dtype)
        backend.require(q, k, v, softmax_scale=scale)
        check_forward(backend, q, k, v, dtype, causal=causal, softmax_scale=scale)


@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("how", ["scale1e4", "q_times_1e3"])
def test_large_logits(backend, how, num_splits):
    """Huge logits: no NaN, no inf, and still the reference (lse relative to its size)."""
    rng = np.random.default_rng(5100)
    for dtype in _dtypes(backend):
        q, k, v = make_qkv(rng, 2, 33, 300, 4, 2, 64, dtype)
        kw = {"causal": True, "num_splits": num_splits}
        if how == "scale1e4":
            kw["softmax_scale"] = 1e4
        else:
            q = randn(rng, q.shape, dtype, scale=1e3)
        backend.require(q, k, v, **kw)
        out, lse = check_forward(backend, q, k, v, dtype, lse_rtol=LSE_RTOL_LARGE, **kw)
        assert np.isfinite(out).all() and np.isfinite(lse).all()


@pytest.mark.parametrize("num_splits", [0, 1, 2])
def test_nan_row_is_isolated(backend, num_splits):
    """NaN in q[b, i, h] makes only row (b, i, h) NaN."""
    rng = np.random.default_rng(5200)
    for dtype in _dtypes(backend):
        q, k, v = make_qkv(rng, 2, 20, 200, 4, 2, 64, dtype)
        q[1, 7, 2, 5] = np.nan
        backend.require(q, k, v, num_splits=num_splits)
        out, lse = check_forward(backend, q, k, v, dtype, causal=True, num_splits=num_splits)
        nan_rows = np.isnan(out).any(axis=-1)
        expected = np.zeros_like(nan_rows)
        expected[1, 7, 2] = True
        assert np.array_equal(nan_rows, expected)
        assert np.isnan(out[1, 7, 2]).all()
        assert np.isnan(lse[1, 2, 7])
        assert np.isnan(lse).sum() == 1


def _strided_views(rng, dtype, shape):
    """Views of q's shape with unusual strides, all over fresh random data."""
    batch, seqlen, heads, head_dim = shape
    dt = np_dtype(dtype)
    views = {}
    base = randn(rng, (batch, heads, seqlen, head_dim), dtype)
    views["transposed_bhsd"] = base.transpose(0, 2, 1, 3)
    base = randn(rng, (batch, 2 * seqlen, heads, 2 * head_dim), dtype)
    views["step_slices"] = base[:, ::2, :, :head_dim]
    base = randn(rng, (batch, seqlen, heads, 2 * head_dim), dtype)
    views["head_dim_stride2"] = base[..., ::2]
    views["fortran_order"] = np.asfortranarray(randn(rng, shape, dtype))
    views["negative_strides"] = randn(rng, shape, dtype)[:, ::-1, ::-1]
    base = randn(rng, (batch, seqlen, heads, head_dim + 3), dtype)
    views["offset_slice"] = base[..., 3:]
    views["broadcast_zero_strides"] = np.broadcast_to(randn(rng, (1, 1, heads, head_dim), dtype), shape)
    for name, view in views.items():
        assert view.shape == shape and view.dtype == dt, name
    return views


@pytest.mark.parametrize("which", ["q", "k", "v", "all"])
@pytest.mark.parametrize("layout", ["transposed_bhsd", "step_slices", "head_dim_stride2",
                                    "fortran_order", "negative_strides", "offset_slice",
                                    "broadcast_zero_strides"])
def test_strided_host_inputs(cpu, layout, which):
    """Host arrays with any strides (the glue may copy them) give the reference result."""
    rng = np.random.default_rng(5300)
    for dtype in ("f32", "bf16"):
        q, k, v = make_qkv(rng, 2, 30, 90, 4, 2, 64, dtype)
        if which in ("q", "all"):
            q = _strided_views(rng, dtype, q.shape)[layout]
        if which in ("k", "all"):
            k = _strided_views(rng, dtype, k.shape)[layout]
        if which in ("v", "all"):
            v = _strided_views(rng, dtype, v.shape)[layout]
        check_forward(cpu, q, k, v, dtype, causal=True)


@pytest.mark.parametrize("layout", ["transposed_bhsd", "step_slices", "offset_slice"])
def test_strided_gpu_inputs(gpu_backend, layout):
    """Device tensors with a unit head_dim stride and any other strides."""
    if not gpu_backend.use_torch:
        pytest.skip("needs torch with CUDA to make strided device tensors")
    import torch

    import fmha_native
    rng = np.random.default_rng(5310)
    q, k, v = make_qkv(rng, 2, 30, 90, 4, 2, 64, "f16")
    dense = torch.from_numpy(q).cuda()
    if layout == "transposed_bhsd":
        qd = dense.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout == "step_slices":
        qd = torch.repeat_interleave(dense, 2, dim=1)[:, ::2]
    else:
        qd = torch.cat([dense[..., :3], dense], dim=-1)[..., 3:]
    assert qd.stride(-1) == 1 and not qd.is_contiguous() and torch.equal(qd, dense)
    out, lse = fmha_native.forward(qd, gpu_backend.put(k), gpu_backend.put(v), causal=True)
    ref_out, ref_lse = reference.forward(q, k, v, causal=True)
    assert_close(reference.to_float64(out), reference.to_float64(lse), ref_out, ref_lse, "f16")


@pytest.mark.parametrize("heads_q,heads_kv", [(8, 8), (8, 2), (8, 1)])
def test_decode_causal_equals_full(backend, heads_q, heads_kv):
    """seqlen_q = 1: bottom-right causal sees every key, so causal == non-causal."""
    rng = np.random.default_rng(5400)
    dtype = "f16" if backend.is_gpu else "f32"
    q, k, v = make_qkv(rng, 3, 1, 777, heads_q, heads_kv, 128, dtype)
    backend.require(q, k, v)
    out_c, lse_c = check_forward(backend, q, k, v, dtype, causal=True)
    out_f, lse_f = check_forward(backend, q, k, v, dtype, causal=False)
    np.testing.assert_allclose(out_c, out_f, rtol=0, atol=1e-6 if dtype == "f32" else 1e-3)
    np.testing.assert_allclose(lse_c, lse_f, rtol=0, atol=1e-5)


def _naive_same_precision(q, k, v, dtype, causal):
    """softmax(QK^T)V with every intermediate rounded to dtype (fp32 arithmetic inside):
    what a plain PyTorch implementation in that dtype computes."""
    dt = np_dtype(dtype)

    def rnd(x):
        return x.astype(np.float32).astype(dt).astype(np.float64)

    qf, kf, vf = (reference.to_float64(x) for x in (q, k, v))
    batch, seqlen_q, heads_q, head_dim = qf.shape
    seqlen_k, heads_kv = kf.shape[1], kf.shape[2]
    kf = np.repeat(kf, heads_q // heads_kv, axis=2)
    vf = np.repeat(vf, heads_q // heads_kv, axis=2)
    scores = rnd(np.einsum("bqhd,bkhd->bhqk", qf, kf) / np.sqrt(head_dim))
    if causal:
        visible = np.arange(seqlen_k)[None, :] <= np.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q
        scores = np.where(visible, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs = rnd(probs / probs.sum(-1, keepdims=True))
    return rnd(np.einsum("bhqk,bkhd->bqhd", probs, vf))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_error_at_most_twice_naive(backend, dtype, num_splits):
    """FlashAttention's rule: our error is at most ~2x that of a naive implementation in
    the same precision."""
    rng = np.random.default_rng(5500)
    q, k, v = make_qkv(rng, 2, 64, 512, 4, 2, 64, dtype)
    backend.require(q, k, v, num_splits=num_splits)
    ref_out = reference.forward(q, k, v, causal=True, return_lse=False)
    out, _ = backend.forward(q, k, v, causal=True, num_splits=num_splits)
    ours = rel_fro(out, ref_out)
    naive = rel_fro(_naive_same_precision(q, k, v, dtype, True), ref_out)
    assert ours <= 2.0 * naive, f"error {ours:.3g} > 2 x naive {naive:.3g}"
