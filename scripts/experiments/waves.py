"""PERFORMANCE.md v57: does the grid's last wave cost our kernels a whole round of work items? In the bench's shapes
(B·N = 16384, H·D = 2048) every kernel has a power of two of work items at every N: the qk_softmax P kernel 4096 at
D = 64 (128 rows an item) and 2048 at D = 128, the PV kernel 2048 (256 rows), fused 2048. On 132 SMs that is 31.03 or
15.52 rounds, so the last round runs 4 or 68 items while the other SMs wait. If so, a shape with 3 % more heads
(33·132 items: 32 or 16 rounds exactly) takes no longer than the bench's; if the tail is hidden, 3 % longer.

Each pair is timed by the profiler's kernel spans (attnlab.kernels.kernel_times), base and variant alternating over
rounds, so the ratio is per kernel and both shapes see the same clock. GPU only:

    python scripts/experiments/waves.py [--rounds 3] [--out waves.csv]
"""
import argparse
import statistics

import pandas as pd
import torch

from attnlab import kernels, measure

# (D, N, base (B, H), variant (B, H)): the variant has 33/32 of the base's heads·batches, a whole number of rounds.
PAIRS = [
    (64, 4096, (4, 32), (4, 33)),
    (64, 16384, (1, 32), (1, 33)),
    (128, 4096, (4, 16), (2, 33)),
    (128, 8192, (2, 16), (1, 33)),
]


def times(build, B, H, N, D, dtype, causal):
    q, k, v = measure.make_inputs(measure.Case(build, B, H, H, N, D, dtype, causal, "cuda"))
    out = kernels.kernel_times(build, q, k, v, causal=causal)
    del q, k, v
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--builds", default="qk_softmax,fused")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rows = []
    for D, N, base, var in PAIRS:
        for build in a.builds.split(","):
            got = {"base": [], "variant": []}
            for _ in range(a.rounds):
                for which, (B, H) in (("base", base), ("variant", var)):
                    got[which].append(times(build, B, H, N, D, a.dtype, False))
            work = (var[0] * var[1]) / (base[0] * base[1])
            for name in sorted(got["base"][0]):
                b = statistics.median(r.get(name, float("nan")) for r in got["base"])
                v = statistics.median(r.get(name, float("nan")) for r in got["variant"])
                rows.append(dict(build=build, D=D, N=N, base=f"{base[0]}x{base[1]}", variant=f"{var[0]}x{var[1]}",
                                 kernel=name[:60], base_ms=b, variant_ms=v, time_ratio=v / b, work_ratio=work,
                                 base_rounds=" ".join(f"{r.get(name, float('nan')):.4f}" for r in got["base"]),
                                 variant_rounds=" ".join(f"{r.get(name, float('nan')):.4f}" for r in got["variant"])))
                print(f"{build} D={D} N={N} {name[:40]}: base {b:.4f} ms, variant {v:.4f} ms, time ratio {v / b:.4f}"
                      f" (work ratio {work:.4f})", flush=True)
            if a.out:
                pd.DataFrame(rows).to_csv(a.out, index=False)


if __name__ == "__main__":
    main()
