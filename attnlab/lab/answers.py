"""Sections 11 and 12: the check-yourself questions and the experiment record, each answer computed from the run's
gate, its byte model and the lesson rows."""
from __future__ import annotations

import html
import math
from dataclasses import dataclass

import pandas as pd

from attnlab import measure, model, report
from attnlab import model as bd
from attnlab.lab.profiler_view import fused_stages_refused
from attnlab.lab.run import OURS, Run, run_shapes
from attnlab.lab.sections import dominant, head_dim_words, overlap_findings, speedup_table, trend
from attnlab.lab.source import Lessons, groups_of, lessons, readable_bytes, relative_path
from attnlab.report import correctness as cr

def threshold(sp: pd.DataFrame) -> float:
    """The speedup check-yourself asks about: the first whole multiple above the slowest curve's start (3× where the
    slowest starts between 2× and 3×), so the question has an N to find on at least one curve."""
    return float(math.floor(sp.iloc[:, 0].min()) + 1)


# -- section 11: check yourself -----------------------------------------------------------------------------------

@dataclass
class Question:
    question: str
    answer: str
    source: str  # where the numbers in the answer come from

    def html(self) -> str:
        return (f"<p><b>{html.escape(self.question)}</b></p><details><summary>Answer (computed from "
                f"{html.escape(self.source)})</summary><p>{html.escape(self.answer)}</p></details>")


def _first_over(t: pd.DataFrame, threshold: float) -> str:
    parts = []
    for (dtype, causal, D), row in t.iterrows():
        over = [n for n, x in row.items() if pd.notna(x) and x >= threshold]
        kind = "causal" if causal else "non-causal"
        best = row.max()
        parts.append(f"{kind} D = {D}: first at N = {over[0]} ({row[over[0]]:.2f}×)" if over else
                     f"{kind} D = {D}: never (at most {best:.2f}×, at N = {row.idxmax()})")
    return "; ".join(parts)


def _traffic_share(les: Lessons, dtype: str, causal: bool, D: int, N: int) -> tuple[float, float, float, float]:
    """At one shape: S and P's round-trip bytes, their time at the measured copy bandwidth, materialised's time and
    fused's (net times, as the speedup table divides)."""
    att = report.attribution(groups_of(les)[(dtype, causal)])
    at = att[(att["D"] == D) & (att["N"] == N)]
    found = report.speedup(groups_of(les)[(dtype, causal)], builds=["fused"])
    f = found[(found["D"] == D) & (found["N"] == N)].iloc[0]
    return at["bytes"].sum(), at["predicted_ms"].sum(), f["materialised_ms"], f["ms"]


def why_there(les: Lessons, sp: pd.DataFrame, x: float) -> str:
    """At the first curve's first N past x: how much of materialised's time S and P's bytes account for at the
    measured bandwidth, against what fused takes, and how that share moved from the N before."""
    for (dtype, causal, D), row in sp.iterrows():
        over = [n for n, v in row.items() if pd.notna(v) and v >= x]
        if not over:
            continue
        n = over[0]
        moved, pred, mat, fused = _traffic_share(les, dtype, causal, D, n)
        text = (f"At N = {n} ({'causal' if causal else 'non-causal'}, D = {D}) S and P's two round trips move "
                f"{readable_bytes(moved)}, {pred:.3g} ms at the measured bandwidth, {pred / mat:.0%} of materialised's "
                f"{mat:.3g} ms, while fused takes {fused:.3g} ms in all.")
        before = [m for m, v in row.items() if m < n and pd.notna(v)]
        if before:
            m = before[-1]
            _, pred0, mat0, _ = _traffic_share(les, dtype, causal, D, m)
            grew = pred / mat > pred0 / mat0
            text += (f" At N = {m} that traffic was {pred0 / mat0:.0%} of materialised's time and the ratio "
                     f"{row[m]:.2f}×: " + ("the share S and P take of materialised's time grew with N, and the "
                                            "ratio with it." if grew else
                                            "the share did not grow, so S and P's traffic alone does not explain "
                                            "the step in the ratio."))
        else:
            text += " It is the first N measured: the ratio starts past the threshold."
        return text
    return "No curve reaches it: S and P's traffic never outweighs fused's whole time by that much here."


def questions(run: Run, les: Lessons | None = None) -> list[Question]:
    """The seeds' three questions and questions about this run's own numbers, each answer computed from the data:
    the gate and byte model of `run`, the speed rows of `les` (lessons(run) unless given)."""
    from attnlab import profiler as k  # loaded when the questions are asked: torch.profiler is slow to import

    les = les or lessons(run)
    qs = []
    here = f"this run ({relative_path(run.out)})"
    # the seeds' questions, answered with the data at hand
    dom = dominant(les) if les is not None else pd.DataFrame()
    dom_fused = dom["fused"].value_counts().to_dict() if "fused" in dom else {}
    qs.append(Question(
        "Why can a profiler not tell you which stage dominates a fused attention kernel?",
        f"Because fused is one kernel ({', '.join(k.UNSTAGED)}): QKᵀ, softmax and PV run interleaved inside it, "
        f"overlapped across warps, and the profiler sees only its total. Asked for stage times, the kernel table "
        f"refuses: \"{fused_stages_refused()}\". The honest route is ablation: "
        + (f"across {les.label}, the stage whose removal saved the most in fused was "
           + ", ".join(f"{'no single stage (within the noise)' if s == '—' else s} at {n} shape(s)"
                       for s, n in dom_fused.items()) + "." if dom_fused else
           "the ablation table names the stage whose removal saves the most."),
        les.label if les is not None else here))
    ab = cr.correctness_table(run.gate) if not run.gate.empty else pd.DataFrame()
    ab = ab[ab["build"].str.contains("-")] if len(ab) else ab
    passed = f"{int((ab['verdict'] == 'pass').sum())} of {len(ab)}" if len(ab) else "none"
    consumed = ""
    if les is not None:
        r = les.results[(les.results["family"] == "ablation") & (les.results["status"] == "ok")]
        finite = int(r["checksum"].notna().sum())
        consumed = (f" In {les.label}, {finite} of {len(r)} ablation rows carry a finite checksum of their "
                    f"consumed output.")
    qs.append(Question(
        "What makes an ablation a valid measurement?",
        "It is still a legal program that computes something checkable, it consumes its output (else dead-code "
        "elimination deletes the work and the time collapses to a launch), it changes one stage only (same tiles, "
        f"same inputs), and its difference from the base exceeds the noise. In {here}, {passed} ablation (build, "
        f"shape) pairs matched their own oracle in the gate." + consumed,
        here + (f" and {les.label}" if les is not None else "")))
    if les is not None:
        tr = trend(les)
        shape_words = "; ".join(f"{'causal' if r.causal else 'non-causal'} D = {r.D}: {r.first:.2f}× at N = "
                                f"{r.first_N} → {r.last:.2f}× at N = {r.last_N} ({r.shape})"
                                for r in tr.itertuples())
        qs.append(Question(
            "What shape should the speedup curve have as sequence length grows, and what shape does it have here?",
            "Predicted: rising while materialised's N² traffic of S and P grows faster than fused's work can hide "
            f"it, then a plateau once fused is bound by its own arithmetic. Measured (fused over materialised): "
            " ".join([f"{shape_words}.", *head_dim_words(les)]),
            les.label))
        sp = speedup_table(les)
        x = threshold(sp)
        qs.append(Question(
            f"At which N does fused first beat materialised by {x:g}×, and why there?",
            _first_over(sp, x) + ". " + why_there(les, sp, x), les.label))
        dt = les.dtypes[0]
        g = groups_of(les)[(dt, False)] if (dt, False) in groups_of(les) else next(iter(groups_of(les).values()))
        att = report.attribution(g)
        n_max = int(att["N"].max())
        last = att[att["N"] == n_max]
        qs.append(Question(
            f"At N = {n_max}, which removed boundary saves more time, and how does each compare with its bytes at "
            "the measured bandwidth?",
            "; ".join(f"D = {r.D}, {r.boundary}: saved {r.delta_ms:.3g} ms against {r.predicted_ms:.3g} ms for its "
                      f"{readable_bytes(r.bytes)} at the copy bandwidth (×{r.measured_over_predicted:.2f})"
                      for r in last.itertuples()) + ".", les.label))
        find = overlap_findings(les)
        qs.append(Question(
            "Does any ablation of fused save almost nothing, or make it slower? What does that tell you?",
            ("Yes. " + " ".join(find[:3]) + (f" (and {len(find) - 3} more findings)" if len(find) > 3 else ""))
            if find else "No: every ablation of fused saved at least 5 % of its time in these rows.", les.label))
    cases = run_shapes(run)
    big = max(cases, key=lambda c: (c.N, c.D))
    mk = {b: measure.Case(b, big.B, big.H, big.Hkv, big.N, big.D, big.dtype, big.causal, run.device) for b in OURS}
    qs.append(Question(
        f"At this run's largest shape (B = {big.B}, H = {big.H}, N = {big.N}, D = {big.D}, {big.dtype}), how many "
        "bytes must materialised hold at once, and how many must fused?",
        f"materialised: {readable_bytes(model.hold_bytes(mk['materialised']))} (S and P, each "
        f"{readable_bytes(bd.nn_bytes(big.B, big.H, big.N, big.dtype))}); qk_softmax: "
        f"{readable_bytes(model.hold_bytes(mk['qk_softmax']))} (P and O); fused: {readable_bytes(model.hold_bytes(mk['fused']))} "
        f"(O only): {model.hold_bytes(mk['materialised']) / model.hold_bytes(mk['fused']):.0f}× less.",
        here + " (the byte model at its shapes)"))
    if len(run.gate):
        t = cr.correctness_table(run.gate)
        ran = t[t["verdict"] != "not run"].dropna(subset=["err_over_limit"])
        if len(ran):
            w = ran.loc[ran["err_over_limit"].idxmax()]
            qs.append(Question(
                "Which build came closest to its error limit in this run's gate, and how close?",
                f"{w['build']} at N = {w['N']}, D = {w['D']}, {'causal' if w['causal'] else 'non-causal'}: err "
                f"{w['err']:.3g} against a limit of {w['limit']:.3g} ({w['err_over_limit']:.0%} of it). "
                f"{int((t['verdict'] == 'pass').sum())} of {len(t)} (build, shape) pairs passed.", here))
    c = run.ceilings
    if c.get("tbps") and c.get("tflops"):
        s_bytes = bd.boundary_bytes("S round trip", big.B, big.H, big.N, big.dtype, big.causal)
        qs.append(Question(
            "At the copy bandwidth this run measured, how long would the S round trip take at its largest shape, "
            "and what is the ridge point of this device?",
            f"{readable_bytes(s_bytes)} at {c['tbps']:.3g} TB/s: {bd.ms_at(s_bytes, c['tbps']):.3g} ms. The ridge point is "
            f"{c['tflops'] / c['tbps']:.3g} FLOP/byte ({c['tflops']:.3g} TFLOP/s over {c['tbps']:.3g} TB/s): a "
            "kernel doing fewer FLOPs per byte moved is bound by memory here.", here + " (its measured ceilings)"))
    return qs


def check_yourself(run: Run, les: Lessons | None = None):
    from IPython.display import HTML

    return HTML("\n".join(q.html() for q in questions(run, les)))


# -- section 12: the experiment record ----------------------------------------------------------------------------

def _n_span(ns) -> str:
    lo, hi = int(min(ns)), int(max(ns))
    return f"N = {lo}" if lo == hi else f"N = {lo}–{hi}"


def _qk_tradeoff(les: Lessons) -> str:
    """What qk_softmax pays in QKᵀ for dropping S, over every group's S step (report.attribution's qk_passes): a
    second pass only where its rows say it ran two; none where one pass held the row on chip."""
    att = pd.concat([report.attribution(g) for g in groups_of(les).values()], ignore_index=True)
    s = att[att["boundary"] == "S round trip"]
    two, one, unknown = s[s["qk_passes"] == 2], s[s["qk_passes"] == 1], s[s["qk_passes"].isna()]
    parts = []
    if len(two):
        parts.append(f"qk_softmax pays for dropping S with a second QKᵀ pass in the {len(two)} of {len(s)} shapes "
                     f"where it ran two passes ({_n_span(two['N'])}; up to "
                     f"{-two['qk_removed_ms'].min():.3g} ms at the matmul ceiling)")
    if len(one):
        parts.append(f"{'it' if len(two) else 'qk_softmax'} pays no second QKᵀ pass in the {len(one)} of {len(s)} "
                     f"shapes where it ran one (N ≤ {one['N'].max()}), the row held on chip")
    if len(unknown):
        parts.append(f"in {len(unknown)} of {len(s)} shapes qk_softmax's rows do not record whether it ran one QKᵀ "
                     "pass or two")
    return "; ".join(parts)


def experiment_record(run: Run, les: Lessons | None = None) -> pd.DataFrame:
    """Hypothesis, controlled change, observed effect, tradeoff and verdict, each filled from the data (`les`:
    lessons(run) unless given)."""
    les = les or lessons(run)
    if les is None:
        return pd.DataFrame([("hypothesis", "fused's speedup over materialised grows with N, then flattens"),
                             ("observed effect", "no GPU rows to judge it by (see section 5)")],
                            columns=["entry", "record"])
    tr = trend(les)
    verdicts = tr["shape"].value_counts().to_dict()
    supported = verdicts.get("rises then flattens", 0)
    effect = "; ".join(f"{'causal' if r.causal else 'non-causal'} D = {r.D}: {r.first:.2f}× → {r.last:.2f}× "
                       f"(last doubling {r.last_step:+.0%})" for r in tr.itertuples())
    big = les.results[les.results["status"] == "ok"]
    n_max = int(big["N"].max())
    hold = big[(big["N"] == n_max) & big["build"].isin(OURS)].groupby("build")["hold_bytes"].max()
    err = big[big["build"].isin(OURS)].groupby("build")["err"].max()
    record = [
        ("hypothesis", "fused's speedup over materialised grows with N, then flattens (refuted if it falls, is flat "
                       "from the start, or still rises more than 5 % over the last doubling)"),
        ("controlled change", "one memory boundary removed at a time: materialised → qk_softmax (S no longer "
                              "written) → fused (P neither); the same shapes, inputs, dtype, timer (CUDA-graph "
                              "replay, median) and consumption step for every build"),
        ("observed effect", f"{effect} ({les.label})"),
        ("verdict", f"supported in {supported} of {len(tr)} (causal, D) curves; "
                    + ", ".join(f"{k}: {n}" for k, n in verdicts.items())),
        ("tradeoff", f"at N = {n_max} fused must hold {readable_bytes(hold.get('fused'))} against materialised's "
                     f"{readable_bytes(hold.get('materialised'))}, but keeps no P to inspect or reuse and no stage a "
                     f"profiler can time; {_qk_tradeoff(les)}; worst error against the fp64 oracle: "
                     + ", ".join(f"{b} {err.get(b, math.nan):.3g}" for b in OURS)),
    ]
    return pd.DataFrame(record, columns=["entry", "record"])


def record(run: Run, les: Lessons | None = None):
    """Section 12: the experiment record as a table in the page, each entry whole."""
    from IPython.display import Markdown

    t = experiment_record(run, les)
    return Markdown("| entry | record |\n|---|---|\n" + "\n".join(
        f"| **{e}** | {str(r).replace('|', '/')} |" for e, r in zip(t["entry"], t["record"])))
