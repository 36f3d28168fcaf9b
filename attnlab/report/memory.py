"""The IO argument in bytes: the peak allocation each fusion step saves, next to the S or P it stops holding.

materialised holds S and P at once (S is freed only once P exists), qk_softmax holds P, fused holds neither
(attnlab.builds), so the peak difference between adjacent builds should be one (B, H, N, N) tensor in the input
dtype — B·H·N²·itemsize (attnlab.cost.nn_bytes). Off by more than allocator rounding means a build
holds something its name says it does not.

    memory_table(group)   per removed boundary: the peak bytes saved beside the S or P it stops holding
    peak_table(group)     per build: its peak beside the S and P bytes and the hold its name predicts
"""
from __future__ import annotations

import math

import pandas as pd

from attnlab import cost as bd
from attnlab.report import groups

HELD = {"S round trip": "S", "P round trip": "P"}  # the tensor a step stops holding

COLUMNS = {
    **groups.STEP_COLUMNS,
    "from_peak_bytes": "from_build's peak allocation", "to_peak_bytes": "to_build's peak allocation",
    "saved_bytes": "from_peak_bytes − to_peak_bytes, measured",
    "tensor": "the tensor the step stops holding, S or P",
    "predicted_bytes": "the peak bytes the step should save: S − O for the S step (materialised frees S before O "
                       "exists, qk_softmax holds O beside P), P for the P step (attnlab.cost.held_saving)",
    "saved_over_predicted": "saved_bytes / predicted_bytes",
    "note": "why a number is NaN (on a CPU, peak allocation is unknown), and any alloc_flag the rows carry",
}


def _flags(found: dict, builds, shape: tuple) -> list[str]:
    """The measurement's own warnings (alloc_flag: peak below what the build must hold) for these rows."""
    flags = []
    for b in builds:
        flag = found[(b, shape)].get("alloc_flag", "") if (b, shape) in found else ""
        if isinstance(flag, str) and flag:
            flags.append(f"{b}: {flag}")
    return flags


def memory_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (shape, boundary) of one (dtype, causal) group: peak bytes saved vs the S or P size."""
    dtype, causal = groups.one_group(results, ("peak_bytes",))
    found = groups.cases(results)
    rows = []
    for shape in groups.shapes(results):
        B, H, _, N, D = shape
        for boundary, (src, dst) in bd.BOUNDARIES.items():
            predicted = bd.held_saving(boundary, B, H, N, D, dtype)
            from_peak, why_from = groups.value(found, src, shape, "peak_bytes")
            to_peak, why_to = groups.value(found, dst, shape, "peak_bytes")
            saved = from_peak - to_peak
            # the S step keeps O where it drops S: at N ≤ D that is no saving at all, and a ratio to it means nothing
            none = (f"no saving predicted at {groups.where(shape)}: the {HELD[boundary]} this step stops holding is "
                    "no larger than the O it keeps (N ≤ D)") if predicted <= 0 else ""
            rows.append({
                **groups.leading(dtype, causal, shape), "boundary": boundary, "from_build": src, "to_build": dst,
                "from_peak_bytes": from_peak, "to_peak_bytes": to_peak, "saved_bytes": saved,
                "tensor": HELD[boundary], "predicted_bytes": predicted,
                "saved_over_predicted": saved / predicted if predicted > 0 else math.nan,
                "note": groups.notes(why_from, why_to, none, *_flags(found, (src, dst), shape)),
            })
    return pd.DataFrame(rows, columns=[*groups.LEADING, *COLUMNS])


PEAK_COLUMNS = {
    "build": "the build", "holds": "the (B, H, N, N) tensors it must hold at once: 'S+P', 'P' or 'none'",
    "peak_bytes": "peak allocation of one call, measured (NaN where unknowable: a CPU has no allocator statistics)",
    "hold_bytes": "the bytes it must hold at once, predicted (attnlab.cost.hold_bytes)",
    "s_bytes": "size of S, B·H·N²·itemsize, predicted", "p_bytes": "size of P (the same size as S), predicted",
    "peak_over_hold": "peak_bytes / hold_bytes: below 1 the build held less than its name says",
    "note": "why peak_bytes is NaN; any alloc_flag the row carries",
}


def peak_table(results: pd.DataFrame, builds=None) -> pd.DataFrame:
    """One row per (shape, build) of one (dtype, causal) group: the peak allocation measured beside the S and P bytes
    and the hold the build's name predicts. `builds` defaults to every non-ablation build, in the results' order."""
    dtype, causal = groups.one_group(results, ("peak_bytes", "hold_bytes", "family"))
    if builds is None:
        builds = list(dict.fromkeys(results.loc[results["family"] != "ablation", "build"]))
    from attnlab import builds as table  # the build's name says what it holds

    found = groups.cases(results)
    rows = []
    for shape in groups.shapes(results):
        B, H, _, N, D = shape
        size = bd.nn_bytes(B, H, N, dtype)
        for build in builds:
            if (build, shape) not in found:
                continue
            peak, why = groups.value(found, build, shape, "peak_bytes")
            hold = int(found[(build, shape)]["hold_bytes"])
            rows.append({**groups.leading(dtype, causal, shape), "build": build, "holds": table.get(build).holds,
                         "peak_bytes": peak, "hold_bytes": hold, "s_bytes": size, "p_bytes": size,
                         "peak_over_hold": peak / hold if hold > 0 else math.nan,
                         "note": groups.notes(why, *_flags(found, (build,), shape))})
    return pd.DataFrame(rows, columns=[*groups.LEADING, *PEAK_COLUMNS])
