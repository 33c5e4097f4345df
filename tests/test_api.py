"""The Python surface: output kinds and dtypes, out=/lse=, return_lse, inputs left
untouched, reference counts, explain() and info()."""
import gc
import sys
import time

import numpy as np
import pytest

import fmha_native
from fmha_native import reference
from _harness import as_f64, assert_close, bits, make_qkv, np_dtype

EXPLAIN_KEYS = {"backend", "kernel", "num_splits", "block_m", "block_n", "pack_gqa", "reason", "gate"}
INFO_KEYS = {"version", "backends", "devices", "cpu_threads", "cpu_simd"}


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_output_kind_dtype_shape(cpu, dtype):
    rng = np.random.default_rng(6000)
    q, k, v = make_qkv(rng, 2, 9, 31, 6, 3, 32, dtype)
    out, lse = fmha_native.forward(q, k, v, device="cpu")
    assert isinstance(out, np.ndarray) and isinstance(lse, np.ndarray)
    assert out.dtype == np_dtype(dtype) and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (2, 6, 9)
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype)


def test_return_lse_false(backend):
    dtype = "f16" if backend.is_gpu else "f32"
    rng = np.random.default_rng(6100)
    q, k, v = make_qkv(rng, 2, 9, 31, 4, 2, 64, dtype)
    res = backend.forward_native(q, k, v, return_lse=False)
    assert not isinstance(res, tuple)
    assert tuple(res.shape) == q.shape
    ref_out = reference.forward(q, k, v, return_lse=False)
    assert_close(as_f64(res), None, ref_out, None, dtype)
    # Same values as with the lse requested.
    out, _ = backend.forward_native(q, k, v)
    assert bits(out) == bits(res)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("return_lse", [True, False])
def test_out_and_lse_given(cpu, num_splits, return_lse):
    rng = np.random.default_rng(6200)
    q, k, v = make_qkv(rng, 2, 20, 300, 4, 2, 64, "f32")
    out = np.full(q.shape, 7.0, dtype=np.float32)
    lse = np.full((2, 4, 20), 7.0, dtype=np.float32)
    expected_out, expected_lse = fmha_native.forward(q, k, v, device="cpu", num_splits=num_splits)
    kw = {"out": out, "return_lse": return_lse, "num_splits": num_splits, "device": "cpu"}
    if return_lse:
        kw["lse"] = lse
    res = fmha_native.forward(q, k, v, **kw)
    if return_lse:
        assert res[0] is out and res[1] is lse
        assert bits(lse) == bits(expected_lse)
    else:
        assert res is out
    assert bits(out) == bits(expected_out)


def test_lse_given_alone(cpu):
    rng = np.random.default_rng(6250)
    q, k, v = make_qkv(rng, 1, 5, 70, 2, 1, 16, "bf16")
    lse = np.empty((1, 2, 5), dtype=np.float32)
    out, lse_res = fmha_native.forward(q, k, v, lse=lse, device="cpu")
    assert lse_res is lse
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "bf16")


def test_out_given_strided(cpu):
    """out may be any writable view of the right shape and dtype; only it is written."""
    rng = np.random.default_rng(6260)
    q, k, v = make_qkv(rng, 2, 10, 50, 4, 2, 32, "f32")
    backing = np.full((2, 4, 10, 32 * 2), 5.0, dtype=np.float32)
    out = backing.transpose(0, 2, 1, 3)[..., ::2]
    res, _ = fmha_native.forward(q, k, v, out=out, device="cpu")
    assert res is out
    ref_out = reference.forward(q, k, v, return_lse=False)
    assert_close(as_f64(out), None, ref_out, None, "f32")
    assert (backing[..., 1::2] == 5.0).all(), "wrote outside out"


@pytest.mark.parametrize("num_splits", [0, 1, 3])
def test_inputs_unchanged(backend, num_splits):
    dtype = "f16" if backend.is_gpu else "f32"
    rng = np.random.default_rng(6300)
    q, k, v = make_qkv(rng, 2, 40, 300, 8, 2, 64, dtype)
    q[0, 1, 2, 3] = np.nan
    if backend.use_torch:
        qd, kd, vd = backend.put(q), backend.put(k), backend.put(v)
        before = [x.clone() for x in (qd, kd, vd)]
        fmha_native.forward(qd, kd, vd, causal=True, num_splits=num_splits)
        for x, y in zip((qd, kd, vd), before):
            assert bits(x) == bits(y)
        return
    before = [bits(x) for x in (q, k, v)]
    backend.forward_native(q, k, v, causal=True, num_splits=num_splits)
    assert [bits(x) for x in (q, k, v)] == before


def test_refcounts_stable(cpu):
    rng = np.random.default_rng(6400)
    q, k, v = make_qkv(rng, 1, 4, 16, 2, 1, 16, "f32")
    out = np.empty_like(q)
    lse = np.empty((1, 2, 4), dtype=np.float32)
    objs = (q, k, v, out, lse)
    gc.collect()
    before = [sys.getrefcount(x) for x in objs]
    for i in range(1000):
        fmha_native.forward(q, k, v, device="cpu", causal=bool(i & 1))
        fmha_native.forward(q, k, v, out=out, lse=lse, device="cpu", num_splits=1 + (i % 3))
        fmha_native.forward(q, k, v, out=out, return_lse=False, device="cpu")
        fmha_native.explain(q, k, v, device="cpu")
        with pytest.raises(ValueError):
            fmha_native.forward(q, k, v, out=out, lse=lse[:, :1], device="cpu")
    gc.collect()
    assert [sys.getrefcount(x) for x in objs] == before


def test_no_leak_over_many_calls(cpu):
    """Memory traced by Python (outputs, views, error objects) does not grow with calls."""
    import tracemalloc
    rng = np.random.default_rng(6450)
    q, k, v = make_qkv(rng, 1, 8, 64, 2, 1, 32, "f32")

    def burst():
        for _ in range(300):
            fmha_native.forward(q, k, v, device="cpu")
            with pytest.raises(TypeError):
                fmha_native.forward(q, k, v.astype(np.float16), device="cpu")

    burst()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        burst()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes still held after 300 calls"


def test_explain_keys(backend):
    dtype = "f16" if backend.is_gpu else "f32"
    rng = np.random.default_rng(6500)
    q, k, v = make_qkv(rng, 2, 16, 500, 8, 2, 64, dtype)
    plan = fmha_native.explain(backend.put(q), backend.put(k), backend.put(v), causal=True,
                               **backend.device_kw())
    assert EXPLAIN_KEYS <= set(plan), f"missing {EXPLAIN_KEYS - set(plan)}"
    assert plan["backend"] == backend.name
    assert isinstance(plan["kernel"], str) and plan["kernel"]
    assert isinstance(plan["reason"], str) and plan["reason"]
    for key in ("num_splits", "block_m", "block_n"):
        assert isinstance(plan[key], int) and plan[key] >= 1, key
    assert isinstance(plan["gate"], dict) and plan["gate"]
    for name, item in plan["gate"].items():
        assert isinstance(name, str)
        assert isinstance(item["met"], bool) and isinstance(item["why"], str) and item["why"]


def test_explain_cpu_gate_reports_unsupported_head_dim(cpu):
    rng = np.random.default_rng(6510)
    q, k, v = make_qkv(rng, 1, 2, 8, 1, 1, 300, "f32")
    try:
        plan = fmha_native.explain(q, k, v, device="cpu")
    except (NotImplementedError, ValueError) as exc:
        assert "head_dim" in str(exc)
    else:
        assert plan["gate"]["head_dim"]["met"] is False
    with pytest.raises((NotImplementedError, ValueError), match="head_dim"):
        fmha_native.forward(q, k, v, device="cpu")


def test_explain_runs_nothing(cpu):
    """explain() neither writes out nor does the work: on a problem that would take
    minutes (zero-stride inputs, so no memory) it answers at once."""
    rng = np.random.default_rng(6600)
    shape_q, shape_kv = (8, 32768, 32, 128), (8, 32768, 8, 128)
    q = np.broadcast_to(rng.standard_normal((1, 1, 1, 128), dtype=np.float32), shape_q)
    k = np.broadcast_to(rng.standard_normal((1, 1, 1, 128), dtype=np.float32), shape_kv)
    v = np.broadcast_to(rng.standard_normal((1, 1, 1, 128), dtype=np.float32), shape_kv)
    start = time.perf_counter()
    plan = fmha_native.explain(q, k, v, causal=True, device="cpu")
    assert time.perf_counter() - start < 5.0
    assert plan["backend"] == "cpu"
    small_q, small_k, small_v = make_qkv(rng, 1, 4, 16, 2, 1, 16, "f32")
    out = np.full(small_q.shape, 3.0, dtype=np.float32)
    lse = np.full((1, 2, 4), 3.0, dtype=np.float32)
    fmha_native.explain(small_q, small_k, small_v, out=out, lse=lse, device="cpu")
    assert (out == 3.0).all() and (lse == 3.0).all()


def test_info_keys():
    info = fmha_native.info()
    assert INFO_KEYS <= set(info), f"missing {INFO_KEYS - set(info)}"
    assert info["version"] == "0.1.0"
    assert "cpu" in info["backends"]
    assert set(info["backends"]) <= {"cpu", "cuda", "hip"}
    assert isinstance(info["devices"], list)
    for dev in info["devices"]:
        assert {"ordinal", "name", "arch", "sm_count"} <= set(dev)
    assert isinstance(info["cpu_threads"], int) and info["cpu_threads"] >= 1
    assert info["cpu_simd"] in ("avx512", "avx2", "scalar")
    assert issubclass(fmha_native.FmhaError, RuntimeError)


def test_public_names():
    for name in ("forward", "explain", "combine", "info", "FmhaError", "Tensor", "reference"):
        assert hasattr(fmha_native, name), name


def test_device_none_host_arrays_run(cpu):
    """device=None with host arrays runs somewhere (GPU when present and admitted, else
    CPU) and gives the reference result."""
    rng = np.random.default_rng(6700)
    q, k, v = make_qkv(rng, 1, 10, 70, 4, 2, 64, "f16")
    out, lse = fmha_native.forward(q, k, v, causal=True)
    ref_out, ref_lse = reference.forward(q, k, v, causal=True)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16")


@pytest.mark.parametrize("name", ["cuda", "hip", "gpu"])
def test_device_gpu_without_gpu(name):
    if fmha_native.info()["devices"]:
        pytest.skip("a GPU is visible: this checks the no-GPU error")
    rng = np.random.default_rng(6800)
    q, k, v = make_qkv(rng, 1, 2, 8, 1, 1, 64, "f16")
    with pytest.raises(ValueError, match="device|GPU|gpu"):
        fmha_native.forward(q, k, v, device=name)
