"""Parity of every backend with the float64 reference: dtypes, head dims, head layouts,
causal and not, sequence lengths that are not tile multiples, empty problems."""
import numpy as np
import pytest

from _harness import check_forward, make_qkv, np_dtype

CPU_HEAD_DIMS = (1, 16, 32, 64, 80, 96, 128, 256)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", CPU_HEAD_DIMS)
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_dtype_head_dim(backend, dtype, head_dim, causal):
    backend.skip_unsupported(dtype)
    rng = np.random.default_rng(1000 + head_dim)
    q, k, v = make_qkv(rng, 2, 37, 113, 4, 2, head_dim, dtype)
    backend.require(q, k, v, causal=causal)
    check_forward(backend, q, k, v, dtype, causal=causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads_q,heads_kv", [(4, 4), (8, 2), (6, 1), (16, 2)],
                         ids=["mha", "gqa4", "mqa", "gqa8"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_head_layouts(backend, dtype, head_dim, heads_q, heads_kv, causal):
    backend.skip_unsupported(dtype)
    rng = np.random.default_rng(2000 + heads_q * 10 + heads_kv)
    q, k, v = make_qkv(rng, 2, 65, 130, heads_q, heads_kv, head_dim, dtype)
    backend.require(q, k, v, causal=causal)
    check_forward(backend, q, k, v, dtype, causal=causal)


SEQLENS = [(1, 1), (3, 3), (17, 17), (113, 113), (1, 17), (3, 113), (17, 1000), (1, 1000),
           (113, 1000), (1000, 1000), (1, 4097), (17, 4097),
           pytest.param(1000, 4097, marks=pytest.mark.slow),
           pytest.param(4097, 4097, marks=pytest.mark.slow)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
def test_seqlens(backend, seqlen_q, seqlen_k, causal):
    dtype = "f16" if backend.is_gpu else "f32"
    rng = np.random.default_rng(3000 + seqlen_q + seqlen_k)
    # Few heads at the long lengths keep the float64 reference (and CI) fast.
    heads = 2 if seqlen_q * seqlen_k <= 200_000 else 1
    q, k, v = make_qkv(rng, 2 if heads == 2 else 1, seqlen_q, seqlen_k, 2 * heads, heads, 64, dtype)
    backend.require(q, k, v, causal=causal)
    check_forward(backend, q, k, v, dtype, causal=causal)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_seqlens_low_precision_long(backend, dtype):
    rng = np.random.default_rng(3100)
    q, k, v = make_qkv(rng, 1, 333, 2049, 2, 1, 128, dtype)
    backend.require(q, k, v, causal=True)
    check_forward(backend, q, k, v, dtype, causal=True)


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(17, 5), (100, 64), (65, 1), (200, 130)])
@pytest.mark.parametrize("num_splits", [0, 1, 2])
def test_causal_more_queries_than_keys(backend, seqlen_q, seqlen_k, num_splits):
    """Bottom-right causal: the first seqlen_q - seqlen_k rows see no key: out 0, lse -inf."""
    dtype = "f16" if backend.is_gpu else "f32"
    rng = np.random.default_rng(3200 + seqlen_q)
    q, k, v = make_qkv(rng, 2, seqlen_q, seqlen_k, 4, 2, 64, dtype)
    backend.require(q, k, v, causal=True)
    out, lse = check_forward(backend, q, k, v, dtype, causal=True, num_splits=num_splits)
    empty = seqlen_q - seqlen_k
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert (out[:, :empty] == 0).all()
    assert np.isneginf(lse[:, :, :empty]).all()
    assert np.isfinite(lse[:, :, empty:]).all()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q", [1, 17])
def test_no_keys(backend, seqlen_q, causal):
    """seqlen_k = 0: every row sees no key."""
    dtype = "f16" if backend.is_gpu else "f32"
    rng = np.random.default_rng(3300)
    q, k, v = make_qkv(rng, 2, seqlen_q, 0, 4, 2, 64, dtype)
    backend.require(q, k, v, causal=causal)
    out, lse = backend.forward(q, k, v, causal=causal)
    assert out.shape == q.shape and lse.shape == (2, 4, seqlen_q)
    assert (out == 0).all()
    assert np.isneginf(lse).all()


@pytest.mark.parametrize("shape", [(0, 5, 4, 64, 7, 2), (2, 0, 4, 64, 7, 2), (0, 0, 4, 64, 0, 2),
                                   (2, 0, 4, 64, 0, 2)],
                         ids=["batch0", "seqlen_q0", "all0", "seqlen_q0_k0"])
def test_empty_outputs(backend, shape):
    batch, seqlen_q, heads_q, head_dim, seqlen_k, heads_kv = shape
    dtype = "f16" if backend.is_gpu else "f32"
    rng = np.random.default_rng(3400)
    q, k, v = make_qkv(rng, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype)
    res = backend.forward_native(q, k, v, causal=True)
    out, lse = res
    assert tuple(out.shape) == q.shape
    assert tuple(lse.shape) == (batch, heads_q, seqlen_q)
    if isinstance(out, np.ndarray):
        assert out.dtype == np_dtype(dtype) and lse.dtype == np.float32
