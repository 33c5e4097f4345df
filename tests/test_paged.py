"""Paged KV cache (issue 20): block_table over [num_pages, page_size, heads_kv, head_dim]
caches, on every backend, held to fmha_native.reference: page sizes 16/64/256, shuffled
pages, NaN in every slot no sequence holds, ragged lengths from 0 to the capacity, GQA,
forced splits, the append through the table, and out-of-range entries (a ValueError for
host arrays; the NaN rule for device arrays, on the GPU)."""
import numpy as np
import pytest

import fmha_native
from fmha_native import reference
from _harness import (NO_GPU_REASON, OUT_RTOL, assert_close, paged_cache, randn,
                      rel_fro, torch_cuda)

HEADS_KV = 2
HEAD_DIM = 64
# Blocks per sequence for each page size: capacities of 512 keys.
MAX_BLOCKS = {16: 32, 64: 8, 256: 2}


def _dtype(backend):
    return "f16" if backend.is_gpu else "f32"


def _lengths(capacity):
    """Empty, full, shorter than a page, and ending inside a page."""
    return np.array([0, capacity, 13, capacity // 2 + 37], dtype=np.int32)


def _same_cache(after, expected):
    """Whole-cache equality, NaN slots included (they must stay untouched)."""
    return np.array_equal(after, expected, equal_nan=True)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_paged_matches_reference(backend, page_size, causal, group, dtype):
    backend.skip_unsupported(dtype)
    rng = np.random.default_rng(20000 + page_size + group)
    capacity = page_size * MAX_BLOCKS[page_size]
    lens = _lengths(capacity)
    k, v, table = paged_cache(rng, lens, page_size, MAX_BLOCKS[page_size], HEADS_KV, HEAD_DIM,
                              dtype)
    q = randn(rng, (len(lens), 3, HEADS_KV * group, HEAD_DIM), dtype)
    kw = {"causal": causal, "cache_seqlens": lens, "block_table": table}
    backend.require(q, k, v, **kw)
    out, lse = backend.forward(q, k, v, **kw)
    ref_out, ref_lse = reference.forward(q, k, v, **kw)
    assert not np.isnan(ref_out).any()
    assert_close(out, lse, ref_out, ref_lse, dtype)
    # Sequence 0 holds no key: out 0, lse -inf.
    assert (out[0] == 0).all() and np.isneginf(lse[0]).all()


@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_paged_full_capacity_without_cache_seqlens(backend, page_size):
    """No cache_seqlens: every sequence attends to its whole table."""
    dtype = _dtype(backend)
    rng = np.random.default_rng(20100 + page_size)
    blocks = MAX_BLOCKS[page_size] // 2
    lens = np.full(3, page_size * blocks)
    k, v, table = paged_cache(rng, lens, page_size, blocks, HEADS_KV, HEAD_DIM, dtype)
    q = randn(rng, (3, 5, 4, HEAD_DIM), dtype)
    for causal in (False, True):
        kw = {"causal": causal, "block_table": table}
        backend.require(q, k, v, **kw)
        out, lse = backend.forward(q, k, v, **kw)
        ref_out, ref_lse = reference.forward(q, k, v, **kw)
        assert_close(out, lse, ref_out, ref_lse, dtype, what=f"causal={causal}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_paged_forced_splits_agree(backend, causal):
    """num_splits 1, 2 and 7 each match the reference and so each other."""
    dtype = _dtype(backend)
    rng = np.random.default_rng(20200)
    lens = np.array([512, 1, 300, 77], dtype=np.int32)
    k, v, table = paged_cache(rng, lens, 16, 32, HEADS_KV, HEAD_DIM, dtype)
    q = randn(rng, (4, 2, 8, HEAD_DIM), dtype)
    kw = {"causal": causal, "cache_seqlens": lens, "block_table": table}
    ref_out, ref_lse = reference.forward(q, k, v, **kw)
    outs = []
    for splits in (1, 2, 7):
        backend.require(q, k, v, num_splits=splits, **kw)
        out, lse = backend.forward(q, k, v, num_splits=splits, **kw)
        assert_close(out, lse, ref_out, ref_lse, dtype, what=f"num_splits={splits}")
        outs.append(out)
    for other in outs[1:]:
        assert rel_fro(other, outs[0]) <= 2 * OUT_RTOL[dtype]


@pytest.mark.parametrize("num_splits", [0, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_new", [1, 5])
@pytest.mark.parametrize("page_size", [16, 64])
def test_paged_append(backend, page_size, seqlen_new, causal, num_splits):
    """k_new/v_new land at cache_seqlens[b] + t through the table (crossing pages), the
    rest of the cache is untouched (its NaN slots included), and attention covers them."""
    dtype = _dtype(backend)
    rng = np.random.default_rng(20300 + page_size + seqlen_new)
    blocks = 4
    capacity = page_size * blocks
    lens = np.array([0, capacity - seqlen_new, page_size - 1, 2 * page_size], dtype=np.int32)
    k, v, table = paged_cache(rng, lens, page_size, blocks, HEADS_KV, HEAD_DIM, dtype,
                              reach=lens + seqlen_new)
    q = randn(rng, (4, seqlen_new, 8, HEAD_DIM), dtype)
    k_new = randn(rng, (4, seqlen_new, HEADS_KV, HEAD_DIM), dtype)
    v_new = randn(rng, (4, seqlen_new, HEADS_KV, HEAD_DIM), dtype)
    kw = {"causal": causal, "cache_seqlens": lens, "block_table": table, "k_new": k_new,
          "v_new": v_new}
    backend.require(q, k, v, **kw)
    ref_out, ref_lse = reference.forward(q, k, v, **kw)
    k_expected, v_expected = reference.append_kv(k, v, lens, k_new, v_new, block_table=table)
    lens_before, table_before = lens.copy(), table.copy()
    out, lse, k_after, v_after = backend.forward_append(q, k, v, num_splits=num_splits, **kw)
    assert_close(out, lse, ref_out, ref_lse, dtype)
    assert _same_cache(k_after, k_expected), "k pages differ from the expected append"
    assert _same_cache(v_after, v_expected), "v pages differ from the expected append"
    assert np.array_equal(lens, lens_before) and np.array_equal(table, table_before)


def test_paged_host_entry_out_of_range_is_value_error(cpu):
    """A host block_table entry within a sequence's length that names no page is
    refused before anything runs; entries past the length are never looked at."""
    rng = np.random.default_rng(20400)
    lens = np.array([40, 10], dtype=np.int32)
    k, v, table = paged_cache(rng, lens, 16, 4, HEADS_KV, HEAD_DIM)
    q = randn(rng, (2, 1, 4, HEAD_DIM))
    table[1, 2:] = 10 ** 6  # past sequence 1's single page: fine
    out, _ = cpu.forward(q, k, v, cache_seqlens=lens, block_table=table)
    ref_out, _ = reference.forward(q, k, v, cache_seqlens=lens, block_table=table)
    assert rel_fro(out, ref_out) <= OUT_RTOL["f32"]
    for bad in (k.shape[0], -1):
        table[0, 2] = bad  # holds keys 32..39 of sequence 0
        with pytest.raises(ValueError, match="block_table"):
            cpu.forward(q, k, v, cache_seqlens=lens, block_table=table)


@pytest.mark.gpu
def test_paged_device_entry_out_of_range_gives_nan_rows(gpu_backend):
    """Device metadata is not read on the host: an out-of-range page makes the rows that
    would see its keys NaN (out and lse), never a read outside k/v; the other sequences
    are unaffected."""
    if not torch_cuda():
        pytest.skip("device block tables need torch CUDA tensors; " + NO_GPU_REASON)
    rng = np.random.default_rng(20500)
    lens = np.array([100, 70, 33], dtype=np.int32)
    k, v, table = paged_cache(rng, lens, 16, 8, HEADS_KV, HEAD_DIM, "f16")
    q = randn(rng, (3, 1, 8, HEAD_DIM), "f16")
    ref_out, ref_lse = reference.forward(q, k, v, cache_seqlens=lens, block_table=table)
    bad = table.copy()
    bad[1, 3] = k.shape[0] + 5  # keys 48..63 of sequence 1
    kw = {"cache_seqlens": lens, "block_table": bad}
    out, lse = gpu_backend.forward(q, k, v, **kw)
    assert np.isnan(out[1]).all() and np.isnan(lse[1]).all()
    keep = [0, 2]
    assert_close(out[keep], lse[keep], ref_out[keep], ref_lse[keep], "f16")
    # The same table as a host array is refused.
    with pytest.raises(ValueError, match="block_table"):
        fmha_native.forward(q, k, v, cache_seqlens=lens, block_table=bad, device="gpu")
