"""Session 34: which of qk_softmax's two kernels holds the build's fixed part (attnlab bench's line against the floor,
`attnlab.bench.floor_lines`: at FlashAttention's shapes 0.03–0.12 ms non-causal and 0.08–0.14 ms causal, where Q, K,
V and O's bytes take 0.063 ms at the copy rate). Each kernel's profiler span (attnlab.kernels.kernel_times) at every
bench N, alternating over rounds, then a line ms = fixed + slope·N per kernel (attnlab.report.lines.fit) through
N ≥ --min-n. GPU only:

    python scripts/experiments/kernel_lines.py [--rounds 3] [--dtype bfloat16] [--out kernel_lines.csv]
"""
import argparse
import statistics

import pandas as pd
import torch

from attnlab import kernels, measure
from attnlab.report import lines

NS = (512, 1024, 2048, 4096, 8192, 16384)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--ds", default="64,128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--min-n", type=int, default=2048)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    cases = [(int(d), bool(int(c)), n) for d in a.ds.split(",") for c in a.causal.split(",") for n in NS]
    got = {case: [] for case in cases}
    for _ in range(a.rounds):
        for D, causal, N in cases:
            B, H = 16384 // N, 2048 // D
            q, k, v = measure.make_inputs(measure.Case("qk_softmax", B, H, H, N, D, a.dtype, causal, "cuda"))
            got[(D, causal, N)].append(kernels.kernel_times("qk_softmax", q, k, v, causal=causal))
            del q, k, v
            torch.cuda.empty_cache()
    rows = []
    for (D, causal, N), rounds in got.items():
        for name in sorted(set().union(*rounds)):
            spans = [r.get(name, 0.0) for r in rounds]  # a kernel absent from a round ran no time there
            rows.append(dict(build=name[:40], B=16384 // N, H=2048 // D, N=N, D=D, dtype=a.dtype, causal=causal,
                             status="ok", ms=statistics.median(spans), rounds=" ".join(f"{s:.4f}" for s in spans)))
            print(f"D={D} causal={causal} N={N} {name[:40]}: {rows[-1]['ms']:.4f} ms ({rows[-1]['rounds']})",
                  flush=True)
    df = pd.DataFrame(rows)
    if a.out:
        df.to_csv(a.out, index=False)
    t = lines.fit(df, sorted(df.build.unique()), "N", min_n=a.min_n)
    print(f"lines through N >= {a.min_n}: ms = fixed + slope * N/1000")
    print(t.round(4).to_string(index=False))


if __name__ == "__main__":
    main()
