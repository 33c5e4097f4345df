"""KV cache (issue 4): per-sequence key lengths (cache_seqlens), appending k_new/v_new
in place, causal alignment with each sequence's own length, and bad cache inputs
raising before anything is written."""
import re

import numpy as np
import pytest

import fmha_native
from fmha_native import reference
from _harness import as_f64, assert_close, bits, randn

CAPACITY = 300


def _cache_problem(rng, dtype, batch, seqlen_q, heads_q, heads_kv, head_dim, capacity=CAPACITY):
    q = randn(rng, (batch, seqlen_q, heads_q, head_dim), dtype)
    k = randn(rng, (batch, capacity, heads_kv, head_dim), dtype)
    v = randn(rng, (batch, capacity, heads_kv, head_dim), dtype)
    return q, k, v


def _lengths(capacity, seqlen_new=0):
    """Mixed lengths in one batch: empty, full, tiny, not a tile multiple."""
    return np.array([0, capacity - seqlen_new, 5, 131], dtype=np.int32)


def _dtype(backend):
    return "f16" if backend.is_gpu else "f32"


@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_cache_seqlens(backend, group, head_dim, causal, num_splits):
    dtype = _dtype(backend)
    rng = np.random.default_rng(10000 + group * 7 + head_dim)
    lens = _lengths(CAPACITY)
    q, k, v = _cache_problem(rng, dtype, 4, 1, 2 * group, 2, head_dim)
    kw = {"causal": causal, "num_splits": num_splits, "cache_seqlens": lens}
    backend.require(q, k, v, **kw)
    out, lse = backend.forward(q, k, v, **kw)
    ref_out, ref_lse = reference.forward(q, k, v, causal=causal, cache_seqlens=lens)
    assert_close(out, lse, ref_out, ref_lse, dtype)
    # Entry 0 has no key: out 0, lse -inf.
    assert (out[0] == 0).all() and np.isneginf(lse[0]).all()


@pytest.mark.parametrize("num_splits", [0, 1, 2])
def test_cache_seqlens_causal_multi_row(backend, num_splits):
    """seqlen_q > 1 with causal: row i sees key j iff j <= i + len_b - seqlen_q, so
    entries shorter than seqlen_q have empty leading rows."""
    dtype = _dtype(backend)
    rng = np.random.default_rng(10100)
    q, k, v = _cache_problem(rng, dtype, 4, 9, 8, 2, 64)
    lens = np.array([3, 9, 300, 70], dtype=np.int32)
    kw = {"causal": True, "num_splits": num_splits, "cache_seqlens": lens}
    backend.require(q, k, v, **kw)
    out, lse = backend.forward(q, k, v, **kw)
    ref_out, ref_lse = reference.forward(q, k, v, causal=True, cache_seqlens=lens)
    assert_close(out, lse, ref_out, ref_lse, dtype)
    assert (out[0, :6] == 0).all() and np.isneginf(lse[0, :, :6]).all()


def test_cache_seqlens_ignores_keys_past_length(backend):
    """Garbage (NaN) past each sequence's length must never be read."""
    dtype = _dtype(backend)
    rng = np.random.default_rng(10150)
    q, k, v = _cache_problem(rng, dtype, 4, 3, 4, 2, 64)
    lens = np.array([0, 1, 64, 200], dtype=np.int32)
    for b, n in enumerate(lens):
        k[b, n:] = np.nan
        v[b, n:] = np.nan
    kw = {"causal": True, "cache_seqlens": lens}
    backend.require(q, k, v, **kw)
    out, lse = backend.forward(q, k, v, **kw)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    k_clean = np.where(np.isnan(k.astype(np.float32)), 0, k.astype(np.float32))
    v_clean = np.where(np.isnan(v.astype(np.float32)), 0, v.astype(np.float32))
    ref_out, ref_lse = reference.forward(q, k_clean, v_clean, causal=True, cache_seqlens=lens)
    assert_close(out, lse, ref_out, ref_lse, dtype)


def _run_append(backend, q, k, v, lens, k_new, v_new, **kw):
    """Calls forward with the append, returns (out, lse, k after, v after, lens after)
    as host float64 (lens as int32)."""
    kd, vd, lens_d = backend.put(k), backend.put(v), backend.put(lens)
    res = fmha_native.forward(backend.put(q), kd, vd, cache_seqlens=lens_d, k_new=backend.put(k_new),
                              v_new=backend.put(v_new), **backend.device_kw(), **kw)
    out, lse = res
    lens_after = lens_d.cpu().numpy() if hasattr(lens_d, "cpu") else lens_d
    return as_f64(out), as_f64(lse), as_f64(kd), as_f64(vd), np.asarray(lens_after)


@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("seqlen_new", [1, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim,group", [(64, 1), (128, 4), (64, 8)])
def test_append(backend, head_dim, group, causal, seqlen_new, num_splits):
    dtype = _dtype(backend)
    rng = np.random.default_rng(10200 + seqlen_new + group)
    q, k, v = _cache_problem(rng, dtype, 4, seqlen_new, 2 * group, 2, head_dim)
    k_new = randn(rng, (4, seqlen_new, 2, head_dim), dtype)
    v_new = randn(rng, (4, seqlen_new, 2, head_dim), dtype)
    lens = _lengths(CAPACITY, seqlen_new)
    lens_before = lens.copy()
    backend.require(q, k, v, causal=causal, cache_seqlens=lens, k_new=k_new, v_new=v_new)
    new_bits = bits(k_new), bits(v_new)
    ref_out, ref_lse = reference.forward(q, k, v, causal=causal, cache_seqlens=lens,
                                         k_new=k_new, v_new=v_new)
    k_expected, v_expected = reference.append_kv(k, v, lens, k_new, v_new)
    out, lse, k_after, v_after, lens_after = _run_append(
        backend, q, k, v, lens, k_new, v_new, causal=causal, num_splits=num_splits)
    assert_close(out, lse, ref_out, ref_lse, dtype)
    # The whole cache equals the expected one: appended rows written, nothing else touched.
    assert np.array_equal(k_after, k_expected), "k cache differs from the expected append"
    assert np.array_equal(v_after, v_expected), "v cache differs from the expected append"
    assert np.array_equal(lens_after, lens_before), "cache_seqlens was modified"
    assert (bits(k_new), bits(v_new)) == new_bits


def test_append_decode_steps(backend):
    """Several decode steps in a row grow the cache like a generation loop does."""
    dtype = _dtype(backend)
    rng = np.random.default_rng(10300)
    q_all = randn(rng, (2, 6, 4, 64), dtype)
    k_new_all = randn(rng, (2, 6, 2, 64), dtype)
    v_new_all = randn(rng, (2, 6, 2, 64), dtype)
    k = randn(rng, (2, 64, 2, 64), dtype)
    v = randn(rng, (2, 64, 2, 64), dtype)
    if not backend.use_torch:
        lens = np.array([10, 57], dtype=np.int32)
        k_ref, v_ref = reference.to_float64(k), reference.to_float64(v)
        backend.require(q_all[:, :1], k, v, cache_seqlens=lens, k_new=k_new_all[:, :1],
                        v_new=v_new_all[:, :1])
        for step in range(6):
            sl = slice(step, step + 1)
            ref_out, ref_lse = reference.forward(q_all[:, sl], k_ref, v_ref, cache_seqlens=lens,
                                                 k_new=k_new_all[:, sl], v_new=v_new_all[:, sl],
                                                 causal=True)
            k_ref, v_ref = reference.append_kv(k_ref, v_ref, lens, k_new_all[:, sl], v_new_all[:, sl])
            out, lse = fmha_native.forward(q_all[:, sl], k, v, cache_seqlens=lens,
                                           k_new=k_new_all[:, sl], v_new=v_new_all[:, sl],
                                           causal=True, **backend.device_kw())
            assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype)
            lens = lens + 1
        assert np.array_equal(reference.to_float64(k), k_ref)
        assert np.array_equal(reference.to_float64(v), v_ref)
        return
    import torch
    kd, vd = backend.put(k), backend.put(v)
    lens = torch.tensor([10, 57], dtype=torch.int32, device="cuda")
    k_ref, v_ref = reference.to_float64(k), reference.to_float64(v)
    for step in range(6):
        sl = slice(step, step + 1)
        lens_h = lens.cpu().numpy()
        ref_out, ref_lse = reference.forward(q_all[:, sl], k_ref, v_ref, cache_seqlens=lens_h,
                                             k_new=k_new_all[:, sl], v_new=v_new_all[:, sl],
                                             causal=True)
        k_ref, v_ref = reference.append_kv(k_ref, v_ref, lens_h, k_new_all[:, sl], v_new_all[:, sl])
        out, lse = fmha_native.forward(backend.put(q_all[:, sl]), kd, vd, cache_seqlens=lens,
                                       k_new=backend.put(k_new_all[:, sl]),
                                       v_new=backend.put(v_new_all[:, sl]), causal=True)
        assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype)
        lens += 1
    assert np.array_equal(as_f64(kd), k_ref) and np.array_equal(as_f64(vd), v_ref)


def test_append_strided_cache(cpu):
    """A cache that is a strided view (unit head_dim stride) is appended in place; one
    with a non-unit head_dim stride is either appended in place too or refused."""
    rng = np.random.default_rng(10400)
    q = randn(rng, (2, 1, 4, 32))
    k_new = randn(rng, (2, 1, 2, 32))
    v_new = randn(rng, (2, 1, 2, 32))
    lens = np.array([3, 40], dtype=np.int32)
    k = randn(rng, (2, 2, 64, 32)).transpose(0, 2, 1, 3)
    v = randn(rng, (2, 64, 2, 64))[..., ::2]
    k0, v0 = k.copy(), v.copy()
    k_expected, v_expected = reference.append_kv(k0, v0, lens, k_new, v_new)
    try:
        out, lse = fmha_native.forward(q, k, v, cache_seqlens=lens, k_new=k_new, v_new=v_new,
                                       device="cpu")
    except ValueError as exc:
        assert re.search(r"\bv\b", str(exc)), str(exc)
        assert bits(k) == bits(k0) and bits(v) == bits(v0)
        return
    ref_out, ref_lse = reference.forward(q, k0, v0, cache_seqlens=lens, k_new=k_new, v_new=v_new)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f32")
    assert np.array_equal(reference.to_float64(k), k_expected)
    assert np.array_equal(reference.to_float64(v), v_expected), \
        "append went to a temporary copy of a strided v cache, not to the caller's array"


def test_explain_with_cache(backend):
    dtype = _dtype(backend)
    rng = np.random.default_rng(10500)
    q, k, v = _cache_problem(rng, dtype, 4, 1, 8, 2, 64)
    plan = fmha_native.explain(backend.put(q), backend.put(k), backend.put(v),
                               cache_seqlens=backend.put(_lengths(CAPACITY)), num_splits=3,
                               **backend.device_kw())
    assert plan["num_splits"] == 3


BAD_CASES = {
    # case: (exception, pattern naming the argument)
    "lens_int64": ((TypeError, ValueError), r"cache_seqlens"),
    "lens_float": (TypeError, r"cache_seqlens"),
    "lens_2d": (ValueError, r"cache_seqlens"),
    "lens_short": (ValueError, r"cache_seqlens"),
    "lens_negative": (ValueError, r"cache_seqlens"),
    "lens_beyond_capacity": (ValueError, r"cache_seqlens|capacity"),
    "append_overflow": (ValueError, r"cache_seqlens|capacity|k_new"),
    "k_new_without_v_new": (ValueError, r"v_new"),
    "v_new_without_k_new": (ValueError, r"k_new"),
    "k_new_without_lens": (ValueError, r"cache_seqlens"),
    "k_new_heads": (ValueError, r"k_new"),
    "k_new_head_dim": (ValueError, r"k_new"),
    "k_new_batch": (ValueError, r"k_new"),
    "v_new_seqlen": (ValueError, r"v_new|k_new"),
    "k_new_dtype": (TypeError, r"k_new|dtype"),
    "cache_read_only": (ValueError, r"\bk\b|read"),
    "lens_not_array": (TypeError, r"cache_seqlens"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_cache_inputs(case):
    exc, pattern = BAD_CASES[case]
    rng = np.random.default_rng(10600)
    q, k, v = _cache_problem(rng, "f32", 4, 2, 4, 2, 32, capacity=64)
    k_new = randn(rng, (4, 2, 2, 32))
    v_new = randn(rng, (4, 2, 2, 32))
    lens = np.array([0, 62, 5, 17], dtype=np.int32)
    kw = {"cache_seqlens": lens, "k_new": k_new, "v_new": v_new}
    if case == "lens_int64":
        kw["cache_seqlens"] = lens.astype(np.int64)
    elif case == "lens_float":
        kw["cache_seqlens"] = lens.astype(np.float32)
    elif case == "lens_2d":
        kw["cache_seqlens"] = lens[:, None]
    elif case == "lens_short":
        kw["cache_seqlens"] = lens[:3]
    elif case == "lens_negative":
        kw["cache_seqlens"] = np.array([0, 1, -1, 2], np.int32)
    elif case == "lens_beyond_capacity":
        kw = {"cache_seqlens": np.array([0, 65, 5, 17], np.int32)}
    elif case == "append_overflow":
        kw["cache_seqlens"] = np.array([0, 63, 5, 17], np.int32)
    elif case == "k_new_without_v_new":
        del kw["v_new"]
    elif case == "v_new_without_k_new":
        del kw["k_new"]
    elif case == "k_new_without_lens":
        del kw["cache_seqlens"]
    elif case == "k_new_heads":
        kw["k_new"] = randn(rng, (4, 2, 1, 32))
    elif case == "k_new_head_dim":
        kw["k_new"] = randn(rng, (4, 2, 2, 16))
    elif case == "k_new_batch":
        kw["k_new"] = randn(rng, (3, 2, 2, 32))
    elif case == "v_new_seqlen":
        kw["v_new"] = randn(rng, (4, 3, 2, 32))
    elif case == "k_new_dtype":
        kw["k_new"] = k_new.astype(np.float16)
    elif case == "cache_read_only":
        k.flags.writeable = False
    elif case == "lens_not_array":
        kw["cache_seqlens"] = object()
    out = np.full(q.shape, 42.0, np.float32)
    lse = np.full((4, 4, 2), 42.0, np.float32)
    before = [bits(x) for x in (q, k, v, k_new, v_new, lens)]
    with pytest.raises(exc, match=pattern):
        fmha_native.forward(q, k, v, out=out, lse=lse, device="cpu", **kw)
    assert [bits(x) for x in (q, k, v, k_new, v_new, lens)] == before, "an input was modified"
    assert (out == 42.0).all() and (lse == 42.0).all(), "out/lse written before the error"
