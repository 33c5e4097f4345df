"""fmha_native.distributed (context parallelism on torch.distributed) and combine's lists
and aliasing.

The multi-process tests start W workers on 127.0.0.1 (this file run as a script, gloo on
the CPU; NCCL on GPUs when two or more are visible), once per world: the parent writes
every case's per-rank inputs to a file, each worker runs all of them and saves its
results, and the parent holds each rank's rows to a single-process fmha_native.forward on
the full sequence and to the float64 reference.  Each world has a hard time limit.
"""
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import fmha_native  # noqa: E402
from fmha_native import reference  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import OUT_RTOL, assert_close, rel_fro  # noqa: E402

# Seconds one world (start, every case, exit) may take before its workers are killed.
WORLD_TIMEOUT = 90
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


# ---------------------------------------------------------------------------
# Inputs and their shards
# ---------------------------------------------------------------------------

def _randn(gen, shape, dtype):
    return torch.randn(shape, generator=gen).to(DTYPES[dtype])


def _positions(layout, rank, world, local):
    """The sequence positions rank holds, in its local order."""
    if layout == "contiguous":
        return list(range(rank * local, (rank + 1) * local))
    chunk = local // 2
    second = 2 * world - 1 - rank
    return (list(range(rank * chunk, (rank + 1) * chunk)) +
            list(range(second * chunk, (second + 1) * chunk)))


def _prefill_cases(world, gpu):
    """Every method x layout x causal x dtype, GQA, odd shard lengths; a few extras."""
    dtypes = ("bf16",) if gpu else ("f32", "bf16")
    head_dim = 64 if gpu else 32
    cases = []
    for method in ("ring", "allgather"):
        for layout in ("contiguous", "zigzag"):
            for causal in (False, True):
                for dtype in dtypes:
                    # contiguous: odd shards of 7; zigzag: odd chunks of 3.
                    local = 7 if layout == "contiguous" else 6
                    cases.append(dict(method=method, layout=layout, causal=causal, dtype=dtype,
                                      batch=2, local_q=local, local_k=local, heads_q=4,
                                      heads_kv=2, head_dim=head_dim))
    dtype = dtypes[0]
    for method in ("ring", "allgather"):
        # MQA, and an explicit softmax_scale.
        cases.append(dict(method=method, layout="zigzag", causal=True, dtype=dtype, batch=1,
                          local_q=10, local_k=10, heads_q=3, heads_kv=1, head_dim=head_dim,
                          softmax_scale=0.3))
        # Unmasked with more keys than queries per rank.
        cases.append(dict(method=method, layout="contiguous", causal=False, dtype=dtype,
                          batch=2, local_q=5, local_k=9, heads_q=2, heads_kv=2,
                          head_dim=head_dim))
    # Causal windows, both methods and layouts: narrower than a chunk (blocks of other
    # ranks drop rows or vanish), about a shard, wider than the sequence, right -1.
    if not gpu or _gpu_has_windows():
        for method in ("ring", "allgather"):
            for layout in ("contiguous", "zigzag"):
                for window in ((0, 0), (2, 0), (5, -1), (9, 0), (200, 0)):
                    for dtype in dtypes:
                        cases.append(dict(method=method, layout=layout, causal=True,
                                          dtype=dtype, batch=1, local_q=6, local_k=6,
                                          heads_q=4, heads_kv=2, head_dim=head_dim,
                                          window=window))
            cases.append(dict(method=method, layout="zigzag", causal=True, dtype=dtypes[-1],
                              batch=2, local_q=8, local_k=8, heads_q=2, heads_kv=1,
                              head_dim=head_dim, window=(3, 0)))
            # Windows without causal: both sides bounded, one side open, a band that
            # reaches past a chunk; the layout matters again (positions decide).
            for layout in ("contiguous", "zigzag"):
                for window in ((0, 0), (3, 2), (-1, 4), (7, -1), (1, 13)):
                    cases.append(dict(method=method, layout=layout, causal=False,
                                      dtype=dtypes[-1], batch=1, local_q=6, local_k=6,
                                      heads_q=4, heads_kv=2, head_dim=head_dim,
                                      window=window))
    # out_dtype=float32 for bfloat16 inputs: no partial and no result is rounded.
    for method in ("ring", "allgather"):
        for layout in ("contiguous", "zigzag"):
            cases.append(dict(method=method, layout=layout, causal=True, dtype="bf16",
                              batch=1, local_q=6, local_k=6, heads_q=4, heads_kv=2,
                              head_dim=head_dim, out_dtype="float32"))
    # world 3: a sub-group whose rank 0 is global rank 1 (the ring's peers are global
    # ranks); world 2: a group of one rank (no communication at all).
    for method in ("ring", "allgather"):
        cases.append(dict(method=method, layout="zigzag", causal=True, dtype=dtype,
                          batch=1, local_q=8, local_k=8, heads_q=4, heads_kv=2,
                          head_dim=head_dim, group=[1, 2] if world == 3 else [0]))
    for i, case in enumerate(cases):
        case["kind"] = "prefill"
        case["name"] = (f"{case['method']}-{case['layout']}-"
                        f"{'causal' if case['causal'] else 'full'}-{case['dtype']}-"
                        f"q{case['local_q']}k{case['local_k']}h{case['heads_q']}/"
                        f"{case['heads_kv']}" + _group_tag(case) + _window_tag(case) +
                        _out_tag(case) + f"-{i}")
    return cases


def _gpu_has_windows():
    """Whether the GPU kernels run a causal window (the CPU always does)."""
    if not torch.cuda.is_available() or not fmha_native.info().get("devices"):
        return False
    x = torch.zeros(1, 16, 2, 64, dtype=torch.bfloat16, device="cuda")
    try:
        plan = fmha_native.explain(x, x, x, causal=True, window=(4, 0))
    except NotImplementedError:
        return False
    return bool(plan.get("supported"))


def _decode_cases(world, gpu):
    dtypes = ("bf16",) if gpu else ("f32", "bf16")
    head_dim = 64 if gpu else 32
    cases = []
    for dtype in dtypes:
        for paged in (False, True):
            for seqlen_q in (1, 2):
                cases.append(dict(kind="decode", dtype=dtype, paged=paged, batch=4,
                                  seqlen_q=seqlen_q, heads_q=4, heads_kv=2, head_dim=head_dim))
    cases.append(dict(kind="decode", dtype=dtypes[0], paged=False, batch=2, seqlen_q=1,
                      heads_q=2, heads_kv=1, head_dim=head_dim,
                      group=[1, 2] if world == 3 else [0]))
    for paged in (False, True):
        cases.append(dict(kind="decode", dtype="bf16", paged=paged, batch=4, seqlen_q=2,
                          heads_q=4, heads_kv=2, head_dim=head_dim, out_dtype="float32"))
    for i, case in enumerate(cases):
        case["name"] = (f"decode-{case['dtype']}-{'paged' if case['paged'] else 'dense'}-"
                        f"sq{case['seqlen_q']}" + _group_tag(case) + _out_tag(case) +
                        f"-{i}")
    return cases


def _window_tag(case):
    return "-window{}_{}".format(*case["window"]) if case.get("window") else ""


def _out_tag(case):
    return "-out" + case["out_dtype"] if case.get("out_dtype") else ""


def _group_tag(case):
    return "-group" + "".join(map(str, case["group"])) if "group" in case else ""


def _members(case, world):
    return case.get("group", list(range(world)))


def _prepare_prefill(case, world, gen):
    w = len(_members(case, world))
    sq, sk = case["local_q"] * w, case["local_k"] * w
    b, hq, hk, d = case["batch"], case["heads_q"], case["heads_kv"], case["head_dim"]
    q = _randn(gen, (b, sq, hq, d), case["dtype"])
    k = _randn(gen, (b, sk, hk, d), case["dtype"])
    v = _randn(gen, (b, sk, hk, d), case["dtype"])
    ranks = []
    for r in range(w):
        pq = _positions(case["layout"], r, w, case["local_q"])
        pk = _positions(case["layout"], r, w, case["local_k"])
        ranks.append({"q": q[:, pq].contiguous(), "k": k[:, pk].contiguous(),
                      "v": v[:, pk].contiguous(), "positions": torch.tensor(pq)})
    case["full"] = {"q": q, "k": k, "v": v}
    case["ranks"] = ranks


def _prepare_decode(case, world, gen):
    """Ragged shards of every sequence's keys: one rank holds none of any sequence, one
    sequence has no key at all; slots past a shard's length (and unused pages) are NaN."""
    w = len(_members(case, world))
    b, sq, hq, hk, d = (case["batch"], case["seqlen_q"], case["heads_q"], case["heads_kv"],
                        case["head_dim"])
    dtype = DTYPES[case["dtype"]]
    counts = torch.randint(0, 40, (b, w), generator=gen)
    counts[:, w - 1] = 0          # a rank holding no key of any sequence
    counts[0] = 0                 # a sequence with no key anywhere
    counts[1, 0] = 33             # more than two pages on one rank
    q = _randn(gen, (b, sq, hq, d), case["dtype"])
    page = 16
    shards = []
    for r in range(w):
        cap = max(16, int(counts[:, r].max()) + 3)
        cap = -(-cap // page) * page
        k = _randn(gen, (b, cap, hk, d), case["dtype"])
        v = _randn(gen, (b, cap, hk, d), case["dtype"])
        for s in range(b):
            k[s, int(counts[s, r]):] = float("nan")
            v[s, int(counts[s, r]):] = float("nan")
        shards.append((k, v, counts[:, r].to(torch.int32).contiguous()))
    # The full sequences: shard 0's keys, then shard 1's, ...
    total = counts.sum(1)
    cap_full = max(1, int(total.max()))
    k_full = torch.zeros((b, cap_full, hk, d), dtype=dtype)
    v_full = torch.zeros((b, cap_full, hk, d), dtype=dtype)
    for s in range(b):
        at = 0
        for r, (k, v, lens) in enumerate(shards):
            n = int(lens[s])
            k_full[s, at:at + n] = k[s, :n]
            v_full[s, at:at + n] = v[s, :n]
            at += n
    ranks = []
    for k, v, lens in shards:
        entry = {"q": q, "cache_seqlens": lens}
        if case["paged"]:
            # The dense shard cut into pages, the pages shuffled, plus a spare NaN page.
            blocks = k.shape[1] // page
            pages = b * blocks + 1
            order = torch.randperm(b * blocks, generator=gen)
            kp = torch.full((pages, page, hk, d), float("nan"), dtype=dtype)
            vp = torch.full((pages, page, hk, d), float("nan"), dtype=dtype)
            kp[order] = k.reshape(b * blocks, page, hk, d)
            vp[order] = v.reshape(b * blocks, page, hk, d)
            entry.update(k=kp, v=vp, block_table=order.view(b, blocks).to(torch.int32))
        else:
            entry.update(k=k, v=v)
        ranks.append(entry)
    case["full"] = {"q": q, "k": k_full, "v": v_full, "cache_seqlens": total.to(torch.int32)}
    case["ranks"] = ranks


# ---------------------------------------------------------------------------
# Workers
# ---------------------------------------------------------------------------

def _run_case(case, rank, world, groups, device):
    """This rank's result of one case: (out, lse), or None when rank is not a member."""
    from fmha_native.distributed import context_parallel_decode, context_parallel_forward

    members = _members(case, world)
    if rank not in members:
        return None
    group = groups.get(tuple(members))
    inputs = {key: value.to(device) if torch.is_tensor(value) else value
              for key, value in case["ranks"][members.index(rank)].items()}
    if case["kind"] == "prefill":
        extra = {"window": case["window"]} if case.get("window") else {}
        return context_parallel_forward(
            inputs["q"], inputs["k"], inputs["v"], group=group, causal=case["causal"],
            softmax_scale=case.get("softmax_scale"), method=case["method"],
            layout=case["layout"], out_dtype=case.get("out_dtype"), **extra)
    out, lse = context_parallel_decode(
        inputs["q"], inputs["k"], inputs["v"], cache_seqlens=inputs["cache_seqlens"],
        block_table=inputs.get("block_table"), group=group, out_dtype=case.get("out_dtype"))
    # return_lse=False gives the same out.
    alone = context_parallel_decode(
        inputs["q"], inputs["k"], inputs["v"], cache_seqlens=inputs["cache_seqlens"],
        block_table=inputs.get("block_table"), group=group, return_lse=False,
        out_dtype=case.get("out_dtype"))
    assert torch.equal(alone, out)
    return out, lse


def _worker(rank, world, port, folder, backend):
    from datetime import timedelta

    torch.set_num_threads(1)
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=WORLD_TIMEOUT))
    cases = torch.load(os.path.join(folder, "cases.pt"))
    groups = {}
    for members in sorted({tuple(c["group"]) for c in cases if "group" in c}):
        groups[members] = dist.new_group(list(members))  # every rank takes part
    results = {}
    for case in cases:
        result = _run_case(case, rank, world, groups, device)
        if result is not None:
            results[case["name"]] = tuple(x.cpu() for x in result)
    dist.barrier()
    torch.save(results, os.path.join(folder, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_world(world, backend, cases, folder):
    """Run every case on `world` workers; {rank: {case name: (out, lse)}}."""
    storable = [{key: value for key, value in case.items() if key != "full"} for case in cases]
    torch.save(storable, os.path.join(folder, "cases.pt"))
    port = _free_port()
    env = dict(os.environ, FMHA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(fmha_native.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_parent, env.get("PYTHONPATH", "")])
    if os.path.exists("/sys/class/net/lo"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo on loopback only
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker", str(rank),
                               str(world), str(port), folder, backend],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                              cwd=package_parent)
             for rank in range(world)]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=WORLD_TIMEOUT)[0].decode(errors="replace"))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
        pytest.fail(f"{world} {backend} workers did not finish in {WORLD_TIMEOUT} s")
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"worker {rank} of {world} failed:\n{log[-4000:]}"
    return {rank: torch.load(os.path.join(folder, f"rank{rank}.pt")) for rank in range(world)}


# One world per (backend, size): started once, its results shared by the checks below.
WORLDS = [("gloo", 2), ("gloo", 3), ("nccl", 2)]


def _gpu_world_reason():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return "NCCL context parallelism needs 2 visible GPUs"
    if not dist.is_nccl_available():
        return "this torch has no NCCL"
    if not fmha_native.info().get("devices"):
        return "fmha_native lists no GPU device"
    return None


def _all_cases(backend, world):
    gpu = backend == "nccl"
    gen = torch.Generator().manual_seed(5000 + 10 * world + gpu)
    cases = _prefill_cases(world, gpu) + _decode_cases(world, gpu)
    for case in cases:
        (_prepare_prefill if case["kind"] == "prefill" else _prepare_decode)(case, world, gen)
        case["gpu"] = gpu
    return cases


_world_results = {}


@pytest.fixture(scope="module")
def world_results(tmp_path_factory):
    def get(backend, world):
        key = (backend, world)
        if key not in _world_results:
            if backend == "nccl":
                reason = _gpu_world_reason()
                if reason:
                    pytest.skip(reason)
            if not dist.is_gloo_available() and backend == "gloo":
                pytest.skip("this torch has no gloo backend")
            cases = _all_cases(backend, world)
            folder = str(tmp_path_factory.mktemp(f"{backend}{world}"))
            _world_results[key] = (cases, _run_world(world, backend, cases, folder))
        return _world_results[key]
    return get


def _expected(case, device):
    """(single-process forward, float64 reference) on the full problem."""
    full = case["full"]
    if case["kind"] == "prefill":
        kw = {"causal": case["causal"], "softmax_scale": case.get("softmax_scale")}
        if case.get("window"):
            kw["window"] = case["window"]
    else:
        kw = {"cache_seqlens": full["cache_seqlens"]}
    dev = {key: value.to(device) for key, value in full.items()}
    if case["kind"] == "decode":
        dev["cache_seqlens"] = full["cache_seqlens"].to(device)
        kw["cache_seqlens"] = dev["cache_seqlens"]
    # A window runs on the CPU backend (GPU kernels for it may not be built yet).
    one_dev = "cpu" if case.get("window") else device
    dev = {key: value.to(one_dev) for key, value in dev.items()}
    if "cache_seqlens" in kw:
        kw["cache_seqlens"] = dev["cache_seqlens"]
    one = fmha_native.forward(dev["q"], dev["k"], dev["v"], out_dtype=case.get("out_dtype"),
                              **kw)
    ref_kw = dict(kw)
    if case["kind"] == "decode":
        ref_kw["cache_seqlens"] = full["cache_seqlens"].numpy()
    ref = reference.forward(full["q"], full["k"], full["v"], **ref_kw)
    return tuple(x.cpu() for x in one), ref


def _f64(x):
    return x.double().numpy()


def _runs_on_gpu(case):
    """Whether the workers' forward calls on this case's host tensors ran on a GPU."""
    full = case["full"]
    return fmha_native.explain(full["q"], full["k"], full["v"])["backend"] == "gpu"


def _check(case, rank_out, rank_lse, one, ref, rows, what):
    """One rank's result against the single-process forward and the reference, on the
    given query positions."""
    out, lse = _f64(rank_out), _f64(rank_lse)
    one_out, one_lse = _f64(one[0])[:, rows], _f64(one[1])[:, :, rows]
    ref_out, ref_lse = ref[0][:, rows], ref[1][:, :, rows]
    f32_out = case.get("out_dtype") == "float32"
    out_dtype = torch.float32 if f32_out else DTYPES[case["dtype"]]
    assert rank_out.dtype == out_dtype and rank_lse.dtype == torch.float32, what
    # out_dtype=float32 on the CPU: nothing is rounded after the fp32 math, so the float32
    # bound holds for bfloat16 inputs too (GPU tiles round P to bfloat16: its own bound).
    # CPU tensors run on a visible GPU when its gate admits them (device=None).
    on_gpu = case["gpu"] or _runs_on_gpu(case)
    bound = "f32" if f32_out and not on_gpu else case["dtype"]
    assert_close(out, lse, ref_out, ref_lse, bound, what=what)
    if case["dtype"] == "f32" or (f32_out and not on_gpu):
        # Same arithmetic up to the order of the merge: close to the last bits.
        fin = np.isfinite(one_lse)
        assert np.array_equal(np.isneginf(lse), np.isneginf(one_lse)), what
        assert np.abs(out - one_out).max() <= 2e-5, f"{what}: out differs from one process"
        assert np.abs(lse[fin] - one_lse[fin]).max() <= 2e-5, f"{what}: lse differs"
    else:
        # The partials are rounded to bfloat16 once each, the result once more.
        err = rel_fro(out, one_out)
        assert err <= OUT_RTOL["bf16"], f"{what}: out differs from one process by {err:.3g}"


def _case_ids(backend, world):
    gpu = backend == "nccl"
    return [c["name"] for c in _prefill_cases(world, gpu) + _decode_cases(world, gpu)]


@pytest.mark.parametrize("backend,world,name",
                         [pytest.param(b, w, n, marks=[pytest.mark.gpu] if b == "nccl" else [])
                          for b, w in WORLDS for n in _case_ids(b, w)])
def test_context_parallel(world_results, backend, world, name):
    cases, results = world_results(backend, world)
    case = next(c for c in cases if c["name"] == name)
    device = "cuda:0" if backend == "nccl" else "cpu"
    one, ref = _expected(case, device)
    members = _members(case, world)
    for index, rank in enumerate(members):
        out, lse = results[rank][case["name"]]
        if case["kind"] == "prefill":
            rows = case["ranks"][index]["positions"].tolist()
        else:
            rows = list(range(case["full"]["q"].shape[1]))  # every rank: the whole result
        _check(case, out, lse, one, ref, rows, f"{name} rank {rank}")
    for rank in range(world):
        if rank not in members:
            assert name not in results[rank]


# ---------------------------------------------------------------------------
# Single process: argument errors, import, combine's lists and aliasing
# ---------------------------------------------------------------------------

def _small(dtype=torch.float32):
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(1, 4, 2, 16, generator=gen).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("change,error,match", [
    (dict(method="tree"), ValueError, "method"),
    (dict(layout="striped"), ValueError, "layout"),
    (dict(q=np.zeros((1, 4, 2, 16), np.float32)), TypeError, r"\bq\b"),
    (dict(k=torch.zeros(1, 4, 2, 16, dtype=torch.float16)), TypeError, "dtype"),
    (dict(k=torch.zeros(1, 6, 2, 16), v=torch.zeros(1, 6, 2, 16), causal=True), ValueError,
     r"q.shape\[1\]"),
    (dict(q=torch.zeros(1, 5, 2, 16), k=torch.zeros(1, 5, 2, 16), v=torch.zeros(1, 5, 2, 16),
          causal=True, layout="zigzag"), ValueError, "even"),
    (dict(v=torch.zeros(1, 5, 2, 16)), ValueError, "one shape"),
    (dict(out_dtype="bfloat16"), ValueError, "out_dtype"),
    (dict(k=torch.zeros(1, 6, 2, 16), v=torch.zeros(1, 6, 2, 16), window=(4, 1)), ValueError,
     r"q.shape\[1\]"),
    (dict(window=(4, 2), causal=True), ValueError, "window"),
    (dict(window=(-2, 0), causal=True), ValueError, "window"),
    (dict(window=4, causal=True), TypeError, "window"),
    (dict(out_dtype=torch.float16), ValueError, "out_dtype"),
    ({}, ValueError, "init_process_group"),
])
def test_forward_argument_errors(change, error, match):
    from fmha_native.distributed import context_parallel_forward

    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    q, k, v = _small()
    kw = dict(q=q, k=k, v=v, causal=False)
    kw.update(change)
    with pytest.raises(error, match=match):
        context_parallel_forward(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)


def _covered(calls, nq, nk):
    """How often each (local query row, local key row) pair is attended by the calls,
    under forward's rule: a call of sq rows and sk keys puts row i at position
    i + sk - sq, causal keeps keys <= it, window (left, right) those within."""
    counts = np.zeros((nq, nk), int)
    for rows, keys, causal, window in calls:
        sq, sk = rows.stop - rows.start, keys.stop - keys.start
        for i in range(sq):
            pos = i + sk - sq
            for j in range(sk):
                ok = j <= pos if causal else True
                if window is not None:
                    wl, wr = window
                    wr = 0 if causal else wr
                    ok = ok and (wl < 0 or j >= pos - wl) and (wr < 0 or j <= pos + wr)
                counts[rows.start + i, keys.start + j] += ok
    return counts


def _visible(q_pos, k_pos, window):
    """Which (query, key) position pairs window = (left, right) shows (-1 unbounded)."""
    left, right = window
    return np.array([[int((left < 0 or p - left <= j) and (right < 0 or j <= p + right))
                      for j in k_pos] for p in q_pos])


# Causal windows (right 0) and windows without causal, each side bounded or not.
WINDOWS = [(left, 0) for left in (0, 1, 2, 3, 5, 6, 7, 15, 300)] + \
    [(0, 1), (2, 3), (-1, 2), (4, -1), (0, -1), (-1, 0), (9, 9), (1, 20)]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("local", [2, 6, 7])
def test_window_calls_cover_exactly_the_window(world, layout, local):
    """Every (rank, source rank) block of the ring, for windows from 0 to past the
    sequence, causal or not: each visible pair is attended exactly once, nothing else."""
    from fmha_native.distributed import _chunks, _window_calls

    if layout == "zigzag" and local % 2:
        pytest.skip("zigzag holds two equal chunks")
    for window in WINDOWS:
        for rank in range(world):
            mine = _chunks(layout, rank, world, local)
            q_pos = [p for a, b in mine for p in range(a, b)]
            for src in range(world):
                theirs = _chunks(layout, src, world, local)
                k_pos = [p for a, b in theirs for p in range(a, b)]
                calls = _window_calls(mine, theirs, window)
                got = _covered(calls, len(q_pos), len(k_pos))
                want = _visible(q_pos, k_pos, window)
                assert np.array_equal(got, want), (window, rank, src, calls)
                # No call attends to nothing, and rows are never given twice in one call.
                assert all(r.stop > r.start and c.stop > c.start for r, c, _, _ in calls)


@pytest.mark.parametrize("q_range, k_range", [((5, 9), (0, 9)), ((5, 9), (2, 4)),
                                              ((5, 9), (9, 12)), ((0, 3), (0, 3)),
                                              ((4, 8), (2, 6)), ((2, 5), (0, 11))])
def test_window_calls_prefix_and_before(q_range, k_range):
    """The all-gather's prefix blocks and arbitrary key ranges before the queries."""
    from fmha_native.distributed import _window_calls

    for window in WINDOWS + [(left, right) for left in range(-1, 12) for right in (-1, 0, 2, 5)]:
        calls = _window_calls([q_range], [k_range], window)
        got = _covered(calls, q_range[1] - q_range[0], k_range[1] - k_range[0])
        assert np.array_equal(got, _visible(range(*q_range), range(*k_range), window)), window


@pytest.mark.parametrize("wide", [True, False])
def test_ring_partials_float32_or_rounded_once(monkeypatch, wide):
    """The ring's two ways of making a block's partial, in one process (rank 1 of 2 with
    no transfers: its own K/V stand for rank 0's too): float32 (the CPU, and GPU blocks
    whose producer writes fp32 partials) or rounded to q's dtype and widened (GPU blocks
    the sm90 kernel runs); _wide_partials decides per distinct block, and not at all when
    the caller asks for a float32 result."""
    from fmha_native import distributed as cp

    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 8, 2, 32, generator=gen).bfloat16() for _ in range(3))
    asked = []
    monkeypatch.setattr(cp, "_wide_partials",
                        lambda torch_, args, kw: asked.append(args[0].shape[1]) or wide)

    def run(f32_result):
        return cp._ring(torch, dist, q, k, v, True, None, "contiguous", None, 1, 2,
                        lambda i: i, communicate=False, f32_result=f32_result)

    out, lse = run(False)
    assert sorted(asked) == [8, 8] and out.dtype == torch.bfloat16
    # Keys 0..7 (rank 0's, here the same values) then 8..15 causally.
    kk, vv = torch.cat([k, k], 1), torch.cat([v, v], 1)
    ref_out, ref_lse = reference.forward(q, kk, vv, causal=True)
    assert_close(_f64(out), _f64(lse), ref_out, ref_lse, "bf16")
    asked.clear()
    out32, lse32 = run(True)
    assert not asked and out32.dtype == torch.float32
    # CPU tensors run on a visible GPU when its gate admits them; its tiles round P to
    # bfloat16, so the float32 bound holds only where the CPU ran them.
    on_gpu = fmha_native.explain(q, kk, vv)["backend"] == "gpu"
    assert_close(_f64(out32), _f64(lse32), ref_out, ref_lse, "bf16" if on_gpu else "f32")
    if wide:  # the same float32 partials: the 16-bit result is the float32 one rounded
        assert torch.equal(out32.bfloat16(), out)


def test_decode_needs_a_group():
    from fmha_native.distributed import context_parallel_decode

    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    q, k, v = _small()
    with pytest.raises(ValueError, match="init_process_group"):
        context_parallel_decode(q, k, v, cache_seqlens=torch.tensor([4], dtype=torch.int32))


def test_import_does_not_load_torch():
    # fmha_native.distributed loads on first use, and loads torch at its first call.
    code = ("import sys, fmha_native; assert 'torch' not in sys.modules; "
            "d = fmha_native.distributed; assert 'torch' not in sys.modules; "
            "print(d.context_parallel_forward.__name__)")
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(fmha_native.__file__)))
    env = dict(os.environ, PYTHONPATH=package_parent)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=package_parent, timeout=60)
    assert run.returncode == 0 and "context_parallel_forward" in run.stdout, run.stderr


def _partials(groups=3, dtype=torch.float32, seed=2, head_dim=24):
    gen = torch.Generator().manual_seed(seed)
    outs = torch.randn(groups, 2, 5, 3, head_dim, generator=gen).to(dtype)
    lses = torch.randn(groups, 2, 3, 5, generator=gen) * 3
    lses[1, 0, 1, 2] = float("-inf")   # a partial with no key in a live row
    lses[:, 1, 2, 4] = float("-inf")   # a row with no key anywhere
    outs[1, 0, 2, 1] = float("nan")    # ignored: that partial's lse is -inf
    return outs, lses


def _close_to_reference(out, lse, outs, lses, dtype="f32"):
    ref_out, ref_lse = reference.combine(outs, lses)
    assert_close(_f64(out), _f64(lse), ref_out, ref_lse, dtype)


@pytest.mark.parametrize("kind", ["tuple_of_views", "list_of_copies", "numpy_views",
                                  "numpy_copies", "mixed"])
def test_combine_lists(kind):
    outs, lses = _partials()
    if kind == "tuple_of_views":
        args = (tuple(outs.unbind(0)), tuple(lses.unbind(0)))
    elif kind == "list_of_copies":
        args = ([x.clone() for x in outs], [x.clone() for x in lses])
    elif kind == "numpy_views":
        on, ln = outs.numpy(), lses.numpy()
        args = ([on[g] for g in range(3)], [ln[g] for g in range(3)])
    elif kind == "numpy_copies":
        args = ([outs[g].numpy().copy() for g in range(3)],
                [lses[g].numpy().copy() for g in range(3)])
    else:  # a list of outs with a stacked lses
        args = (list(outs), lses)
    out, lse = fmha_native.combine(*args)
    assert type(out) is (np.ndarray if kind.startswith("numpy") else torch.Tensor)
    _close_to_reference(torch.as_tensor(out), torch.as_tensor(lse), outs, lses)


def test_combine_views_not_copied():
    """Equally spaced views of one buffer become one strided view of it (no copy);
    others are stacked."""
    outs, lses = _partials()
    items = list(outs.unbind(0))
    from fmha_native import _partials as as_one

    view = as_one(items, "outs")
    assert view.data_ptr() == outs.data_ptr() and view.stride() == outs.stride()
    # Every other step: still one buffer, stride two partials.
    every_other = as_one([outs[0], outs[2]], "outs")
    assert every_other.data_ptr() == outs.data_ptr() and every_other.stride(0) == outs.stride(0) * 2
    # Unequal steps are stacked.
    stacked = as_one([outs[0], outs[2], outs[1]], "outs")
    assert stacked.data_ptr() != outs.data_ptr()
    assert torch.equal(stacked[2].nan_to_num(), outs[1].nan_to_num())


def _combine_device(name):
    if name == "cpu":
        return "cpu"
    if not torch.cuda.is_available() or not fmha_native.info().get("devices"):
        pytest.skip("no CUDA device for torch and fmha_native: the GPU combine did not run")
    return "cuda"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("head_dim", [24, 300])  # 300: more than one chunk of features
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("slot", [0, 2])
@pytest.mark.parametrize("form", ["stacked", "list"])
def test_combine_out_aliases_one_partial(device, head_dim, dtype, slot, form):
    device = _combine_device(device)
    outs, lses = _partials(dtype=DTYPES[dtype], head_dim=head_dim)
    outs, lses = outs.to(device), lses.to(device)
    expect_out, expect_lse = fmha_native.combine(outs.clone(), lses)
    work = outs.clone()
    target = work[slot]
    lse = torch.empty(2, 3, 5, device=device)
    args = (work, lses) if form == "stacked" else (list(work.unbind(0)), list(lses.unbind(0)))
    out, lse_out = fmha_native.combine(*args, out=target, lse=lse)
    assert out is target and lse_out is lse
    # The in-place merge equals the merge into fresh memory, bit for bit.
    assert torch.equal(target.view(torch.int16 if dtype == "bf16" else torch.int32),
                       expect_out.view(torch.int16 if dtype == "bf16" else torch.int32))
    assert torch.equal(lse, expect_lse)
    _close_to_reference(target.cpu(), lse.cpu(), outs.cpu(), lses.cpu(), dtype)
    # The other partials are untouched.
    for g in range(3):
        if g != slot:
            assert torch.equal(work[g].nan_to_num(), outs[g].nan_to_num())


def test_combine_numpy_out_aliases_one_partial():
    outs, lses = _partials()
    on, ln = outs.numpy().copy(), lses.numpy()
    expect_out, expect_lse = fmha_native.combine(on.copy(), ln)
    out, lse = fmha_native.combine(on, ln, out=on[1])
    assert np.array_equal(on[1], expect_out) and np.array_equal(lse, expect_lse)


@pytest.mark.parametrize("how", ["shifted_row", "other_strides", "lse_is_partial"])
def test_combine_partial_aliases_refused(how):
    outs, lses = _partials()
    work = outs.clone()
    kw = {}
    if how == "shifted_row":
        # One row past partial 0: rows would be written before other rows read them.
        kw["out"] = work.view(-1)[3 * 24:3 * 24 + work[0].numel()].view(work[0].shape)
    elif how == "other_strides":
        # The same memory as partial 0 read in another order.
        kw["out"] = work[0].view(2, 3, 5, 24).transpose(1, 2)
    else:
        kw["lse"] = lses[0]
    before = work.clone()
    with pytest.raises(ValueError, match=r"\b(out|lse)\b overlaps"):
        fmha_native.combine(work, lses, **kw)
    assert torch.equal(work.nan_to_num(), before.nan_to_num())


@pytest.mark.parametrize("case,error,match", [
    ("empty", ValueError, "at least one partial"),
    ("shapes", ValueError, r"outs\[1\]"),
    ("kinds", TypeError, r"outs\[1\]"),
])
def test_combine_list_errors(case, error, match):
    outs, lses = _partials()
    if case == "empty":
        args = ([], [])
    elif case == "shapes":
        args = ([outs[0], outs[1][:, :4].clone()], lses[:2])
    else:
        args = ([outs[0], outs[1].numpy()], lses[:2])
    with pytest.raises(error, match=match):
        fmha_native.combine(*args)


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "worker":
    _worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
