"""Head dims beyond 64 and 128 on the GPU (issue 21): 32, 80, 96, 192 and 256 through every
mode the tensor-core kernels run (prefill, KV cache with append, paged, packed, forced
splits), held to the float64 reference; head dims the GPU tables do not list are refused
with a NotImplementedError that leads with head_dim.  Head_dim 256 keeps O in two column
parts of 128 (csrc/fmha_config.h FMHA_GPU_O_PARTS); on Hopper its unsplit prefill runs the
sm90 kernel (tests/test_gpu_sm90.py), so the prefill tiles' own d256 path runs here through
forced splits and KV caches, and with FMHA_GPU_PREFILL_KERNEL=mma (set for the whole
process) through every prefill test.  Every test skips (saying so) when no GPU is visible;
none passes without running on one."""
import numpy as np
import pytest

import fmha_native
from fmha_native import reference
from _harness import NO_GPU_REASON, as_f64, assert_close, gpu_devices, make_qkv, packed, paged_cache

# Without a GPU every test skips, saying so (conftest's gpu_backend skips the same way).
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_devices(), reason=NO_GPU_REASON)]

# Head dims with GPU tiles besides 64 and 128 (csrc/fmha_config.h; NVIDIA builds).
NEW_DIMS = [32, 80, 96, 192, 256]
REFUSED = [48, 112]


@pytest.mark.parametrize("head_dim", NEW_DIMS)
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(37, 101), (130, 130), (200, 67), (1, 333)])
def test_prefill_gqa_odd_lengths(gpu_backend, head_dim, dtype, causal, sq, sk):
    rng = np.random.default_rng(21000 + sq + sk)
    q, k, v = make_qkv(rng, 2, sq, sk, 8, 2, head_dim, dtype)
    plan = fmha_native.explain(q, k, v, causal=causal, device="gpu")
    assert plan["supported"] and plan["backend"] == "gpu", plan.get("error")
    ref_out, ref_lse = reference.forward(q, k, v, causal=causal)
    out, lse = gpu_backend.forward(q, k, v, causal=causal)
    assert_close(out, lse, ref_out, ref_lse, dtype, what=f"d{head_dim} {plan['kernel']}")


@pytest.mark.parametrize("head_dim", NEW_DIMS)
@pytest.mark.parametrize("num_splits", [1, 2, 7])
def test_forced_splits_agree(gpu_backend, head_dim, num_splits):
    rng = np.random.default_rng(21100 + num_splits)
    q, k, v = make_qkv(rng, 1, 3, 1500, 4, 4, head_dim, "bf16")
    ref_out, ref_lse = reference.forward(q, k, v, causal=True)
    out, lse = gpu_backend.forward(q, k, v, causal=True, num_splits=num_splits)
    assert_close(out, lse, ref_out, ref_lse, "bf16", what=f"splits={num_splits}")


@pytest.mark.parametrize("head_dim", NEW_DIMS)
def test_decode_cache_and_append(gpu_backend, head_dim):
    rng = np.random.default_rng(21200)
    lengths = np.array([0, 1, 250, 777], np.int32)
    capacity = 800
    q, k, v = make_qkv(rng, 4, 2, capacity, 8, 2, head_dim, "f16")
    k_new, v_new = (x[:, :2].copy() for x in make_qkv(rng, 4, 2, 2, 8, 2, head_dim, "f16")[1:])
    ref_out, ref_lse = reference.forward(q, k, v, causal=True, cache_seqlens=lengths,
                                         k_new=k_new, v_new=v_new)
    out, lse, k_after, v_after = gpu_backend.forward_append(q, k, v, causal=True, cache_seqlens=lengths,
                                                    k_new=k_new, v_new=v_new)
    assert_close(out, lse, ref_out, ref_lse, "f16", what="decode + append")
    for b, n in enumerate(lengths):
        np.testing.assert_array_equal(k_after[b, n:n + 2], as_f64(k_new[b]))
        np.testing.assert_array_equal(v_after[b, n:n + 2], as_f64(v_new[b]))


@pytest.mark.parametrize("head_dim", NEW_DIMS)
def test_paged(gpu_backend, head_dim):
    rng = np.random.default_rng(21300)
    lengths = np.array([5, 64, 131], np.int32)
    k, v, table = paged_cache(rng, lengths, 16, 10, 2, head_dim, "bf16")
    q = make_qkv(rng, 3, 1, 1, 8, 2, head_dim, "bf16")[0]
    ref_out, ref_lse = reference.forward(q, k, v, cache_seqlens=lengths, block_table=table)
    out, lse = gpu_backend.forward(q, k, v, cache_seqlens=lengths, block_table=table)
    assert_close(out, lse, ref_out, ref_lse, "bf16", what="paged")


@pytest.mark.parametrize("head_dim", NEW_DIMS)
def test_packed_varlen(gpu_backend, head_dim):
    rng = np.random.default_rng(21400)
    lengths = [1, 70, 129, 3]
    q, cu = packed(rng, lengths, 8, head_dim, "bf16")
    k, _ = packed(rng, lengths, 2, head_dim, "bf16")
    v, _ = packed(rng, lengths, 2, head_dim, "bf16")
    kw = dict(causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=129, max_seqlen_k=129)
    ref_out, ref_lse = reference.forward(q, k, v, **kw)
    out, lse = gpu_backend.forward(q, k, v, **kw)
    assert_close(out, lse, ref_out, ref_lse, "bf16", what="packed")


@pytest.mark.parametrize("head_dim", REFUSED)
def test_unlisted_head_dims_refused(head_dim):
    rng = np.random.default_rng(21500)
    q, k, v = make_qkv(rng, 1, 4, 40, 2, 1, head_dim, "f16")
    with pytest.raises(NotImplementedError) as info:
        fmha_native.forward(q, k, v, device="gpu")
    assert str(info.value).startswith(f"head_dim {head_dim} is not supported by the GPU kernels")
    # device=None falls back to the CPU, which runs any head_dim
    out, lse = fmha_native.forward(q, k, v)
    ref_out, ref_lse = reference.forward(q, k, v)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16")


@pytest.mark.parametrize("num_splits", [0, 3])
def test_head_dim_256_parts_of_o(gpu_backend, num_splits):
    """d256 decode over a long cache with GQA: both column parts of O written, the LSE once,
    and the plan says how O is kept; NaN in the keys past each length never reaches O."""
    rng = np.random.default_rng(21600 + num_splits)
    lengths = np.array([3, 1000, 4099], np.int32)
    q, k, v = make_qkv(rng, 3, 1, 4100, 8, 2, 256, "bf16")
    for b, n in enumerate(lengths):
        k[b, n:] = np.nan
        v[b, n:] = np.nan
    kw = dict(cache_seqlens=lengths, num_splits=num_splits)
    plan = fmha_native.explain(q, k, v, device="gpu", **kw)
    assert plan["kernel"].startswith("fwd_decode<bfloat16,d256"), plan["kernel"]
    assert "O in 2 column parts of 128" in plan["reason"], plan["reason"]
    ref_out, ref_lse = reference.forward(q, k, v, cache_seqlens=lengths)
    out, lse = gpu_backend.forward(q, k, v, **kw)
    assert_close(out, lse, ref_out, ref_lse, "bf16", what=f"d256 decode, num_splits={num_splits}")
