"""Bad input raises TypeError or ValueError naming the argument, before anything is
written: checked on the CPU path (host arrays) with out= and lse= sentinels."""
import re

import numpy as np
import pytest

import fmha_native
from _harness import bits, dtype_name, make_qkv, randn

SENTINEL = 42.0


def dtype_name_or_none(dtype):
    try:
        return dtype_name(dtype)
    except ValueError:
        return None


def _problem(dtype="f32"):
    rng = np.random.default_rng(7000)
    q, k, v = make_qkv(rng, 2, 8, 24, 4, 2, 32, dtype)
    return q, k, v


def _expect(exc, pattern, q, k, v, **kw):
    """forward(...) raises exc whose message matches pattern (a word naming the
    argument); a sentinel out= (unless the case brings its own) stays untouched."""
    kw.setdefault("device", "cpu")
    sentinel = None
    if "out" not in kw and isinstance(q, np.ndarray) and q.ndim == 4 \
            and dtype_name_or_none(q.dtype) is not None:
        sentinel = np.full(q.shape, SENTINEL, dtype=q.dtype)
        kw["out"] = sentinel
    inputs = [bits(x) for x in (q, k, v) if isinstance(x, np.ndarray)]
    with pytest.raises(exc) as info:
        fmha_native.forward(q, k, v, **kw)
    msg = str(info.value)
    assert re.search(pattern, msg), f"message {msg!r} does not name {pattern!r}"
    if sentinel is not None:
        assert (sentinel.astype(np.float32) == SENTINEL).all(), "out was written before the error"
    assert [bits(x) for x in (q, k, v) if isinstance(x, np.ndarray)] == inputs
    return msg


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("ndim", [3, 5])
def test_wrong_ndim(which, ndim):
    q, k, v = _problem()
    args = {"q": q, "k": k, "v": v}
    x = args[which]
    args[which] = x[0] if ndim == 3 else x[None]
    _expect(ValueError, rf"\b{which}\b", args["q"], args["k"], args["v"])


@pytest.mark.parametrize("case", ["batch_k", "batch_v", "head_dim_k", "head_dim_v", "kv_seqlen",
                                  "kv_heads"])
def test_shape_mismatch(case):
    rng = np.random.default_rng(7100)
    q, k, v = _problem()
    if case == "batch_k":
        k = randn(rng, (3,) + k.shape[1:])
    elif case == "batch_v":
        v = randn(rng, (3,) + v.shape[1:])
    elif case == "head_dim_k":
        k = randn(rng, k.shape[:3] + (16,))
    elif case == "head_dim_v":
        v = randn(rng, v.shape[:3] + (16,))
    elif case == "kv_seqlen":
        v = randn(rng, (2, 25, 2, 32))
    else:
        v = randn(rng, (2, 24, 1, 32))
    _expect(ValueError, r"\b(k|v|batch|head_dim|shape)\b", q, k, v)


def test_heads_not_multiple():
    rng = np.random.default_rng(7200)
    q = randn(rng, (2, 8, 4, 32))
    k = randn(rng, (2, 24, 3, 32))
    v = randn(rng, (2, 24, 3, 32))
    _expect(ValueError, r"heads", q, k, v)


@pytest.mark.parametrize("which", ["k", "v"])
def test_mixed_dtypes(which):
    q, k, v = _problem()
    args = {"q": q, "k": k, "v": v}
    args[which] = args[which].astype(np.float16)
    _expect(TypeError, r"dtype", args["q"], args["k"], args["v"])


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.float64, np.complex64, bool])
def test_unsupported_dtype(dtype):
    q, k, v = _problem()
    _expect(TypeError, r"dtype|\bq\b", q.astype(dtype), k.astype(dtype), v.astype(dtype))


@pytest.mark.parametrize("value,exc", [(-1, ValueError), (1.5, TypeError), (True, TypeError),
                                       ("2", TypeError), (10**9, ValueError), (2.0, TypeError),
                                       (257, ValueError),
                                       (10**30, ValueError)])
def test_bad_num_splits(value, exc):
    q, k, v = _problem()
    _expect(exc, r"num_splits", q, k, v, num_splits=value)


@pytest.mark.parametrize("value,exc", [(float("nan"), ValueError), (float("inf"), ValueError),
                                       (float("-inf"), ValueError), ("0.1", TypeError),
                                       (1e400, ValueError)])
def test_bad_softmax_scale(value, exc):
    q, k, v = _problem()
    _expect(exc, r"softmax_scale", q, k, v, softmax_scale=value)


@pytest.mark.parametrize("value,exc", [("tpu", ValueError), ("", ValueError), ("CPU!", ValueError),
                                       (3, (TypeError, ValueError))])
def test_bad_device(value, exc):
    q, k, v = _problem()
    _expect(exc, r"device", q, k, v, device=value)


@pytest.mark.parametrize("value,exc", [(-1, ValueError), ("s", TypeError), (1.5, TypeError)])
def test_bad_stream(value, exc):
    q, k, v = _problem()
    _expect(exc, r"stream", q, k, v, stream=value)


def test_out_wrong_shape():
    q, k, v = _problem()
    _expect(ValueError, r"\bout\b", q, k, v, out=np.zeros((2, 8, 4, 16), np.float32))


def test_out_wrong_dtype():
    q, k, v = _problem()
    _expect((TypeError, ValueError), r"\bout\b", q, k, v, out=np.zeros(q.shape, np.float16))


def test_out_read_only():
    q, k, v = _problem()
    out = np.full(q.shape, SENTINEL, np.float32)
    out.flags.writeable = False
    _expect(ValueError, r"\bout\b", q, k, v, out=out)
    assert (out == SENTINEL).all()


@pytest.mark.parametrize("how", ["is_q", "view_of_q", "shares_k"])
def test_out_overlaps_input(how):
    q, k, v = _problem()
    q_copy = q.copy()
    if how == "is_q":
        out = q
    elif how == "view_of_q":
        out = q[:, ::-1]
    else:
        # k's memory reinterpreted as an array of q's shape.
        big = randn(np.random.default_rng(7300), (k.size,))
        k = big.reshape(k.shape)
        out = big[64:64 + q.size].reshape(q.shape)
    _expect(ValueError, r"\bout\b", q, k, v, out=out)
    assert bits(q) == bits(q_copy)


def test_out_overlaps_lse():
    q, k, v = _problem()
    backing = np.zeros(q.size + 64, np.float32)
    out = backing[:q.size].reshape(q.shape)
    lse = backing[q.size - 64:q.size].reshape(2, 4, 8)
    _expect(ValueError, r"\b(out|lse)\b", q, k, v, out=out, lse=lse)


@pytest.mark.parametrize("case", ["shape", "dtype", "read_only", "ndim"])
def test_bad_lse(case):
    q, k, v = _problem()
    if case == "shape":
        lse = np.zeros((2, 8, 4), np.float32)
    elif case == "dtype":
        lse = np.zeros((2, 4, 8), np.float64)
    elif case == "ndim":
        lse = np.zeros((2, 4, 8, 1), np.float32)
    else:
        lse = np.zeros((2, 4, 8), np.float32)
        lse.flags.writeable = False
    exc = (TypeError, ValueError) if case == "dtype" else ValueError
    _expect(exc, r"\blse\b", q, k, v, lse=lse)
    assert (lse == 0).all()


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("obj", [None, 3.0, "abc", [[[[1.0]]]], object()],
                         ids=["None", "float", "str", "list", "object"])
def test_non_array_objects(which, obj):
    q, k, v = _problem()
    args = {"q": q, "k": k, "v": v}
    args[which] = obj
    _expect(TypeError, rf"\b{which}\b", args["q"], args["k"], args["v"])


def test_non_array_out():
    q, k, v = _problem()
    with pytest.raises(TypeError, match=r"\bout\b"):
        fmha_native.forward(q, k, v, out=[0.0], device="cpu")


def test_unknown_keyword_and_positional():
    q, k, v = _problem()
    with pytest.raises(TypeError):
        fmha_native.forward(q, k, v, causel=True)
    with pytest.raises(TypeError):
        fmha_native.forward(q, k)
    with pytest.raises(TypeError):
        fmha_native.forward(q, k, v, True)


def test_zero_heads_or_head_dim():
    rng = np.random.default_rng(7400)
    q = randn(rng, (1, 4, 0, 16))
    k = randn(rng, (1, 4, 0, 16))
    _expect(ValueError, r"heads", q, k, k.copy())
    q = randn(rng, (1, 4, 2, 0))
    k = randn(rng, (1, 4, 1, 0))
    _expect(ValueError, r"head_dim", q, k, k.copy())


def test_explain_validates_like_forward():
    q, k, v = _problem()
    with pytest.raises(ValueError, match="num_splits"):
        fmha_native.explain(q, k, v, num_splits=-1, device="cpu")
    with pytest.raises(TypeError, match="dtype"):
        fmha_native.explain(q, k, v.astype(np.float16), device="cpu")
    with pytest.raises(ValueError, match="device"):
        fmha_native.explain(q, k, v, device="tpu")


@pytest.mark.parametrize("dtype, name", [
    (np.dtype(">f4"), "big-endian float32"), (np.dtype("<f4"), "float32"),
    (np.dtype(np.int64), "int64"), (np.dtype(">i8"), "big-endian int64"),
    (np.dtype(np.float64), "float64"), (np.dtype(np.int8), "int8"),
    (np.dtype(np.complex64), "complex64")])
def test_reference_dtype_names(dtype, name):
    from fmha_native import reference

    if not np.little_endian:
        pytest.skip("the expected names are written for a little-endian host")
    assert reference.dtype_name(dtype) == name


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("dtype, name", [(np.complex128, "complex128"), ("U3", "str96"),
                                         (object, "object")])
def test_reference_refuses_non_real_inputs(which, dtype, name):
    """The oracle reads real numbers only; anything else is a TypeError naming the
    argument and its dtype (complex values would otherwise lose their imaginary part)."""
    from fmha_native import reference

    q, k, v = _problem()
    args = {"q": q, "k": k, "v": v}
    args[which] = args[which].astype(dtype)
    with pytest.raises(TypeError, match=rf"^{which} must hold real numbers, got {name}$"):
        reference.forward(args["q"], args["k"], args["v"])
