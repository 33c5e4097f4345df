"""The CPU's bf16 pair path (csrc/cpu_simd.h, FMHA_ISA_AVX512BF16): S = Q K^T of bfloat16
Q/K/V on AVX-512 BF16 dot products, P V in fp32.

Its scores are the fp32 chain of exact bf16 products, so it is held to the float32 bound
(out_dtype=float32) against the float64 reference, not only to the bf16 one: head dims odd
and even (the odd ones pad a zero pair), key counts odd, GQA packing, window, softcap,
sinks, splits, a KV cache whose slots past cache_seqlens are NaN, paged, packed, append.
A row's bits do not depend on the other rows.  Against FMHA_CPU_SIMD=avx512 (the fp32
kernels) bf16 agrees to fp32 rounding and float16/float32 agree bit for bit.  Every test
skips, saying why, where the CPU lacks avx512_bf16 or FMHA_CPU_SIMD caps it below.
"""
import json
import os
import sys

import numpy as np
import pytest

import fmha_native
from fmha_native import reference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import (as_f64, assert_close, bits, make_qkv, packed, paged_cache,  # noqa: E402
                      randn, rel_fro, run_python)


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _skip_reason():
    if "avx512_bf16" not in _cpu_flags():
        return "this CPU has no avx512_bf16 (or /proc/cpuinfo says nothing): no pair path"
    simd = fmha_native.info()["cpu_simd"]
    if simd != "avx512bf16":
        return (f"the CPU path is {simd!r} (FMHA_CPU_SIMD={os.environ.get('FMHA_CPU_SIMD')!r} "
                "caps it below avx512bf16)")
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def _run(q, k, v, **kw):
    """(out float32, lse, out bf16) as float64, both runs on the CPU."""
    out32, lse = fmha_native.forward(q, k, v, device="cpu", out_dtype="float32", **kw)
    out16, _ = fmha_native.forward(q, k, v, device="cpu", **kw)
    return as_f64(out32), as_f64(lse), as_f64(out16)


def _check(q, k, v, **kw):
    """Both outs against the reference: float32 out within the float32 bound, bf16 out
    within the bf16 one."""
    ref_kw = {key: val for key, val in kw.items() if key != "num_splits"}
    ref_out, ref_lse = reference.forward(q, k, v, **ref_kw)
    out32, lse, out16 = _run(q, k, v, **kw)
    assert_close(out32, lse, ref_out, ref_lse, "f32", what="float32 out:")
    assert_close(out16, lse, ref_out, ref_lse, "bf16", what="bf16 out:")
    return out32, lse


def test_explain_names_the_pair_level():
    q, k, v = make_qkv(np.random.default_rng(0), 1, 4, 8, 2, 2, 16, "bf16")
    assert fmha_native.explain(q, k, v, device="cpu")["kernel"].endswith(",avx512bf16>")
    # Other dtypes run the fp32 AVX-512 kernels, and explain() says so.
    q, k, v = make_qkv(np.random.default_rng(0), 1, 4, 8, 2, 2, 16, "f16")
    assert fmha_native.explain(q, k, v, device="cpu")["kernel"].endswith(",avx512>")


@pytest.mark.parametrize("head_dim", [1, 2, 17, 64, 80, 96, 128, 255, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(head_dim, causal):
    rng = np.random.default_rng(head_dim * 2 + causal)
    q, k, v = make_qkv(rng, 2, 37, 131, 4, 4, head_dim, "bf16")
    _check(q, k, v, causal=causal)


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 1), (1, 4099), (3, 7), (65, 65),
                                               (200, 129), (33, 1001)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_lengths_and_splits(seqlen_q, seqlen_k, num_splits):
    rng = np.random.default_rng(seqlen_q * 7 + seqlen_k + num_splits)
    q, k, v = make_qkv(rng, 2, seqlen_q, seqlen_k, 8, 2, 64, "bf16")
    _check(q, k, v, causal=True, num_splits=num_splits)
    _check(q, k, v, causal=False, num_splits=num_splits)


@pytest.mark.parametrize("heads_q,heads_kv", [(8, 2), (6, 1), (4, 4)])
def test_gqa(heads_q, heads_kv):
    rng = np.random.default_rng(heads_q * 10 + heads_kv)
    q, k, v = make_qkv(rng, 3, 19, 77, heads_q, heads_kv, 96, "bf16")
    _check(q, k, v, causal=True)
    # decode: one row per query head, the group packed into one tile
    _check(q[:, :1], k, v)


@pytest.mark.parametrize("feature", ["window", "softcap", "sinks", "all"])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_features(feature, num_splits):
    rng = np.random.default_rng(42 + num_splits)
    q, k, v = make_qkv(rng, 2, 45, 300, 4, 2, 80, "bf16")
    kw = {"causal": True, "num_splits": num_splits}
    if feature in ("window", "all"):
        kw["window"] = (37, 0)
    if feature in ("softcap", "all"):
        kw["softcap"] = 5.0
    if feature in ("sinks", "all"):
        kw["sinks"] = rng.standard_normal(4).astype(np.float32)
    _check(q, k, v, **kw)


def test_scale_and_large_logits():
    rng = np.random.default_rng(7)
    q, k, v = make_qkv(rng, 1, 50, 90, 2, 2, 33, "bf16")
    q = (as_f64(q) * 8).astype(q.dtype)
    _check(q, k, v, causal=False, softmax_scale=0.9)


def test_kv_cache_nan_past_length():
    rng = np.random.default_rng(11)
    q, k, v = make_qkv(rng, 3, 5, 160, 8, 2, 128, "bf16")
    lens = np.array([1, 77, 160], np.int32)
    for b, n in enumerate(lens):
        k[b, n:] = np.nan
        v[b, n:] = np.nan
    out32, _ = _check(q, k, v, causal=True, cache_seqlens=lens)
    assert np.isfinite(out32).all()


def test_append():
    rng = np.random.default_rng(12)
    q, k, v = make_qkv(rng, 2, 3, 100, 4, 2, 65, "bf16")
    k_new, v_new = randn(rng, (2, 3, 2, 65), "bf16"), randn(rng, (2, 3, 2, 65), "bf16")
    lens = np.array([10, 97], np.int32)
    kw = {"causal": True, "cache_seqlens": lens, "k_new": k_new, "v_new": v_new}
    ref_out, ref_lse = reference.forward(q, k, v, **kw)
    k1, v1 = k.copy(), v.copy()
    out, lse = fmha_native.forward(q, k1, v1, device="cpu", out_dtype="float32", **kw)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f32")
    for b, n in enumerate(lens):
        np.testing.assert_array_equal(as_f64(k1[b, n:n + 3]), as_f64(k_new[b]))


@pytest.mark.parametrize("head_dim", [64, 17])
def test_paged(head_dim):
    rng = np.random.default_rng(13 + head_dim)
    lengths = [5, 47, 130]
    k, v, table = paged_cache(rng, lengths, 16, 10, 2, head_dim, "bf16")
    q = randn(rng, (3, 4, 8, head_dim), "bf16")
    lens = np.array(lengths, np.int32)
    _check(q, k, v, causal=True, cache_seqlens=lens, block_table=table)
    _check(q, k, v, causal=True, cache_seqlens=lens, block_table=table, num_splits=3)


def test_packed():
    rng = np.random.default_rng(14)
    lq, lk = [3, 0, 40, 17], [9, 5, 40, 100]
    q, cu_q = packed(rng, lq, 4, 48, "bf16")
    k, cu_k = packed(rng, lk, 2, 48, "bf16")
    v, _ = packed(rng, lk, 2, 48, "bf16")
    kw = {"causal": True, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
          "max_seqlen_q": max(lq), "max_seqlen_k": max(lk)}
    _check(q, k, v, **kw)


@pytest.mark.parametrize("heads_q,heads_kv,head_dim", [(4, 4, 64), (8, 2, 17)])
def test_rows_independent(heads_q, heads_kv, head_dim):
    """Changing every other row (other query rows, other heads of a packed group) leaves
    a row's bits alone."""
    rng = np.random.default_rng(15)
    q, k, v = make_qkv(rng, 1, 40, 150, heads_q, heads_kv, head_dim, "bf16")
    q2 = randn(rng, q.shape, "bf16")
    keep = (0, 21, 1)  # row 21, head 1
    q2[keep] = q[keep]
    for kw in ({"causal": True}, {"causal": False, "num_splits": 2}):
        a, la = fmha_native.forward(q, k, v, device="cpu", out_dtype="float32", **kw)
        b, lb = fmha_native.forward(q2, k, v, device="cpu", out_dtype="float32", **kw)
        assert bits(a[keep]) == bits(b[keep])
        assert bits(la[0, 1, 21]) == bits(lb[0, 1, 21])
        assert not np.array_equal(as_f64(a), as_f64(b))


def test_nan_row_is_isolated():
    rng = np.random.default_rng(16)
    q, k, v = make_qkv(rng, 1, 33, 70, 4, 2, 64, "bf16")
    q[0, 5, 3, 7] = np.nan
    out, _ = fmha_native.forward(q, k, v, device="cpu", out_dtype="float32")
    bad = np.isnan(as_f64(out)).any(axis=-1)
    assert bad[0, 5, 3] and bad.sum() == 1


_OTHER_PATH = """
import hashlib, json, sys
import numpy as np
import fmha_native
sys.path.insert(0, TESTS)
from _harness import make_qkv, as_f64, bits
res = {"simd": fmha_native.info()["cpu_simd"]}
for dtype in ("bf16", "f16", "f32"):
    q, k, v = make_qkv(np.random.default_rng(17), 2, 70, 333, 8, 2, 96, dtype)
    out, lse = fmha_native.forward(q, k, v, device="cpu", causal=True, out_dtype="float32")
    res[dtype] = {"out": as_f64(out).ravel()[::7].tolist(),
                  "bits": hashlib.sha256(bits(out) + bits(lse)).hexdigest()}
print(json.dumps(res))
"""


def test_against_fp32_path():
    """bf16 agrees with FMHA_CPU_SIMD=avx512 (bf16 widened, fp32 FMA) to fp32 rounding
    (the scores differ only in where the scale is rounded in); f16 and f32 run the very
    same kernels, bit for bit."""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    got = {}
    for simd in ("avx512", "avx512bf16"):
        res = run_python(["-c", _OTHER_PATH.replace("TESTS", repr(tests_dir))],
                         {"FMHA_CPU_SIMD": simd})
        assert res.returncode == 0, res.stderr
        got[simd] = json.loads(res.stdout)
        assert got[simd]["simd"] == simd
    old, new = got["avx512"], got["avx512bf16"]
    assert rel_fro(np.array(new["bf16"]["out"]), np.array(old["bf16"]["out"])) <= 1e-6
    assert new["bf16"]["bits"] != old["bf16"]["bits"], "the pair path did not run"
    for dtype in ("f16", "f32"):
        assert new[dtype]["bits"] == old[dtype]["bits"], dtype
