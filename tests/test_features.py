"""Model features (issue 21) on the CPU backend: sliding windows, logit softcapping and
attention sinks, alone and together, in every mode the CPU runs (dense, KV cache with
append, paged, packed, splits), combine with sinks, the head dims 1..512, bad input, and
what explain() says.  Expected values come from fmha_native.reference only, which is
itself checked here against a per-element loop.  The GPU plan for the features (the
tensor-core tiles run them, block skipping in the split rule) is checked on CPU CI
through the planner hook _plan_for_device; the GPU kernels themselves are tested in
test_gpu_features.py."""
import math

import numpy as np
import pytest

import _fmha_native
import fmha_native
from fmha_native import reference
from _harness import (as_f64, assert_close, make_qkv, packed,
                      paged_cache, randn)

FEATURE_KEYWORDS = ("window", "softcap", "sinks")


def _ref_kw(kw):
    """The keywords the reference takes with forward's meaning."""
    names = FEATURE_KEYWORDS + ("causal", "softmax_scale", "cache_seqlens", "k_new", "v_new",
                                "block_table", "cu_seqlens_q", "cu_seqlens_k")
    return {key: kw[key] for key in names if key in kw}


def _check(q, k, v, dtype="f32", **kw):
    """forward on the CPU against the reference; returns the float64 (out, lse)."""
    ref_out, ref_lse = reference.forward(q, k, v, **_ref_kw(kw))
    out, lse = fmha_native.forward(q, k, v, device="cpu", **kw)
    out, lse = as_f64(out), as_f64(lse)
    assert_close(out, lse, ref_out, ref_lse, dtype, what=str({n: kw.get(n) for n in
                                                               ("window", "softcap", "causal")}))
    return out, lse


def _sinks(rng, heads, scale=1.0):
    return (rng.standard_normal(heads) * scale).astype(np.float32)


# --------------------------------------------------------------- the oracle itself

def _brute_force(q, k, v, causal, window, softcap, sinks, scale):
    """One per-element loop over (batch, head, row, key), for small problems only."""
    batch, seqlen_q, heads_q, dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0
    out = np.zeros(q.shape)
    lse = np.full((batch, heads_q, seqlen_q), -math.inf)
    for b in range(batch):
        for h in range(heads_q):
            kh = h // (heads_q // heads_kv)
            for i in range(seqlen_q):
                pos = i + seqlen_k - seqlen_q
                logits = []
                for j in range(seqlen_k):
                    if (left >= 0 and j < pos - left) or (right >= 0 and j > pos + right):
                        continue
                    s = scale * float(np.dot(q[b, i, h].astype(np.float64),
                                             k[b, j, kh].astype(np.float64)))
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    logits.append((s, j))
                denom_terms = [s for s, _ in logits]
                if sinks is not None:
                    denom_terms.append(float(sinks[h]))
                if not denom_terms:
                    continue
                mx = max(denom_terms)
                denom = sum(math.exp(s - mx) for s in denom_terms)
                lse[b, h, i] = mx + math.log(denom)
                for s, j in logits:
                    out[b, i, h] += math.exp(s - mx) / denom * v[b, j, kh].astype(np.float64)
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window, softcap, with_sinks", [
    (None, 0.0, True), ((2, 1), 0.0, False), ((0, -1), 0.7, False), ((3, 0), 1.3, True),
    ((-1, 2), 0.0, True), ((1, 1), 0.0, False)])
def test_reference_matches_a_per_element_loop(causal, window, softcap, with_sinks):
    rng = np.random.default_rng(2100)
    # seqlen_q > seqlen_k: the first rows sit before every key (some see none).
    for seqlen_q, seqlen_k in ((3, 7), (6, 4)):
        q, k, v = make_qkv(rng, 2, seqlen_q, seqlen_k, 4, 2, 5)
        sinks = _sinks(rng, 4) if with_sinks else None
        if causal and window is not None and window[1] > 0:
            window = (window[0], 0)
        want = _brute_force(q, k, v, causal, window, softcap, sinks, 0.4)
        got = reference.forward(q, k, v, causal=causal, window=window, softcap=softcap,
                                sinks=sinks, softmax_scale=0.4)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(got[1]), np.isneginf(want[1]))
        fin = np.isfinite(want[1])
        np.testing.assert_allclose(got[1][fin], want[1][fin], rtol=1e-12)


def test_reference_combine_folds_the_sink_once():
    """combine(sinks=) is the merge of the partials plus one partial (out 0, lse sink)."""
    rng = np.random.default_rng(2101)
    outs = rng.standard_normal((3, 2, 5, 4, 6))
    lses = rng.standard_normal((3, 2, 4, 5))
    lses[:, 0, 1, 2] = -np.inf  # a row no shard saw
    sinks = rng.standard_normal(4)
    out, lse = reference.combine(outs, lses, sinks=sinks)
    total = np.exp(lses).sum(axis=0) + np.exp(sinks)[None, :, None]
    np.testing.assert_allclose(lse, np.log(total), rtol=1e-12)
    weights = np.exp(lses) / total[None]
    want = np.einsum("gbhs,gbshd->bshd", weights, outs)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    assert lse[0, 1, 2] == sinks[1] and not out[0, 2, 1].any()


# --------------------------------------------------------------- each feature, CPU

FEATURES = {
    "window": dict(window=(37, 11)),
    "window_left": dict(window=(50, -1)),
    "window_right": dict(window=(-1, 20)),
    "softcap": dict(softcap=3.0),
    "sinks": dict(sinks=True),
    "all": dict(window=(29, 5), softcap=2.5, sinks=True),
}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(97, 203), (203, 97), (1, 300), (64, 64)])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_feature_matches_reference(feature, seqlen_q, seqlen_k, causal, dtype):
    rng = np.random.default_rng(2200 + seqlen_q)
    q, k, v = make_qkv(rng, 2, seqlen_q, seqlen_k, 6, 2, 48, dtype)
    kw = dict(FEATURES[feature])
    if kw.get("sinks") is True:
        kw["sinks"] = _sinks(rng, 6, 2.0)
    if causal and kw.get("window", (0, 0))[1] > 0:
        kw["window"] = (kw["window"][0], 0)
    _check(q, k, v, dtype, causal=causal, **kw)


@pytest.mark.parametrize("window", [(0, 0), (0, -1), (-1, 0), (3, 0), (0, 5), (7, 7), (63, 0),
                                    (64, 0), (65, 1), (-1, -1)])
def test_windows_smaller_than_a_block_and_left_zero(window):
    rng = np.random.default_rng(2300)
    q, k, v = make_qkv(rng, 1, 150, 333, 4, 4, 32)
    out, _ = _check(q, k, v, window=window)
    if window == (0, 0):
        # Each row sees exactly its own key: out is that key's value row.
        shift = 333 - 150
        np.testing.assert_allclose(out[0], v[0, shift:].astype(np.float64), rtol=1e-6)


def test_window_none_and_unbounded_window_are_the_plain_call():
    rng = np.random.default_rng(2301)
    q, k, v = make_qkv(rng, 2, 33, 90, 4, 2, 16)
    for causal, windows in ((True, ((-1, -1), (-1, 0), (10**6, 0))),
                            (False, ((-1, -1), (-1, 10**6), (10**6, 10**6), (10**30, -1)))):
        plain = fmha_native.forward(q, k, v, device="cpu", causal=causal)
        for window in windows:
            got = fmha_native.forward(q, k, v, device="cpu", causal=causal, window=window)
            np.testing.assert_array_equal(got[0], plain[0])
            np.testing.assert_array_equal(got[1], plain[1])


def test_rows_that_see_no_key():
    """Rows before every key (seqlen_q > seqlen_k with right = 0) or whose window misses
    the keys: out 0 and lse -inf, or lse = the head's sink."""
    rng = np.random.default_rng(2400)
    q, k, v = make_qkv(rng, 2, 40, 10, 4, 2, 16)
    sinks = _sinks(rng, 4)
    out, lse = _check(q, k, v, window=(3, 0))
    assert np.isneginf(lse[:, :, :30]).all() and not out[:, :30].any()
    out, lse = _check(q, k, v, window=(3, 0), sinks=sinks)
    assert not out[:, :30].any()
    np.testing.assert_array_equal(lse[:, :, :30], np.broadcast_to(sinks[None, :, None],
                                                                  (2, 4, 30)))
    # No key at all (seqlen_k = 0): every row is (0, sink).
    q0, k0, v0 = make_qkv(rng, 2, 5, 0, 4, 2, 16)
    out, lse = fmha_native.forward(q0, k0, v0, device="cpu", sinks=sinks)
    assert not np.asarray(out).any()
    np.testing.assert_array_equal(lse, np.broadcast_to(sinks[None, :, None], (2, 4, 5)))
    out, lse = fmha_native.forward(q0, k0, v0, device="cpu")
    assert np.isneginf(lse).all()


@pytest.mark.parametrize("softcap", [0.01, 0.3, 1.0, 50.0, 1000.0])
@pytest.mark.parametrize("q_scale", [1.0, 10.0])
def test_softcap_accuracy_over_its_range(softcap, q_scale):
    """The CPU's tanh (a series near 0, exp2 beyond) within the float32 bounds, from
    scores well inside the cap to scores far past it."""
    rng = np.random.default_rng(2402)
    q, k, v = make_qkv(rng, 2, 40, 300, 4, 2, 64)
    q = (q * np.float32(q_scale)).astype(np.float32)
    for splits in (1, 3):
        _check(q, k, v, softcap=softcap, num_splits=splits)


def test_huge_softcap_and_sinks_of_minus_infinity_change_nothing_much():
    rng = np.random.default_rng(2401)
    q, k, v = make_qkv(rng, 1, 20, 70, 2, 2, 16)
    plain_out, plain_lse = fmha_native.forward(q, k, v, device="cpu")
    out, lse = fmha_native.forward(q, k, v, device="cpu", sinks=np.full(2, -np.inf, np.float32))
    np.testing.assert_allclose(out, plain_out, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(lse, plain_lse, rtol=1e-6)
    out, lse = fmha_native.forward(q, k, v, device="cpu", softcap=1e6)
    np.testing.assert_allclose(out, plain_out, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------- splits and combine

@pytest.mark.parametrize("kw", [dict(window=(70, 0), causal=True), dict(softcap=2.0),
                                dict(sinks=True), dict(window=(100, 30), softcap=5.0, sinks=True)],
                         ids=["window", "softcap", "sinks", "all"])
@pytest.mark.parametrize("seqlen_q", [1, 5, 80])
def test_forced_splits_agree(kw, seqlen_q):
    rng = np.random.default_rng(2500 + seqlen_q)
    q, k, v = make_qkv(rng, 2, seqlen_q, 777, 8, 2, 32)
    kw = dict(kw)
    if kw.get("sinks") is True:
        kw["sinks"] = _sinks(rng, 8, 3.0)
    results = [_check(q, k, v, num_splits=n, **kw) for n in (1, 2, 7)]
    for out, lse in results[1:]:
        np.testing.assert_allclose(out, results[0][0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse, results[0][1], rtol=1e-6, atol=1e-6)


def test_forced_splits_are_deterministic_and_row_independent():
    rng = np.random.default_rng(2501)
    q, k, v = make_qkv(rng, 3, 3, 500, 4, 2, 32)
    sinks = _sinks(rng, 4)
    kw = dict(device="cpu", window=(130, 0), causal=True, softcap=4.0, sinks=sinks, num_splits=7)
    a = fmha_native.forward(q, k, v, **kw)
    b = fmha_native.forward(q, k, v, **kw)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    one = fmha_native.forward(q[1:2], k[1:2], v[1:2], **kw)
    assert np.array_equal(one[0], a[0][1:2]) and np.array_equal(one[1], a[1][1:2])


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_combine_with_sinks_equals_one_call(shards):
    """Attention over KV shards (no sinks) merged by combine(sinks=) equals one forward
    with the sinks, and the reference combine."""
    rng = np.random.default_rng(2600 + shards)
    q, k, v = make_qkv(rng, 2, 9, 301, 6, 3, 40)
    sinks = _sinks(rng, 6, 2.0)
    bounds = np.linspace(0, 301, shards + 1).astype(int)
    parts = [fmha_native.forward(q, k[:, a:b], v[:, a:b], device="cpu")
             for a, b in zip(bounds[:-1], bounds[1:])]
    outs = np.stack([o for o, _ in parts])
    lses = np.stack([l for _, l in parts])
    out, lse = fmha_native.combine(outs, lses, sinks=sinks)
    ref_out, ref_lse = reference.forward(q, k, v, sinks=sinks)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f32")
    want = reference.combine(outs, lses, sinks=sinks)
    np.testing.assert_allclose(out, want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, want[1], rtol=1e-6)
    single = fmha_native.forward(q, k, v, device="cpu", sinks=sinks)
    np.testing.assert_allclose(out, single[0], rtol=1e-5, atol=1e-6)
    # Lists of partials take the same path.
    listed = fmha_native.combine(list(outs), list(lses), sinks=sinks)
    assert np.array_equal(listed[0], out) and np.array_equal(listed[1], lse)


def test_combine_with_sinks_of_empty_partials():
    rng = np.random.default_rng(2602)
    outs = rng.standard_normal((2, 1, 3, 2, 8)).astype(np.float32)
    lses = np.full((2, 1, 2, 3), -np.inf, np.float32)
    sinks = _sinks(rng, 2)
    out, lse = fmha_native.combine(outs, lses, sinks=sinks)
    assert not np.asarray(out).any()
    np.testing.assert_array_equal(lse, np.broadcast_to(sinks[None, :, None], (1, 2, 3)))
    out, lse = fmha_native.combine(outs, lses)
    assert np.isneginf(lse).all()


# --------------------------------------------------------------- serving modes

@pytest.mark.parametrize("kw", [dict(window=(40, 0)), dict(window=(5, -1), softcap=3.0),
                                dict(sinks=True, window=(64, 0))], ids=["window", "cap", "sinks"])
def test_decode_with_cache_seqlens_and_append(kw):
    rng = np.random.default_rng(2700)
    lengths = np.array([0, 1, 63, 200, 5], np.int32)
    q, k, v = make_qkv(rng, 5, 2, 260, 8, 2, 32)
    k_new, v_new = randn(rng, (5, 2, 2, 32)), randn(rng, (5, 2, 2, 32))
    kw = dict(kw)
    if kw.get("sinks") is True:
        kw["sinks"] = _sinks(rng, 8)
    want_k, want_v = reference.append_kv(k, v, lengths, k_new, v_new)
    k_run, v_run = k.copy(), v.copy()
    for splits in (1, 3):
        k_run, v_run = k.copy(), v.copy()
        ref = reference.forward(q, k, v, causal=True, cache_seqlens=lengths, k_new=k_new,
                                v_new=v_new, **_ref_kw(kw))
        out, lse = fmha_native.forward(q, k_run, v_run, device="cpu", causal=True,
                                       cache_seqlens=lengths, k_new=k_new, v_new=v_new,
                                       num_splits=splits, **kw)
        assert_close(as_f64(out), as_f64(lse), ref[0], ref[1], "f32")
    np.testing.assert_array_equal(k_run, want_k.astype(np.float32))
    np.testing.assert_array_equal(v_run, want_v.astype(np.float32))
    # Decode without an append: one query row per sequence.
    _check(q[:, :1], k, v, cache_seqlens=lengths, **kw)


def test_paged_cache_with_window_softcap_sinks():
    rng = np.random.default_rng(2800)
    lengths = [70, 3, 129]
    k, v, table = paged_cache(rng, lengths, 16, 10, 2, 24)
    q = randn(rng, (3, 4, 6, 24))
    sinks = _sinks(rng, 6)
    for splits in (1, 2, 7):
        _check(q, k, v, causal=True, cache_seqlens=np.array(lengths, np.int32),
               block_table=table, window=(33, 0), softcap=2.0, sinks=sinks, num_splits=splits)


def test_packed_sequences_with_window_softcap_sinks():
    rng = np.random.default_rng(2900)
    q, cu_q = packed(rng, [5, 0, 17, 64], 4, 20)
    k, cu_k = packed(rng, [9, 3, 17, 130], 2, 20)
    v = randn(rng, k.shape)
    sinks = _sinks(rng, 4)
    for causal in (False, True):
        for splits in (1, 2):
            _check(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal,
                   window=(20, 0 if causal else 4), softcap=1.5, sinks=sinks,
                   num_splits=splits)


# --------------------------------------------------------------- head dims

@pytest.mark.parametrize("head_dim", [1, 3, 80, 96, 192, 256, 320, 512])
def test_head_dims_on_the_cpu(head_dim):
    rng = np.random.default_rng(3000 + head_dim)
    q, k, v = make_qkv(rng, 2, 7, 131, 6, 2, head_dim, "bf16")
    _check(q, k, v, "bf16", causal=True)
    q, k, v = make_qkv(rng, 1, 5, 77, 4, 1, head_dim)
    _check(q, k, v, window=(21, 2), softcap=4.0, sinks=_sinks(rng, 4), num_splits=2)
    plan = fmha_native.explain(q, k, v, device="cpu")
    assert plan["gate"]["head_dim"]["met"] is True


def test_head_dim_above_512_is_refused_on_the_cpu():
    rng = np.random.default_rng(3100)
    q, k, v = make_qkv(rng, 1, 2, 8, 1, 1, 513)
    with pytest.raises(NotImplementedError, match="head_dim 513"):
        fmha_native.forward(q, k, v, device="cpu")


# --------------------------------------------------------------- bad input

def _problem():
    rng = np.random.default_rng(3200)
    return make_qkv(rng, 1, 4, 9, 4, 2, 8)


@pytest.mark.parametrize("window, exc", [((-2, 0), ValueError), ((0, -5), ValueError),
                                         ((1, 2, 3), ValueError), ((1,), ValueError),
                                         (5, TypeError), ("ab", TypeError),
                                         ((1.5, 2), TypeError), ((True, 2), TypeError)])
def test_bad_window(window, exc):
    q, k, v = _problem()
    out = np.full(q.shape, 7.0, np.float32)
    with pytest.raises(exc, match="window"):
        fmha_native.forward(q, k, v, device="cpu", window=window, out=out)
    assert (out == 7.0).all()


def test_causal_with_a_positive_right_bound_is_refused():
    q, k, v = _problem()
    with pytest.raises(ValueError, match="window"):
        fmha_native.forward(q, k, v, device="cpu", causal=True, window=(3, 2))
    fmha_native.forward(q, k, v, device="cpu", causal=True, window=(3, 0))


@pytest.mark.parametrize("softcap, exc", [(-1.0, ValueError), (float("nan"), ValueError),
                                          (float("inf"), ValueError), (1e300, ValueError),
                                          ("1", TypeError), (True, TypeError), (None, TypeError)])
def test_bad_softcap(softcap, exc):
    q, k, v = _problem()
    out = np.full(q.shape, 7.0, np.float32)
    with pytest.raises(exc, match="softcap"):
        fmha_native.forward(q, k, v, device="cpu", softcap=softcap, out=out)
    assert (out == 7.0).all()


@pytest.mark.parametrize("sinks, exc", [(np.zeros(4, np.float64), TypeError),
                                        (np.zeros(4, np.int32), TypeError),
                                        (np.zeros(4, np.float16), TypeError),
                                        (np.zeros(2, np.float32), ValueError),
                                        (np.zeros((1, 4), np.float32), ValueError),
                                        (np.zeros(8, np.float32), ValueError)])
def test_bad_sinks(sinks, exc):
    q, k, v = _problem()
    out = np.full(q.shape, 7.0, np.float32)
    with pytest.raises(exc, match="sinks"):
        fmha_native.forward(q, k, v, device="cpu", sinks=sinks, out=out)
    assert (out == 7.0).all()
    outs, lses = np.zeros((2, 1, 4, 4, 8), np.float32), np.zeros((2, 1, 4, 4), np.float32)
    with pytest.raises(exc, match="sinks"):
        fmha_native.combine(outs, lses, sinks=sinks)


def test_sinks_overlapping_an_output_is_refused():
    q, k, v = _problem()
    lse = np.zeros((1, 4, 4), np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        fmha_native.forward(q, k, v, device="cpu", lse=lse, sinks=lse[0, :, 0])


# --------------------------------------------------------------- explain

def test_explain_shows_the_features():
    q, k, v = _problem()
    plan = fmha_native.explain(q, k, v, device="cpu")
    assert plan["window"] is None and plan["softcap"] == 0.0 and plan["sinks"] is False
    plan = fmha_native.explain(q, k, v, device="cpu", causal=True, window=(5, -1), softcap=2.0,
                               sinks=np.zeros(4, np.float32))
    assert plan["window"] == (5, 0) and plan["softcap"] == 2.0 and plan["sinks"] is True
    plan = fmha_native.explain(q, k, v, device="cpu", window=(-1, 3))
    assert plan["window"] == (-1, 3)
    plan = fmha_native.explain(q, k, v, device="cpu", causal=True, window=(-1, -1))
    assert plan["window"] is None


def _long_keys(seqlen_k, seqlen_q=1):
    """Zero-stride k/v of seqlen_k keys: explain needs their shapes, not their memory."""
    q = np.zeros((1, seqlen_q, 8, 64), np.float32)
    kv = np.broadcast_to(np.zeros((1, 1, 2, 64), np.float32), (1, seqlen_k, 2, 64))
    return q, kv, kv


@pytest.mark.parametrize("seqlen_q", [1, 100])
def test_explain_counts_only_the_visible_key_blocks(seqlen_q):
    """A window makes the blocks a tile sees (and the split rule's count) independent of
    the keys' length; explain says how many a tile skips."""
    counts = []
    for seqlen_k in (4096, 131072):
        q, k, v = _long_keys(seqlen_k, seqlen_q)
        plan = fmha_native.explain(q, k, v, device="cpu", causal=True, window=(256, 0))
        split = plan["split"]
        assert split["all_key_blocks"] == -(-seqlen_k // plan["block_n"])
        assert split["key_blocks"] < split["all_key_blocks"]
        assert "skips" in plan["reason"]
        counts.append(split["key_blocks"])
        forced = fmha_native.explain(q, k, v, device="cpu", causal=True, window=(256, 0),
                                     num_splits=200)
        assert forced["num_splits"] == split["key_blocks"]
        plain = fmha_native.explain(q, k, v, device="cpu", causal=True)
        assert plain["split"]["key_blocks"] == split["all_key_blocks"]
    assert counts[0] == counts[1]


def test_windowed_decode_reads_only_its_window():
    """Keys outside every row's window are never read: NaN there does not reach the
    result (a backend that multiplied them by a zero weight would give NaN)."""
    rng = np.random.default_rng(3300)
    q, k, v = make_qkv(rng, 2, 3, 5000, 4, 2, 32)
    k[:, :4000] = np.nan
    v[:, :4000] = np.nan
    for splits in (1, 2, 7):
        out, lse = fmha_native.forward(q, k, v, device="cpu", causal=True, window=(900, 0),
                                       num_splits=splits)
        assert np.isfinite(out).all() and np.isfinite(lse).all()
        ref = reference.forward(q[:, :, :, :], k[:, 4000:], v[:, 4000:], causal=True,
                                window=(900, 0))
        assert_close(as_f64(out), as_f64(lse), ref[0], ref[1], "f32")


def test_windowed_prefill_tiles_skip_blocks_outside_their_windows():
    """Prefill: each tile skips the key blocks before its rows' windows.  Keys 0..959
    (whole 64-key blocks) are NaN; rows whose tiles' windows start well past them must
    come out as on clean keys.  (A block some row of the tile sees partly is read whole,
    and 0 * NaN in P V would show there, as it does for causal masks.)"""
    rng = np.random.default_rng(3301)
    q, k, v = make_qkv(rng, 1, 2000, 2000, 2, 1, 32)
    assert fmha_native.explain(q, k, v, device="cpu")["block_n"] == 64
    k_nan, v_nan = k.copy(), v.copy()
    k_nan[:, :960] = np.nan
    v_nan[:, :960] = np.nan
    ref = reference.forward(q, k, v, causal=True, window=(100, 0))
    for splits in (1, 2):
        out, lse = fmha_native.forward(q, k_nan, v_nan, device="cpu", causal=True,
                                       window=(100, 0), num_splits=splits)
        rows = slice(1200, None)
        assert_close(as_f64(out)[:, rows], as_f64(lse)[:, :, rows], ref[0][:, rows],
                     ref[1][:, :, rows], "f32")


# --------------------------------------------------------------- the GPU plan

H100 = dict(name="NVIDIA H100 80GB HBM3", arch="sm_90", cc=(9, 0), sm_count=132,
            l2_bytes=50 << 20, max_smem_per_block=227 << 10, max_smem_per_sm=228 << 10)
H100_SM90 = dict(H100, archs_built=["80", "90a"])
PREFILL = dict(batch=1, seqlen_q=4096, seqlen_k=4096, heads_q=32, heads_kv=8, head_dim=128,
               dtype="bfloat16", causal=1)


@pytest.mark.parametrize("extra, named, in_name", [
    (dict(window_left=128), "window", ",window"),
    (dict(causal=0, window_right=3), "window", ",window"),
    (dict(softcap=30), "softcap", ",causal,softcap"),
    (dict(sinks=1), "sinks", ",causal,sinks"),
    (dict(window_left=8, softcap=5, sinks=1), "window, softcap and sinks", ",window,softcap,sinks")])
@pytest.mark.parametrize("seqlen_q", [1, 4096])
def test_gpu_plan_runs_the_features_in_the_kernel_it_picks(extra, named, in_name, seqlen_q):
    """The GPU gate admits every feature and the planner picks the kernel it would pick
    without them: the Hopper prefill kernel for long queries, the decode tiles for one
    query row; the kernel's name carries the mask kind and the features."""
    problem = dict(PREFILL, seqlen_q=seqlen_q)
    plain = _fmha_native._plan_for_device(problem, H100_SM90)
    assert plain["supported"] is True
    assert plain["gate"]["features"]["why"].startswith("no window, softcap or sinks")
    plan = _fmha_native._plan_for_device(dict(problem, **extra), H100_SM90)
    assert plan["supported"] is True and plan["gate"]["features"]["met"] is True
    assert plan["gate"]["features"]["why"].startswith(named + " asked for: every GPU kernel")
    want = "fwd_decode<" if seqlen_q == 1 else "fwd_sm90<"
    assert plain["kernel"].startswith(want) and plan["kernel"].startswith(want), plan["kernel"]
    assert in_name + (",pack_gqa>" if seqlen_q == 1 else ",") in plan["kernel"], plan["kernel"]
    if seqlen_q == 1:
        assert named + " in them" in plan["reason"], plan["reason"]


def test_gpu_plan_takes_causal_alone_and_an_unbounded_window_as_plain():
    problem = dict(PREFILL, seqlen_q=64, window_left=-1, window_right=-1)
    plan = _fmha_native._plan_for_device(problem, H100)
    assert plan["supported"] is True
    assert plan["kernel"].startswith("fwd_mma<bfloat16,d128,causal>"), plan["kernel"]
    assert "in them" not in plan["reason"]


@pytest.mark.parametrize("seqlen_q", [1, 4096])
def test_gpu_plan_counts_only_the_visible_key_blocks(seqlen_q):
    """As on the CPU: a window makes the GPU split rule's block count (and a forced
    num_splits' clamp) independent of seqlen_k, and explain says how many a tile skips."""
    counts = []
    for seqlen_k in (8192, 131072):
        problem = dict(PREFILL, seqlen_q=seqlen_q, seqlen_k=seqlen_k, window_left=1024)
        plan = _fmha_native._plan_for_device(problem, H100)
        split = plan["split"]
        assert split["all_key_blocks"] == -(-seqlen_k // plan["block_n"])
        rows = seqlen_q if plan["pack_gqa"] else min(plan["block_m"], seqlen_q)
        assert split["key_blocks"] == -(-(rows + 1024) // plan["block_n"]) + 1
        assert "skips" in plan["reason"], plan["reason"]
        counts.append(split["key_blocks"])
        # A forced split count is clamped to the visible blocks of the forced plan's tiles
        # (the sm90 kernel does not split: a build with sm_90a forces the mma tiles).
        forced = _fmha_native._plan_for_device(problem, H100, num_splits=256)
        rows_f = seqlen_q if forced["pack_gqa"] else min(forced["block_m"], seqlen_q)
        assert forced["num_splits"] == forced["split"]["key_blocks"]
        assert forced["num_splits"] == -(-(rows_f + 1024) // forced["block_n"]) + 1
        plain = _fmha_native._plan_for_device(dict(problem, window_left=-1), H100)
        # (its key blocks may be wider: the d128 ping-pong tiles walk 176 keys a block)
        assert plain["split"]["key_blocks"] == -(-seqlen_k // plain["block_n"])
        assert "skips" not in plain["reason"]
    assert counts[0] == counts[1]


# --------------------------------------------------------------- torch ops

def test_torch_ops_carry_the_features():
    torch = pytest.importorskip("torch")
    fmha_native._load_torch()
    rng = np.random.default_rng(3500)
    q, k, v = (torch.from_numpy(x) for x in make_qkv(rng, 2, 5, 70, 4, 2, 16))
    sinks = torch.from_numpy(_sinks(rng, 4))
    kw = dict(causal=True, window=(20, 0), softcap=3.0, sinks=sinks, device="cpu")
    direct = fmha_native.forward(q, k, v, **kw)
    via_op = torch.ops.fmha_native.forward(q, k, v, None, None, None, None, True, None, 0, True,
                                           None, None, "cpu", None, [20, 0], 3.0, sinks)
    assert torch.equal(direct[0], via_op[0]) and torch.equal(direct[1], via_op[1])
    from torch.fx.experimental.proxy_tensor import make_fx
    graph = make_fx(lambda q, k, v, s: fmha_native.forward(
        q, k, v, causal=True, window=(20, 0), softcap=3.0, sinks=s, device="cpu"))(q, k, v, sinks)
    traced = graph(q, k, v, sinks)
    assert torch.equal(traced[0], direct[0]) and torch.equal(traced[1], direct[1])
    outs, lses = torch.stack([direct[0], direct[0]]), torch.stack([direct[1], direct[1]])
    merged = fmha_native.combine(outs, lses, sinks=sinks)
    op_merged = torch.ops.fmha_native.combine(outs, lses, None, sinks)
    assert torch.equal(merged[0], op_merged[0]) and torch.equal(merged[1], op_merged[1])
    scalars = dict(cache_seqlens=None, block_table=None, cu_seqlens_q=None, cu_seqlens_k=None,
                   causal=True, softmax_scale=None, num_splits=2, return_lse=True,
                   max_seqlen_q=None, max_seqlen_k=None, device="cpu", stream=None,
                   window=[20, 0], softcap=3.0, sinks=sinks)
    torch.library.opcheck(torch.ops.fmha_native.forward.default, (q, k, v), scalars)
    torch.library.opcheck(torch.ops.fmha_native.combine.default, (outs, lses, None, sinks))
    with pytest.raises(ValueError, match="window"):
        fmha_native._torch_ops.call_forward(q, k, v, dict(window=(-3, 0)))
    with pytest.raises(ValueError, match="softcap"):
        fmha_native._torch_ops.call_forward(q, k, v, dict(softcap=-1.0))
