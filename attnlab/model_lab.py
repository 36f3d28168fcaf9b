"""What notebooks/model_forward.ipynb calls: our builds as a transformers model's attention, the whole forward
measured per build, and the gap between the attention's speedup and the forward's explained by Amdahl's law.

    p = params(**cell); run = begin(p)   the parameters cell validated (attnlab.model_sweep), the run folder made
    sweep_run(run)                       the grid measured into it (resumable), run.results replaced by every row
    lessons(run)                         the rows the speed sections read, resolved from the run when called: its
                                         own rows measured on a CUDA device (every part of a resumed run), else the
                                         newest committed GPU model run's (find_runs), else None
    source_note(run), speed(run), shares(run), speedups(run), memory(run), check_yourself(run)
                                         the sections: each resolves lessons(run) when it runs, so no cell reads rows
                                         that a later cell replaces
    amdahl(f, s)                         1 / ((1 − f) + f / s): the forward's speedup when a share f of its time
                                         runs s times faster
    amdahl_table(results)                per model and shape: f, the attention's speedup alone and in the model, the
                                         forward's speedup measured and predicted
    launch_floor(results)                where one layer's attention alone stays flat while its FLOPs grow: the
                                         host's time to issue the call, not the kernel's work
    share_steps(results), share_note     how f moves from one N to the next, and where it falls what the rows show

    python -m attnlab.model_lab --params params/model/h200.yaml [--out DIR] [--timeout S]

renders the notebook with papermill into a run folder (default a new outputs/<device>/<time>/) with its HTML. On a
CPU our kernels run in Triton's interpreter: that run proves the logits match transformers' SDPA path (padding
included), and its times measure Python, so they are never shown as speed.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import yaml

from attnlab import builds, hf_attention, lab, cost as bd, model_forward as mf, model_sweep, render, runs, sweep
from attnlab.args import Parser, existing_file, out_dir as out_dir_arg, positive_float
from attnlab.lab import Question, notebook, readable_bytes, relative_path
from attnlab.lab import setup as lab_setup
from attnlab.lab.run import open_folder
from attnlab.lab.source import committed_source_note
from attnlab.report import palette
from attnlab.runs import outputs_root

NOTEBOOK = render.NOTEBOOKS / "model_forward.ipynb"
KEYS = ("name", "device", "dtype", "models", "seq_lens", "batches", "max_tokens", "builds", "baseline", "windows",
        "reps_ms", "min_reps", "seed", "compile_modes", "compile_builds")
MAKE_ONE = ("STEPS=model bash scripts/device.sh on a GPU machine (or `python -m attnlab.model_lab --params "
            "params/model/h200.yaml`), then commit its folder under outputs/<gpu>/")


# -- the run ------------------------------------------------------------------------------------------------------

def setup() -> dict:
    """attnlab.lab.setup (figures that survive an HTML export, wide tables, which python runs this kernel), and
    whether transformers is here."""
    info = lab_setup()
    if hf_attention.available():
        import transformers

        info["transformers"] = transformers.__version__
    else:
        info["transformers"] = f"not installed: the model runs need it ({hf_attention.INSTALL})"
    return info


def params(**cell) -> dict:
    """The parameters cell as validated params (attnlab.model_sweep.validate); None means 'not given'."""
    unknown = sorted(set(cell) - set(KEYS) - {"out_dir"})
    if unknown:
        raise sweep.ParamsError(unknown[0], cell[unknown[0]], f"is not a params key; known: {', '.join(KEYS)}, "
                                                               "out_dir")
    return model_sweep.validate({k: v for k, v in cell.items() if v is not None})


Run = lab.Run  # a run's folder and what is in it (its gate stays empty: a model run has none)


def begin(p: dict) -> Run:
    """The device resolved, the run folder made (or out_dir reopened) with its model_params.yaml, its rows read."""
    out, device, p = open_folder(p, model_sweep.PARAMS)
    return _read(Run(out, p, device, {}))


def _read(run: Run) -> Run:
    prov = run.out / model_sweep.PROVENANCE
    if prov.exists():
        run.provenance = json.loads(prov.read_text())
    if (run.out / model_sweep.RESULTS).exists():
        run.results = model_sweep.read_results(run.out)
    return run


def sweep_run(run: Run, progress: bool = True):
    """Measure the run's grid into its folder (resumable); without transformers, a note saying how to get it."""
    from IPython.display import Markdown

    if not hf_attention.available():
        return Markdown(f"**transformers is not installed in this kernel's environment**, so no model runs here. "
                        f"Install the lab's `model` extra: `{hf_attention.INSTALL}`, then run this notebook again. "
                        "The sections below read a committed GPU run where there is one.")
    model_sweep.run(run.params, run.out, progress=progress, bar=notebook.progress_bar("model forwards"))
    _read(run)
    ok = int((run.results["status"] == "ok").sum())
    return Markdown(f"{len(run.results)} rows ({ok} ok) in `{relative_path(run.out / model_sweep.RESULTS)}`, provenance "
                    f"in `{model_sweep.PROVENANCE}` beside it.")


def load(folder) -> Run:
    """A model run's folder as model_sweep writes it."""
    out = Path(folder)
    prov = out / model_sweep.PROVENANCE
    if not prov.exists():
        raise ValueError(f"{out} holds no {model_sweep.PROVENANCE}: give a model run's output folder")
    data = json.loads(prov.read_text())
    run = Run(out, data.get("params", {}), str(data.get("device", {}).get("device", "cpu")), data)
    return _read(run)


def find_runs(root=None) -> list[Path]:
    """Every model run folder under `root` (default attnlab.runs.outputs_root()), oldest first by its provenance's
    start time: attnlab.runs.find_runs of the model sweep's provenance file."""
    return runs.find_runs(root, model_sweep.PROVENANCE)


def reference_run(root=None, need=("materialised", "fused")) -> Path | None:
    """The newest model run whose rows were measured on a CUDA device (their `device` column) with ok rows of every
    build in `need` and of copy_v."""
    for folder in reversed(find_runs(root)):
        rows = lab.gpu_rows(load(folder).results)
        if not rows.empty and {*need, mf.ABLATED} <= set(rows.loc[rows["status"] == "ok", "build"]):
            return folder
    return None


@dataclass
class Lessons(lab.Lessons):
    """The GPU rows the speed sections read, where they come from (attnlab.lab.Lessons: its label), and the build
    the speedups are over."""

    baseline: str = "materialised"


def _device_name(rows: pd.DataFrame, fallback: str) -> str:
    """The device the rows name (their most common device_name), else `fallback`."""
    names = rows["device_name"].dropna().astype(str)
    names = names[names != ""]
    return str(names.mode().iloc[0]) if len(names) else fallback


def lessons(run: Run | Lessons | None, root=None) -> Lessons | None:
    """The rows the speed sections read, resolved from `run` as it is when called (each section calls this, so no
    cell reads rows an earlier cell captured before the sweep replaced them): this run's rows measured on a CUDA
    device (the rows' `device` column), when they hold an ok row of one of our builds (a resumed run: the rows of
    every part); else the newest committed GPU model run's (reference_run under `root`); else None. A Lessons is
    returned as it is."""
    if run is None or isinstance(run, Lessons):
        return run
    base = run.params.get("baseline", "materialised")
    mine = lab.gpu_rows(run.results)
    if not mine.empty and ((mine["status"] == "ok") & mine["build"].isin(builds.OURS)).any():
        return Lessons(mine, run.out, _device_name(mine, run.device_name), True, run.provenance, base)
    folder = reference_run(root, need=(base, "fused"))
    if folder is None:
        return None
    ref = load(folder)
    rows = lab.gpu_rows(ref.results)
    return Lessons(rows, folder, _device_name(rows, ref.device_name), False, ref.provenance,
                   ref.params.get("baseline", base))


def source_note(run: Run, les: Lessons | None = None):
    """Where the speed sections' numbers come from, and why (`les`: lessons(run) unless given)."""
    return committed_source_note(les or lessons(run), run.gpu, kind="model", make_one=MAKE_ONE,
                                 lacking="ok GPU row", head="From a committed GPU run, not from this machine",
                                 tail=", so the speed and memory sections read that run's rows")


# -- the models and correctness -----------------------------------------------------------------------------------

def models_table(results: pd.DataFrame) -> pd.DataFrame:
    """One line per model config: its shape, parameters, and the shapes it was run at."""
    cols = ["model", "model_type", "layers", "hidden", "H", "Hkv", "D", "intermediate", "vocab", "params", "dtype"]
    t = results.groupby("model", sort=False).agg(
        **{c: (c, "first") for c in cols[1:]},
        shapes=("case_id", lambda s: ", ".join(dict.fromkeys(
            f"B={b}·N={n}" for b, n in zip(results.loc[s.index, "B"], results.loc[s.index, "N"])))))
    t["params"] = t["params"].map(lambda n: f"{n / 1e6:.3g} M")
    t.insert(5, "GQA group", t["H"] // t["Hkv"])
    return t.reset_index()


def correctness(results: pd.DataFrame) -> pd.DataFrame:
    """Per model and build, over every shape: the worst logits difference from transformers' SDPA path, plain and
    with a padding mask, beside transformers' own eager attention's (the difference two correct paths show in this
    dtype), and the status. copy_v is left out: it computes no attention."""
    r = results[results["build"] != mf.ABLATED]
    rows = []
    for (model, build), g in r.groupby(["model", "build"], sort=False):
        ok = g[g["status"] == "ok"]
        eager = results[(results["model"] == model) & (results["build"] == "transformers_eager")]
        rows.append(dict(
            model=model, build=build, shapes=len(g), ok=len(ok),
            logits_maxdiff=ok["logits_maxdiff"].max(), padded_maxdiff=ok["padded_maxdiff"].max(skipna=False),
            eager_maxdiff=eager["logits_maxdiff"].max(),
            note="; ".join(n for n in dict.fromkeys([*g.loc[g["status"] != "ok", "status"], *ok["err_note"]]) if n)))
    t = pd.DataFrame(rows)
    t["over_eager"] = t["logits_maxdiff"] / t["eager_maxdiff"]
    return t


def nan_padded(results: pd.DataFrame) -> list[str]:
    """The builds whose padded logits hold NaN: a fully masked row (a padded query) gives NaN in plain softmax code,
    and the NaN spreads through V to every later token."""
    r = results[(results["status"] == "ok") & results["padded_maxdiff"].isna() & (results["err_note"] == "")
                & ~results["build"].isin([mf.REFERENCE, mf.ABLATED])]
    return list(dict.fromkeys(r["build"]))


# -- Amdahl -------------------------------------------------------------------------------------------------------

def amdahl(f: float, s: float) -> float:
    """The whole's speedup when a share f (0..1) of its time runs s (> 0) times faster: 1 / ((1 − f) + f / s)."""
    if not 0 <= f <= 1:
        raise ValueError(f"f (the share of time sped up) must be between 0 and 1, got {f!r}")
    if not s > 0:
        raise ValueError(f"s (the speedup of that share) must be > 0, got {s!r}")
    return 1.0 / ((1.0 - f) + f / s)


def _forward(results: pd.DataFrame, build: str) -> pd.DataFrame:
    ok = results[(results["build"] == build) & (results["status"] == "ok")]
    return ok.set_index(["model", "B", "N"])[["forward_ms", "attention_ms", "layers"]]


def amdahl_table(results: pd.DataFrame, build: str = "fused", baseline: str = "materialised") -> pd.DataFrame:
    """Per model and shape, `build` against `baseline` in the same model:

        share            f = (baseline's forward − copy_v's forward) / baseline's forward: attention's share of the
                         baseline's forward, by ablation
        share_alone      layers × baseline's attention alone / its forward: the same share from the attention timed
                         outside the model
        attn_speedup     s = baseline's attention alone / build's: the speedup a kernel benchmark reports
        attn_speedup_in_model   (baseline − copy_v) / (build − copy_v): the attention's speedup inside the forward
        predicted        amdahl(f, s): what the forward should gain
        measured         baseline's forward / build's
        ceiling          1 / (1 − f): what an infinitely fast attention would give
    """
    b, x, c = _forward(results, baseline), _forward(results, build), _forward(results, mf.ABLATED)
    both = dict(left_index=True, right_index=True, how="inner")
    t = b.merge(x, suffixes=("", "_build"), **both).merge(c.add_suffix("_copy_v"), **both)
    if t.empty:
        return pd.DataFrame(columns=["model", "B", "N", "share", "share_alone", "attn_speedup",
                                     "attn_speedup_in_model", "predicted", "measured", "ceiling"])
    out = pd.DataFrame(index=t.index)
    out["baseline_ms"], out["build_ms"], out["copy_v_ms"] = t["forward_ms"], t["forward_ms_build"], t[
        "forward_ms_copy_v"]
    out["share"] = ((t["forward_ms"] - t["forward_ms_copy_v"]) / t["forward_ms"]).clip(0, 1)
    out["share_alone"] = t["layers"] * t["attention_ms"] / t["forward_ms"]
    out["attn_speedup"] = t["attention_ms"] / t["attention_ms_build"]
    out["attn_speedup_in_model"] = (t["forward_ms"] - t["forward_ms_copy_v"]) / (
        t["forward_ms_build"] - t["forward_ms_copy_v"])
    out["predicted"] = [amdahl(f, s) for f, s in zip(out["share"], out["attn_speedup"])]
    out["measured"] = t["forward_ms"] / t["forward_ms_build"]
    out["ceiling"] = 1 / (1 - out["share"])
    out.attrs.update(build=build, baseline=baseline)
    return out.reset_index()


def amdahl_curves(shares=(0.1, 0.25, 0.5, 0.75, 0.9), s_max: float = 20.0):
    """The law itself, before any data: the whole forward's speedup against the attention's, one line per share f.
    Each line flattens toward 1 / (1 − f) however fast the attention gets."""
    import numpy as np
    import plotly.graph_objects as go

    s = np.geomspace(1, s_max, 60)
    fig = go.Figure()
    for i, f in enumerate(shares):
        fig.add_scatter(x=s, y=[amdahl(f, v) for v in s], mode="lines", name=f"f = {f:g} (ceiling {1 / (1 - f):.3g}×)",
                        line=dict(color=palette.series_colour(i)))
    fig.update_layout(title="Amdahl's law: speedup of the whole = 1 / ((1 − f) + f / s)",
                      xaxis_title="attention's speedup s (×)", yaxis_title="whole forward's speedup (×)",
                      xaxis_type="log", height=420)
    return fig


def speedup_figure(table: pd.DataFrame, label: str = ""):
    """Per model: the attention's speedup alone, the forward's speedup measured, and Amdahl's prediction, against
    tokens per forward (B·N), one marker per batch."""
    from plotly.subplots import make_subplots

    models = list(dict.fromkeys(table["model"]))
    fig = make_subplots(rows=1, cols=len(models), subplot_titles=models, shared_yaxes=True)
    series = (("attn_speedup", "attention alone (s)", "dot"), ("predicted", "forward, Amdahl's prediction", "dash"),
              ("measured", "forward, measured", "solid"), ("ceiling", "ceiling 1/(1−f)", "longdashdot"))
    colours = dict(zip([s[0] for s in series], (*(palette.series_colour(i) for i in range(3)),
                                                 palette.QUANTITY_COLOURS["ceiling"])))
    symbols = dict(zip(sorted(table["B"].unique()), ("circle", "square", "diamond", "cross")))
    for i, model in enumerate(models):
        for B, g in table[table["model"] == model].groupby("B"):
            g = g.sort_values("N")
            for col, name, dash in series:
                fig.add_scatter(x=g["B"] * g["N"], y=g[col], mode="lines+markers", row=1, col=i + 1,
                                name=f"{name}, B = {B}", legendgroup=f"{col}{B}", showlegend=i == 0,
                                line=dict(color=colours[col], dash=dash), marker=dict(symbol=symbols.get(B, "circle")),
                                hovertext=[f"B = {B}, N = {n}" for n in g["N"]])
        fig.update_xaxes(type="log", title_text="tokens per forward, B·N (tokens)", row=1, col=i + 1)
    fig.update_yaxes(title_text=f"speedup of {table.attrs.get('build', 'fused')} over "
                                f"{table.attrs.get('baseline', 'materialised')} (×)", row=1, col=1)
    fig.update_layout(title=f"The attention's speedup and the whole forward's{' (' + label + ')' if label else ''}",
                      height=460)
    return fig


def share_figure(table: pd.DataFrame):
    """Attention's share f of the baseline's forward against N, one line per model and batch, by ablation and from
    the attention timed alone."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, ((model, B), g) in enumerate(table.groupby(["model", "B"], sort=False)):
        g = g.sort_values("N")
        fig.add_scatter(x=g["N"], y=g["share"], mode="lines+markers", name=f"{model}, B = {B}: by ablation",
                        line=dict(color=palette.series_colour(i)))
        fig.add_scatter(x=g["N"], y=g["share_alone"], mode="markers", marker_symbol="x",
                        marker=dict(color=palette.series_colour(i)), name=f"{model}, B = {B}: layers × attention alone")
    fig.update_layout(title=f"Attention's share f of {table.attrs.get('baseline', 'the baseline')}'s forward",
                      xaxis_title="sequence length N (tokens)",
                      yaxis_title="attention's share f (fraction)", xaxis_type="log", yaxis_range=[0, 1],
                      height=420)
    return fig


def forward_table(results: pd.DataFrame, column: str = "forward_ms") -> pd.DataFrame:
    """`column` per model and shape (rows) and build (columns), in the order the builds were measured."""
    ok = results[results["status"] == "ok"]
    t = ok.pivot_table(index=["model", "B", "N"], columns="build", values=column, aggfunc="first")
    return t[[b for b in dict.fromkeys(results["build"]) if b in t.columns]]


def memory_table(results: pd.DataFrame) -> pd.DataFrame:
    """Peak allocation of one forward above the weights, per model, shape and build, readable."""
    return forward_table(results, "peak_bytes").map(readable_bytes)


def _note(text: str):
    from IPython.display import Markdown

    return Markdown(text)


def _no_gpu_rows() -> list:
    return [_note(f"*Nothing to show: no GPU model rows (this run has none, and no committed GPU model run was found "
                  f"under `{relative_path(outputs_root())}`). To make one: {MAKE_ONE}.*")]


# -- what the rows say about the host and the share ----------------------------------------------------------------

FLAT = 0.20  # attention alone changing by less than this share (max / min − 1) over a stretch of N is flat there
FLOPS_GROWTH = 4.0  # ... while its FLOPs grow at least this many times: the launch floor
HOST_OVER_ALONE = 1.5  # the attention costing this many times its time alone inside the forward: not its work alone
SUBLINEAR = 0.8  # copy_v's forward growing by less than this share of its tokens' growth: a cost per call shows
SAME_FORWARD = 0.02  # two forwards within this share of each other are the same time


def attention_flops(r) -> int:
    """One layer's attention FLOPs at a row's shape, causal as attnlab.model_forward.attention_alone times it
    (attnlab.cost.flops: 4·B·H·N²·D, halved)."""
    return bd.flops(SimpleNamespace(B=int(r["B"]), H=int(r["H"]), N=int(r["N"]), D=int(r["D"]), causal=True))


def launch_floor(results: pd.DataFrame) -> pd.DataFrame:
    """Per model, batch and build (copy_v aside: it computes no attention), each longest stretch of consecutive N
    over which one layer's attention timed alone changes by less than FLAT while its FLOPs grow FLOPS_GROWTH times
    or more. A time that stays put while the work grows that much is not the work's: it is what the host takes to
    issue an eager call, the floor under every build's time."""
    cols = ["model", "B", "build", "first_N", "last_N", "low_ms", "high_ms", "flops_growth"]
    ok = results[(results["status"] == "ok") & (results["build"] != mf.ABLATED) & (results["attention_ms"] > 0)]
    rows = []
    for (model, B, build), g in ok.groupby(["model", "B", "build"], sort=False):
        g = g.sort_values("N").reset_index(drop=True)
        ms, flops, ns = list(g["attention_ms"]), [attention_flops(r) for _, r in g.iterrows()], list(g["N"])
        i = 0
        while i < len(g) - 1:
            j = i
            while j + 1 < len(g) and max(ms[i:j + 2]) / min(ms[i:j + 2]) - 1 < FLAT:
                j += 1
            if j > i and flops[j] / flops[i] >= FLOPS_GROWTH:
                rows.append(dict(model=model, B=int(B), build=build, first_N=int(ns[i]), last_N=int(ns[j]),
                                 low_ms=min(ms[i:j + 1]), high_ms=max(ms[i:j + 1]), flops_growth=flops[j] / flops[i]))
                i = j + 1
            else:
                i += 1
    return pd.DataFrame(rows, columns=cols)


def _at_floor(floor: pd.DataFrame, model, B, build, N) -> bool:
    f = floor[(floor["model"] == model) & (floor["B"] == B) & (floor["build"] == build)]
    return bool(((f["first_N"] <= N) & (N <= f["last_N"])).any())


def floor_note(results: pd.DataFrame) -> str:
    """Where a build's attention alone is the host's launch time (launch_floor), said beside the numbers."""
    floor = launch_floor(results)
    if floor.empty:
        return (f"*No build's attention alone stays within {FLAT:.0%} over a {FLOPS_GROWTH:g}× growth of its FLOPs "
                "here: none of these times is flat in N, the mark of the host's launch time.*")
    parts = [f"{r.build}'s stays between {r.low_ms:.3g} and {r.high_ms:.3g} ms from N = {r.first_N} to N = "
             f"{r.last_N} ({r.model}, B = {r.B}) while its FLOPs grow {r.flops_growth:.0f}×"
             for r in floor.itertuples()]
    return ("**The launch floor.** One layer's attention alone: " + "; ".join(parts) + ". A time that stays flat "
            "while the work grows that much is the host's time to issue the call (Python, transformers' wrapper, "
            "the launches), not the kernel's work: there a ratio of two builds' times compares their launches, not "
            "their kernels.")


def share_steps(results: pd.DataFrame, build: str = "fused", baseline: str = "materialised") -> pd.DataFrame:
    """Per model and batch, each step from one N to the next: attention's share f of the baseline's forward at both
    ends, and what the rows say at the first end: the attention's time inside the forward per layer
    ((baseline − copy_v) / layers) beside the baseline's attention alone, how much copy_v's forward and the tokens
    grow over the step, how much the baseline's attention alone and its FLOPs grow, and how far apart `build`'s and
    the baseline's forwards are."""
    t = amdahl_table(results, build, baseline)
    base = _forward(results, baseline)
    floor = launch_floor(results)
    heads = results.drop_duplicates(["model"]).set_index("model")[["H", "D"]]
    rows = []
    for (model, B), g in t.groupby(["model", "B"], sort=False):
        g = g.sort_values("N").reset_index(drop=True)
        for a, b in zip(g.itertuples(), g.iloc[1:].itertuples()):
            one, two = base.loc[(model, B, a.N)], base.loc[(model, B, b.N)]
            shape = dict(B=B, H=heads.loc[model, "H"], D=heads.loc[model, "D"])
            rows.append(dict(
                model=model, B=int(B), N=int(a.N), next_N=int(b.N), share=a.share, next_share=b.share,
                in_model_ms=(a.baseline_ms - a.copy_v_ms) / one["layers"], alone_ms=one["attention_ms"],
                copy_v_growth=b.copy_v_ms / a.copy_v_ms, token_growth=b.N / a.N,
                alone_growth=two["attention_ms"] / one["attention_ms"],
                flops_growth=attention_flops({**shape, "N": b.N}) / attention_flops({**shape, "N": a.N}),
                forwards_apart=abs(a.build_ms / a.baseline_ms - 1), attn_speedup=a.attn_speedup,
                floor=_at_floor(floor, model, B, baseline, a.N)))
    return pd.DataFrame(rows)


def _why_falls(s, build: str, baseline: str) -> list[str]:
    """The reasons the rows give for f falling over step `s` (a share_steps row), each computed, none assumed."""
    why = []
    if s.in_model_ms > HOST_OVER_ALONE * s.alone_ms:
        why.append(f"inside the forward {baseline}'s attention costs {s.in_model_ms:.3g} ms a layer at N = {s.N} "
                   f"({baseline}'s forward − copy_v's, per layer), {s.in_model_ms / s.alone_ms:.1f}× its "
                   f"{s.alone_ms:.3g} ms timed alone")
    if s.copy_v_growth < SUBLINEAR * s.token_growth:
        why.append(f"copy_v's forward grows {s.copy_v_growth:.2f}× for {s.token_growth:g}× the tokens")
    if s.forwards_apart < SAME_FORWARD:
        why.append(f"{build}'s forward is within {s.forwards_apart:.1%} of {baseline}'s at N = {s.N}, though "
                   f"{build}'s attention alone is {s.attn_speedup:.2f}× faster")
    if s.floor or s.alone_growth < min(s.copy_v_growth, s.flops_growth / 2):
        why.append(f"{baseline}'s attention alone grows {s.alone_growth:.2f}× while its FLOPs grow "
                   f"{s.flops_growth:.0f}× and copy_v's forward {s.copy_v_growth:.2f}×"
                   + (" (it is at the launch floor there)" if s.floor else ""))
    return why


def _each(why: list) -> str:
    return "Each says" if len(why) > 1 else "This says"


def share_note(results: pd.DataFrame, build: str = "fused", baseline: str = "materialised") -> str:
    """How attention's share f of the baseline's forward moves with N, per model and batch, and where it falls, the
    reasons the rows give (share_steps): only what the numbers show is said."""
    steps = share_steps(results, build, baseline)
    if steps.empty:
        return "*One N per model and batch: nothing to say of how f moves with N.*"
    lines, rose = [], False
    for (model, B), g in steps.groupby(["model", "B"], sort=False):
        path = " → ".join([f"{g['share'].iloc[0]:.2f} (N = {g['N'].iloc[0]})"]
                          + [f"{s.next_share:.2f} (N = {s.next_N})" for s in g.itertuples()])
        line = f"{model}, B = {B}: f = {path}."
        rose = rose or bool((g["next_share"] > g["share"]).any())
        for s in g[g["next_share"] < g["share"]].itertuples():
            why = _why_falls(s, build, baseline)
            line += f" It falls from N = {s.N} to N = {s.next_N}: " + ("; ".join(why) + f". {_each(why)} the "
                    f"forward's time at N = {s.N} is not the GPU's work alone: a cost per call (the host issuing "
                    "kernels) sets part of it, and f there is a share of that cost." if why else
                    "no reason shows in these rows (the attention costing more inside the forward than alone, the "
                    "forward growing slower than its tokens, the two forwards alike, the attention alone growing "
                    "slower than its work: none holds).")
        lines.append(line)
    if rose:
        lines.append("Where f rises it rises as the arithmetic says: attention's FLOPs per token grow with N (each "
                     "query reads every earlier key), while the projections', the MLP's and the output head's per "
                     "token stay the same at any N.")
    return " ".join(lines)


# -- the sections ---------------------------------------------------------------------------------------------------

def models(run: Run) -> list:
    """Section: the model configs this run built."""
    if run.results.empty:
        return [_note("*No model rows in this run (see the sweep's note above).*")]
    return [models_table(run.results)]


def checks(run: Run) -> list:
    """Section: the logits of every build against transformers' SDPA path, plain and padded, with what they mean."""
    if run.results.empty:
        return [_note("*No model rows in this run: nothing checked here.*")]
    out = [correctness(run.results)]
    nans = nan_padded(run.results)
    if nans:
        out.append(_note(f"**NaN under padding:** {', '.join(nans)} give NaN logits once a sequence is left-padded "
                         "(check yourself asks why). Our builds and SDPA give a query with no key to attend to zeros."))
    out.append(interpreter_note(run))
    return out


def speed(run: Run | Lessons | None) -> list:
    """Section: each build's forward time and one layer's attention alone, per model and shape (ms), of
    lessons(run) resolved now, with where the attention alone is the host's launch time."""
    les = lessons(run)
    if les is None:
        return _no_gpu_rows()
    return [lab.rows_line(les), _note("**Forward, ms** (eager, as a user calls `model(...)`):"),
            forward_table(les.results),
            _note("**One layer's attention alone, ms** (the function transformers calls, eagerly):"),
            forward_table(les.results, "attention_ms"), _note(floor_note(les.results))]


def _amdahl_rows(les: Lessons | None, build: str):
    """(amdahl_table of the lesson rows, None) or (None, the notes to show instead)."""
    if les is None:
        return None, _no_gpu_rows()
    t = amdahl_table(les.results, build, les.baseline)
    if t.empty:
        return None, [lab.rows_line(les), _note(f"*No shape has ok rows of {build}, {les.baseline} and copy_v.*")]
    return t, None


def shares(run: Run | Lessons | None, build: str = "fused") -> list:
    """Section: attention's share of the baseline's forward, by ablation and from the attention timed alone, and
    how it moves with N (share_note)."""
    les = lessons(run)
    t, notes = _amdahl_rows(les, build)
    return notes or [lab.rows_line(les), share_figure(t), t[["model", "B", "N", "baseline_ms", "copy_v_ms",
                                                              "share", "share_alone", "ceiling"]],
                     _note(share_note(les.results, build, les.baseline))]


def speedups(run: Run | Lessons | None, build: str = "fused") -> list:
    """Section: the attention's speedup against the forward's, measured and predicted by Amdahl's law."""
    les = lessons(run)
    t, notes = _amdahl_rows(les, build)
    if notes:
        return notes
    out = [lab.rows_line(les), speedup_figure(t, les.label),
           t[["model", "B", "N", "share", "attn_speedup", "attn_speedup_in_model", "predicted", "measured",
              "ceiling"]]]
    if not launch_floor(les.results).empty:
        out.append(_note(floor_note(les.results)))
    return out


def memory(run: Run | Lessons | None) -> list:
    """Section: peak allocation of one forward above the weights, per build."""
    les = lessons(run)
    if les is None:
        return _no_gpu_rows()
    return [lab.rows_line(les), memory_table(les.results)]


# -- as deployed: the forward compiled --------------------------------------------------------------------------

def deployed_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per model, shape and build measured compiled: its forward eagerly and compiled (ms), each over
    transformers_sdpa's forward in the same mode, and the compiled graph's breaks. `rows`: every mode's rows."""
    ok = rows[rows["status"] == "ok"]
    key = ["model", "B", "N"]
    ms = ok.pivot_table(index=[*key, "build"], columns="mode", values="forward_ms", aggfunc="first")
    compiled_modes = [m for m in ms.columns if m != mf.EAGER]
    if not compiled_modes or mf.EAGER not in ms.columns:
        return pd.DataFrame()
    mode = compiled_modes[0]
    sdpa = ms.xs(mf.REFERENCE, level="build")
    t = ms[[mf.EAGER, mode]].dropna().reset_index()
    t = t[t["build"] != mf.REFERENCE]
    t = t.join(sdpa[[mf.EAGER, mode]].rename(columns=lambda c: f"sdpa_{c}"), on=key)
    t["over_sdpa_eager"] = t[mf.EAGER] / t[f"sdpa_{mf.EAGER}"]
    t["over_sdpa_compiled"] = t[mode] / t[f"sdpa_{mode}"]
    breaks = ok[ok["mode"] == mode].set_index([*key, "build"])["graph_breaks"]
    t["graph_breaks"] = [breaks.get(tuple(r)) for r in t[[*key, "build"]].itertuples(index=False)]
    t.attrs["mode"] = mode
    return t.rename(columns={mf.EAGER: "eager_ms", mode: "compiled_ms"})[
        [*key, "build", "eager_ms", "compiled_ms", "over_sdpa_eager", "over_sdpa_compiled", "graph_breaks"]]


def deployed_figure(t: pd.DataFrame):
    """Each build's forward over SDPA's, eager (light) and compiled (solid), per shape: below 1, faster than SDPA."""
    import plotly.graph_objects as go

    shape = [f"{m} B={b} N={n}" for m, b, n in zip(t["model"], t["B"], t["N"])]
    fig = go.Figure()
    for build, g in t.groupby("build", sort=False):
        x = [s for s, b in zip(shape, t["build"]) if b == build]
        fig.add_bar(x=x, y=g["over_sdpa_eager"], name=f"{build}, eager", marker_color=palette.colour(build),
                    opacity=0.35)
        fig.add_bar(x=x, y=g["over_sdpa_compiled"], name=f"{build}, compiled ({t.attrs.get('mode', '')})",
                    marker_color=palette.colour(build))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="SDPA's forward in the same mode")
    fig.update_layout(barmode="group", height=400, title="the whole forward over SDPA's: eager against compiled",
                      yaxis_title="forward time / SDPA's forward time (same mode)")
    return fig


def deployed_note(t: pd.DataFrame) -> str:
    """One sentence per build and shape, read off the table: compiled and eager, each over SDPA's."""
    lines = []
    for r in t.itertuples():
        breaks = "" if pd.isna(r.graph_breaks) else f", {int(r.graph_breaks)} graph break{'s' * (r.graph_breaks != 1)}"
        lines.append(f"- {r.model} B = {r.B}, N = {r.N}: {r.build}'s compiled forward {r.compiled_ms:.2f} ms, "
                     f"{r.over_sdpa_compiled:.2f}× SDPA's compiled; eagerly {r.eager_ms:.2f} ms, "
                     f"{r.over_sdpa_eager:.2f}× SDPA's eager{breaks}.")
    return "\n".join(lines)


def deployed(run: Run | Lessons | None) -> list:
    """Section: the forward as deployed, compiled by torch.compile (params compile_modes), beside the eager one,
    each build over SDPA's in the same mode, from the rows lessons(run) names (their folder's compiled rows)."""
    les = lessons(run)
    if les is None:
        return _no_gpu_rows()
    t = deployed_table(lab.gpu_rows(model_sweep.read_results(les.folder, modes=None)))
    if t.empty:
        return [lab.rows_line(les),
                _note("*These rows hold no compiled forward: the params named no `compile_modes`.*")]
    return [lab.rows_line(les), deployed_figure(t), _note(deployed_note(t))]


def interpreter_note(run: Run):
    """Under the correctness table: where rows were measured off a GPU, that their times measure Python."""
    from IPython.display import Markdown

    if run.results.empty or len(lab.gpu_rows(run.results)) == len(run.results):
        return Markdown("")
    return Markdown("*These rows were measured on a CPU, our Triton kernels in Triton's interpreter: their times "
                    "measure Python, not kernels, and no ratio of them is a speedup. The logits' differences are "
                    "real.*")


# -- check yourself -----------------------------------------------------------------------------------------------

def _shape(r) -> str:
    return f"{r['model']} at B = {int(r['B'])}, N = {int(r['N'])}"


def _memory_question(les: Lessons, build: str) -> Question | None:
    """At the last shape with both peaks: the two peaks, what separates them against the S and P the baseline
    holds, and the build's peak against copy_v's (the forward without attention's work)."""
    peak = forward_table(les.results, "peak_bytes")
    if not {les.baseline, build} <= set(peak.columns):
        return None
    p = peak[[les.baseline, build] + ([mf.ABLATED] if mf.ABLATED in peak.columns else [])].dropna(
        subset=[les.baseline, build])
    if p.empty:
        return None
    (model, B, N), last = p.index[-1], p.iloc[-1]
    answer = f"{readable_bytes(last[les.baseline])} against {readable_bytes(last[build])}."
    r = les.results[(les.results["model"] == model)].iloc[0]
    try:
        held = bd.holds(les.baseline)
    except ValueError:  # transformers' own paths: what they hold is not in the byte model
        held = ""
    size = 0
    if held in ("S+P", "P"):
        tensors = 2 if held == "S+P" else 1
        size = tensors * bd.nn_bytes(int(B), int(r["H"]), int(N), str(r["dtype"]))
        gap = last[les.baseline] - last[build]
        answer += (f" The difference, {readable_bytes(gap)}, is {gap / size:.2f}× one layer's {held.replace('+', ' and ')} "
                   f"({tensors}·B·H·N² elements of {r['dtype']}: {readable_bytes(size)}), which {les.baseline} holds at "
                   "once, one layer at a time.")
    if mf.ABLATED in p.columns and pd.notna(last.get(mf.ABLATED)) and last[mf.ABLATED] > 0:
        extra = last[build] - last[mf.ABLATED]
        small = size > 0 and abs(extra) < 0.05 * size
        answer += (f" {build}'s peak is {last[build] / last[mf.ABLATED]:.2f}× copy_v's (the same forward with the "
                   f"attention replaced by a copy of V): its attention adds {readable_bytes(extra)} to the peak"
                   + (f", next to nothing beside {les.baseline}'s {held.replace('+', ' and ')}." if small else "."))
    return Question(f"At {model}, B = {B}, N = {N}, how much memory does one forward take above the weights with "
                    f"{les.baseline}, and with {build}?", answer, les.label)


def questions(run: Run, les: Lessons | None = None, build: str = "fused") -> list[Question]:
    """Questions on this run's correctness and on the GPU rows' speedups (`les`: lessons(run) unless given), each
    answer computed from the rows."""
    les = les or lessons(run)
    qs = []
    here = f"this run ({relative_path(run.out)})"
    if not run.results.empty:
        t = correctness(run.results)
        ours = t[t["build"].isin(hf_attention.REGISTERED)]
        if len(ours) and ours["logits_maxdiff"].notna().any():
            w = ours.loc[ours["logits_maxdiff"].idxmax()]
            eager = t["eager_maxdiff"].max()
            yardstick = (f"transformers' own eager attention differs from SDPA by up to {eager:.3g} at the same "
                         "inputs. Two correct attentions in one dtype differ by rounding alone, so a build within a "
                         "small multiple of eager's difference is as right as transformers' own paths"
                         if pd.notna(eager) else
                         "this run measured no transformers_eager row to set it against. Two correct attentions in "
                         "one dtype differ by rounding alone, by a small fraction of the logits' size")
            qs.append(Question(
                "How far are our builds' logits from transformers' SDPA path, and is that close?",
                f"At most {w['logits_maxdiff']:.3g} ({w['build']}, {w['model']}), padded or not; {yardstick}; a "
                "dropped mask or a wrong head mapping shows as a difference of the logits' own size.", here))
        nans = nan_padded(run.results)
        if nans:
            qs.append(Question(
                "Which build gives NaN logits once a sequence is padded, and why?",
                f"{', '.join(nans)}: a left-padded query has no key it may attend to, so its softmax is over "
                "nothing but −∞ and plain softmax code returns NaN; the NaN then sits in that position's V in the "
                "next layer, and 0 × NaN is NaN in every later P·V. Our builds and SDPA give such a row zeros; "
                "transformers' eager path adds a large negative number instead of −∞ for the same reason.", here))
    if les is None:
        qs.append(Question(
            "What does fusion buy in the whole forward on a GPU?",
            f"No GPU model run was found to answer from. To make one: {MAKE_ONE}.", here))
        return qs
    t = amdahl_table(les.results, build, les.baseline)
    if t.empty:
        return qs
    top = t.loc[t["share"].idxmax()]
    qs.append(Question(
        f"Where is attention's share of {les.baseline}'s forward largest, and what is the most any attention kernel "
        "could then speed the forward up?",
        f"{_shape(top)}: f = {top['share']:.2f}, so even an attention that took no time would speed the forward up "
        f"at most 1 / (1 − f) = {top['ceiling']:.2f}×.", les.label))
    big = t.loc[t["attn_speedup"].idxmax()]
    floor = launch_floor(les.results)
    floored = [b for b in (build, les.baseline) if _at_floor(floor, big["model"], big["B"], b, big["N"])]
    qs.append(Question(
        f"{build} is up to how many times faster than {les.baseline} at attention alone, and why does the whole "
        "forward gain less?",
        f"{big['attn_speedup']:.2f}× at {_shape(big)}, where the forward gains {big['measured']:.2f}×. Only the "
        f"share f = {big['share']:.2f} of the forward is attention; the projections, the MLP and the output head "
        f"run at the same speed in both. Amdahl: 1 / ((1 − {big['share']:.2f}) + {big['share']:.2f} / "
        f"{big['attn_speedup']:.2f}) = {big['predicted']:.2f}×."
        + (f" At that shape {' and '.join(floored)}'s attention alone is at the launch floor (section 5): the "
           "ratio compares the host's launches as much as the kernels." if floored else ""), les.label))
    t["miss"] = t["measured"] / t["predicted"] - 1
    worst = t.loc[t["miss"].abs().idxmax()]
    qs.append(Question(
        "How well does Amdahl's law predict the forward's speedup, and where does it miss most?",
        f"Within {t['miss'].abs().median():.0%} at the median shape; the largest miss is at {_shape(worst)}: "
        f"predicted {worst['predicted']:.2f}×, measured {worst['measured']:.2f}×. There the attention's speedup "
        f"inside the model, {worst['attn_speedup_in_model']:.2f}×, differs from the one timed alone, "
        f"{worst['attn_speedup']:.2f}×, and the law assumes they are equal. What can part them: inside the forward "
        "the attention's inputs arrive from the projections (not from a warm, separate buffer) and its launches "
        "queue behind other kernels, and the share f is measured with a copy of V standing in for attention, "
        "which itself takes time.", les.label))
    qs.append(Question("How does attention's share of the forward change with the sequence length, and why?",
                       share_note(les.results, build, les.baseline), les.label))
    memory_q = _memory_question(les, build)
    if memory_q is not None:
        qs.append(memory_q)
    return qs


def check_yourself(run: Run, les: Lessons | None = None, build: str = "fused"):
    from IPython.display import HTML

    return HTML("\n".join(q.html() for q in questions(run, les, build)))


# -- rendering ----------------------------------------------------------------------------------------------------

def render_notebook(params_path, out=None, *, timeout: float | None = None, execute=None) -> render.Rendered:
    """notebooks/model_forward.ipynb executed by papermill with the params file's keys into a run folder, and its
    HTML. Bad params raise ParamsError before anything is written; a failing or timed-out cell gives a non-zero
    code and keeps the partial notebook and every row measured."""
    p = model_sweep.load_params(params_path)
    raw = yaml.safe_load(Path(params_path).read_text())
    out = Path(out) if out else lab.new_folder(sweep.resolve_device(p))
    sweep.check_out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    nb_out = out / NOTEBOOK.name
    code, message = render.run_notebook(NOTEBOOK, nb_out, {**raw, "out_dir": str(out)}, timeout=timeout,
                                        execute=execute)
    html = render.export_html(nb_out) if nb_out.exists() else None
    rows = len(model_sweep.read_results(out, modes=None)) if (out / model_sweep.RESULTS).exists() else 0
    where = relative_path(out)
    if code:
        message = f"{NOTEBOOK.name} stopped: {message}. Kept in {where}: the partial notebook and {rows} row(s)"
    else:
        message = f"{NOTEBOOK.name} rendered with {params_path} into {where}: {rows} rows, notebook and HTML"
    return render.Rendered(code, out, nb_out, html, message)


def main(argv=None) -> int:
    ap = Parser(prog="python -m attnlab.model_lab", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", required=True, type=existing_file, metavar="FILE", help="params YAML")
    ap.add_argument("--out", type=out_dir_arg, metavar="DIR", help="run folder (default: a new "
                                                                    "outputs/<device>/<time>/)")
    ap.add_argument("--timeout", type=positive_float, metavar="S", help="seconds a cell may run (default: none)")
    args = ap.parse_args(argv)
    return render.finish(lambda: render_notebook(args.params, args.out, timeout=args.timeout))


if __name__ == "__main__":
    sys.exit(main())
