"""Packed (varlen) sequences (issue 20): cu_seqlens_q / cu_seqlens_k on every backend,
held to fmha_native.reference: ragged query and key lengths including 0 and 1, causal
alignment bottom-right per sequence with len_q != len_k, GQA, the [heads_q, total_q] lse
layout, mixed prefill / decode / verify batches appending packed k_new into a dense or a
paged cache, and bad metadata (a ValueError for host arrays; the NaN rule for device
arrays, on the GPU)."""
import numpy as np
import pytest

from fmha_native import reference
from _harness import (NO_GPU_REASON, assert_close, packed, paged_cache, randn, torch_cuda)

HEADS_KV = 2
HEAD_DIM = 64
# Query and key lengths per sequence: empty and one-row sequences on both sides, more
# queries than keys (leading rows see nothing under a causal mask), and the reverse.
LENS_Q = [0, 1, 17, 5, 64, 1, 3]
LENS_K = [3, 0, 17, 40, 1, 130, 0]


def _dtype(backend):
    return "f16" if backend.is_gpu else "f32"


def _same_cache(after, expected):
    return np.array_equal(after, expected, equal_nan=True)


@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_matches_reference(backend, causal, group, dtype, num_splits):
    backend.skip_unsupported(dtype)
    rng = np.random.default_rng(21000 + group)
    q, cu_q = packed(rng, LENS_Q, HEADS_KV * group, HEAD_DIM, dtype)
    k, cu_k = packed(rng, LENS_K, HEADS_KV, HEAD_DIM, dtype)
    v, _ = packed(rng, LENS_K, HEADS_KV, HEAD_DIM, dtype)
    kw = {"causal": causal, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}
    backend.require(q, k, v, num_splits=num_splits, **kw)
    out, lse = backend.forward(q, k, v, num_splits=num_splits, **kw)
    ref_out, ref_lse = reference.forward(q, k, v, **kw)
    assert lse.shape == (HEADS_KV * group, q.shape[0])
    assert_close(out, lse, ref_out, ref_lse, dtype)


def test_varlen_lse_layout(backend):
    """out rows and lse columns of sequence b sit at cu_seqlens_q[b] + i, and equal what
    the reference gives for that sequence alone as a dense batch of one."""
    dtype = _dtype(backend)
    rng = np.random.default_rng(21100)
    q, cu_q = packed(rng, LENS_Q, 8, HEAD_DIM, dtype)
    k, cu_k = packed(rng, LENS_K, HEADS_KV, HEAD_DIM, dtype)
    v, _ = packed(rng, LENS_K, HEADS_KV, HEAD_DIM, dtype)
    kw = {"causal": True, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}
    backend.require(q, k, v, **kw)
    out, lse = backend.forward(q, k, v, **kw)
    assert out.shape == q.shape and lse.shape == (8, q.shape[0])
    for b in range(len(LENS_Q)):
        rows = slice(cu_q[b], cu_q[b + 1])
        keys = slice(cu_k[b], cu_k[b + 1])
        ref_out, ref_lse = reference.forward(q[None, rows], k[None, keys], v[None, keys],
                                             causal=True)
        assert_close(out[None, rows], lse[None, :, rows], ref_out, ref_lse, dtype,
                     what=f"sequence {b}")


def test_varlen_max_seqlen_bounds(backend):
    """max_seqlen_q / max_seqlen_k at the longest lengths change nothing."""
    dtype = _dtype(backend)
    rng = np.random.default_rng(21200)
    q, cu_q = packed(rng, LENS_Q, 4, HEAD_DIM, dtype)
    k, cu_k = packed(rng, LENS_K, HEADS_KV, HEAD_DIM, dtype)
    v, _ = packed(rng, LENS_K, HEADS_KV, HEAD_DIM, dtype)
    kw = {"causal": True, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
          "max_seqlen_q": max(LENS_Q), "max_seqlen_k": max(LENS_K)}
    backend.require(q, k, v, **kw)
    out, lse = backend.forward(q, k, v, **kw)
    ref_out, ref_lse = reference.forward(q, k, v, **kw)
    assert_close(out, lse, ref_out, ref_lse, dtype)


def test_varlen_dense_kv(backend):
    """Packed queries over a dense [batch, seqlen_k, ...] k/v: every sequence has
    seqlen_k keys, causal aligned to its own query count."""
    dtype = _dtype(backend)
    rng = np.random.default_rng(21300)
    lens_q = [4, 0, 1, 30]
    q, cu_q = packed(rng, lens_q, 8, HEAD_DIM, dtype)
    k = randn(rng, (4, 30, HEADS_KV, HEAD_DIM), dtype)
    v = randn(rng, (4, 30, HEADS_KV, HEAD_DIM), dtype)
    for causal in (False, True):
        kw = {"causal": causal, "cu_seqlens_q": cu_q}
        backend.require(q, k, v, **kw)
        out, lse = backend.forward(q, k, v, **kw)
        ref_out, ref_lse = reference.forward(q, k, v, **kw)
        assert_close(out, lse, ref_out, ref_lse, dtype, what=f"causal={causal}")


# A serving step: chunked prefill from empty, two decodes (one filling the cache), a
# speculative verify of 4 tokens, and a sequence with no new tokens.
MIXED_LENS_Q = [20, 1, 1, 4, 0]


def _mixed_cached(capacity):
    return np.array([0, capacity - 1, 30, 50, 7], dtype=np.int32)


@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_mixed_batch_dense_cache(backend, causal, num_splits):
    dtype = _dtype(backend)
    rng = np.random.default_rng(21400)
    capacity = 96
    batch = len(MIXED_LENS_Q)
    lens = _mixed_cached(capacity)
    q, cu_q = packed(rng, MIXED_LENS_Q, 8, HEAD_DIM, dtype)
    k_new, _ = packed(rng, MIXED_LENS_Q, HEADS_KV, HEAD_DIM, dtype)
    v_new, _ = packed(rng, MIXED_LENS_Q, HEADS_KV, HEAD_DIM, dtype)
    k = randn(rng, (batch, capacity, HEADS_KV, HEAD_DIM), dtype)
    v = randn(rng, (batch, capacity, HEADS_KV, HEAD_DIM), dtype)
    kw = {"causal": causal, "cu_seqlens_q": cu_q, "cache_seqlens": lens, "k_new": k_new,
          "v_new": v_new}
    backend.require(q, k, v, **kw)
    ref_out, ref_lse = reference.forward(q, k, v, **kw)
    k_expected, v_expected = reference.append_kv(k, v, lens, k_new, v_new, cu_seqlens_q=cu_q)
    out, lse, k_after, v_after = backend.forward_append(q, k, v, num_splits=num_splits, **kw)
    assert_close(out, lse, ref_out, ref_lse, dtype)
    assert np.array_equal(k_after, k_expected), "k cache differs from the expected append"
    assert np.array_equal(v_after, v_expected), "v cache differs from the expected append"


@pytest.mark.parametrize("num_splits", [0, 2])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("page_size", [16, 64])
def test_varlen_mixed_batch_paged_cache(backend, page_size, causal, num_splits):
    dtype = _dtype(backend)
    rng = np.random.default_rng(21500 + page_size)
    blocks = 128 // page_size + 1
    capacity = blocks * page_size
    lens = _mixed_cached(capacity)
    new = np.array(MIXED_LENS_Q)
    k, v, table = paged_cache(rng, lens, page_size, blocks, HEADS_KV, HEAD_DIM, dtype,
                              reach=lens + new)
    q, cu_q = packed(rng, MIXED_LENS_Q, 8, HEAD_DIM, dtype)
    k_new, _ = packed(rng, MIXED_LENS_Q, HEADS_KV, HEAD_DIM, dtype)
    v_new, _ = packed(rng, MIXED_LENS_Q, HEADS_KV, HEAD_DIM, dtype)
    kw = {"causal": causal, "cu_seqlens_q": cu_q, "cache_seqlens": lens, "block_table": table,
          "k_new": k_new, "v_new": v_new}
    backend.require(q, k, v, **kw)
    ref_out, ref_lse = reference.forward(q, k, v, **kw)
    k_expected, v_expected = reference.append_kv(k, v, lens, k_new, v_new, block_table=table,
                                                 cu_seqlens_q=cu_q)
    out, lse, k_after, v_after = backend.forward_append(q, k, v, num_splits=num_splits, **kw)
    assert_close(out, lse, ref_out, ref_lse, dtype)
    assert _same_cache(k_after, k_expected), "k pages differ from the expected append"
    assert _same_cache(v_after, v_expected), "v pages differ from the expected append"


@pytest.mark.parametrize("bad", ["decreasing", "short_end", "negative_start"])
def test_varlen_host_cu_seqlens_refused(cpu, bad):
    """Host cu_seqlens that break the layout are refused, naming the argument."""
    rng = np.random.default_rng(21600)
    q, cu_q = packed(rng, [3, 4, 5], 4, HEAD_DIM)
    k, cu_k = packed(rng, [6, 7, 8], HEADS_KV, HEAD_DIM)
    v, _ = packed(rng, [6, 7, 8], HEADS_KV, HEAD_DIM)
    broken = cu_k.copy()
    if bad == "decreasing":
        broken[2] = broken[1] - 1
    elif bad == "short_end":
        broken[-1] -= 1
    else:
        broken[0] = -1
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        cpu.forward(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=broken)


@pytest.mark.gpu
def test_varlen_device_cu_seqlens_k_out_of_range_gives_nan_rows(gpu_backend):
    """Device cu_seqlens_k past total_k are clamped, never read outside k/v: the rows of
    the offending sequence come out NaN and the others are unaffected."""
    if not torch_cuda():
        pytest.skip("device cu_seqlens need torch CUDA tensors; " + NO_GPU_REASON)
    rng = np.random.default_rng(21700)
    lens_q, lens_k = [5, 3, 8], [9, 40, 12]
    q, cu_q = packed(rng, lens_q, 8, HEAD_DIM, "f16")
    k, cu_k = packed(rng, lens_k, HEADS_KV, HEAD_DIM, "f16")
    v, _ = packed(rng, lens_k, HEADS_KV, HEAD_DIM, "f16")
    ref_out, ref_lse = reference.forward(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    bad = cu_k.copy()
    bad[-1] = 10 ** 6  # sequence 2 would read far past k
    out, lse = gpu_backend.forward(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=bad)
    last = slice(cu_q[2], cu_q[3])
    assert np.isnan(out[last]).all() and np.isnan(lse[:, last]).all()
    keep = slice(0, cu_q[2])
    assert_close(out[keep], lse[:, keep], ref_out[keep], ref_lse[:, keep], "f16")
