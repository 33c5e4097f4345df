"""Split-K: forced and heuristic split counts against the reference, the clamp that
explain() reports, determinism, and independence of a row from other batch entries."""
import numpy as np
import pytest

import fmha_native
from _harness import bits, check_forward, key_blocks, make_qkv

MAX_SPLITS = 256  # FMHA_MAX_SPLITS: the largest count a caller may force


def _dtype(backend):
    return "f16" if backend.is_gpu else "f32"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q", [1, 3, 65])
@pytest.mark.parametrize("num_splits", [0, 1, 2, 3, MAX_SPLITS])
def test_forced_splits_match_reference(backend, num_splits, seqlen_q, causal):
    rng = np.random.default_rng(4000 + num_splits + seqlen_q)
    for dtype in (("f16", "bf16") if backend.is_gpu else ("f32", "bf16")):
        q, k, v = make_qkv(rng, 2, seqlen_q, 1000, 8, 2, 64, dtype)
        backend.require(q, k, v, causal=causal, num_splits=num_splits)
        check_forward(backend, q, k, v, dtype, causal=causal, num_splits=num_splits)


@pytest.mark.parametrize("seqlen_k", [1, 63, 64, 65, 1000, 4097])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, MAX_SPLITS])
def test_explain_clamps_forced_splits(backend, num_splits, seqlen_k):
    """A forced count is clamped to the key blocks there are; explain shows the result."""
    dtype = _dtype(backend)
    rng = np.random.default_rng(4100)
    q, k, v = make_qkv(rng, 1, 4, seqlen_k, 4, 2, 64, dtype)
    backend.require(q, k, v, num_splits=num_splits)
    plan = fmha_native.explain(backend.put(q), backend.put(k), backend.put(v),
                               num_splits=num_splits, **backend.device_kw())
    expected = min(num_splits, key_blocks(seqlen_k, plan["block_n"]))
    assert plan["num_splits"] == expected, plan
    assert plan["backend"] == backend.name


@pytest.mark.parametrize("seqlen_q,seqlen_k,batch,heads", [(1, 4097, 1, 2), (1, 1000, 4, 8),
                                                           (128, 128, 2, 4), (1000, 1000, 1, 1)])
def test_heuristic_split_count_in_range(backend, seqlen_q, seqlen_k, batch, heads):
    dtype = _dtype(backend)
    rng = np.random.default_rng(4200)
    q, k, v = make_qkv(rng, batch, seqlen_q, seqlen_k, heads, 1, 64, dtype)
    backend.require(q, k, v)
    plan = fmha_native.explain(backend.put(q), backend.put(k), backend.put(v), **backend.device_kw())
    assert 1 <= plan["num_splits"] <= min(MAX_SPLITS, key_blocks(seqlen_k, plan["block_n"]))
    assert isinstance(plan["reason"], str) and plan["reason"]


# Decode problems with few tiles: on the GPU the heuristic lets the walkers (warps) of a
# decode CTA share one split and merge in shared memory (explain: walkers_per_split > 1),
# alone (short keys) or under the split-K combine (long keys); lens include 0 and a length
# shorter than one key block, so some walkers see no key at all.
@pytest.mark.parametrize("seqlen_k,lens", [(512, None), (20000, None), (3000, [0, 5, 2999, 1700])],
                         ids=["merge", "merge+combine", "ragged"])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_walker_merge(backend, head_dim, group, seqlen_k, lens):
    dtype = "bf16" if backend.is_gpu else "f32"
    rng = np.random.default_rng(4250 + head_dim + group + seqlen_k)
    batch = 1 if lens is None else len(lens)
    q, k, v = make_qkv(rng, batch, 1, seqlen_k, group, 1, head_dim, dtype)
    q[-1, 0, group - 1, :] = np.nan  # this row alone must come out NaN (its entry has keys)
    kw = {} if lens is None else {"cache_seqlens": np.array(lens, dtype=np.int32)}
    backend.require(q, k, v, **kw)
    plan = fmha_native.explain(backend.put(q), backend.put(k), backend.put(v), **backend.device_kw(),
                               **{key: backend.put(val) for key, val in kw.items()})
    if backend.is_gpu:
        assert plan["walkers_per_split"] > 1, plan["reason"]
    else:
        assert plan["walkers_per_split"] == 1
    out, _ = check_forward(backend, q, k, v, dtype, **kw)
    nan_rows = np.isnan(out).any(axis=-1)
    assert nan_rows[-1, 0, group - 1] and nan_rows.sum() == 1, nan_rows


def test_decode_kv_read_once(backend):
    """GPU decode tiles read K/V with an evict-first L2 policy when the K/V bytes of the call
    are at most 4x the L2 size (README, explain), counted with the real cache lengths when
    those are on the host; never on the CPU or for prefill tiles."""
    if not backend.is_gpu:
        q, k, v = make_qkv(np.random.default_rng(4270), 1, 1, 512, 8, 2, 64, "f32")
        assert fmha_native.explain(q, k, v, device="cpu")["kv_read_once"] is False
        return
    if not backend.use_torch:
        pytest.skip("needs torch to build the large device cache")
    import torch
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    heads_kv, group, head_dim = 8, 4, 128
    row_bytes = 2 * heads_kv * head_dim * 2  # K and V of one key, 16-bit elements
    capacity = 4 * l2 // row_bytes + 1024     # just past 4x L2 when every key is read
    q = torch.zeros(1, 1, heads_kv * group, head_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.zeros(1, capacity, heads_kv, head_dim, dtype=torch.bfloat16, device="cuda")
    assert fmha_native.explain(q, k, k)["kv_read_once"] is False
    short = np.array([capacity // 2], dtype=np.int32)  # the real length, on the host
    assert fmha_native.explain(q, k, k, cache_seqlens=short)["kv_read_once"] is True
    small = k[:, :capacity // 8]
    plan = fmha_native.explain(q, small, small)
    assert plan["kv_read_once"] is True and "evict-first" in plan["reason"], plan
    prefill = torch.zeros(1, 64, heads_kv * group, head_dim, dtype=torch.bfloat16, device="cuda")
    assert fmha_native.explain(prefill, small, small)["kv_read_once"] is False


@pytest.mark.parametrize("num_splits", [0, 1, 2, 3, MAX_SPLITS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_deterministic(backend, num_splits, causal):
    """The same call on the same inputs gives the same bits, every time."""
    dtype = _dtype(backend)
    rng = np.random.default_rng(4300 + num_splits)
    q, k, v = make_qkv(rng, 3, 70, 1000, 8, 2, 64, dtype)
    backend.require(q, k, v, num_splits=num_splits)
    first = backend.forward_native(q, k, v, causal=causal, num_splits=num_splits)
    for _ in range(3):
        again = backend.forward_native(q, k, v, causal=causal, num_splits=num_splits)
        assert bits(again[0]) == bits(first[0])
        assert bits(again[1]) == bits(first[1])


@pytest.mark.parametrize("num_splits", [1, 2, 3, MAX_SPLITS])
@pytest.mark.parametrize("seqlen_q", [1, 33])
def test_row_independent_of_batch(backend, num_splits, seqlen_q):
    """For a forced split count, batch entry b alone gives the same bits as inside a batch."""
    dtype = _dtype(backend)
    rng = np.random.default_rng(4400 + num_splits)
    q, k, v = make_qkv(rng, 4, seqlen_q, 700, 8, 2, 64, dtype)
    backend.require(q, k, v, num_splits=num_splits)
    out, lse = backend.forward_native(q, k, v, causal=True, num_splits=num_splits)
    out_h, lse_h = _host(out), _host(lse)
    for b in range(q.shape[0]):
        sl = slice(b, b + 1)
        out_b, lse_b = backend.forward_native(q[sl], k[sl], v[sl], causal=True, num_splits=num_splits)
        assert bits(out_b) == bits(out_h[sl]), f"batch entry {b}: out differs"
        assert bits(lse_b) == bits(lse_h[sl]), f"batch entry {b}: lse differs"


def _host(x):
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu()
    return x


_THREADS_SCRIPT = """
import sys
import numpy as np
import fmha_native
data = np.load(sys.argv[1])
out, lse = fmha_native.forward(data["q"], data["k"], data["v"], causal=True,
                               num_splits=int(sys.argv[3]), device="cpu")
np.savez(sys.argv[2], out=out, lse=lse)
"""


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("threads", [1, 3])
def test_cpu_bits_independent_of_thread_count(cpu, tmp_path, threads, num_splits):
    """FMHA_NUM_THREADS changes the schedule, never the bits (for a forced split count)."""
    import os
    import subprocess
    import sys
    rng = np.random.default_rng(4500)
    q, k, v = make_qkv(rng, 2, 50, 700, 8, 2, 64, "f32")
    np.savez(tmp_path / "in.npz", q=q, k=k, v=v)
    env = dict(os.environ, FMHA_NUM_THREADS=str(threads))
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(fmha_native.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_parent, env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, str(tmp_path / "in.npz"),
                    str(tmp_path / "out.npz"), str(num_splits)], check=True, env=env,
                   cwd=package_parent, timeout=120)
    theirs = np.load(tmp_path / "out.npz")
    out, lse = fmha_native.forward(q, k, v, causal=True, num_splits=num_splits, device="cpu")
    assert bits(theirs["out"]) == bits(out) and bits(theirs["lse"]) == bits(lse)
