"""Section 9, the profiler view: two builds under torch.profiler at one shape of the run, the kernels (or on a CPU the
operators) each one runs, and the kernel table's refusal to time fused's stages."""
from __future__ import annotations

import warnings

import pandas as pd
import torch

from attnlab import builds, measure
from attnlab.lab.run import Run, run_shapes
from attnlab.lab.source import relative_path

def _kernels():
    """The profiler module, loaded when the profiler view runs (torch.profiler is slow to import)."""
    from attnlab import profiler

    return profiler


def profile_shape(run: Run) -> measure.Case:
    """The shape the profiler view uses: the run's D of the first head dim, non-causal where measured, and the
    largest N up to 4096 (big enough for S and P to matter, small enough to profile in a second)."""
    shapes = [c for c in run_shapes(run) if c.N <= 4096] or run_shapes(run)
    shapes.sort(key=lambda c: (c.causal, c.D, -c.N))
    return shapes[0]


def profile(run: Run, builds_: tuple = ("materialised", "fused"), calls: int = 3) -> dict:
    """Section 9: each build at profile_shape under torch.profiler, a trace saved per build in the run's folder (open
    it in Perfetto or chrome://tracing), and the table of what the profiler saw. On a GPU: the device kernels each
    build launches, ms per call (attnlab's kernel table, kernel_times), and the stage table of a build whose stages
    are separate kernels. On a CPU our Triton kernels run in the interpreter, whose trace is Python: the CPU view
    profiles torch's own materialised form (torch_eager: matmul, softmax, matmul) beside SDPA's one fused operator
    instead, and says so."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from attnlab import lies

    case = profile_shape(run)
    if not run.gpu:
        builds_ = ("torch_eager", "sdpa_default")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.gpu else [])
    q, k, v = measure.make_inputs(measure.Case(builds_[0], case.B, case.H, case.Hkv, case.N, case.D, case.dtype,
                                               case.causal, run.device))
    dev = torch.device(run.device)
    out = {"case": case, "tables": {}, "traces": {}, "stages": {}, "device": "cuda" if run.gpu else "cpu"}
    with warnings.catch_warnings():
        # torch's profiler warns once per process, as a profiling session starts, that it "clears events at the
        # end of each cycle". Each session here has no schedule, so one cycle, read whole when it
        # ends: the warning says nothing about these numbers, and it would print on the page.
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events", category=UserWarning)
        for name in builds_:
            attend = builds.get(name).attend
            attend(q, k, v, causal=case.causal)  # compiled and warm before the profiler starts
            measure.sync(dev)
            with lies.quiet_stderr(), torch_profile(activities=activities) as prof:
                for _ in range(calls):
                    attend(q, k, v, causal=case.causal)
                measure.sync(dev)
            trace = run.out / f"trace_{name}.json"
            prof.export_chrome_trace(str(trace))
            out["traces"][name] = trace
            if run.gpu:
                kernel_ms = _kernels().kernel_times(name, q, k, v, causal=case.causal, calls=calls)
                out["tables"][name] = _shares(pd.DataFrame({"name": list(kernel_ms), "ms_per_call": list(
                    kernel_ms.values())}))
                if name in _kernels().STAGES:
                    try:
                        out["stages"][name] = _kernels().stage_table(kernel_ms, name)
                    except ValueError as e:  # kernels the stage table does not name: say so, keep the kernel table
                        out["stages"][name] = f"no stage table: {e}"
            else:
                out["tables"][name] = _cpu_ops(prof, calls)
    return out


def _shares(t: pd.DataFrame) -> pd.DataFrame:
    t = t.sort_values("ms_per_call", ascending=False).reset_index(drop=True)
    t["share"] = t["ms_per_call"] / t["ms_per_call"].sum() if len(t) else []
    return t


def _cpu_ops(prof, calls: int) -> pd.DataFrame:
    """torch's CPU operators the profiler saw, each with its own (self) time per call."""
    rows = [{"name": e.key, "calls_per_call": e.count / calls, "ms_per_call": e.self_cpu_time_total / 1e3 / calls}
            for e in prof.key_averages() if e.key.startswith("aten::") and e.self_cpu_time_total > 0]
    return _shares(pd.DataFrame(rows, columns=["name", "calls_per_call", "ms_per_call"]))


def profile_report(prof: dict) -> list:
    """Section 9's outputs in order: what was profiled, each build's table (with the stage table of a staged build on
    a GPU), the refusal of stage times for fused, and where the traces are."""
    from IPython.display import Markdown

    c = prof["case"]
    shape = f"B = {c.B}, H = {c.H}, N = {c.N}, D = {c.D}, {c.dtype}, {'causal' if c.causal else 'non-causal'}"
    traces = ", ".join(f"`{relative_path(t)}`" for t in prof["traces"].values())
    out = []
    if prof["device"] == "cuda":
        out.append(Markdown(f"torch.profiler over three calls of each build at {shape}: the device kernels each one "
                            f"launches, ms per call. Traces (open in Perfetto or chrome://tracing): {traces}."))
    else:
        out.append(Markdown(
            f"This machine has no GPU, and our Triton kernels run here in Triton's interpreter, whose profile would "
            f"time Python. So the profiler is pointed at torch's own CPU operators at {shape}: torch_eager, the "
            f"materialised form written in torch (matmul, softmax, matmul: three stages the profiler can time apart), "
            f"beside sdpa_default, which runs attention as one fused operator (one entry, nothing inside it to time). "
            f"These are a CPU's times, not a GPU's. Traces: {traces}."))
    for name, table in prof["tables"].items():
        out.append(Markdown(f"**{name}**: {len(table)} {'kernel' if prof['device'] == 'cuda' else 'operator'}(s)"))
        out.append(table)
        if name in prof["stages"]:
            stages = prof["stages"][name]
            out.append(Markdown(f"{name}'s stages, from its kernels (attnlab's kernel table)"
                                + (":" if isinstance(stages, pd.DataFrame) else f": {stages}")))
            if isinstance(stages, pd.DataFrame):
                out.append(stages)
    out.append(Markdown(f"Asked for fused's stage times, the kernel table refuses: *{fused_stages_refused()}*"))
    return out


def fused_stages_refused() -> str:
    """What the kernel table says when asked for the fused build's stage times (attnlab.profiler.stage_table)."""
    k = _kernels()
    try:
        k.stage_table({"fused_kernel": 1.0}, "fused")
    except k.StagesNotSeparable as e:
        return str(e)
    raise AssertionError("stage_table gave stage times for fused")  # the guard itself is broken
