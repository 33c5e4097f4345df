"""python -m fmha_native: a demo that runs one realistic attention problem end to end.

Owns the command-line demo: it prints what the build has (info), the plan for the
problem (explain), runs it on the best backend present, checks it against the float64
reference (on one kv head's group of query heads when the problem is large), and
prints the error, the median time, the FLOP rate and the bytes moved per second.
Exits 1 when the check fails, 2 on a bad argument (one line on stderr, no traceback).
"""
import argparse
import statistics
import sys
import time

import numpy as np

import fmha_native
from fmha_native import reference

# Defaults: a prefill-sized GQA problem on a GPU, a smaller one on the CPU.
GPU_DEFAULT_SHAPE = (2, 16, 4, 1024, 1024, 128)
CPU_DEFAULT_SHAPE = (1, 8, 2, 512, 512, 64)
SHAPE_FIELDS = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim")

# Element types by the names NumPy and torch give them; --dtype also takes the short forms.
DTYPES = ("float32", "float16", "bfloat16")
DTYPE_ALIASES = {"f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16",
                 "half": "float16", "bf16": "bfloat16"}

# Accuracy contract (DESIGN.md section 2).
OUT_RTOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
LSE_ATOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}

WARMUP_RUNS = 2
GPU_RUNS = 20
CPU_RUNS = 5
# Rate units, largest first: a rate is shown in the largest one it reaches.
RATE_UNITS = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


PROG = "python -m fmha_native"


def fail(message):
    """Exit status 2 with message as one line on stderr (a bad argument or problem)."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line on stderr and exit status 2 (argparse's own prints
    the whole usage first)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _count(minimum, what):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"wants {what}, got {text!r}")
        return value
    return parse


def parse_dtype(text):
    name = DTYPE_ALIASES.get(text.lower(), text.lower())
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"wants one of {', '.join(DTYPES)}, got {text!r}")
    return name


def parse_shape(text):
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        dims = ()
    if len(dims) != len(SHAPE_FIELDS) or min(dims) < 0:
        raise argparse.ArgumentTypeError(
            f"wants {len(SHAPE_FIELDS)} non-negative integers "
            f"{','.join(SHAPE_FIELDS)}, got {text!r}")
    return dims


def parse_args(argv):
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="backend to run (auto: the GPU when one is visible)")
    parser.add_argument("--dtype", type=parse_dtype, default=None,
                        help="float32, float16 or bfloat16 (or f32, f16, bf16; default: "
                             "bfloat16 on the GPU, float32 on the CPU)")
    parser.add_argument("--shape", type=parse_shape, default=None,
                        help="batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim "
                             f"(default GPU {GPU_DEFAULT_SHAPE}, CPU {CPU_DEFAULT_SHAPE})")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                        help="bottom-right causal mask (default on)")
    parser.add_argument("--num-splits", type=_count(0, "an integer >= 0"), default=0,
                        help="parts the keys are split into: 0 = let the library choose "
                             "(default), 1 = no split, n >= 2 = n parts")
    parser.add_argument("--runs", type=_count(1, "an integer >= 1"), default=None,
                        help=f"timed runs, the median is shown (default {GPU_RUNS} on the GPU, "
                             f"{CPU_RUNS} on the CPU)")
    return parser.parse_args(argv)


def _import_torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _numpy_dtype(name):
    if name == "float32":
        return np.dtype(np.float32)
    if name == "float16":
        return np.dtype(np.float16)
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


class Problem:
    """The inputs in NumPy (what the reference reads) and in the form the run uses."""

    def __init__(self, shape, dtype, device, torch):
        batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim = shape
        rng = np.random.default_rng(0)
        host = [rng.standard_normal(s, dtype=np.float32) for s in (
            (batch, seqlen_q, heads_q, head_dim),
            (batch, seqlen_k, heads_kv, head_dim),
            (batch, seqlen_k, heads_kv, head_dim))]
        self.shape = shape
        self.dtype = dtype
        self.torch = torch
        np_dtype = _numpy_dtype(dtype)
        if torch is not None:
            tdtype = getattr(torch, dtype)
            self.inputs = [torch.from_numpy(x).to(device="cuda", dtype=tdtype) for x in host]
            self.kw = {}
            self.itemsize = self.inputs[0].element_size()
        elif np_dtype is not None:
            self.inputs = [x.astype(np_dtype) for x in host]
            self.kw = {"device": device}
            self.itemsize = np_dtype.itemsize
        else:
            raise ValueError("bfloat16 on the host needs ml_dtypes: pip install ml_dtypes")
        self.where = ("torch CUDA tensors" if torch is not None
                      else f"NumPy arrays, device={device!r}")


def visible_pairs(seqlen_q, seqlen_k, causal):
    """(query, key) pairs that do work: all of them, half for causal square (the usual
    convention), else the exact bottom-right causal count."""
    if not causal:
        return seqlen_q * seqlen_k
    if seqlen_q == seqlen_k:
        return seqlen_q * seqlen_k / 2
    shift = seqlen_k - seqlen_q
    return sum(min(seqlen_k, max(0, i + shift + 1)) for i in range(seqlen_q))


def time_runs(problem, run, runs):
    """Median seconds of `runs` calls after warm-up: CUDA events under torch, else wall
    clock (host arrays on the GPU then include the copies to and from the device)."""
    for _ in range(WARMUP_RUNS):
        run()
    times = []
    torch = problem.torch
    if torch is not None:
        torch.cuda.synchronize()
        for _ in range(runs):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 1e3)
    else:
        for _ in range(runs):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def check(problem, out, lse, causal):
    """Errors of the first kv head's query heads (and first batch entry) against the
    float64 reference; returns (out relative error, lse max abs error, passed)."""
    batch, heads_q, heads_kv, _, _, _ = problem.shape
    group = heads_q // heads_kv
    q, k, v = (reference.to_float64(x)[:1] for x in problem.inputs)
    ref_out, ref_lse = reference.forward(q[:, :, :group], k[:, :, :1], v[:, :, :1], causal=causal)
    got_out = reference.to_float64(out)[:1, :, :group]
    got_lse = reference.to_float64(lse)[:1, :group]
    if ref_out.size == 0:
        return 0.0, 0.0, True
    norm = np.linalg.norm(ref_out)
    out_err = np.linalg.norm(got_out - ref_out) / (norm if norm else 1.0)
    finite = np.isfinite(ref_lse)
    same_inf = np.array_equal(np.isneginf(got_lse), np.isneginf(ref_lse))
    lse_err = float(np.abs(got_lse[finite] - ref_lse[finite]).max()) if finite.any() else 0.0
    passed = (bool(np.isfinite(out_err)) and out_err <= OUT_RTOL[problem.dtype]
              and lse_err <= LSE_ATOL[problem.dtype] and same_inf)
    return float(out_err), lse_err, passed


def rate(per_second, unit):
    """per_second in the largest unit of RATE_UNITS it reaches: '20.6 GFLOP/s'."""
    for scale, prefix in RATE_UNITS:
        if per_second >= scale:
            return f"{per_second / scale:.3g} {prefix}{unit}"
    return f"{per_second:.3g} {unit}"


def print_plan(plan, heads_q, heads_kv):
    """explain()'s plan, each field with what it means for this run."""
    print("\nplan (fmha_native.explain: what forward will run, decided before running it)")
    backend = plan.get("backend")
    where = (f"{plan.get('cpu_threads')} threads, {plan.get('cpu_simd')} SIMD"
             if backend == "cpu" else f"device {plan.get('device')}")
    print(f"  backend     {backend} ({where})")
    print(f"  kernel      {plan.get('kernel')}")
    print(f"  tiles       {plan.get('block_m')} query rows x {plan.get('block_n')} keys per step "
          "(block_m x block_n)")
    group = heads_q // heads_kv if heads_kv else 0
    if plan.get("pack_gqa"):
        print(f"  pack_gqa    yes: the {group} query heads that share a kv head are packed into "
              "the same tiles, which read each block of K and V once for all of them")
    else:
        print("  pack_gqa    no: each query head is its own tile")
    splits = plan.get("num_splits")
    chosen = ("chosen by the library" if not plan.get("requested_splits")
              else "as requested with --num-splits")
    if splits == 1:
        print(f"  num_splits  1: each tile walks all of its keys ({chosen})")
    else:
        print(f"  num_splits  {splits}: each tile's keys are cut into {splits} parts that run in "
              f"parallel and are merged afterwards (split-K; {chosen})")
    walkers = plan.get("walkers_per_split") or 1
    if walkers > 1:
        print(f"  walkers     {walkers} warps of one thread block share each split and merge their "
              "results in shared memory (walkers_per_split)")
    if plan.get("kv_read_once"):
        print("  kv_read_once yes: K and V are read once and evicted from L2 first")
    print(f"  why         {plan.get('reason')}")
    gate = plan.get("gate") or {}
    if gate:
        print("  requirements of this backend")
        for name, item in gate.items():
            print(f"    {name:<10}{'met' if item['met'] else 'NOT met'}: {item['why']}")


def main(argv=None):
    args = parse_args(argv)
    info = fmha_native.info()
    print(f"fmha_native {info['version']}")
    print(f"  backends    {', '.join(info['backends'])}")
    for dev in info["devices"]:
        print(f"  device {dev['ordinal']}    {dev['name']} ({dev['arch']}, {dev['sm_count']} SMs)")
    if not info["devices"]:
        print("  devices     none visible")
    print(f"  cpu         {info['cpu_threads']} threads, {info['cpu_simd']}")

    device = args.device
    if device == "auto":
        device = "gpu" if info["devices"] else "cpu"
    if device == "gpu" and not info["devices"]:
        return fail("--device gpu, but no GPU is visible to fmha_native")
    dtype = args.dtype or ("bfloat16" if device == "gpu" else "float32")
    shape = args.shape or (GPU_DEFAULT_SHAPE if device == "gpu" else CPU_DEFAULT_SHAPE)
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim = shape
    if heads_kv == 0 or heads_q % heads_kv:
        return fail(f"heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv})")
    torch = _import_torch_cuda() if device == "gpu" else None
    try:
        problem = Problem(shape, dtype, device, torch)
    except ValueError as exc:
        return fail(str(exc))
    kw = dict(problem.kw, causal=args.causal, num_splits=args.num_splits)

    print("\nproblem")
    print("  " + ", ".join(f"{name} {value}" for name, value in zip(SHAPE_FIELDS, shape))
          + f", {dtype}, causal {args.causal}, inputs as {problem.where}")
    try:
        plan = fmha_native.explain(*problem.inputs, **kw)
    except (TypeError, ValueError) as exc:
        return fail(str(exc))
    print_plan(plan, heads_q, heads_kv)

    try:
        out, lse = fmha_native.forward(*problem.inputs, **kw)
    except NotImplementedError as exc:
        return fail(f"not supported on {device}: {exc}")
    out_err, lse_err, passed = check(problem, out, lse, args.causal)
    print("\ncheck against the float64 reference (first batch entry, query heads of kv head 0)")
    print(f"  out relative error {out_err:.3g} (bound {OUT_RTOL[dtype]:g}), "
          f"lse max abs error {lse_err:.3g} (bound {LSE_ATOL[dtype]:g}): "
          f"{'PASS' if passed else 'FAIL'}")

    runs = args.runs if args.runs is not None else (GPU_RUNS if device == "gpu" else CPU_RUNS)
    seconds = time_runs(problem, lambda: fmha_native.forward(*problem.inputs, **kw), runs)
    flops = 4 * batch * heads_q * head_dim * visible_pairs(seqlen_q, seqlen_k, args.causal)
    io_bytes = problem.itemsize * (2 * batch * seqlen_q * heads_q * head_dim
                                   + 2 * batch * seqlen_k * heads_kv * head_dim)
    clock = ("CUDA events" if problem.torch is not None else
             "wall clock, host<->device copies included" if device == "gpu" else "wall clock")
    print(f"\ntime (median of {runs} run{'s' if runs != 1 else ''} after {WARMUP_RUNS} warm-up "
          f"runs, {clock})")
    print(f"  {seconds * 1e3:.3f} ms per call")
    if seconds > 0:
        print(f"  {rate(flops / seconds, 'FLOP/s'):<14} (4 x head_dim FLOPs per query head and "
              "visible query-key pair)")
        print(f"  {rate(io_bytes / seconds, 'B/s'):<14} (Q, K and V read once, out written once)")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
