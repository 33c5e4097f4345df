"""GPU-only behaviour: torch CUDA and CuPy round trips, streams, CUDA graph capture,
device-placement errors, host arrays computed on the GPU, the GPU gate.  Every test
skips (saying so) when no GPU is visible; none passes without running on one."""
import numpy as np
import pytest

import fmha_native
from fmha_native import reference
from _harness import (NO_GPU_REASON, as_f64, assert_close, bits, gpu_devices, make_qkv, np_dtype,
                      torch_cuda)

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _need_gpu():
    if not gpu_devices():
        pytest.skip(NO_GPU_REASON)


@pytest.fixture
def torch():
    if not torch_cuda():
        pytest.skip("needs torch with CUDA")
    import torch as torch_module
    return torch_module


def _tdtype(torch, dtype):
    return {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype]


def _cuda(torch, x, dtype, device="cuda"):
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(device=device,
                                                                         dtype=_tdtype(torch, dtype))


@pytest.mark.parametrize("num_splits", [0, 1, 4])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_torch_cuda_round_trip(torch, dtype, head_dim, num_splits):
    rng = np.random.default_rng(11000)
    q, k, v = make_qkv(rng, 2, 100, 1000, 8, 2, head_dim, dtype)
    qd, kd, vd = (_cuda(torch, x, dtype) for x in (q, k, v))
    out, lse = fmha_native.forward(qd, kd, vd, causal=True, num_splits=num_splits)
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.dtype == qd.dtype
    assert out.device == qd.device and tuple(out.shape) == q.shape
    assert lse.dtype == torch.float32 and lse.is_cuda and tuple(lse.shape) == (2, 8, 100)
    ref_out, ref_lse = reference.forward(q, k, v, causal=True)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype)


def test_torch_cuda_out_given(torch):
    rng = np.random.default_rng(11050)
    q, k, v = make_qkv(rng, 1, 33, 200, 4, 4, 64, "f16")
    qd, kd, vd = (_cuda(torch, x, "f16") for x in (q, k, v))
    out = torch.full_like(qd, 3.0)
    lse = torch.full((1, 4, 33), 3.0, device="cuda")
    res = fmha_native.forward(qd, kd, vd, out=out, lse=lse)
    assert res[0] is out and res[1] is lse
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16")


def test_second_device(torch):
    if torch.cuda.device_count() < 2 or len(gpu_devices()) < 2:
        pytest.skip("needs two GPUs")
    rng = np.random.default_rng(11080)
    q, k, v = make_qkv(rng, 1, 17, 300, 4, 2, 128, "bf16")
    qd, kd, vd = (_cuda(torch, x, "bf16", device="cuda:1") for x in (q, k, v))
    out, lse = fmha_native.forward(qd, kd, vd, causal=True)
    assert out.device == qd.device and lse.device == qd.device
    ref_out, ref_lse = reference.forward(q, k, v, causal=True)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "bf16")


def test_cupy_round_trip():
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    rng = np.random.default_rng(11100)
    q, k, v = make_qkv(rng, 2, 50, 400, 8, 2, 64, "f16")
    qd, kd, vd = (cupy.asarray(x) for x in (q, k, v))
    out, lse = fmha_native.forward(qd, kd, vd, causal=True)
    assert type(out).__module__.startswith("cupy") and out.dtype == np.float16
    assert lse.dtype == np.float32
    ref_out, ref_lse = reference.forward(q, k, v, causal=True)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16")


class _DLPackOnly:
    """A device producer fmha_native does not know (like JAX): DLPack only."""

    def __init__(self, tensor):
        self._tensor = tensor

    def __dlpack__(self, **kw):
        return self._tensor.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._tensor.__dlpack_device__()


def test_unknown_device_producer_gets_fmha_tensor(torch):
    rng = np.random.default_rng(11150)
    q, k, v = make_qkv(rng, 1, 20, 130, 4, 2, 64, "f16")
    qd, kd, vd = (_cuda(torch, x, "f16") for x in (q, k, v))
    out, lse = fmha_native.forward(_DLPackOnly(qd), _DLPackOnly(kd), _DLPackOnly(vd))
    torch.cuda.synchronize()
    assert isinstance(out, fmha_native.Tensor)
    assert tuple(out.shape) == q.shape
    out_t, lse_t = torch.from_dlpack(out), torch.from_dlpack(lse)
    assert out_t.is_cuda and out_t.dtype == torch.float16
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out_t), as_f64(lse_t), ref_out, ref_lse, "f16")


@pytest.mark.parametrize("how", ["current_stream", "stream_argument"])
def test_non_default_stream_sees_pending_work(torch, how):
    """A big matmul on a side stream writes q just before the call; launching on that
    stream (the current one, or passed as stream=) must order after it."""
    rng = np.random.default_rng(11200)
    _, k, v = make_qkv(rng, 2, 128, 2048, 8, 2, 128, "f16")
    kd, vd = _cuda(torch, k, "f16"), _cuda(torch, v, "f16")
    n = 8192
    gen = torch.Generator(device="cuda").manual_seed(11200)
    a = torch.randn(n, n, device="cuda", dtype=torch.float16, generator=gen) / n ** 0.5
    b = torch.randn(n, n, device="cuda", dtype=torch.float16, generator=gen)
    c = torch.empty(n, n, device="cuda", dtype=torch.float16)
    qd = torch.full((2, 128, 8, 128), -1.0, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(4):  # several ms of work queued ahead of the attention
            torch.matmul(a, b, out=c)
        qd.copy_(c.view(-1)[:qd.numel()].view_as(qd))
        if how == "current_stream":
            out, lse = fmha_native.forward(qd, kd, vd, causal=True)
    if how == "stream_argument":
        out = torch.empty_like(qd)
        lse = torch.empty((2, 8, 128), device="cuda")
        fmha_native.forward(qd, kd, vd, causal=True, out=out, lse=lse, stream=side.cuda_stream)
    side.synchronize()
    q = qd.float().cpu().numpy()
    assert not (q == -1.0).all()
    ref_out, ref_lse = reference.forward(q, k, v, causal=True)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16")


@pytest.mark.parametrize("num_splits", [1, 3, 0])
def test_cuda_graph_capture(torch, num_splits):
    """Captured with torch.cuda.graph, replay gives the same bits as an eager call."""
    rng = np.random.default_rng(11300)
    q, k, v = make_qkv(rng, 2, 1, 4096, 16, 4, 128, "bf16")
    qd, kd, vd = (_cuda(torch, x, "bf16") for x in (q, k, v))
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(2):
            fmha_native.forward(qd, kd, vd, causal=True, num_splits=num_splits)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g, lse_g = fmha_native.forward(qd, kd, vd, causal=True, num_splits=num_splits)
    for seed in (1, 2):
        q_new = make_qkv(np.random.default_rng(11300 + seed), 2, 1, 1, 16, 4, 128, "bf16")[0]
        qd.copy_(_cuda(torch, q_new, "bf16"))
        graph.replay()
        out_e, lse_e = fmha_native.forward(qd, kd, vd, causal=True, num_splits=num_splits)
        torch.cuda.synchronize()
        assert bits(out_g) == bits(out_e) and bits(lse_g) == bits(lse_e)
        ref_out, ref_lse = reference.forward(q_new, k, v, causal=True)
        assert_close(as_f64(out_g), as_f64(lse_g), ref_out, ref_lse, "bf16")


def test_mixed_devices_refused(torch):
    rng = np.random.default_rng(11400)
    q, k, v = make_qkv(rng, 1, 4, 64, 2, 1, 64, "f16")
    qd = _cuda(torch, q, "f16")
    kc, vc = torch.from_numpy(k), torch.from_numpy(v)
    with pytest.raises(ValueError, match=r"device|\bk\b"):
        fmha_native.forward(qd, kc, vc)
    with pytest.raises(ValueError, match=r"device|\bk\b|\bv\b"):
        fmha_native.forward(qd, k, v)  # NumPy k/v with a CUDA q
    out_host = torch.empty(q.shape, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"\bout\b|device"):
        fmha_native.forward(qd, _cuda(torch, k, "f16"), _cuda(torch, v, "f16"), out=out_host)


def test_device_head_dim_stride_refused(torch):
    rng = np.random.default_rng(11450)
    q, k, v = make_qkv(rng, 1, 4, 64, 2, 1, 64, "f16")
    q_wide = _cuda(torch, np.repeat(q, 2, axis=-1), "f16")[..., ::2]
    assert q_wide.stride(-1) == 2
    with pytest.raises(ValueError, match=r"\bq\b"):
        fmha_native.forward(q_wide, _cuda(torch, k, "f16"), _cuda(torch, v, "f16"))


def test_cuda_tensors_with_device_cpu_refused(torch):
    rng = np.random.default_rng(11500)
    q, k, v = make_qkv(rng, 1, 4, 64, 2, 1, 64, "f16")
    with pytest.raises(ValueError, match="device|cpu"):
        fmha_native.forward(*(_cuda(torch, x, "f16") for x in (q, k, v)), device="cpu")


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("num_splits", [0, 1, 3])
def test_host_numpy_on_gpu(dtype, num_splits):
    rng = np.random.default_rng(11600)
    q, k, v = make_qkv(rng, 2, 70, 600, 8, 2, 128, dtype)
    out, lse = fmha_native.forward(q, k, v, causal=True, device="gpu", num_splits=num_splits)
    assert isinstance(out, np.ndarray) and out.dtype == np_dtype(dtype)
    ref_out, ref_lse = reference.forward(q, k, v, causal=True)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype)
    plan = fmha_native.explain(q, k, v, causal=True, device="gpu")
    assert plan["backend"] == "gpu"


def test_host_numpy_cache_append_on_gpu():
    """Host caches computed on the GPU: the append reaches the caller's arrays."""
    rng = np.random.default_rng(11650)
    q, k, v = make_qkv(rng, 2, 1, 256, 8, 2, 64, "f16")
    k_new, v_new = make_qkv(rng, 2, 1, 1, 2, 2, 64, "f16")[1:]
    lens = np.array([10, 200], np.int32)
    k_expected, v_expected = reference.append_kv(k, v, lens, k_new, v_new)
    ref_out, ref_lse = reference.forward(q, k, v, cache_seqlens=lens, k_new=k_new, v_new=v_new)
    out, lse = fmha_native.forward(q, k, v, cache_seqlens=lens, k_new=k_new, v_new=v_new,
                                   device="gpu")
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16")
    assert np.array_equal(reference.to_float64(k), k_expected)
    assert np.array_equal(reference.to_float64(v), v_expected)


def test_gpu_float32_refused():
    rng = np.random.default_rng(11700)
    q, k, v = make_qkv(rng, 1, 4, 64, 2, 1, 64, "f32")
    with pytest.raises((NotImplementedError, TypeError), match="float32|dtype"):
        fmha_native.forward(q, k, v, device="gpu")


@pytest.mark.parametrize("head_dim", [32, 80, 96, 256])
def test_gpu_gate_and_not_implemented(head_dim):
    """A head_dim the gate rejects raises NotImplementedError that points to device="cpu";
    one it admits matches the reference."""
    rng = np.random.default_rng(11750)
    q, k, v = make_qkv(rng, 1, 20, 100, 2, 1, head_dim, "f16")
    plan = fmha_native.explain(q, k, v, device="gpu")
    assert plan["backend"] == "gpu" and "head_dim" in plan["gate"]
    if plan["gate"]["head_dim"]["met"]:
        out, lse = fmha_native.forward(q, k, v, device="gpu")
        ref_out, ref_lse = reference.forward(q, k, v)
        assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16")
    else:
        with pytest.raises(NotImplementedError, match="cpu") as info:
            fmha_native.forward(q, k, v, device="gpu")
        assert "head_dim" in str(info.value)


def test_gpu_explain_names_device():
    rng = np.random.default_rng(11800)
    q, k, v = make_qkv(rng, 1, 1, 16384, 32, 8, 128, "bf16")
    plan = fmha_native.explain(q, k, v, device="gpu")
    assert plan["backend"] == "gpu"
    names = {d["name"] for d in gpu_devices()}
    assert any(name in str(plan) for name in names), plan
    assert all(item["met"] for item in plan["gate"].values()), plan["gate"]
    # Decode with batch 1 and 8 kv heads under-fills any current GPU: the heuristic splits.
    assert plan["num_splits"] > 1, plan["reason"]


def test_gpu_matches_cpu(torch):
    rng = np.random.default_rng(11900)
    q, k, v = make_qkv(rng, 2, 64, 512, 8, 2, 128, "bf16")
    out_c, lse_c = fmha_native.forward(q, k, v, causal=True, device="cpu")
    out_g, lse_g = fmha_native.forward(*(_cuda(torch, x, "bf16") for x in (q, k, v)), causal=True)
    ref_out, ref_lse = reference.forward(q, k, v, causal=True)
    assert_close(as_f64(out_c), as_f64(lse_c), ref_out, ref_lse, "bf16")
    assert_close(as_f64(out_g), as_f64(lse_g), ref_out, ref_lse, "bf16")
