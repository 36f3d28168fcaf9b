"""The walkthrough's sections, each a table, a figure or a paragraph computed from the rows: the device (section
2), the hypothesis and the speedup curves with their batch policy and head dims (1 and 5), memory (6: the peak
allocation figure, its tables folded), attribution by ablation and what the ablations did not save (7), the roofline
(8) and the ways a benchmark lies (10). Those of the GPU rows take a Run or Lessons (needs_lessons). A detail table
goes on the page folded, its notes said once (attnlab.lab.page); the section functions return the tables whole."""
from __future__ import annotations

import json
import math
import re

import pandas as pd

from attnlab import measure, cost, report, sweep
from attnlab import cost as bd
from attnlab.lab import page
from attnlab.lab.run import OURS, Run, run_shapes
from attnlab.lab.source import (Lessons, groups_of, has_ours, lessons, needs_lessons, no_lessons, readable,
                                readable_bytes, relative_path)
from attnlab.report import curves, roofline
from attnlab.report.ablation import ablation_table
from attnlab.report.memory import memory_table, peak_table
from attnlab.runs import find_runs

# -- section 2: the device ----------------------------------------------------------------------------------------

def _facts(prov: dict, dtype: str, out) -> list[tuple[str, str]]:
    dev, sw, git = prov.get("device", {}), prov.get("software", {}), prov.get("git", {})
    c = prov.get("ceilings", {}).get(dtype, {})
    return [
        ("device", f"{dev.get('name')} ({dev.get('device')})"),
        ("compute capability", dev.get("capability") or "none (CPU)"),
        ("memory", readable_bytes(dev["total_memory"]) if dev.get("total_memory") else "n/a"),
        ("driver / CUDA", f"{dev.get('driver_version') or 'n/a'} / {sw.get('cuda') or 'n/a'}"),
        ("torch / triton / python", f"{sw.get('torch')} / {sw.get('triton')} / {sw.get('python')}"),
        ("Triton interpreter", "on: our kernels run as Python, so their timings measure Python"
         if sw.get("triton_interpret") == "1" else "off: our kernels are compiled for the device"),
        ("commit", f"{git.get('commit') or 'not recorded'}{' (with uncommitted changes)' if git.get('dirty') else ''}"),
        ("code fingerprint", str(prov.get("code"))),
        ("dtype", dtype),
        ("copy bandwidth, measured", f"{c.get('tbps', math.nan):.4g} TB/s (read + written; {c.get('timer')})"),
        ("matmul rate, measured", f"{c.get('tflops', math.nan):.4g} TFLOP/s ({c.get('matmul_n')}³)"),
        ("ridge point", f"{c['tflops'] / c['tbps']:.3g} FLOP/byte" if c.get("tbps") else "n/a"),
        ("folder", relative_path(out)),
    ]


def summary(run: Run) -> pd.DataFrame:
    """Section 2: the device, the software, the commit and the ceilings this run measured, one fact a line. Where
    the speed lessons come from is said after the sweep (source_note), once this run's rows exist."""
    return pd.DataFrame(_facts(run.provenance, run.params["dtype"], run.out), columns=["what", "this run"])


# -- section 1 and 5: the hypothesis and the speedup curve --------------------------------------------------------

def hypothesis(p: dict):
    from IPython.display import Markdown

    ns = sorted(p["seq_lens"])
    return Markdown(
        f"**It is refuted** if the speedup falls with N, stays flat from the first N, or is still rising by more than "
        f"{curves.FLAT:.0%} over the last doubling of N. This run's grid: N = {', '.join(map(str, ns))}; "
        f"D = {', '.join(map(str, p['head_dims']))}; {p['dtype']}; causal {', '.join(map(str, p['causal']))}; "
        f"batch policy `{p['batch_policy']}`.")


@needs_lessons(many=True)
def speedup_figures(les: Lessons) -> list:
    """Section 5: per dtype, our three builds' figure (attnlab.report.curves.speedup_curves), then the library
    builds' beside fused (library_curves) where the rows hold any."""
    out = []
    for dt in les.dtypes:
        out.append(curves.speedup_curves(les.results, dt))
        libraries = curves.library_curves(les.results, dt)
        if libraries is not None:
            out.append(libraries)
    return out


@needs_lessons()
def speedup_table(les: Lessons, build: str = "fused", baseline: str = "materialised") -> pd.DataFrame:
    """build's speedup over baseline per (dtype, causal, D) and N, wide: the numbers behind the curves."""
    parts = [report.speedup(g, baseline=baseline, builds=[build]) for g in report.split(les.results).values()
             if {build, baseline} <= set(g["build"])]
    t = pd.concat(parts, ignore_index=True)
    return t.pivot_table(index=["dtype", "causal", "D"], columns="N", values=f"x_vs_{baseline}").round(2)


@needs_lessons()
def trend(les: Lessons, build: str = "fused", baseline: str = "materialised") -> pd.DataFrame:
    """Per (dtype, causal, D): the speedup at the first and last N, its change over the first and the last doubling,
    and the shape that makes of the hypothesis."""
    return curves.speedup_trend(les.results, build=build, baseline=baseline)


@needs_lessons()
def batch_policy(les: Lessons) -> pd.DataFrame:
    """The (B, H) at each (D, N) of the lesson rows, with B·N and H·D: whether the grid holds tokens fixed (B·N one
    value: FlashAttention's shapes) or B and H fixed (the seeds' policy), read from the rows themselves."""
    ours = les.results[les.results["build"] == "fused"]
    t = ours[["dtype", "D", "N", "B", "H"]].drop_duplicates().sort_values(["dtype", "D", "N"])
    t = t.assign(tokens=t["B"] * t["N"], width=t["H"] * t["D"])
    return t.reset_index(drop=True)


def policy_of(results: pd.DataFrame) -> str:
    """'fixed_tokens' when B·N is one value at every N of each (dtype, D), 'fixed' when B and H are, else 'mixed'."""
    t = results[["dtype", "D", "N", "B", "H"]].drop_duplicates()
    if t.empty or t["N"].nunique() < 2:
        return "mixed"
    by = t.assign(tokens=t["B"] * t["N"]).groupby(["dtype", "D"])
    if (by["tokens"].nunique() == 1).all():
        return "fixed_tokens"
    if (by["B"].nunique() == 1).all() and (by["H"].nunique() == 1).all():
        return "fixed"
    return "mixed"


def policy_runs(les: Lessons, root=None) -> dict:
    """The lesson rows of their first dtype and, for each other batch policy, the newest GPU run of the same card
    holding our three builds (its rows of the same dtype, else of its own first dtype): label → rows of one dtype."""
    dtype = les.dtypes[0]
    mine = policy_of(les.results[les.results["dtype"].astype(str) == dtype])
    runs = {f"{mine} ({dtype}, {relative_path(les.folder)})": les.results[les.results["dtype"].astype(str) == dtype]}
    same_card = [f for f in find_runs(root) if f != les.folder
                 and json.loads((f / sweep.PROVENANCE).read_text()).get("device", {}).get("name") == les.device_name]
    seen = {mine}
    for folder in reversed(same_card):
        try:
            rows = sweep.read_results(folder)
        except (OSError, ValueError):
            continue
        dtypes = sorted(rows["dtype"].astype(str).unique())
        if not dtypes:
            continue
        theirs = dtype if dtype in dtypes else dtypes[0]
        rows = rows[rows["dtype"].astype(str) == theirs]
        policy = policy_of(rows)
        if policy not in seen and policy != "mixed" and has_ours(rows):
            seen.add(policy)
            runs[f"{policy} ({theirs}, {relative_path(folder)})"] = rows
    return runs


def curve_words(rows: pd.DataFrame, build: str = "fused", baseline: str = "materialised") -> str:
    """Each (dtype, causal, D) curve of `build` over `baseline` in words: its first, highest and last points and the
    shape speedup_trend gives it."""
    parts = []
    for r in curves.speedup_trend(rows, build=build, baseline=baseline).itertuples():
        t = report.speedup(report.split(rows)[(r.dtype, r.causal)], baseline=baseline, builds=[build])
        line = t[t["D"] == r.D].dropna(subset=[f"x_vs_{baseline}"]).sort_values("N")
        top = line.loc[line[f"x_vs_{baseline}"].idxmax()]
        peak = (f", highest {top[f'x_vs_{baseline}']:.2f}× at N = {int(top['N'])}"
                if int(top["N"]) not in (r.first_N, r.last_N) else "")
        parts.append(f"{'causal' if r.causal else 'non-causal'} D = {r.D}: {r.first:.2f}× at N = {r.first_N}{peak}, "
                     f"{r.last:.2f}× at N = {r.last_N} ({r.shape})")
    return "; ".join(parts)


def curve_shapes(rows: pd.DataFrame, build: str = "fused", baseline: str = "materialised") -> str:
    """The shape speedup_trend gives each (dtype, causal, D) curve of `build` over `baseline`, curves of one shape
    named together: 'flat at non-causal D = 64, non-causal D = 128; rises then flattens at causal D = 64'."""
    named: dict[str, list[str]] = {}
    for r in curves.speedup_trend(rows, build=build, baseline=baseline).itertuples():
        named.setdefault(r.shape, []).append(f"{'causal' if r.causal else 'non-causal'} D = {r.D}")
    return "; ".join(f"{shape} at {', '.join(names)}" for shape, names in named.items())


@needs_lessons()
def batch_policy_note(les: Lessons):
    """What the lesson rows' batch policy is, what their curves did, and the same card's run of the other policy
    beside them when one is committed: every number from the rows."""
    from IPython.display import Markdown

    t = batch_policy(les)
    runs = policy_runs(les)
    mine, *others = runs
    policy = mine.split(" ")[0]
    if policy == "fixed_tokens":
        text = f"**fixed tokens** (B·N = {int(t['tokens'].iloc[0])} and H·D = {int(t['width'].iloc[0])} at every N)."
        other = "params/seeds-policy.yaml"
    elif policy == "fixed":
        text = (f"**fixed B and H** (B = {int(t['B'].iloc[0])}, H = {int(t['H'].iloc[0])} at every N, the seeds' "
                "policy).")
        other = "params/<gpu>.yaml"  # the card's own params hold tokens fixed
    else:
        text = "**mixed**: B and H change between N in no single pattern; read each curve with its row's B and H."
        other = "params/seeds-policy.yaml"
    text += (f" Measured here, fused over materialised is {curve_shapes(runs[mine])} (the trend above gives its "
             "numbers).")
    for label in others:
        text += (f" On the same card under **{label.split(' ')[0].replace('_', ' ')}** ({label.split('(', 1)[1][:-1]}"
                 f"): {curve_words(runs[label])}. The figure below sets the two side by side.")
    if not others:
        text += (f" No run of another policy on this card is committed, so these rows cannot show what the policy "
                 f"does; `attnlab run --params {other}` on the same card renders one.")
    return Markdown(f"Batch policy of these rows: {text}")


@needs_lessons(many=True)
def batch_policy_figures(les: Lessons) -> list:
    """The speedup of fused over materialised for each batch policy a run of this card holds (policy_runs); nothing
    when only one policy was measured."""
    runs = policy_runs(les)
    return [curves.policy_figure(runs)] if len(runs) > 1 else []


def head_dim_facts(les: Lessons) -> list[dict]:
    """Per (dtype, causal) with two head dims or more, at the largest N all of them reach: fused's speedup over
    materialised per D (`x`), S and P's round-trip bytes per FLOP of attention per D (`per_flop`: 1/D, since S and P
    hold N² elements a head whatever D is while the FLOPs are 4·N²·D), and whether the speedups are ordered as that
    predicts, the larger D lower (`ordered`)."""
    out = []
    for (dtype, causal), g in groups_of(les).items():
        if not {"fused", "materialised"} <= set(g["build"]):
            continue
        sp = report.speedup(g, builds=["fused"]).dropna(subset=["x_vs_materialised"])
        dims = sorted(int(d) for d in sp["D"].unique())
        common = set.intersection(*(set(sp[sp["D"] == d]["N"]) for d in dims)) if dims else set()
        if len(dims) < 2 or not common:
            continue
        n = max(common)
        at = sp[sp["N"] == n].set_index("D")
        x = {d: float(at.loc[d, "x_vs_materialised"]) for d in dims}
        per_flop = {}
        for d in dims:
            r = at.loc[d]
            case = measure.Case("fused", int(r["B"]), int(r["H"]), int(r["Hkv"]), n, d, dtype, causal, "cuda")
            moved = sum(bd.boundary_bytes(k, case.B, case.H, n, dtype, causal) for k in bd.BOUNDARIES)
            per_flop[d] = moved / cost.flops(case)
        out.append(dict(dtype=dtype, causal=causal, N=n, dims=dims, x=x, per_flop=per_flop,
                        ordered=all(x[a] >= x[b] for a, b in zip(dims, dims[1:]))))
    return out


WHY_1_OVER_D = "1/D, since S and P hold N² elements a head whatever D is while the FLOPs are 4·N²·D"


def head_dim_words(les: Lessons) -> list[str]:
    """head_dim_facts in words, a paragraph per (dtype, causal): the speedup per D beside S and P's round-trip bytes
    per FLOP, and whether the curves are ordered as 1/D predicts."""
    out = []
    for f in head_dim_facts(les):
        dims, x, per_flop = f["dims"], f["x"], f["per_flop"]
        out.append(
            f"At N = {f['N']} ({f['dtype']}, {'causal' if f['causal'] else 'non-causal'}) fused over materialised is "
            + ", ".join(f"{x[d]:.2f}× at D = {d}" for d in dims)
            + ". S and P's round trips move " + ", ".join(f"{per_flop[d]:.3g} byte per FLOP at D = {d}" for d in dims)
            + f": {WHY_1_OVER_D}. "
            + ("So a larger D leaves materialised less extra traffic per unit of work and fused less to win, and "
               "its curve sits lower, as here." if f["ordered"] else
               "1/D predicts the larger D's curve sits lower; here it does not, so at this N something besides S "
               "and P's traffic sets the ratio (the ablations below look inside)."))
    return out


@needs_lessons()
def head_dim_note(les: Lessons):
    """head_dim_facts as one paragraph: each group's speedups and bytes per FLOP in one clause, and which groups are
    ordered as 1/D predicts (the notebook says why, once); or the line that these rows hold one head dim."""
    from IPython.display import Markdown

    facts = head_dim_facts(les)
    if not facts:
        return Markdown("These rows hold one head dim, so they cannot show how D moves the curve.")
    same = all(f["dims"] == facts[0]["dims"] for f in facts)  # else each value names its D
    dims = " and ".join(f"D = {d}" for d in facts[0]["dims"]) if same else "each head dim"
    at = (lambda d: "") if same else (lambda d: f" at D = {d}")
    groups = "; ".join(
        f"{f['dtype']} {'causal' if f['causal'] else 'non-causal'} at N = {f['N']}: "
        + ", ".join(f"{f['x'][d]:.2f}×{at(d)}" for d in f["dims"]) + " (S and P's round trips: "
        + ", ".join(f"{f['per_flop'][d]:.3g}{at(d)}" for d in f["dims"]) + " byte per FLOP)" for f in facts)
    bad = [f"{f['dtype']} {'causal' if f['causal'] else 'non-causal'}" for f in facts if not f["ordered"]]
    verdict = ("The larger D's curve sits lower in every group, as predicted." if not bad else
               f"Here it does not in {', '.join(bad)}: at that N something besides S and P's traffic sets the ratio "
               "(the ablations below look inside).")
    return Markdown(f"Fused over materialised at {dims}, at the largest N every head dim reaches: {groups}. {verdict}")


# -- section 6: memory --------------------------------------------------------------------------------------------

@needs_lessons(many=True)
def memory(les: Lessons, dtype: str | None = None, causal: bool = False) -> list[pd.DataFrame]:
    """Section 6: per shape, the predicted size of S (= P) beside every build's measured peak allocation, and the
    builds whose peak is not what their name says they hold (peak_table); per removed boundary, the peak bytes it saved
    beside the S or P it stops holding (memory_table). Bytes readable."""
    g = report.split(les.results)[(dtype or les.dtypes[0], causal)]
    peaks = peak_table(g)
    wide = peaks.pivot_table(index=["D", "N", "B", "H"], columns="build", values="peak_bytes", aggfunc="first")
    wide = wide[list(dict.fromkeys(peaks["build"]))]
    wide.insert(0, "S or P (predicted)", peaks.groupby(["D", "N", "B", "H"])["s_bytes"].first())
    wide = wide.map(readable_bytes)
    wide.columns.name = "peak allocation"
    odd = peaks[(peaks["peak_over_hold"] < 1) | (peaks["peak_over_hold"] > 1.5) | (peaks["note"] != "")]
    odd = odd[["D", "N", "build", "holds", "peak_bytes", "hold_bytes", "peak_over_hold", "note"]]
    saved = memory_table(g)[["D", "N", "boundary", "tensor", "saved_bytes", "predicted_bytes", "saved_over_predicted",
                             "note"]]
    return [wide, readable(odd.reset_index(drop=True)), readable(saved)]


@needs_lessons(many=True)
def memory_details(les: Lessons, dtype: str | None = None, causal: bool = False) -> list:
    """memory's three tables folded (attnlab.lab.page), their notes said once beneath each."""
    wide, odd, saved = memory(les, dtype, causal)
    return [page.fold(wide, "Every build's peak allocation per shape, beside the predicted size of S (= P)"),
            page.noted(odd, fold="The builds whose peak is not what their name says they hold"),
            page.noted(saved, fold="Per removed boundary: the peak bytes it saved against the tensor it stops holding")]


@needs_lessons()
def memory_figure(les: Lessons, dtype: str | None = None, causal: bool = False):
    """Section 6's picture: every build's peak allocation against N beside what each of ours must hold
    (attnlab.report.figures.memory_figure), for one (dtype, causal) group of the lesson rows."""
    from attnlab.report.figures import memory_figure as fig

    return fig(report.split(les.results)[(dtype or les.dtypes[0], causal)])


def byte_model(run: Run) -> pd.DataFrame:
    """The byte model at this run's own shapes, true on any device: what each of our builds must hold and move
    (attnlab.cost), and what each removed boundary moves (attnlab.cost.boundary_bytes)."""
    rows = []
    for c in run_shapes(run):
        case = {b: measure.Case(b, c.B, c.H, c.Hkv, c.N, c.D, c.dtype, c.causal, run.device) for b in OURS}
        rows.append({"causal": c.causal, "D": c.D, "N": c.N, "B": c.B, "H": c.H,
                     "S or P": bd.nn_bytes(c.B, c.H, c.N, c.dtype),
                     **{f"{b} holds": cost.hold_bytes(case[b]) for b in OURS},
                     **{f"{b} moves": cost.bytes_moved(case[b]) for b in OURS},
                     **{f"{k} moves": bd.boundary_bytes(k, c.B, c.H, c.N, c.dtype, c.causal) for k in bd.BOUNDARIES}})
    t = pd.DataFrame(rows)
    return readable(t, [c for c in t.columns if c not in ("causal", "D", "N", "B", "H")])


# -- section 7: attribution by ablation ---------------------------------------------------------------------------
@needs_lessons()
def attribution(les: Lessons, dtype: str | None = None, causal: bool = False) -> pd.DataFrame:
    g = groups_of(les)[(dtype or les.dtypes[0], causal)]
    cols = ["D", "N", "boundary", "delta_ms", "bytes", "predicted_ms", "measured_over_predicted", "qk_passes",
            "qk_removed_ms", "measured_over_with_qk", "note"]
    return readable(report.attribution(g)[cols], ["bytes"])


@needs_lessons()
def attribution_figure(les: Lessons, dtype: str | None = None, causal: bool = False):
    return curves.attribution_figure(groups_of(les)[(dtype or les.dtypes[0], causal)])


@needs_lessons()
def ablations(les: Lessons, base: str = "fused", dtype: str | None = None, causal: bool = False) -> pd.DataFrame:
    g = groups_of(les)[(dtype or les.dtypes[0], causal)]
    cols = ["D", "N", "base_ms", "softmax_saving_ms", "pv_saving_ms", "mask_cost_ms", "noise_ms", "dominant", "note"]
    return ablation_table(g, base=base)[cols]


@needs_lessons()
def ablation_figure(les: Lessons, base: str = "fused", dtype: str | None = None, causal: bool = False):
    from attnlab.report.figures import ablation_figure as fig

    return fig(groups_of(les)[(dtype or les.dtypes[0], causal)], base=base)


@needs_lessons()
def dominant(les: Lessons) -> pd.DataFrame:
    """The dominant stage of each of our builds at every shape and causal value (ablation_table's `dominant`; '—'
    where no stage's saving clears the noise or another's)."""
    parts = []
    for (dtype, causal), g in groups_of(les).items():
        for base in OURS:
            if any(b.startswith(f"{base}-") for b in g["build"]):
                t = ablation_table(g, base=base)
                parts.append(t[["dtype", "causal", "D", "N", "base", "dominant"]])
    if not parts:
        return pd.DataFrame(columns=["dtype", "causal", "D", "N"])
    t = pd.concat(parts).replace({"dominant": {"": "—"}})
    return t.pivot_table(index=["dtype", "causal", "D", "N"], columns="base", values="dominant",
                         aggfunc="first")[[b for b in OURS if b in set(t["base"])]]


SMALL_SHARE = 0.05  # a stage whose removal saves less than this share of its build's time is a finding to explain
# On Hopper an SM does 4096 dense 16-bit matmul FLOPs a clock and 16 exponentials (its MUFU units): H100 SXM's 989
# TFLOP/s of matmul against 3.9 TFLOP/s of exponentials (FlashAttention-3, section 3). Warp-specialised (Gluon)
# kernels run only on Hopper here, so this ratio is read only beside them.
HOPPER_FLOPS_PER_EXP = 256


def _stage_rows(les: Lessons, base: str) -> pd.DataFrame:
    """attnlab.report.ablation.stage_savings over every (dtype, causal) group that ablates `base`."""
    from attnlab.report.ablation import stage_savings

    parts = [stage_savings(g, base=base) for g in groups_of(les).values()
             if any(b.startswith(f"{base}-") for b in g["build"])]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _n_list(ns, every) -> str:
    """N values as 'N = a–b' when they run unbroken through `every` (the N the group measured), else listed."""
    ns, every = sorted(set(ns)), sorted(set(every))
    i = every.index(ns[0])
    if len(ns) > 2 and every[i:i + len(ns)] == ns:
        return f"N = {ns[0]}–{ns[-1]}"
    return "N = " + ", ".join(str(n) for n in ns)


def _pct(x: float, digits: int = 0) -> str:
    """A share as a percent with `digits` decimals, never '-0%'."""
    return f"{round(x * 100, digits) + 0:.{digits}f}%"


def _share_range(shares, digits: int = 0) -> str:
    lo, hi = _pct(min(shares), digits), _pct(max(shares), digits)
    return lo if lo == hi else f"{lo} to {hi}"


def _why_small(stage: str, rows: pd.DataFrame, base: str) -> str:
    """Why a stage's removal saved little, as far as the rows support it: overlap is offered as the likely cause only
    where the kernel running the stage beside other stages is warp-specialised (its tiles say gluon)."""
    name = "PV" if stage == "pv" else stage
    kernel = rows["kernel"].iloc[0]
    kinds = set(rows["kernel_kind"])
    if not kernel:
        return (f"In {base} the {name} has a kernel of its own, with no other stage to run under, so these rows give "
                "no reason to read it as overlap.")
    if kinds == {"triton"}:
        return (f"The {kernel} kernel's tiles here say Triton, not a warp-specialised Gluon kernel, so these rows give "
                "no reason to read it as overlap.")
    if kinds != {"gluon"}:
        return (f"These rows record no tiles for the {kernel} kernel, so whether it is warp-specialised is unknown, "
                "and they give no reason to read it as overlap.")
    flops = rows["flop_share"].dropna()
    evidence = (f"its matmul is {_share_range(flops)} of {base}'s counted FLOPs, yet removing it saves less than "
                f"{SMALL_SHARE:.0%} of the time" if len(flops) else f"removing it saves less than {SMALL_SHARE:.0%}")
    return (f"Likely cause: the {name} runs under other work. The evidence: {evidence}; and the {kernel} kernel is "
            "warp-specialised (its tiles say gluon): a loader warp feeds consumer warpgroups whose matmuls run "
            "asynchronously on the tensor cores while the softmax runs on the CUDA cores, so one stage can run while "
            "another computes, off the critical path.")


def overlap_findings(les: Lessons, base: str = "fused") -> list[str]:
    """The ablations of `base` that saved less than SMALL_SHARE of its time or made it slower, one line per (stage,
    kind of kernel) naming the shapes, with why as far as the rows support it (_why_small)."""
    t = _stage_rows(les, base)
    if t.empty:
        return []
    t = t[t["share"].notna() & (t["share"] < SMALL_SHARE)]
    measured = {k: list(g["N"]) for k, g in groups_of(les).items()}
    out = []
    for (stage, _), rows in t.groupby(["stage", "kernel_kind"], sort=False):
        name = "PV" if stage == "pv" else stage
        where = "; ".join(f"{dt} {'causal' if c else 'non-causal'} D = {d} at {_n_list(g['N'], measured[(dt, c)])}"
                          for (dt, c, d), g in rows.groupby(["dtype", "causal", "D"], sort=False))
        slower = rows[rows["saving_ms"] < -rows["noise_ms"]]
        ran = (f"; in {len(slower)} of them it ran slower by more than the noise, so its stand-in costs more than "
               f"the {name} it replaces" if len(slower) else "")
        out.append(f"{name}, in {len(rows)} shape(s) ({where}): removing it saved {_share_range(rows['share'], 1)} "
                   f"of {base}'s time" + (" (negative: it ran slower)" if rows["share"].min() < 0 else "") + f"{ran}. "
                   + _why_small(stage, rows, base))
    return out


@needs_lessons()
def overlap(les: Lessons, base: str = "fused"):
    """overlap_findings as a list in the page, or the line that there are none."""
    from IPython.display import Markdown

    lines = overlap_findings(les, base)
    if not lines:
        return Markdown(f"No ablation of {base} saved less than {SMALL_SHARE:.0%} of its time or made it slower.")
    def item(line: str) -> str:  # the finding open, its likely cause and evidence one click away
        finding, cause, why = line.partition(" Likely cause:")
        return f"- {finding}" + (f" <details><summary>Likely cause, and the evidence</summary>Likely cause:{why}"
                                 "</details>" if cause else "")

    return Markdown(f"Ablations of {base} that saved less than {SMALL_SHARE:.0%} of its time or made it slower "
                    f"({les.label}):\n\n" + "\n".join(item(x) for x in lines))


@needs_lessons()
def pv_by_head_dim(les: Lessons, base: str = "fused"):
    """What removing PV saves at each head dim, from the rows, and why D changes it as far as they support: PV's
    FLOPs grow with D as QKᵀ's do, while the exponentials stay one per score, so at small D the softmax bounds a
    warp-specialised kernel and PV runs under it."""
    from IPython.display import Markdown

    t = _stage_rows(les, base)
    t = t[(t["stage"] == "pv") & t["share"].notna()] if not t.empty else t
    if t.empty:
        return Markdown(f"No row here removes PV from {base}.")
    by_d = {int(d): g for d, g in t.groupby("D")}
    med = {d: float(g["share"].median()) for d, g in by_d.items()}
    said = " and ".join(f"{_pct(med[d])} at D = {d} ({_share_range(g['share'])} over {len(g)} shapes)"
                        for d, g in by_d.items())
    text = (f"Removing PV saves a median {said} of {base}'s time"
            + (" (negative: the ablation ran slower)" if min(med.values()) < 0 else "") + f"; {les.label}.")
    dims = sorted(by_d)
    if len(dims) < 2:
        return Markdown(text + " This run measured one head dim, so it cannot show how D changes the saving.")
    if not all(med[a] < med[b] for a, b in zip(dims, dims[1:])) or med[dims[-1]] - med[dims[0]] < SMALL_SHARE:
        return Markdown(text + f" The saving does not grow with D by {SMALL_SHARE:.0%} or more in these rows.")
    per = " and ".join(f"one per {4 * d} matmul FLOPs at D = {d}" for d in dims)
    text += f" Why D changes it: QKᵀ and PV do 4·N²·D FLOPs a head against N² exponentials, {per}."
    if set(t["kernel_kind"]) != {"gluon"}:
        return Markdown(text + f" Not every {base} kernel here records Gluon tiles (warp-specialised), so these rows "
                               "give no reason to read the small saving as PV hidden under the softmax.")
    ratio = " and ".join(f"{4 * d / HOPPER_FLOPS_PER_EXP:g}× its exponential's time at D = {d}" for d in dims)
    return Markdown(text + f" A Hopper SM does {HOPPER_FLOPS_PER_EXP} 16-bit matmul FLOPs in one MUFU exponential's "
                           f"time, so a score's matmuls take {ratio}: near 1× the softmax is the likely bound, and "
                           f"{base}'s warp-specialised kernel (its tiles say gluon) runs PV under it; as D grows, "
                           "PV's time shows.")


# -- section 8: roofline ------------------------------------------------------------------------------------------

@needs_lessons(many=True)
def roofline_figures(les: Lessons) -> list:
    return [roofline.roofline_figure(les.results, dt) for dt in les.dtypes]


@needs_lessons()
def roofline_table(les: Lessons) -> pd.DataFrame:
    t = pd.concat([roofline.roofline_table(les.results, dt) for dt in les.dtypes], ignore_index=True)
    return t.groupby(["dtype", "causal", "build"])["share_of_roof"].median().unstack("build").round(2)


# -- section 10: how a benchmark lies -----------------------------------------------------------------------------

LIES = ("dead_output", "compile_rewrite", "recompile_limit", "mixed_ratio", "launch_overhead")


def lie(name: str, run: Run, les: Lessons | None = None) -> list:
    """Section 10: one demonstration of attnlab.lies, as its prose and its evidence table; the lies that need GPU
    rows read `les` (lessons(run) unless given)."""
    from attnlab import lies

    if name not in LIES:
        raise ValueError(f"name must be one of {', '.join(LIES)}, got {name!r}")
    les = les or lessons(run)
    if name == "dead_output":
        demo = lies.dead_output(run.device)
    elif name == "compile_rewrite":
        demo = lies.compile_rewrite(run.device)
    elif name == "recompile_limit":
        demo = lies.recompile_limit()
    elif les is None:
        return [no_lessons()]
    elif name == "mixed_ratio":
        demo = lies.mixed_ratio(les.results, les.label)
    else:
        demo = lies.launch_overhead(run.device, les.results, les.label)
    return lie_outputs(demo)


OPEN_SENTENCES = 1  # of a lie's text on the page; the rest is folded with its guard and evidence


def lie_outputs(demo) -> list:
    """A demonstration on the page: its title, where it ran and the lie's first OPEN_SENTENCES sentences open; the
    rest of it, the guard that catches it and the evidence table folded beneath (attnlab.lab.page)."""
    from IPython.display import Markdown

    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z*`(])", demo.lie.strip())
    shown, rest = " ".join(sentences[:OPEN_SENTENCES]), " ".join(sentences[OPEN_SENTENCES:])
    more = f"<p>{page.inline_markdown(rest)}</p>" if rest else ""
    return [Markdown(f"### {demo.title}\n\n*Where:* {demo.where}.\n\n**The lie.** {shown}"),
            page.Folded(demo.evidence, "More of the lie, the guard that catches it, and the evidence" if rest else
                        "The guard that catches it, and the evidence",
                        before_html=f"{more}<p><b>The guard.</b> {page.inline_markdown(demo.guard)}</p>")]
