"""Where a build's time goes as N grows at FlashAttention's shapes: a least-squares line ms = fixed + slope·N over a
bench's N = 512 … 16384 rows (B·N and H·D constant: the work grows as N, and our fused kernels' grids, 128 rows a
program, have the same number of programs at every N). `fixed` holds what does not grow with N (each program's prologue and epilogue, the last wave's
tail), `slope` the steady state. Issue 5's question "where does fused's gap to cuDNN come from" in two numbers:

    python scripts/fixed_cost.py BENCH_CSV [--builds fused,sdpa_cudnn,sdpa_flash] [--min-n 1024]

(--min-n: leave out shorter rows, e.g. qk_softmax's N = 512, where another P kernel runs.)

Prints, per (dtype, D, causal) and build, fixed_ms, ms_per_1k_N and the fit's worst residual in per cent.
"""
import argparse

import numpy as np
import pandas as pd


def fit(bench: pd.DataFrame, builds=("fused", "sdpa_cudnn", "sdpa_flash")) -> pd.DataFrame:
    """One row per (dtype, D, causal, build): the line through that build's ok rows at FlashAttention's shapes."""
    b = bench[(bench.B * bench.N == 16384) & (bench.H * bench.D == 2048) & bench.build.isin(builds)
              & (bench.status == "ok")]
    rows = []
    for (dtype, D, causal, build), g in b.groupby(["dtype", "D", "causal", "build"]):
        if g.N.nunique() < 3:
            continue  # a line through two points says nothing about how well it fits
        A = np.vstack([np.ones(len(g)), g.N.to_numpy() / 1000]).T
        (fixed, slope), *_ = np.linalg.lstsq(A, g.ms.to_numpy(), rcond=None)
        resid = np.abs(A @ [fixed, slope] - g.ms.to_numpy()) / g.ms.to_numpy()
        rows.append(dict(dtype=dtype, D=D, causal=causal, build=build, fixed_ms=fixed, ms_per_1k_N=slope,
                         max_resid_pct=100 * resid.max(), points=len(g)))
    return pd.DataFrame(rows)


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
