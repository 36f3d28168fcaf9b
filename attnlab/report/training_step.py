"""The real model's training step, one shape, from the rows of attnlab.model_train.measure: which builds give
transformers' SDPA loss and gradients within the rule, and what each build's step holds and takes.

    figure(rows)              two bar panels, one bar per build that ran, in its palette colour: the step's peak
                              allocation above the weights, and the time per step
    sentences(rows, baseline) what the rows say, computed from them: which builds match SDPA's gradients within the
                              rule (and where those outside it miss most), how much memory each saves against
                              `baseline`, and what the times are (Python's, on a CPU)
    section(rows, baseline)   (figure, Markdown text): the notebook section
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from attnlab import accuracy, model_train as mt
from attnlab.report import palette
from attnlab.report.units import BYTE_TITLE, byte_axis, byte_label

SHAPE = ("model", "B", "N", "dtype")


def one_shape(rows: pd.DataFrame) -> dict:
    """The (model, B, N, dtype) all rows share; ValueError naming the mix, or the missing columns, otherwise."""
    missing = [c for c in mt.COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(f"rows must be attnlab.model_train.measure's; missing columns: {', '.join(missing)}")
    if rows.empty:
        raise ValueError("rows must hold at least one build's row; got none")
    shapes = rows[list(SHAPE)].drop_duplicates()
    if len(shapes) > 1:
        raise ValueError(f"rows must hold one shape (one measure call); got {len(shapes)}: "
                         f"{shapes.to_dict('records')}")
    return shapes.iloc[0].to_dict()


def _ok(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["status"] == "ok"]


def _on_cpu(rows: pd.DataFrame) -> bool:
    return not rows["device"].astype(str).str.startswith("cuda").any()


def figure(rows: pd.DataFrame) -> go.Figure:
    """Peak allocation of one step above the weights (empty on a CPU: no allocator statistics) and the time per step,
    one bar per build whose step ran, grouped at the rows' N in the builds' order, each in its palette colour."""
    shape = one_shape(rows)
    ok = _ok(rows)
    cpu = _on_cpu(rows)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14, subplot_titles=(
        "peak allocation of a step above the weights" + (" (none on a CPU)" if cpu else ""),
        "time per step" + (" (Python's, in Triton's interpreter)" if cpu else "")))
    at = [str(shape["N"])]  # one group of bars, one bar a build, at the rows' sequence length
    for _, r in ok.iterrows():
        b = r["build"]
        look = dict(marker=dict(color=palette.colour(b)), meta={"build": b}, legendgroup=b)
        fig.add_trace(go.Bar(x=at, y=[r["peak_bytes"]], name=b, **look, hovertext=[byte_label(r["peak_bytes"])]),
                      row=1, col=1)
        fig.add_trace(go.Bar(x=at, y=[r["step_ms"]], name=b, showlegend=False, **look,
                             hovertext=[f"{r['step_ms']:.3g} ms over {r['step_reps']:.0f} steps"]), row=1, col=2)
    fig.update_yaxes(**byte_axis(list(ok["peak_bytes"]), log=False), row=1, col=1)
    fig.update_yaxes(title_text=f"peak allocation per step ({BYTE_TITLE})", row=1, col=1)
    fig.update_yaxes(title_text="time per step (ms, " + ("time.perf_counter: Python's" if cpu else "CUDA events")
                     + ")", row=1, col=2)
    fig.update_xaxes(title_text="sequence length N (tokens)", type="category")
    fig.update_layout(title_text=f"One training step of {shape['model']} per build ({shape['dtype']}, "
                                 f"B = {shape['B']}, N = {shape['N']}): forward with loss and backward",
                      barmode="group", legend_title_text="attention")
    return fig


def match_sentence(rows: pd.DataFrame) -> str:
    """Which builds give SDPA's loss and gradients within the rule (attnlab.model_train), which do not and where
    they miss most, and which did not run."""
    shape = one_shape(rows)
    floor = accuracy.FLOOR[getattr(torch, shape["dtype"])]
    compared = _ok(rows)[_ok(rows)["build"] != mt.REFERENCE]
    ran = compared[compared["over_limit"].notna()]
    match, miss = ran[ran["matches"].astype(bool)], ran[~ran["matches"].astype(bool)]
    where = f"transformers' SDPA path ({shape['model']}, B = {shape['B']}, N = {shape['N']}, {shape['dtype']})"
    if ran.empty:
        text = f"No build was compared with {where}."
    else:
        text = (f"Against {where}, {len(match)} of {len(ran)} builds give its loss and every parameter's gradient "
                f"within the rule (each difference at most twice {mt.YARDSTICK}'s, or {floor:g}, whichever is "
                "larger)" + (f": {', '.join(match['build'])}." if len(match) else "."))
    if len(miss):
        text += " Outside it: " + "; ".join(f"{r.build}, whose {r.over_limit_at} differs {r.over_limit:.3g}× its "
                                            "limit" for r in miss.itertuples()) + "."
    failed = rows[rows["status"] != "ok"]
    if len(failed):
        text += " Did not run: " + "; ".join(f"{r.build} ({r.status})" for r in failed.itertuples()) + "."
    unjudged = compared[compared["over_limit"].isna()]
    if len(unjudged):
        text += f" Not compared ({mt.REFERENCE} did not run): {', '.join(unjudged['build'])}."
    return text


def memory_sentence(rows: pd.DataFrame, baseline: str = "materialised") -> str:
    """How much less (or more) each build's step holds at its peak than `baseline`'s (transformers_eager's where
    `baseline` has no measured peak); on a CPU, that no peak is known."""
    ok = _ok(rows)
    ok = ok[ok["peak_bytes"].notna()]
    if ok.empty:
        return ("Peak memory is not known here: a CPU has no allocator statistics, so the memory panel is empty; a "
                "GPU run fills it.")
    base = baseline if baseline in set(ok["build"]) else mt.YARDSTICK
    if base not in set(ok["build"]):
        base = ok["build"].iloc[0]
    peaks = ok.set_index("build")["peak_bytes"]
    top = float(peaks[base])
    parts = []
    for build, peak in peaks.items():
        if build == base:
            continue
        saved = top - float(peak)
        parts.append(f"{build} {'saves' if saved >= 0 else 'holds'} {byte_label(abs(saved))} "
                     f"({abs(saved) / top:.0%} {'less' if saved >= 0 else 'more'})")
    grads = float(ok["grad_bytes"].iloc[0])
    return (f"A step with {base} peaks at {byte_label(top)} above the weights, {byte_label(grads)} of it the "
            "parameters' gradients, which every build allocates"
            + (": against it, " + "; ".join(parts) + "." if parts else "."))


def time_sentence(rows: pd.DataFrame, baseline: str = "materialised") -> str:
    """The step times' source; on a GPU, the fastest build's step beside `baseline`'s."""
    ok = _ok(rows)
    ok = ok[ok["step_ms"].notna()]
    if ok.empty:
        return "No build's step was timed."
    if _on_cpu(rows):
        return ("The step times are time.perf_counter's around Triton's interpreter on a CPU: they measure Python, "
                "not kernels, and rank no build.")
    ms = ok.set_index("build")["step_ms"]
    fastest = ms.idxmin()
    text = f"The fastest step is {fastest}'s, {ms[fastest]:.3g} ms (CUDA events, after a warm-up step)"
    if baseline in ms.index and baseline != fastest:
        text += f"; {baseline}'s takes {ms[baseline]:.3g} ms, {ms[baseline] / ms[fastest]:.2f}× as long"
    return text + "."


def sentences(rows: pd.DataFrame, baseline: str = "materialised") -> list[str]:
    return [match_sentence(rows), memory_sentence(rows, baseline), time_sentence(rows, baseline)]


def section(rows: pd.DataFrame, baseline: str = "materialised") -> tuple[go.Figure, str]:
    """The notebook section: (figure(rows), the sentences as one Markdown paragraph)."""
    return figure(rows), " ".join(sentences(rows, baseline))
