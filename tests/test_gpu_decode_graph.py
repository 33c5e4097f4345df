"""A decode step with device cache_seqlens never reads them on the host: no
device-to-host copy or stream sync, capture in a torch CUDA graph and replay with new
lengths and appended tokens, and bad device lengths (negative, over capacity) giving
NaN rows for their entry while the rest of the batch is right and no memory outside
the tensors is touched.  FMHA_VALIDATE=1 turns bad device lengths back into the
host arrays' ValueError.  Every test needs a GPU and torch with CUDA and skips,
saying which is missing, without them."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fmha_native
from fmha_native import reference
from _harness import NO_GPU_REASON, as_f64, assert_close, gpu_devices, torch_cuda

pytestmark = pytest.mark.gpu


@pytest.fixture
def torch():
    if not gpu_devices():
        pytest.skip(NO_GPU_REASON)
    if not torch_cuda():
        pytest.skip("needs torch with CUDA")
    import torch as torch_module
    return torch_module


def _rand(torch, gen, shape, dtype=None):
    return torch.randn(shape, generator=gen, device="cuda", dtype=dtype or torch.float16)


def _decode_problem(torch, seed, batch=4, capacity=300, heads_q=8, heads_kv=2, head_dim=128,
                    seqlen_q=1, seqlen_new=1):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return dict(
        q=_rand(torch, gen, (batch, seqlen_q, heads_q, head_dim)),
        k=_rand(torch, gen, (batch, capacity, heads_kv, head_dim)),
        v=_rand(torch, gen, (batch, capacity, heads_kv, head_dim)),
        k_new=_rand(torch, gen, (batch, seqlen_new, heads_kv, head_dim)),
        v_new=_rand(torch, gen, (batch, seqlen_new, heads_kv, head_dim)),
        gen=gen)


def _count_copies_and_syncs(torch, fn):
    """(device-to-host copies, synchronizing runtime calls) that the profiler saw during fn()."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()  # outside what is counted: the profiler's own flush
    copies = syncs = 0
    for ev in prof.events():
        name = ev.name
        if "Memcpy DtoH" in name or "Memcpy Device -> Host" in name:
            copies += 1
        elif name in ("cudaStreamSynchronize", "cudaMemcpy", "cudaEventSynchronize",
                      "cuStreamSynchronize", "cuMemcpyDtoH_v2"):
            syncs += 1
    # The one torch.cuda.synchronize() above is cudaDeviceSynchronize: not counted.
    return copies, syncs


def test_decode_with_device_lengths_copies_nothing_to_the_host(torch):
    d = _decode_problem(torch, 30100)
    lens = torch.tensor([0, 17, 299, 150], dtype=torch.int32, device="cuda")
    out = torch.empty_like(d["q"])
    lse = torch.empty((4, 8, 1), dtype=torch.float32, device="cuda")

    def step():
        for _ in range(3):
            fmha_native.forward(d["q"], d["k"], d["v"], cache_seqlens=lens, k_new=d["k_new"],
                                v_new=d["v_new"], out=out, lse=lse)

    step()  # warm-up: device properties, kernel loading, the scratch pool
    torch.cuda.synchronize()
    # Positive control: host lengths with host results must copy down and sync, so the
    # profiler does see this extension's copies and syncs.
    q_host = d["q"].cpu().numpy()
    k_host, v_host = d["k"].cpu().numpy(), d["v"].cpu().numpy()
    control = _count_copies_and_syncs(
        torch, lambda: fmha_native.forward(q_host, k_host, v_host, device="gpu",
                                           cache_seqlens=np.array([0, 17, 299, 150], np.int32)))
    assert control[0] >= 1 and control[1] >= 1, control
    copies, syncs = _count_copies_and_syncs(torch, step)
    assert (copies, syncs) == (0, 0)
    # And torch's own sync checker stays quiet around the call.
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_explain_device_lengths_is_length_independent(torch):
    d = _decode_problem(torch, 30150)
    lens = torch.tensor([0, 17, 299, 150], dtype=torch.int32, device="cuda")
    plan = fmha_native.explain(d["q"], d["k"], d["v"], cache_seqlens=lens, k_new=d["k_new"],
                               v_new=d["v_new"])
    assert plan["length_independent"] is True
    assert "length-independent" in plan["reason"] and "300 keys" in plan["reason"]
    hinted = fmha_native.explain(d["q"], d["k"], d["v"], cache_seqlens=lens, k_new=d["k_new"],
                                 v_new=d["v_new"], max_seqlen_k=64)
    assert hinted["length_independent"] is True and "64 keys" in hinted["reason"]
    host = fmha_native.explain(d["q"], d["k"], d["v"], cache_seqlens=lens.cpu().numpy(),
                               k_new=d["k_new"], v_new=d["v_new"])
    assert host["length_independent"] is False


def _expected(d, k_before, v_before, lens, q=None):
    q = as_f64(d["q"] if q is None else q)
    lens = np.asarray(lens, dtype=np.int64)
    ref_out, ref_lse = reference.forward(q, k_before, v_before, cache_seqlens=lens,
                                         k_new=as_f64(d["k_new"]), v_new=as_f64(d["v_new"]))
    k_after, v_after = reference.append_kv(k_before, v_before, lens, as_f64(d["k_new"]),
                                           as_f64(d["v_new"]))
    return ref_out, ref_lse, k_after, v_after


def _capture(torch, step):
    """A CUDA graph of step(), warmed up once outside the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture (first-call attributes, workspaces)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def _replay(torch, d, graph, lens, new_lens):
    """New lengths, queries and appended tokens written on the device into the captured
    tensors, then one replay; returns the caches as they were before it."""
    lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
    d["q"].copy_(_rand(torch, d["gen"], tuple(d["q"].shape)))
    d["k_new"].copy_(_rand(torch, d["gen"], tuple(d["k_new"].shape)))
    d["v_new"].copy_(_rand(torch, d["gen"], tuple(d["v_new"].shape)))
    k_before, v_before = as_f64(d["k"]), as_f64(d["v"])
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    return k_before, v_before


@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_captured_decode_step_replays_with_new_lengths(torch, head_dim, num_splits):
    """One captured step (append one token, attend) replayed with lengths and tokens
    changed on the device between replays, 0 and full included, against the reference."""
    batch, capacity = 4, 300
    d = _decode_problem(torch, 30200 + head_dim + num_splits, batch=batch, capacity=capacity,
                        head_dim=head_dim)
    lens = torch.zeros(batch, dtype=torch.int32, device="cuda")
    out = torch.empty_like(d["q"])
    lse = torch.empty((batch, 8, 1), dtype=torch.float32, device="cuda")

    def step():
        fmha_native.forward(d["q"], d["k"], d["v"], cache_seqlens=lens, k_new=d["k_new"],
                            v_new=d["v_new"], out=out, lse=lse, num_splits=num_splits)

    graph = _capture(torch, step)

    full = capacity - 1
    schedule = [[0, 5, full, 137], [full, 0, 64, 1], [299 // 2, full, 0, 0], [full] * batch,
                [0] * batch]
    for i, new_lens in enumerate(schedule):
        k_before, v_before = _replay(torch, d, graph, lens, new_lens)
        ref_out, ref_lse, k_after, v_after = _expected(d, k_before, v_before, new_lens)
        assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16",
                     what=f"replay {i} lengths {new_lens}")
        assert np.array_equal(as_f64(d["k"]), k_after) and np.array_equal(as_f64(d["v"]), v_after)


def test_device_sized_chunks_follow_the_lengths(torch):
    """(8,32,8,1,8192,128) with device lengths: the planner leaves the chunk to the
    kernels (explain's split rule "device": they size it from the lengths they find),
    and one captured step replays right whatever the spread: one long entry among
    short ones (its keys go to every split), lengths spread out, zeros and full, all
    full, and a bad entry (negative length), whose rows alone come out NaN."""
    batch, capacity, heads_q, heads_kv = 8, 8192, 32, 8
    d = _decode_problem(torch, 30300, batch=batch, capacity=capacity, heads_q=heads_q,
                        heads_kv=heads_kv)
    lens = torch.zeros(batch, dtype=torch.int32, device="cuda")
    plan = fmha_native.explain(d["q"], d["k"], d["v"], cache_seqlens=lens, k_new=d["k_new"],
                               v_new=d["v_new"])
    assert plan["split"]["rule"] == "device" and plan["num_splits"] > 1, plan["reason"]
    assert "the kernels size the chunks from the lengths they find" in plan["reason"]
    out = torch.empty_like(d["q"])
    lse = torch.empty((batch, heads_q, 1), dtype=torch.float32, device="cuda")

    def step():
        fmha_native.forward(d["q"], d["k"], d["v"], cache_seqlens=lens, k_new=d["k_new"],
                            v_new=d["v_new"], out=out, lse=lse)

    graph = _capture(torch, step)

    full = capacity - 1
    schedule = [[full, 3, 100, 0, 250, 17, 64, 1],             # one long among short ones
                [4000, 8000, 123, 5555, 2048, 7001, 999, 31],  # spread
                [0, full, 0, full, 0, full, 0, full],
                [full] * batch,
                [full, 40, -1, 700, full, 0, 3000, 12]]         # entry 2 is bad
    for i, new_lens in enumerate(schedule):
        k_before, v_before = _replay(torch, d, graph, lens, new_lens)
        good = [b for b, n in enumerate(new_lens) if n >= 0]
        ref_out, ref_lse, _, _ = _expected(
            {key: (val[good] if key in ("q", "k_new", "v_new") else val) for key, val in d.items()},
            k_before[good], v_before[good], [new_lens[b] for b in good])
        got_out, got_lse = as_f64(out), as_f64(lse)
        assert_close(got_out[good], got_lse[good], ref_out, ref_lse, "f16",
                     what=f"replay {i} lengths {new_lens}")
        bad = [b for b in range(batch) if b not in good]
        assert np.isnan(got_out[bad]).all() and np.isnan(got_lse[bad]).all(), f"replay {i}"


@pytest.mark.parametrize("batch,heads_q,heads_kv,capacity,head_dim", [
    (100, 8, 1, 8192, 64),    # walkers of a split merge (2 per split on an H100/H200)
    (130, 8, 2, 4096, 128),   # the last entries found in the fifth round of 32
])
def test_device_sized_chunks_find_every_entry_of_a_large_batch(torch, batch, heads_q, heads_kv,
                                                               capacity, head_dim):
    """The compact grid of device-sized chunks: each piece finds its entry by a prefix
    sum over the entries' piece counts, 32 entries per round (the first 64 lengths read
    once).  A batch of over 64 entries, lengths 0 to full and one bad entry, against the
    reference: entries past the rounds kept in registers are found, and each entry's
    unused split slots are marked empty (else the combine would weigh stale partials)."""
    d = _decode_problem(torch, 30400 + batch, batch=batch, capacity=capacity, heads_q=heads_q,
                        heads_kv=heads_kv, head_dim=head_dim)
    rng = np.random.default_rng(batch)
    new_lens = rng.integers(0, capacity // 8, batch)
    new_lens[::7] = 0
    new_lens[3] = new_lens[batch - 2] = capacity - 1
    new_lens[batch - 30] = -5  # bad: its rows alone are NaN
    lens = torch.tensor(new_lens, dtype=torch.int32, device="cuda")
    plan = fmha_native.explain(d["q"], d["k"], d["v"], cache_seqlens=lens, k_new=d["k_new"],
                               v_new=d["v_new"])
    if plan["split"]["rule"] != "device":
        pytest.skip(f"this GPU's plan sizes no chunks on the device: {plan['reason']}")
    # Stale partials from a full-length call first: unmarked split slots would show.
    full = torch.full((batch,), capacity - 1, dtype=torch.int32, device="cuda")
    fmha_native.forward(d["q"], d["k"].clone(), d["v"].clone(), cache_seqlens=full,
                        k_new=d["k_new"], v_new=d["v_new"])
    k_before, v_before = as_f64(d["k"]), as_f64(d["v"])
    out, lse = fmha_native.forward(d["q"], d["k"], d["v"], cache_seqlens=lens, k_new=d["k_new"],
                                   v_new=d["v_new"])
    torch.cuda.synchronize()
    good = [b for b in range(batch) if new_lens[b] >= 0]
    ref_out, ref_lse, _, _ = _expected(
        {key: (val[good] if key in ("q", "k_new", "v_new") else val) for key, val in d.items()},
        k_before[good], v_before[good], new_lens[good])
    got_out, got_lse = as_f64(out), as_f64(lse)
    assert_close(got_out[good], got_lse[good], ref_out, ref_lse, "f16",
                 what=f"{plan['num_splits']} splits, lengths {new_lens.tolist()}")
    assert np.isnan(got_out[batch - 30]).all() and np.isnan(got_lse[batch - 30]).all()


def test_device_sized_chunks_with_window_softcap_and_sinks(torch):
    """The compact grid in the window kind's kernels: (16,16,16,1,16384,64) with device
    lengths and a 12000-key window to the left (the splits share only the blocks a tile
    sees), softcap and sinks, lengths 0 to full and one bad entry.  The reference for each
    entry runs on its window's keys alone (the cache is too large for a float64 copy)."""
    batch, capacity, heads, head_dim, left = 16, 16384, 16, 64, 12000
    gen = torch.Generator(device="cuda").manual_seed(30500)
    q = _rand(torch, gen, (batch, 1, heads, head_dim), torch.bfloat16)
    k = _rand(torch, gen, (batch, capacity, heads, head_dim), torch.bfloat16)
    v = _rand(torch, gen, (batch, capacity, heads, head_dim), torch.bfloat16)
    sinks = torch.randn(heads, generator=gen, device="cuda", dtype=torch.float32) * 2
    new_lens = [capacity, 0, 1, 500, left + 1, 16000, 7000, 12345,
                31, 9000, -3, 2047, 4096, 15000, 64, 13000]  # entry 10 is bad
    lens = torch.tensor(new_lens, dtype=torch.int32, device="cuda")
    kw = dict(causal=True, window=(left, 0), softcap=4.0, sinks=sinks)
    plan = fmha_native.explain(q, k, v, cache_seqlens=lens, **kw)
    if plan["split"]["rule"] != "device":
        pytest.skip(f"this GPU's plan sizes no chunks on the device: {plan['reason']}")
    assert ",window" in plan["kernel"] and ",softcap" in plan["kernel"], plan["kernel"]
    out, lse = fmha_native.forward(q, k, v, cache_seqlens=lens, **kw)
    torch.cuda.synchronize()
    got_out, got_lse = as_f64(out), as_f64(lse)
    sinks64 = as_f64(sinks)
    for b, n in enumerate(new_lens):
        if n < 0:
            assert np.isnan(got_out[b]).all() and np.isnan(got_lse[b]).all(), b
            continue
        seen = min(n, left + 1)  # query n - 1 sees keys n - 1 - left .. n - 1
        start = n - seen
        rows = slice(start, start + max(seen, 1))  # one key row even when none is seen
        ref_out, ref_lse = reference.forward(
            as_f64(q[b:b + 1]), as_f64(k[b:b + 1, rows]), as_f64(v[b:b + 1, rows]),
            cache_seqlens=np.array([seen]), softcap=4.0, sinks=sinks64)
        assert_close(got_out[b:b + 1], got_lse[b:b + 1], ref_out, ref_lse, "bf16",
                     what=f"entry {b}, length {n}: {plan['num_splits']} splits")


@pytest.mark.parametrize("num_splits", [0, 1, 4])
@pytest.mark.parametrize("seqlen_q", [1, 20])
def test_bad_device_lengths_give_nan_rows_and_touch_nothing_outside(torch, seqlen_q, num_splits):
    """Entries whose device length does not fit (negative, or with the appended row past
    the capacity) come out NaN and append nothing; the others are right; guard regions
    around the caches (a larger buffer, sliced) keep their bits."""
    batch, capacity, guard, heads_kv, head_dim = 6, 200, 48, 2, 128
    d = _decode_problem(torch, 30300 + seqlen_q + num_splits, batch=batch, capacity=capacity,
                        head_dim=head_dim, seqlen_q=seqlen_q)
    poison = float("nan")
    buffers, caches = [], []
    for name in ("k", "v"):
        big = torch.full((batch + 2, capacity + 2 * guard, heads_kv, head_dim), poison,
                         dtype=torch.float16, device="cuda")
        view = big[1:batch + 1, guard:guard + capacity]
        view.copy_(d[name])
        buffers.append(big)
        caches.append(view)
    before = [b.clone() for b in buffers]
    good = [0, 5, capacity - 1]                 # empty, short, full after the append
    bad = [-1, capacity, 2 ** 31 - 1]          # negative, one past, far past
    lens_list = [bad[0], good[0], bad[1], good[1], bad[2], good[2]]
    lens = torch.tensor(lens_list, dtype=torch.int32, device="cuda")
    out = torch.full_like(d["q"], 5.0)
    lse = torch.full((batch, 8, seqlen_q), 5.0, dtype=torch.float32, device="cuda")
    k_before, v_before = as_f64(caches[0]), as_f64(caches[1])
    fmha_native.forward(d["q"], caches[0], caches[1], cache_seqlens=lens, k_new=d["k_new"],
                        v_new=d["v_new"], out=out, lse=lse, num_splits=num_splits, causal=True)
    torch.cuda.synchronize()

    bad_rows = [b for b, n in enumerate(lens_list) if n < 0 or n > capacity - 1]
    good_rows = [b for b in range(batch) if b not in bad_rows]
    assert bad_rows == [0, 2, 4]
    got_out, got_lse = as_f64(out), as_f64(lse)
    assert np.isnan(got_out[bad_rows]).all() and np.isnan(got_lse[bad_rows]).all()

    sub = {key: d[key][good_rows] for key in ("q", "k_new", "v_new")}
    good_lens = np.array([lens_list[b] for b in good_rows])
    ref_out, ref_lse = reference.forward(as_f64(sub["q"]), k_before[good_rows],
                                         v_before[good_rows], cache_seqlens=good_lens,
                                         k_new=as_f64(sub["k_new"]), v_new=as_f64(sub["v_new"]),
                                         causal=True)
    assert_close(got_out[good_rows], got_lse[good_rows], ref_out, ref_lse, "f16")

    # Bad entries appended nothing; good ones appended exactly their row.
    k_after, v_after = reference.append_kv(k_before[good_rows], v_before[good_rows], good_lens,
                                           as_f64(sub["k_new"]), as_f64(sub["v_new"]))
    for cache, want_good, original in ((caches[0], k_after, k_before),
                                       (caches[1], v_after, v_before)):
        got = as_f64(cache)
        assert np.array_equal(got[good_rows], want_good)
        assert np.array_equal(got[bad_rows], original[bad_rows], equal_nan=True)
    # Outside the slices: the guard rows and guard batch entries keep their bits.
    for big, old in zip(buffers, before):
        inner = torch.zeros_like(big, dtype=torch.bool)
        inner[1:batch + 1, guard:guard + capacity] = True
        assert torch.equal(big.view(torch.int16)[~inner], old.view(torch.int16)[~inner])


@pytest.mark.parametrize("hint", [16, 300])
def test_max_seqlen_k_is_only_a_plan_hint(torch, hint):
    """A hint below the real lengths costs speed, never keys: every length is walked."""
    d = _decode_problem(torch, 30400)
    lens_list = [3, 250, 299, 100]
    lens = torch.tensor(lens_list, dtype=torch.int32, device="cuda")
    k_before, v_before = as_f64(d["k"]), as_f64(d["v"])
    out, lse = fmha_native.forward(d["q"], d["k"], d["v"], cache_seqlens=lens, k_new=d["k_new"],
                                   v_new=d["v_new"], max_seqlen_k=hint)
    ref_out, ref_lse, _, _ = _expected(d, k_before, v_before, lens_list)
    assert_close(as_f64(out), as_f64(lse), ref_out, ref_lse, "f16")


_VALIDATE_SCRIPT = """
import json, torch, fmha_native
q = torch.randn(2, 1, 4, 64, device="cuda", dtype=torch.float16)
k = torch.randn(2, 32, 2, 64, device="cuda", dtype=torch.float16)
v = torch.randn(2, 32, 2, 64, device="cuda", dtype=torch.float16)
lens = torch.tensor([3, 33], dtype=torch.int32, device="cuda")
try:
    out, lse = fmha_native.forward(q, k, v, cache_seqlens=lens)
    torch.cuda.synchronize()
    res = ["ok", bool(torch.isnan(out[1]).all()), bool(torch.isfinite(out[0]).all())]
except Exception as exc:
    res = [type(exc).__name__, str(exc)]
print(json.dumps(res))
"""


@pytest.mark.parametrize("value", [None, "1"])
def test_fmha_validate_checks_device_lengths(torch, value):
    env = {k: v for k, v in os.environ.items() if k != "FMHA_VALIDATE"}
    if value is not None:
        env["FMHA_VALIDATE"] = value
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(fmha_native.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_parent, env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", _VALIDATE_SCRIPT], capture_output=True,
                         text=True, env=env, cwd=package_parent, timeout=300)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    if value is None:
        assert got == ["ok", True, True]  # the device rule: NaN rows for the bad entry only
    else:
        assert got[0] == "ValueError"
        assert got[1].startswith("cache_seqlens[1] = 33: need 0 <= cache_seqlens[b] <= 32")
