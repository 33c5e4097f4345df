"""Inputs through DLPack (NumPy's exporter behind a minimal producer, versioned and
legacy capsules, PyTorch CPU tensors) and through the buffer protocol (ml_dtypes bf16)."""
import gc
import re
import sys

import numpy as np
import pytest

import fmha_native
from fmha_native import reference
from _harness import DLPackOnly, as_f64, assert_close, bits, make_qkv, np_dtype


class LegacyDLPack:
    """An old producer: __dlpack__ takes only stream and returns a legacy capsule."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


@pytest.mark.parametrize("wrapper", [DLPackOnly, LegacyDLPack], ids=["versioned", "legacy"])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_numpy_dlpack_inputs(wrapper, dtype):
    rng = np.random.default_rng(9000)
    q, k, v = make_qkv(rng, 2, 13, 77, 4, 2, 64, dtype)
    kt = np.ascontiguousarray(k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # strided
    out, lse = fmha_native.forward(wrapper(q), wrapper(kt), wrapper(v), causal=True, device="cpu")
    assert tuple(out.shape) == q.shape and tuple(lse.shape) == (2, 4, 13)
    ref_out, ref_lse = reference.forward(q, k, v, causal=True)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype)


def test_dlpack_producer_was_used():
    rng = np.random.default_rng(9050)
    q, k, v = make_qkv(rng, 1, 3, 10, 2, 1, 16, "f32")
    wq = DLPackOnly(q)
    fmha_native.forward(wq, k, v, device="cpu")
    assert wq.calls >= 1


def test_dlpack_out_given():
    rng = np.random.default_rng(9100)
    q, k, v = make_qkv(rng, 2, 5, 40, 4, 2, 32, "f32")
    out = np.full(q.shape, 9.0, np.float32)
    lse = np.full((2, 4, 5), 9.0, np.float32)
    res = fmha_native.forward(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v), out=DLPackOnly(out),
                              lse=DLPackOnly(lse), device="cpu")
    assert len(res) == 2
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f32")


def test_dlpack_read_only_out_refused():
    rng = np.random.default_rng(9150)
    q, k, v = make_qkv(rng, 1, 5, 40, 2, 1, 32, "f32")
    out = np.full(q.shape, 9.0, np.float32)
    out.flags.writeable = False
    with pytest.raises((ValueError, BufferError), match=r"\bout\b|read"):
        fmha_native.forward(q, k, v, out=DLPackOnly(out), device="cpu")
    assert (out == 9.0).all()


def test_dlpack_read_only_inputs_accepted():
    rng = np.random.default_rng(9160)
    q, k, v = make_qkv(rng, 1, 5, 40, 2, 1, 32, "f32")
    for x in (q, k, v):
        x.flags.writeable = False
    out, lse = fmha_native.forward(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v), device="cpu")
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f32")


@pytest.mark.parametrize("wrapper", [DLPackOnly, LegacyDLPack], ids=["versioned", "legacy"])
def test_dlpack_refcounts_stable(wrapper):
    """Every capsule is released: the arrays behind the producers are not kept alive."""
    rng = np.random.default_rng(9200)
    q, k, v = make_qkv(rng, 1, 3, 10, 2, 1, 16, "f32")
    wq, wk, wv = wrapper(q), wrapper(k), wrapper(v)
    gc.collect()
    before = [sys.getrefcount(x) for x in (q, k, v, wq, wk, wv)]
    for _ in range(500):
        fmha_native.forward(wq, wk, wv, device="cpu")
        with pytest.raises(ValueError):
            fmha_native.forward(wq, wk, wv, num_splits=-1, device="cpu")
    gc.collect()
    assert [sys.getrefcount(x) for x in (q, k, v, wq, wk, wv)] == before


@pytest.mark.parametrize("wrapper", [DLPackOnly, LegacyDLPack], ids=["versioned", "legacy"])
def test_dlpack_refused_views_release_their_capsules(wrapper):
    """A capsule whose tensor was read and then refused (a dtype no argument takes, a
    read-only or too-many-dimensions out) is deleted: nothing keeps its array alive."""
    rng = np.random.default_rng(9250)
    q, k, v = make_qkv(rng, 1, 3, 10, 2, 1, 16, "f32")
    q64 = q.astype(np.float64)
    read_only = np.zeros(q.shape, np.float32)
    read_only.flags.writeable = False
    deep = np.zeros((1,) * 9, np.float32)
    arrays = (q64, read_only, deep)
    gc.collect()
    before = [sys.getrefcount(x) for x in arrays]
    for _ in range(200):
        with pytest.raises(TypeError, match=r"^q .*got float64$"):
            fmha_native.forward(wrapper(q64), k, v, device="cpu")
        with pytest.raises((ValueError, BufferError)):
            fmha_native.forward(q, k, v, out=wrapper(read_only), device="cpu")
        with pytest.raises(ValueError, match="dimensions"):
            fmha_native.forward(q, k, v, out=wrapper(deep), device="cpu")
    gc.collect()
    assert [sys.getrefcount(x) for x in arrays] == before


def test_ml_dtypes_bf16_round_trip():
    rng = np.random.default_rng(9300)
    q, k, v = make_qkv(rng, 2, 9, 50, 4, 1, 64, "bf16")
    out, lse = fmha_native.forward(q, k, v, device="cpu")
    assert out.dtype == np_dtype("bf16") and isinstance(out, np.ndarray)
    assert lse.dtype == np.float32
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "bf16")


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed")


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_torch_cpu_round_trip(dtype):
    torch = _torch()
    tdtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    gen = torch.Generator().manual_seed(9400)
    q = torch.randn(2, 21, 8, 64, generator=gen).to(tdtype)
    k = torch.randn(2, 90, 2, 64, generator=gen).to(tdtype)
    v = torch.randn(2, 90, 2, 64, generator=gen).to(tdtype)
    out, lse = fmha_native.forward(q, k, v, causal=True, device="cpu")
    assert isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)
    assert out.dtype == tdtype and out.device.type == "cpu" and tuple(out.shape) == (2, 21, 8, 64)
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (2, 8, 21)
    ref_out, ref_lse = reference.forward(q, k, v, causal=True)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype)
    # And the same answer as from NumPy-side inputs.
    if dtype != "bf16":
        np_out, _ = fmha_native.forward(q.numpy(), k.numpy(), v.numpy(), causal=True, device="cpu")
        assert bits(np_out) == bits(out)


def test_torch_cpu_default_device():
    """device=None with torch CPU tensors computes (on the CPU, or on a GPU for host
    inputs) and returns torch tensors."""
    torch = _torch()
    gen = torch.Generator().manual_seed(9450)
    q = torch.randn(1, 5, 4, 64, generator=gen).half()
    k = torch.randn(1, 40, 2, 64, generator=gen).half()
    v = torch.randn(1, 40, 2, 64, generator=gen).half()
    out, lse = fmha_native.forward(q, k, v)
    assert isinstance(out, torch.Tensor) and out.device.type == "cpu"
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16")


def test_torch_cpu_strided_and_out_given():
    torch = _torch()
    gen = torch.Generator().manual_seed(9500)
    q = torch.randn(2, 8, 17, 32, generator=gen).transpose(1, 2)  # [b, s, h, d] view
    k = torch.randn(2, 60, 4, 64, generator=gen)[..., ::2]         # head_dim stride 2
    v = torch.randn(2, 60, 4, 32, generator=gen)
    out = torch.full((2, 17, 8, 32), 4.0)
    lse = torch.full((2, 8, 17), 4.0)
    q0, k0, v0 = q.clone(), k.clone(), v.clone()
    res_out, res_lse = fmha_native.forward(q, k, v, out=out, lse=lse, device="cpu")
    assert res_out is out and res_lse is lse
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f32")
    assert torch.equal(q, q0) and torch.equal(k, k0) and torch.equal(v, v0)


def test_torch_refcounts_stable():
    torch = _torch()
    q = torch.randn(1, 4, 2, 16)
    k = torch.randn(1, 8, 1, 16)
    v = torch.randn(1, 8, 1, 16)
    gc.collect()
    before = [sys.getrefcount(x) for x in (q, k, v)]
    for _ in range(300):
        fmha_native.forward(q, k, v, device="cpu")
    gc.collect()
    assert [sys.getrefcount(x) for x in (q, k, v)] == before


def test_torch_requires_grad_input():
    """A tensor that requires grad is either read (forward only) or refused with a
    TypeError/ValueError naming it; never a crash or a silent wrong answer."""
    torch = _torch()
    gen = torch.Generator().manual_seed(9600)
    q = torch.randn(1, 4, 2, 16, generator=gen, requires_grad=True)
    k = torch.randn(1, 8, 1, 16, generator=gen)
    v = torch.randn(1, 8, 1, 16, generator=gen)
    try:
        out, lse = fmha_native.forward(q, k, v, device="cpu")
    except (TypeError, ValueError, BufferError, RuntimeError) as exc:
        assert re.search(r"\bq\b", str(exc)), str(exc)
        return
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f32")


def test_torch_cpu_device_gpu_without_gpu():
    torch = _torch()
    if fmha_native.info()["devices"]:
        pytest.skip("a GPU is visible: host torch tensors may legitimately run there")
    q = torch.randn(1, 4, 2, 64).half()
    k = torch.randn(1, 8, 1, 64).half()
    with pytest.raises(ValueError, match="device|GPU|gpu"):
        fmha_native.forward(q, k, k.clone(), device="gpu")
