"""Per-stream timeline of the decode producer (and combine) from %globaltimer
stamps, for a probe build only: benchmarks/experiments/timeline_probe.patch adds the stamps
and a `probe` pointer that the launcher reads from $FMHA_PROBE.  Each stream
(warp) records entry, after griddepcontrol.wait, first K/V block landed, main
loop done and exit; each combine CTA entry, after its wait and exit.  Runs with
the L2 flushed as in bench.py, cuDNN timed in the same rounds.

    patch -p1 < benchmarks/experiments/timeline_probe.patch   (in a throw-away copy)
    PYTHONPATH=<copy>/src python3 benchmarks/timeline_probe.py [--shape B,HQ,HKV,SQ,SK,D[,splits]]... [--raw f.npz]
"""
import argparse
import os
import statistics

import numpy as np
import torch
from torch.nn.attention import SDPBackend

SHAPES = ["1,16,16,1,65535,64", "1,32,8,1,131072,128", "16,32,8,1,8192,128", "16,32,8,1,4096,128",
          "64,32,8,1,4096,128"]
COMBINE_AT = 1 << 15

probe = torch.zeros(1 << 16, dtype=torch.int64, device="cuda")
os.environ["FMHA_PROBE"] = str(probe.data_ptr())
import fmha_native  # noqa: E402  (after the env var, though it is read per call)
from bench import L2_FLUSH_BYTES, make_problem, peer_fn, timed_ms  # noqa: E402  (benchmarks/ is the script's directory)


def q(x, f):
    return float(np.quantile(x, f))


def analyse(rec, comb):
    """Times in us relative to the first stream's entry."""
    live = rec[rec[:, 1] > 0]
    t0 = live[:, 1].min()
    entry, waited, first, loop, exit_ = ((live[:, i] - t0) / 1e3 for i in range(1, 6))
    busy = live[:, 6] > 0
    r = {
        "streams": len(live), "sms": len(np.unique(live[:, 0])),
        "entry_max": entry.max(), "wait_med": np.median(waited - entry),
        "first_med": np.median((first - waited)[busy]), "first_max": (first - waited)[busy].max(),
        "loop_p0": loop[busy].min(), "loop_p10": q(loop[busy], .1), "loop_p50": q(loop[busy], .5),
        "loop_p90": q(loop[busy], .9), "loop_max": loop[busy].max(),
        "epi_med": np.median(exit_ - loop), "epi_max": (exit_ - loop).max(), "exit_max": exit_.max(),
    }
    c = comb[comb[:, 1] > 0]
    if len(c):
        r["comb_entry"] = (c[:, 1].min() - t0) / 1e3
        r["comb_release"] = (c[:, 2].min() - t0) / 1e3
        r["comb_exit"] = (c[:, 3].max() - t0) / 1e3
    ticks = np.unique(np.diff(np.unique(live[:, 1:6].ravel())))
    r["tick_ns"] = int(ticks[ticks > 0].min()) if (ticks > 0).any() else 0
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", action="append")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--raw", help="save every run's probe records to this .npz")
    args = ap.parse_args()
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    saved = {}
    for spec in args.shape or SHAPES:
        b, hq, hkv, sq, sk, d, *forced = (int(x) for x in spec.split(","))
        splits = forced[0] if forced else 0
        qq, k, v, out, lse = make_problem(b, hq, hkv, sq, sk, d)
        plan = fmha_native.explain(qq, k, v, num_splits=splits)
        ours = lambda: fmha_native.forward(qq, k, v, out=out, lse=lse, num_splits=splits)  # noqa: E731
        cudnn, _ = peer_fn(SDPBackend.CUDNN_ATTENTION, qq, k, v, False)
        for _ in range(3):
            ours(), cudnn()
        times = {"ours": [], "cudnn": []}
        stats, raws = [], []
        for _ in range(args.reps):
            for name, fn in (("ours", ours), ("cudnn", cudnn)):
                probe.zero_()
                times[name].append(timed_ms(fn, flush) * 1e3)
                if name == "ours":
                    raw = probe.cpu().numpy().view(np.uint64).astype(np.int64)
                    raws.append(raw[:COMBINE_AT + 4096].copy())
                    stats.append(analyse(raw[:COMBINE_AT].reshape(-1, 8), raw[COMBINE_AT:].reshape(-1, 4)))
        if args.raw:
            saved[spec] = np.stack(raws)
        med = {key: statistics.median(s[key] for s in stats) for key in stats[0]}
        print(f"== {spec}  plan {plan['num_splits']}x{plan.get('stream_splits', '?')}  "
              f"ours {statistics.median(times['ours']):.1f} us  cuDNN {statistics.median(times['cudnn']):.1f} us  "
              f"(event, flushed; probe build)")
        print("   " + "  ".join(f"{key} {val:.2f}" if isinstance(val, float) else f"{key} {val}"
                               for key, val in med.items()))
    if args.raw:
        np.savez_compressed(args.raw, **{k.replace(",", "_"): v for k, v in saved.items()})


if __name__ == "__main__":
    main()
