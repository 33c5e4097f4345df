"""Context-parallel benchmark (issue 23): fmha_native.distributed on W GPUs against one GPU
of the same machine, bf16, NCCL.

    torchrun --nproc_per_node=2 benchmarks/bench_cp.py [--reps 5] [--json out.json]
    torchrun --nproc_per_node=2 benchmarks/bench_cp.py --quick          # small shapes
    torchrun --nproc_per_node=2 benchmarks/bench_cp.py --device cpu --quick   # gloo smoke run

Every rank generates the same full problem from one seed and keeps its shard, so the
context-parallel rows can be checked against the one-GPU result (max_rel_err: the largest
|cp - one| / max|one| over this rank's rows, max over ranks).  A W-rank time is the
slowest rank's, per repetition (CUDA events, all_reduce MAX), median of --reps after
warm-up; the one-GPU time is the same call on the whole problem on each GPU alone, median.

Rows:
  prefill ring     causal (1,32,8,S,S,128), layout zigzag, method ring: one-GPU ms / W-GPU
                   ms (target >= 1.8x on 2 GPUs)
  prefill allgather  the same problem with method allgather (zigzag), reported alongside
  ring overlap     the ring's time against the same blocks and merges with no transfer
                   (compute_only): per step ms both ways; target ring <= 1.10x compute-only
  dcp decode       (1,32,8,1,L,128): one GPU holds all L keys, W GPUs about L/W each
                   (device cache_seqlens), context_parallel_decode: one-GPU ms / W-GPU ms
                   (target >= 1.8x on 2 GPUs); also replayed from a captured CUDA graph
                   where capture works (decode_graph_ms).  A single timed call also
                   holds each rank's first launch after the barrier and the ranks'
                   start skew, so the steady-state row runs --steps decode steps back
                   to back per repetition (no sync between them), for the one-GPU call
                   and for DCP alike: one_gpu_step_ms, dcp_step_ms (ms per step) and
                   step_speedup
Prints a table and the command, torch and NCCL versions for benchmarks/RESULTS.md.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import fmha_native
from fmha_native import distributed as cp

PREFILL = (1, 32, 8, 131072, 128)        # batch, heads_q, heads_kv, seqlen, head_dim
DECODE = (1, 32, 8, 1 << 20, 128)        # batch, heads_q, heads_kv, cache length, head_dim
PREFILL_QUICK = (1, 32, 8, 16384, 128)
DECODE_QUICK = (1, 32, 8, 1 << 17, 128)
PREFILL_CPU = (1, 4, 2, 512, 64)
DECODE_CPU = (1, 4, 2, 4096, 64)


class Timer:
    """Times one call on this rank: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.device = device

    def once(self, fn):
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)


def time_world(timer, fn, reps, warmup=2):
    """Median over reps of the slowest rank's ms (all ranks start each rep together)."""
    for _ in range(warmup):
        fn()
    timer.sync()
    times = []
    for _ in range(reps):
        dist.barrier()
        timer.sync()
        ms = torch.tensor([timer.once(fn)], dtype=torch.float64, device=timer.device)
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)
        times.append(float(ms.item()))
    return statistics.median(times)


def time_alone(timer, fn, reps, warmup=2):
    """Median ms of fn on this rank alone (every rank runs it on its own device)."""
    for _ in range(warmup):
        fn()
    timer.sync()
    return statistics.median(timer.once(fn) for _ in range(reps))


def max_over_ranks(x, device):
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def rel_err(part, whole_rows):
    whole_rows = whole_rows.float()
    scale = whole_rows.abs().max().clamp_min(1e-30)
    return float(((part.float() - whole_rows).abs().max() / scale).item())


def zigzag_positions(rank, world, seqlen, device):
    chunk = seqlen // (2 * world)
    second = 2 * world - 1 - rank
    return torch.cat([torch.arange(rank * chunk, (rank + 1) * chunk, device=device),
                      torch.arange(second * chunk, (second + 1) * chunk, device=device)])


def bench_prefill(shape, dtype, device, timer, reps, rank, world):
    b, hq, hkv, s, d = shape
    s -= s % (2 * world)  # zigzag: 2W equal chunks
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(b, s, hq, d, device=device, dtype=dtype, generator=gen)
    k = torch.randn(b, s, hkv, d, device=device, dtype=dtype, generator=gen)
    v = torch.randn(b, s, hkv, d, device=device, dtype=dtype, generator=gen)
    rows = zigzag_positions(rank, world, s, device)
    ql, kl, vl = (x[:, rows].contiguous() for x in (q, k, v))
    row = {"kind": "prefill", "shape": [b, hq, hkv, s, s, d, True], "layout": "zigzag",
           "world": world}
    one = fmha_native.forward(q, k, v, causal=True)
    row["one_gpu_ms"] = time_alone(timer, lambda: fmha_native.forward(q, k, v, causal=True), reps)
    one_rows = one[0][:, rows]
    del q, k, v, one
    for method in ("ring", "allgather"):
        call = (lambda method=method: cp.context_parallel_forward(
            ql, kl, vl, causal=True, method=method, layout="zigzag"))
        out, _ = call()
        row[f"{method}_max_rel_err"] = max_over_ranks(rel_err(out, one_rows), device)
        del out
        row[f"{method}_ms"] = time_world(timer, call, reps)
        row[f"{method}_speedup"] = row["one_gpu_ms"] / row[f"{method}_ms"]
    # The ring with no transfers: the same blocks and merges on the rank's own K/V.
    group_rank, _, global_rank = cp._group_of(dist, None)
    compute_only = (lambda: cp._ring(torch, dist, ql, kl, vl, True, None, "zigzag", None,
                                     group_rank, world, global_rank, communicate=False))
    row["compute_only_ms"] = time_world(timer, compute_only, reps)
    row["ring_step_ms"] = row["ring_ms"] / world
    row["compute_only_step_ms"] = row["compute_only_ms"] / world
    row["ring_over_compute"] = row["ring_ms"] / row["compute_only_ms"]
    return row


def back_to_back(fn, steps):
    """fn run `steps` times in a row, with nothing between the calls."""
    def run():
        for _ in range(steps):
            fn()
    return run


def bench_decode(shape, dtype, device, timer, reps, rank, world, graph, steps):
    b, hq, hkv, length, d = shape
    # Rank r holds keys [lo, hi) of every sequence (shards differ by one key at most).
    lo, hi = rank * length // world, (rank + 1) * length // world
    gen = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(b, 1, hq, d, device=device, dtype=dtype, generator=gen)
    k = torch.randn(b, length, hkv, d, device=device, dtype=dtype, generator=gen)
    v = torch.randn(b, length, hkv, d, device=device, dtype=dtype, generator=gen)
    full_lens = torch.full((b,), length, dtype=torch.int32, device=device)
    row = {"kind": "decode", "shape": [b, hq, hkv, 1, length, d, False], "world": world}
    one = fmha_native.forward(q, k, v, cache_seqlens=full_lens)
    def one_gpu():
        return fmha_native.forward(q, k, v, cache_seqlens=full_lens)

    row["one_gpu_ms"] = time_alone(timer, one_gpu, reps * 4)
    row["steps"] = steps
    row["one_gpu_step_ms"] = time_alone(timer, back_to_back(one_gpu, steps), reps) / steps
    kl = k[:, lo:hi].contiguous()
    vl = v[:, lo:hi].contiguous()
    del k, v
    lens = torch.full((b,), hi - lo, dtype=torch.int32, device=device)

    def call():
        return cp.context_parallel_decode(q, kl, vl, cache_seqlens=lens)

    out, _ = call()
    row["max_rel_err"] = max_over_ranks(rel_err(out, one[0]), device)
    row["dcp_ms"] = time_world(timer, call, reps * 4)
    row["speedup"] = row["one_gpu_ms"] / row["dcp_ms"]
    row["dcp_step_ms"] = time_world(timer, back_to_back(call, steps), reps) / steps
    row["step_speedup"] = row["one_gpu_step_ms"] / row["dcp_step_ms"]
    if graph and device.type == "cuda":
        try:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                call()  # warm-up outside the capture (NCCL and the plan cache)
            torch.cuda.current_stream(device).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                captured, _ = call()
            g.replay()
            torch.cuda.synchronize(device)
            row["graph_max_rel_err"] = max_over_ranks(rel_err(captured, one[0]), device)
            row["decode_graph_ms"] = time_world(timer, g.replay, reps * 4)
        except Exception as exc:  # reported, not fatal: the eager rows still stand
            row["decode_graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: gloo and float32 (checks the script, times nothing useful)")
    parser.add_argument("--no-graph", action="store_true", help="skip the captured decode")
    parser.add_argument("--steps", type=int, default=20,
                        help="decode steps back to back per timed repetition of the "
                             "steady-state row (default 20)")
    parser.add_argument("--json", help="write the rows here (rank 0)")
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
        dtype = torch.bfloat16
        prefill, decode = (PREFILL_QUICK, DECODE_QUICK) if args.quick else (PREFILL, DECODE)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        dtype = torch.float32
        prefill, decode = PREFILL_CPU, DECODE_CPU
    rank, world = dist.get_rank(), dist.get_world_size()
    timer = Timer(device)
    with torch.no_grad():
        rows = [bench_prefill(prefill, dtype, device, timer, args.reps, rank, world),
                bench_decode(decode, dtype, device, timer, args.reps, rank, world,
                             not args.no_graph, max(1, args.steps))]
    if rank == 0:
        meta = {"command": "torchrun --nproc_per_node=%d %s" % (world, " ".join(sys.argv)),
                "torch": torch.__version__, "world": world,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if args.device == "cuda" else None,
                "device": torch.cuda.get_device_name(device) if args.device == "cuda" else "cpu",
                "fmha_native": fmha_native.__version__}
        print(json.dumps(meta))
        for row in rows:
            print(json.dumps({k: (float(f"{x:.4g}") if isinstance(x, float) else x)
                              for k, x in row.items()}))
        p, dc = rows
        print(f"\nprefill {tuple(p['shape'])} zigzag on {world}: one GPU {p['one_gpu_ms']:.2f} ms, "
              f"ring {p['ring_ms']:.2f} ms ({p['ring_speedup']:.2f}x), allgather "
              f"{p['allgather_ms']:.2f} ms ({p['allgather_speedup']:.2f}x); ring step "
              f"{p['ring_step_ms']:.2f} ms vs compute-only {p['compute_only_step_ms']:.2f} ms "
              f"({p['ring_over_compute']:.3f}x)")
        graph = (f", graph {dc['decode_graph_ms']:.3f} ms" if "decode_graph_ms" in dc else "")
        print(f"decode {tuple(dc['shape'])} on {world}: one GPU {dc['one_gpu_ms']:.3f} ms, "
              f"dcp {dc['dcp_ms']:.3f} ms ({dc['speedup']:.2f}x){graph}; {dc['steps']} steps "
              f"back to back: one GPU {dc['one_gpu_step_ms']:.3f} ms/step, dcp "
              f"{dc['dcp_step_ms']:.3f} ms/step ({dc['step_speedup']:.2f}x)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
