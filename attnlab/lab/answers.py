"""Sections 11 and 12: the check-yourself questions and the experiment record, each answer computed from the run's
gate, its byte model and the lesson rows. Most questions ask for a prediction first (bytes ÷ bandwidth, FLOPs ÷ rate,
with the ceilings the lesson rows' run measured) and answer with the prediction beside the measurement; each reads
the shape the explanations read (attnlab.lab.explain.teaching_row) unless it names another."""
from __future__ import annotations

import html
import math
from dataclasses import dataclass

import pandas as pd

from attnlab import measure, cost, report
from attnlab.lab.explain import case_of, ceilings_of, row_at, shape_words, teaching_row
from attnlab.lab.profiler_view import fused_stages_refused
from attnlab.lab.run import OURS, Run, run_shapes
from attnlab.lab.sections import dominant, head_dim_words, overlap_findings, trend
from attnlab.lab.source import Lessons, groups_of, lessons, readable_bytes, relative_path
from attnlab.report import correctness as cr

# -- section 11: check yourself -----------------------------------------------------------------------------------

@dataclass
class Question:
    question: str
    answer: str
    source: str  # where the numbers in the answer come from

    def html(self) -> str:
        return (f"<p><b>{html.escape(self.question)}</b></p><details><summary>Answer (computed from "
                f"{html.escape(self.source)})</summary><p>{html.escape(self.answer)}</p></details>")


def _times(x: float) -> str:
    """A ratio as the page prints it: two decimals, whole numbers past 100."""
    return f"{x:.2f}" if x < 100 else f"{x:,.0f}"


def _ceiling_words(c: dict) -> str:
    return f"{c['tbps']:.3g} TB/s copy bandwidth and {c['tflops']:.3g} TFLOP/s matmul rate"


def predict_times(les: Lessons) -> Question | None:
    """Materialised's time from the bytes it must move at the measured copy bandwidth, fused's from its FLOPs at the
    measured matmul rate, their ratio as the predicted speedup; each beside the measurement, at teaching_row's
    shape."""
    row = teaching_row(les)
    mat = row_at(les, "materialised", row) if row is not None else None
    c = ceilings_of(les)
    if mat is None or not (c["tbps"] > 0 and c["tflops"] > 0):
        return None
    moved = cost.bytes_moved(case_of(mat))
    flops = cost.flops(case_of(row))
    t_mat, t_fused = cost.ms_at(moved, c["tbps"]), cost.ms_at(flops, c["tflops"])
    m_mat, m_fused = float(mat["ms"]), float(row["ms"])
    return Question(
        f"Predict before you look: at {shape_words(row)}, how long should materialised take if moving its bytes "
        f"were all it did, and fused if its FLOPs were? Use this card's measured {_ceiling_words(c)}. What speedup "
        "does that predict?",
        f"materialised moves {readable_bytes(moved)}: ÷ {c['tbps']:.3g} TB/s = {t_mat:.3g} ms; measured "
        f"{m_mat:.3g} ms ({_times(m_mat / t_mat)}× the prediction). fused does {flops / 1e9:,.4g} GFLOP: ÷ {c['tflops']:.3g} "
        f"TFLOP/s = {t_fused:.3g} ms; measured {m_fused:.3g} ms ({t_fused / m_fused:.0%} of the matmul ceiling). "
        f"Predicted speedup {_times(t_mat / t_fused)}×, measured {m_mat / m_fused:.2f}×: "
        + ("within 25 %, so bytes bound materialised and FLOPs bound fused as the model says."
           if abs(t_mat / t_fused / (m_mat / m_fused) - 1) <= 0.25 else
           "more than 25 % apart: the build further from its prediction (the ratios above) runs further from its "
           "ceiling than the model assumes."),
        les.label)


def predict_head_dim(les: Lessons) -> Question | None:
    """From the smallest head dim's measured times at the largest N two head dims share (non-causal where measured),
    the next head dim's speedup: materialised's extra time over fused scales with S and P's bytes (B·H·N² each);
    fused's time at the larger D is the one measured there."""
    r = les.results[(les.results["status"] == "ok") & (les.results["dtype"].astype(str) == les.dtypes[0])]
    if (~r["causal"].astype(bool)).any():
        r = r[~r["causal"].astype(bool)]
    pair = {d: r[r["D"] == d] for d in sorted(r["D"].unique())[:2]}
    if len(pair) < 2:
        return None
    (lo, a), (hi, b) = pair.items()
    both = [n for n in sorted(set(a[a["build"] == "fused"]["N"]) & set(b[b["build"] == "fused"]["N"]))
            if {"fused", "materialised"} <= set(a[a["N"] == n]["build"]) & set(b[b["N"] == n]["build"])]
    if not both:
        return None
    n = both[-1]
    at = {d: g[g["N"] == n].set_index("build") for d, g in pair.items()}
    size = {d: cost.nn_bytes(int(at[d].loc["fused", "B"]), int(at[d].loc["fused", "H"]), n, les.dtypes[0])
            for d in at}
    extra = float(at[lo].loc["materialised", "ms"]) - float(at[lo].loc["fused", "ms"])
    f_hi = float(at[hi].loc["fused", "ms"])
    scaled = extra * size[hi] / size[lo]
    predicted = (f_hi + scaled) / f_hi
    measured = float(at[hi].loc["materialised", "ms"]) / f_hi
    x_lo = float(at[lo].loc["materialised", "ms"]) / float(at[lo].loc["fused", "ms"])
    causal = bool(at[lo]["causal"].iloc[0])
    return Question(
        f"At N = {n} ({les.dtypes[0]}, {'causal' if causal else 'non-causal'}), fused beat materialised {x_lo:.2f}× "
        f"at D = {lo}. Predict the speedup at D = {hi}, where fused takes {f_hi:.3g} ms: materialised's extra time "
        "is S and P's traffic, which scales with their bytes (B·H·N² elements each, whatever D).",
        f"At D = {lo} materialised's extra time was {extra:.3g} ms. S at D = {hi} is {readable_bytes(size[hi])} "
        f"against {readable_bytes(size[lo])} at D = {lo} (B and H of each row), so the extra becomes {scaled:.3g} ms "
        f"and the speedup ({f_hi:.3g} + {scaled:.3g}) / {f_hi:.3g} = {predicted:.2f}×; measured {measured:.2f}× "
        f"({measured / predicted - 1:+.0%}).",
        les.label)


def predict_boundaries(les: Lessons) -> Question | None:
    """What each removed boundary should save at the largest N of the first group, from its bytes at the measured
    copy bandwidth, beside what it saved (report.attribution)."""
    dt = les.dtypes[0]
    g = groups_of(les)[(dt, False)] if (dt, False) in groups_of(les) else next(iter(groups_of(les).values()))
    att = report.attribution(g)
    if att.empty:
        return None
    n_max = int(att["N"].max())
    last = att[att["N"] == n_max]
    return Question(
        f"At N = {n_max}, predict what removing S's round trip saves, and P's, from each one's bytes at the measured "
        "copy bandwidth; then compare with what each removal saved.",
        "; ".join(f"D = {r.D}, {r.boundary}: {readable_bytes(r.bytes)} predicts {r.predicted_ms:.3g} ms; it saved "
                  f"{r.delta_ms:.3g} ms (×{_times(r.measured_over_predicted)})" for r in last.itertuples()) + ".",
        les.label)


def predict_peaks(les: Lessons) -> Question | None:
    """The bytes materialised and fused must hold at once at teaching_row's shape (the byte model), beside their
    measured peak allocations."""
    row = teaching_row(les)
    mat = row_at(les, "materialised", row) if row is not None else None
    if mat is None:
        return None
    B, H, N, D, dt = int(row["B"]), int(row["H"]), int(row["N"]), int(row["D"]), str(row["dtype"])
    hold_mat, hold_fused = cost.hold_bytes(case_of(mat)), cost.hold_bytes(case_of(row))
    peaks = {b: float(x["peak_bytes"]) for b, x in (("materialised", mat), ("fused", row))}
    measured = ("; measured peaks: " + ", ".join(f"{b} {readable_bytes(p)} ({p / h:.2f}× its prediction)" for (b, p), h
                                                  in zip(peaks.items(), (hold_mat, hold_fused)))
                if all(math.isfinite(p) for p in peaks.values()) else "; these rows record no peak allocation")
    return Question(
        f"Predict the peak memory of materialised and of fused at {shape_words(row)}: which tensors must each hold "
        "at once, and how many bytes is that?",
        f"materialised holds S and P together while the softmax runs: 2·B·H·N²·{cost.itemsize(dt)} bytes = "
        f"{readable_bytes(hold_mat)}; fused holds only O: B·H·N·D·{cost.itemsize(dt)} = "
        f"{readable_bytes(hold_fused)}, {hold_mat / hold_fused:,.0f}× less{measured}.",
        les.label)


def predict_accuracy(les: Lessons) -> Question | None:
    """Which of our builds should err most against the fp64 oracle, from where each rounds to the rows' dtype,
    beside the median err each had over the rows."""
    dt = les.dtypes[0]
    r = les.results[(les.results["status"] == "ok") & (les.results["dtype"].astype(str) == dt)
                    & les.results["build"].isin(OURS)].dropna(subset=["err"])
    med = r.groupby("build")["err"].median()
    if set(med.index) != set(OURS):
        return None
    ordered = med["materialised"] >= med["qk_softmax"] >= med["fused"]
    return Question(
        f"Predict which of our three builds is least accurate against the fp64 oracle in {dt}, and which most: "
        f"materialised stores S and P in {dt}, qk_softmax stores P, fused keeps both in fp32 on chip and rounds "
        "only O.",
        f"Each rounding to {dt} adds error, so predict materialised ≥ qk_softmax ≥ fused. The median err over "
        f"{len(r)} rows: " + ", ".join(f"{b} {med[b]:.3g}" for b in OURS)
        + f" (materialised {med['materialised'] / med['fused']:.2f}× fused): "
        + ("in the predicted order." if ordered else "not in the predicted order, so something besides rounding "
                                                      "S and P sets the error here."),
        les.label)


def predict_bound(les: Lessons) -> Question | None:
    """Fused's and materialised's arithmetic intensity (FLOPs per byte they must move) at teaching_row's shape
    against the card's ridge point, and the share of each ceiling their measured times reach."""
    row = teaching_row(les)
    mat = row_at(les, "materialised", row) if row is not None else None
    c = ceilings_of(les)
    if mat is None or not (c["tbps"] > 0 and c["tflops"] > 0):
        return None
    ridge = c["tflops"] / c["tbps"]
    parts = []
    for b, x in (("fused", row), ("materialised", mat)):
        case = case_of(x)
        f, moved, ms = cost.flops(case), cost.bytes_moved(case), float(x["ms"])
        bound = "arithmetic" if f / moved > ridge else "memory"
        parts.append(f"{b}: {f / moved:,.0f} FLOP/byte, {bound}-bound by the model; measured {f / (ms * 1e9):.3g} "
                     f"TFLOP/s ({f / (ms * 1e9) / c['tflops']:.0%} of the matmul rate) and {moved / (ms * 1e9):.3g} "
                     f"TB/s ({moved / (ms * 1e9) / c['tbps']:.0%} of the copy bandwidth)")
    return Question(
        f"Predict whether fused and materialised are bound by memory or by arithmetic at {shape_words(row)}: divide "
        f"each one's FLOPs by the bytes it must move and set that against this card's ridge point "
        f"({c['tflops']:.3g} TFLOP/s ÷ {c['tbps']:.3g} TB/s).",
        f"The ridge point is {ridge:.3g} FLOP/byte: a kernel doing fewer FLOPs per byte is bound by memory. "
        + "; ".join(parts) + ".",
        les.label)


def _hold_at_run_shape(run: Run) -> Question:
    """The byte model at this run's largest shape, for a run with no GPU rows to compare with."""
    big = max(run_shapes(run), key=lambda c: (c.N, c.D))
    mk = {b: measure.Case(b, big.B, big.H, big.Hkv, big.N, big.D, big.dtype, big.causal, run.device) for b in OURS}
    return Question(
        f"At this run's largest shape (B = {big.B}, H = {big.H}, N = {big.N}, D = {big.D}, {big.dtype}), predict how "
        "many bytes materialised must hold at once, and fused.",
        f"materialised: {readable_bytes(cost.hold_bytes(mk['materialised']))} (S and P, each "
        f"{readable_bytes(cost.nn_bytes(big.B, big.H, big.N, big.dtype))}); qk_softmax: "
        f"{readable_bytes(cost.hold_bytes(mk['qk_softmax']))} (P and O); fused: "
        f"{readable_bytes(cost.hold_bytes(mk['fused']))} (O only).",
        f"this run ({relative_path(run.out)}; the byte model at its shapes)")


def questions(run: Run, les: Lessons | None = None) -> list[Question]:
    """The seeds' three questions, then questions that ask for a prediction from first principles (bytes ÷ bandwidth,
    FLOPs ÷ rate, with the lesson rows' measured ceilings) and answer with the prediction beside the measurement:
    the gate and byte model of `run`, the rows of `les` (lessons(run) unless given)."""
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
    if les is None:
        return qs + [_hold_at_run_shape(run)]
    tr = trend(les)
    shape_words_ = "; ".join(f"{'causal' if r.causal else 'non-causal'} D = {r.D}: {r.first:.2f}× at N = "
                             f"{r.first_N} → {r.last:.2f}× at N = {r.last_N} ({r.shape})" for r in tr.itertuples())
    qs.append(Question(
        "What shape should the speedup curve have as sequence length grows, and what shape does it have here?",
        "Predicted: rising while materialised's N² traffic of S and P grows faster than fused's work can hide "
        "it, then a plateau once fused is bound by its own arithmetic. Measured (fused over materialised): "
        + " ".join([f"{shape_words_}.", *head_dim_words(les)]),
        les.label))
    qs += [q for q in (predict_times(les), predict_head_dim(les), predict_boundaries(les), predict_peaks(les))
           if q is not None]
    find = overlap_findings(les)
    qs.append(Question(
        "Does any ablation of fused save almost nothing, or make it slower? What does that tell you?",
        ("Yes. " + " ".join(find[:3]) + (f" (and {len(find) - 3} more findings)" if len(find) > 3 else ""))
        if find else "No: every ablation of fused saved at least 5 % of its time in these rows.", les.label))
    qs += [q for q in (predict_accuracy(les), predict_bound(les)) if q is not None]
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
