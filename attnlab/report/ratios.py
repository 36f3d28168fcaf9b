"""How much faster each build is than a named baseline, within one (dtype, causal) group.

Times are net of the consumption step (ms − consume_ms: every timed call also sums its output, which would pull
every ratio towards 1). The ratio is baseline ms / build ms (above 1: faster than the baseline) and its column is named for the baseline,
`x_vs_<baseline>`. Where the baseline has no ok time at a shape (OOM, unsupported, not measured) the ratio is NaN
and the note says so; no other build stands in for it.
"""
from __future__ import annotations

import math

import pandas as pd

from attnlab.report import groups


def speedup(results: pd.DataFrame, baseline: str = "materialised", builds=None) -> pd.DataFrame:
    """One row per (shape, build) of one group: ms, the baseline's ms and `x_vs_<baseline>`, with a note.

    `builds` defaults to every non-ablation build in the group, in the order the results list them.
    """
    dtype, causal = groups.one_group(results, ("ms", "family"))
    if builds is None:
        builds = list(dict.fromkeys(results.loc[results["family"] != "ablation", "build"]))
    builds = list(builds)
    present = set(results["build"])
    absent = [b for b in [baseline, *builds] if b not in present]
    if absent:  # a typo would otherwise give a table of NaN
        raise ValueError(f"build(s) {absent} have no rows in this group; it has {sorted(present)}")
    found = groups.cases(results)
    ratio = f"x_vs_{baseline}"
    rows = []
    for shape in groups.shapes(results):
        base_ms, why_base = groups.net_ms(found, baseline, shape, role="baseline")
        for build in builds:
            ms, why = groups.net_ms(found, build, shape)
            rows.append({**groups.leading(dtype, causal, shape), "build": build, "ms": ms,
                         f"{baseline}_ms": base_ms, ratio: base_ms / ms if ms > 0 else math.nan,
                         "note": groups.notes(why_base, why, groups.same_code(found, (baseline, build), shape),
                                              groups.same_clock(found, (baseline, build), shape))})
    return pd.DataFrame(rows, columns=[*groups.LEADING, "build", "ms", f"{baseline}_ms", ratio, "note"])
