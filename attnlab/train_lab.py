"""What notebooks/training.ipynb calls: every build with a backward measured forward, backward and forward+backward
(attnlab.train_sweep), and the sections that read the rows: the gradients' correctness, the forward+backward speedup,
the memory held for the backward, the recompute trade, check yourself, and a real model's training step.

    p = params(**cell); run = begin(p)   the parameters cell validated (attnlab.train_sweep), the run folder made
    sweep_run(run)                       the grid measured into it (resumable), run.results replaced by every row
    gradients(run)                       this run's own rows: each build's gradients against the fp64 oracle (on a
                                         CPU, our kernels in Triton's interpreter: correctness, never speed)
    lessons(run)                         the rows the speed and memory sections read, resolved when called: this
                                         run's rows measured on a CUDA device, else the newest committed GPU training
                                         run's (reference_run), else None
    source_note(run), speedup(run), memory(run), recompute(run), check_yourself(run)
                                         the sections: each a prediction from the card's measured ceilings, one
                                         figure, a few sentences computed from the rows, its table folded
    real_model(run)                      a real model's training step per build (attnlab.model_train: loss and
                                         gradients against SDPA's, peak, step time), where the params name one

    attnlab train [--params FILE] [--out DIR]     (python -m attnlab.train_lab --params FILE [--out DIR])

renders the notebook with papermill into a run folder (default a new outputs/<device>/<time>/) with its HTML.
"""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from attnlab import cost, hf_attention, lab, render, sweep, train_sweep
from attnlab.lab import notebook, page, readable_bytes, relative_path
from attnlab.lab.answers import Question
from attnlab.lab.run import cell_params, load_folder, open_folder, read_folder
from attnlab.lab.source import committed_source_note, named_device
from attnlab.measure import Case
from attnlab.report import training as rt
from attnlab.report import training_step
from attnlab.runs import find_runs, outputs_root

NOTEBOOK = render.NOTEBOOKS / "training.ipynb"
KEYS = (*(k for k in sweep.KNOWN if k != "out_dir"), "model_step")
NEED = ("materialised", "fused")  # a GPU training run teaches from ok forward+backward rows of these
MAKE_ONE = ("`STEPS=train bash scripts/device.sh` on a GPU machine (or `attnlab train --params "
            "params/training/h100.yaml`), then commit its folder under `outputs/<gpu>/`")
PASS = rt.FORWARD_BACKWARD


# -- the run ------------------------------------------------------------------------------------------------------

def setup() -> dict:
    """attnlab.lab.setup: figures that survive an HTML export, wide tables, which python runs this kernel."""
    return lab.setup()


def params(**cell) -> dict:
    """The parameters cell as validated params (attnlab.train_sweep.validate; attnlab.lab.run.cell_params)."""
    return cell_params(cell, KEYS, train_sweep.validate)


Run = lab.Run  # a run's folder and what is in it (its gate stays empty: the rows carry their own checks)


def begin(p: dict) -> Run:
    """The device resolved, the run folder made (or out_dir reopened) with its train_params.yaml, its rows read."""
    out, device, p = open_folder(p, train_sweep.PARAMS)
    return _read(Run(out, p, device, {}))


def _read(run: Run) -> Run:
    return read_folder(run, train_sweep.PROVENANCE, train_sweep.RESULTS, train_sweep.read_results)


def sweep_run(run: Run, progress: bool = True):
    """Measure the run's grid into its folder (resumable: a folder holding rows measures only what is missing)."""
    from IPython.display import Markdown

    train_sweep.run(run.params, run.out, progress=progress, bar=notebook.progress_bar("training sweep"))
    _read(run)
    r = run.results
    oom = int(r["status"].str.startswith("oom").sum())
    return Markdown(f"{len(r)} rows ({int((r['status'] == 'ok').sum())} ok, {oom} out of memory) in "
                    f"`{relative_path(run.out / train_sweep.RESULTS)}`, provenance in `{train_sweep.PROVENANCE}` "
                    "beside it.")


def load(folder) -> Run:
    """A training run's folder as attnlab.train_sweep writes it."""
    return load_folder(folder, train_sweep.PROVENANCE, _read)


def reference_run(root=None, need=NEED) -> Path | None:
    """The newest training run (attnlab.runs.find_runs of train_provenance.json under `root`, by start time) whose
    rows measured on a CUDA device (their `device` column) hold ok forward+backward rows of every build in `need`."""
    for folder in reversed(find_runs(root, train_sweep.PROVENANCE)):
        try:
            rows = lab.gpu_rows(train_sweep.read_results(folder))
        except ValueError:  # another schema: not a run this checkout reads
            continue
        if set(need) <= set(rt.ok(rows, PASS)["build"]):
            return folder
    return None


def lessons(run: Run | lab.Lessons | None, root=None) -> lab.Lessons | None:
    """The rows the speed and memory sections read, resolved from `run` as it is when called: this run's rows
    measured on a CUDA device where they hold an ok forward+backward row of one of our builds (a resumed run: every
    part's rows); else the newest committed GPU training run's (reference_run under `root`); else None. A Lessons
    is returned as it is."""
    if run is None or isinstance(run, lab.Lessons):
        return run
    mine = lab.gpu_rows(run.results)
    if len(mine) and rt.ok(mine, PASS)["build"].isin(lab.OURS).any():
        return lab.Lessons(mine, run.out, named_device(mine, run.device_name), True, run.provenance)
    folder = reference_run(root)
    if folder is None:
        return None
    ref = load(folder)
    rows = lab.gpu_rows(ref.results)
    return lab.Lessons(rows, folder, named_device(rows, ref.device_name), False, ref.provenance)


def source_note(run: Run, les: lab.Lessons | None = None):
    """Where the speed and memory sections' numbers come from, and why (`les`: lessons(run) unless given)."""
    return committed_source_note(les or lessons(run), run.gpu, kind="training", make_one=MAKE_ONE,
                                 lacking="ok forward+backward GPU row",
                                 head="Correctness from this run; speed and memory from a committed GPU run, not "
                                      "from this machine")


def _note(text: str):
    from IPython.display import Markdown

    return Markdown(text)


def _nothing() -> list:
    return [_note(f"*Nothing to show: no GPU training rows (this run has none, and no committed GPU training run was "
                  f"found under `{relative_path(outputs_root())}`). To make one: {MAKE_ONE}.*")]


def _figure(draw, les: lab.Lessons):
    """draw(the lesson rows), or a line saying why there is no figure (rows with nothing it can draw)."""
    try:
        return draw(les.results)
    except ValueError as e:
        return _note(f"*No figure: {e}.*")


def ceilings_of(les: lab.Lessons) -> dict:
    """The ceilings the lesson rows' run measured in their dtype: tbps, tflops (NaN where it measured none)."""
    c = les.provenance.get("ceilings", {}).get(rt.one_dtype(les.results), {})
    return dict(tbps=float(c.get("tbps", math.nan)), tflops=float(c.get("tflops", math.nan)))


def _x(r: float) -> str:
    return f"{r:.2f}×" if math.isfinite(r) else "n/a"


def _ms(x: float) -> str:
    return f"{x:.3g} ms" if math.isfinite(x) else "n/a"


def _case(build: str, r, dtype: str) -> Case:
    return Case(build, int(r.B), int(r.H), int(r.Hkv), int(r.N), int(r.D), dtype, bool(r.causal))


# -- correctness (this run's own rows) -----------------------------------------------------------------------------

def gradients(run: Run) -> list:
    """Section: every build's rows of this run against the fp64 oracle, per pass (attnlab.report.training.gradients),
    with what they say; on a CPU, that the times measure Python."""
    if run.results.empty:
        return [_note("*No rows in this run (see the sweep's note above).*")]
    t = rt.gradients(run.results)
    ran = t[t["verdict"] != "not run"]
    failed = t[t["verdict"] == "FAIL"]
    fails = ", ".join(f"{b} {p}" for b, p in zip(failed["build"], failed["pass"]))
    words = [f"{len(ran) - len(failed)} of {len(ran)} (build, pass) pairs that ran are within the accuracy rule at "
             "every shape (the gradient nearest its limit, on a backward pass; O on a forward)"
             + (f"; **{fails} fail it**." if len(failed) else ".")]
    idle = t[t["verdict"] == "not run"]
    for why, g in idle.groupby("why_not_run", sort=False):
        words.append(f"Not run: {', '.join(f'{b} {p}' for b, p in zip(g['build'], g['pass']))} ({why}).")
    if len(lab.gpu_rows(run.results)) < len(run.results):
        words.append("*These rows were measured on a CPU, our Triton kernels in Triton's interpreter: the errors are "
                     "real, the times measure Python and are never shown as speed.*")
    return [_note(" ".join(words)), page.noted(t, "why_not_run", fold="every build and pass against the fp64 oracle")]


# -- forward+backward speed ---------------------------------------------------------------------------------------

def _teaching_shapes(rows: pd.DataFrame) -> pd.DataFrame:
    """Per head dim, the shape the predictions read: non-causal where measured, at the largest N where
    materialised's forward+backward ran (else the largest N measured)."""
    causal = bool(rows["causal"].astype(bool).min())
    r = rows[rows["causal"].astype(bool) == causal]
    ran = rt.ok(r, PASS)
    out = []
    for d, g in r.groupby("D"):
        mat = ran[(ran["D"] == d) & (ran["build"] == "materialised")]
        n = mat["N"].max() if len(mat) else g["N"].max()
        out.append(g[g["N"] == n].iloc[0])
    return pd.DataFrame(out)


def speed_prediction(les: lab.Lessons) -> str:
    """Forward+backward from the card's ceilings, per head dim at _teaching_shapes: materialised's bytes (forward and
    backward, attnlab.cost) at the copy bandwidth, fused's FLOPs at the matmul rate, their ratio."""
    c, dtype = ceilings_of(les), rt.one_dtype(les.results)
    parts = []
    for r in _teaching_shapes(les.results).itertuples():
        mat, fused = _case("materialised", r, dtype), _case("fused", r, dtype)
        moved = cost.bytes_moved(mat) + cost.backward_bytes(mat)
        flops = cost.flops(fused) + cost.backward_flops(fused)
        t_mat, t_fused = cost.ms_at(moved, c["tbps"]), cost.ms_at(flops, c["tflops"])
        parts.append(f"at D = {r.D}, N = {r.N} (B = {r.B}, H = {r.H}), materialised moves "
                     f"{readable_bytes(moved)} ({_ms(t_mat)} at {c['tbps']:.3g} TB/s) and fused does "
                     f"{flops / 1e12:.3g} TFLOP ({_ms(t_fused)} at {c['tflops']:.3g} TFLOP/s): fused "
                     f"{_x(t_mat / t_fused)} faster if each ran at its ceiling")
    return ("**Prediction, from this card's ceilings before the rows:** materialised's forward+backward is bound by "
            "its bytes (S and P in the forward; P, dP and dS in the backward), fused's by its FLOPs (the forward's "
            "two products, the backward's five with S recomputed): " + "; ".join(parts) + ".")


def ratio_range(t: pd.DataFrame, build: str, over: str) -> tuple[float, float, int]:
    """(least, greatest, shapes) of `over`'s time / `build`'s over the shapes where both ran (speedups' table)."""
    a = t[t["build"] == build].set_index(rt.SHAPE)["ms"]
    b = t[t["build"] == over].set_index(rt.SHAPE)["ms"]
    r = (b / a).dropna()
    return (float(r.min()), float(r.max()), len(r)) if len(r) else (math.nan, math.nan, 0)


def oom_words(rows: pd.DataFrame, build: str, pass_: str = PASS) -> str:
    """Where `build`'s `pass_` ran out of memory: 'from N = … (D = …)', per head dim, or '' where it never did."""
    o = rt.out_of_memory(rows[(rows["build"] == build) & (rows["pass"] == pass_)])
    return ", ".join(f"from N = {int(g['N'].min())} at D = {d}" for d, g in o.groupby("D"))


def speed_words(les: lab.Lessons) -> str:
    """2–4 sentences from the rows: fused over materialised measured against the prediction, fused against cuDNN's
    and FlashAttention-2's forward+backward, and where materialised ran out of memory."""
    rows = les.results
    t = rt.speedups(rows)
    c, dtype = ceilings_of(les), rt.one_dtype(rows)
    said = []
    for r in _teaching_shapes(rows).itertuples():
        at = t[(t["D"] == r.D) & (t["N"] == r.N) & (t["causal"].astype(bool) == bool(r.causal))]
        s = at.loc[at["build"] == "fused", "speedup"]
        mat, fused = _case("materialised", r, dtype), _case("fused", r, dtype)
        predicted = (cost.ms_at(cost.bytes_moved(mat) + cost.backward_bytes(mat), c["tbps"])
                     / cost.ms_at(cost.flops(fused) + cost.backward_flops(fused), c["tflops"]))
        if len(s) and math.isfinite(s.iloc[0]):
            said.append(f"at D = {r.D}, N = {r.N}, {_x(s.iloc[0])} (predicted {_x(predicted)})")
    words = [("Measured, fused's forward+backward is faster than materialised's " + "; ".join(said) + ".")
             if said else "No shape has ok forward+backward rows of both fused and materialised."]
    libs = []
    for lib, name in (("sdpa_cudnn", "cuDNN's"), ("sdpa_flash", "FlashAttention-2's"), ("flex", "FlexAttention's")):
        lo, hi, n = ratio_range(t, "fused", lib)
        if n:
            libs.append(f"{_x(lo) if lo == hi else _x(lo) + ' to ' + _x(hi)} {name} speed ({lib}, {n} shapes)")
    if libs:
        words.append("Over every shape both ran, fused runs at " + "; ".join(libs) + " (> 1: fused faster).")
    oom = oom_words(rows, "materialised")
    words.append(f"materialised's forward+backward ran out of memory {oom}: the curve stops there." if oom else
                 "materialised's forward+backward ran at every N of the grid.")
    return " ".join(words)


def speed_table(les: lab.Lessons) -> pd.DataFrame:
    """Forward+backward ms per shape (rows) and build (columns), then each build's speedup over materialised."""
    t = rt.speedups(les.results)
    ms = t.pivot_table(index=["causal", "D", "N"], columns="build", values="ms", aggfunc="first")
    x = t.pivot_table(index=["causal", "D", "N"], columns="build", values="speedup", aggfunc="first")
    order = [b for b in dict.fromkeys(les.results["build"]) if b in ms.columns]
    return pd.concat({"ms": ms[order], "× materialised": x[[b for b in order if b in x.columns]]}, axis=1).round(3)


def speedup(run: Run | lab.Lessons | None) -> list:
    """Section: the forward+backward speedup over materialised against N, predicted first from the card's ceilings."""
    les = lessons(run)
    if les is None:
        return _nothing()
    return [lab.rows_line(les), _note(speed_prediction(les)), _figure(rt.speedup_figure, les), _note(speed_words(les)),
            page.fold(speed_table(les), "forward+backward times (ms) and speedups over materialised, per shape")]


# -- memory held for the backward ---------------------------------------------------------------------------------

def fills_at(total: float, r, dtype: str, tokens_fixed: bool) -> float:
    """The N at which P alone, B·H·N² elements, fills `total` bytes: with B·H·N fixed by the grid (the bench's
    policy) P grows as N, total / (B·H·N·E); with B and H fixed, as N², √(total / (B·H·E))."""
    per = int(r.B) * int(r.H) * cost.itemsize(dtype)
    return total / (per * int(r.N)) if tokens_fixed else math.sqrt(total / per)


def memory_prediction(les: lab.Lessons) -> str:
    """What P and the logsumexp weigh at the largest N of each head dim, their ratio N·E/4, and the N at which P
    alone fills the card's memory (fills_at)."""
    rows, dtype = les.results, rt.one_dtype(les.results)
    total = (les.provenance.get("device") or {}).get("total_memory")
    parts = []
    for d, g in rows.groupby("D"):
        r = g.loc[g["N"].idxmax()]
        p = cost.saved_bytes(_case("materialised", r, dtype))
        lse = cost.saved_bytes(_case("fused", r, dtype))
        tokens_fixed = (g["B"] * g["H"] * g["N"]).nunique() == 1 and g["N"].nunique() > 1
        fills = (f"; P alone would fill this card's {readable_bytes(total)} at N ≈ "
                 f"{fills_at(total, r, dtype, tokens_fixed):,.0f}" if total else "")
        parts.append(f"at D = {d}, N = {int(r.N)} (B·H = {int(r.B) * int(r.H)}), P is {readable_bytes(p)} and the "
                     f"logsumexp {readable_bytes(lse)}, {p / lse:,.0f}× less{fills}")
    return ("**Prediction, from the model before the rows:** materialised and qk_softmax keep P, B·H·N² elements of "
            f"{cost.itemsize(dtype)} bytes, from forward to backward; fused keeps one float32 logsumexp per query "
            "row, B·H·N·4 bytes, N·E/4 times less: " + "; ".join(parts) + ".")


def memory_words(les: lab.Lessons) -> str:
    """Per head dim, at the largest N each build ran: its held bytes against what it must save; and where the
    P-keeping builds ran out of memory."""
    t = rt.held(les.results)
    said = []
    for d, g in t.groupby("D"):
        ran = g[g["held_bytes"].notna()]
        parts = []
        for build, b in ran.groupby("build", sort=False):
            r = b.loc[b["N"].idxmax()]
            parts.append(f"{build} {readable_bytes(r['held_bytes'])} at N = {int(r['N'])} ({_x(r['held_over_saved'])} "
                         f"its {'logsumexp' if cost.holds(build) == 'none' else 'P'})")
        said.append(f"At D = {d}: " + ", ".join(parts) + ".")
    ooms = [f"{b} {w}" for b in dict.fromkeys(les.results["build"]) if (w := oom_words(les.results, b))]
    said.append(("Out of memory in forward+backward: " + "; ".join(ooms) + ".") if ooms else
                "No build ran out of memory at any N of the grid.")
    return " ".join(said)


def memory(run: Run | lab.Lessons | None) -> list:
    """Section: the bytes each build holds from forward to backward against N, with the model's P and logsumexp."""
    les = lessons(run)
    if les is None:
        return _nothing()
    t = rt.held(les.results)
    t = lab.readable(t, ["held_bytes", "saved_bytes"]).assign(note=t["status"].where(t["status"] != "ok", ""))
    return [lab.rows_line(les), _note(memory_prediction(les)), _figure(rt.held_figure, les), _note(memory_words(les)),
            page.noted(t.drop(columns="status"), "note", fold="held for the backward, per head dim, N and build, "
                                                              "beside what the build must save")]


# -- the recompute trade ------------------------------------------------------------------------------------------

def recompute_prediction(les: lab.Lessons) -> str:
    """The trade per score: 2·D FLOPs at the matmul rate against 3·E bytes at the copy bandwidth, as a ratio per head
    dim (attnlab.cost's module docstring): the same at every N."""
    c, dtype = ceilings_of(les), rt.one_dtype(les.results)
    e = cost.itemsize(dtype)
    ridge = c["tflops"] / c["tbps"]
    each = "; ".join(f"{1.5 * e * ridge / d:.3g}× at D = {d}" for d in sorted(les.results["D"].unique()))
    return (f"**Prediction, from this card's ceilings before the rows:** recomputing a score costs 2·D FLOPs; keeping "
            f"its P costs {3 * e} bytes (stored once in {dtype}, read twice by the backward). At {c['tflops']:.3g} "
            f"TFLOP/s and {c['tbps']:.3g} TB/s (a ridge of {ridge:.3g} FLOP/byte), moving P takes 1.5·E·R/D times as "
            f"long as recomputing it: {each}; twice that causal, where half the scores need no recompute. Both grow "
            "as N², so the ratio is the same at every N.")


def recompute_words(les: lab.Lessons, table: pd.DataFrame) -> str:
    """At the largest N of each head dim (non-causal where measured): the two model times, and the backward passes
    measured there."""
    causal = bool(table["causal"].min())
    said = []
    for d, g in table[table["causal"] == causal].groupby("D"):
        r = g.loc[g["N"].idxmax()]
        line = (f"At D = {d}, N = {int(r['N'])}: recomputing S costs {_ms(r['recompute_ms'])}, moving P "
                f"{_ms(r['p_ms'])} ({_x(r['p_over_recompute'])})")
        measured = g[g["fused_backward_ms"].notna() & g["qk_softmax_backward_ms"].notna()]
        if len(measured):
            m = measured.loc[measured["N"].idxmax()]
            line += (f"; measured at N = {int(m['N'])}, fused's backward, which recomputes, takes "
                     f"{_ms(m['fused_backward_ms'])} and qk_softmax's, which reads P, "
                     f"{_ms(m['qk_softmax_backward_ms'])}")
        said.append(line + ".")
    return " ".join(said)


def recompute(run: Run | lab.Lessons | None) -> list:
    """Section: fused's extra FLOPs at the card's matmul rate against the P it never stores or reads at its copy
    bandwidth, both in ms, per N."""
    les = lessons(run)
    if les is None:
        return _nothing()
    c = ceilings_of(les)
    if not (c["tbps"] > 0 and c["tflops"] > 0):
        return [lab.rows_line(les), _note("*The lesson rows' run recorded no ceilings: no trade to compute.*")]
    table = rt.recompute(les.results, c)
    shown = table.assign(recompute_flops=table["recompute_flops"].map(lambda f: f"{f / 1e9:,.4g} GFLOP"),
                         p_bytes=table["p_bytes"].map(readable_bytes)).round(4)
    return [lab.rows_line(les), _note(recompute_prediction(les)), rt.recompute_figure(table, les.device_name),
            _note(recompute_words(les, table)), page.fold(shown, "the trade per shape, with the backward passes "
                                                                 "measured")]


# -- check yourself -----------------------------------------------------------------------------------------------

def _recompute_question(les: lab.Lessons) -> Question | None:
    c, dtype = ceilings_of(les), rt.one_dtype(les.results)
    if not (c["tbps"] > 0 and c["tflops"] > 0):
        return None
    table = rt.recompute(les.results, c)
    d = int(table["D"].min())
    e = cost.itemsize(dtype)
    flop_ps = 2 * d / (c["tflops"] * 1e12) * 1e12
    byte_ps = 3 * e / (c["tbps"] * 1e12) * 1e12
    big = table[(table["D"] == d) & ~table["causal"]] if (~table["causal"]).any() else table[table["D"] == d]
    r = big.loc[big["N"].idxmax()]
    shape = SimpleNamespace(B=1, H=1, Hkv=1, N=int(r["N"]), D=d, causal=False)
    p_row = cost.saved_bytes(Case("materialised", **vars(shape), dtype=dtype))
    lse_row = cost.saved_bytes(Case("fused", **vars(shape), dtype=dtype))
    answer = (f"Recomputing a score at D = {d}: 2·{d} = {2 * d} FLOPs ÷ {c['tflops']:.3g} TFLOP/s = {flop_ps:.3g} ps. "
              f"Keeping its P: {3 * e} bytes (written once, read twice) ÷ {c['tbps']:.3g} TB/s = {byte_ps:.3g} ps, "
              f"{byte_ps / flop_ps:.3g}× longer. Both counts grow as N², so the ratio holds at every N. Recomputing "
              f"spends 2·D / (3·E) = {2 * d / (3 * e):.3g} FLOPs per byte of P it never moves, below this card's "
              f"ridge of {c['tflops'] / c['tbps']:.3g} FLOP/byte (the FLOPs it does in the time it moves one byte): "
              f"below the ridge, FLOPs cost less than bytes. Memory decides it outright: at N = {int(r['N'])} one "
              f"head's P is "
              f"{readable_bytes(p_row)}, its logsumexp {readable_bytes(lse_row)} ({p_row / lse_row:,.0f}× less).")
    measured = big[big["fused_backward_ms"].notna() & big["qk_softmax_backward_ms"].notna()]
    if len(measured):
        m = measured.loc[measured["N"].idxmax()]
        answer += (f" Measured at N = {int(m['N'])}: fused's backward, doing the extra FLOPs, takes "
                   f"{_ms(m['fused_backward_ms'])}; qk_softmax's, reading P, {_ms(m['qk_softmax_backward_ms'])}.")
    return Question(f"Predict first: at D = {d} in {dtype} on this card, which costs less per score, recomputing S "
                    f"(2·D FLOPs at {c['tflops']:.3g} TFLOP/s) or storing P and reading it back twice ({3 * e} bytes "
                    f"at {c['tbps']:.3g} TB/s)? By how much, and does the answer change with N?", answer, les.label)


def _memory_question(les: lab.Lessons) -> Question | None:
    """How far in N materialised trains on the card: the last N it ran, the first it ran out at and what it asked
    for, against P, dP and dS at that N."""
    rows, dtype = les.results, rt.one_dtype(les.results)
    mat = rows[(rows["build"] == "materialised") & (rows["pass"] == PASS)]
    if mat.empty:
        return None
    d = int(mat["D"].min())
    mat = mat[(mat["D"] == d) & ~mat["causal"].astype(bool)] if (~mat["causal"].astype(bool)).any() else \
        mat[mat["D"] == d]
    ran, oom = mat[mat["status"] == "ok"], rt.out_of_memory(mat)
    total = (les.provenance.get("device") or {}).get("total_memory")
    card = f" against this card's {readable_bytes(total)}" if total else ""
    if oom.empty:
        answer = (f"Every N of the grid: up to N = {int(mat['N'].max())} at D = {d}, materialised's forward+backward "
                  f"fit{card}.")
    else:
        r = oom.loc[oom["N"].idxmin()]
        p = cost.saved_bytes(_case("materialised", r, dtype))
        last = f"up to N = {int(ran['N'].max())}" if len(ran) else "at no N of the grid"
        wanted = re.match(r"oom: (\d+) bytes wanted", str(r["status"]))
        asked = f", asking for {readable_bytes(int(wanted.group(1)))} more" if wanted else ""
        answer = (f"It ran {last} at D = {d} and ran out at N = {int(r['N'])}{asked}. There the forward "
                  f"keeps P ({readable_bytes(p)}) and, while the softmax runs, S beside it; the backward writes dP and "
                  f"dS, each as large as P, while P is still held: three N × N tensors, "
                  f"{readable_bytes(3 * p)}{card}. fused holds "
                  f"{readable_bytes(cost.saved_bytes(_case('fused', r, dtype)))} there.")
    return Question(f"Predict first: how far in N can materialised train on this card at D = {d}, and what runs out?",
                    answer, les.label)


def questions(run: Run, les: lab.Lessons | None = None) -> list[Question]:
    les = les or lessons(run)
    if les is None:
        return [Question("Why is recomputing P cheaper than storing it?",
                         f"No GPU training run was found to answer from. To make one: {MAKE_ONE}.",
                         f"this run ({relative_path(run.out)})")]
    return [q for q in (_recompute_question(les), _memory_question(les)) if q is not None]


def check_yourself(run: Run, les: lab.Lessons | None = None):
    from IPython.display import HTML

    return HTML("\n".join(q.html() for q in questions(run, les)))


# -- a real model's training step ----------------------------------------------------------------------------------

STEP_COLUMNS = ["build", "status", "loss", "loss_diff", "grad_rel_max", "over_limit", "matches", "peak_bytes",
                "step_ms"]


def _step_section(rows: pd.DataFrame, label: str) -> list:
    """attnlab.report.training_step's section of one run's model-step rows: the line naming them, the figure, the
    sentences, the rows folded."""
    fig, text = training_step.section(rows)
    return [_note(f"*Rows: {label}.*"), fig, _note(text),
            page.fold(lab.readable(rows[STEP_COLUMNS], ["peak_bytes"]), "each build's step against SDPA's")]


def real_model(run: Run) -> list:
    """Section: a real model's training step (attnlab.model_train, measured by the sweep into model_train.csv where
    the params name a model_step): this run's rows, and where those were not measured on a GPU, the committed GPU
    training run's beside them (lessons(run)), each through attnlab.report.training_step; else a line saying it was
    not measured in this run, and why."""
    out = []
    mine = train_sweep.read_step(run.out)
    if mine is not None and len(mine):
        out += _step_section(mine, f"this run, `{relative_path(run.out / train_sweep.MODEL_STEP)}`")
    if mine is None or lab.gpu_rows(mine).empty:
        les = lessons(run)
        theirs = train_sweep.read_step(les.folder) if les is not None and not les.own else None
        if theirs is not None and len(lab.gpu_rows(theirs)):
            out += _step_section(theirs, f"from a committed GPU run, not from this machine: {les.label}")
    if out:
        return out
    why = ("its params name no model_step" if not run.params.get("model_step") else
           f"transformers is not installed: {hf_attention.INSTALL}" if not hf_attention.available() else
           "the sweep above has not reached it")
    return [_note(f"*A real model's training step: not measured in this run ({why}), and no committed GPU training "
                  "run holds one.*")]


# -- rendering ----------------------------------------------------------------------------------------------------

def render_notebook(params_path, out=None, *, timeout: float | None = None, execute=None) -> render.Rendered:
    """notebooks/training.ipynb executed by papermill with the params file's keys into a run folder (attnlab.render's
    render_run), and its HTML. Bad params raise ParamsError before anything is written."""
    return render.render_run(NOTEBOOK, params_path, train_sweep.load_params(params_path), out, timeout=timeout,
                             execute=execute, rows=lambda folder: len(train_sweep.read_results(folder))
                             if (folder / train_sweep.RESULTS).exists() else 0)


main = render.command("python -m attnlab.train_lab", __doc__, render_notebook)


if __name__ == "__main__":
    sys.exit(main())
