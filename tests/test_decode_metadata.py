"""Device metadata on the host side, in CPU CI: the max_seqlen_k plan hint and its
errors, FMHA_VALIDATE=1 (read once per process, so each value runs in its own
process) and explain()'s length_independent field for host lengths.  Device lengths
themselves (no syncs, CUDA-graph replay, bad lengths giving NaN rows) are tested on a
GPU in tests/test_gpu_decode_graph.py."""
import json

import numpy as np
import pytest

import fmha_native
from _harness import bits, make_qkv, randn, run_python

CAPACITY = 64


def _cache(rng, batch=3, seqlen_new=2, dtype="f32"):
    q, k, v = make_qkv(rng, batch, 1, CAPACITY, 4, 2, 16, dtype)
    k_new = randn(rng, (batch, seqlen_new, 2, 16), dtype)
    v_new = randn(rng, (batch, seqlen_new, 2, 16), dtype)
    lens = np.array([0, 17, CAPACITY - seqlen_new][:batch], dtype=np.int32)
    return q, k, v, k_new, v_new, lens


@pytest.mark.parametrize("hint", [True, 2.0, "8", [8], np.float32(8)])
def test_max_seqlen_k_must_be_an_int(hint):
    q, k, v, k_new, v_new, lens = _cache(np.random.default_rng(20900))
    with pytest.raises(TypeError, match="max_seqlen_k must be an int or None"):
        fmha_native.forward(q, k, v, cache_seqlens=lens, k_new=k_new, v_new=v_new,
                            max_seqlen_k=hint, device="cpu")


@pytest.mark.parametrize("hint", [0, -1, 1, CAPACITY + 1, 2 ** 70, -2 ** 70])
@pytest.mark.parametrize("fn", ["forward", "explain"])
def test_max_seqlen_k_out_of_range(fn, hint):
    """The hint counts keys with the appended rows: k_new.shape[1] (2) .. capacity (64)."""
    q, k, v, k_new, v_new, lens = _cache(np.random.default_rng(20910))
    k0 = k.copy()
    with pytest.raises(ValueError) as info:
        getattr(fmha_native, fn)(q, k, v, cache_seqlens=lens, k_new=k_new, v_new=v_new,
                                 max_seqlen_k=hint, device="cpu")
    msg = str(info.value)
    assert msg.startswith("max_seqlen_k must be in [2, 64]"), msg
    assert f"got {hint}" in msg if abs(hint) < 2 ** 63 else "got" in msg
    assert bits(k) == bits(k0)  # nothing was appended


def test_max_seqlen_k_without_appended_rows_starts_at_1():
    q, k, v, _, _, lens = _cache(np.random.default_rng(20920))
    with pytest.raises(ValueError, match=r"max_seqlen_k must be in \[1, 64\] \(1 to k.shape"):
        fmha_native.forward(q, k, v, cache_seqlens=lens, max_seqlen_k=0, device="cpu")
    # The same bounds hold without a cache (capacity = k.shape[1]).
    with pytest.raises(ValueError, match=r"max_seqlen_k must be in \[1, 64\]"):
        fmha_native.forward(q, k, v, max_seqlen_k=65, device="cpu")


@pytest.mark.parametrize("hint", [2, 19, CAPACITY])
def test_max_seqlen_k_changes_nothing_for_host_lengths(hint):
    """Host lengths are read and plan the call; a valid hint leaves plan and bits alone."""
    rng = np.random.default_rng(20930)
    q, k, v, k_new, v_new, lens = _cache(rng)
    runs = []
    for kw in ({}, {"max_seqlen_k": hint}):
        kc, vc = k.copy(), v.copy()
        out, lse = fmha_native.forward(q, kc, vc, cache_seqlens=lens, k_new=k_new, v_new=v_new,
                                       device="cpu", **kw)
        plan = fmha_native.explain(q, k.copy(), v.copy(), cache_seqlens=lens, k_new=k_new,
                                   v_new=v_new, device="cpu", **kw)
        runs.append((bits(out), bits(lse), bits(kc), bits(vc), plan))
    assert runs[0] == runs[1]


def test_explain_host_lengths_are_not_length_independent():
    q, k, v, k_new, v_new, lens = _cache(np.random.default_rng(20940))
    plan = fmha_native.explain(q, k, v, cache_seqlens=lens, k_new=k_new, v_new=v_new,
                               device="cpu")
    assert plan["kv_cache"] is True
    assert plan["length_independent"] is False
    assert "length-independent" not in plan["reason"]
    plain = fmha_native.explain(q, k, v, device="cpu")
    assert plain["length_independent"] is False


_SCRIPT = """
import json, numpy as np, fmha_native
rng = np.random.default_rng(20950)
q = rng.standard_normal((2, 1, 4, 16)).astype(np.float32)
k = rng.standard_normal((2, 32, 2, 16)).astype(np.float32)
v = rng.standard_normal((2, 32, 2, 16)).astype(np.float32)
res = {}
for name, lens in (("good", [3, 32]), ("bad", [3, 33])):
    try:
        out, lse = fmha_native.forward(q, k, v, cache_seqlens=np.array(lens, np.int32),
                                       device="cpu")
        res[name] = ["ok", out.tobytes().hex(), lse.tobytes().hex()]
    except Exception as exc:
        res[name] = [type(exc).__name__, str(exc)]
print(json.dumps(res))
"""


def _run(env_value):
    env_vars = {} if env_value is None else {"FMHA_VALIDATE": env_value}
    res = run_python(["-c", _SCRIPT], env_vars, drop=("FMHA_VALIDATE",))
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_fmha_validate_keeps_host_checks_and_results():
    """FMHA_VALIDATE=1 adds checks of device memory only: host lengths raise the same
    ValueError and valid calls give the same bits with it on or off."""
    off, on = _run(None), _run("1")
    assert off["bad"][0] == "ValueError"
    assert off["bad"][1].startswith("cache_seqlens[1] = 33: need 0 <= cache_seqlens[b] <= 32")
    assert on == off
    assert on["good"][0] == "ok"
