"""fmha_native: fused multi-head attention forward with native split-K kernels.

This module is the Python glue around the C extension ``_fmha_native``: it
re-exports the extension's functions and, for callers that hand in torch or
CuPy arrays, picks the caller's current stream and allocates the outputs with
the caller's own library, so results come back as the caller's kind of array.
torch and CuPy are imported only when the caller's objects come from them.
It also owns the checks made once at import (the extension's version, the
FMHA_NUM_THREADS / FMHA_CPU_SIMD / FMHA_GPU_PREFILL_KERNEL settings), the refusal of torch tensors that
require grad under grad mode, the routing of torch calls that torch traces or compiles
through the torch.library ops of fmha_native/_torch_ops.py, and the public functions'
signatures.

    out, lse = fmha_native.forward(q, k, v, causal=True, num_splits=0)

Layout: q [batch, seqlen_q, heads_q, head_dim], k and v
[batch, seqlen_k, heads_kv, head_dim]; out like q; lse float32
[batch, heads_q, seqlen_q] (natural log).  Packed (varlen) calls with cu_seqlens_q:
q [total_q, heads_q, head_dim], out like q, lse float32 [heads_q, total_q].  See
DESIGN.md for the contract.

torch: plain eager calls go straight to the extension (its C fast path reads torch
tensors and torch's current stream), because the op's dispatch would add about as much
host time again as the whole direct call takes on a decode step (_torch_ops.py says
more).  Calls made while torch traces or compiles (torch.compiler.is_compiling(),
fake or functional tensors, a dispatch mode) go through the ops fmha_native::forward,
forward_out, forward_append, combine and combine_out, so torch.compile(fullgraph=True)
sees one op.  The ops are registered when this package first meets a torch tensor
(inside torch.compile too: dynamo runs the import of _torch_ops for real).
"""
# The extension is a top-level module, not fmha_native._C: from a source checkout
# (the repository root on sys.path) this package is the tree's own copy of the
# Python files, and it still finds the compiled part that `pip install .` put in
# site-packages.
import os as _os
import warnings as _warnings
from inspect import Parameter as _Parameter, Signature as _Signature

# The version these Python files were written for; the extension must say the same
# (csrc/fmha.h FMHA_VERSION), or the two halves come from different builds.
__version__ = "0.1.0"

try:
    import _fmha_native as _C
except ImportError as exc:  # pragma: no cover - a setup problem, said plainly
    raise ImportError("fmha_native's compiled extension _fmha_native is missing: install the "
                      "package with `pip install .` from the repository root") from exc

if getattr(_C, "__version__", None) != __version__:
    raise ImportError(
        f"fmha_native {__version__} (Python files in {_os.path.dirname(__file__)}) found the "
        f"compiled extension _fmha_native {getattr(_C, '__version__', '(no version)')} "
        f"({getattr(_C, '__file__', '?')}): the two come from different builds. Reinstall with "
        "`pip install .` in the checkout these files come from (or import fmha_native from "
        "outside the repository to use the installed copy)")

FmhaError = _C.FmhaError
Tensor = _C.Tensor
info = _C.info

__all__ = ["FmhaError", "Tensor", "combine", "explain", "forward", "info", "reference",
           "__version__"]


# ---------------------------------------------------------------------------
# Run-time environment: FMHA_NUM_THREADS and FMHA_CPU_SIMD are read by the C side
# (csrc/cpu_pool.c, csrc/cpu_fwd.c) at the CPU backend's first use, and
# FMHA_GPU_PREFILL_KERNEL (csrc/gpu.c) at the first GPU plan, with the rules below; a
# value they cannot honour is replaced there silently, so it is reported here, at
# import, as a RuntimeWarning that names what is used instead.
# ---------------------------------------------------------------------------

# Pool threads per online CPU at most, and overall (csrc/cpu_pool.c has the same
# numbers and says why).
_THREADS_PER_CPU_CAP = 4
_THREADS_HARD_CAP = 1024
_SIMD_NAMES = ("auto", "scalar", "avx2", "avx512", "avx512bf16")
# The names csrc/gpu.c (fmha_gpu_prefill_choice) knows; any other value means auto.
_PREFILL_KERNEL_NAMES = ("auto", "mma", "sm90")


def _online_cpus():
    try:
        online = _os.sysconf("SC_NPROCESSORS_ONLN")
    except (AttributeError, OSError, ValueError):
        online = _os.cpu_count() or 1
    return max(1, min(online, _THREADS_HARD_CAP))


def _environment_problems(environ):
    """Messages for the FMHA_* run-time variables in environ that the C side will not
    take as given, each saying what it uses instead; [] when all is well."""
    problems = []
    text = environ.get("FMHA_NUM_THREADS", "")
    if text:
        online = _online_cpus()
        cap = min(_THREADS_HARD_CAP, _THREADS_PER_CPU_CAP * online)
        digits = text.isascii() and text.isdigit()
        # Past 18 digits the value is over any cap (and int() of thousands of digits raises).
        count = (int(text) if len(text) <= 18 else cap + 1) if digits else 0
        if count == 0:
            problems.append(f"FMHA_NUM_THREADS={text!r} is not a whole number >= 1; using "
                            f"{online} threads (the online CPUs)")
        elif count > cap:
            problems.append(f"FMHA_NUM_THREADS={text} is more than {cap} ({_THREADS_PER_CPU_CAP} "
                            f"per online CPU, at most {_THREADS_HARD_CAP}); using {cap} threads")
    simd = environ.get("FMHA_CPU_SIMD", "")
    if simd and simd not in _SIMD_NAMES:
        problems.append(f"FMHA_CPU_SIMD={simd!r} is not one of {', '.join(_SIMD_NAMES)}; using "
                        "auto (the best SIMD path this CPU has)")
    kernel = environ.get("FMHA_GPU_PREFILL_KERNEL", "")
    if kernel and kernel not in _PREFILL_KERNEL_NAMES:
        problems.append(f"FMHA_GPU_PREFILL_KERNEL={kernel!r} is not one of "
                        f"{', '.join(_PREFILL_KERNEL_NAMES)}; using auto (the planner picks the "
                        "prefill kernel for the device)")
    return problems


def _warn_environment():
    for problem in _environment_problems(_os.environ):
        _warnings.warn(problem, RuntimeWarning, stacklevel=3)


_warn_environment()

# The torch module and its Tensor type, set the first time a torch tensor is
# seen (this module never imports torch itself), the cheapest way to ask
# torch for the current stream of a device, and fmha_native._torch_ops (the
# torch.library ops, registered when it is imported).
_torch = None
_torch_tensor = None
_torch_raw_stream = None
_ops = None
# torch.compiler.is_compiling and the depth of torch's dispatch-mode stack, called
# directly by forward/combine for plain tensors (a call through _ops.wanted costs
# as much again on every eager call).
_torch_compiling = None
_torch_dispatch_modes = None

# type -> "torch", "cupy" or None, filled as types are met: the module-name test
# below costs more than the rest of a NumPy call's Python glue.
_library_of_type = {}


def _library(obj):
    """'torch', 'cupy' or None: which known array library made obj."""
    cls = type(obj)
    try:
        return _library_of_type[cls]
    except KeyError:
        pass
    module = getattr(cls, "__module__", None) or ""
    lib = None
    if module == "torch" or module.startswith("torch."):
        lib = "torch"
    elif module == "cupy" or module.startswith("cupy."):
        lib = "cupy"
    _library_of_type[cls] = lib
    return lib


def _load_torch():
    global _torch, _torch_tensor, _torch_raw_stream, _ops, _torch_compiling
    global _torch_dispatch_modes
    if _torch is None:
        import torch

        from . import _torch_ops as ops

        # torch.cuda.current_stream(i).cuda_stream builds a Stream object;
        # the raw handle it wraps comes from this function (what torch's own
        # compiled code calls), when this torch has it.
        _torch_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _torch_tensor = torch.Tensor
        _ops = ops
        _torch_compiling = ops.is_compiling
        _torch_dispatch_modes = ops.dispatch_modes
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


def _no_grad_input(name, x):
    """x without autograd history (shares memory) when it is a torch tensor that
    requires grad; under grad mode such a tensor is refused: this library computes
    the forward only, so a result that autograd would treat as differentiable (or an
    output written behind autograd's back) would be silently wrong."""
    if _library(x) != "torch" or not x.requires_grad:
        return x
    return _detached(name, x)


def _traced_no_grad_input(name, x):
    """_no_grad_input on the ops' path, which dynamo traces: without _library, whose
    type cache dynamo would guard on (recompiling whenever a new type is cached)."""
    if isinstance(x, _torch_tensor) and x.requires_grad:
        return _detached(name, x)
    return x


def _detached(name, x):
    """x.detach() for a torch tensor x that requires grad, outside grad mode."""
    if _torch.is_grad_enabled():
        raise ValueError(
            f"{name} requires grad, but fmha_native computes the attention forward only (no "
            f"backward): call it under torch.no_grad() or torch.inference_mode(), or pass "
            f"{name}.detach()")
    return x.detach()


# Tensor arguments of forward/explain and of combine, checked by _no_grad_input.
_FORWARD_TENSOR_KEYWORDS = ("out", "lse", "cache_seqlens", "k_new", "v_new", "block_table",
                            "cu_seqlens_q", "cu_seqlens_k", "sinks", "k_scale", "v_scale")
_COMBINE_TENSOR_KEYWORDS = ("out", "lse", "sinks")


def _no_grad_keywords(kw, names, check=_no_grad_input):
    for name in names:
        x = kw.get(name)
        if x is not None:
            kw[name] = check(name, x)


def _q_rank(kw):
    """The rank q must have for forward to allocate its outputs: 3 when packed."""
    return 4 if kw.get("cu_seqlens_q") is None else 3


def _out_dtype_is_float32(value):
    """Whether out_dtype=value asks for float32 in one of the spellings the extension
    takes (csrc/args.c: "float32", torch.float32, numpy.float32, numpy.dtype("float32"));
    False for None and for anything else (which the extension refuses, naming out_dtype)."""
    if value is None:
        return False
    if isinstance(value, str):
        return value == "float32"
    if isinstance(value, type):
        return value.__module__ == "numpy" and value.__name__ == "float32"
    module = type(value).__module__ or ""
    if module == "torch":
        return str(value) == "torch.float32"
    return (module == "numpy" or module.startswith("numpy.")) and str(value) == "float32"


def _forward_outputs(q, kw, empty, float32):
    """Allocate out (q's shape; q's dtype, or float32 with out_dtype=float32) and lse
    (float32 [batch, heads_q, seqlen_q], or [heads_q, total_q] with cu_seqlens_q) where
    kw has none; q has _q_rank(kw) dimensions; empty(shape, dtype) is the library's
    allocator on q's device."""
    if kw.get("out") is None:
        kw["out"] = empty(q.shape, float32 if _out_dtype_is_float32(kw.get("out_dtype"))
                          else q.dtype)
    if kw.get("lse") is None and kw.get("return_lse", True):
        if kw.get("cu_seqlens_q") is not None:
            kw["lse"] = empty((q.shape[1], q.shape[0]), float32)
        else:
            batch, seqlen_q, heads_q = q.shape[0], q.shape[1], q.shape[2]
            kw["lse"] = empty((batch, heads_q, seqlen_q), float32)


def _combine_outputs(outs, kw, empty, float32):
    """Allocate out (outs' dtype, [batch, seqlen_q, heads, head_dim]) and lse (float32
    [batch, heads, seqlen_q]) where kw has none; empty as for _forward_outputs."""
    _, batch, seqlen_q, heads, head_dim = outs.shape
    if kw.get("out") is None:
        kw["out"] = empty((batch, seqlen_q, heads, head_dim), outs.dtype)
    if kw.get("lse") is None:
        kw["lse"] = empty((batch, heads, seqlen_q), float32)


def _prepare(lib, q, k, v, kw, allocate):
    """Common glue of forward/explain for torch or CuPy q: (context or None, q, k, v, kw)."""
    kw = dict(kw)
    if lib == "torch":
        _load_torch()
        q, k, v = _no_grad_input("q", q), _no_grad_input("k", k), _no_grad_input("v", v)
        if kw:
            _no_grad_keywords(kw, _FORWARD_TENSOR_KEYWORDS)
        ctx, kw = _torch_context(q, kw)
        # Only a well-formed q gets outputs here, and device tensors with
        # device="cpu" get none: _C reports those errors.
        if (allocate and q.dim() == _q_rank(kw) and
                not (kw.get("device") == "cpu" and q.device.type != "cpu") and
                (kw.get("out") is None or kw.get("lse") is None)):
            torch = _torch
            _forward_outputs(q, kw, lambda shape, dtype: torch.empty(shape, dtype=dtype, device=q.device),
                             torch.float32)
        return ctx, q, k, v, kw
    ctx, kw = _cupy_context(q, kw)
    if allocate and q.ndim == _q_rank(kw) and kw.get("device") != "cpu":
        import cupy

        _forward_outputs(q, kw, lambda shape, dtype: cupy.empty(shape, dtype=dtype), cupy.float32)
    return ctx, q, k, v, kw


def _ops_forward(q, k, v, kw):
    """forward through the torch ops (torch is tracing or compiling the call)."""
    check = _traced_no_grad_input
    q, k, v = check("q", q), check("k", k), check("v", v)
    if kw:
        kw = dict(kw)
        _no_grad_keywords(kw, _FORWARD_TENSOR_KEYWORDS, check)
    return _ops.call_forward(q, k, v, kw)


def _dispatch(fn, q, k, v, kw, allocate):
    """fn(q, k, v, **kw) for torch or CuPy q, in the context their library needs."""
    ctx, q, k, v, kw = _prepare(_library(q), q, k, v, kw, allocate=allocate)
    if ctx is None:
        return fn(q, k, v, **kw)
    with ctx:
        return fn(q, k, v, **kw)


# forward, explain and combine take **kw and hand it to the C functions, which bind
# and check the keywords themselves (and name a wrong one); Python-level parameters
# would add the cost of binding every keyword twice to each call.  Their signatures
# (for inspect.signature, help() and IDEs; fmha_native/__init__.pyi has the types)
# are attached below, and tests/test_api.py checks them against the C argument lists.


def forward(q, k, v, **kw):
    """Attention forward: (out, lse), or out alone when return_lse is false.

    q [batch, seqlen_q, heads_q, head_dim], k and v [batch, seqlen_k, heads_kv,
    head_dim] (sequence before heads: a torch SDPA tensor [batch, heads, seq, dim]
    needs .transpose(1, 2) first).  out is like q; lse is float32
    [batch, heads_q, seqlen_q] (natural log).

    ``causal``: bottom-right aligned mask.  ``softmax_scale``: default
    1/sqrt(head_dim).  ``num_splits``: 0 = heuristic, 1 = no split, >= 2 = forced
    (clamped to the key blocks).  ``out``/``lse``: written in place and returned.
    ``device``: None (where the inputs live), "cpu", "gpu"/"cuda"/"hip".
    ``stream``: an integer stream handle; for torch and CuPy inputs it defaults to
    the caller's current stream.  With ``cache_seqlens`` (int32 [batch]) k and v are
    a KV cache of capacity seqlen_k; ``k_new`` and ``v_new`` [batch, seqlen_new,
    heads_kv, head_dim] are written into it at cache_seqlens[b] before attending.
    Device cache_seqlens are never read on the host (no sync; a decode step can be
    captured in a CUDA graph): the plan is made for the capacity, or for
    ``max_seqlen_k`` (the most keys any sequence has, appended rows included).

    Paged KV cache: ``block_table`` int32 [batch, max_blocks_per_seq]; k and v are
    [num_pages, page_size, heads_kv, head_dim] (page_size a multiple of 16) and key j
    of sequence b lives in page block_table[b, j // page_size]; k_new/v_new are
    appended through the table.  Packed (varlen) sequences: ``cu_seqlens_q`` int32
    [batch + 1] (q [total_q, heads_q, head_dim], out like q, lse float32
    [heads_q, total_q]), with ``cu_seqlens_k`` for packed k and v [total_k, heads_kv,
    head_dim], or with a dense or paged KV cache (then k_new/v_new are packed like q).
    ``max_seqlen_q`` / ``max_seqlen_k``: the longest sequence, a plan hint (device
    cu_seqlens are never read on the host).  Causal is bottom-right per sequence.

    Model features (both backends; on the GPU the tensor-core kernels run them):
    ``window=(left, right)``: query i at position p = i + len_k - len_q sees key j
    iff p - left <= j <= p + right (-1: unbounded; causal=True sets right to 0).
    ``softcap=c`` (c > 0): every scaled score s becomes c * tanh(s / c) before the
    softmax.  ``sinks`` float32 [heads_q]: one logit per query head that joins the
    softmax denominator only (lse includes it; a row with no visible key gives out 0 and
    lse = the sink).

    ``out_dtype``: None (q's dtype) or float32 ("float32", torch.float32 or
    numpy.float32): out in float32 for float16/bfloat16 inputs, so partial states that
    are merged later (combine, context parallelism) are not rounded to 16 bits first.
    An ``out`` given in float32 means the same; out and out_dtype, both given, must agree.

    FP8 KV cache (both backends; the GPU tiles widen the codes as they read them):
    k and v (dense, packed or paged, both alike) in float8 e4m3fn -- torch
    ``float8_e4m3fn`` tensors, ``ml_dtypes.float8_e4m3fn`` NumPy arrays, or, for a
    producer that cannot export fp8 (DLPack without the float8 codes), uint8 arrays of
    the codes with ``kv_dtype="e4m3fn"``.  q, out, k_new and v_new keep float16/bfloat16
    (float32 on the CPU).  ``k_scale`` / ``v_scale``: the dequantization factors, key
    = k_scale * fp8 code value: a Python number (per tensor), or float32 of shape ()
    (per tensor), [heads_kv] or [batch, heads_kv] (per sequence and kv head); each
    defaults to 1.0.  Host scales must be positive and finite (ValueError); device
    scales are not read on the host, and one <= 0 or NaN gives what the math gives
    (never an access outside the tensors).  An append quantizes on write: k_new / v_new
    row x is stored as the e4m3fn nearest to x / scale (ties to even), saturated to
    +-448.

    Forward only: torch tensors that require grad are refused under grad mode.  torch
    calls made while torch traces or compiles go through the op fmha_native::forward
    (or forward_out / forward_append when out, lse or an append is written).
    """
    # A plain torch tensor once torch is loaded: also what dynamo sees when it traces
    # this function, which must not reach _library (see _traced_no_grad_input).
    if type(q) is _torch_tensor:
        if _torch_compiling() or _torch_dispatch_modes():
            return _ops_forward(q, k, v, kw)
        return _dispatch(_C.forward, q, k, v, kw, allocate=True)
    lib = _library(q)
    if lib is None:
        return _C.forward(q, k, v, **kw)
    if lib == "torch":
        if _torch is None:
            _load_torch()
        if _ops.wanted(q):
            return _ops_forward(q, k, v, kw)
    return _dispatch(_C.forward, q, k, v, kw, allocate=True)


def explain(q, k, v, **kw):
    """The plan forward would run with the same arguments, as a dict.

    The plan, without running it: backend, kernel, effective
    num_splits, partials (producers write fp32 partials and the combine writes out),
    block_m, block_n, pack_gqa, reason, gate ({requirement: {"met", "why"}}), supported,
    and the problem's dimensions, dtype and out_dtype.  Validates like forward.
    """
    if _library(q) is None:
        return _C.explain(q, k, v, **kw)
    return _dispatch(_C.explain, q, k, v, kw, allocate=False)


def combine(outs, lses, **kw):
    """Merge partial attention states: (out, lse).

    Merges G partial attention states (as split-K or context parallelism produce
    them): outs [G, batch, seqlen_q, heads, head_dim] normalised by their own
    row sums, lses float32 [G, batch, heads, seqlen_q].  out has outs' dtype
    [batch, seqlen_q, heads, head_dim]; lse is float32 [batch, heads, seqlen_q].
    Partials whose lse is -inf (a shard with no visible key) add nothing, whatever
    their out holds; a row whose partials are all -inf gives out = 0, lse = -inf.

    outs and lses may each be a list or tuple of G partials ([batch, seqlen_q, heads,
    head_dim] and [batch, heads, seqlen_q]) of one kind (torch, CuPy or NumPy): when
    they are equally spaced views of one buffer they are read in place, else stacked
    (a copy).  ``out`` may be exactly one of the partials (outs[g] itself, or that
    list item): every partial of a row is read before the row is written.  ``lse``
    must not overlap lses.  ``sinks`` (float32 [heads], where outs are): attention-sink
    logits folded in once, after the merge, so the combine of sink-free partials over
    KV shards equals one forward with those sinks.  torch calls made while torch traces or compiles go
    through the op fmha_native::combine (combine_out when out or lse is given).
    """
    # As in forward: dynamo tracing a plain torch tensor never reaches _library.
    if type(outs) is _torch_tensor:
        lib = "torch"
    else:
        if type(outs) in (list, tuple):
            outs = _partials(outs, "outs")
        if type(lses) in (list, tuple):
            lses = _partials(lses, "lses")
        lib = _library(outs)
    if lib is None:
        return _C.combine(outs, lses, **kw)
    ctx = None
    if lib == "torch":
        if _torch is None:
            _load_torch()
        if _ops.wanted(outs):
            check = _traced_no_grad_input
            kw = dict(kw)
            _no_grad_keywords(kw, _COMBINE_TENSOR_KEYWORDS, check)
            return _ops.call_combine(check("outs", outs), check("lses", lses), kw)
        outs, lses = _no_grad_input("outs", outs), _no_grad_input("lses", lses)
        kw = dict(kw)
        _no_grad_keywords(kw, _COMBINE_TENSOR_KEYWORDS)
        if outs.dim() == 5:
            ctx, kw = _torch_context(outs, kw)
            torch = _torch
            _combine_outputs(outs, kw, lambda shape, dtype: torch.empty(shape, dtype=dtype,
                                                                        device=outs.device),
                             torch.float32)
    elif lib == "cupy" and outs.ndim == 5:
        import cupy

        ctx, kw = _cupy_context(outs, dict(kw))
        _combine_outputs(outs, kw, lambda shape, dtype: cupy.empty(shape, dtype=dtype),
                         cupy.float32)
    if ctx is None:
        return _C.combine(outs, lses, **kw)
    with ctx:
        return _C.combine(outs, lses, **kw)


def _partials(items, name):
    """A list or tuple of G partial states as one array with a leading G axis: a
    strided view when the items are equally spaced views of one buffer (no copy,
    and an out= that is one of the items stays an exact alias), else a stack."""
    if not items:
        raise ValueError(f"{name} must hold at least one partial state, got an empty "
                         f"{type(items).__name__}")
    first = items[0]
    lib = _library(first)
    for index, x in enumerate(items):
        if _library(x) != lib or (lib is not None and type(x) is not type(first)):
            raise TypeError(f"{name} must be partial states of one kind of array, but "
                            f"{name}[{index}] is a {type(x).__module__}.{type(x).__name__} and "
                            f"{name}[0] a {type(first).__module__}.{type(first).__name__}")
    if lib == "torch":
        torch = _load_torch()
        view = _torch_view_of(items, torch)
        if view is not None:
            return view
        _same_shapes(items, name, lambda x: tuple(x.shape), lambda x: x.dtype)
        return torch.stack(list(items))
    if lib == "cupy":
        import cupy

        _same_shapes(items, name, lambda x: tuple(x.shape), lambda x: x.dtype)
        return cupy.stack(list(items))
    import numpy

    arrays = [numpy.asarray(x) for x in items]
    view = _numpy_view_of(arrays, numpy)
    if view is not None:
        return view
    _same_shapes(arrays, name, lambda x: x.shape, lambda x: x.dtype)
    return numpy.stack(arrays)


def _same_shapes(items, name, shape, dtype):
    for index, x in enumerate(items[1:], 1):
        if shape(x) != shape(items[0]) or dtype(x) != dtype(items[0]):
            raise ValueError(f"{name}[{index}] has shape {shape(x)} and dtype {dtype(x)}, but "
                             f"{name}[0] has {shape(items[0])} and {dtype(items[0])}: every "
                             "partial state must have the same shape and dtype")


def _equal_step(addresses, itemsize):
    """The common distance (in elements, >= 0) between consecutive addresses, or None."""
    step = addresses[1] - addresses[0] if len(addresses) > 1 else 0
    if step < 0 or step % itemsize:
        return None
    for a, b in zip(addresses, addresses[1:]):
        if b - a != step:
            return None
    return step // itemsize


def _torch_view_of(items, torch):
    """items (torch tensors) as one [G, ...] strided view when they share a storage,
    shape, dtype, device and strides and sit at equal steps in it; else None."""
    first = items[0]
    if first.requires_grad:  # as_strided would record autograd history
        return None
    for x in items:
        if (x.shape != first.shape or x.dtype != first.dtype or x.device != first.device
                or x.stride() != first.stride() or x.requires_grad
                or x.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()):
            return None
    step = _equal_step([x.storage_offset() for x in items], 1)
    if step is None:
        return None
    return first.as_strided((len(items),) + tuple(first.shape), (step,) + first.stride(),
                            first.storage_offset())


def _numpy_view_of(arrays, numpy):
    """As _torch_view_of for NumPy arrays that are views of one base array."""
    def root(x):
        while isinstance(x.base, numpy.ndarray):
            x = x.base
        return x

    first = arrays[0]
    base = root(first)
    if base is first or first.dtype.itemsize == 0:
        return None
    for x in arrays:
        if (x.shape != first.shape or x.dtype != first.dtype or x.strides != first.strides
                or root(x) is not base):
            return None
    step = _equal_step([x.__array_interface__["data"][0] for x in arrays], 1)
    if step is None:
        return None
    # Every item lies inside base, so the view's elements do too.
    view = numpy.lib.stride_tricks.as_strided(first, (len(arrays),) + first.shape,
                                              (step,) + first.strides, writeable=False)
    return view


def _signature(positional, keywords):
    """A Signature: positional-or-keyword names, then keyword-only (name, default) pairs."""
    params = [_Parameter(name, _Parameter.POSITIONAL_OR_KEYWORD) for name in positional]
    params += [_Parameter(name, _Parameter.KEYWORD_ONLY, default=default)
               for name, default in keywords]
    return _Signature(params)


# The C argument lists (forward_args and combine_args in csrc/args.c) and the
# defaults the C side applies when a keyword is left out.
_FORWARD_KEYWORDS = (("causal", False), ("softmax_scale", None), ("num_splits", 0),
                     ("return_lse", True), ("out", None), ("lse", None), ("device", None),
                     ("stream", None), ("cache_seqlens", None), ("k_new", None),
                     ("v_new", None), ("max_seqlen_k", None), ("block_table", None),
                     ("cu_seqlens_q", None), ("cu_seqlens_k", None), ("max_seqlen_q", None),
                     ("window", None), ("softcap", 0.0), ("sinks", None), ("out_dtype", None),
                     ("kv_dtype", None), ("k_scale", None), ("v_scale", None))
_COMBINE_KEYWORDS = (("out", None), ("lse", None), ("stream", None), ("sinks", None))
forward.__signature__ = _signature(("q", "k", "v"), _FORWARD_KEYWORDS)
explain.__signature__ = _signature(("q", "k", "v"), _FORWARD_KEYWORDS)
combine.__signature__ = _signature(("outs", "lses"), _COMBINE_KEYWORDS)


from . import reference  # noqa: E402  (the float64 oracle; needs only NumPy)


def __getattr__(name):
    # fmha_native.distributed needs torch: imported at its first use, never by
    # `import fmha_native`.
    if name == "distributed":
        # import_module, not `from . import`: that form asks this hook first.
        import importlib

        return importlib.import_module(__name__ + ".distributed")
    raise AttributeError(f"module 'fmha_native' has no attribute {name!r}")
