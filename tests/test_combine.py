"""combine(): merging partial attention states, as context parallelism does over KV
shards; empty partials and all-empty rows; out=/lse=; bad inputs."""
import numpy as np
import pytest

import fmha_native
from fmha_native import reference
from _harness import as_f64, assert_close, bits, make_qkv, np_dtype, randn


def _stack(xs):
    """Stack partial results (native kind) along a new leading axis, same kind."""
    if type(xs[0]).__module__.startswith("torch"):
        import torch
        return torch.stack(list(xs))
    return np.stack([np.asarray(x) for x in xs])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("cuts", [(0, 300, 700, 1000), (0, 0, 1000), (0, 1, 999, 1000),
                                  (0, 1000, 1000)], ids=["3shards", "empty_first", "tiny", "empty_last"])
def test_shards_equal_one_pass(backend, cuts, causal):
    """forward over key shards + combine == forward over all keys.

    Causal over shards: each shard holds keys [c0, c1) of seqlen_k; with seqlen_q = 1 the
    single row sees every key, so per-shard causal equals the global mask.
    """
    dtypes = ("f16", "bf16") if backend.is_gpu else ("f32", "f16")
    rng = np.random.default_rng(8000)
    for dtype in dtypes:
        seqlen_q = 1 if causal else 37
        q, k, v = make_qkv(rng, 2, seqlen_q, cuts[-1], 8, 2, 64, dtype)
        backend.require(q, k, v)
        outs, lses = [], []
        for c0, c1 in zip(cuts[:-1], cuts[1:]):
            out, lse = backend.forward_native(q, k[:, c0:c1], v[:, c0:c1], causal=causal)
            outs.append(out)
            lses.append(lse)
        merged_out, merged_lse = fmha_native.combine(_stack(outs), _stack(lses))
        ref_out, ref_lse = reference.forward(q, k, v, causal=causal)
        # Each partial was rounded to dtype once and the merge rounds again: still
        # within the one-pass bound.
        assert_close(as_f64(merged_out), as_f64(merged_lse), ref_out, ref_lse, dtype)
        if isinstance(merged_out, np.ndarray):
            assert merged_out.dtype == np_dtype(dtype) and merged_lse.dtype == np.float32


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("groups", [1, 2, 5])
def test_combine_matches_reference(backend, dtype, groups):
    backend.skip_unsupported(dtype)
    rng = np.random.default_rng(8100 + groups)
    outs = randn(rng, (groups, 2, 7, 4, 64), dtype)
    lses = (rng.standard_normal((groups, 2, 4, 7)) * 3).astype(np.float32)
    lses[0, 1, 2, 3] = -np.inf  # one empty partial inside a non-empty row
    out, lse = fmha_native.combine(backend.put(outs), backend.put(lses))
    ref_out, ref_lse = reference.combine(outs, lses)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, dtype)


def test_combine_empty_rows(backend):
    """All partials -inf: out = 0, lse = -inf, no NaN, whatever the partial outs hold."""
    dtype = "f16" if backend.is_gpu else "f32"
    rng = np.random.default_rng(8200)
    outs = randn(rng, (3, 2, 5, 4, 64), dtype, scale=100.0)
    lses = rng.standard_normal((3, 2, 4, 5)).astype(np.float32)
    lses[:, 0, 1, :] = -np.inf      # rows (0, :, 1) empty in every partial
    lses[:, 1, :, 4] = -np.inf      # rows (1, 4, :) empty too
    lses[1, 1, 2, 0] = -np.inf      # one empty partial in a non-empty row
    out, lse = fmha_native.combine(backend.put(outs), backend.put(lses))
    out, lse = as_f64(out), as_f64(lse)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert (out[0, :, 1] == 0).all() and np.isneginf(lse[0, 1]).all()
    assert (out[1, 4] == 0).all() and np.isneginf(lse[1, :, 4]).all()
    ref_out, ref_lse = reference.combine(outs, lses)
    assert_close(out, lse, ref_out, ref_lse, dtype)


def test_combine_all_empty(backend):
    dtype = "f16" if backend.is_gpu else "f32"
    rng = np.random.default_rng(8250)
    outs = randn(rng, (2, 1, 3, 2, 64), dtype)
    lses = np.full((2, 1, 2, 3), -np.inf, np.float32)
    out, lse = fmha_native.combine(backend.put(outs), backend.put(lses))
    assert (as_f64(out) == 0).all() and np.isneginf(as_f64(lse)).all()


def test_combine_out_given(cpu):
    rng = np.random.default_rng(8300)
    outs = randn(rng, (3, 2, 5, 4, 32), "bf16")
    lses = rng.standard_normal((3, 2, 4, 5)).astype(np.float32)
    out = np.zeros((2, 5, 4, 32), np_dtype("bf16"))
    lse = np.zeros((2, 4, 5), np.float32)
    before = bits(outs), bits(lses)
    res = fmha_native.combine(outs, lses, out=out, lse=lse)
    assert res[0] is out and res[1] is lse
    ref_out, ref_lse = reference.combine(outs, lses)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "bf16")
    assert (bits(outs), bits(lses)) == before


def test_combine_strided_inputs(cpu):
    rng = np.random.default_rng(8350)
    outs = randn(rng, (3, 2, 4, 5, 32), "f32").transpose(0, 1, 3, 2, 4)
    lses = rng.standard_normal((3, 2, 5, 4)).astype(np.float32).transpose(0, 1, 3, 2)
    out, lse = fmha_native.combine(outs, lses)
    ref_out, ref_lse = reference.combine(outs, lses)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f32")


def test_combine_torch_cpu():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8400)
    outs = randn(rng, (2, 1, 5, 4, 32), "f32")
    lses = rng.standard_normal((2, 1, 4, 5)).astype(np.float32)
    out, lse = fmha_native.combine(torch.from_numpy(outs).to(torch.bfloat16), torch.from_numpy(lses))
    assert isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    ref_out, ref_lse = reference.combine(torch.from_numpy(outs).to(torch.bfloat16), lses)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "bf16")


@pytest.mark.parametrize("case", ["lse_shape", "lse_dtype", "outs_ndim", "lses_ndim", "groups",
                                  "outs_int", "out_shape", "out_dtype", "lse_out_shape",
                                  "not_array"])
def test_combine_bad_inputs(case):
    rng = np.random.default_rng(8500)
    outs = randn(rng, (3, 2, 5, 4, 32), "f32")
    lses = rng.standard_normal((3, 2, 4, 5)).astype(np.float32)
    kw = {}
    exc, pattern = ValueError, r"\b(lses|outs)\b"
    if case == "lse_shape":
        lses = lses.transpose(0, 1, 3, 2).copy()
    elif case == "lse_dtype":
        lses = lses.astype(np.float16)
        exc = TypeError
    elif case == "outs_ndim":
        outs = outs[0]
    elif case == "lses_ndim":
        lses = lses[0]
    elif case == "groups":
        lses = lses[:2]
    elif case == "outs_int":
        outs = outs.astype(np.int32)
        exc = TypeError
    elif case == "out_shape":
        kw["out"] = np.zeros((2, 5, 4, 16), np.float32)
        pattern = r"\bout\b"
    elif case == "out_dtype":
        kw["out"] = np.zeros((2, 5, 4, 32), np.float16)
        exc, pattern = (TypeError, ValueError), r"\bout\b"
    elif case == "lse_out_shape":
        kw["lse"] = np.zeros((2, 5, 4), np.float32)
        pattern = r"\blse\b"
    else:
        outs = "outs"
        exc = TypeError
    with pytest.raises(exc, match=pattern):
        fmha_native.combine(outs, lses, **kw)
