"""fmha_native: fused multi-head attention forward with native split-K kernels.

This module is the Python glue around the C extension ``_fmha_native``: it
re-exports the extension's functions and, for callers that hand in torch or
CuPy arrays, picks the caller's current stream and allocates the outputs with
the caller's own library, so results come back as the caller's kind of array.
torch and CuPy are imported only when the caller's objects come from them.

    out, lse = fmha_native.forward(q, k, v, causal=True, num_splits=0)

Layout: q [batch, seqlen_q, heads_q, head_dim], k and v
[batch, seqlen_k, heads_kv, head_dim]; out like q; lse float32
[batch, heads_q, seqlen_q] (natural log).  See DESIGN.md for the contract.
"""
# The extension is a top-level module, not fmha_native._C: from a source checkout
# (the repository root on sys.path) this package is the tree's own copy of the
# Python files, and it still finds the compiled part that `pip install .` put in
# site-packages.
try:
    import _fmha_native as _C
except ImportError as exc:  # pragma: no cover - a setup problem, said plainly
    raise ImportError("fmha_native's compiled extension _fmha_native is missing: install the "
                      "package with `pip install .` from the repository root") from exc

FmhaError = _C.FmhaError
Tensor = _C.Tensor
info = _C.info
__version__ = _C.__version__

__all__ = ["FmhaError", "Tensor", "combine", "explain", "forward", "info", "reference",
           "__version__"]

# Input keywords of forward/explain that a torch caller may pass with
# requires_grad set (DLPack refuses those; this library computes forward only).
# out and lse are not among them: they are returned as the very objects given.
_INPUT_KEYWORDS = ("cache_seqlens", "k_new", "v_new")


# The torch module and its Tensor type, set the first time a torch tensor is
# seen (this module never imports torch itself), and the cheapest way to ask
# torch for the current stream of a device.
_torch = None
_torch_tensor = None
_torch_raw_stream = None


def _library(obj):
    """'torch', 'cupy' or None: which known array library made obj."""
    cls = type(obj)
    if cls is _torch_tensor:
        return "torch"
    module = cls.__module__ or ""
    if module == "torch" or module.startswith("torch."):
        return "torch"
    if module == "cupy" or module.startswith("cupy."):
        return "cupy"
    return None


def _load_torch():
    global _torch, _torch_tensor, _torch_raw_stream
    if _torch is None:
        import torch

        # torch.cuda.current_stream(i).cuda_stream builds a Stream object;
        # the raw handle it wraps comes from this function (what torch's own
        # compiled code calls), when this torch has it.
        _torch_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _torch_tensor = torch.Tensor
        _torch = torch
    return _torch


def _torch_context(q, kw):
    """(device context or None, kw) for a torch call: current stream and device.

    The context switches torch's current device to q's for the call (torch's
    __dlpack__ requires it); it is None when q is on the host or already on the
    current device, where switching would change nothing.
    """
    torch = _load_torch()
    if q.is_cuda:
        index = q.get_device()
        current = torch.cuda.current_device()  # also torch's lazy CUDA init
        if kw.get("stream") is None:
            if _torch_raw_stream is not None:
                kw["stream"] = _torch_raw_stream(index)
            else:
                kw["stream"] = torch.cuda.current_stream(index).cuda_stream
        if current != index:
            return torch.cuda.device(index), kw
    return None, kw


def _cupy_context(q, kw):
    import cupy

    if kw.get("stream") is None:
        kw["stream"] = cupy.cuda.get_current_stream().ptr
    return q.device, kw


def _detach(x):
    """x without autograd history (shares memory), for a torch input that has one."""
    if (type(x) is _torch_tensor or _library(x) == "torch") and x.requires_grad:
        return x.detach()
    return x


def _forward_outputs(q, kw, empty, float32):
    """Allocate out (like q) and lse (float32 [batch, heads_q, seqlen_q]) where kw has none;
    empty(shape, dtype) is the library's allocator on q's device."""
    if kw.get("out") is None:
        kw["out"] = empty(q.shape, q.dtype)
    if kw.get("lse") is None and kw.get("return_lse", True):
        batch, seqlen_q, heads_q = q.shape[0], q.shape[1], q.shape[2]
        kw["lse"] = empty((batch, heads_q, seqlen_q), float32)


def _prepare(lib, q, k, v, kw, allocate):
    """Common glue of forward/explain for torch or CuPy q: (context or None, q, k, v, kw)."""
    kw = dict(kw)
    if lib == "torch":
        q, k, v = _detach(q), _detach(k), _detach(v)
        if kw:
            for key in _INPUT_KEYWORDS:
                x = kw.get(key)
                if x is not None:
                    kw[key] = _detach(x)
        ctx, kw = _torch_context(q, kw)
        # Only a well-formed q gets outputs here, and device tensors with
        # device="cpu" get none: _C reports those errors.
        if (allocate and q.dim() == 4 and
                not (kw.get("device") == "cpu" and q.device.type != "cpu") and
                (kw.get("out") is None or kw.get("lse") is None)):
            torch = _torch
            _forward_outputs(q, kw, lambda shape, dtype: torch.empty(shape, dtype=dtype, device=q.device),
                             torch.float32)
        return ctx, q, k, v, kw
    ctx, kw = _cupy_context(q, kw)
    if allocate and q.ndim == 4 and kw.get("device") != "cpu":
        import cupy

        _forward_outputs(q, kw, lambda shape, dtype: cupy.empty(shape, dtype=dtype), cupy.float32)
    return ctx, q, k, v, kw


def _dispatch(fn, q, k, v, kw, allocate):
    """fn(q, k, v, **kw) in the context the inputs' library needs (see _prepare)."""
    lib = _library(q)
    if lib is None:
        return fn(q, k, v, **kw)
    ctx, q, k, v, kw = _prepare(lib, q, k, v, kw, allocate=allocate)
    if ctx is None:
        return fn(q, k, v, **kw)
    with ctx:
        return fn(q, k, v, **kw)


def forward(q, k, v, **kw):
    """forward(q, k, v, *, causal=False, softmax_scale=None, num_splits=0,
    return_lse=True, out=None, lse=None, device=None, stream=None,
    cache_seqlens=None, k_new=None, v_new=None) -> (out, lse) or out

    Attention forward.  ``num_splits``: 0 = heuristic, 1 = no split, >= 2 = forced
    (clamped to the key blocks).  ``device``: None (where the inputs live), "cpu",
    "gpu"/"cuda"/"hip".  ``stream``: an integer stream handle; for torch and CuPy
    inputs it defaults to the caller's current stream.  With ``cache_seqlens``
    (int32 [batch]) k and v are a KV cache of capacity seqlen_k; ``k_new`` and
    ``v_new`` [batch, seqlen_new, heads_kv, head_dim] are written into it at
    cache_seqlens[b] before attending.
    """
    return _dispatch(_C.forward, q, k, v, kw, allocate=True)


def explain(q, k, v, **kw):
    """explain(q, k, v, **forward_keywords) -> dict

    The plan forward would run, without running it: backend, kernel, effective
    num_splits, block_m, block_n, pack_gqa, reason, gate ({requirement: {"met",
    "why"}}), supported, and the problem's dimensions.
    """
    return _dispatch(_C.explain, q, k, v, kw, allocate=False)


def combine(outs, lses, **kw):
    """combine(outs, lses, *, out=None, lse=None, stream=None) -> (out, lse)

    Merge G partial attention states (as split-K or context parallelism produce
    them): outs [G, batch, seqlen_q, heads, head_dim] normalised by their own
    row sums, lses float32 [G, batch, heads, seqlen_q].  out has outs' dtype
    [batch, seqlen_q, heads, head_dim]; lse is float32 [batch, heads, seqlen_q].
    """
    lib = _library(outs)
    ctx = None
    if lib == "torch" and outs.dim() == 5:
        outs, lses = _detach(outs), _detach(lses)
        ctx, kw = _torch_context(outs, dict(kw))
        torch = _torch
        g, batch, seqlen_q, heads, head_dim = outs.shape
        if kw.get("out") is None:
            kw["out"] = torch.empty((batch, seqlen_q, heads, head_dim), dtype=outs.dtype,
                                    device=outs.device)
        if kw.get("lse") is None:
            kw["lse"] = torch.empty((batch, heads, seqlen_q), dtype=torch.float32,
                                    device=outs.device)
    elif lib == "cupy" and outs.ndim == 5:
        import cupy

        ctx, kw = _cupy_context(outs, dict(kw))
        g, batch, seqlen_q, heads, head_dim = outs.shape
        if kw.get("out") is None:
            kw["out"] = cupy.empty((batch, seqlen_q, heads, head_dim), dtype=outs.dtype)
        if kw.get("lse") is None:
            kw["lse"] = cupy.empty((batch, heads, seqlen_q), dtype=cupy.float32)
    if ctx is None:
        return _C.combine(outs, lses, **kw)
    with ctx:
        return _C.combine(outs, lses, **kw)


from . import reference  # noqa: E402  (the float64 oracle; needs only NumPy)
