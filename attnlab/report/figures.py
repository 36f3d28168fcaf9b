"""Plotly figures of one (dtype, causal) group, drawn from the tables (so every guard of the tables applies).

    speedup_figure(group, baseline)   x_vs_<baseline> against N, one line per build, one panel per head dim
    memory_figure(group)              peak allocation against N, one line per build, beside what each build must
                                      hold (attnlab.cost's hold_bytes) dashed in the same colour; a byte axis
                                      labelled in MiB and GiB (attnlab.report.units.byte_axis)
    ablation_figure(group, base)      what removing each stage saves, per N, one panel per head dim; below,
                                      apart, what applying an all-zero mask adds

Side by side, one panel per run (cards, or runs of one card), each panel one run's rows of one (dtype, causal) group:

    speedup_by_run(groups, baseline)  x_vs_<baseline> against N, one line per build and head dim
    memory_by_run(groups)             peak allocation against N, one line per build and head dim
    ratio_by_run(ratios)              a library build's time over ours (attnlab.compare.library_ratio) against N

Every build keeps its colour from attnlab.report.palette, ours drawn bold and the libraries thin; a panel draws at
most palette.MOST_VISIBLE traces, the rest a legend click away. `to_html(figures)` writes them into one
self-contained page: plotly.js inline, so it draws with no network.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnlab.report import palette
from attnlab.report.ablation import ablation_table
from attnlab.report.groups import LEADING, one_group
from attnlab.report.ratios import speedup
from attnlab.report.units import BYTE_TITLE, byte_axis, byte_label, n_axis, readable_log_axes

MEMORY_AXIS = "memory per call"


def panels(dims, title: str, ns=()):
    """One row of panels, one per head dim, sharing y, on a log N axis."""
    fig = make_subplots(rows=1, cols=len(dims), subplot_titles=[f"D = {d}" for d in dims], shared_yaxes=True)
    fig.update_layout(title=title, template="plotly_white", legend_title_text="build")
    fig.update_xaxes(type="log", title_text="sequence length N (tokens)", **n_axis(ns))
    return fig


def speedup_figure(group, baseline: str = "materialised", builds=None) -> go.Figure:
    dtype, causal = one_group(group)
    t = speedup(group, baseline=baseline, builds=builds)
    ratio = f"x_vs_{baseline}"
    dims = sorted(t["D"].unique())
    fig = panels(dims, f"speedup over {baseline} ({dtype}, {'causal' if causal else 'non-causal'}; "
                        f"times net of the consumption step)", t["N"])
    for col, d in enumerate(dims, start=1):
        for build, rows in t[t["D"] == d].groupby("build", sort=False):
            rows = rows.sort_values("N")
            fig.add_trace(go.Scatter(x=rows["N"], y=rows[ratio], mode="lines+markers", name=build,
                                     legendgroup=build, showlegend=col == 1,
                                     hovertext=rows["note"], **palette.style(build)), row=1, col=col)
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text=f"× faster than {baseline} (ratio of times)", col=1)
    return palette.limit_visible(readable_log_axes(fig))


def memory_figure(group, builds=None) -> go.Figure:
    """Peak allocation against N for one (dtype, causal) group, a panel per head dim: each build's measured peak
    (solid) and what its name says it must hold (attnlab.cost's hold_bytes: materialised S and P, qk_softmax P and
    O, fused O; dashed, the same colour). A peak far above its dashed line holds more than its algorithm needs; one
    below it is not the program its name claims. Ours bold; the libraries thin, behind their legend entries where
    the panel would hold more than palette.MOST_VISIBLE lines."""
    dtype, causal = one_group(group, ("peak_bytes", "hold_bytes"))
    ok = group[group["status"] == "ok"]
    if builds is not None:
        ok = ok[ok["build"].isin(builds)]
    ok = ok[(ok["family"] != "ablation") & ok["peak_bytes"].notna()]
    if ok.empty:
        raise ValueError("no row holds a measured peak allocation to draw (a CPU run has none: no device allocator)")
    dims = sorted(ok["D"].unique())
    fig = panels(dims, f"peak allocation per call ({dtype}, {'causal' if causal else 'non-causal'}): solid, the "
                        "measured peak; dashed, what the build must hold", ok["N"])
    order = palette.ours_first(ok["build"])
    for col, d in enumerate(dims, start=1):
        part = ok[ok["D"] == d]
        for build in order:
            rows = part[part["build"] == build].sort_values("N")
            if rows.empty:
                continue
            fig.add_trace(go.Scatter(x=rows["N"], y=rows["peak_bytes"], mode="lines+markers", name=build,
                                     legendgroup=build, showlegend=col == 1, **palette.style(build),
                                     hovertext=[f"peak {byte_label(p)}, must hold {byte_label(h)}"
                                                for p, h in zip(rows["peak_bytes"], rows["hold_bytes"])]),
                          row=1, col=col)
            look = palette.style(build, "dash")
            look["line"]["width"] = min(look["line"]["width"], palette.LIBRARY_WIDTH + 0.5)
            fig.add_trace(go.Scatter(x=rows["N"], y=rows["hold_bytes"], mode="lines", name=f"{build} must hold",
                                     legendgroup=f"{build} must hold", showlegend=col == 1, **look), row=1, col=col)
    fig.update_yaxes(**byte_axis(list(ok["peak_bytes"]) + list(ok["hold_bytes"])))
    fig.update_yaxes(title_text=f"{MEMORY_AXIS} ({BYTE_TITLE})", col=1)
    return palette.limit_visible(readable_log_axes(fig))


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
    q = palette.QUANTITY_COLOURS
    bars = ((1, "softmax_saving_ms", "softmax (→ copy)", q["softmax"]), (1, "pv_saving_ms", "PV (dropped)", q["pv"]),
            (2, "mask_cost_ms", "mask", q["mask"]))
    for col, d in enumerate(dims, start=1):
        rows = t[t["D"] == d].sort_values("N")
        for panel, column, label, colour in bars:
            fig.add_trace(go.Bar(x=rows["N"].astype(str), y=rows[column], name=label, legendgroup=label,
                                 showlegend=col == 1, marker_color=colour), row=panel, col=col)
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


def _by_run(tables: dict, y: str, line: str, title: str, y_title: str, hover: str | None = None,
            bytes_axis: bool = False) -> go.Figure:
    """One panel per run (at most three a row), `y` against N, one line per (`line`, D): a build's colour from the
    palette (`line` names builds), dash per head dim; the same value keeps its colour in every panel. `bytes_axis`:
    `y` is bytes, labelled in MiB and GiB."""
    titles = list(tables)
    cols = min(3, len(titles))
    rows = math.ceil(len(titles) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, shared_yaxes=True,
                        vertical_spacing=0.25 / rows if rows > 1 else 0.2)
    fig.update_layout(title=title, template="plotly_white", legend_title_text=f"{line}, head dim",
                      height=380 * rows)
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
                                     **palette.style(str(name), _DASHES[dims.index(int(d)) % len(_DASHES)])),
                          row=r + 1, col=c + 1)
            shown.add(key)
    fig.update_xaxes(type="log", title_text="sequence length N (tokens)", **n_axis(ns))
    fig.update_yaxes(type="log")
    if bytes_axis:
        fig.update_yaxes(**byte_axis([v for t in tables.values() for v in t[y]]))
    fig.update_yaxes(title_text=y_title, col=1)
    return palette.limit_visible(readable_log_axes(fig))


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
                   f"peak allocation ({BYTE_TITLE})", bytes_axis=True)


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
