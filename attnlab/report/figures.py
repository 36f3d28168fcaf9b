"""Plotly figures of one (dtype, causal) group, drawn from the tables (so every guard of the tables applies).

    speedup_figure(group, baseline)   x_vs_<baseline> against N, one line per build, one panel per head dim
    memory_figure(group)              peak allocation against N, one line per build, predicted holds dashed
    ablation_figure(group, base)      what removing each stage saves, per N, one panel per head dim; below,
                                      apart, what applying an all-zero mask adds

Side by side, one panel per run (cards, or runs of one card), each panel one run's rows of one (dtype, causal) group:

    speedup_by_run(groups, baseline)  x_vs_<baseline> against N, one line per build and head dim
    memory_by_run(groups)             peak allocation against N, one line per build and head dim
    ratio_by_run(ratios)              a library build's time over ours (attnlab.compare.library_ratio) against N

`to_html(figures)` writes them into one self-contained page: plotly.js inline, so it draws with no network.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnlab.report.ablation import ablation_table
from attnlab.report.groups import LEADING, one_group
from attnlab.report.ratios import speedup


def _panels(dims, title: str, ns=()):
    fig = make_subplots(rows=1, cols=len(dims), subplot_titles=[f"D = {d}" for d in dims], shared_yaxes=True)
    fig.update_layout(title=title, template="plotly_white", legend_title_text="build")
    ticks = sorted({int(n) for n in ns})
    fig.update_xaxes(type="log", title_text="sequence length N (tokens)", tickvals=ticks,
                     ticktext=[str(n) for n in ticks])
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
    fig.update_yaxes(title_text=f"× faster than {baseline} (ratio of times)", col=1)
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
    fig.update_yaxes(title_text="peak allocation (bytes)", col=1)
    return fig


def ablation_figure(group, base: str = "fused") -> go.Figure:
    """Two rows of panels, one column per head dim: above, what removing each stage saves; below, apart on an axis of
    its own, what applying an all-zero mask adds (a stage the base program does not have, so a cost, never a
    saving). Each bar keeps the colour of its ablation in every panel."""
    dtype, causal = one_group(group)
    t = ablation_table(group, base=base)
    dims = sorted(t["D"].unique())
    fig = make_subplots(rows=2, cols=len(dims), shared_yaxes=True, vertical_spacing=0.22,
                        subplot_titles=[f"D = {d}" for d in dims] + [f"D = {d}, all-zero mask" for d in dims])
    fig.update_layout(title=f"what removing each stage of {base} saves ({dtype}, "
                            f"{'causal' if causal else 'non-causal'}); below, what applying a mask adds",
                      template="plotly_white", legend_title_text="ablation", barmode="group", height=640)
    bars = ((1, "softmax_saving_ms", "softmax (→ copy)"), (1, "pv_saving_ms", "PV (dropped)"),
            (2, "mask_cost_ms", "mask"))
    for col, d in enumerate(dims, start=1):
        rows = t[t["D"] == d].sort_values("N")
        for i, (panel, column, label) in enumerate(bars):
            fig.add_trace(go.Bar(x=rows["N"].astype(str), y=rows[column], name=label, legendgroup=label,
                                 showlegend=col == 1, marker_color=_color(i)), row=panel, col=col)
    fig.update_xaxes(type="category", title_text="sequence length N (tokens)", row=2)
    fig.update_yaxes(title_text="what removing each stage saves (ms)", row=1, col=1)
    fig.update_yaxes(title_text="what applying an all-zero mask adds (ms)", row=2, col=1)
    return fig


def _one_group_of_all(groups: dict) -> tuple[str, bool]:
    """The (dtype, causal) every run's frame holds; a ValueError when they differ (panels side by side compare runs,
    never dtypes or causal settings)."""
    if not groups:
        raise ValueError("groups must hold at least one run's rows")
    keys = {title: one_group(g) for title, g in groups.items()}
    if len(set(keys.values())) > 1:
        raise ValueError("panels side by side must show one dtype and one causal value, got "
                         + ", ".join(f"{t}: {d} {'causal' if c else 'non-causal'}" for t, (d, c) in keys.items()))
    return next(iter(keys.values()))


_DASHES = ("solid", "dash", "dot", "dashdot")


def _by_run(tables: dict, y: str, line: str, title: str, y_title: str, hover: str | None = None) -> go.Figure:
    """One panel per run (at most three a row), `y` against N, one line per (`line`, D): colour per `line` value,
    dash per head dim; the same value keeps its colour in every panel."""
    titles = list(tables)
    cols = min(3, len(titles))
    rows = math.ceil(len(titles) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, shared_yaxes=True,
                        vertical_spacing=0.25 / rows if rows > 1 else 0.2)
    fig.update_layout(title=title, template="plotly_white", legend_title_text=f"{line}, head dim",
                      height=380 * rows)
    names = list(dict.fromkeys(v for t in tables.values() for v in t[line]))
    dims = sorted({int(d) for t in tables.values() for d in t["D"]})
    ns = sorted({int(n) for t in tables.values() for n in t["N"]})
    shown = set()
    for i, (title_i, t) in enumerate(tables.items()):
        r, c = divmod(i, cols)
        for (name, d), part in t.groupby([line, "D"], sort=False):
            part = part.sort_values("N")
            key = f"{name}, D={int(d)}"
            fig.add_trace(go.Scatter(x=part["N"], y=part[y], mode="lines+markers", name=key, legendgroup=key,
                                     showlegend=key not in shown,
                                     hovertext=part[hover] if hover else None,
                                     line=dict(color=_color(names.index(name)),
                                               dash=_DASHES[dims.index(int(d)) % len(_DASHES)])),
                          row=r + 1, col=c + 1)
            shown.add(key)
    fig.update_xaxes(type="log", title_text="sequence length N (tokens)", tickvals=ns, ticktext=[str(n) for n in ns])
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text=y_title, col=1)
    return fig


def speedup_by_run(groups: dict, baseline: str = "materialised", builds=None) -> go.Figure:
    """`groups`: {run title: that run's rows of one (dtype, causal) group}. attnlab.report.speedup in each panel."""
    dtype, causal = _one_group_of_all(groups)
    tables = {t: speedup(g, baseline=baseline, builds=builds) for t, g in groups.items()}
    return _by_run(tables, f"x_vs_{baseline}", "build",
                   f"speedup over {baseline} per run ({dtype}, {'causal' if causal else 'non-causal'}; "
                   "times net of the consumption step)", f"× faster than {baseline} (ratio of times)", hover="note")


def memory_by_run(groups: dict, builds=None) -> go.Figure:
    """`groups` as speedup_by_run's; the ok rows' peak allocation of every non-ablation build."""
    dtype, causal = _one_group_of_all(groups)
    tables = {}
    for title, g in groups.items():
        ok = g[(g["status"] == "ok") & (g["family"] != "ablation") & g["peak_bytes"].notna()]
        tables[title] = ok if builds is None else ok[ok["build"].isin(builds)]
    return _by_run(tables, "peak_bytes", "build",
                   f"peak allocation per call, per run ({dtype}, {'causal' if causal else 'non-causal'})",
                   "peak allocation (bytes)")


def ratio_by_run(ratios: dict) -> go.Figure:
    """`ratios`: {run title: attnlab.compare.library_ratio tables of one group}; library ms / ours ms against N."""
    missing = [c for t in ratios.values() for c in (*LEADING, "ours", "library", "library_over_ours") if c not in t]
    if missing:
        raise ValueError(f"ratio tables lack column(s) {sorted(set(missing))}: pass attnlab.compare.library_ratio")
    keys = {(str(d), bool(c)) for t in ratios.values() for d, c in zip(t["dtype"], t["causal"])}
    ours = {o for t in ratios.values() for o in t["ours"]}
    if len(keys) != 1 or len(ours) != 1:
        raise ValueError(f"ratio tables must hold one dtype, one causal value and one of our builds, got "
                         f"{sorted(keys)} and {sorted(ours)}")
    (dtype, causal), = keys
    return _by_run(ratios, "library_over_ours", "library",
                   f"{ours.pop()} against each library build, per run ({dtype}, "
                   f"{'causal' if causal else 'non-causal'}; above 1: ours is faster)",
                   "library time / our time (ratio)", hover="note")


def to_html(figures) -> str:
    """One page holding every figure; plotly.js is inlined once, so the page draws offline."""
    parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figures)]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>attnlab figures</title></head><body>"
            + "\n".join(parts) + "</body></html>")


_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf")


def _color(i: int) -> str:
    return _PALETTE[i % len(_PALETTE)]
