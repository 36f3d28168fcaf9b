"""Training's tables and figures, pure functions of a training sweep's rows (attnlab.train_sweep.read_results: every
pass's rows, with the byte model's columns beside the measured ones) and, for the recompute trade, the run's
measured ceilings.

    gradients(rows)                  per build and pass: rows, how many ran, the worst gradient error over its limit
    speedups(rows, pass_, baseline)  per shape and build: the pass's time (net of the consumption step) and the
                                     baseline's time over it
    speedup_figure(rows, ...)        those speedups against N, a panel per (causal, D), one colour per build
    held(rows)                       per head dim, N and build: what the forward left for the backward, measured,
                                     beside what the build must save (P, or the logsumexp)
    held_figure(rows)                held bytes against N, a panel per head dim, with the two lines of the model
    recompute(rows, ceilings)        per shape: fused's extra FLOPs at the matmul rate against the bytes of P it never
                                     moves at the copy bandwidth, both in ms, beside the backward times measured
    recompute_figure(table)          those two times against N, a panel per causal value, one dash per head dim

A training run holds one dtype (its params'): a frame of several is refused, as every table of attnlab.report
refuses one.
"""
from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnlab import cost
from attnlab.measure import Case
from attnlab.report import palette
from attnlab.report.figures import panels
from attnlab.report.units import BYTE_TITLE, byte_axis, byte_label, n_axis, readable_log_axes
from attnlab.schema import less_consumption

FORWARD_BACKWARD = "forward+backward"
BACKWARD_PASSES = ("backward", FORWARD_BACKWARD)
BASELINE = "materialised"
SHAPE = ["dtype", "causal", "D", "N", "B", "H", "Hkv"]
DASHES = ("solid", "dash", "dot", "dashdot")


def _causal_word(causal: bool) -> str:
    return "causal" if causal else "non-causal"


def one_dtype(rows: pd.DataFrame) -> str:
    """The rows' one dtype; ValueError where they hold several (a ratio never mixes dtypes) or none."""
    dtypes = sorted(rows["dtype"].astype(str).unique())
    if len(dtypes) != 1:
        raise ValueError(f"training rows must hold one dtype, got {dtypes or 'none'}")
    return dtypes[0]


def ok(rows: pd.DataFrame, pass_: str) -> pd.DataFrame:
    """The ok rows of one pass."""
    return rows[(rows["status"] == "ok") & (rows["pass"] == pass_)]


def out_of_memory(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows whose case ran out of memory."""
    return rows[rows["status"].astype(str).str.startswith("oom")]


# -- correctness --------------------------------------------------------------------------------------------------

def gradients(rows: pd.DataFrame) -> pd.DataFrame:
    """Per build and pass (in the order measured): rows, ok, not run (unsupported, out of memory, error), the worst
    err / err_limit over the ok rows (a gradient's nearest its limit on a backward pass, O's on a forward), and
    'pass' when every ok row is within its limit, 'FAIL' when one is not, 'not run' when none ran."""
    out = []
    for (build, pass_), g in rows.groupby(["build", "pass"], sort=False):
        good = g[g["status"] == "ok"]
        worst = (good["err"] / good["err_limit"]).max() if len(good) else math.nan
        verdict = "not run" if good.empty else "FAIL" if worst > 1 else "pass"
        out.append(dict(build=build, **{"pass": pass_}, rows=len(g), ok=len(good), not_run=len(g) - len(good),
                        worst_err_over_limit=worst, verdict=verdict,
                        why_not_run="; ".join(dict.fromkeys(g.loc[g["status"] != "ok", "status"].astype(str)))))
    return pd.DataFrame(out, columns=["build", "pass", "rows", "ok", "not_run", "worst_err_over_limit", "verdict",
                                      "why_not_run"])


# -- speed --------------------------------------------------------------------------------------------------------

def speedups(rows: pd.DataFrame, pass_: str = FORWARD_BACKWARD, baseline: str = BASELINE) -> pd.DataFrame:
    """Per shape and build (ok rows of `pass_`): ms net of the consumption step (schema.less_consumption, as every
    ratio of the lab), and `speedup`, the baseline's ms at that shape over the build's (NaN where the baseline did
    not run there: out of memory, say)."""
    one_dtype(rows)
    good = ok(rows, pass_).copy()
    good["ms"] = [less_consumption(m, c) for m, c in zip(good["ms"], good["consume_ms"])]
    base = good[good["build"] == baseline].set_index(SHAPE)["ms"].rename("baseline_ms")
    t = good[[*SHAPE, "build", "ms"]].join(base, on=SHAPE)
    t["speedup"] = t["baseline_ms"] / t["ms"]
    return t.reset_index(drop=True)


def _grid(rows: pd.DataFrame, title: str):
    """Subplots: a row per causal value, a column per head dim, each titled."""
    causals = sorted(rows["causal"].astype(bool).unique())
    dims = sorted(rows["D"].unique())
    fig = make_subplots(rows=len(causals), cols=len(dims), shared_xaxes=True, shared_yaxes=True,
                        subplot_titles=[f"D = {d}, {_causal_word(c)}" for c in causals for d in dims],
                        vertical_spacing=0.12, horizontal_spacing=0.06)
    fig.update_layout(title=title, template="plotly_white", legend_title_text="build",
                      height=280 + 260 * len(causals))
    fig.update_xaxes(type="log", **n_axis(rows["N"]))
    fig.update_xaxes(title_text="sequence length N (tokens)", row=len(causals))
    return fig, causals, dims


def speedup_figure(rows: pd.DataFrame, pass_: str = FORWARD_BACKWARD, baseline: str = BASELINE) -> go.Figure:
    """Each build's speedup over `baseline` in `pass_` against N (speedups), a panel per (causal, D): ours bold, the
    libraries thin, one colour per build (attnlab.report.palette). A build's line stops where the baseline did not
    run."""
    t = speedups(rows, pass_, baseline)
    t = t[t["build"] != baseline]
    if t["speedup"].notna().sum() == 0:
        raise ValueError(f"no shape has an ok {pass_} row of both {baseline} and another build")
    fig, causals, dims = _grid(t, f"{pass_}: speedup over {baseline} ({one_dtype(rows)}; times net of the "
                                  "consumption step)")
    order = palette.ours_first(t["build"])
    for r, causal in enumerate(causals, start=1):
        for c, d in enumerate(dims, start=1):
            part = t[(t["causal"].astype(bool) == causal) & (t["D"] == d)]
            for build in order:
                line = part[(part["build"] == build) & part["speedup"].notna()].sort_values("N")
                if len(line):
                    fig.add_trace(go.Scatter(x=line["N"], y=line["speedup"], mode="lines+markers", name=build,
                                             legendgroup=build, showlegend=(r, c) == (1, 1), **palette.style(build)),
                                  row=r, col=c)
    fig.add_hline(y=1, line=dict(color=palette.QUANTITY_COLOURS["ceiling"], width=1, dash="dot"))
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text=f"× faster than {baseline}", col=1)
    return palette.limit_visible(readable_log_axes(fig))


# -- memory -------------------------------------------------------------------------------------------------------

def held(rows: pd.DataFrame) -> pd.DataFrame:
    """Per head dim, N and build, from the backward passes' rows of one causal value (non-causal where measured:
    what a build saves does not depend on the mask): held_bytes measured (the largest over the passes), saved_bytes
    the model's, their ratio, and `status`, 'ok' or why no row of the build ran there (out of memory, say)."""
    one_dtype(rows)
    back = rows[rows["pass"].isin(BACKWARD_PASSES)]
    if back.empty:
        return pd.DataFrame(columns=["D", "N", "B", "H", "build", "held_bytes", "saved_bytes", "held_over_saved",
                                     "status"])
    causal = bool(back["causal"].astype(bool).min())
    back = back[back["causal"].astype(bool) == causal]
    out = []
    for (d, n, b, h, build), g in back.groupby(["D", "N", "B", "H", "build"], sort=False):
        good = g[g["status"] == "ok"]
        value = good["held_bytes"].max() if len(good) else math.nan
        saved = int(g["saved_bytes"].iloc[0])
        out.append(dict(D=d, N=n, B=b, H=h, build=build, held_bytes=value, saved_bytes=saved,
                        held_over_saved=value / saved if saved else math.nan,
                        status="ok" if len(good) else str(g["status"].iloc[0])))
    t = pd.DataFrame(out).sort_values(["D", "N"], kind="stable").reset_index(drop=True)
    t.attrs["causal"] = causal
    return t


def model_lines(t: pd.DataFrame, dtype: str) -> pd.DataFrame:
    """Per head dim and N of `t` (held's table): P's bytes (B·H·N² elements of the dtype) and the logsumexp's
    (B·H·N float32), what a P-keeping and a recomputing build must save."""
    shapes = t[["D", "N", "B", "H"]].drop_duplicates()
    p_bytes = [cost.saved_bytes(Case("materialised", int(r.B), int(r.H), int(r.H), int(r.N), int(r.D), dtype))
               for r in shapes.itertuples()]
    lse = [cost.saved_bytes(Case("fused", int(r.B), int(r.H), int(r.H), int(r.N), int(r.D), dtype))
           for r in shapes.itertuples()]
    return shapes.assign(P=p_bytes, logsumexp=lse).reset_index(drop=True)


MODEL_STYLE = {"P": dict(color=palette.QUANTITY_COLOURS["predicted"], dash="dash", width=2),
               "logsumexp": dict(color=palette.QUANTITY_COLOURS["predicted_with_qk"], dash="dot", width=2)}
MODEL_NAMES = {"P": "model: P, B·H·N² elements", "logsumexp": "model: logsumexp, B·H·N float32"}


def held_figure(rows: pd.DataFrame) -> go.Figure:
    """Held bytes against N (held), a panel per head dim: each build's measured bytes (solid, its colour; ours
    bold) and the model's two lines (dashed P, dotted logsumexp). A build at its line saves what its algorithm
    needs; above it, more; a line that stops is where the build ran out of memory."""
    t = held(rows)
    dtype = one_dtype(rows)
    good = t[t["held_bytes"].notna()]
    if good.empty:
        raise ValueError("no backward row holds a measured held_bytes to draw")
    dims = sorted(t["D"].unique())
    fig = panels(dims, f"Memory held from forward to backward ({dtype}, {_causal_word(t.attrs['causal'])}): "
                       "measured, and what the model says each build must keep", t["N"])
    fig.update_layout(height=460)
    model = model_lines(t, dtype)
    order = palette.ours_first(good["build"])
    for col, d in enumerate(dims, start=1):
        part = good[good["D"] == d]
        for build in order:
            line = part[part["build"] == build].sort_values("N")
            if len(line):
                fig.add_trace(go.Scatter(x=line["N"], y=line["held_bytes"], mode="lines+markers", name=build,
                                         legendgroup=build, showlegend=col == 1, **palette.style(build),
                                         hovertext=[f"held {byte_label(h)}, must save {byte_label(s)}"
                                                    for h, s in zip(line["held_bytes"], line["saved_bytes"])]),
                              row=1, col=col)
        m = model[model["D"] == d].sort_values("N")
        for what in ("P", "logsumexp"):
            fig.add_trace(go.Scatter(x=m["N"], y=m[what], mode="lines", name=MODEL_NAMES[what], legendgroup=what,
                                     showlegend=col == 1, line=MODEL_STYLE[what]), row=1, col=col)
    fig.update_yaxes(**byte_axis([*good["held_bytes"], *model["P"], *model["logsumexp"]]))
    fig.update_yaxes(title_text=f"held for the backward ({BYTE_TITLE})", col=1)
    return palette.limit_visible(readable_log_axes(fig))


# -- the recompute trade ------------------------------------------------------------------------------------------

def recompute(rows: pd.DataFrame, ceilings: dict) -> pd.DataFrame:
    """Per shape of the rows (causal, D, N, in order): fused's recompute_flops (one QKᵀ pass, attnlab.cost) at the
    measured matmul rate, recompute_ms; the bytes of P a P-keeping build stores once and reads twice (cost.kept_p_bytes)
    at the measured copy bandwidth, p_ms; p_over_recompute = p_ms / recompute_ms; and the backward pass's measured
    ms of fused, qk_softmax and materialised where their rows are ok (NaN where not)."""
    dtype = one_dtype(rows)
    tflops, tbps = float(ceilings["tflops"]), float(ceilings["tbps"])
    back = ok(rows, "backward")
    out = []
    for (causal, d, n, b, h, hkv), _ in rows.groupby(["causal", "D", "N", "B", "H", "Hkv"], sort=True):
        shape = dict(B=int(b), H=int(h), Hkv=int(hkv), N=int(n), D=int(d), dtype=dtype, causal=bool(causal))
        flops = cost.recompute_flops(Case("fused", **shape))
        moved = cost.kept_p_bytes(Case("qk_softmax", **shape))
        row = dict(causal=bool(causal), D=int(d), N=int(n), recompute_flops=flops,
                   recompute_ms=cost.ms_at(flops, tflops), p_bytes=moved, p_ms=cost.ms_at(moved, tbps))
        row["p_over_recompute"] = row["p_ms"] / row["recompute_ms"]
        here = back[(back["causal"].astype(bool) == bool(causal)) & (back["D"] == d) & (back["N"] == n)]
        for build in ("fused", "qk_softmax", "materialised"):
            ms = here.loc[here["build"] == build, "ms"]
            row[f"{build}_backward_ms"] = float(ms.iloc[0]) if len(ms) else math.nan
        out.append(row)
    return pd.DataFrame(out)


def recompute_figure(table: pd.DataFrame, label: str = "") -> go.Figure:
    """recompute_ms (fused's colour) and p_ms (qk_softmax's: the build that keeps P) against N, a panel per causal
    value, one dash per head dim: two lines that never meet say the trade is the same at every N."""
    causals = sorted(table["causal"].unique())
    dims = sorted(table["D"].unique())
    fig = make_subplots(rows=1, cols=len(causals), subplot_titles=[_causal_word(c) for c in causals],
                        shared_yaxes=True)
    fig.update_layout(title="The recompute trade: fused's extra FLOPs at the matmul rate against P's bytes at the "
                            f"copy bandwidth{' (' + label + ')' if label else ''}", template="plotly_white",
                      height=440)
    fig.update_xaxes(type="log", title_text="sequence length N (tokens)", **n_axis(table["N"]))
    series = (("recompute_ms", "fused", "recompute S (extra FLOPs)"), ("p_ms", "qk_softmax", "store P, read it twice"))
    for col, causal in enumerate(causals, start=1):
        for i, d in enumerate(dims):
            part = table[(table["causal"] == causal) & (table["D"] == d)].sort_values("N")
            for column, build, words in series:
                look = palette.style(build, DASHES[i % len(DASHES)])
                fig.add_trace(go.Scatter(x=part["N"], y=part[column], mode="lines+markers", name=f"{words}, D = {d}",
                                         legendgroup=f"{column}{d}", showlegend=col == 1, **look),
                              row=1, col=col)
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text="time at the card's ceiling (ms)", col=1)
    return readable_log_axes(fig)
