"""GPU benchmark: fmha_native against torch SDPA's FLASH_ATTENTION and CUDNN_ATTENTION
backends, in one process, bf16, on the shapes of the GPU and decode issues.

Timing: CUDA events around each call after warm-up, median of --reps runs, ours
and the peers interleaved round by round; for memory-bound shapes (few query
rows) the L2 is flushed before every run.
Prints ms, TFLOP/s (4*B*Hq*Sq*Sk*D, halved for causal square), effective GB/s
(Q+K+V+O bytes once) and our plan (splits x walkers per split), then writes JSON
with --json (benchmarks/results_tables.py renders it for RESULTS.md).

    python benchmarks/bench.py [--set gpu|decode|all] [--varlen] [--json out.json] [--plot out.png]
    python benchmarks/bench.py --shape 1,32,8,1,131072,128 --shape 8,16,16,8192,8192,64,1
"""
import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha_native

# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal)
GPU_SHAPES = [
    (1, 16, 16, 128, 65535, 64, False),
    (1, 2, 2, 40000, 40000, 64, False),
    (8, 16, 16, 8192, 8192, 64, False),
    (8, 16, 16, 8192, 8192, 64, True),
    (16, 64, 64, 8192, 8192, 128, True),
    (16, 64, 64, 8192, 8192, 128, False),
    (16, 64, 8, 8192, 8192, 128, True),
    (1, 32, 8, 1, 131072, 128, False),
]
DECODE_SHAPES = [
    (1, 16, 16, 1, 65535, 64, False),
    (1, 32, 8, 1, 131072, 128, False),
    (16, 32, 8, 1, 8192, 128, False),
    (64, 32, 8, 1, 4096, 128, False),
    (4, 32, 8, 16, 16384, 128, False),
]

L2_FLUSH_BYTES = 512 << 20
# "zero": the usual flush (zero a buffer larger than L2), which leaves ~L2-size of
# dirty lines whose write-back lands in the timed call; "clean": the same, then a read
# of a second buffer, so the timed call starts with L2 holding only clean lines.
FLUSH_MODE = "zero"


def walkers_per_split(plan):
    """Warp groups that walk one split's key blocks side by side (explain()'s
    walkers_per_split; trees before the rename call it stream_splits)."""
    return plan.get("walkers_per_split", plan.get("stream_splits", 1))


def flops(b, hq, hkv, sq, sk, d, causal):
    f = 4.0 * b * hq * sq * sk * d
    return f / 2 if causal and sq == sk else f


def nbytes(b, hq, hkv, sq, sk, d, elem=2):
    return elem * (2 * b * sq * hq * d + 2 * b * sk * hkv * d)


def timed_ms(fn, flush=None, reread=None):
    """One call of fn timed with CUDA events, in ms: after zeroing `flush` (the L2
    flush buffer) and then reading `reread` (the clean flush), when given."""
    if flush is not None:
        flush.zero_()
    if reread is not None:
        reread.max()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_all(fns, reps, flush):
    """Median ms of each callable in `fns` (name -> fn).  The runs are
    interleaved - each round times every fn once, in a rotated order - so clock
    or thermal drift over the measurement hits all of them alike."""
    scratch = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda") if flush else None
    reread = torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.float32, device="cuda") if flush and FLUSH_MODE == "clean" else None
    names = list(fns)
    for name in names:
        for _ in range(3):
            fns[name]()
    torch.cuda.synchronize()
    times = {name: [] for name in names}
    for r in range(reps):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            times[name].append(timed_ms(fns[name], scratch, reread))
    return {name: statistics.median(t) for name, t in times.items()}


def peer_fns(row, q, k, v, causal):
    """The SDPA peers that run this problem (name -> fn); notes and failures go to row."""
    fns = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            fns[name], note = peer_fn(backend, q, k, v, causal)
            if note:
                row[name + "_note"] = note
        except RuntimeError as exc:
            row[name + "_ms"] = None
            row[name + "_note"] = str(exc).splitlines()[0][:80]
    return fns


def peer_fn(backend, q, k, v, causal):
    """torch SDPA in its [B, H, S, D] layout (views of our [B, S, H, D] tensors)."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = q.shape[2] != k.shape[2]

    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)

    try:
        run()
        return run, "enable_gqa" if gqa else ""
    except RuntimeError:
        if not gqa:
            raise
    # This backend has no GQA: give it expanded K/V (it then reads more bytes than we count).
    rep = q.shape[2] // k.shape[2]
    ke, ve = kt.repeat_interleave(rep, dim=1), vt.repeat_interleave(rep, dim=1)

    def run_expanded():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, ke, ve, is_causal=causal)

    run_expanded()
    return run_expanded, "kv expanded"


def make_problem(b, hq, hkv, sq, sk, d):
    """bf16 q, k, v (seeded) in FlashAttention's layout and out / lse buffers for them."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    return q, k, v, torch.empty_like(q), torch.empty(b, hq, sq, device="cuda", dtype=torch.float32)


def bench_shape(shape, reps, check):
    b, hq, hkv, sq, sk, d, causal = shape
    q, k, v, out, lse = make_problem(b, hq, hkv, sq, sk, d)
    flush = sq * hq // hkv <= 64
    plan = fmha_native.explain(q, k, v, causal=causal)
    row = {"shape": list(shape), "splits": plan["num_splits"], "walkers_per_split": walkers_per_split(plan),
           "kernel": plan["kernel"]}

    def ours():
        fmha_native.forward(q, k, v, causal=causal, out=out, lse=lse)

    fns = {"ours": ours, **peer_fns(row, q, k, v, causal)}
    for name, ms in time_all(fns, reps, flush).items():
        row[name + "_ms"] = ms
    if check:
        ref = fns["flash"]().transpose(1, 2) if "flash" in fns else None
        if ref is not None and not (causal and sq != sk):
            ours()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            row["rel_err_vs_flash"] = err
    f, nb = flops(*shape), nbytes(b, hq, hkv, sq, sk, d)
    row["ours_tflops"] = f / row["ours_ms"] / 1e9
    row["ours_gbs"] = nb / row["ours_ms"] / 1e6
    peers = [row[p + "_ms"] for p in ("flash", "cudnn") if row.get(p + "_ms")]
    row["best_peer_ms"] = min(peers) if peers else None
    row["speedup_vs_best"] = row["best_peer_ms"] / row["ours_ms"] if peers else None
    row["speedup_vs_flash"] = row["flash_ms"] / row["ours_ms"] if row.get("flash_ms") else None
    del q, k, v, out, lse
    torch.cuda.empty_cache()
    return row


def bench_varlen(reps, batch=32, heads_q=32, heads_kv=8, capacity=32768, d=128, seed=0):
    """Issue 4's ragged decode batch: one query per sequence, key lengths uniform
    in [1, capacity].  Time should follow the sum of the lengths, not batch x the
    longest: compare with the same call on a batch whose every length is the
    mean, and with the peers, which get the padded cache (they cannot skip it)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, 1, heads_q, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(batch, capacity, heads_kv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(batch, capacity, heads_kv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    lengths = torch.randint(1, capacity + 1, (batch,), generator=torch.Generator().manual_seed(seed),
                            dtype=torch.int32)
    mean = int(lengths.float().mean().round())
    ragged = lengths.cuda()
    uniform = torch.full((batch,), mean, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads_q, 1, device="cuda", dtype=torch.float32)
    row = {"shape": [batch, heads_q, heads_kv, 1, capacity, d, False], "kernel": "varlen",
           "sum_lengths": int(lengths.sum()), "mean_length": mean,
           "splits": fmha_native.explain(q, k, v, cache_seqlens=ragged)["num_splits"]}
    # Device lengths are never read on the host, so that call is planned on the capacity;
    # the same lengths in host memory let the planner size the splits by the real lengths.
    fns = {"ours": lambda: fmha_native.forward(q, k, v, cache_seqlens=ragged, out=out, lse=lse),
           "ours_host_lengths": lambda: fmha_native.forward(q, k, v, cache_seqlens=lengths, out=out, lse=lse),
           "ours_uniform": lambda: fmha_native.forward(q, k, v, cache_seqlens=uniform, out=out, lse=lse),
           **peer_fns(row, q, k, v, False)}
    for name, ms in time_all(fns, reps, True).items():
        row[name + "_ms"] = ms
    used = 2 * row["sum_lengths"] * heads_kv * d * 2 + 2 * batch * heads_q * d * 2
    row["ours_gbs"] = used / row["ours_ms"] / 1e6
    row["ragged_over_uniform"] = row["ours_ms"] / row["ours_uniform_ms"]
    row["device_over_host_lengths"] = row["ours_ms"] / row["ours_host_lengths_ms"]
    return row


def fmt(x, spec):
    return format(x, spec) if x is not None else "-"


def print_table(rows):
    print(f"{'shape (B,Hq,Hkv,Sq,Sk,D,causal)':36s} {'split':>7s} {'ours ms':>9s} {'flash ms':>9s} "
          f"{'cudnn ms':>9s} {'TFLOP/s':>8s} {'GB/s':>7s} {'x flash':>8s} {'x cudnn':>8s} {'x best':>7s}")
    for r in rows:
        shape = "(" + ",".join(str(int(x)) if not isinstance(x, bool) else ("c" if x else "nc")
                               for x in r["shape"]) + ")"
        split = f"{r['splits']}x{r.get('walkers_per_split', r.get('stream_splits', 1))}"
        x_cudnn = r["cudnn_ms"] / r["ours_ms"] if r.get("cudnn_ms") else None
        print(f"{shape:36s} {split:>7s} {r['ours_ms']:9.4f} {fmt(r.get('flash_ms'), '9.4f')} "
              f"{fmt(r.get('cudnn_ms'), '9.4f')} {r['ours_tflops']:8.1f} {r['ours_gbs']:7.0f} "
              f"{fmt(r.get('speedup_vs_flash'), '8.2f')} {fmt(x_cudnn, '8.3f')} "
              f"{fmt(r.get('speedup_vs_best'), '7.2f')}")


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if "best_peer_ms" in r]
    labels = ["{},{},{},{},{},{}{}".format(*r["shape"][:6], ",c" if r["shape"][6] else "") for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 1.1), 4.5))
    width = 0.27
    for i, (key, name) in enumerate((("ours_ms", "fmha_native"), ("flash_ms", "torch flash (FA2)"),
                                     ("cudnn_ms", "cuDNN"))):
        vals = [(rows[j]["best_peer_ms"] / rows[j][key]) if rows[j].get(key) and rows[j]["best_peer_ms"] else 0
                for j in x]
        ax.bar([j + (i - 1) * width for j in x], vals, width, label=name)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("speed relative to the best peer (higher is better)")
    ax.set_title(f"fmha_native vs torch SDPA peers, bf16, {torch.cuda.get_device_name()}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", choices=["gpu", "decode", "all"], default="all")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--only", help="comma list of row indices of the chosen set")
    ap.add_argument("--varlen", action="store_true", help="also the ragged-batch decode row")
    ap.add_argument("--flush", choices=["zero", "clean"], default="zero",
                    help="L2 flush before memory-bound runs (see FLUSH_MODE)")
    ap.add_argument("--shape", action="append", metavar="B,HQ,HKV,SQ,SK,D[,causal]",
                    help="benchmark this shape instead of a set (repeatable; causal 0/1)")
    args = ap.parse_args()
    global FLUSH_MODE
    FLUSH_MODE = args.flush
    shapes = {"gpu": GPU_SHAPES, "decode": DECODE_SHAPES, "all": GPU_SHAPES + DECODE_SHAPES}[args.set]
    if args.only:
        shapes = [shapes[int(i)] for i in args.only.split(",")]
    if args.shape:
        shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape]
        shapes = [s[:6] + (bool(s[6]) if len(s) > 6 else False,) for s in shapes]
    rows = []
    for s in shapes:
        rows.append(bench_shape(s, args.reps, not args.no_check))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    varlen = bench_varlen(args.reps) if args.varlen else None
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"cuDNN {torch.backends.cudnn.version()}  fmha_native {fmha_native.info()['version']}")
    print_table(rows)
    if varlen:
        print(f"ragged batch {varlen['shape'][:3]} lengths uniform in [1, {varlen['shape'][4]}] "
              f"(sum {varlen['sum_lengths']}): ours {varlen['ours_ms']:.3f} ms "
              f"({varlen['ours_gbs']:.0f} GB/s of keys read), same batch at the mean length "
              f"{varlen['ours_uniform_ms']:.3f} ms (ratio {varlen['ragged_over_uniform']:.2f}); "
              f"lengths on the host (length-aware plan) {varlen['ours_host_lengths_ms']:.3f} ms "
              f"(device/host {varlen['device_over_host_lengths']:.3f}); "
              f"padded peers: flash {fmt(varlen.get('flash_ms'), '.3f')} ms, "
              f"cudnn {fmt(varlen.get('cudnn_ms'), '.3f')} ms")
        rows.append(varlen)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "rows": rows}, f, indent=1)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
