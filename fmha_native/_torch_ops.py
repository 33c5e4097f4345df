"""fmha_native's torch.library custom ops, and the glue that calls them.

Owns the registration of the ``fmha_native::*`` operators, their fake (meta)
implementations, and ``call_forward`` / ``call_combine``, which turn a call of
fmha_native.forward / combine into calls of these ops.  The package imports this
module only once torch is in use (it imports torch at its top), so importing
fmha_native never imports torch.

Why several ops for one function: torch.compile functionalizes the graph, and an op
that declares a mutated argument is run on a copy of it unless the compiler can prove
the copy unneeded (inductor usually can; aot_eager never does).  A KV cache is the
largest tensor in a decode step, so only the op that appends (``forward_append``)
declares the caches mutable, and a call that writes nothing it was given goes through
the pure ``forward``, which returns fresh out and lse:

    forward(q, k, v, ...) -> (out, lse)       nothing given is written
    forward_out(q, k, v, out!, lse!?, ...)    out= / lse= given: written in place
    forward_append(q, k!, v!, k_new, v_new, out!, lse!?, ...)   k_new/v_new appended
    combine(outs, lses) -> (out, lse)
    combine_out(outs, lses, out!, lse!)

lse is float32 [batch, heads_q, seqlen_q], or [heads_q, total_q] with cu_seqlens_q;
the pure forward returns an empty lse [0] when return_lse is false (an op returns
tensors, never None).

Routing (fmha_native.forward and combine decide, with is_compiling, dispatch_modes
and ``wanted``): torch tensors go through these ops while torch traces or compiles
(torch.compiler.is_compiling(), a tensor subclass such as FakeTensor or
FunctionalTensor, or a TorchDispatchMode on the stack), so torch.compile(fullgraph=True)
and make_fx see one op.  Plain eager calls skip the ops and call the extension
directly: on a decode-sized call with CPU tensors the op's dispatch adds about as
much host time again as the direct call takes (the custom-op boundary, the schema
binding, the Python kernel behind it), and an eager caller gains nothing from it.
benchmarks/host_overhead_cpu.py measures the direct path; tests/test_torch_op.py holds
the two paths to the same bits.

The stream is not a traced constant: with stream=None the op's implementation asks
torch for the current stream of q's device when it runs, so a graph captured by
torch.compile(mode="reduce-overhead") records the capture stream.
"""
import numbers

import torch

import _fmha_native as _C
import fmha_native  # fully imported: this module is imported by its first torch call

__all__ = ["call_forward", "call_combine", "wanted"]

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# Whether torch is compiling the caller (dynamo folds this call to True while it
# traces), and how many dispatch modes (make_fx, FakeTensorMode, ...) are active.
is_compiling = torch.compiler.is_compiling
dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_Tensor = torch.Tensor

# The keywords forward() and combine() take; an unknown one is refused the way the
# extension refuses it.
_FORWARD_NAMES = frozenset(name for name, _ in fmha_native._FORWARD_KEYWORDS)
_COMBINE_NAMES = frozenset(name for name, _ in fmha_native._COMBINE_KEYWORDS)
# The optional keywords, handed to the extension only when given (it applies its own
# defaults to the rest), in the order _forward_kw lists their values.
_OPTIONAL_NAMES = ("cache_seqlens", "block_table", "cu_seqlens_q", "cu_seqlens_k",
                   "max_seqlen_q", "max_seqlen_k", "softmax_scale", "device", "stream",
                   "window", "sinks", "out_dtype")


def wanted(q):
    """True when a call with torch tensor q must go through the ops: torch is tracing
    or compiling it, or q is not a plain tensor (a fake, functional or other subclass
    tensor that the extension must not read)."""
    return is_compiling() or type(q) is not _Tensor or dispatch_modes() > 0


# ---------------------------------------------------------------------------
# Running the extension from inside an op
# ---------------------------------------------------------------------------

def _run(fn, first, args, kw):
    """fn(*args, **kw) with the stream and current device torch's conventions ask for:
    the current stream of first's device (read now, at run time) and that device made
    current (torch's exporter requires it)."""
    if first.is_cuda:
        index = first.get_device()
        if kw.get("stream") is None:
            kw["stream"] = (_raw_stream(index) if _raw_stream is not None
                            else torch.cuda.current_stream(index).cuda_stream)
        if torch.cuda.current_device() != index:
            with torch.cuda.device(index):
                return fn(*args, **kw)
    return fn(*args, **kw)


def _forward_kw(causal, softmax_scale, num_splits, return_lse, device, stream,
                cache_seqlens, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                max_seqlen_k, window, softcap, sinks, out_dtype=None, kv_dtype=None,
                k_scale=None, v_scale=None, k_scale_value=None, v_scale_value=None):
    kw = {"causal": causal, "num_splits": num_splits, "return_lse": return_lse,
          "softcap": softcap}
    # An fp8 KV cache's scales: the schema carries a tensor and a number apart.
    for name, value in (("kv_dtype", kv_dtype), ("k_scale", k_scale if k_scale is not None
                                                 else k_scale_value),
                        ("v_scale", v_scale if v_scale is not None else v_scale_value)):
        if value is not None:
            kw[name] = value
    values = (cache_seqlens, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
              max_seqlen_k, softmax_scale, device, stream,
              None if window is None else tuple(window), sinks, out_dtype)
    for name, value in zip(_OPTIONAL_NAMES, values):
        if value is not None:
            kw[name] = value
    return kw


def _lse_shape(q, cu_seqlens_q):
    """lse's shape for q; ValueError naming q when q has the wrong rank (the extension
    says the same when the op runs; a fake tensor needs a shape before that)."""
    if cu_seqlens_q is not None:
        if q.dim() != 3:
            raise ValueError(f"q must be 3-D [total_q, heads_q, head_dim] with cu_seqlens_q, "
                             f"got {q.dim()}-D")
        return (q.shape[1], q.shape[0])
    if q.dim() != 4:
        raise ValueError(f"q must be 4-D [batch, seqlen_q, heads_q, head_dim], got {q.dim()}-D")
    return (q.shape[0], q.shape[2], q.shape[1])


def _new_outputs(q, cu_seqlens_q, return_lse, out_dtype=None):
    """Fresh (out, lse) for q: out has q's shape and out_dtype (None: q's dtype),
    contiguous; lse float32."""
    lse_shape = _lse_shape(q, cu_seqlens_q) if return_lse else (0,)
    return (q.new_empty(q.shape, dtype=out_dtype or q.dtype),
            q.new_empty(lse_shape, dtype=torch.float32))


def _out_dtype(value):
    """out_dtype as the schema's ScalarType?: None or torch.float32, with the extension's
    check and message (made before tracing bakes the value in)."""
    if value is None:
        return None
    if fmha_native._out_dtype_is_float32(value):
        return torch.float32
    raise ValueError(f"out_dtype must be None (q's dtype) or float32 (\"float32\", "
                     f"torch.float32 or numpy.float32), got {value!r}")


# ---------------------------------------------------------------------------
# The ops.  Defined through torch.library.Library with schema strings, not
# torch.library.custom_op: custom_op puts Python layers in front of every call (an
# autograd wrapper, and for mutable ops a version-counter kernel that re-binds the
# schema's arguments in Python), which costs a mutable op of this many arguments
# about as much as ten direct calls -- paid on every step of a compiled graph that
# runs without CUDA graphs.  Here the CPU and CUDA (also ROCm) kernels are the Python
# functions below and nothing else runs in Python; no autograd formula is registered
# (forward() refuses inputs that require grad under grad mode).
# ---------------------------------------------------------------------------

# The metadata tensors and scalars every forward op takes after its tensors.
_FORWARD_TAIL = ("Tensor? cache_seqlens, Tensor? block_table, Tensor? cu_seqlens_q, "
                 "Tensor? cu_seqlens_k, bool causal, float? softmax_scale, int num_splits, "
                 "bool return_lse, SymInt? max_seqlen_q, SymInt? max_seqlen_k, str? device, "
                 "int? stream, int[]? window=None, float softcap=0.0, Tensor? sinks=None, "
                 "ScalarType? out_dtype=None, "
                 "str? kv_dtype=None, Tensor? k_scale=None, Tensor? v_scale=None, "
                 "float? k_scale_value=None, float? v_scale_value=None")

_lib = torch.library.Library("fmha_native", "DEF")


def _define(schema, kernel, fake):
    """Define fmha_native::<name> with kernel on CPU and CUDA and fake for tracing;
    returns the op's default overload."""
    name = schema.split("(", 1)[0]
    _lib.define(schema)
    for key in ("CPU", "CUDA"):
        _lib.impl(name, kernel, key)
    torch.library.register_fake("fmha_native::" + name, fake, lib=_lib)
    return getattr(torch.ops.fmha_native, name).default


def _forward_kernel(q, k, v, cache_seqlens, block_table, cu_seqlens_q, cu_seqlens_k, causal,
                    softmax_scale, num_splits, return_lse, max_seqlen_q, max_seqlen_k, device,
                    stream, window=None, softcap=0.0, sinks=None, out_dtype=None,
                    kv_dtype=None, k_scale=None, v_scale=None, k_scale_value=None, v_scale_value=None):
    out, lse = _new_outputs(q, cu_seqlens_q, return_lse, out_dtype)
    kw = _forward_kw(causal, softmax_scale, num_splits, return_lse, device, stream,
                     cache_seqlens, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, window, softcap, sinks, out_dtype, kv_dtype, k_scale, v_scale, k_scale_value, v_scale_value)
    kw["out"] = out
    if return_lse:
        kw["lse"] = lse
    _run(_C.forward, q, (q, k, v), kw)
    return out, lse


def _forward_fake(q, k, v, cache_seqlens, block_table, cu_seqlens_q, cu_seqlens_k, causal,
                  softmax_scale, num_splits, return_lse, max_seqlen_q, max_seqlen_k, device,
                  stream, window=None, softcap=0.0, sinks=None, out_dtype=None,
                  kv_dtype=None, k_scale=None, v_scale=None, k_scale_value=None, v_scale_value=None):
    return _new_outputs(q, cu_seqlens_q, return_lse, out_dtype)


def _forward_out_kernel(q, k, v, out, lse, cache_seqlens, block_table, cu_seqlens_q,
                        cu_seqlens_k, causal, softmax_scale, num_splits, return_lse,
                        max_seqlen_q, max_seqlen_k, device, stream, window=None, softcap=0.0,
                        sinks=None, out_dtype=None, kv_dtype=None, k_scale=None, v_scale=None, k_scale_value=None, v_scale_value=None):
    kw = _forward_kw(causal, softmax_scale, num_splits, return_lse, device, stream,
                     cache_seqlens, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, window, softcap, sinks, out_dtype, kv_dtype, k_scale, v_scale, k_scale_value, v_scale_value)
    kw["out"] = out
    if lse is not None:
        kw["lse"] = lse
    _run(_C.forward, q, (q, k, v), kw)


def _forward_append_kernel(q, k, v, k_new, v_new, out, lse, cache_seqlens, block_table,
                           cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, num_splits,
                           return_lse, max_seqlen_q, max_seqlen_k, device, stream,
                           window=None, softcap=0.0, sinks=None, out_dtype=None, kv_dtype=None, k_scale=None, v_scale=None, k_scale_value=None, v_scale_value=None):
    kw = _forward_kw(causal, softmax_scale, num_splits, return_lse, device, stream,
                     cache_seqlens, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, window, softcap, sinks, out_dtype, kv_dtype, k_scale, v_scale, k_scale_value, v_scale_value)
    kw["out"] = out
    kw["k_new"] = k_new
    kw["v_new"] = v_new
    if lse is not None:
        kw["lse"] = lse
    _run(_C.forward, q, (q, k, v), kw)


def _writes_only(*args, **kwargs):
    """The fake of an op that only writes tensors it was given."""
    return None


def _combine_shapes(outs):
    if outs.dim() != 5:
        raise ValueError(f"outs must be 5-D [splits, batch, seqlen_q, heads, head_dim], got "
                         f"{outs.dim()}-D")
    _, batch, seqlen_q, heads, head_dim = outs.shape
    return (batch, seqlen_q, heads, head_dim), (batch, heads, seqlen_q)


def _combine_outputs(outs, lses, stream, sinks=None):
    out_shape, lse_shape = _combine_shapes(outs)
    return outs.new_empty(out_shape), outs.new_empty(lse_shape, dtype=torch.float32)


def _combine_out_kernel(outs, lses, out, lse, stream, sinks=None):
    kw = {"out": out, "lse": lse}
    if stream is not None:
        kw["stream"] = stream
    if sinks is not None:
        kw["sinks"] = sinks
    _run(_C.combine, outs, (outs, lses), kw)


def _combine_kernel(outs, lses, stream, sinks=None):
    out, lse = _combine_outputs(outs, lses, stream, sinks)
    _combine_out_kernel(outs, lses, out, lse, stream, sinks)
    return out, lse


_forward = _define("forward(Tensor q, Tensor k, Tensor v, " + _FORWARD_TAIL +
                   ") -> (Tensor, Tensor)", _forward_kernel, _forward_fake)
_forward_out = _define("forward_out(Tensor q, Tensor k, Tensor v, Tensor(a!) out, "
                       "Tensor(b!)? lse, " + _FORWARD_TAIL + ") -> ()",
                       _forward_out_kernel, _writes_only)
_forward_append = _define("forward_append(Tensor q, Tensor(a!) k, Tensor(b!) v, Tensor k_new, "
                          "Tensor v_new, Tensor(c!) out, Tensor(d!)? lse, " + _FORWARD_TAIL +
                          ") -> ()", _forward_append_kernel, _writes_only)
_combine = _define("combine(Tensor outs, Tensor lses, int? stream, Tensor? sinks=None) -> "
                   "(Tensor, Tensor)", _combine_kernel, _combine_outputs)
_combine_out = _define("combine_out(Tensor outs, Tensor lses, Tensor(a!) out, Tensor(b!) lse, "
                       "int? stream, Tensor? sinks=None) -> ()", _combine_out_kernel, _writes_only)


# ---------------------------------------------------------------------------
# fmha_native.forward / combine in terms of the ops
# ---------------------------------------------------------------------------

def _unexpected(fn, kw, names):
    for name in kw:
        if name not in names:
            raise TypeError(f"{fn}() got an unexpected keyword argument '{name}'")


def call_forward(q, k, v, kw):
    """fmha_native.forward(q, k, v, **kw) through the ops (kw: the caller's keywords,
    with grad-requiring tensors already refused or detached)."""
    _unexpected("forward", kw, _FORWARD_NAMES)
    get = kw.get
    return_lse = bool(get("return_lse", True))
    out, lse = get("out"), get("lse")
    k_new, v_new = get("k_new"), get("v_new")
    cu_seqlens_q = get("cu_seqlens_q")
    scalars = dict(
        cache_seqlens=get("cache_seqlens"), block_table=get("block_table"),
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=get("cu_seqlens_k"),
        causal=bool(get("causal", False)), softmax_scale=get("softmax_scale"),
        num_splits=get("num_splits", 0), return_lse=return_lse,
        max_seqlen_q=get("max_seqlen_q"), max_seqlen_k=get("max_seqlen_k"),
        device=get("device"), stream=get("stream"), window=_window(get("window")),
        softcap=_softcap(get("softcap", 0.0)), sinks=get("sinks"),
        out_dtype=_out_dtype(get("out_dtype")), kv_dtype=get("kv_dtype"))
    for name in ("k_scale", "v_scale"):
        # A tensor goes to the schema's Tensor?, a number to its float?.
        value = get(name)
        if isinstance(value, torch.Tensor):
            scalars[name] = value
        elif value is not None:
            scalars[name + "_value"] = _scale_value(name, value)
    if k_new is None and v_new is None and out is None and lse is None:
        out, lse = _forward(q, k, v, **scalars)
        return (out, lse) if return_lse else out
    # Something given is written: the in-place ops, with the outputs the caller did not
    # give allocated here (in a compiled graph they are graph-internal buffers).
    if out is None:
        out = q.new_empty(q.shape, dtype=scalars["out_dtype"] or q.dtype)
    if lse is None and return_lse:
        lse = q.new_empty(_lse_shape(q, cu_seqlens_q), dtype=torch.float32)
    if k_new is not None or v_new is not None:
        if k_new is None or v_new is None:
            raise ValueError("k_new and v_new must be given together")
        _forward_append(q, k, v, k_new, v_new, out, lse, **scalars)
    else:
        _forward_out(q, k, v, out, lse, **scalars)
    return (out, lse) if return_lse else out


def _window(window):
    """window as the schema's int[]?, with the extension's checks and messages (made
    before tracing bakes the value in)."""
    if window is None:
        return None
    if not isinstance(window, (tuple, list)):
        raise TypeError(f"window must be a (left, right) tuple of ints or None, got "
                        f"{type(window).__name__}")
    if len(window) != 2:
        raise ValueError(f"window must be a (left, right) pair, got {len(window)} values")
    for x in window:
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"window must be a (left, right) tuple of ints, got "
                            f"{type(x).__name__}")
        if x < -1:
            raise ValueError(f"window values must be >= -1 (-1 = unbounded), got {window!r}")
    return [int(x) for x in window]


def _scale_value(name, value):
    """An fp8 scale given as a number, as the schema's float, with the extension's checks
    (made before tracing bakes the value in)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number or a float32 array, got "
                        f"{type(value).__name__}")
    value = float(value)
    if not (0.0 < value < float("inf")):
        raise ValueError(f"{name} must be positive and finite in float32 (the fp8 "
                         f"dequantization factor), got {value!r}")
    return value


def _softcap(softcap):
    """softcap as the schema's float: the extension's checks, made before tracing bakes
    the value in (a bool, a string or a negative value would fail later or silently)."""
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a real number (0 = off), got {type(softcap).__name__}")
    softcap = float(softcap)
    if not softcap >= 0.0 or softcap == float("inf"):
        raise ValueError(f"softcap must be 0 (off) or positive and finite, got {softcap!r}")
    return softcap


def call_combine(outs, lses, kw):
    """fmha_native.combine(outs, lses, **kw) through the ops."""
    _unexpected("combine", kw, _COMBINE_NAMES)
    out, lse, stream = kw.get("out"), kw.get("lse"), kw.get("stream")
    sinks = kw.get("sinks")
    if out is None and lse is None:
        return _combine(outs, lses, stream, sinks)
    out_shape, lse_shape = _combine_shapes(outs)
    if out is None:
        out = outs.new_empty(out_shape)
    if lse is None:
        lse = outs.new_empty(lse_shape, dtype=torch.float32)
    _combine_out(outs, lses, out, lse, stream, sinks)
    return out, lse
