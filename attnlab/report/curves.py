"""The walkthrough's figures of one dtype: non-causal and causal side by side, never in one line or one ratio.

    speedup_curves(results, dtype, baseline)  three rows of panels against N: each of our builds' speedup over the
                                              baseline, its latency (ms) and its achieved TFLOP/s; a column per causal
                                              value; one colour per build (attnlab.report.palette), one dash per head
                                              dim
    library_curves(results, dtype, baseline)  the library builds' speedup over the baseline beside fused's: a panel
                                              per (head dim, causal value), fused bold, each library thin
    speedup_trend(results, build, baseline)   the curve's shape per (dtype, causal, D): rises then flattens, still
                                              rising, flat or falls (what the walkthrough's hypothesis is judged by)
    policy_figure(runs)                       one build's speedup against N for several runs (one per batch policy):
                                              the build's colour, one dash per run, one marker per head dim
    attribution_figure(group)                 per removed boundary and head dim: the time the step saved, measured,
                                              beside its bytes at the measured bandwidth (and with the QKᵀ pass the
                                              step adds or removes)

Each panel is drawn from one (dtype, causal) group's table (attnlab.report.speedup, attribution), so every guard of
those tables holds: a frame mixing dtypes is refused, and the two causal values never share a panel.
"""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnlab.report import palette
from attnlab.report.boundary_time import attribution
from attnlab.report.groups import cases, one_group, split
from attnlab.report.ratios import speedup
from attnlab.report.units import n_axis, readable_log_axes

DASHES = ("solid", "dash", "dot", "dashdot", "longdash")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x")
# (column, subplot label, axis title with its unit)
ROWS = (("speedup", "× faster than {baseline}", "× faster than {baseline} (ratio of times)"),
        ("ms", "latency (ms)", "latency (ms)"), ("tflops", "achieved TFLOP/s", "achieved rate (TFLOP/s)"))


def _causal_word(causal: bool) -> str:
    return "causal" if causal else "non-causal"


def _one_dtype(results, dtype: str):
    one = results[results["dtype"].astype(str) == str(dtype)]
    if one.empty:
        raise ValueError(f"results hold no rows of dtype {dtype!r}; they have {sorted(results['dtype'].unique())}")
    return split(one)


def speedup_curves(results, dtype: str, baseline: str = "materialised", builds=None) -> go.Figure:
    """Speedup over `baseline`, latency and achieved TFLOP/s against N for one dtype (module docstring). `builds`
    defaults to our three builds (those measured); library_curves draws the libraries."""
    parts = _one_dtype(results, dtype)
    measured = {b for g in parts.values() for b in g["build"]}
    builds = [b for b in (builds or palette.OURS) if b in measured]
    causals = [c for (_, c) in parts]
    fig = make_subplots(rows=len(ROWS), cols=len(causals), shared_xaxes=True, vertical_spacing=0.07,
                        horizontal_spacing=0.08,
                        subplot_titles=[f"{_causal_word(c)}: {label.format(baseline=baseline)}"
                                        for _, label, _ in ROWS for c in causals])
    tables = {c: speedup(g, baseline=baseline, builds=builds) for (_, c), g in parts.items()}
    dims = sorted({int(d) for t in tables.values() for d in t["D"]})
    ns = sorted({int(n) for t in tables.values() for n in t["N"]})
    ratio = f"x_vs_{baseline}"
    for col, causal in enumerate(causals, start=1):
        t = tables[causal]
        rows = cases(parts[(str(dtype), causal)])
        # achieved TFLOP/s at the same net time the speedup uses: FLOPs (attnlab.cost) over ms less consumption
        t = t.assign(tflops=[rows[(r.build, (r.B, r.H, r.Hkv, r.N, r.D))]["flops"] / (r.ms * 1e9)
                             if r.ms > 0 else float("nan") for r in t.itertuples()])
        t = t.rename(columns={ratio: "speedup"})
        for (build, d), line in t.groupby(["build", "D"], sort=False):
            line = line.sort_values("N")
            key = f"{build}, D={int(d)}"
            for row, (column, *_) in enumerate(ROWS, start=1):
                fig.add_trace(go.Scatter(
                    x=line["N"], y=line[column], mode="lines+markers", name=key, legendgroup=key,
                    showlegend=(row == 1 and col == 1), hovertext=line["note"],
                    **palette.style(build, DASHES[dims.index(int(d)) % len(DASHES)])), row=row, col=col)
    fig.update_xaxes(type="log", **n_axis(ns))
    fig.update_xaxes(title_text="sequence length N (tokens)", row=len(ROWS))
    fig.update_yaxes(type="log")
    for row, (_, _, axis) in enumerate(ROWS, start=1):
        fig.update_yaxes(title_text=axis.format(baseline=baseline), row=row, col=1)
    fig.update_layout(title=f"Speedup over {baseline}, latency and achieved rate of our builds ({dtype}; times net "
                            "of the consumption step; colour: build, dash: head dim D)",
                      template="plotly_white", height=330 * len(ROWS), legend_title_text="build, head dim")
    return palette.limit_visible(readable_log_axes(fig))


def library_curves(results, dtype: str, baseline: str = "materialised", ours: str = "fused") -> go.Figure | None:
    """The library builds' speedup over `baseline` against N beside `ours`'s, for one dtype: a row per head dim, a
    column per causal value; `ours` bold, each library thin in its own colour. None when the rows hold no library
    build."""
    parts = _one_dtype(results, dtype)
    libraries = list(dict.fromkeys(b for g in parts.values() for b in g["build"]
                                   if not palette.is_ours(b) and b != baseline))
    if not libraries:
        return None
    causals = [c for (_, c) in parts]
    tables = {c: speedup(g, baseline=baseline, builds=[ours, *libraries]) for (_, c), g in parts.items()}
    dims = sorted({int(d) for t in tables.values() for d in t["D"]})
    ns = sorted({int(n) for t in tables.values() for n in t["N"]})
    fig = make_subplots(rows=len(dims), cols=len(causals), shared_xaxes=True, shared_yaxes=True,
                        vertical_spacing=0.12 if len(dims) > 1 else 0.2, horizontal_spacing=0.06,
                        subplot_titles=[f"{_causal_word(c)}, D = {d}" for d in dims for c in causals])
    ratio = f"x_vs_{baseline}"
    shown = set()
    for col, causal in enumerate(causals, start=1):
        t = tables[causal]
        for row, d in enumerate(dims, start=1):
            for build, line in t[t["D"] == d].groupby("build", sort=False):
                line = line.sort_values("N")
                fig.add_trace(go.Scatter(x=line["N"], y=line[ratio], mode="lines+markers", name=build,
                                         legendgroup=build, showlegend=build not in shown, hovertext=line["note"],
                                         **palette.style(build)), row=row, col=col)
                shown.add(build)
    fig.update_xaxes(type="log", **n_axis(ns))
    fig.update_xaxes(title_text="sequence length N (tokens)", row=len(dims))
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text=f"× faster than {baseline} (ratio of times)", col=1)
    fig.update_layout(title=f"The library builds beside {ours}: speedup over {baseline} ({dtype}; {ours} bold, each "
                            "library thin; click a legend entry to hide or show it)",
                      template="plotly_white", height=300 * len(dims) + 120, legend_title_text="build")
    return palette.limit_visible(readable_log_axes(fig))


def attribution_figure(group) -> go.Figure:
    """For one (dtype, causal) group: per boundary (rows) and head dim (columns), bars against N of the time the step
    saved (measured Δ between the two builds), its bytes at the measured copy bandwidth, and that plus the QKᵀ pass
    the step removes (negative: adds)."""
    dtype, causal = one_group(group)
    t = attribution(group)
    bounds = list(dict.fromkeys(t["boundary"]))
    dims = sorted({int(d) for d in t["D"]})
    fig = make_subplots(rows=len(bounds), cols=len(dims), shared_yaxes=False, vertical_spacing=0.15,
                        subplot_titles=[f"{b} ({t[t.boundary == b].from_build.iloc[0]} → "
                                        f"{t[t.boundary == b].to_build.iloc[0]}), D = {d}"
                                        for b in bounds for d in dims])
    q = palette.QUANTITY_COLOURS
    bars = (("delta_ms", "saved, measured (Δ ms)", q["measured"]),
            ("predicted_ms", "its bytes at the copy bandwidth", q["predicted"]),
            ("predicted_with_qk_ms", "bytes + the QKᵀ pass the step removes", q["predicted_with_qk"]))
    for row, b in enumerate(bounds, start=1):
        for col, d in enumerate(dims, start=1):
            part = t[(t["boundary"] == b) & (t["D"] == d)].sort_values("N")
            for column, label, colour in bars:
                fig.add_trace(go.Bar(x=part["N"].astype(str), y=part[column], name=label, legendgroup=label,
                                     showlegend=(row == 1 and col == 1), marker_color=colour,
                                     hovertext=part["note"]), row=row, col=col)
    fig.update_xaxes(type="category", title_text="sequence length N (tokens)")
    fig.update_yaxes(title_text="time (ms)", col=1)
    fig.update_layout(title=f"What each removed boundary saves, against what its bytes cost at the measured "
                            f"bandwidth ({dtype}, {_causal_word(causal)})",
                      barmode="group", template="plotly_white", height=360 * len(bounds))
    return fig


FLAT = 0.05  # a doubling of N that changes the speedup by less than this share leaves it flat
RISE = 0.10  # the speedup must change by more than this share from the first N to the last to have risen or fallen


def _shape(first: float, last: float, last_step: float, points: int) -> str:
    if points < 2:
        return "one N only"
    overall = last / first - 1
    if abs(overall) < RISE:
        return "flat"
    if overall < 0:
        return "falls"
    return "still rising" if last_step > FLAT else "rises then flattens"


def doubling_changes(n: list, x: list) -> tuple[float, float]:
    """The relative change of x over the first doubling of N (n[0] to the first N at least twice it) and over the
    last (from the largest N at most half the last to the last): the grid's step where no N is that far apart, so a
    grid in steps of 512 is judged over the same span of N as one in powers of two."""
    if len(x) < 2:
        return math.nan, math.nan
    up = next((i for i, v in enumerate(n) if v >= 2 * n[0]), len(n) - 1)
    down = next((i for i in range(len(n) - 1, -1, -1) if n[i] <= n[-1] / 2), 0)
    return x[max(up, 1)] / x[0] - 1, x[-1] / x[min(down, len(x) - 2)] - 1


def speedup_trend(results, build: str = "fused", baseline: str = "materialised") -> pd.DataFrame:
    """Per (dtype, causal, D): `build`'s speedup over `baseline` at the first and last N measured, its change over
    the first and the last doubling of N (doubling_changes: first_step, last_step), and the curve's shape: 'rises
    then flattens' (up by more than RISE overall, by at most FLAT over the last doubling), 'still rising', 'flat',
    'falls' or 'one N only'."""
    rows = []
    ratio = f"x_vs_{baseline}"
    for (dtype, causal), g in split(results).items():
        if not {build, baseline} <= set(g["build"]):
            continue
        t = speedup(g, baseline=baseline, builds=[build]).dropna(subset=[ratio])
        for d, line in t.groupby("D"):
            line = line.sort_values("N")
            x, n = list(line[ratio]), list(line["N"])
            steps = doubling_changes(n, x)
            rows.append({"dtype": dtype, "causal": causal, "D": int(d), "first_N": int(n[0]), "first": x[0],
                         "last_N": int(n[-1]), "last": x[-1], "first_step": steps[0], "last_step": steps[-1],
                         "shape": _shape(x[0], x[-1], steps[-1], len(x))})
    return pd.DataFrame(rows, columns=["dtype", "causal", "D", "first_N", "first", "last_N", "last", "first_step",
                                       "last_step", "shape"])


def policy_figure(runs: dict, build: str = "fused", baseline: str = "materialised") -> go.Figure:
    """`build`'s speedup over `baseline` against N for several runs (`runs`: label → results of one dtype each, e.g.
    one run per batch policy): the build's own colour, one dash per run, one marker per head dim, a panel per causal
    value."""
    dtypes = {label: sorted(r["dtype"].astype(str).unique()) for label, r in runs.items()}
    several = [label for label, d in dtypes.items() if len(d) != 1]
    if several:
        raise ValueError(f"runs must hold one dtype each: {several[0]!r} holds {dtypes[several[0]] or 'none'}")
    causals = sorted({bool(c) for r in runs.values() for c in r["causal"]})
    fig = make_subplots(rows=1, cols=len(causals), shared_yaxes=True,
                        subplot_titles=[f"{_causal_word(c)}: {build} over {baseline}" for c in causals])
    ratio = f"x_vs_{baseline}"
    dims = sorted({int(d) for r in runs.values() for d in r["D"]})
    for i, (label, results) in enumerate(runs.items()):
        for col, causal in enumerate(causals, start=1):
            g = split(results).get((dtypes[label][0], causal))
            if g is None:
                continue
            t = speedup(g, baseline=baseline, builds=[build])
            for d, line in t.groupby("D"):
                line = line.sort_values("N")
                key = f"{label}, D={int(d)}"
                look = palette.style(build, DASHES[i % len(DASHES)])
                look["marker"]["symbol"] = SYMBOLS[dims.index(int(d)) % len(SYMBOLS)]
                fig.add_trace(go.Scatter(x=line["N"], y=line[ratio], mode="lines+markers", name=key, legendgroup=key,
                                         showlegend=col == 1, hovertext=line["B"].map(lambda b: f"B = {b}"), **look),
                              row=1, col=col)
    fig.update_xaxes(type="log", title_text="sequence length N (tokens)",
                     **n_axis({int(n) for r in runs.values() for n in r["N"]}))
    fig.update_yaxes(title_text=f"× faster than {baseline} (ratio of times)", col=1)
    fig.update_layout(title=f"How the batch policy shapes the curve: {build} over {baseline} "
                            f"({', '.join(sorted({d[0] for d in dtypes.values()}))})",
                      template="plotly_white", legend_title_text="run (dash), head dim (marker)")
    return palette.limit_visible(readable_log_axes(fig))
