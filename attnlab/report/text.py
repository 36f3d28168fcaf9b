"""Every table of a results table as plain text, one (dtype, causal) group at a time: what `attnlab report` prints.

Pure: results in, a string out. Ablation tables appear only for bases whose ablations were measured.
"""
from __future__ import annotations

import pandas as pd

from attnlab.report.ablation import ablation_table, causal_saving
from attnlab.report.boundary_time import attribution
from attnlab.report.groups import split
from attnlab.report.memory import memory_table
from attnlab.report.ratios import speedup

WIDE = {"display.width": 250, "display.max_columns": 40, "display.max_rows": 1000, "display.max_colwidth": 70}


def _fmt(x) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _section(title: str, table: pd.DataFrame) -> str:
    with pd.option_context(*[kv for item in WIDE.items() for kv in item]):
        return f"## {title}\n\n{table.to_string(index=False, float_format=_fmt)}\n"


def figures(results: pd.DataFrame, baseline: str = "materialised") -> list:
    """Every figure of attnlab.report.figures the results can draw, group by group."""
    from attnlab.report import figures as fg

    out, measured = [], set(results["build"])
    for _, group in split(results).items():
        out.append(fg.speedup_figure(group, baseline=baseline))
        if group["peak_bytes"].notna().any():  # a CPU run measures no peak allocation
            out.append(fg.memory_figure(group))
        out += [fg.ablation_figure(group, base=b) for b in ("fused", "qk_softmax", "materialised")
                if any(n.startswith(f"{b}-") for n in measured)]
    return out


def render(results: pd.DataFrame, baseline: str = "materialised") -> str:
    out = []
    measured = set(results["build"])
    for (dtype, causal), group in split(results).items():
        head = f"{dtype}, {'causal' if causal else 'non-causal'}"
        out.append(f"# {head}\n")
        out.append(_section(f"speedup over {baseline} ({head})", speedup(group, baseline=baseline)))
        if {"materialised", "qk_softmax", "fused"} <= measured:
            out.append(_section(f"attribution: time per boundary removed vs its bytes ({head})", attribution(group)))
            out.append(_section(f"peak memory per boundary removed ({head})", memory_table(group)))
        for base in ("fused", "qk_softmax", "materialised"):
            if any(b.startswith(f"{base}-") for b in measured):
                out.append(_section(f"ablations of {base}: what removing each stage saves ({head})",
                                    ablation_table(group, base=base)))
    for dtype, one in results.groupby("dtype", sort=True):
        if one["causal"].nunique() < 2:
            continue
        for build in ("fused", "qk_softmax", "materialised"):
            if build in measured:
                out.append(_section(f"what causal masking saves {build} ({dtype}; a difference, never a ratio)",
                                    causal_saving(one, build)))
    return "\n".join(out)
