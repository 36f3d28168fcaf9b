"""A build's time as a line through FlashAttention's shapes: what grows with N and what does not.

    fit(bench, builds, x="N")   -> one row per (dtype, D, causal, build): fixed_ms, slope, max_resid_pct, points

At FlashAttention's shapes (B·N = 16384 tokens, H·D = 2048) the work, the bytes of S and P and qk_softmax's floor all
grow as N, while Q, K, V and O keep the same bytes at every N and our kernels' grids the same number of programs. So
a least-squares line ms = fixed + slope·x over a build's rows splits its time in two: `slope`, the steady state (per
unit of x), and `fixed`, what does not grow with N (launches, each program's prologue and epilogue, the last wave's
tail, and Q/K/V/O traffic that nothing overlaps). With x = N / 1000 the slope is ms per 1000 keys;
with x = floor_ms (qk_softmax's rows) it is the build over its floor in the limit of long
rows, the number qk_softmax's target (at most 1.25× its floor) bounds, and fixed says by how much the short rows
stand above it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from attnlab.measure import TOKENS, WIDTH



def fit(bench: pd.DataFrame, builds, x: str = "N", min_n: int = 0) -> pd.DataFrame:
    """The line through each (dtype, D, causal, build)'s ok rows at FlashAttention's shapes with N ≥ min_n; x: the
    column to fit against ('N' is taken in thousands). Groups with fewer than three such rows get no line (a line
    through two points says nothing about how well it fits)."""
    if x not in bench:
        raise ValueError(f"x must be a column of the bench rows, got {x!r} (columns: {', '.join(bench.columns)})")
    b = bench[(bench.B * bench.N == TOKENS) & (bench.H * bench.D == WIDTH) & bench.build.isin(list(builds))
              & (bench.status == "ok") & (bench.N >= min_n)]
    rows = []
    for (dtype, D, causal, build), g in b.groupby(["dtype", "D", "causal", "build"]):
        g = g.dropna(subset=[x, "ms"])
        if g.N.nunique() < 3:
            continue
        xs = g[x].to_numpy(dtype=float) / (1000 if x == "N" else 1)
        A = np.vstack([np.ones(len(g)), xs]).T
        ms = g.ms.to_numpy(dtype=float)
        (fixed, slope), *_ = np.linalg.lstsq(A, ms, rcond=None)
        resid = np.abs(A @ [fixed, slope] - ms) / ms
        rows.append(dict(dtype=dtype, D=D, causal=causal, build=build, fixed_ms=fixed, slope=slope,
                         max_resid_pct=100 * resid.max(), points=len(g)))
    return pd.DataFrame(rows, columns=["dtype", "D", "causal", "build", "fixed_ms", "slope", "max_resid_pct",
                                       "points"])
