"""Shared helpers of the test suite: input generation, backends, tolerances, checks.

Every parity test builds its inputs in NumPy (float32, float16 or ml_dtypes bfloat16),
hands them to a Backend, which moves them where that backend runs (NumPy with
device="cpu"; torch CUDA tensors, or NumPy with device="gpu", for the GPU), and compares
the float64 view of the result with fmha_native.reference on the same rounded inputs.
"""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import fmha_native
from fmha_native import reference

try:
    import ml_dtypes
except ImportError:  # bf16 NumPy cases skip; torch bf16 cases still run
    ml_dtypes = None

try:
    import torch
except ImportError:
    torch = None

# Accuracy contract (DESIGN.md section 2): relative Frobenius error of out, absolute
# error of lse, against the float64 reference.
OUT_RTOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1e-2}
LSE_ATOL = {"f32": 1e-4, "f16": 1e-2, "bf16": 1e-2}
# The lse of huge logits is itself huge; fp32 can only be this close relative to it.
LSE_RTOL_LARGE = 1e-5

GPU_DTYPES = ("f16", "bf16")
NO_GPU_REASON = "no GPU device is listed by fmha_native.info(): the GPU backend did not run"


def np_dtype(name):
    if name == "f32":
        return np.dtype(np.float32)
    if name == "f16":
        return np.dtype(np.float16)
    if name == "bf16":
        if ml_dtypes is None:
            pytest.skip("ml_dtypes is not installed: no NumPy bfloat16")
        return np.dtype(ml_dtypes.bfloat16)
    raise ValueError(name)


def dtype_name(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return "f32"
    if dtype == np.float16:
        return "f16"
    if dtype.name == "bfloat16":
        return "bf16"
    raise ValueError(dtype)


def randn(rng, shape, dtype="f32", scale=1.0):
    """Standard normal values times scale, rounded to dtype (never zeros)."""
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np_dtype(dtype))


def make_qkv(rng, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype="f32"):
    q = randn(rng, (batch, seqlen_q, heads_q, head_dim), dtype)
    k = randn(rng, (batch, seqlen_k, heads_kv, head_dim), dtype)
    v = randn(rng, (batch, seqlen_k, heads_kv, head_dim), dtype)
    return q, k, v


def packed(rng, lengths, heads, head_dim, dtype="f32"):
    """Packed rows of sequences of the given lengths: (x [sum, heads, head_dim],
    cu_seqlens int32 [len(lengths) + 1])."""
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return randn(rng, (int(cu[-1]), heads, head_dim), dtype), cu


def paged_cache(rng, lengths, page_size, max_blocks, heads_kv, head_dim, dtype="f32",
                reach=None, spare_pages=3):
    """A paged KV cache: (k, v [num_pages, page_size, heads_kv, head_dim], block_table
    int32 [batch, max_blocks]).  Sequence b holds lengths[b] keys; its pages are drawn
    from a shuffled pool with spare_pages never used.  Every slot that holds none of
    those keys is NaN (spare pages, the tail of a last page, slots an append will fill),
    so a backend that reads one shows it.  Table entries past the first
    ceil(reach[b] / page_size) of row b (reach defaults to lengths) are -1: they hold
    no page and must not be read."""
    lengths = np.asarray(lengths, np.int64)
    reach = lengths if reach is None else np.asarray(reach, np.int64)
    batch = len(lengths)
    num_pages = batch * max_blocks + spare_pages
    k = randn(rng, (num_pages, page_size, heads_kv, head_dim), dtype)
    v = randn(rng, (num_pages, page_size, heads_kv, head_dim), dtype)
    table = rng.permutation(num_pages)[:batch * max_blocks].reshape(batch, max_blocks)
    table = table.astype(np.int32)
    holds = np.zeros((num_pages, page_size), bool)
    for b in range(batch):
        for j in range(-(-int(lengths[b]) // page_size)):
            holds[table[b, j], :min(page_size, int(lengths[b]) - j * page_size)] = True
        table[b, -(-int(reach[b]) // page_size):] = -1
    k[~holds] = np.nan
    v[~holds] = np.nan
    return k, v, table


def gpu_devices():
    return list(fmha_native.info().get("devices") or [])


def torch_cuda():
    return torch is not None and torch.cuda.is_available()


def as_f64(x):
    """float64 NumPy copy of a result of any kind (NumPy, torch, fmha_native.Tensor)."""
    if isinstance(x, np.ndarray) or type(x).__module__.startswith(("torch", "cupy")):
        return reference.to_float64(x)
    return reference.to_float64(np.from_dlpack(x))


def bits(x):
    """Bytes of x for bitwise comparison (NaN-safe, dtype-agnostic)."""
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().contiguous().view(torch.uint8).numpy()
    return np.ascontiguousarray(np.asarray(x)).view(np.uint8).tobytes()


class Backend:
    """Runs fmha_native on one backend, taking and giving NumPy arrays."""

    def __init__(self, name):
        self.name = name
        self.use_torch = name == "gpu" and torch_cuda()

    def __repr__(self):
        return f"Backend({self.name})"

    @property
    def is_gpu(self):
        return self.name == "gpu"

    def device_kw(self):
        # Torch CUDA tensors go to the GPU by themselves; host arrays are forced.
        if self.name == "cpu":
            return {"device": "cpu"}
        return {} if self.use_torch else {"device": "gpu"}

    def put(self, x):
        """Move one NumPy array where this backend runs (None passes through).  Integer
        metadata (cache_seqlens, block_table, cu_seqlens_q/k) keeps its dtype and goes
        to the device like the tensors, so GPU runs read it as device metadata."""
        if x is None or not self.use_torch or not isinstance(x, np.ndarray):
            return x  # already where it runs
        if x.dtype.kind == "i":
            return torch.from_numpy(np.ascontiguousarray(x)).cuda()
        tdtype = {"f32": torch.float32, "f16": torch.float16,
                  "bf16": torch.bfloat16}[dtype_name(x.dtype)]
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(tdtype).cuda()

    def skip_unsupported(self, dtype):
        if self.is_gpu and dtype not in GPU_DTYPES:
            pytest.skip(f"{dtype} runs on the CPU only (GPU kernels: float16, bfloat16)")

    def require(self, q, k, v, **kw):
        """On the GPU, skip problems the gate rejects, after checking they raise
        NotImplementedError as the contract says."""
        if not self.is_gpu:
            return
        qd, kd, vd = self.put(q), self.put(k), self.put(v)
        kw = {key: self.put(val) if isinstance(val, np.ndarray) else val for key, val in kw.items()}
        try:
            plan = fmha_native.explain(qd, kd, vd, **self.device_kw(), **kw)
            supported = all(item["met"] for item in plan["gate"].values())
        except NotImplementedError:
            supported = False
        if not supported:
            with pytest.raises(NotImplementedError, match="cpu"):
                fmha_native.forward(qd, kd, vd, **self.device_kw(), **kw)
            pytest.skip("the GPU gate rejects this problem (NotImplementedError checked); "
                        "no GPU parity ran")

    def forward_native(self, q, k, v, **kw):
        """fmha_native.forward on this backend; returns its native result.  Every NumPy
        keyword argument (k_new/v_new and the integer metadata) is moved with put."""
        kw = {key: self.put(val) if isinstance(val, np.ndarray) else val for key, val in kw.items()}
        return fmha_native.forward(self.put(q), self.put(k), self.put(v), **self.device_kw(), **kw)

    def forward_append(self, q, k, v, **kw):
        """forward with an in-place append (k_new/v_new): returns float64 (out, lse,
        k after, v after), the caches read back from where the backend wrote them."""
        kd, vd = self.put(k), self.put(v)
        out, lse = self.forward_native(q, kd, vd, **kw)
        return as_f64(out), as_f64(lse), as_f64(kd), as_f64(vd)

    def forward(self, q, k, v, **kw):
        """fmha_native.forward on this backend; returns float64 NumPy (out, lse)."""
        res = self.forward_native(q, k, v, **kw)
        if kw.get("return_lse", True):
            out, lse = res
            return as_f64(out), as_f64(lse)
        return as_f64(res)


def rel_fro(actual, expected):
    """Relative Frobenius error ||actual - expected|| / ||expected||."""
    diff = np.linalg.norm((actual - expected).ravel())
    norm = np.linalg.norm(expected.ravel())
    if norm == 0.0:
        return diff
    return diff / norm


def assert_close(out, lse, ref_out, ref_lse, dtype, lse_rtol=0.0, what=""):
    """Check (out, lse) against the reference within the contract's bounds.

    Non-finite reference entries (empty rows: lse -inf; NaN rows) must be matched
    exactly in kind; the finite rest is held to the per-dtype bounds.
    """
    assert out.shape == ref_out.shape, f"{what} out shape {out.shape} != {ref_out.shape}"
    ref_nan = np.isnan(ref_out)
    assert np.array_equal(np.isnan(out), ref_nan), f"{what} NaN pattern of out differs from the reference"
    finite = ~ref_nan
    err = rel_fro(np.where(finite, out, 0.0), np.where(finite, ref_out, 0.0))
    assert err <= OUT_RTOL[dtype], f"{what} out relative error {err:.3g} > {OUT_RTOL[dtype]:g} ({dtype})"
    if lse is None:
        return
    assert lse.shape == ref_lse.shape, f"{what} lse shape {lse.shape} != {ref_lse.shape}"
    assert np.array_equal(np.isnan(lse), np.isnan(ref_lse)), f"{what} NaN pattern of lse differs"
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), \
        f"{what} lse is -inf exactly where the reference row sees no key: pattern differs"
    fin = np.isfinite(ref_lse)
    assert np.isfinite(lse[fin]).all(), f"{what} lse not finite where the reference is"
    if fin.any():
        scale = np.abs(ref_lse[fin]).max()
        bound = LSE_ATOL[dtype] + lse_rtol * scale
        lerr = np.abs(lse[fin] - ref_lse[fin]).max()
        assert lerr <= bound, f"{what} lse abs error {lerr:.3g} > {bound:.3g} ({dtype})"


# forward's keywords that the reference takes with the same meaning.
REFERENCE_KEYWORDS = ("causal", "softmax_scale", "cache_seqlens", "k_new", "v_new", "block_table",
                      "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


def check_forward(backend, q, k, v, dtype, lse_rtol=0.0, **kw):
    """Run one problem on backend and hold it to the reference; returns (out, lse)."""
    ref_kw = {key: kw[key] for key in REFERENCE_KEYWORDS if key in kw}
    ref_out, ref_lse = reference.forward(q, k, v, **ref_kw)
    out, lse = backend.forward(q, k, v, **kw)
    assert_close(out, lse, ref_out, ref_lse, dtype, lse_rtol=lse_rtol)
    return out, lse


def key_blocks(seqlen_k, block_n):
    return max(1, math.ceil(seqlen_k / block_n))


def run_python(args, env_vars=None, drop=(), timeout=120):
    """subprocess.run of `python *args` in a fresh interpreter that imports the same
    fmha_native these tests import (its parent folder is first on PYTHONPATH and the
    working directory); the environment is this one without the variables in drop,
    with env_vars set."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_vars or {})
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(fmha_native.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_parent, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=package_parent, timeout=timeout)


class DLPackOnly:
    """Exposes an array through __dlpack__/__dlpack_device__ only (no buffer protocol),
    forwarding max_version, so a versioned capsule is produced when asked for; calls
    counts the __dlpack__ calls."""

    def __init__(self, array):
        self._array = array
        self.calls = 0

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls += 1
        kw = {"stream": stream}
        if max_version is not None:
            kw["max_version"] = max_version
        return self._array.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()
