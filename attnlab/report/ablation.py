"""Which stage dominates a build, found by removing it: after fusion there are no stages left to time apart.

Each ablation (attnlab.builds.ABLATIONS) is the same kernel with one stage changed, still consuming its output:

    no_softmax  softmax replaced by a copy: saves the max/exp/normalise arithmetic (and, in qk_softmax, its first pass
                over K); the bytes of S and P still move
    no_pv       PV contraction dropped, V never read: saves the matmul and the V reads; P is still read
    zero_mask   an all-zero additive (N, N) mask loaded and applied: *adds* the mask stage, so its difference from the
                unmasked base is what applying a mask costs — loading the mask tile and adding it to every live score
                (qk_softmax loads it in each of its two passes, while P's writes stream through L2). In a causal
                group both rows are causal, so it is the mask cost on the tiles a causal build visits.

The dominant stage of a shape is the one whose removal saves the most time; the mask is not a candidate (it is not a
stage of the base program). `stage_savings` gives the same savings one row per (shape, stage), with what a reader
needs to judge a small one: the stage's share of the base's counted FLOPs, and the kernel that runs the stage beside
other work, Gluon (warp-specialised: a loader warp and consumer warpgroups, the matmuls issued asynchronously, so one
stage can run while another computes) or Triton, as the base row's recorded tiles say. What stays when both are removed (QKᵀ, the memory round trips) is not ablated here: see
attnlab.report.boundary_time. `causal_saving` puts a build's causal and non-causal rows side by side as a difference
of times, never a ratio.
"""
from __future__ import annotations

import math

import pandas as pd

from attnlab import cost, schema
from attnlab.report import groups

OURS = ("materialised", "qk_softmax", "fused")
STAGES = {"softmax": "no_softmax", "pv": "no_pv"}  # stage → the ablation that removes it
VARIANTS = ("no_softmax", "no_pv", "zero_mask")  # every ablation of a base (attnlab.builds.ABLATIONS)
# Removing one stage saves at most about a third of a build's time at the lab's shapes: an ablation that runs in
# under this share of its base's time has lost more than its stage, e.g. an output nobody consumed.
DROPPED_SHARE = 0.25

COLUMNS = {
    "base": "the build ablated",
    "base_ms": "the base build's median ms",
    "no_softmax_ms": "with softmax replaced by a copy", "no_pv_ms": "with the PV contraction dropped",
    "zero_mask_ms": "with an all-zero additive mask applied",
    "softmax_saving_ms": "base_ms − no_softmax_ms: the time the softmax arithmetic costs",
    "pv_saving_ms": "base_ms − no_pv_ms: the time the PV contraction (and reading V) costs",
    "mask_cost_ms": "zero_mask_ms − base_ms: the time loading and applying an additive mask costs",
    "noise_ms": "the smallest difference read as real (attnlab.report.groups.noise_ms)",
    "dominant": "the stage whose removal saves the most, by more than noise_ms ('softmax' or 'pv'; '' when none "
                "does, and the note says why)",
    "note": "why a number is NaN or dominant is ''",
}

CAUSAL_MEASURES = {
    "fused": "the key tiles past the diagonal are skipped (half the QKᵀ and PV work), less the per-element causal "
             "mask on the diagonal tiles",
    "qk_softmax": "half the QKᵀ work (both passes) and half the PV work and P reads are skipped, less the diagonal "
                  "tiles' mask; P is still written in full (zeros past the diagonal)",
    "materialised": "half the QKᵀ and PV work and P reads are skipped; S and P are still written in full and the "
                    "softmax still reads all of S",
}
_LIBRARY_MEASURES = "whatever this implementation skips for the masked half, less what applying the mask costs"


def ablation_table(results: pd.DataFrame, base: str = "fused") -> pd.DataFrame:
    """One row per shape of one (dtype, causal) group: what removing each stage of `base` saves, and which dominates."""
    if base not in OURS:
        raise ValueError(f"base must be one of {', '.join(OURS)}, got {base!r}")
    dtype, causal = groups.one_group(results, ("ms",))
    found = groups.cases(results)
    rows = []
    for shape in groups.shapes(results):
        base_ms, why = groups.value(found, base, shape)
        ms, whys = {}, [why]
        for ablation in VARIANTS:
            ms[ablation], why = groups.value(found, f"{base}-{ablation}", shape)
            whys.append(why)
        saving = {stage: base_ms - ms[ab] for stage, ab in STAGES.items()}
        noise = groups.noise_ms(found, [base, *(f"{base}-{ab}" for ab in STAGES.values())], shape, base_ms)
        dominant, why = _dominant(saving, noise)
        whys += [f"{base}-{ab} ran in {ms[ab] / base_ms:.0%} of {base}'s time: more than removing one stage can save; "
                 "check that its output is consumed (work a compiler dropped looks like this)"
                 for ab in ms if ms[ab] < DROPPED_SHARE * base_ms]
        whys += [_slower(base, ab, stage, -saving[stage]) for stage, ab in STAGES.items() if saving[stage] < -noise]
        rows.append({
            **groups.leading(dtype, causal, shape), "base": base, "base_ms": base_ms,
            **{f"{ab}_ms": v for ab, v in ms.items()},
            **{f"{stage}_saving_ms": v for stage, v in saving.items()},
            "mask_cost_ms": ms["zero_mask"] - base_ms,
            "noise_ms": noise,
            "dominant": dominant,
            "note": groups.notes(*whys, why, groups.same_code(found, [base, *(f"{base}-{a}" for a in ms)], shape),
                                 groups.same_clock(found, [base, *(f"{base}-{a}" for a in ms)], shape),
                                 *_other_tiles(found, base, shape)),
        })
    return pd.DataFrame(rows, columns=[*groups.LEADING, *COLUMNS])


def _slower(base: str, ablation: str, stage: str, extra_ms: float) -> str:
    """The note for an ablation slower than its base by extra_ms. base − ablation is the stage's cost less its
    stand-in's, so a negative saving bounds the stage from one side only: it costs at least extra_ms less than the
    stand-in. The stand-in is not timed alone, so nothing bounds the stage's own cost from above."""
    return (f"{ablation} ran {extra_ms:.3g} ms slower than {base}: its stand-in costs more than the {stage} it "
            f"replaces, so the {stage} costs at least {extra_ms:.3g} ms less than the stand-in; what the {stage} "
            "itself costs this row does not bound")


# The kernel that runs a stage beside other stages, per base: fused runs both in one kernel, qk_softmax its softmax
# in its P kernel (beside QKᵀ and P's stores). A stage not named here has a kernel of its own (qk_softmax's PV,
# materialised's softmax and PV), where no other stage can hide it.
STAGE_KERNEL = {"fused": {"softmax": "fused", "pv": "fused"}, "qk_softmax": {"softmax": "qk_softmax"}}

STAGE_COLUMNS = {
    "base": "the build ablated", "stage": "the stage removed ('softmax' or 'pv')",
    "base_ms": "the base build's median ms", "saving_ms": "base_ms − the ablation's ms (negative: it ran slower)",
    "share": "saving_ms / base_ms", "noise_ms": "the smallest difference read as real (groups.noise_ms)",
    "flop_share": "the stage's matmul FLOPs over the base row's counted FLOPs (pv: one N×N×D product; NaN for the "
                  "softmax, whose arithmetic the count leaves out, or where the row has no FLOP count)",
    "kernel": "the kernel that runs the stage beside other stages ('' where it has a kernel of its own)",
    "kernel_kind": "'gluon' (warp-specialised) or 'triton', from the base row's recorded tiles; '' where unrecorded",
}


def stage_savings(results: pd.DataFrame, base: str = "fused") -> pd.DataFrame:
    """One row per (shape, stage) of one (dtype, causal) group: ablation_table's savings, with the stage's FLOP share
    and the kind of kernel that runs it (STAGE_COLUMNS)."""
    t = ablation_table(results, base=base)
    dtype, causal = groups.one_group(results, ("ms",))
    found = groups.cases(results)
    rows = []
    for r in t.to_dict("records"):
        shape = tuple(int(r[c]) for c in groups.SHAPE)
        row = found.get((base, shape))
        flops = float(row.get("flops", math.nan)) if row is not None else math.nan
        for stage in STAGES:
            kernel = STAGE_KERNEL.get(base, {}).get(stage, "")
            kind = schema.kernel_label(row.get("tiles"), kernel) if kernel and row is not None else ""
            stage_flops = cost.qk_pass_flops(*shape[:2], *shape[3:], causal) if stage == "pv" else math.nan
            rows.append({**groups.leading(dtype, causal, shape), "base": base, "stage": stage,
                         "base_ms": r["base_ms"], "saving_ms": r[f"{stage}_saving_ms"],
                         "share": r[f"{stage}_saving_ms"] / r["base_ms"], "noise_ms": r["noise_ms"],
                         "flop_share": stage_flops / flops if flops > 0 else math.nan,
                         "kernel": kernel, "kernel_kind": kind})
    return pd.DataFrame(rows, columns=[*groups.LEADING, *STAGE_COLUMNS])


def _other_tiles(found: dict, base: str, shape: tuple) -> list[str]:
    """Notes for ablations that ran with other tiles than their base: then the difference mixes the removed stage
    with a change of kernel configuration (on the H200 a mask once needed other tiles to fit shared memory)."""
    row = found.get((base, shape))
    if row is None or not str(row.get("tiles", "")):
        return []
    out = []
    for ablation in VARIANTS:
        other = found.get((f"{base}-{ablation}", shape))
        if other is not None and str(other.get("tiles", "")) not in ("", str(row["tiles"])):
            out.append(f"{base}-{ablation} ran other tiles than {base} ({other['tiles']} vs {row['tiles']}): its "
                       "difference mixes the stage with a change of kernel configuration")
    return out


def _dominant(saving: dict[str, float], noise: float = 0.0) -> tuple[str, str]:
    """The stage saving the most by more than `noise`, or '' and why: a partial set of ablations proves nothing
    about dominance, and neither does a difference the same case could show timed twice."""
    if any(math.isnan(v) for v in saving.values()):
        return "", "dominant unknown: an ablation or the base is missing"
    ranked = sorted(saving.items(), key=lambda kv: kv[1], reverse=True)
    (top, best), (other, second) = ranked[0], ranked[1]
    if best <= 0:
        return "", "no ablation saves time"
    if best <= noise:
        return "", (f"no stage dominates measurably: the largest saving ({top}, {best:.3g} ms) is within the noise "
                    f"({noise:.3g} ms); the time is in what no ablation removes (QKᵀ, the memory round trips)")
    if best - second <= noise:
        return "", (f"tie between {top} and {other}: their savings differ by {best - second:.3g} ms, within the "
                    f"noise ({noise:.3g} ms)")
    return top, ""


def causal_saving(results: pd.DataFrame, build: str = "fused") -> pd.DataFrame:
    """One row per shape of one dtype: `build`'s non-causal and causal ms and their difference, with what it measures.

    The two rows do different work, so this is a difference in time, deliberately never a ratio.
    """
    groups.require(results, ("dtype", "causal", "build", "status", "ms", *groups.SHAPE))
    dtypes = sorted(results["dtype"].astype(str).unique())
    if len(dtypes) != 1:
        raise ValueError(f"causal_saving takes one dtype, got {dtypes}: select one first")
    by_causal = {c: groups.cases(g) for c, g in results.groupby("causal")}
    rows = []
    for shape in groups.shapes(results):
        got = {c: groups.value(by_causal.get(c, {}), build, shape, role="causal" if c else "non-causal")
               for c in (False, True)}
        rows.append({
            "dtype": dtypes[0], **dict(zip(groups.SHAPE, shape)), "build": build,
            "noncausal_ms": got[False][0], "causal_ms": got[True][0],
            "saved_ms": got[False][0] - got[True][0],
            "measures": CAUSAL_MEASURES.get(build, _LIBRARY_MEASURES),
            "note": groups.notes(got[False][1], got[True][1]),
        })
    columns = ["dtype", *groups.LEADING[2:], "build", "noncausal_ms", "causal_ms", "saved_ms", "measures", "note"]
    return pd.DataFrame(rows, columns=columns)
