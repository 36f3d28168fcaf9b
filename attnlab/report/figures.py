"""Plotly figures of one (dtype, causal) group, drawn from the tables (so every guard of the tables applies).

    speedup_figure(group, baseline)   x_vs_<baseline> against N, one line per build, one panel per head dim
    memory_figure(group)              peak allocation against N, one line per build, predicted holds dashed
    ablation_figure(group, base)      what removing each stage saves, per N, one panel per head dim

`to_html(figures)` writes them into one self-contained page: plotly.js inline, so it draws with no network.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnlab.report.ablation import ablation_table
from attnlab.report.groups import one_group
from attnlab.report.ratios import speedup


def _panels(dims, title: str, ns=()):
    fig = make_subplots(rows=1, cols=len(dims), subplot_titles=[f"D = {d}" for d in dims], shared_yaxes=True)
    fig.update_layout(title=title, template="plotly_white", legend_title_text="build")
    ticks = sorted({int(n) for n in ns})
    fig.update_xaxes(type="log", title_text="sequence length N", tickvals=ticks, ticktext=[str(n) for n in ticks])
    return fig


def speedup_figure(group, baseline: str = "materialised", builds=None) -> go.Figure:
    dtype, causal = one_group(group)
    t = speedup(group, baseline=baseline, builds=builds)
    ratio = f"x_vs_{baseline}"
    dims = sorted(t["D"].unique())
    fig = _panels(dims, f"speedup over {baseline} ({dtype}, {'causal' if causal else 'non-causal'}; "
                        f"times net of the consumption step)", t["N"])
    for col, d in enumerate(dims, start=1):
        for i, (build, rows) in enumerate(t[t["D"] == d].groupby("build", sort=False)):
            rows = rows.sort_values("N")
            fig.add_trace(go.Scatter(x=rows["N"], y=rows[ratio], mode="lines+markers", name=build,
                                     legendgroup=build, showlegend=col == 1,
                                     hovertext=rows["note"], line=dict(color=_color(i))), row=1, col=col)
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text=f"× faster than {baseline}", col=1)
    return fig


def memory_figure(group, builds=None) -> go.Figure:
    dtype, causal = one_group(group, ("peak_bytes", "hold_bytes"))
    ok = group[group["status"] == "ok"]
    if builds is not None:
        ok = ok[ok["build"].isin(builds)]
    ok = ok[ok["family"] != "ablation"]
    dims = sorted(ok["D"].unique())
    fig = _panels(dims, f"peak allocation per call ({dtype}, {'causal' if causal else 'non-causal'})", ok["N"])
    for col, d in enumerate(dims, start=1):
        for i, (build, rows) in enumerate(ok[ok["D"] == d].groupby("build", sort=False)):
            rows = rows.sort_values("N")
            fig.add_trace(go.Scatter(x=rows["N"], y=rows["peak_bytes"], mode="lines+markers", name=build,
                                     legendgroup=build, showlegend=col == 1, line=dict(color=_color(i))),
                          row=1, col=col)
            fig.add_trace(go.Scatter(x=rows["N"], y=rows["hold_bytes"], mode="lines", name=f"{build} must hold",
                                     legendgroup=build, showlegend=False, line=dict(color=_color(i), dash="dot")),
                          row=1, col=col)
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text="bytes", col=1)
    return fig


def ablation_figure(group, base: str = "fused") -> go.Figure:
    dtype, causal = one_group(group)
    t = ablation_table(group, base=base)
    dims = sorted(t["D"].unique())
    fig = _panels(dims, f"what removing each stage of {base} saves ({dtype}, "
                        f"{'causal' if causal else 'non-causal'}); the mask bar is what applying one costs")
    bars = (("softmax_saving_ms", "softmax (→ copy)"), ("pv_saving_ms", "PV (dropped)"), ("mask_cost_ms", "mask"))
    for col, d in enumerate(dims, start=1):
        rows = t[t["D"] == d].sort_values("N")
        for i, (column, label) in enumerate(bars):
            fig.add_trace(go.Bar(x=rows["N"].astype(str), y=rows[column], name=label, legendgroup=label,
                                 showlegend=col == 1, marker_color=_color(i)), row=1, col=col)
    fig.update_xaxes(type="category")
    fig.update_yaxes(title_text="ms", col=1)
    fig.update_layout(barmode="group")
    return fig


def to_html(figures) -> str:
    """One page holding every figure; plotly.js is inlined once, so the page draws offline."""
    parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figures)]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>attnlab figures</title></head><body>"
            + "\n".join(parts) + "</body></html>")


_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf")


def _color(i: int) -> str:
    return _PALETTE[i % len(_PALETTE)]
