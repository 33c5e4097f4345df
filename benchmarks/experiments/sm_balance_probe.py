"""How much would the decode rows gain if each SM got work in proportion to its
measured streaming speed?  Timing only (the output is wrong): needs a probe build
(timeline_probe.patch) plus sm_balance.patch, which scales every stream's key-block
count by sm_scale[%smid] (read from $FMHA_SM_SCALE) and wraps blocks past its split's
end back into the split.

Per shape: calibrate the per-SM rate (key blocks per us, from the probe's stamps)
with all scales 1, derive scales = rate / mean rate, refine once from the SMs' loop
times under those scales, then time ones / refined scales / cuDNN interleaved with
the L2 flushed (as bench.py) and print medians, with the key blocks each run did.

    PYTHONPATH=<probe+balance tree>/src python3 benchmarks/experiments/sm_balance_probe.py
"""
import os
import statistics
import sys

import numpy as np
import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
probe = torch.zeros(1 << 16, dtype=torch.int64, device="cuda")
scale = torch.ones(1024, dtype=torch.float32, device="cuda")
os.environ["FMHA_PROBE"] = str(probe.data_ptr())
os.environ["FMHA_SM_SCALE"] = str(scale.data_ptr())
import fmha_native  # noqa: E402
from bench import L2_FLUSH_BYTES, make_problem, peer_fn, timed_ms  # noqa: E402

SHAPES = [(16, 32, 8, 1, 8192, 128), (1, 32, 8, 1, 131072, 128), (1, 16, 16, 1, 65535, 64),
          (64, 32, 8, 1, 4096, 128)]
COMBINE_AT = 1 << 15
flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")


def run(fn, with_probe):
    probe.zero_()
    us = timed_ms(fn, flush) * 1e3
    if not with_probe:
        return us, None
    raw = probe.cpu().numpy().view(np.uint64).astype(np.int64)[:COMBINE_AT].reshape(-1, 8)
    return us, raw[(raw[:, 1] > 0)]


def per_sm(rec):
    """smid -> (loop us from the SM's first landed block to its last loop end, blocks)."""
    out = {}
    busy = rec[rec[:, 6] > 0]
    for sm in np.unique(busy[:, 0]):
        r = busy[busy[:, 0] == sm]
        out[int(sm)] = ((r[:, 4].max() - r[:, 3].min()) / 1e3, int(r[:, 6].sum()))
    return out


def summary(rec):
    busy = rec[rec[:, 6] > 0]
    t0 = rec[:, 1].min()
    loop = (busy[:, 4] - t0) / 1e3
    return {"blocks": int(busy[:, 6].sum()), "loop_p50": float(np.median(loop)), "loop_max": float(loop.max()),
            "exit_max": float((rec[:, 5].max() - t0) / 1e3)}


def main():
    reps = 11
    for shape in SHAPES:
        b, hq, hkv, sq, sk, d = shape
        qq, k, v, out, lse = make_problem(b, hq, hkv, sq, sk, d)
        plan = fmha_native.explain(qq, k, v)
        ours = lambda: fmha_native.forward(qq, k, v, out=out, lse=lse)  # noqa: E731
        cudnn, _ = peer_fn(SDPBackend.CUDNN_ATTENTION, qq, k, v, False)
        scale.fill_(1.0)
        for _ in range(3):
            ours(), cudnn()
        # 1. calibrate with every scale 1: rate per SM
        rates = {}
        for _ in range(5):
            for sm, (us, blocks) in per_sm(run(ours, True)[1]).items():
                rates.setdefault(sm, []).append(blocks / us)
        rate = {sm: statistics.median(r) for sm, r in rates.items()}
        mean = statistics.mean(rate.values())
        f1 = {sm: min(1.9, max(0.5, r / mean)) for sm, r in rate.items()}
        # 2. refine: under f1, stretch each SM's scale by (mean loop time / its loop time)
        host = np.ones(1024, dtype=np.float32)
        for sm, f in f1.items():
            host[sm] = f
        scale.copy_(torch.from_numpy(host))
        times = {}
        for _ in range(5):
            for sm, (us, _) in per_sm(run(ours, True)[1]).items():
                times.setdefault(sm, []).append(us)
        t = {sm: statistics.median(x) for sm, x in times.items()}
        tm = statistics.mean(t.values())
        f2 = host.copy()
        for sm, x in t.items():
            f2[sm] = min(1.9, max(0.5, f2[sm] * tm / x))
        tiers = np.round(np.array(sorted(f2[list(t)])), 2)
        # 3. interleaved: ones / f1 / f2 / cuDNN
        modes = {"ones": np.ones(1024, dtype=np.float32), "f1": host, "f2": f2}
        res = {m: [] for m in (*modes, "cudnn")}
        for _ in range(reps):
            for m, tab in modes.items():
                scale.copy_(torch.from_numpy(tab))
                us, rec = run(ours, True)
                res[m].append((us, summary(rec)))
            res["cudnn"].append((run(cudnn, False)[0], None))
        print(f"== {shape} plan {plan['num_splits']}x{plan.get('stream_splits', '?')}  SMs seen {len(rate)}  "
              f"f2 min/p10/p50/p90/max {tiers.min()}/{np.quantile(tiers, .1):.2f}/{np.median(tiers):.2f}/"
              f"{np.quantile(tiers, .9):.2f}/{tiers.max()}")
        for m, rows in res.items():
            us = statistics.median(r[0] for r in rows)
            if rows[0][1] is None:
                print(f"   {m:6s} event {us:7.1f} us")
                continue
            s = {key: statistics.median(r[1][key] for r in rows) for key in rows[0][1]}
            print(f"   {m:6s} event {us:7.1f} us  blocks {s['blocks']:.0f}  loop p50 {s['loop_p50']:.1f}  "
                  f"max {s['loop_max']:.1f}  exit {s['exit_max']:.1f}")
        del qq, k, v, out, lse
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
