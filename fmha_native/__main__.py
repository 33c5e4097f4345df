"""python -m fmha_native: a demo that runs one realistic attention problem end to end.

Owns the command-line demo: it prints what the build has (info), the plan for the
problem (explain), runs it on the best backend present, checks it against the float64
reference (on one kv head's group of query heads when the problem is large), and
prints the error, the median time, TFLOP/s and GB/s.  Exits 1 when the check fails.
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

# Accuracy contract (DESIGN.md section 2).
OUT_RTOL = {"f32": 1e-5, "f16": 2e-3, "bf16": 1e-2}
LSE_ATOL = {"f32": 1e-4, "f16": 1e-2, "bf16": 1e-2}

WARMUP_RUNS = 2
GPU_RUNS = 20
CPU_RUNS = 5
TERA = 1e12
GIGA = 1e9


def parse_shape(text):
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        dims = ()
    if len(dims) != len(SHAPE_FIELDS) or min(dims) < 0:
        raise argparse.ArgumentTypeError(
            f"--shape wants {len(SHAPE_FIELDS)} non-negative integers "
            f"{','.join(SHAPE_FIELDS)}, got {text!r}")
    return dims


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m fmha_native", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="backend to run (auto: the GPU when one is visible)")
    parser.add_argument("--dtype", choices=("f32", "f16", "bf16"), default=None,
                        help="element type (default: bf16 on the GPU, f32 on the CPU)")
    parser.add_argument("--shape", type=parse_shape, default=None,
                        help="batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim "
                             f"(default GPU {GPU_DEFAULT_SHAPE}, CPU {CPU_DEFAULT_SHAPE})")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                        help="bottom-right causal mask (default on)")
    parser.add_argument("--num-splits", type=int, default=0, help="0 = heuristic (default)")
    parser.add_argument("--runs", type=int, default=None, help="timed runs (median is shown)")
    return parser.parse_args(argv)


def _import_torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _numpy_dtype(name):
    if name == "f32":
        return np.dtype(np.float32)
    if name == "f16":
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
            tdtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
            self.inputs = [torch.from_numpy(x).to(device="cuda", dtype=tdtype) for x in host]
            self.kw = {}
            self.itemsize = self.inputs[0].element_size()
        elif np_dtype is not None:
            self.inputs = [x.astype(np_dtype) for x in host]
            self.kw = {"device": device}
            self.itemsize = np_dtype.itemsize
        else:
            raise SystemExit("bfloat16 on the host needs ml_dtypes: pip install ml_dtypes")
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
        print("error: --device gpu, but no GPU is visible to fmha_native", file=sys.stderr)
        return 2
    dtype = args.dtype or ("bf16" if device == "gpu" else "f32")
    shape = args.shape or (GPU_DEFAULT_SHAPE if device == "gpu" else CPU_DEFAULT_SHAPE)
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim = shape
    if heads_kv == 0 or heads_q % heads_kv:
        print(f"error: heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv})", file=sys.stderr)
        return 2
    torch = _import_torch_cuda() if device == "gpu" else None
    problem = Problem(shape, dtype, device, torch)
    kw = dict(problem.kw, causal=args.causal, num_splits=args.num_splits)

    print("\nproblem")
    print("  " + ", ".join(f"{name} {value}" for name, value in zip(SHAPE_FIELDS, shape))
          + f", {dtype}, causal {args.causal}, inputs as {problem.where}")
    plan = fmha_native.explain(*problem.inputs, **kw)
    print("\nplan (explain)")
    for key in ("backend", "kernel", "num_splits", "block_m", "block_n", "pack_gqa", "reason"):
        print(f"  {key:<11} {plan.get(key)}")
    for name, item in plan.get("gate", {}).items():
        print(f"  gate {name:<8} {'met' if item['met'] else 'NOT met'}: {item['why']}")

    try:
        out, lse = fmha_native.forward(*problem.inputs, **kw)
    except NotImplementedError as exc:
        print(f"\nnot supported on {device}: {exc}", file=sys.stderr)
        return 2
    out_err, lse_err, passed = check(problem, out, lse, args.causal)
    print("\ncheck against the float64 reference (first batch entry, query heads of kv head 0)")
    print(f"  out relative error {out_err:.3g} (bound {OUT_RTOL[dtype]:g}), "
          f"lse max abs error {lse_err:.3g} (bound {LSE_ATOL[dtype]:g}): "
          f"{'PASS' if passed else 'FAIL'}")

    runs = args.runs or (GPU_RUNS if device == "gpu" else CPU_RUNS)
    seconds = time_runs(problem, lambda: fmha_native.forward(*problem.inputs, **kw), runs)
    flops = 4 * batch * heads_q * head_dim * visible_pairs(seqlen_q, seqlen_k, args.causal)
    io_bytes = problem.itemsize * (2 * batch * seqlen_q * heads_q * head_dim
                                   + 2 * batch * seqlen_k * heads_kv * head_dim)
    clock = ("CUDA events" if problem.torch is not None else
             "wall clock, host<->device copies included" if device == "gpu" else "wall clock")
    print(f"\ntime (median of {runs} after {WARMUP_RUNS} warm-up, {clock})")
    print(f"  {seconds * 1e3:.3f} ms   {flops / seconds / TERA if seconds else 0:.3g} TFLOP/s   "
          f"{io_bytes / seconds / GIGA if seconds else 0:.3g} GB/s (Q+K+V+O)   "
          f"num_splits {plan.get('num_splits')}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
