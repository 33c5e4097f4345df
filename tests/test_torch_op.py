"""The torch custom ops (fmha_native/_torch_ops.py) and fmha_native.forward / combine
under torch's tracers: torch.library.opcheck of every op, the fake implementations'
shapes for every mode (dense, KV cache, paged, packed), torch.compile(fullgraph=True)
with aot_eager and inductor against the float64 reference, the KV cache appended in
place (not through a copy) under inductor, and, on a GPU, a decode step compiled with
mode="reduce-overhead" (CUDA graphs) replayed with new lengths.  Skips without torch."""
import numpy as np
import pytest

import fmha_native
from fmha_native import reference
from _harness import NO_GPU_REASON, as_f64, assert_close, gpu_devices, run_python

torch = pytest.importorskip("torch")

# What the first torch call does: import fmha_native._torch_ops (registering the ops).
fmha_native._load_torch()
from fmha_native import _torch_ops  # noqa: E402

ops = torch.ops.fmha_native


def _packed_keywords_known():
    """Whether the extension binds the packed and paged keywords (csrc/args.c)."""
    return "cu_seqlens_q" in (getattr(fmha_native._C.forward, "__doc__", "") or "")


needs_packed = pytest.mark.skipif(not _packed_keywords_known(),
                                  reason="this build of _fmha_native predates cu_seqlens_q, "
                                         "cu_seqlens_k and block_table")


def _randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def _dense(seed, batch=2, seqlen_q=7, seqlen_k=19, heads_q=4, heads_kv=2, head_dim=32,
           dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (_randn(gen, batch, seqlen_q, heads_q, head_dim, dtype=dtype),
            _randn(gen, batch, seqlen_k, heads_kv, head_dim, dtype=dtype),
            _randn(gen, batch, seqlen_k, heads_kv, head_dim, dtype=dtype))


def _cache(seed, lengths, capacity=48, seqlen_new=1, heads_q=4, heads_kv=2, head_dim=32):
    """A decode step: q, caches whose unused rows hold NaN, new rows, int32 lengths."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    k = _randn(gen, batch, capacity, heads_kv, head_dim)
    v = _randn(gen, batch, capacity, heads_kv, head_dim)
    for b, n in enumerate(lengths):
        k[b, n:] = float("nan")
        v[b, n:] = float("nan")
    return dict(q=_randn(gen, batch, seqlen_new, heads_q, head_dim), k=k, v=v,
                k_new=_randn(gen, batch, seqlen_new, heads_kv, head_dim),
                v_new=_randn(gen, batch, seqlen_new, heads_kv, head_dim),
                cache_seqlens=torch.tensor(lengths, dtype=torch.int32))


def _check(out, lse, ref_out, ref_lse, dtype="f32", what=""):
    assert_close(as_f64(out), None if lse is None else as_f64(lse), ref_out, ref_lse, dtype,
                 what=what)


class _Recorder:
    """A torch.compile backend that keeps each graph dynamo hands it and runs it
    through aot_eager (functionalization included)."""

    def __init__(self):
        from torch._dynamo.backends.registry import lookup_backend
        self.graphs = []
        self._aot_eager = lookup_backend("aot_eager")

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return self._aot_eager(gm, example_inputs)

    def targets(self):
        return [str(node.target) for gm in self.graphs for node in gm.graph.nodes
                if node.op == "call_function"]


# ---------------------------------------------------------------------------
# opcheck: schema (mutation annotations), fake implementations, aot dispatch with
# dynamic shapes, against the real kernels on CPU tensors
# ---------------------------------------------------------------------------

def _scalars(causal=False, return_lse=True, cache_seqlens=None, cu_seqlens_q=None,
             cu_seqlens_k=None, block_table=None, max_seqlen_q=None, max_seqlen_k=None):
    # The ops' arguments after their tensors, in schema order, with device="cpu".
    return dict(cache_seqlens=cache_seqlens, block_table=block_table, cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_k=cu_seqlens_k, causal=causal, softmax_scale=None, num_splits=0,
                return_lse=return_lse, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                device="cpu", stream=None)


@pytest.mark.parametrize("causal, return_lse", [(True, True), (False, False)])
def test_opcheck_forward_dense(causal, return_lse):
    q, k, v = _dense(100)
    torch.library.opcheck(ops.forward.default, (q, k, v),
                          _scalars(causal=causal, return_lse=return_lse))


def test_opcheck_forward_cache_host_lengths():
    p = _cache(101, [0, 30, 48])
    torch.library.opcheck(ops.forward.default, (p["q"], p["k"], p["v"]),
                          _scalars(causal=True, cache_seqlens=p["cache_seqlens"]))


@pytest.mark.parametrize("with_lse", [True, False])
def test_opcheck_forward_out(with_lse):
    q, k, v = _dense(102)
    out = torch.full_like(q, 7.0)
    lse = torch.full((2, 4, 7), 7.0) if with_lse else None
    torch.library.opcheck(ops.forward_out.default, (q, k, v, out, lse),
                          _scalars(causal=True, return_lse=with_lse))


def test_opcheck_forward_append():
    p = _cache(103, [3, 40])
    out = torch.empty_like(p["q"])
    lse = torch.empty(2, 4, 1)
    torch.library.opcheck(ops.forward_append.default,
                          (p["q"], p["k"], p["v"], p["k_new"], p["v_new"], out, lse),
                          _scalars(causal=True, cache_seqlens=p["cache_seqlens"]))


def test_opcheck_combine():
    gen = torch.Generator().manual_seed(104)
    outs, lses = _randn(gen, 3, 2, 5, 4, 16), _randn(gen, 3, 2, 4, 5)
    torch.library.opcheck(ops.combine.default, (outs, lses, None))
    torch.library.opcheck(ops.combine_out.default,
                          (outs, lses, torch.empty(2, 5, 4, 16), torch.empty(2, 4, 5), None))


@needs_packed
def test_opcheck_forward_packed():
    q, k, v = _dense(105, batch=1, seqlen_q=12, seqlen_k=20)
    cq = torch.tensor([0, 5, 5, 12], dtype=torch.int32)
    ck = torch.tensor([0, 9, 13, 20], dtype=torch.int32)
    torch.library.opcheck(ops.forward.default, (q[0], k[0], v[0]),
                          _scalars(causal=True, cu_seqlens_q=cq, cu_seqlens_k=ck))


# ---------------------------------------------------------------------------
# The eager path calls the extension directly; the ops give the same bits
# ---------------------------------------------------------------------------

def test_eager_calls_skip_the_op(monkeypatch):
    """Plain eager calls never reach the ops (their dispatch costs more than the call)."""
    def refuse(*args, **kw):
        raise AssertionError("an eager call went through the torch op")

    fmha_native.forward(*_dense(110), device="cpu")  # torch loaded, ops registered
    monkeypatch.setattr(_torch_ops, "call_forward", refuse)
    monkeypatch.setattr(_torch_ops, "call_combine", refuse)
    q, k, v = _dense(110)
    out, lse = fmha_native.forward(q, k, v, causal=True, device="cpu")
    fmha_native.combine(torch.stack([out, out]), torch.stack([lse, lse]))


def test_ops_match_the_direct_call_bitwise():
    q, k, v = _dense(111)
    direct = fmha_native.forward(q, k, v, causal=True, device="cpu")
    via_op = ops.forward(q, k, v, **_scalars(causal=True))
    assert torch.equal(direct[0], via_op[0]) and torch.equal(direct[1], via_op[1])
    out, lse = torch.empty_like(q), torch.empty(2, 4, 7)
    ops.forward_out(q, k, v, out, lse, **_scalars(causal=True))
    assert torch.equal(direct[0], out) and torch.equal(direct[1], lse)

    p = _cache(112, [5, 47])
    k2, v2 = p["k"].clone(), p["v"].clone()
    want = fmha_native.forward(p["q"], p["k"], p["v"], cache_seqlens=p["cache_seqlens"],
                               k_new=p["k_new"], v_new=p["v_new"], device="cpu")
    out, lse = torch.empty_like(p["q"]), torch.empty(2, 4, 1)
    ops.forward_append(p["q"], k2, v2, p["k_new"], p["v_new"], out, lse,
                       **_scalars(cache_seqlens=p["cache_seqlens"]))
    assert torch.equal(want[0], out) and torch.equal(want[1], lse)
    # The caches hold NaN past the lengths: compare bits, NaN included.
    assert torch.equal(p["k"].view(torch.int32), k2.view(torch.int32))
    assert torch.equal(p["v"].view(torch.int32), v2.view(torch.int32))


@needs_packed
def test_eager_packed_outputs_match_the_op():
    """The eager glue allocates packed outputs (out like q, lse [heads_q, total_q])."""
    p = _mixed_paged(113)
    k2, v2 = p["k"].clone(), p["v"].clone()
    meta = dict(cache_seqlens=p["cache_seqlens"], block_table=p["block_table"],
                cu_seqlens_q=p["cu_seqlens_q"])
    out, lse = fmha_native.forward(p["q"], p["k"], p["v"], k_new=p["k_new"], v_new=p["v_new"],
                                   causal=True, device="cpu", **meta)
    assert isinstance(out, torch.Tensor) and out.shape == p["q"].shape
    assert lse.shape == (4, p["q"].shape[0]) and lse.dtype == torch.float32
    want_out, want_lse = torch.empty_like(out), torch.empty_like(lse)
    ops.forward_append(p["q"], k2, v2, p["k_new"], p["v_new"], want_out, want_lse,
                       **_scalars(causal=True, **meta))
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    out_only = fmha_native.forward(p["q"], k2, v2, return_lse=False, causal=True, device="cpu",
                                   **meta)
    assert out_only.shape == p["q"].shape


# ---------------------------------------------------------------------------
# Fake tensors: shapes and dtypes for every mode, without running anything
# ---------------------------------------------------------------------------

def _fake_call(make, **kw):
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        args = make()
        return args, fmha_native.forward(*args[:3], **{**kw, **args[3]})


def test_fake_shapes_every_mode():
    def dense():
        return (torch.empty(3, 5, 8, 64, dtype=torch.bfloat16), torch.empty(3, 40, 2, 64, dtype=torch.bfloat16),
                torch.empty(3, 40, 2, 64, dtype=torch.bfloat16), {})

    def cache():
        return (torch.empty(3, 2, 8, 64, dtype=torch.float16), torch.empty(3, 64, 2, 64, dtype=torch.float16),
                torch.empty(3, 64, 2, 64, dtype=torch.float16),
                dict(cache_seqlens=torch.empty(3, dtype=torch.int32),
                     k_new=torch.empty(3, 2, 2, 64, dtype=torch.float16),
                     v_new=torch.empty(3, 2, 2, 64, dtype=torch.float16)))

    def paged():
        return (torch.empty(3, 1, 8, 64), torch.empty(10, 16, 2, 64), torch.empty(10, 16, 2, 64),
                dict(cache_seqlens=torch.empty(3, dtype=torch.int32),
                     block_table=torch.empty(3, 4, dtype=torch.int32)))

    def packed():
        return (torch.empty(11, 8, 64), torch.empty(30, 2, 64), torch.empty(30, 2, 64),
                dict(cu_seqlens_q=torch.empty(4, dtype=torch.int32),
                     cu_seqlens_k=torch.empty(4, dtype=torch.int32)))

    def packed_paged_append():
        return (torch.empty(11, 8, 64), torch.empty(10, 16, 2, 64), torch.empty(10, 16, 2, 64),
                dict(cu_seqlens_q=torch.empty(4, dtype=torch.int32),
                     cache_seqlens=torch.empty(3, dtype=torch.int32),
                     block_table=torch.empty(3, 4, dtype=torch.int32),
                     k_new=torch.empty(11, 2, 64), v_new=torch.empty(11, 2, 64)))

    cases = [(dense, (3, 8, 5)), (cache, (3, 8, 2)), (paged, (3, 8, 1)), (packed, (8, 11)),
             (packed_paged_append, (8, 11))]
    for make, lse_shape in cases:
        args, (out, lse) = _fake_call(make, causal=True)
        q = args[0]
        assert out.shape == q.shape and out.dtype == q.dtype, make.__name__
        assert tuple(lse.shape) == lse_shape and lse.dtype == torch.float32, make.__name__
        assert out.is_contiguous() and lse.is_contiguous()
        _, res = _fake_call(make, return_lse=False)
        assert not isinstance(res, tuple) and res.shape == q.shape, make.__name__


def test_fake_given_outputs_come_back():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k, v = torch.empty(2, 3, 4, 16), torch.empty(2, 9, 2, 16), torch.empty(2, 9, 2, 16)
        out, lse = torch.empty(2, 3, 4, 16), torch.empty(2, 4, 3)
        res = fmha_native.forward(q, k, v, out=out, lse=lse)
        assert res[0] is out and res[1] is lse
        res = fmha_native.forward(q, k, v, out=out, return_lse=False)
        assert res is out
        outs, lses = torch.empty(3, 2, 3, 4, 16), torch.empty(3, 2, 4, 3)
        out, lse = fmha_native.combine(outs, lses)
        assert out.shape == (2, 3, 4, 16) and lse.shape == (2, 4, 3)


def test_fake_bad_rank_names_q():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k = torch.empty(3, 4, 16), torch.empty(1, 9, 2, 16)
        with pytest.raises(ValueError, match=r"^q must be 4-D"):
            fmha_native.forward(q, k, k)
        with pytest.raises(ValueError, match=r"^q must be 3-D"):
            fmha_native.forward(k, k, k, cu_seqlens_q=torch.empty(2, dtype=torch.int32))
        with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
            fmha_native.forward(k, k, k, bogus=1)


# ---------------------------------------------------------------------------
# torch.compile(fullgraph=True)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, name", [(torch.float32, "f32"), (torch.bfloat16, "bf16")])
def test_compile_dense_causal(dtype, name):
    q, k, v = _dense(120, dtype=dtype)
    recorder = _Recorder()

    @torch.compile(fullgraph=True, backend=recorder)
    def step(q, k, v):
        out, lse = fmha_native.forward(q, k, v, causal=True, device="cpu")
        return out * 2, lse

    out2, lse = step(q, k, v)
    assert "fmha_native.forward.default" in recorder.targets()
    ref_out, ref_lse = reference.forward(q, k, v, causal=True)
    _check(out2.float() / 2, lse, ref_out, ref_lse, name)


def test_compile_return_lse_false():
    q, k, v = _dense(130)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(q, k, v):
        return fmha_native.forward(q, k, v, causal=True, return_lse=False, device="cpu") + 1

    res = step(q, k, v)
    assert isinstance(res, torch.Tensor) and res.shape == q.shape
    _check(res - 1, None, reference.forward(q, k, v, causal=True, return_lse=False), None)


def test_compile_given_out_and_lse():
    q, k, v = _dense(121)
    out, lse = torch.full_like(q, 7.0), torch.full((2, 4, 7), 7.0)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(q, k, v, out, lse):
        fmha_native.forward(q, k, v, out=out, lse=lse, device="cpu")
        return out.sum()

    total = step(q, k, v, out, lse)
    ref_out, ref_lse = reference.forward(q, k, v)
    _check(out, lse, ref_out, ref_lse)
    assert abs(float(total) - float(ref_out.sum())) < 1e-3


def _append_reference(p, causal=True, **kw):
    args = {name: p[name].numpy() for name in ("cache_seqlens", "k_new", "v_new")}
    ref = reference.forward(p["q"], p["k"], p["v"], causal=causal, **args, **kw)
    caches = reference.append_kv(p["k"], p["v"], args["cache_seqlens"], args["k_new"],
                                 args["v_new"], **kw)
    return ref, caches


def _check_caches(k, v, caches):
    for got, want in zip((k, v), caches):
        got = as_f64(got)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.array_equal(np.nan_to_num(got), np.nan_to_num(want))


def test_compile_decode_append_aot_eager():
    """Two decode steps of one compiled function: lengths change, the caches grow."""
    p = _cache(122, [0, 17, 46], seqlen_new=2)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(q, k, v, k_new, v_new, cache_seqlens):
        return fmha_native.forward(q, k, v, cache_seqlens=cache_seqlens, k_new=k_new,
                                   v_new=v_new, causal=True, device="cpu")

    for turn in range(2):
        (ref_out, ref_lse), caches = _append_reference(p)
        out, lse = step(p["q"], p["k"], p["v"], p["k_new"], p["v_new"], p["cache_seqlens"])
        _check(out, lse, ref_out, ref_lse, what=f"turn {turn}")
        _check_caches(p["k"], p["v"], caches)
        p["cache_seqlens"] = torch.tensor([2, 30, 40], dtype=torch.int32)
        p["q"] = p["q"].flip(0)


def test_compile_decode_append_inductor_writes_the_cache_in_place():
    """Under inductor the op runs on the caller's caches: no copy of a KV cache per step."""
    from torch._inductor.utils import run_and_get_code

    p = _cache(123, [4, 45])

    def step(q, k, v, k_new, v_new, cache_seqlens):
        return fmha_native.forward(q, k, v, cache_seqlens=cache_seqlens, k_new=k_new,
                                   v_new=v_new, causal=True, device="cpu")

    (ref_out, ref_lse), caches = _append_reference(p)
    k_ptr = p["k"].data_ptr()
    (out, lse), codes = run_and_get_code(torch.compile(step, fullgraph=True), p["q"], p["k"],
                                         p["v"], p["k_new"], p["v_new"], p["cache_seqlens"])
    _check(out, lse, ref_out, ref_lse)
    _check_caches(p["k"], p["v"], caches)
    assert p["k"].data_ptr() == k_ptr
    code = "\n".join(codes)
    assert "fmha_native.forward_append.default(" in code
    assert "clone" not in code and ".copy_(" not in code, code


def test_compile_dynamic_shapes_no_recompile():
    """One graph for every cache capacity and batch (the fake implementation handles
    symbolic sizes)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")

    @torch.compile(fullgraph=True, backend=counter, dynamic=True)
    def step(q, k, v, cache_seqlens):
        return fmha_native.forward(q, k, v, cache_seqlens=cache_seqlens, device="cpu")

    # No size repeats another of the same call (torch would take them as equal).
    for seed, lengths, capacity in ((124, [3, 9, 0], 40), (125, [50, 0, 7, 1, 60], 64)):
        p = _cache(seed, lengths, capacity=capacity)
        out, lse = step(p["q"], p["k"], p["v"], p["cache_seqlens"])
        ref_out, ref_lse = reference.forward(p["q"], p["k"], p["v"],
                                             cache_seqlens=p["cache_seqlens"])
        _check(out, lse, ref_out, ref_lse)
    assert counter.frame_count == 1


def test_compile_combine():
    gen = torch.Generator().manual_seed(126)
    outs, lses = _randn(gen, 3, 2, 5, 4, 16), _randn(gen, 3, 2, 4, 5)
    lses[1, 0, 2] = float("-inf")

    @torch.compile(fullgraph=True, backend="aot_eager")
    def merge(outs, lses):
        return fmha_native.combine(outs, lses)

    out, lse = merge(outs, lses)
    ref_out, ref_lse = reference.combine(outs, lses)
    _check(out, lse, ref_out, ref_lse)


def _split_reference(q, k, v, cq, ck, causal):
    """The packed problem as one dense reference call per sequence."""
    outs, lses = [], []
    for b in range(len(cq) - 1):
        qb = q[cq[b]:cq[b + 1]][None]
        kb, vb = k[ck[b]:ck[b + 1]][None], v[ck[b]:ck[b + 1]][None]
        out, lse = reference.forward(qb, kb, vb, causal=causal)
        outs.append(out[0])
        lses.append(lse[0])
    return np.concatenate(outs), np.concatenate(lses, axis=1)


@needs_packed
def test_compile_packed():
    q, k, v = _dense(127, batch=1, seqlen_q=20, seqlen_k=41)
    q, k, v = q[0], k[0], v[0]
    cq, ck = [0, 1, 9, 9, 20], [0, 17, 25, 30, 41]

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(q, k, v, cu_seqlens_q, cu_seqlens_k):
        return fmha_native.forward(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                   causal=True, device="cpu")

    out, lse = step(q, k, v, torch.tensor(cq, dtype=torch.int32),
                    torch.tensor(ck, dtype=torch.int32))
    assert out.shape == q.shape and lse.shape == (4, 20)
    ref_out, ref_lse = _split_reference(q, k, v, cq, ck, causal=True)
    _check(out, lse, ref_out, ref_lse)


def _mixed_paged(seed, page_size=16, heads_q=4, heads_kv=2, head_dim=32):
    """A chunked-prefill / decode / idle batch in one packed call over a paged cache:
    pages shuffled, unused pages and slots NaN."""
    gen = torch.Generator().manual_seed(seed)
    cached, new = [20, 3, 0], [1, 5, 0]
    max_blocks, num_pages = 3, 11
    order = torch.randperm(num_pages, generator=gen)
    table = order[:len(cached) * max_blocks].reshape(len(cached), max_blocks)
    k = torch.full((num_pages, page_size, heads_kv, head_dim), float("nan"))
    v = torch.full_like(k, float("nan"))
    for b, n in enumerate(cached):
        for pos in range(n):
            page, slot = table[b, pos // page_size], pos % page_size
            k[page, slot] = _randn(gen, heads_kv, head_dim)
            v[page, slot] = _randn(gen, heads_kv, head_dim)
    total_q = sum(new)
    cu = [0]
    for n in new:
        cu.append(cu[-1] + n)
    return dict(q=_randn(gen, total_q, heads_q, head_dim), k=k, v=v,
                k_new=_randn(gen, total_q, heads_kv, head_dim),
                v_new=_randn(gen, total_q, heads_kv, head_dim),
                cache_seqlens=torch.tensor(cached, dtype=torch.int32),
                block_table=table.to(torch.int32), cu_seqlens_q=torch.tensor(cu, dtype=torch.int32))


@needs_packed
def test_opcheck_forward_append_packed_paged():
    p = _mixed_paged(106)
    out, lse = torch.empty_like(p["q"]), torch.empty(4, p["q"].shape[0])
    torch.library.opcheck(ops.forward_append.default,
                          (p["q"], p["k"], p["v"], p["k_new"], p["v_new"], out, lse),
                          _scalars(causal=True, cache_seqlens=p["cache_seqlens"],
                                   block_table=p["block_table"], cu_seqlens_q=p["cu_seqlens_q"]))


@needs_packed
def test_compile_packed_paged_append():
    p = _mixed_paged(129)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(q, k, v, k_new, v_new, cache_seqlens, block_table, cu_seqlens_q):
        return fmha_native.forward(q, k, v, k_new=k_new, v_new=v_new, cache_seqlens=cache_seqlens,
                                   block_table=block_table, cu_seqlens_q=cu_seqlens_q,
                                   causal=True, device="cpu")

    (ref_out, ref_lse), caches = _append_reference(
        p, block_table=p["block_table"].numpy(), cu_seqlens_q=p["cu_seqlens_q"].numpy())
    out, lse = step(p["q"], p["k"], p["v"], p["k_new"], p["v_new"], p["cache_seqlens"],
                    p["block_table"], p["cu_seqlens_q"])
    assert out.shape == p["q"].shape and lse.shape == (4, p["q"].shape[0])
    _check(out, lse, ref_out, ref_lse)
    _check_caches(p["k"], p["v"], caches)


def test_compile_refuses_requires_grad_under_grad_mode():
    q, k, v = _dense(128)
    q.requires_grad_(True)
    step = torch.compile(lambda q, k, v: fmha_native.forward(q, k, v, device="cpu"),
                         fullgraph=True, backend="aot_eager")
    # fullgraph=True: dynamo reports the refusal inside its own error; without it the
    # call falls back to eager, which raises the ValueError itself.
    with pytest.raises(Exception, match=r"q requires grad.*torch\.no_grad\(\)"):
        step(q, k, v)
    loose = torch.compile(lambda q, k, v: fmha_native.forward(q, k, v, device="cpu"),
                          backend="aot_eager")
    with pytest.raises(ValueError, match=r"^q requires grad.*torch\.no_grad\(\)"):
        loose(q, k, v)
    with torch.no_grad():
        out, lse = step(q, k, v)
    assert not out.requires_grad
    ref_out, ref_lse = reference.forward(q, k, v)
    _check(out, lse, ref_out, ref_lse)


def test_first_call_inside_compile_registers_the_ops():
    """fmha_native imported before torch, and its first torch call compiled: the ops
    register during tracing and the graph holds them.  Importing fmha_native alone does
    not import torch."""
    code = (
        "import sys, fmha_native\n"
        "assert 'torch' not in sys.modules, 'fmha_native imported torch'\n"
        "import torch\n"
        "q = torch.randn(1, 3, 2, 16); k = torch.randn(1, 5, 2, 16)\n"
        "f = torch.compile(lambda q, k: fmha_native.forward(q, k, k, device='cpu'),\n"
        "                  fullgraph=True, backend='aot_eager')\n"
        "out, lse = f(q, k)\n"
        "want = fmha_native.forward(q, k, k, device='cpu')\n"
        "assert torch.equal(out, want[0]) and torch.equal(lse, want[1])\n"
        "assert hasattr(torch.ops.fmha_native, 'forward_append')\n"
        "print('ok')\n")
    res = run_python(["-c", code], timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


# ---------------------------------------------------------------------------
# GPU: torch.compile(mode="reduce-overhead") captures the decode step in a CUDA graph
# ---------------------------------------------------------------------------

@pytest.mark.gpu
def test_reduce_overhead_decode_replays_with_new_lengths(monkeypatch):
    if not gpu_devices():
        pytest.skip(NO_GPU_REASON)
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    from torch._dynamo.utils import counters

    gen = torch.Generator(device="cuda").manual_seed(130)
    batch, capacity, heads_q, heads_kv, head_dim = 3, 512, 8, 2, 128

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float16)

    k, v = rand(batch, capacity, heads_kv, head_dim), rand(batch, capacity, heads_kv, head_dim)
    k[:, 300:] = float("nan")  # never within a length below
    v[:, 300:] = float("nan")
    # Caches updated in place by a CUDA graph must have a fixed address.
    torch._dynamo.mark_static_address(k)
    torch._dynamo.mark_static_address(v)

    def step(q, k, v, k_new, v_new, cache_seqlens):
        return fmha_native.forward(q, k, v, cache_seqlens=cache_seqlens, k_new=k_new,
                                   v_new=v_new, causal=True)

    # The op's implementation runs on the warm-up and recording calls only; later turns
    # must be replays of the captured graph (fewer runs than turns proves it).
    runs = []
    real_run = _torch_ops._run

    def counting_run(*args):
        runs.append(1)
        return real_run(*args)

    monkeypatch.setattr(_torch_ops, "_run", counting_run)
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    counters.clear()
    schedule = [[0, 100, 250], [1, 101, 251], [40, 7, 299], [298, 0, 12], [5, 5, 5]]
    for turn, lengths in enumerate(schedule):
        q = rand(batch, 1, heads_q, head_dim)
        k_new, v_new = rand(batch, 1, heads_kv, head_dim), rand(batch, 1, heads_kv, head_dim)
        lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        k_host, v_host = k.cpu(), v.cpu()
        ref_out, ref_lse = reference.forward(q, k_host, v_host, causal=True, cache_seqlens=lengths,
                                             k_new=k_new, v_new=v_new)
        caches = reference.append_kv(k_host, v_host, lengths, k_new, v_new)
        out, lse = compiled(q, k, v, k_new, v_new, lens)
        _check(out.clone(), lse.clone(), ref_out, ref_lse, "f16", what=f"turn {turn}")
        _check_caches(k, v, caches)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert 1 <= len(runs) <= 2, f"the op ran {len(runs)} times in {len(schedule)} turns"
