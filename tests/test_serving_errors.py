"""Bad serving input (issue 20): every refusal of block_table, cu_seqlens_q/k and
max_seqlen_q/k that the host glue makes before anything runs.  Each case starts from a
call that works, breaks one thing, and checks the exception type, that the message names
the argument (and the rule), and that out, lse, k, v and k_new were not written."""
import json

import numpy as np
import pytest

import fmha_native
from _harness import NO_GPU_REASON, gpu_devices, run_python, torch_cuda

HEADS_Q, HEADS_KV, HEAD_DIM = 4, 2, 16
PAGE = 16


def _rand(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _packed_cache():
    """Packed queries appending packed rows to a dense cache: lengths 3, 0, 5."""
    rng = np.random.default_rng(2001)
    cu_q = np.array([0, 3, 3, 8], np.int32)
    return dict(
        q=_rand(rng, (8, HEADS_Q, HEAD_DIM)),
        k=_rand(rng, (3, 32, HEADS_KV, HEAD_DIM)), v=_rand(rng, (3, 32, HEADS_KV, HEAD_DIM)),
        cu_seqlens_q=cu_q, cache_seqlens=np.array([4, 10, 0], np.int32),
        k_new=_rand(rng, (8, HEADS_KV, HEAD_DIM)), v_new=_rand(rng, (8, HEADS_KV, HEAD_DIM)),
        out=np.full((8, HEADS_Q, HEAD_DIM), 7.0, np.float32),
        lse=np.full((HEADS_Q, 8), 7.0, np.float32))


def _packed_keys():
    """Packed queries over packed keys: query lengths 3, 0, 5; key lengths 6, 2, 9."""
    rng = np.random.default_rng(2002)
    return dict(
        q=_rand(rng, (8, HEADS_Q, HEAD_DIM)),
        k=_rand(rng, (17, HEADS_KV, HEAD_DIM)), v=_rand(rng, (17, HEADS_KV, HEAD_DIM)),
        cu_seqlens_q=np.array([0, 3, 3, 8], np.int32),
        cu_seqlens_k=np.array([0, 6, 8, 17], np.int32),
        out=np.full((8, HEADS_Q, HEAD_DIM), 7.0, np.float32),
        lse=np.full((HEADS_Q, 8), 7.0, np.float32))


def _paged():
    """A paged cache of 7 pages of 16 keys, 3 blocks per sequence, appending 2 rows each
    to lengths 5, 20, 0; -1 entries past each sequence's pages."""
    rng = np.random.default_rng(2003)
    table = np.array([[4, -1, -1], [0, 6, -1], [2, -1, -1]], np.int32)
    return dict(
        q=_rand(rng, (3, 2, HEADS_Q, HEAD_DIM)),
        k=_rand(rng, (7, PAGE, HEADS_KV, HEAD_DIM)), v=_rand(rng, (7, PAGE, HEADS_KV, HEAD_DIM)),
        block_table=table, cache_seqlens=np.array([5, 20, 0], np.int32),
        k_new=_rand(rng, (3, 2, HEADS_KV, HEAD_DIM)), v_new=_rand(rng, (3, 2, HEADS_KV, HEAD_DIM)),
        out=np.full((3, 2, HEADS_Q, HEAD_DIM), 7.0, np.float32),
        lse=np.full((3, HEADS_Q, 2), 7.0, np.float32))


BASES = {"packed_cache": _packed_cache, "packed_keys": _packed_keys, "paged": _paged}
WRITTEN = ("out", "lse", "k", "v", "k_new")


def _call(kw):
    kw = dict(kw)
    return fmha_native.forward(kw.pop("q"), kw.pop("k"), kw.pop("v"), device="cpu", **kw)


@pytest.mark.parametrize("base", sorted(BASES))
def test_bases_run(base):
    """The starting points are valid: each error below comes from the one change."""
    out, lse = _call(BASES[base]())
    assert np.isfinite(out).all() and np.isfinite(lse).all()


def _set(**changes):
    def apply(kw):
        for key, value in changes.items():
            if value is None:
                kw.pop(key, None)
            else:
                kw[key] = value(kw) if callable(value) else value
    return apply


# (id, base, change, exception, words the message must contain)
CASES = [
    # combinations
    ("cu_k_without_cu_q", "packed_keys",
     _set(cu_seqlens_q=None, q=lambda kw: kw["q"][None], out=None, lse=None),
     ValueError, ["cu_seqlens_k", "cu_seqlens_q"]),
    ("cu_k_with_cache_seqlens", "packed_keys",
     _set(cache_seqlens=np.array([1, 1, 1], np.int32)), ValueError,
     ["cu_seqlens_k", "cache_seqlens"]),
    ("cu_k_with_block_table", "packed_keys",
     _set(block_table=np.zeros((3, 1), np.int32)), ValueError, ["cu_seqlens_k", "block_table"]),
    ("cu_k_with_k_new", "packed_keys",
     _set(k_new=lambda kw: np.zeros((8, HEADS_KV, HEAD_DIM), np.float32),
          v_new=lambda kw: np.zeros((8, HEADS_KV, HEAD_DIM), np.float32)),
     ValueError, ["cu_seqlens_k", "k_new"]),
    # dtypes
    ("cu_q_int64", "packed_cache", _set(cu_seqlens_q=lambda kw: kw["cu_seqlens_q"].astype(np.int64)),
     TypeError, ["cu_seqlens_q", "int32", "int64"]),
    ("cu_k_int64", "packed_keys", _set(cu_seqlens_k=lambda kw: kw["cu_seqlens_k"].astype(np.int64)),
     TypeError, ["cu_seqlens_k", "int32", "int64"]),
    ("block_table_float32", "paged", _set(block_table=lambda kw: kw["block_table"].astype(np.float32)),
     TypeError, ["block_table", "int32", "float32"]),
    ("block_table_int64", "paged", _set(block_table=lambda kw: kw["block_table"].astype(np.int64)),
     TypeError, ["block_table", "int32", "int64"]),
    # cu_seqlens shapes and values
    ("cu_q_2d", "packed_cache", _set(cu_seqlens_q=lambda kw: kw["cu_seqlens_q"][None]),
     ValueError, ["cu_seqlens_q", "1-D"]),
    ("cu_q_empty", "packed_cache", _set(cu_seqlens_q=np.zeros(0, np.int32)),
     ValueError, ["cu_seqlens_q", "batch + 1"]),
    ("cu_k_wrong_length", "packed_keys", _set(cu_seqlens_k=np.array([0, 6, 17], np.int32)),
     ValueError, ["cu_seqlens_k", "batch + 1"]),
    ("cu_q_not_from_0", "packed_cache", _set(cu_seqlens_q=np.array([1, 3, 3, 8], np.int32)),
     ValueError, ["cu_seqlens_q[0] = 1", "start at 0"]),
    ("cu_q_decreasing", "packed_keys", _set(cu_seqlens_q=np.array([0, 3, 2, 8], np.int32)),
     ValueError, ["cu_seqlens_q", "decrease"]),
    ("cu_q_wrong_end", "packed_keys", _set(cu_seqlens_q=np.array([0, 3, 3, 7], np.int32)),
     ValueError, ["cu_seqlens_q", "total_q", "q.shape[0]"]),
    ("cu_k_not_from_0", "packed_keys", _set(cu_seqlens_k=np.array([2, 6, 8, 17], np.int32)),
     ValueError, ["cu_seqlens_k[0] = 2", "start at 0"]),
    ("cu_k_decreasing", "packed_keys", _set(cu_seqlens_k=np.array([0, 9, 8, 17], np.int32)),
     ValueError, ["cu_seqlens_k", "decrease"]),
    ("cu_k_wrong_end", "packed_keys", _set(cu_seqlens_k=np.array([0, 6, 8, 18], np.int32)),
     ValueError, ["cu_seqlens_k", "total_k", "k.shape[0]"]),
    # max_seqlen_q / max_seqlen_k
    ("max_q_below_longest", "packed_keys", _set(max_seqlen_q=4), ValueError,
     ["cu_seqlens_q", "max_seqlen_q = 4"]),
    ("max_k_below_longest", "packed_keys", _set(max_seqlen_k=8), ValueError,
     ["cu_seqlens_k", "max_seqlen_k = 8"]),
    ("max_q_above_total", "packed_keys", _set(max_seqlen_q=9), ValueError, ["max_seqlen_q", "[1, 8]"]),
    ("max_k_above_total", "packed_keys", _set(max_seqlen_k=18), ValueError, ["max_seqlen_k", "[1, 17]"]),
    ("max_q_without_cu_q", "paged", _set(max_seqlen_q=2), ValueError, ["max_seqlen_q", "cu_seqlens_q"]),
    ("max_q_not_int", "packed_keys", _set(max_seqlen_q=3.0), TypeError, ["max_seqlen_q", "int"]),
    # packed shapes
    ("q_4d_with_cu_q", "packed_keys", _set(q=lambda kw: kw["q"][None], out=None, lse=None),
     ValueError, ["q", "3-D", "total_q"]),
    ("k_4d_with_cu_k", "packed_keys", _set(k=lambda kw: kw["k"][None], v=lambda kw: kw["v"][None]),
     ValueError, ["k", "3-D", "total_k"]),
    ("lse_dense_with_cu_q", "packed_keys",
     _set(lse=lambda kw: np.full((3, HEADS_Q, 5), 7.0, np.float32)), ValueError,
     ["lse", "[heads_q, total_q]"]),
    ("k_new_dense_with_cu_q", "packed_cache",
     _set(k_new=lambda kw: kw["k_new"].reshape(1, 8, HEADS_KV, HEAD_DIM),
          v_new=lambda kw: kw["v_new"].reshape(1, 8, HEADS_KV, HEAD_DIM)),
     ValueError, ["k_new", "total_q"]),
    ("dense_k_batch_with_cu_q", "packed_cache",
     _set(k=lambda kw: kw["k"][:2], v=lambda kw: kw["v"][:2]), ValueError,
     ["k", "cu_seqlens_q.shape[0] - 1"]),
    ("cache_seqlens_batch_with_cu_q", "packed_cache",
     _set(cache_seqlens=np.array([1, 1], np.int32)), ValueError, ["cache_seqlens", "[batch]"]),
    # paged shapes
    ("paged_k_3d", "paged", _set(k=lambda kw: kw["k"][0], v=lambda kw: kw["v"][0]), ValueError,
     ["k", "num_pages, page_size"]),
    ("page_size_24", "paged",
     _set(k=lambda kw: np.zeros((7, 24, HEADS_KV, HEAD_DIM), np.float32),
          v=lambda kw: np.zeros((7, 24, HEADS_KV, HEAD_DIM), np.float32)),
     ValueError, ["page_size", "multiple of 16", "24"]),
    ("page_size_differs", "paged",
     _set(v=lambda kw: np.zeros((7, 32, HEADS_KV, HEAD_DIM), np.float32)),
     ValueError, ["page_size", "v.shape[1]", "k.shape[1]"]),
    ("v_pages_differ", "paged",
     _set(v=lambda kw: np.zeros((6, PAGE, HEADS_KV, HEAD_DIM), np.float32)),
     ValueError, ["v", "the shape of k"]),
    ("block_table_1d", "paged", _set(block_table=lambda kw: kw["block_table"][0]),
     ValueError, ["block_table", "2-D"]),
    ("block_table_rows", "paged", _set(block_table=lambda kw: kw["block_table"][:2]),
     ValueError, ["block_table", "batch, max_blocks_per_seq"]),
    ("paged_head_dim", "paged",
     _set(k=lambda kw: np.zeros((7, PAGE, HEADS_KV, 8), np.float32),
          v=lambda kw: np.zeros((7, PAGE, HEADS_KV, 8), np.float32)),
     ValueError, ["k", "head_dim"]),
    # paged values
    ("block_table_page_out_of_range", "paged",
     _set(block_table=np.array([[4, -1, -1], [0, 7, -1], [2, -1, -1]], np.int32)),
     ValueError, ["block_table[1, 1] = 7", "num_pages = 7"]),
    ("block_table_negative_in_use", "paged",
     _set(block_table=np.array([[4, -1, -1], [-1, 6, -1], [2, -1, -1]], np.int32)),
     ValueError, ["block_table[1, 0] = -1"]),
    # without cache_seqlens every sequence fills its row: every entry is read
    ("block_table_full_rows", "paged",
     _set(cache_seqlens=None, k_new=None, v_new=None), ValueError,
     ["block_table[0, 1] = -1", "every row"]),
    ("paged_over_capacity", "paged",
     _set(cache_seqlens=np.array([5, 47, 0], np.int32),
          block_table=np.array([[4, -1, -1], [0, 6, 1], [2, -1, -1]], np.int32)),
     ValueError, ["cache_seqlens[1] = 47", "block_table.shape[1] * page_size"]),
    ("paged_max_k_above_capacity", "paged", _set(max_seqlen_k=49), ValueError,
     ["max_seqlen_k", "block_table.shape[1] * page_size"]),
    ("packed_append_over_capacity", "packed_cache",
     _set(cache_seqlens=np.array([4, 10, 28], np.int32)), ValueError,
     ["cache_seqlens[2] = 28", "new rows in cu_seqlens_q", "32"]),
    ("packed_append_negative", "packed_cache",
     _set(cache_seqlens=np.array([4, -1, 0], np.int32)), ValueError, ["cache_seqlens[1] = -1"]),
    ("k_new_without_cache", "paged", _set(cache_seqlens=None), ValueError,
     ["k_new", "cache_seqlens"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refused_before_anything_is_written(case):
    _, base, change, exc, words = case
    kw = BASES[base]()
    change(kw)
    before = {name: kw[name].copy() for name in WRITTEN if name in kw}
    with pytest.raises(exc) as info:
        _call(kw)
    msg = str(info.value)
    for word in words:
        assert word in msg, (word, msg)
    for name, value in before.items():
        assert np.array_equal(kw[name], value, equal_nan=True), f"{name} was written"


def test_block_table_entries_past_the_length_are_not_read():
    """Entries past ceil(len_k(b) / page_size) of a row may hold anything (-1 here,
    an out-of-range page too): host checks read only the pages a sequence uses."""
    kw = _paged()
    kw["block_table"][0, 2] = 99
    out, lse = _call(kw)
    assert np.isfinite(out).all() and np.isfinite(lse).all()


def test_refusal_checks_run_for_explain_too():
    kw = _packed_keys()
    kw["cu_seqlens_k"] = np.array([0, 6, 8, 16], np.int32)
    for name in ("out", "lse"):
        kw.pop(name)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        fmha_native.explain(kw.pop("q"), kw.pop("k"), kw.pop("v"), device="cpu", **kw)


@pytest.mark.parametrize("name", ["cu_seqlens_q", "block_table"])
def test_metadata_must_not_be_an_output(name):
    """Written tensors may not share memory with metadata: out over cu_seqlens_q's
    bytes, or k (appended to) over block_table's."""
    kw = _packed_cache() if name == "cu_seqlens_q" else _paged()
    if name == "cu_seqlens_q":
        buf = np.zeros(8 * HEADS_Q * HEAD_DIM, np.float32)
        kw["out"] = buf.reshape(8, HEADS_Q, HEAD_DIM)
        kw["cu_seqlens_q"] = buf[:4].view(np.int32)
        kw["cu_seqlens_q"][:] = [0, 3, 3, 8]
    else:
        kw["block_table"] = kw["k"].reshape(-1)[:9].view(np.int32).reshape(3, 3)
        kw["block_table"][:] = [[4, 5, 5], [0, 6, 1], [2, 3, 3]]
    with pytest.raises(ValueError) as info:
        _call(kw)
    assert name in str(info.value) and "overlaps" in str(info.value)


# ------------------------------------------------------------------ device tensors (GPU)

needs_cuda = pytest.mark.skipif(not (torch_cuda() and gpu_devices()), reason=NO_GPU_REASON)


@needs_cuda
@pytest.mark.parametrize("mode", ["packed", "paged"])
def test_gpu_unaligned_rows_refused_for_packed_and_paged(mode):
    """Packed and paged rows are read in place (no aligned staging copy): a device q
    whose rows start 2 bytes off a 16-byte boundary is a ValueError, out untouched."""
    import torch
    dev = torch.device("cuda")
    flat = torch.randn(8 * 8 * 64 + 1, device=dev, dtype=torch.float16)
    if mode == "packed":
        q = flat[1:].view(8, 8, 64)
        k = torch.randn(3, 32, 2, 64, device=dev, dtype=torch.float16)
        kw = dict(cu_seqlens_q=torch.tensor([0, 3, 3, 8], dtype=torch.int32, device=dev))
        out = torch.full((8, 8, 64), 7.0, device=dev, dtype=torch.float16)
    else:
        q = flat[1:].view(2, 4, 8, 64)
        k = torch.randn(5, 16, 2, 64, device=dev, dtype=torch.float16)
        kw = dict(block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=dev))
        out = torch.full((2, 4, 8, 64), 7.0, device=dev, dtype=torch.float16)
    with pytest.raises(ValueError) as info:
        fmha_native.forward(q, k, k.clone(), out=out, **kw)
    assert "q" in str(info.value) and "16-byte" in str(info.value)
    assert bool((out == 7.0).all())


_VALIDATE_SCRIPT = """
import json, torch, fmha_native
dev = torch.device("cuda")
i32 = dict(dtype=torch.int32, device=dev)
q = torch.randn(8, 8, 64, device=dev, dtype=torch.float16)
k = torch.randn(17, 2, 64, device=dev, dtype=torch.float16)
pages = torch.randn(4, 16, 2, 64, device=dev, dtype=torch.float16)
qd = torch.randn(2, 1, 8, 64, device=dev, dtype=torch.float16)
calls = {
    "cu_seqlens_q": lambda: fmha_native.forward(q, k, k, cu_seqlens_q=torch.tensor([0, 3, 2, 8], **i32),
                                                cu_seqlens_k=torch.tensor([0, 6, 8, 17], **i32)),
    "cu_seqlens_k": lambda: fmha_native.forward(q, k, k, cu_seqlens_q=torch.tensor([0, 3, 3, 8], **i32),
                                                cu_seqlens_k=torch.tensor([0, 6, 8, 16], **i32)),
    "block_table": lambda: fmha_native.forward(qd, pages, pages, block_table=torch.tensor([[0, 9], [1, 2]], **i32),
                                               cache_seqlens=torch.tensor([20, 5], **i32)),
}
res = {}
for name, call in calls.items():
    try:
        call()
        torch.cuda.synchronize()
        res[name] = ["ok", ""]
    except Exception as exc:
        res[name] = [type(exc).__name__, str(exc)]
print(json.dumps(res))
"""


@needs_cuda
def test_gpu_fmha_validate_reads_device_metadata():
    """Device metadata is never read on the host, except under FMHA_VALIDATE=1, where it
    is checked like host arrays (the kernels' NaN rule covers it otherwise)."""
    runs = {}
    for value in (None, "1"):
        env = {} if value is None else {"FMHA_VALIDATE": value}
        res = run_python(["-c", _VALIDATE_SCRIPT], env, drop=("FMHA_VALIDATE",), timeout=300)
        assert res.returncode == 0, res.stderr
        runs[value] = json.loads(res.stdout.strip().splitlines()[-1])
    for name in ("cu_seqlens_q", "cu_seqlens_k", "block_table"):
        assert runs[None][name][0] == "ok", (name, runs[None][name])
        assert runs["1"][name][0] == "ValueError", (name, runs["1"][name])
        assert runs["1"][name][1].startswith(name), runs["1"][name]
