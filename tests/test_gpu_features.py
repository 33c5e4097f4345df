"""Model features (issue 21) on the GPU: sliding windows, logit softcapping and attention
sinks in the tensor-core kernels (prefill and decode tiles, splits, the walkers' merge)
and in the GPU combine, against the float64 reference only.  Each feature alone and all
together, causal both ways, Sq != Sk, windows smaller than a key block, left = 0, rows
that see no key, KV cache with append, paged and packed sequences, GQA, forced splits,
combine(sinks=), and the block skipping that explain() reports and that keys outside
every window (NaN here) prove.  Every test skips, saying so, when no GPU is visible."""
import numpy as np
import pytest

import fmha_native
from fmha_native import reference
from _harness import (NO_GPU_REASON, Backend, as_f64, assert_close, gpu_devices, make_qkv,
                      packed, paged_cache, randn, torch_cuda)

pytestmark = pytest.mark.gpu

DTYPES = ("f16", "bf16")
REF_KEYWORDS = ("window", "softcap", "sinks", "causal", "softmax_scale", "cache_seqlens",
                "k_new", "v_new", "block_table", "cu_seqlens_q", "cu_seqlens_k")


@pytest.fixture(autouse=True)
def _need_gpu():
    if not gpu_devices():
        pytest.skip(NO_GPU_REASON)


@pytest.fixture
def gpu():
    return Backend("gpu")


def _sinks(rng, heads, scale=2.0):
    return (rng.standard_normal(heads) * scale).astype(np.float32)


def _check(gpu, q, k, v, dtype, **kw):
    """forward on the GPU against the reference; returns the float64 (out, lse)."""
    ref = reference.forward(q, k, v, **{n: kw[n] for n in REF_KEYWORDS if n in kw})
    out, lse = gpu.forward(q, k, v, **kw)
    assert_close(out, lse, ref[0], ref[1], dtype,
                 what=str({n: kw.get(n) for n in ("window", "softcap", "causal", "num_splits")}))
    return out, lse


def _plan(gpu, q, k, v, **kw):
    kw = {key: gpu.put(val) if isinstance(val, np.ndarray) else val for key, val in kw.items()}
    return fmha_native.explain(gpu.put(q), gpu.put(k), gpu.put(v), **gpu.device_kw(), **kw)


FEATURES = {
    "window": dict(window=(37, 11)),
    "window_left": dict(window=(50, -1)),
    "window_right": dict(window=(-1, 20)),
    "softcap": dict(softcap=3.0),
    "sinks": dict(sinks=True),
    "all": dict(window=(29, 5), softcap=2.5, sinks=True),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(97, 203), (203, 97), (1, 300), (300, 300)])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_feature_matches_reference(gpu, feature, seqlen_q, seqlen_k, causal, head_dim, dtype):
    """GQA (6 query heads on 2 kv heads); Sq > Sk has rows that see no key (out 0, lse
    -inf, or the sink); seqlen_q 1 runs the decode tiles."""
    rng = np.random.default_rng(5200 + seqlen_q + head_dim)
    q, k, v = make_qkv(rng, 2, seqlen_q, seqlen_k, 6, 2, head_dim, dtype)
    kw = dict(FEATURES[feature])
    if kw.get("sinks") is True:
        kw["sinks"] = _sinks(rng, 6)
    if causal and kw.get("window", (0, 0))[1] > 0:
        kw["window"] = (kw["window"][0], 0)
    plan = _plan(gpu, q, k, v, causal=causal, **kw)
    assert plan["supported"], plan.get("error")
    _check(gpu, q, k, v, dtype, causal=causal, **kw)


@pytest.mark.parametrize("window", [(0, 0), (3, 2), (0, -1), (5, 0), (-1, 0), (0, 7)])
@pytest.mark.parametrize("seqlen_q", [1, 7, 300])
def test_windows_smaller_than_a_block_and_left_zero(gpu, window, seqlen_q):
    rng = np.random.default_rng(5300 + seqlen_q)
    q, k, v = make_qkv(rng, 2, seqlen_q, 300, 4, 2, 64, "bf16")
    for causal in (False, True):
        if causal and window[1] > 0:
            continue
        _check(gpu, q, k, v, "bf16", causal=causal, window=window)
        _check(gpu, q, k, v, "bf16", causal=causal, window=window, sinks=_sinks(rng, 4))


@pytest.mark.parametrize("softcap, q_scale", [(0.5, 1.0), (5.0, 4.0), (30.0, 8.0), (50.0, 1.0)])
def test_softcap_over_its_range(gpu, softcap, q_scale):
    """Scores far inside and far beyond the cap (the fast tanh saturates to +-1)."""
    rng = np.random.default_rng(5400)
    for dtype in DTYPES:
        q, k, v = make_qkv(rng, 1, 130, 260, 4, 4, 128, dtype)
        q = (q.astype(np.float32) * q_scale).astype(q.dtype)
        _check(gpu, q, k, v, dtype, softcap=softcap, causal=True)


@pytest.mark.parametrize("kw", [dict(window=(40, 0)), dict(softcap=2.0),
                                dict(window=(100, 0), softcap=2.0, sinks=True)],
                         ids=["window", "softcap", "all"])
@pytest.mark.parametrize("seqlen_q", [1, 100])
def test_forced_splits_agree(gpu, kw, seqlen_q):
    """num_splits 1, 2 and 7 divide the visible key blocks; each is held to the reference,
    and they agree with each other within the dtype's bound."""
    rng = np.random.default_rng(5500 + seqlen_q)
    q, k, v = make_qkv(rng, 2, seqlen_q, 1000, 8, 2, 64, "f16")
    kw = dict(kw)
    if kw.get("sinks") is True:
        kw["sinks"] = _sinks(rng, 8)
    results = [_check(gpu, q, k, v, "f16", causal=True, num_splits=s, **kw) for s in (1, 2, 7)]
    for out, lse in results[1:]:
        assert_close(out, lse, results[0][0], results[0][1], "f16")


@pytest.mark.parametrize("kw", [dict(window=(40, 0)), dict(window=(5, -1), softcap=3.0),
                                dict(sinks=True, window=(64, 0))], ids=["window", "cap", "sinks"])
def test_decode_with_cache_seqlens_and_append(gpu, kw):
    rng = np.random.default_rng(5600)
    lengths = np.array([0, 1, 63, 200, 5], np.int32)
    q, k, v = make_qkv(rng, 5, 2, 260, 8, 2, 64, "bf16")
    k_new, v_new = randn(rng, (5, 2, 2, 64), "bf16"), randn(rng, (5, 2, 2, 64), "bf16")
    kw = dict(kw)
    if kw.get("sinks") is True:
        kw["sinks"] = _sinks(rng, 8)
    want_k, want_v = reference.append_kv(k, v, lengths, k_new, v_new)
    for splits in (1, 3):
        ref = reference.forward(q, k, v, causal=True, cache_seqlens=lengths, k_new=k_new,
                                v_new=v_new, **kw)
        out, lse, k_after, v_after = gpu.forward_append(
            q, k.copy(), v.copy(), causal=True, cache_seqlens=lengths, k_new=k_new,
            v_new=v_new, num_splits=splits, **kw)
        assert_close(out, lse, ref[0], ref[1], "bf16")
        np.testing.assert_array_equal(k_after, want_k)
        np.testing.assert_array_equal(v_after, want_v)
    # Decode without an append: one query row per sequence.
    _check(gpu, q[:, :1], k, v, "bf16", cache_seqlens=lengths, **kw)


def test_paged_cache_with_window_softcap_sinks(gpu):
    rng = np.random.default_rng(5700)
    lengths = [70, 3, 129]
    k, v, table = paged_cache(rng, lengths, 16, 10, 2, 64, "f16")
    q = randn(rng, (3, 4, 6, 64), "f16")
    sinks = _sinks(rng, 6)
    for splits in (1, 2, 7):
        _check(gpu, q, k, v, "f16", causal=True, cache_seqlens=np.array(lengths, np.int32),
               block_table=table, window=(33, 0), softcap=2.0, sinks=sinks, num_splits=splits)


def test_packed_sequences_with_window_softcap_sinks(gpu):
    rng = np.random.default_rng(5800)
    q, cu_q = packed(rng, [5, 0, 17, 130], 4, 128, "bf16")
    k, cu_k = packed(rng, [9, 3, 17, 300], 2, 128, "bf16")
    v = randn(rng, k.shape, "bf16")
    sinks = _sinks(rng, 4)
    for causal in (False, True):
        for splits in (1, 2):
            _check(gpu, q, k, v, "bf16", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal,
                   window=(20, 0 if causal else 4), softcap=1.5, sinks=sinks,
                   num_splits=splits)


def test_decode_walkers_merge_with_sinks(gpu):
    """Decode tiles whose walkers share a split merge in shared memory; unsplit, the sink
    joins the merged rows once (explain names the merge).  Forced splits take one walker
    per split: the sink then joins in the combine (or in the walker's own epilogue)."""
    rng = np.random.default_rng(5900)
    q, k, v = make_qkv(rng, 16, 1, 1000, 32, 8, 128, "bf16")
    sinks = _sinks(rng, 32)
    for kw in (dict(sinks=sinks), dict(sinks=sinks, window=(700, 0), softcap=5.0)):
        plan = _plan(gpu, q, k, v, **kw)
        assert plan["kernel"].startswith("fwd_decode<") and "+merge" in plan["kernel"], plan["kernel"]
        for splits in (0, 1, 3):
            _check(gpu, q, k, v, "bf16", num_splits=splits, **kw)


def test_windowed_decode_reads_only_its_window(gpu):
    """Keys outside every row's window are never read: NaN there does not reach the
    result (a kernel that multiplied them by a zero weight would give NaN)."""
    rng = np.random.default_rng(6000)
    q, k, v = make_qkv(rng, 2, 3, 5000, 4, 2, 64, "f16")
    k[:, :4000] = np.nan
    v[:, :4000] = np.nan
    plan = _plan(gpu, q, k, v, causal=True, window=(900, 0))
    assert "skips" in plan["reason"] and ",window" in plan["kernel"], plan
    assert plan["split"]["key_blocks"] < plan["split"]["all_key_blocks"]
    ref = reference.forward(q, k[:, 4000:], v[:, 4000:], causal=True, window=(900, 0))
    for splits in (1, 2, 7):
        out, lse = gpu.forward(q, k, v, causal=True, window=(900, 0), num_splits=splits)
        assert np.isfinite(out).all() and np.isfinite(lse).all()
        assert_close(out, lse, ref[0], ref[1], "f16")


def test_windowed_prefill_tiles_skip_blocks_outside_their_windows(gpu):
    """Prefill: keys 0..959 are NaN; rows from 1200 on, whose tiles' windows start past
    them, come out as on clean keys, and the plan counts only the visible blocks."""
    rng = np.random.default_rng(6100)
    q, k, v = make_qkv(rng, 1, 2000, 2000, 2, 1, 128, "bf16")
    k_nan, v_nan = k.copy(), v.copy()
    k_nan[:, :960] = np.nan
    v_nan[:, :960] = np.nan
    ref = reference.forward(q, k, v, causal=True, window=(100, 0))
    plan = _plan(gpu, q, k, v, causal=True, window=(100, 0))
    assert plan["split"]["key_blocks"] < plan["split"]["all_key_blocks"], plan["split"]
    for splits in (1, 2):
        out, lse = gpu.forward(q, k_nan, v_nan, causal=True, window=(100, 0), num_splits=splits)
        rows = slice(1200, None)
        assert_close(out[:, rows], lse[:, :, rows], ref[0][:, rows], ref[1][:, :, rows], "bf16")


# --------------------------------------------------------------- combine(sinks=)

@pytest.fixture
def torch():
    if not torch_cuda():
        pytest.skip("combine on the GPU needs device arrays: torch with CUDA is not available")
    import torch as torch_module
    return torch_module


def test_gpu_combine_with_sinks_matches_reference(torch):
    rng = np.random.default_rng(6200)
    outs = randn(rng, (3, 2, 7, 4, 64), "f16")
    lses = (rng.standard_normal((3, 2, 4, 7)) * 3).astype(np.float32)
    lses[:, 0, 1, 2] = -np.inf  # a row no shard saw: out 0, lse = its sink
    lses[0, 1, 2, 3] = -np.inf
    sinks = _sinks(rng, 4)
    dev = dict(device="cuda")
    out, lse = fmha_native.combine(torch.from_numpy(outs.astype(np.float32)).half().to(**dev),
                                   torch.from_numpy(lses).to(**dev),
                                   sinks=torch.from_numpy(sinks).to(**dev))
    assert out.is_cuda and lse.is_cuda
    ref_out, ref_lse = reference.combine(outs, lses, sinks=sinks)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16")
    assert float(lse[0, 1, 2]) == pytest.approx(float(sinks[1]), rel=1e-6)


def test_gpu_combine_of_shards_with_sinks_equals_one_call(torch):
    """Shards computed without the sink, merged with it on the GPU, equal one forward
    with the sink (and the GPU forward with it)."""
    rng = np.random.default_rng(6300)
    q, k, v = make_qkv(rng, 2, 5, 700, 8, 2, 128, "bf16")
    sinks = _sinks(rng, 8)
    gpu = Backend("gpu")
    outs, lses = [], []
    for c0, c1 in ((0, 250), (250, 250), (250, 700)):
        out, lse = gpu.forward_native(q, k[:, c0:c1], v[:, c0:c1])
        outs.append(out)
        lses.append(lse)
    merged = fmha_native.combine(torch.stack(outs), torch.stack(lses),
                                 sinks=torch.from_numpy(sinks).cuda())
    ref = reference.forward(q, k, v, sinks=sinks)
    assert_close(as_f64(merged[0]), as_f64(merged[1]), ref[0], ref[1], "bf16")
    _check(gpu, q, k, v, "bf16", sinks=sinks)
