"""Where a build's time goes as N grows at FlashAttention's shapes: a least-squares line ms = fixed + slope·N over a
bench's N = 512 … 16384 rows (B·N and H·D constant: the work grows as N, and our fused kernels' grids, 128 rows a
program, have the same number of programs at every N). `fixed` holds what does not grow with N (each program's prologue and epilogue, the last wave's
tail), `slope` the steady state. Issue 5's question "where does fused's gap to cuDNN come from" in two numbers:

    python scripts/fixed_cost.py BENCH_CSV [--builds fused,sdpa_cudnn,sdpa_flash] [--min-n 1024]

(--min-n: leave out shorter rows, e.g. qk_softmax's N = 512, where another P kernel runs.)

Prints, per (dtype, D, causal) and build, fixed_ms, ms_per_1k_N and the fit's worst residual in per cent.
"""
import argparse

import pandas as pd

from attnlab.report import lines


def fit(bench: pd.DataFrame, builds=("fused", "sdpa_cudnn", "sdpa_flash")) -> pd.DataFrame:
    """One row per (dtype, D, causal, build): the line through that build's ok rows at FlashAttention's shapes
    (attnlab.report.lines.fit against N in thousands)."""
    return lines.fit(bench, builds, "N").rename(columns={"slope": "ms_per_1k_N"})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_csv")
    ap.add_argument("--builds", default="fused,sdpa_cudnn,sdpa_flash")
    ap.add_argument("--min-n", type=int, default=0)
    a = ap.parse_args()
    bench = pd.read_csv(a.bench_csv)
    t = fit(bench[bench.N >= a.min_n], tuple(a.builds.split(",")))
    print(t.pivot_table(index=["dtype", "D", "causal"], columns="build",
                        values=["fixed_ms", "ms_per_1k_N", "max_resid_pct"]).round(4).to_string())


if __name__ == "__main__":
    main()
