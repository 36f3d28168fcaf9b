"""Per-kernel times of one call, from the profiler — and why there are none for the stages inside `fused`.

    kernel_times(build, q, k, v, causal=False)  -> {kernel name: ms}   (CUDA; torch.profiler's device events)
    stage_table(kernel_ms, build)               -> DataFrame: stage, kernel, ms, share

`materialised` launches three kernels (scores → S, softmax S → P, P V) and `qk_softmax` two (QKᵀ + softmax → P, P V),
so a profiler can time their stages apart. `fused` is one kernel: the profiler sees its total and nothing inside it.
Reading "stage times" for it from anywhere (a profiler, in-kernel clocks, a guess from the materialised build)
would be a lie the lab refuses: `stage_table` raises StagesNotSeparable for it and for its ablations, and names the
honest route — the ablation table (attnlab.report.ablation_table), which times the program with one stage removed.
"""
from __future__ import annotations

import pandas as pd
import torch

# the kernels (as Triton names them) of each stage, per build; the order is the order of launch. qk_softmax's P
# stage is a Gluon kernel where one runs (sm90, D = 64 or 128, 16-bit): the two-pass one, or the one-pass one
# (attnlab.triton.hopper.qk_softmax_row, Tiles.one_pass) where a row of N ≤ ROW_MAX keys fits on chip; the Triton kernel
# elsewhere; or the two-pass Gluon kernel and the Triton one: under Tiles.fixed_reference the Triton kernel then
# re-writes the blocks of the rows the Gluon kernel flagged. The PV stage is one PV kernel or the other
# (attnlab.triton.hopper.pv where a Gluon entry takes the case, attnlab.triton.pv else). Every kernel attnlab.triton
# defines is either in this table or in UNSTAGED (tests/test_profiler.py holds that).
STAGES = {
    "materialised": [(("scores_kernel",), "S = scale·QKᵀ (+mask), written to memory"),
                     (("softmax_kernel",), "P = softmax(S), S read and P written"),
                     (("pv_gluon_kernel", "pv_kernel"), "O = P V, P read")],
    "qk_softmax": [(("qk_softmax_gluon_kernel", "qk_softmax_row_kernel", "qk_softmax_kernel"),
                    "P = softmax(scale·QKᵀ + mask) (two QKᵀ passes, or one where a row fits on chip), P written"),
                   (("pv_gluon_kernel", "pv_kernel"), "O = P V, P read")],
}
# the kernels that run a whole build in one launch: no stage of theirs can be timed apart (stage_table refuses them)
UNSTAGED = ("fused_kernel", "fused_gluon_kernel")
# the backward pass's kernels (attnlab.triton.backward, attnlab.triton.fused_backward): a forward call launches none
BACKWARD = ("delta_kernel", "dq_kernel", "ds_kernel", "dkdv_kernel", "transposed_kernel")


class StagesNotSeparable(ValueError):
    """The build runs its stages inside one kernel: no profiler can time them apart."""


def stage_table(kernel_ms: dict, build: str) -> pd.DataFrame:
    """One row per stage of `build` from its kernels' times (ms): stage, kernel, ms, share of the call."""
    base, _, ablation = build.partition("-")
    if base == "fused":
        raise StagesNotSeparable(
            f"{build} runs softmax and both matmuls inside one kernel: a profiler sees only its total, so it has no "
            "stage times; measure what each stage costs by removing it (attnlab.report.ablation_table)")
    if base not in STAGES or ablation:  # an ablation's kernels are not the stages these labels name
        raise ValueError(f"build must be one of our staged builds {sorted(STAGES)} (not an ablation; fused has no "
                         f"stage times), got {build!r}")
    missing = [" or ".join(names) for names, _ in STAGES[base] if not any(k in kernel_ms for k in names)]
    if missing:
        raise ValueError(f"kernel_ms lacks {', '.join(missing)} for {build}: got {sorted(kernel_ms)}")
    rows = [dict(stage=stage, kernel=" + ".join(k for k in names if k in kernel_ms),
                 ms=sum(float(kernel_ms[k]) for k in names if k in kernel_ms)) for names, stage in STAGES[base]]
    df = pd.DataFrame(rows)
    df["share"] = df.ms / df.ms.sum()
    return df


def kernel_times(build: str, q, k, v, *, causal: bool = False, calls: int = 10) -> dict:
    """Mean device ms per call of each kernel `build` launches, from torch.profiler's CUDA events (after one
    warm-up call). Library kernels are listed too, under their own names."""
    if q.device.type != "cuda":
        raise ValueError(f"kernel_times needs CUDA tensors (the profiler times device kernels), got {q.device}")
    from torch.profiler import ProfilerActivity, profile

    from attnlab import builds

    b = builds.get(build)
    b.attend(q, k, v, causal=causal)
    torch.cuda.synchronize(q.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            b.attend(q, k, v, causal=causal)
        torch.cuda.synchronize(q.device)
    totals: dict = {}
    for e in prof.events():  # kernels only: a CPU-side op's device time would count its kernels a second time
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        totals[e.name] = totals.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3 / calls  # the kernel's span
    return totals
