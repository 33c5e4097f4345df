"""The oracle itself: fmha_native.reference checked against a scalar loop written from the
definition and against PyTorch's float64 attention, so a wrong oracle cannot pass
wrong kernels."""
import math

import numpy as np
import pytest

from fmha_native import reference
from _harness import make_qkv


def _loop_attention(q, k, v, causal, scale, lengths=None):
    """Row by row, key by key, from the definition (slow; tiny sizes only)."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    out = np.zeros(q.shape)
    lse = np.full((batch, heads_q, seqlen_q), -np.inf)
    for b in range(batch):
        n = seqlen_k if lengths is None else int(lengths[b])
        for h in range(heads_q):
            kh = h // (heads_q // heads_kv)
            for i in range(seqlen_q):
                keys = [j for j in range(n) if not causal or j <= i + n - seqlen_q]
                if not keys:
                    continue
                s = [scale * sum(float(q[b, i, h, d]) * float(k[b, j, kh, d]) for d in range(head_dim))
                     for j in keys]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                total = sum(w)
                lse[b, h, i] = m + math.log(total)
                for d in range(head_dim):
                    out[b, i, h, d] = sum(wj * float(v[b, j, kh, d]) for wj, j in zip(w, keys)) / total
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 1), (3, 5), (5, 3), (4, 4), (2, 0)])
@pytest.mark.parametrize("heads_q,heads_kv", [(2, 2), (4, 2), (3, 1)])
def test_reference_matches_loop(seqlen_q, seqlen_k, heads_q, heads_kv, causal):
    rng = np.random.default_rng(12000)
    q, k, v = make_qkv(rng, 2, seqlen_q, seqlen_k, heads_q, heads_kv, 4, "f32")
    out, lse = reference.forward(q, k, v, causal=causal, softmax_scale=0.7)
    want_out, want_lse = _loop_attention(q, k, v, causal, 0.7)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[fin], want_lse[fin], rtol=1e-12)


def test_reference_cache_matches_loop():
    rng = np.random.default_rng(12050)
    q, k, v = make_qkv(rng, 3, 3, 9, 4, 2, 4, "f32")
    lengths = np.array([0, 2, 9], np.int32)
    for causal in (False, True):
        out, lse = reference.forward(q, k, v, causal=causal, cache_seqlens=lengths)
        want_out, want_lse = _loop_attention(q, k, v, causal, 0.5, lengths)
        np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(7, 7), (5, 19), (19, 5), (1, 33)])
def test_reference_matches_torch_float64(seqlen_q, seqlen_k, causal):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(12100)
    q, k, v = make_qkv(rng, 2, seqlen_q, seqlen_k, 8, 2, 16, "f32")
    out, lse = reference.forward(q, k, v, causal=causal)
    qt, kt, vt = (torch.from_numpy(x.astype(np.float64)).transpose(1, 2) for x in (q, k, v))
    kt, vt = kt.repeat_interleave(4, dim=1), vt.repeat_interleave(4, dim=1)
    scores = qt @ kt.transpose(-1, -2) / math.sqrt(16)
    if causal:
        i = torch.arange(seqlen_q)[:, None]
        j = torch.arange(seqlen_k)[None, :]
        scores = scores.masked_fill(j > i + seqlen_k - seqlen_q, -math.inf)
    want_lse = torch.logsumexp(scores, dim=-1).numpy()
    want_out = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0) @ vt
    np.testing.assert_allclose(out, want_out.transpose(1, 2).numpy(), atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[fin], want_lse[fin], rtol=1e-12)


def test_reference_chunking_is_invisible(monkeypatch):
    rng = np.random.default_rng(12200)
    q, k, v = make_qkv(rng, 1, 50, 70, 2, 1, 8, "f32")
    whole = reference.forward(q, k, v, causal=True)
    monkeypatch.setattr(reference, "_MAX_CHUNK_ELEMENTS", 150)
    chunked = reference.forward(q, k, v, causal=True)
    np.testing.assert_allclose(chunked[0], whole[0], rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(chunked[1], whole[1], rtol=1e-14)


def test_reference_combine_of_shards():
    rng = np.random.default_rng(12300)
    q, k, v = make_qkv(rng, 2, 6, 40, 4, 2, 8, "f32")
    cuts = [0, 0, 13, 40, 40]
    parts = [reference.forward(q, k[:, a:b], v[:, a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    out, lse = reference.combine(np.stack([p[0] for p in parts]), np.stack([p[1] for p in parts]))
    want_out, want_lse = reference.forward(q, k, v)
    np.testing.assert_allclose(out, want_out, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12)


def test_reference_combine_empty():
    outs = np.full((2, 1, 2, 1, 3), 1e6)
    lses = np.full((2, 1, 1, 2), -np.inf)
    lses[1, 0, 0, 1] = 0.5
    out, lse = reference.combine(outs, lses)
    assert (out[0, 0] == 0).all() and np.isneginf(lse[0, 0, 0])
    assert (out[0, 1] == 1e6).all() and lse[0, 0, 1] == 0.5


def test_reference_empty_rows_and_nan():
    rng = np.random.default_rng(12400)
    q, k, v = make_qkv(rng, 1, 6, 3, 2, 1, 4, "f32")
    q[0, 5, 1, 0] = np.nan
    out, lse = reference.forward(q, k, v, causal=True)
    assert (out[0, :3] == 0).all() and np.isneginf(lse[0, :, :3]).all()
    assert np.isnan(out[0, 5, 1]).all() and np.isnan(lse[0, 1, 5])
    assert np.isnan(out).sum() == 4 and np.isnan(lse).sum() == 1


def test_reference_append_kv():
    rng = np.random.default_rng(12500)
    k = rng.standard_normal((2, 10, 1, 3))
    v = rng.standard_normal((2, 10, 1, 3))
    k_new = rng.standard_normal((2, 2, 1, 3))
    v_new = rng.standard_normal((2, 2, 1, 3))
    lens = np.array([0, 8], np.int32)
    k2, v2 = reference.append_kv(k, v, lens, k_new, v_new)
    assert np.array_equal(k2[0, :2], k_new[0]) and np.array_equal(k2[0, 2:], k[0, 2:])
    assert np.array_equal(v2[1, 8:], v_new[1]) and np.array_equal(v2[1, :8], v[1, :8])
    with pytest.raises(ValueError):
        reference.append_kv(k, v, np.array([0, 9], np.int32), k_new, v_new)
    out_ref = reference.forward(k_new[:, :1].repeat(2, axis=2), k, v, cache_seqlens=lens,
                                k_new=k_new, v_new=v_new, return_lse=False)
    out_direct = reference.forward(k_new[:, :1].repeat(2, axis=2), k2, v2,
                                   cache_seqlens=lens + 2, return_lse=False)
    np.testing.assert_array_equal(out_ref, out_direct)


def test_reference_accepts_torch_and_bf16():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(12600)
    q, k, v = make_qkv(rng, 1, 3, 5, 2, 1, 8, "bf16")
    from_np = reference.forward(q, k, v)
    tq, tk, tv = (torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16) for x in (q, k, v))
    from_torch = reference.forward(tq, tk, tv)
    np.testing.assert_array_equal(from_np[0], from_torch[0])
    assert from_np[0].dtype == np.float64


def _scatter_pages(rng, k, page_size):
    """A dense [batch, capacity, ...] cache as shuffled pages plus its block table."""
    batch, capacity = k.shape[:2]
    blocks = capacity // page_size
    order = rng.permutation(batch * blocks + 2)
    table = order[:batch * blocks].reshape(batch, blocks).astype(np.int32)
    pages = np.full((batch * blocks + 2, page_size) + k.shape[2:], np.nan)
    for b in range(batch):
        for j in range(blocks):
            pages[table[b, j]] = k[b, j * page_size:(j + 1) * page_size]
    return pages, table


@pytest.mark.parametrize("causal", [False, True])
def test_reference_paged_equals_dense(causal):
    """A paged cache is the dense cache it scatters: same results, same appends."""
    rng = np.random.default_rng(12700)
    q, k, v = make_qkv(rng, 3, 2, 64, 4, 2, 8, "f32")
    lens = np.array([0, 62, 17], np.int32)
    k_new = rng.standard_normal((3, 2, 2, 8))
    v_new = rng.standard_normal((3, 2, 2, 8))
    kp, table = _scatter_pages(np.random.default_rng(1), k, 16)
    vp, _ = _scatter_pages(np.random.default_rng(1), v, 16)
    kw = {"causal": causal, "cache_seqlens": lens, "k_new": k_new, "v_new": v_new}
    dense = reference.forward(q, k, v, **kw)
    paged = reference.forward(q, kp, vp, block_table=table, **kw)
    np.testing.assert_array_equal(dense[0], paged[0])
    np.testing.assert_array_equal(dense[1], paged[1])
    k_dense, _ = reference.append_kv(k, v, lens, k_new, v_new)
    kp_before = kp.copy()
    k_paged, _ = reference.append_kv(kp, vp, lens, k_new, v_new, block_table=table)
    np.testing.assert_array_equal(kp, kp_before)  # the caller's pages are not modified
    for b in range(3):
        np.testing.assert_array_equal(k_paged[table[b]].reshape(k.shape[1:]), k_dense[b])
    # Spare pages (never in the table) stay as they were: NaN.
    assert np.isnan(k_paged[np.setdiff1d(np.arange(kp.shape[0]), table)]).all()


@pytest.mark.parametrize("causal", [False, True])
def test_reference_varlen_matches_loop(causal):
    """Packed sequences: each one is the definition applied to its own rows and keys,
    causal bottom-right with its own len_q and len_k."""
    rng = np.random.default_rng(12800)
    lens_q, lens_k = [0, 1, 4, 6, 2], [3, 0, 2, 6, 5]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], 4, 4))
    k = rng.standard_normal((cu_k[-1], 2, 4))
    v = rng.standard_normal((cu_k[-1], 2, 4))
    out, lse = reference.forward(q, k, v, causal=causal, softmax_scale=0.6,
                                 cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert out.shape == q.shape and lse.shape == (4, cu_q[-1])
    for b in range(len(lens_q)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        want_out, want_lse = _loop_attention(q[None, rows], k[None, keys], v[None, keys],
                                             causal, 0.6)
        np.testing.assert_allclose(out[rows], want_out[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(lse[:, rows]), np.isneginf(want_lse[0]))
        fin = np.isfinite(want_lse[0])
        np.testing.assert_allclose(lse[:, rows][fin], want_lse[0][fin], rtol=1e-12)


def test_reference_packed_append_follows_cu_seqlens_q():
    """Packed k_new: sequence b appends its len_q(b) rows; a dense cache of that shape
    then gives the same result with the longer cache_seqlens."""
    rng = np.random.default_rng(12900)
    lens_q = [3, 1, 0]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    q = rng.standard_normal((4, 4, 8))
    k_new = rng.standard_normal((4, 2, 8))
    v_new = rng.standard_normal((4, 2, 8))
    k = rng.standard_normal((3, 10, 2, 8))
    v = rng.standard_normal((3, 10, 2, 8))
    lens = np.array([2, 9, 10], np.int32)
    k2, v2 = reference.append_kv(k, v, lens, k_new, v_new, cu_seqlens_q=cu_q)
    np.testing.assert_array_equal(k2[0, 2:5], k_new[0:3])
    np.testing.assert_array_equal(k2[1, 9], k_new[3])
    np.testing.assert_array_equal(k2[2], k[2])
    np.testing.assert_array_equal(k2[0, 5:], k[0, 5:])
    kw = {"causal": True, "cu_seqlens_q": cu_q}
    appended = reference.forward(q, k, v, cache_seqlens=lens, k_new=k_new, v_new=v_new, **kw)
    direct = reference.forward(q, k2, v2, cache_seqlens=lens + np.array(lens_q, np.int32), **kw)
    np.testing.assert_array_equal(appended[0], direct[0])
    np.testing.assert_array_equal(appended[1], direct[1])
    with pytest.raises(ValueError):  # sequence 1 would end past the capacity
        reference.append_kv(k, v, np.array([2, 10, 0], np.int32), k_new, v_new,
                            cu_seqlens_q=cu_q)


def test_reference_rejects_bad_metadata():
    rng = np.random.default_rng(13000)
    q = rng.standard_normal((5, 2, 4))
    k = rng.standard_normal((7, 2, 4))
    cu_q = np.array([0, 2, 5], np.int32)
    cu_k = np.array([0, 3, 7], np.int32)
    for bad in ([1, 2, 5], [0, 3, 2], [0, 2, 4]):
        with pytest.raises(ValueError, match="cu_seqlens_q"):
            reference.forward(q, k, k, cu_seqlens_q=np.array(bad), cu_seqlens_k=cu_k)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        reference.forward(q, k, k, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=2)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        reference.forward(q, k, k, cu_seqlens_k=cu_k)
    pages = rng.standard_normal((3, 16, 2, 4))
    qd = rng.standard_normal((1, 1, 2, 4))
    table = np.array([[2, 3]], np.int32)  # entry 1 holds keys 16..31
    reference.forward(qd, pages, pages, block_table=table, cache_seqlens=np.array([16]))
    with pytest.raises(ValueError, match="block_table"):
        reference.forward(qd, pages, pages, block_table=table, cache_seqlens=np.array([17]))
