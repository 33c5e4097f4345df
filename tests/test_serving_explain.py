"""explain() of paged and packed calls (issue 20) on the CPU: the serving fields of the
dict (page geometry, packed totals, the longest sequences and where they came from), the
sentences the reason gains, and the NumPy outputs forward allocates for packed calls,
including empty batches."""
import numpy as np
import pytest

import fmha_native

HEADS_Q, HEADS_KV, HEAD_DIM = 4, 2, 16


def _zeros(*shape):
    return np.zeros(shape, np.float32)


def _explain(q, k, v, **kw):
    return fmha_native.explain(q, k, v, device="cpu", **kw)


def test_dense_calls_say_neither():
    d = _explain(_zeros(2, 3, HEADS_Q, HEAD_DIM), _zeros(2, 5, HEADS_KV, HEAD_DIM),
                 _zeros(2, 5, HEADS_KV, HEAD_DIM))
    assert d["paged"] is False and d["varlen"] is False
    for key in ("page_size", "num_pages", "total_q", "max_seqlen_q", "total_k"):
        assert key not in d
    assert "packed" not in d["reason"] and "paged" not in d["reason"]


def test_packed_queries_computed_from_host_cu_seqlens():
    cu = np.array([0, 3, 3, 10], np.int32)          # lengths 3, 0, 7
    d = _explain(_zeros(10, HEADS_Q, HEAD_DIM), _zeros(3, 20, HEADS_KV, HEAD_DIM),
                 _zeros(3, 20, HEADS_KV, HEAD_DIM), cu_seqlens_q=cu)
    assert d["varlen"] is True and d["packed_kv"] is False
    assert (d["batch"], d["total_q"], d["max_seqlen_q"]) == (3, 10, 7)
    assert d["max_seqlen_q_source"] == "computed"
    assert d["seqlen_q"] == 7 and d["seqlen_k"] == 20
    assert "packed queries: 10 rows, the longest 7 (computed from cu_seqlens_q)" in d["reason"]


def test_packed_queries_given_max_seqlen_q():
    cu = np.array([0, 3, 3, 10], np.int32)
    d = _explain(_zeros(10, HEADS_Q, HEAD_DIM), _zeros(3, 20, HEADS_KV, HEAD_DIM),
                 _zeros(3, 20, HEADS_KV, HEAD_DIM), cu_seqlens_q=cu, max_seqlen_q=9)
    assert d["max_seqlen_q_source"] == "given"
    assert d["max_seqlen_q"] == 9 and d["seqlen_q"] == 9
    assert "the longest 9 (max_seqlen_q)" in d["reason"]


def test_packed_keys():
    cu_q = np.array([0, 1, 5], np.int32)
    cu_k = np.array([0, 40, 52], np.int32)           # key lengths 40, 12
    q, k = _zeros(5, HEADS_Q, HEAD_DIM), _zeros(52, HEADS_KV, HEAD_DIM)
    d = _explain(q, k, k, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    assert d["varlen"] is True and d["packed_kv"] is True
    assert (d["total_q"], d["max_seqlen_q"], d["total_k"], d["max_seqlen_k"]) == (5, 4, 52, 40)
    assert d["max_seqlen_k_source"] == "computed" and d["seqlen_k"] == 40
    assert d["kv_cache"] is False and d["length_independent"] is False
    assert "packed keys: 52 rows, the longest 40 (computed from cu_seqlens_k)" in d["reason"]
    given = _explain(q, k, k, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_k=50)
    assert given["max_seqlen_k_source"] == "given" and given["seqlen_k"] == 50


def test_paged_cache():
    table = np.array([[4, 1, -1], [0, 6, 5]], np.int32)
    k = _zeros(7, 16, HEADS_KV, HEAD_DIM)
    d = _explain(_zeros(2, 1, HEADS_Q, HEAD_DIM), k, k, block_table=table,
                 cache_seqlens=np.array([20, 33], np.int32))
    assert d["paged"] is True and d["varlen"] is False
    assert (d["page_size"], d["num_pages"], d["max_blocks_per_seq"]) == (16, 7, 3)
    assert d["kv_cache"] is True and d["seqlen_k"] == 48   # the capacity, 3 pages of 16
    assert ("paged KV cache: 7 pages of 16 keys, up to 3 per sequence (capacity 48 keys)"
            in d["reason"])


def test_paged_without_cache_seqlens_fills_every_row():
    table = np.array([[3, 1], [0, 2]], np.int32)
    k = _zeros(4, 32, HEADS_KV, HEAD_DIM)
    d = _explain(_zeros(2, 5, HEADS_Q, HEAD_DIM), k, k, block_table=table)
    assert d["paged"] is True and d["kv_cache"] is False
    assert d["seqlen_k"] == 64 and d["length_independent"] is False


def test_packed_append_into_paged_cache():
    """Chunked prefill, decode and verify in one call: sequence lengths 6, 1, 3 appended
    through the table; the reason names both modes."""
    cu = np.array([0, 6, 7, 10], np.int32)
    table = np.array([[0, 1], [2, 3], [4, 5]], np.int32)
    k = _zeros(6, 16, HEADS_KV, HEAD_DIM)
    new = _zeros(10, HEADS_KV, HEAD_DIM)
    d = _explain(_zeros(10, HEADS_Q, HEAD_DIM), k, k.copy(), cu_seqlens_q=cu, block_table=table,
                 cache_seqlens=np.array([0, 20, 9], np.int32), k_new=new, v_new=new.copy())
    assert d["paged"] is True and d["varlen"] is True
    assert d["max_seqlen_q"] == 6 and d["seqlen_new"] == 6
    assert "paged KV cache" in d["reason"] and "packed queries: 10 rows" in d["reason"]


@pytest.mark.parametrize("lens", [[], [0, 0]], ids=["batch0", "total_q0"])
def test_empty_packed_calls_run_nothing(lens):
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    q = _zeros(0, HEADS_Q, HEAD_DIM)
    k = _zeros(len(lens), 8, HEADS_KV, HEAD_DIM)
    d = _explain(q, k, k, cu_seqlens_q=cu)
    assert d["kernel"] == "none" and "total_q is 0" in d["reason"]
    out, lse = fmha_native.forward(q, k, k, cu_seqlens_q=cu, device="cpu")
    assert out.shape == (0, HEADS_Q, HEAD_DIM) and lse.shape == (HEADS_Q, 0)


def test_packed_numpy_outputs_are_allocated_packed():
    rng = np.random.default_rng(4)
    cu = np.array([0, 2, 7], np.int32)
    q = rng.standard_normal((7, HEADS_Q, HEAD_DIM)).astype(np.float32)
    k = rng.standard_normal((2, 9, HEADS_KV, HEAD_DIM)).astype(np.float32)
    out, lse = fmha_native.forward(q, k, k, cu_seqlens_q=cu, device="cpu")
    assert out.shape == (7, HEADS_Q, HEAD_DIM) and out.dtype == np.float32
    assert lse.shape == (HEADS_Q, 7) and lse.dtype == np.float32
    # the packed rows of sequence 1 are the dense call of that sequence alone
    dense_out, dense_lse = fmha_native.forward(q[None, 2:7], k[1:2], k[1:2], device="cpu")
    np.testing.assert_allclose(out[2:7], dense_out[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lse[:, 2:7], dense_lse[0], rtol=1e-6, atol=1e-6)
