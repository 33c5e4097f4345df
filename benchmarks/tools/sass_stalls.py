"""Summarise ncu's per-instruction stall samples (the CSV that `SASS=file ncu_stalls.sh`
writes): the kernel's share of samples by stall reason and by opcode, the instructions
that hold the most samples, and how much of the code runs (distinct instructions with an
execution count) and where, by address.

    python benchmarks/tools/sass_stalls.py out.csv [--top 25] [--op MUFU] [--bin 4096]

--op OPCODE: the stall reasons of that opcode's samples alone (e.g. HGMMA, MUFU).
"""
import argparse
import collections
import csv

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read(path):
    lines = open(path).read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    table = list(csv.reader(lines[start:]))
    head = table[0]
    reasons = [h for h in head if h.startswith("stall_") and "(Not Issued)" not in h]
    rows = []
    for r in table[1:]:
        rec = dict(zip(head, r))
        words = rec.get("Source", "").split()
        if not words:
            continue
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        rows.append({
            "address": int(rec["Address"], 16),
            "source": rec["Source"].strip(),
            "opcode": op.split(".")[0],
            "samples": number(rec.get(SAMPLES, "0")),
            "executed": number(rec.get(EXECUTED, "0")),
            "reasons": {h[len("stall_"):]: number(rec.get(h, "0")) for h in reasons},
        })
    return rows


def shares(counter, total, n):
    return ", ".join(f"{k} {v / total * 100:.1f}%" for k, v in counter.most_common(n) if v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--op")
    ap.add_argument("--bin", type=int, default=4096, help="bytes of code per layout line")
    args = ap.parse_args()
    rows = read(args.csv)
    total = sum(r["samples"] for r in rows) or 1.0
    by_reason, by_op, op_exec = collections.Counter(), collections.Counter(), collections.Counter()
    for r in rows:
        by_reason.update(r["reasons"])
        by_op[r["opcode"]] += r["samples"]
        op_exec[r["opcode"]] += r["executed"]
    ran = [r for r in rows if r["executed"] > 0]
    print(f"{len(rows)} instructions ({len(rows) * 16} bytes), {len(ran)} executed; "
          f"{total:.0f} samples, {sum(r['executed'] for r in rows):.0f} warp instructions executed")
    print("by reason:", shares(by_reason, total, 10))
    print("by opcode (share of samples, warp instructions executed):",
          ", ".join(f"{o} {v / total * 100:.1f}% {op_exec[o]:.0f}" for o, v in by_op.most_common(14)))
    if args.op:
        picked, own = collections.Counter(), 0.0
        for r in rows:
            if r["opcode"] == args.op:
                picked.update(r["reasons"])
                own += r["samples"]
        print(f"{args.op}: {own / total * 100:.1f}% of samples; their reasons:",
              shares(picked, sum(picked.values()) or 1.0, 8))
    print(f"\ntop {args.top} instructions by samples:")
    for r in sorted(rows, key=lambda r: -r["samples"])[:args.top]:
        top = sorted(((v, k) for k, v in r["reasons"].items() if v), reverse=True)[:3]
        why = " ".join(f"{k}:{v / r['samples'] * 100:.0f}" for v, k in top) if r["samples"] else ""
        print(f"{r['address'] - rows[0]['address']:7d} {r['samples'] / total * 100:5.2f}% "
              f"ex={r['executed']:>11.0f}  {r['source'][:58]:58s} {why}")
    print(f"\ncode layout ({args.bin}-byte bins with executed instructions):")
    bins = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for r in rows:
        b = bins[(r["address"] - rows[0]["address"]) // args.bin]
        b[0] += r["executed"] > 0
        b[1] += r["executed"]
        b[2] += r["samples"]
    for k in sorted(bins):
        n, ex, smp = bins[k]
        if n:
            print(f"{k * args.bin:8d}  {n:4d} of {args.bin // 16} executed  ex {ex:11.0f}  samples {smp / total * 100:5.1f}%")


if __name__ == "__main__":
    main()
