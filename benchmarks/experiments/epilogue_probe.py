"""Where the decode producer's epilogue time goes, from %globaltimer stamps (a probe
build: timeline_probe.patch plus epilogue_probe.patch, which adds, for every stream of a
merging plan, its main-loop end, its rows parked, the CTA barrier passed and its fold
done at probe[1 << 14 + 4 * stream]).

A build that also stamps, at probe[(1 << 14) + 4096 + 4 * stream], the dependents'
trigger and the stream barrier before the park gets the park split into those.

For each CTA the last stream to end its main loop is on the critical path: its park, the
barrier (~0 for the last one) and the fold.  Prints medians over CTAs and runs of that
stream's three phases, the same for the CTA that ends last, and the combine's
release -> exit; L2 flushed as in bench.py.

    PYTHONPATH=<probe tree>/src python3 benchmarks/experiments/epilogue_probe.py
"""
import os
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
probe = torch.zeros(1 << 16, dtype=torch.int64, device="cuda")
os.environ["FMHA_PROBE"] = str(probe.data_ptr())
import fmha_native  # noqa: E402
from bench import L2_FLUSH_BYTES, make_problem  # noqa: E402

SHAPES = [(16, 32, 8, 1, 8192, 128), (1, 32, 8, 1, 131072, 128), (1, 16, 16, 1, 65535, 64),
          (1, 16, 16, 1, 16384, 64), (1, 32, 8, 1, 8192, 128)]
EPI_AT, COMBINE_AT = 1 << 14, 1 << 15


def main():
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for shape in SHAPES:
        q, k, v, out, lse = make_problem(*shape)
        plan = fmha_native.explain(q, k, v)
        for _ in range(3):
            fmha_native.forward(q, k, v, out=out, lse=lse)
        per_cta, last_cta, comb, park_parts = [], [], [], []
        for _ in range(9):
            probe.zero_()
            flush.zero_()
            fmha_native.forward(q, k, v, out=out, lse=lse)
            torch.cuda.synchronize()
            raw = probe.cpu().numpy().view(np.uint64).astype(np.int64)
            epi = raw[EPI_AT:EPI_AT + 4096].reshape(-1, 4)
            epi = epi[: (len(epi) // 4) * 4].reshape(-1, 4, 4)  # [cta][stream][loop, parked, barrier, folded]
            # optional: [after the dependents' trigger, after the stream barrier] per stream
            kk = raw[EPI_AT + 4096:EPI_AT + 8192].reshape(-1, 4)[:, :2]
            rows = []
            for c, cta in enumerate(epi):
                live = cta[:, 0] > 0
                if not live.any():
                    continue
                j = int(np.argmax(np.where(live, cta[:, 0], -1)))
                s, k2 = cta[j], kk[c * 4 + j]
                parts = (k2[0] - s[0], k2[1] - k2[0], s[1] - k2[1]) if k2[0] > 0 else (0, 0, 0)
                rows.append(((s[1] - s[0]) / 1e3, (s[2] - s[1]) / 1e3, (s[3] - s[2]) / 1e3, s[3],
                             tuple(x / 1e3 for x in parts)))
            rows.sort(key=lambda r: r[3])
            per_cta += [r[:3] for r in rows]
            last_cta.append(rows[-1][:3])
            park_parts.append(rows[-1][4])
            c = raw[COMBINE_AT:COMBINE_AT + 4096].reshape(-1, 4)
            c = c[c[:, 1] > 0]
            if len(c):
                comb.append(((c[:, 3].max() - c[:, 2].min()) / 1e3, (c[:, 2].min() - rows[-1][3]) / 1e3))
        med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
        line = (f"== {shape} plan {plan['num_splits']}x{plan.get('stream_splits', '?')}: last stream of a CTA "
                f"park {med(per_cta, 0):.2f} barrier {med(per_cta, 1):.2f} fold {med(per_cta, 2):.2f} us; "
                f"last CTA park {med(last_cta, 0):.2f} barrier {med(last_cta, 1):.2f} fold {med(last_cta, 2):.2f}")
        if comb:
            line += f"; combine released {med(comb, 1):.2f} after, release->exit {med(comb, 0):.2f}"
        if any(p != (0, 0, 0) for p in park_parts):
            line += (f"; last CTA's park = trigger {med(park_parts, 0):.2f} + barrier {med(park_parts, 1):.2f}"
                     f" + rows {med(park_parts, 2):.2f}")
        print(line)
        del q, k, v, out, lse
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
