"""Errors about dtypes name the argument, what it expects and the dtype the caller
passed, in the names users know (int16, float64, big-endian float32), for every kind
of producer: NumPy arrays, other buffer-protocol exporters (memoryview, array.array),
DLPack capsules (NumPy behind a minimal producer, hand-made capsules) and torch."""
import array
import ctypes
import re

import numpy as np
import pytest

import fmha_native
from _harness import DLPackOnly

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

# Struct-module format codes and the phrases of the old messages: a message that
# shows one of these is speaking in codes, not dtype names.
CODE_PHRASES = ("element format", "DLPack dtype (code", "format '")


def _qkv(dtype=np.float32):
    rng = np.random.default_rng(17)
    q = rng.standard_normal((2, 3, 4, 8)).astype(dtype)
    k = rng.standard_normal((2, 5, 2, 8)).astype(dtype)
    v = rng.standard_normal((2, 5, 2, 8)).astype(dtype)
    return q, k, v


def _message(exc_types, fn, *args, **kwargs):
    with pytest.raises(exc_types) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    for phrase in CODE_PHRASES:
        assert phrase not in msg, msg
    return msg


def _assert_names(msg, argument, got, expected=None):
    assert re.match(rf"{re.escape(argument)}\b", msg), msg
    assert msg.endswith(f"got {got}"), msg
    if expected is not None:
        assert expected in msg, msg


# ---- NumPy arrays -----------------------------------------------------------------

Q_EXPECTS = "must be float16 or bfloat16 (float32 on the CPU)"


@pytest.mark.parametrize("dtype,name", [
    (np.int16, "int16"),
    (np.float64, "float64"),
    (np.dtype(">f4"), "big-endian float32"),
    (np.dtype(">f2"), "big-endian float16"),
    (np.int64, "int64"),
    (np.int32, "int32"),
    (np.uint8, "uint8"),
    (np.bool_, "bool"),
    (np.complex64, "complex64"),
    (np.complex128, "complex128"),
])
def test_numpy_q(dtype, name):
    q, k, v = _qkv()
    msg = _message(TypeError, fmha_native.forward, q.astype(dtype), k, v, device="cpu")
    _assert_names(msg, "q", name, Q_EXPECTS)


def test_numpy_q_float8():
    if ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed")
    q, k, v = _qkv()
    msg = _message(TypeError, fmha_native.forward, q.astype(ml_dtypes.float8_e4m3fn), k, v,
                   device="cpu")
    _assert_names(msg, "q", "float8_e4m3fn", Q_EXPECTS)


@pytest.mark.parametrize("which", ["k", "v"])
@pytest.mark.parametrize("dtype,name", [(np.float64, "float64"), (np.dtype(">f4"),
                                                                  "big-endian float32"),
                                        (np.float16, "float16")])
def test_numpy_k_v_must_match_q(which, dtype, name):
    args = dict(zip("qkv", _qkv()))
    args[which] = args[which].astype(dtype)
    msg = _message(TypeError, fmha_native.forward, args["q"], args["k"], args["v"],
                   device="cpu")
    _assert_names(msg, which, name, "must have q's dtype float32")


def test_numpy_out_and_lse():
    q, k, v = _qkv()
    msg = _message((TypeError, ValueError), fmha_native.forward, q, k, v,
                   out=np.zeros(q.shape, np.float64), device="cpu")
    _assert_names(msg, "out", "float64", "q's dtype float32")
    msg = _message((TypeError, ValueError), fmha_native.forward, q, k, v,
                   lse=np.zeros((2, 4, 3), np.int16), device="cpu")
    _assert_names(msg, "lse", "int16", "must be float32")


@pytest.mark.parametrize("dtype,name", [(np.int64, "int64"), (np.int16, "int16"),
                                        (np.uint32, "uint32"), (np.float32, "float32"),
                                        (np.dtype(">i4"), "big-endian int32")])
def test_numpy_cache_seqlens(dtype, name):
    q, k, v = _qkv()
    msg = _message(TypeError, fmha_native.forward, q, k, v,
                   cache_seqlens=np.array([1, 2], dtype=dtype), device="cpu")
    _assert_names(msg, "cache_seqlens", name, "must be int32")


def test_numpy_combine():
    outs = np.zeros((2, 1, 3, 2, 8), np.float64)
    lses = np.zeros((2, 1, 2, 3), np.float32)
    msg = _message(TypeError, fmha_native.combine, outs, lses)
    _assert_names(msg, "outs", "float64", "float16, bfloat16 or float32")
    msg = _message(TypeError, fmha_native.combine, outs.astype(np.float32),
                   lses.astype(np.float16))
    _assert_names(msg, "lses", "float16", "must be float32")


# ---- other buffer-protocol exporters ----------------------------------------------

def _itemsize_name(code):
    return f"int{array.array(code).itemsize * 8}"


@pytest.mark.parametrize("make,name", [
    (lambda: array.array("q", [1, 2]), "int64"),
    (lambda: array.array("l", [1, 2]), _itemsize_name("l")),
    (lambda: array.array("h", [1, 2]), "int16"),
    (lambda: array.array("d", [1, 2]), "float64"),
    (lambda: array.array("B", [1, 2]), "uint8"),
    (lambda: memoryview(bytes(2)), "uint8"),
    (lambda: memoryview(np.array([1, 2], ">i4")), "big-endian int32"),
    (lambda: memoryview(np.array([1, 2], "?")), "bool"),
])
def test_buffer_cache_seqlens(make, name):
    q, k, v = _qkv()
    msg = _message(TypeError, fmha_native.forward, q, k, v, cache_seqlens=make(),
                   device="cpu")
    _assert_names(msg, "cache_seqlens", name, "must be int32")


@pytest.mark.parametrize("dtype,name", [(np.float64, "float64"),
                                        (np.dtype(">f4"), "big-endian float32"),
                                        (np.int16, "int16"), (np.complex64, "complex64")])
def test_memoryview_q(dtype, name):
    q, k, v = _qkv()
    msg = _message(TypeError, fmha_native.forward, memoryview(q.astype(dtype)), k, v,
                   device="cpu")
    _assert_names(msg, "q", name, Q_EXPECTS)


# ---- DLPack -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype,name", [(np.float64, "float64"), (np.int64, "int64"),
                                        (np.int8, "int8"), (np.uint16, "uint16"),
                                        (np.bool_, "bool"), (np.complex64, "complex64")])
def test_dlpack_q(dtype, name):
    q, k, v = _qkv()
    try:
        wrapped = DLPackOnly(q.astype(dtype))
        wrapped.__dlpack__()
    except (BufferError, TypeError) as exc:
        pytest.skip(f"this NumPy cannot export {name} through DLPack ({exc})")
    msg = _message(TypeError, fmha_native.forward, DLPackOnly(q.astype(dtype)), k, v,
                   device="cpu")
    _assert_names(msg, "q", name, Q_EXPECTS)


def test_dlpack_cache_seqlens_int64():
    q, k, v = _qkv()
    msg = _message(TypeError, fmha_native.forward, q, k, v,
                   cache_seqlens=DLPackOnly(np.array([1, 2], np.int64)), device="cpu")
    _assert_names(msg, "cache_seqlens", "int64", "must be int32")


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class HandMadeCapsule:
    """A legacy DLPack producer of a 1-D host tensor of any (code, bits, lanes), with no
    deleter; it keeps the memory the capsule points to alive."""

    _new_capsule = ctypes.pythonapi.PyCapsule_New
    _new_capsule.restype = ctypes.py_object
    _new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

    def __init__(self, code, bits, lanes, length=2):
        self._data = (ctypes.c_uint8 * 64)()
        self._shape = (ctypes.c_int64 * 1)(length)
        self._managed = _DLManagedTensor()
        t = self._managed.dl_tensor
        t.data = ctypes.addressof(self._data)
        t.device = _DLDevice(1, 0)
        t.ndim = 1
        t.dtype = _DLDataType(code, bits, lanes)
        t.shape = self._shape
        t.strides = None
        self._name = b"dltensor"

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return self._new_capsule(ctypes.addressof(self._managed), self._name, None)

    def __dlpack_device__(self):
        return (1, 0)


@pytest.mark.parametrize("code,bits,lanes,name", [
    (0, 64, 1, "int64"), (1, 8, 1, "uint8"), (2, 64, 1, "float64"), (4, 16, 1, "bfloat16"),
    (5, 64, 1, "complex64"), (5, 128, 1, "complex128"), (6, 8, 1, "bool"),
    (10, 8, 1, "float8_e4m3fn"), (12, 8, 1, "float8_e5m2"), (17, 4, 1, "float4_e2m1fn"),
    (2, 32, 4, "DLPack dtype code 2, 32 bits, 4 lanes"),
    (0, 12, 1, "DLPack dtype code 0, 12 bits, 1 lanes"),
    (99, 16, 1, "DLPack dtype code 99, 16 bits, 1 lanes"),
])
def test_dlpack_dtype_names(code, bits, lanes, name):
    q, k, v = _qkv()
    producer = HandMadeCapsule(code, bits, lanes)
    with pytest.raises(TypeError) as info:
        fmha_native.forward(q, k, v, cache_seqlens=producer, device="cpu")
    msg = str(info.value)
    _assert_names(msg, "cache_seqlens", name, "must be int32")


# ---- torch ------------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


def test_torch_cache_seqlens_int64():
    torch = _torch()
    q, k, v = (torch.from_numpy(a) for a in _qkv())
    seqlens = torch.tensor([1, 2])  # int64: the README's decode example without dtype=
    msg = _message(TypeError, fmha_native.forward, q, k, v, cache_seqlens=seqlens,
                   device="cpu")
    _assert_names(msg, "cache_seqlens", "int64", "must be int32")


def test_torch_q_float64():
    torch = _torch()
    q, k, v = (torch.from_numpy(a) for a in _qkv())
    msg = _message(TypeError, fmha_native.forward, q.double(), k, v, device="cpu")
    _assert_names(msg, "q", "float64", Q_EXPECTS)
