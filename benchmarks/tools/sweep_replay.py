"""Replay a recorded split sweep (sweep_splits.py --json) against this tree's planner, with
no GPU: for each shape, the plan this tree's heuristic makes on the swept device (described
to the _plan_for_device hook), and the time the sweep measured for that plan (the
heuristic's own runs where the plan is unchanged, else the forced count it now picks).
Regret = that time / the best forced time, as SWEEP.md defines it.  A plan whose count the
sweep did not time (pruned at screening) is reported and priced at its screening time.
Only plans the sweep ran are priced: a new kernel or tile choice needs a new sweep.

    python benchmarks/tools/sweep_replay.py [--sweep benchmarks/sweep_h100.json]
"""
import argparse
import json
import math

import _fmha_native

# The sweep's device, as the planner tests describe it (public specifications).
DEVICES = {
    "NVIDIA H100 80GB HBM3": dict(name="NVIDIA H100 80GB HBM3", arch="sm_90", cc=(9, 0), sm_count=132,
                                  l2_bytes=50 << 20, max_smem_per_block=227 << 10,
                                  max_smem_per_sm=228 << 10, archs_built=["80", "90a"]),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", default="benchmarks/sweep_h100.json")
    args = ap.parse_args()
    with open(args.sweep) as f:
        sweep = json.load(f)
    device = DEVICES[sweep["device"]]
    logs, changed = [], []
    for row in sweep["rows"]:
        b, hq, hkv, sq, sk, d, causal = row["shape"]
        plan = _fmha_native._plan_for_device(
            dict(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv, head_dim=d,
                 dtype="bfloat16", causal=int(causal)), device)
        n, same_kernel = plan["num_splits"], ("sm90" in plan["kernel"]) == ("sm90" in row["kernel"])
        if n == row["heuristic_splits"] and same_kernel:
            ms = row["heuristic_ms"]
        else:
            cand = row["candidates"].get(str(n), {})
            ms = cand.get("ms")
            note = ""
            if ms is None:
                ms, note = cand.get("screen_ms", row["heuristic_ms"]), " (not timed: screening time)"
            changed.append(f"{row['label']:28s} {row['kernel_short']:10s} {row['heuristic_splits']:3d} -> "
                           f"{plan['kernel'].split('<')[0]} {n:3d}: {row['heuristic_ms']:.4f} -> {ms:.4f} ms "
                           f"(best {row['best_ms']:.4f}){note}")
        logs.append(math.log(ms / row["best_ms"]))
    for line in changed:
        print(line)
    print(f"{len(logs)} shapes, {len(changed)} plans changed; geometric-mean regret "
          f"{math.exp(sum(logs) / len(logs)):.3f} (recorded {sweep['summary']['geomean_regret']:.3f}); "
          f"max {math.exp(max(logs)):.3f}; above 1.15: {sum(x > math.log(1.15) for x in logs)}")


if __name__ == "__main__":
    main()
