"""Pure functions from a results table (attnlab.schema) to the lab's tables; no I/O, no plotting.

Every table takes one (dtype, causal) group — `split(results)` makes them — and refuses a frame that mixes dtypes
or causal values. Missing numbers are NaN with the reason in a `note` column.

    speedup(group, baseline, builds)   baseline ms / build ms, in a column named for the baseline
    attribution(group)                 Δ per removed boundary (S, P round trips) vs its bytes at copy bandwidth
    ablation_table(group, base)        what removing softmax or PV saves; the dominant stage; the mask's cost
    causal_saving(one_dtype, build)    a build's non-causal and causal times and their difference (never a ratio)
    memory_table(group)                peak bytes each step saves vs the S or P it stops holding
"""
from attnlab.report.ablation import ablation_table, causal_saving
from attnlab.report.boundary_time import attribution
from attnlab.report.groups import split
from attnlab.report.memory import memory_table
from attnlab.report.ratios import speedup

__all__ = ["split", "speedup", "attribution", "ablation_table", "causal_saving", "memory_table"]
