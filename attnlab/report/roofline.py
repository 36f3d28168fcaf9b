"""A roofline of one dtype: every build at its arithmetic intensity, under the run's own measured ceilings.

    intensity  = FLOPs / bytes moved    (attnlab.cost: 4·B·H·N²·D, halved for causal; the fewest bytes the build must
                                         move through device memory)
    achieved   = FLOPs / (ms − consume_ms)                   TFLOP/s, the row's `tflops`
    roof       = min(matmul ceiling, intensity × copy bandwidth)   both measured in the run (provenance.json)

A build under the sloped part of the roof is bound by memory traffic, one under the flat part by arithmetic; its
distance below the roof is what neither explains (launches, latency, softmax work that FLOPs do not count).
materialised and qk_softmax sit far left (S and P make their bytes grow as N²·itemsize per head), fused far right.

    roofline_table(results, dtype)    one row per ok (build, shape, causal): intensity, achieved, roof, share of roof
    roofline_figure(results, dtype)   the same, log-log, one colour per build (attnlab.report.palette), circles
                                      non-causal, diamonds causal; ours large, the libraries small
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attnlab.report import palette
from attnlab.report.groups import LEADING, require
from attnlab.report.units import readable_log_axes


def ceilings(rows: pd.DataFrame) -> tuple[float, float]:
    """(TFLOP/s, TB/s) the rows were measured under; a ValueError when the rows carry more than one pair (rows of two
    runs) or none."""
    pairs = rows[["ceiling_tflops", "ceiling_tbps"]].dropna().drop_duplicates()
    if len(pairs) != 1:
        raise ValueError(f"rows must carry one pair of measured ceilings, got {len(pairs)}: give one run's rows")
    tflops, tbps = (float(x) for x in pairs.iloc[0])
    return tflops, tbps


def roofline_table(results: pd.DataFrame, dtype: str, builds=None) -> pd.DataFrame:
    """Every ok row of `dtype` (non-ablation builds unless `builds` names them) at its intensity under the roof."""
    require(results, ("dtype", "causal", "build", "family", "status", "flops", "bytes_moved", "tflops",
                      "ceiling_tflops", "ceiling_tbps"))
    rows = results[(results["dtype"].astype(str) == str(dtype)) & (results["status"] == "ok")]
    rows = rows[rows["build"].isin(builds)] if builds is not None else rows[rows["family"] != "ablation"]
    if rows.empty:
        raise ValueError(f"results hold no ok rows of dtype {dtype!r} to place on a roofline")
    top, bw = ceilings(rows)
    out = rows[[*LEADING, "build"]].copy()
    out["intensity"] = rows["flops"] / rows["bytes_moved"]
    out["achieved_tflops"] = rows["tflops"]
    out["roof_tflops"] = np.minimum(top, out["intensity"] * bw)
    out["share_of_roof"] = out["achieved_tflops"] / out["roof_tflops"]
    out["bound"] = np.where(out["intensity"] * bw < top, "memory", "compute")
    return out.reset_index(drop=True)


def roofline_figure(results: pd.DataFrame, dtype: str, builds=None) -> go.Figure:
    t = roofline_table(results, dtype, builds)
    top, bw = ceilings(results[(results["dtype"].astype(str) == str(dtype)) & (results["status"] == "ok")])
    ridge = top / bw
    lo = min(t["intensity"].min(), ridge) / 2
    hi = max(t["intensity"].max(), ridge) * 2
    xs = np.geomspace(lo, hi, 200)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=np.minimum(top, xs * bw), mode="lines", name="roof (measured ceilings)",
                             line=dict(color=palette.QUANTITY_COLOURS["roof"], width=2)))
    order = palette.ours_first(t["build"])
    for build in order:  # one trace a build, both causal values in it (the marker says which): ours first
        part = t[t["build"] == build]
        look = palette.style(build)
        look["marker"]["symbol"] = ["diamond" if c else "circle" for c in part["causal"]]
        look["marker"]["size"] = look["marker"]["size"] + 2
        fig.add_trace(go.Scatter(
            x=part["intensity"], y=part["achieved_tflops"], mode="markers", name=build, legendgroup=build,
            hovertext=[f"{'causal' if c else 'non-causal'} N={n} D={d} B={b} H={h}: {s:.0%} of the roof"
                       for c, n, d, b, h, s in zip(part["causal"], part["N"], part["D"], part["B"], part["H"],
                                                   part["share_of_roof"])], **look))
    fig.add_annotation(x=math.log10(ridge), y=math.log10(top), text=f"ridge: {ridge:.0f} FLOP/byte",
                       showarrow=True, arrowhead=2)
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte moved through device memory)")
    fig.update_yaxes(type="log", title_text="achieved rate (TFLOP/s)")
    fig.update_layout(title=f"Roofline ({dtype}): copy bandwidth {bw:.3g} TB/s and matmul rate {top:.3g} TFLOP/s, "
                            "both measured in the run; circles non-causal, diamonds causal", template="plotly_white",
                      legend_title_text="build", height=520)
    return palette.limit_visible(readable_log_axes(fig))
