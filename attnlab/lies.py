"""The ways a benchmark lies, each shown live on a small shape beside the guard in this lab that catches it.

    dead_output(device)      an output nobody reads: a compiler deletes the work and the time collapses to a launch;
                             guard: every timed call consumes its output, and ablation_table flags an ablation that
                             ran in under DROPPED_SHARE of its base's time
    compile_rewrite(device)  torch.compile rewrites the materialised form into one fused SDPA call (it is no longer a
                             materialised baseline); guard: the profiler sees an SDPA operator inside the call, and on
                             a GPU the peak allocation is below the S and P the build must hold (measure.alloc_flag)
    recompile_limit()        past torch._dynamo's recompile limit a compiled function silently runs eager; guard:
                             fail_on_recompile_limit_hit turns it into an error row (attnlab.builds.library.flex)
    mixed_ratio(rows)        a ratio of a non-causal time over a causal one describes the mask, not the fusion;
                             guard: every report table refuses a frame holding both causal values
    launch_overhead(...)     our kernels timed eagerly, as a user calls them, against CUDA-graph replay at a small shape;
                             guard: the timer replays a graph and keeps the host's cost to issue a call (`host_ms`)

Each returns a Demo: what the lie looks like, the guard, the evidence (a table), and where it was measured. On a CPU
the compiled demonstrations time torch's compiled CPU code (real work, not the interpreter), labelled as such; the
launch-overhead one needs a GPU and shows the committed GPU run's rows instead, saying which.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from dataclasses import dataclass

import pandas as pd
import torch

from attnlab import ceilings, measure, report
from attnlab.builds import library
from attnlab.report.ablation import DROPPED_SHARE, ablation_table

SMALL = dict(B=1, H=4, N=256, D=64)  # the shape the live demonstrations use: seconds on a CPU, micro-seconds on a GPU


@dataclass
class Demo:
    title: str
    lie: str
    guard: str
    evidence: pd.DataFrame
    where: str


def _inputs(device: str, dtype=None):
    dtype = dtype or (torch.float16 if device.startswith("cuda") else torch.float32)
    case = measure.Case("fused", SMALL["B"], SMALL["H"], SMALL["H"], SMALL["N"], SMALL["D"], dtype, False, device)
    return case, measure.make_inputs(case)


def time_ms(fn, device: str, reps: int = 20) -> float:
    """Median ms of fn(): triton.testing.do_bench on a GPU (device events, eager calls), perf_counter on a CPU."""
    if device.startswith("cuda"):
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))
    return ceilings.cpu_median_ms(fn, reps)  # the CPU timer the run's ceilings use


def _where(device: str) -> str:
    if device.startswith("cuda"):
        return f"live on {torch.cuda.get_device_name(torch.device(device))}"
    return "live on this CPU: torch's compiled CPU code (real work, not Triton's interpreter), so the times are a CPU's"


def _inductor(counter: str) -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"][counter])


def _row(build: str, ms: float, case) -> dict:
    """A results row of `build` at case's shape, timed `ms`: what the report tables take."""
    row = measure.blank_row()
    base, _, ablation = build.partition("-")
    row.update(build=build, base=base, ablation=ablation, family="ablation" if ablation else "ours", B=case.B,
               H=case.H, Hkv=case.Hkv, N=case.N, D=case.D, dtype=case.dtype, causal=case.causal, status="ok", ms=ms,
               ms_p20=ms, ms_p80=ms, case_id=f"{build}|{case.N}")
    return row


def dead_output(device: str = "cpu") -> Demo:
    """torch.compile of the materialised form, once returning its output and once reading only an input: the second
    has no work left to do. Then the guard: the same two times as a base and its 'ablation', through ablation_table."""
    import torch._dynamo

    case, (q, k, v) = _inputs(device)
    torch._dynamo.reset()

    def used(q, k, v):
        return library.torch_eager(q, k, v)

    def unused(q, k, v):
        library.torch_eager(q, k, v)  # computed, never read: dead code to a compiler
        return q[0, 0, 0, 0] * 1.0

    fast = torch.compile(unused)
    kept = torch.compile(used)
    sink = torch.zeros((), dtype=torch.float32, device=q.device)
    kept_ms = time_ms(lambda: sink.add_(kept(q, k, v).sum(dtype=torch.float32)), device)
    dead_ms = time_ms(lambda: fast(q, k, v), device)
    evidence = pd.DataFrame([("output consumed (acc += o.sum())", kept_ms),
                             ("output never read", dead_ms)], columns=["compiled materialised form", "ms"])
    table = ablation_table(report.split(pd.DataFrame([
        _row("materialised", kept_ms, case), _row("materialised-no_softmax", dead_ms, case),
        _row("materialised-no_pv", kept_ms, case), _row("materialised-zero_mask", kept_ms, case)]))[
        (case.dtype, False)], base="materialised")
    note = table["note"].iloc[0]
    caught = "check that its output is consumed" in note
    return Demo(
        "An ablation whose output nobody reads",
        f"Unread, the compiled attention takes {dead_ms:.3g} ms against {kept_ms:.3g} ms consumed "
        f"({dead_ms / kept_ms:.0%}): the compiler deleted the work, and an ablation timed this way would 'save' "
        "nearly all of it.",
        "attnlab.measure consumes every timed call's output into a checksum on the device, the same step for every "
        f"build; and ablation_table flags any ablation that ran in under {DROPPED_SHARE:.0%} of its base's time. Fed "
        "these two times, it says: " + (f"\u201c{note}\u201d" if caught else "nothing (the guard did not fire)"),
        evidence, _where(device))


@contextlib.contextmanager
def quiet_stderr():
    """The process's standard error (file descriptor 2) sent nowhere for the block: the profiler's C++ side prints a
    line at every start and stop, which would land in the notebook's page."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def sdpa_ops(fn) -> list[str]:
    """The scaled-dot-product-attention operators torch.profiler sees inside one call of fn (CPU operator events)."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sorted({e.key for e in prof.key_averages() if "scaled_dot_product" in e.key})


def compile_rewrite(device: str = "cpu") -> Demo:
    """torch.compile of the plain materialised form: inductor's pattern matcher replaces it with one SDPA call, which
    the profiler then sees inside a call that was written as matmul, softmax, matmul."""
    import torch._dynamo

    case, (q, k, v) = _inputs(device)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: library.torch_eager(q, k, v))
    compiled(q, k, v)
    eager_ms = time_ms(lambda: library.torch_eager(q, k, v), device)
    comp_ms = time_ms(lambda: compiled(q, k, v), device)
    seen_eager = sdpa_ops(lambda: library.torch_eager(q, k, v))
    seen = sdpa_ops(lambda: compiled(q, k, v))
    rows = [("eager materialised (torch_eager)", eager_ms, ", ".join(seen_eager) or "no SDPA operator"),
            ("torch.compile of the same code", comp_ms, ", ".join(seen) or "no SDPA operator")]
    guard = ("the profiler sees " + (f"{', '.join(seen)} inside the compiled call: it is an SDPA call now, not a "
                                     "materialised baseline" if seen else "no SDPA operator in the compiled call "
                                     "(no rewrite happened here)")
             + ". The lab never compiles its materialised rows (torch_eager is plain torch, never compiled); ")
    if device.startswith("cuda"):
        dev = torch.device(device)
        peak, _, _ = measure.peak_pass(lambda: compiled(q, k, v), dev)
        hold = 2 * case.B * case.H * case.N * case.N * q.element_size()  # S and P, as model.hold_bytes("S+P")
        flag = measure.alloc_flag(peak, hold, "S+P")
        rows.append(("peak allocation of the compiled call", peak / 1e6, f"MB; S + P would be {hold / 1e6:.3g} MB"))
        guard += f"and the harness's allocation check says: \u201c{flag or 'nothing: peak ≥ S + P'}\u201d"
    else:
        guard += ("on a GPU the harness's allocation check fires too: a build named materialised whose peak is below "
                  "S + P is flagged in its row's alloc_flag (a CPU has no allocator statistics).")
    return Demo("torch.compile rewrites the materialised form into a fused kernel",
                f"Compiled, the code written as matmul, softmax, matmul takes {comp_ms:.3g} ms against {eager_ms:.3g} "
                "ms eager, and it is no longer the program its name says: it calls one fused attention operator, so "
                "a 'speedup over materialised' measured against it would be a speedup over fused attention.",
                guard, pd.DataFrame(rows, columns=["call", "ms", "attention operator the profiler sees"]),
                _where(device))


def recompile_limit() -> Demo:
    """One compiled function called at four shapes with a recompile limit of two: the last calls run eager with
    no error. Then the same with fail_on_recompile_limit_hit, the setting the flex build runs under."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    def softmax_rows(x):
        return torch.softmax(x * 2.0, dim=-1)

    sizes = (16, 32, 64, 128)
    quiet = logging.getLogger("torch._dynamo")  # its warning at the limit is the only sign, and it is no error
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(softmax_rows, backend="eager", dynamic=False)
    rows = []
    with torch._dynamo.config.patch(recompile_limit=2):
        for n in sizes:
            f(torch.randn(n, n))
            rows.append((n, int(counters["stats"]["unique_graphs"])))
    silently = sum(1 for (_, g), (_, g0) in zip(rows[1:], rows) if g == g0)
    torch._dynamo.reset()
    counters.clear()
    strict = torch.compile(softmax_rows, backend="eager", dynamic=False)
    refused = ""
    with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
        for n in sizes:
            try:
                strict(torch.randn(n, n))
            except Exception as e:  # noqa: BLE001 - the refusal is the point
                refused = (f"at N = {n}: {type(e).__name__}; attnlab.measure records such a case as an error row "
                           f"({'recognised' if measure._is_recompile_limit(e) else 'NOT recognised'} as the "
                           "recompile-limit fallback)")
                break
    torch._dynamo.reset()
    quiet.setLevel(level)
    return Demo("A recompile-limit fallback",
                f"With a limit of two compiled graphs, calls at four shapes compiled "
                f"{rows[-1][1]} graphs: {silently} call(s) ran eager with no error (torch logs one warning), and a table would call their "
                "times 'compiled'.",
                "The flex build compiles under fail_on_recompile_limit_hit=True and the sweep resets torch._dynamo "
                "before each shape, so the fallback becomes a refusal: " + (refused or "no refusal came (the guard "
                                                                             "did not fire)"),
                pd.DataFrame(rows, columns=["N", "graphs compiled so far"]),
                "live in this process (torch._dynamo with its eager backend: the limit is dynamo's, not a device's)")


def mixed_ratio(rows: pd.DataFrame, source: str, build: str = "fused", baseline: str = "materialised") -> Demo:
    """The largest shape's baseline non-causal time over build's causal time, beside the honest ratio within each
    causal value; then what a report table says when handed both."""
    ok = rows[rows["status"] == "ok"]
    dtype = sorted(ok["dtype"].astype(str).unique())[0]
    ok = ok[ok["dtype"].astype(str) == dtype]
    n, d = int(ok["N"].max()), int(sorted(ok["D"].unique())[0])
    at = ok[(ok["N"] == n) & (ok["D"] == d)].set_index(["build", "causal"])["ms"]
    if not {(build, True), (baseline, False), (build, False), (baseline, True)} <= set(at.index):
        raise ValueError(f"rows lack {build} or {baseline} at N = {n}, D = {d} with both causal values")
    mixed = at[(baseline, False)] / at[(build, True)]
    evidence = pd.DataFrame([
        (f"{baseline} non-causal / {build} causal (the lie)", mixed),
        (f"{baseline} / {build}, both non-causal", at[(baseline, False)] / at[(build, False)]),
        (f"{baseline} / {build}, both causal", at[(baseline, True)] / at[(build, True)]),
    ], columns=[f"ratio at N = {n}, D = {d} ({dtype})", "×"])
    try:
        report.speedup(ok[(ok["N"] == n) & (ok["D"] == d)], baseline=baseline)
        refusal = "nothing (the guard did not fire)"
    except ValueError as e:
        refusal = f"\u201c{e}\u201d"
    return Demo("A ratio that mixes causal and non-causal rows",
                f"Dividing the non-causal {baseline} time by the causal {build} time gives {mixed:.2f}×, more than "
                "either honest ratio: the causal row skips half the work, so the number describes the mask, not the "
                "fusion.",
                "Every report table takes one (dtype, causal) group and refuses a frame holding both; handed these "
                f"rows, speedup says: {refusal}. What masking saves is reported as a difference of times "
                "(causal_saving), never a ratio.", evidence, source)


def launch_overhead(device: str, rows: pd.DataFrame | None = None, source: str = "") -> Demo:
    """On a GPU: fused at a small shape timed eagerly (as a user calls it) and as a CUDA-graph replay, with the host's
    cost to issue one call. Without one: the lesson rows' graph-replay `ms` beside `host_ms` (and `eager_ms` where the
    rows have it) at their smallest N, from `source`."""
    from attnlab import builds

    lie = ("At a small shape an eager call costs the host longer to issue than the kernels take: a timer that "
           "replays a CUDA graph reports the kernels, a user calling from Python pays the launches too. Report one "
           "without the other and the number lies to someone. And an eager figure of such a call measures the host, "
           "not the GPU: on an H100 the same fused call, timed twice in a row in one process, took 143 µs and then "
           "221–235 µs, so compare eager figures below a few hundred µs only across repeated runs.")
    guard = ("The lab's timer replays a CUDA graph (timer 'do_bench+graph') and keeps the host's cost to issue one "
             "call in `host_ms`; where a graph cannot be captured it times eagerly and says so, and flags a row whose "
             "issue cost is half its time or more ('host-bound' in timing_note).")
    if device.startswith("cuda"):
        case, (q, k, v) = _inputs(device)
        dev = torch.device(device)
        fused = builds.get("fused").attend
        call = lambda: fused(q, k, v)  # noqa: E731
        call()
        torch.cuda.synchronize(dev)
        eager = time_ms(call, device)
        graphs: list = []
        replay, why = measure.graphed(call, dev, graphs)
        graph_ms = time_ms(replay, device) if graphs else math.nan
        host = measure.host_ms(call, dev)
        graphs.clear()
        evidence = pd.DataFrame([("fused, eager (as a user calls it)", eager), ("fused, CUDA-graph replay", graph_ms),
                                 ("host time to issue one eager call", host)],
                                columns=[f"B={case.B} H={case.H} N={case.N} D={case.D} {case.dtype}", "ms"])
        return Demo("Launch overhead: eager calls against CUDA-graph replay", lie + (f" ({why})" if why else ""),
                    guard, evidence, _where(device))
    if rows is None:
        raise ValueError("without a GPU, launch_overhead needs the committed GPU rows to show (rows=...)")
    ok = rows[(rows["status"] == "ok") & rows["build"].isin(("materialised", "qk_softmax", "fused"))]
    small = ok[ok["N"] == ok["N"].min()]
    cols = ["build", "causal", "D", "N", "B", "H", "ms", "host_ms"] + (["eager_ms"] if "eager_ms" in small else [])
    t = small[cols].sort_values(["causal", "D", "build"]).reset_index(drop=True)
    t["host_ms / ms"] = t["host_ms"] / t["ms"]
    return Demo("Launch overhead: eager calls against CUDA-graph replay (needs a GPU)",
                lie + f" In these rows {int((t['host_ms / ms'] >= 1).sum())} of {len(t)} of our builds' calls take "
                "the host longer to issue than the graph-replayed kernels take to run.",
                guard, t, source + " (this machine has no GPU to show it live)")


def as_markdown(demo: Demo):
    from IPython.display import Markdown

    return Markdown(f"### {demo.title}\n\n*Where:* {demo.where}.\n\n**The lie.** {demo.lie}\n\n**The guard.** "
                    f"{demo.guard}")
