"""The ways a benchmark lies, each shown live beside the guard in this lab that catches it.

    dead_output(device)      an output nobody reads: a compiler deletes the work and the time collapses to a call's
                             fixed cost, shown at a shape where that cost is most of the call and one where the work
                             dwarfs it (DEAD_SHAPES); guard: every timed call consumes its output, and ablation_table
                             flags an ablation that ran in under DROPPED_SHARE of its base's time
    compile_rewrite(device)  torch.compile rewrites the materialised form into one fused SDPA call (it is no longer a
                             materialised baseline, whatever its time); guard: the profiler sees an SDPA operator
                             inside the call, and on a GPU the peak allocation is below the S and P the build must
                             hold (measure.alloc_flag)
    recompile_limit()        past torch._dynamo's recompile limit a compiled function silently runs eager; guard:
                             fail_on_recompile_limit_hit turns it into an error row (attnlab.builds.library.flex)
    mixed_ratio(rows)        a ratio of a non-causal time over a causal one describes the mask, not the fusion (times
                             as report.speedup takes them); guard: every report table refuses a frame holding both
                             causal values
    launch_overhead(...)     our kernels timed eagerly, as a user calls them, against CUDA-graph replay at a small shape;
                             guard: the timer replays a graph and keeps the host's cost to issue a call (`host_ms`)

Each returns a Demo: what the lie looks like, the guard, the evidence (a table), and where it was measured. The
measured ones hand their numbers to a *_demo function that writes every sentence from them. On a CPU the compiled
demonstrations time torch's compiled CPU code (real work, not the interpreter), labelled as such; the launch-overhead
one needs a GPU and shows the committed GPU run's rows instead, saying which.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import statistics
import sys
from dataclasses import dataclass

import pandas as pd
import torch

from attnlab import ceilings, measure, cost, report
from attnlab.builds import library
from attnlab.report import groups
from attnlab.report.ablation import DROPPED_SHARE, ablation_table

SMALL = dict(B=1, H=4, N=256, D=64)  # the shape the live demonstrations use: seconds on a CPU, micro-seconds on a GPU
# dead_output's shapes by device: first one whose work is small beside a call's fixed cost, then one whose work
# dwarfs it. A compiled call costs a fixed amount with no work at all (dynamo's guards, a launch, the timer's events:
# tens of µs on a GPU), so the unread call's share of the consumed one is that cost over the whole call. SMALL's
# matmuls are 4·B·H·N²·D = 67 MFLOP: micro-seconds on a GPU, where the fixed cost is then most of the consumed call and
# the lie shows only a partial 'saving'. B=2 H=16 N=8192 D=128 is 1.1 TFLOP (over 1 ms even at a dense fp16 rate of
# 1 PFLOP/s) and its S and P would be 4 GiB each, so a deleted computation leaves a few per cent of the call. A CPU
# runs SMALL's 67 MFLOP in milliseconds against a fixed cost of micro-seconds, so there SMALL is the large shape and a
# 16 KFLOP one the small.
DEAD_SHAPES = {"cuda": (SMALL, dict(B=2, H=16, N=8192, D=128)), "cpu": (dict(B=1, H=1, N=16, D=16), SMALL)}
EAGER_ROUNDS = 3  # launch_overhead times the eager call this many times in a row: its spread is the host's


@dataclass
class Demo:
    title: str
    lie: str
    guard: str
    evidence: pd.DataFrame
    where: str


def _inputs(device: str, shape: dict = SMALL, dtype=None):
    dtype = dtype or (torch.float16 if device.startswith("cuda") else torch.float32)
    case = measure.Case("fused", shape["B"], shape["H"], shape["H"], shape["N"], shape["D"], dtype, False, device)
    return case, measure.make_inputs(case)


def _shape(case) -> str:
    return f"B={case.B} H={case.H} N={case.N} D={case.D}"


def time_ms(fn, device: str, reps: int = 20) -> float:
    """Median ms of fn(): triton.testing.do_bench on a GPU (device events, eager calls), perf_counter on a CPU."""
    return time_spread(fn, device, reps)[1]


def time_spread(fn, device: str, reps: int = 20) -> tuple[float, float, float]:
    """(p20, median, p80) ms of fn(): do_bench's quantiles on a GPU, perf_counter around `reps` calls on a CPU."""
    if device.startswith("cuda"):
        import triton.testing

        return tuple(float(t) for t in triton.testing.do_bench(fn, warmup=10, rep=50, quantiles=[0.2, 0.5, 0.8]))
    times = ceilings.cpu_times_ms(fn, reps)  # the CPU timer the run's ceilings use
    p20, _, _, p80 = statistics.quantiles(times, n=5)
    return p20, statistics.median(times), p80


def _where(device: str) -> str:
    if device.startswith("cuda"):
        return f"live on {torch.cuda.get_device_name(torch.device(device))}"
    return "live on this CPU: torch's compiled CPU code (real work, not Triton's interpreter), so the times are a CPU's"


def _inductor(counter: str) -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"][counter])


def timed_row(build: str, ms: float, case) -> dict:
    """A results row of `build` at case's shape, timed `ms`: what the report tables take."""
    row = measure.blank_row()
    base, _, ablation = build.partition("-")
    row.update(build=build, base=base, ablation=ablation, family="ablation" if ablation else "ours", B=case.B,
               H=case.H, Hkv=case.Hkv, N=case.N, D=case.D, dtype=case.dtype, causal=case.causal, status="ok", ms=ms,
               ms_p20=ms, ms_p80=ms, case_id=f"{build}|{case.N}")
    return row


def dead_output(device: str = "cpu") -> Demo:
    """torch.compile of the materialised form, once returning its output and once reading only an input, at each of
    DEAD_SHAPES' shapes for the device: the second has no work left to do. Then the guard (dead_output_demo)."""
    import torch._dynamo

    def used(q, k, v):
        return library.torch_eager(q, k, v)

    def unused(q, k, v):
        library.torch_eager(q, k, v)  # computed, never read: dead code to a compiler
        return q[0, 0, 0, 0] * 1.0

    measured = []
    for shape in DEAD_SHAPES["cuda" if device.startswith("cuda") else "cpu"]:
        case, (q, k, v) = _inputs(device, shape)
        torch._dynamo.reset()  # each shape compiles afresh: no dynamic-shape graph from the shape before
        fast, kept = torch.compile(unused), torch.compile(used)
        sink = torch.zeros((), dtype=torch.float32, device=q.device)
        kept_ms = time_ms(lambda: sink.add_(kept(q, k, v).sum(dtype=torch.float32)), device)
        dead_ms = time_ms(lambda: fast(q, k, v), device)
        measured.append((case, kept_ms, dead_ms))
        del q, k, v, fast, kept
    torch._dynamo.reset()
    return dead_output_demo(measured, _where(device))


def dropped_output_note(case, kept_ms: float, dead_ms: float) -> str:
    """What ablation_table says of an ablation timed `dead_ms` against its base's `kept_ms` at case's shape: its
    dropped-output clause, or '' when the guard stays quiet."""
    table = ablation_table(report.split(pd.DataFrame([
        timed_row("materialised", kept_ms, case), timed_row("materialised-no_softmax", dead_ms, case),
        timed_row("materialised-no_pv", kept_ms, case), timed_row("materialised-zero_mask", kept_ms, case)]))[
        (case.dtype, False)], base="materialised")
    found = re.search(r"materialised-no_softmax ran in [^;]*; check that its output is consumed[^)]*\)",
                      table["note"].iloc[0])
    return found.group(0) if found else ""


def dead_output_demo(measured: list, where: str) -> Demo:
    """The dead-output demonstration from `measured`, (case, consumed ms, unread ms) per shape, least work first:
    every figure and every verdict of the guard is computed from them."""
    rows, verdicts, quoted = [], [], False
    for case, kept_ms, dead_ms in measured:
        note = dropped_output_note(case, kept_ms, dead_ms)
        share = dead_ms / kept_ms
        rows.append((_shape(case), cost.flops(case) / 1e9, kept_ms, dead_ms, share,
                     "flagged" if note else "quiet"))
        if not note:
            said = f"nothing: the unread call ran in {share:.0%} of the consumed one, not under {DROPPED_SHARE:.0%}"
        elif quoted:  # the flag's words once; a second flag by its share alone
            said = f"the same, at {share:.0%}"
        else:
            said, quoted = f"\u201c{note}\u201d", True
        verdicts.append(f"at {_shape(case)}, {said}")
    evidence = pd.DataFrame(rows, columns=["shape", "matmul GFLOP", "output consumed (acc += o.sum()), ms",
                                           "output never read, ms", "never read / consumed",
                                           f"ablation_table (flags under {DROPPED_SHARE:.0%})"])
    (case, kept_ms, dead_ms), smaller = measured[-1], measured[:-1]
    s_p = 2 * cost.nn_bytes(case.B, case.H, case.N, case.dtype)
    lie = (f"At {_shape(case)} ({_flop(cost.flops(case))} of matmul, and {_bytes(s_p)} of S and P for "
           f"the materialised form to hold), the compiled attention takes {kept_ms:.3g} ms with its output consumed "
           f"and {dead_ms:.3g} ms with it never read: ")
    if dead_ms < (1 - groups.REPEAT_SHARE) * kept_ms:
        fixed = sorted(d for _, _, d in measured)
        lie += (f"the compiler deleted the work, and an ablation timed this way would 'save' "
                f"{1 - dead_ms / kept_ms:.0%} of the call. What the unread call still takes is what a compiled call "
                "costs with no work (guards, a launch, the timer): "
                + (f"{fixed[0]:.3g}" if len(fixed) == 1 else f"{fixed[0]:.3g}–{fixed[-1]:.3g}") + " ms here")
        lie += ("." if not smaller else ", so where the work is small beside it the lie shows only part of the "
                "call: " + "; ".join(f"at {_shape(c)} ({_flop(cost.flops(c))}) the 'saving' is "
                                     f"{1 - d / k:.0%}" for c, k, d in smaller) + ".")
    else:
        lie += (f"the unread call took {dead_ms / kept_ms:.0%} of the consumed one, so here the compiler did not "
                "visibly delete the work.")
    guard = ("attnlab.measure consumes every timed call's output into a checksum on the device, the same step for "
             f"every build; and ablation_table flags any ablation that ran in under {DROPPED_SHARE:.0%} of its base's "
             f"time, on the premise that removing one stage never saves {1 - DROPPED_SHARE:.0%} of a build. It stays "
             f"quiet whenever the dropped-output call still takes {DROPPED_SHARE:.0%} or more of its base: when a "
             "call's fixed cost is that large a share of the base (a small shape), or when the compiler deleted "
             "only part of the work. Fed these times, it says: " + "; ".join(verdicts) + ".")
    return Demo("An ablation whose output nobody reads", lie, guard, evidence, where)


def _flop(n: float) -> str:
    """A count of floating-point operations as a person reads it: '67.1 MFLOP', '1.1 TFLOP'."""
    for unit, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("KFLOP", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} FLOP"


def _bytes(n: float) -> str:
    """Bytes as a person reads them: '1 MiB', '4 GiB'."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


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
    the profiler then sees inside a call that was written as matmul, softmax, matmul (compile_rewrite_demo)."""
    import torch._dynamo

    case, (q, k, v) = _inputs(device)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: library.torch_eager(q, k, v))
    compiled(q, k, v)
    eager = time_spread(lambda: library.torch_eager(q, k, v), device)
    comp = time_spread(lambda: compiled(q, k, v), device)
    seen_eager = sdpa_ops(lambda: library.torch_eager(q, k, v))
    seen = sdpa_ops(lambda: compiled(q, k, v))
    peaks = None
    if device.startswith("cuda"):
        dev = torch.device(device)
        peaks = (measure.peak_pass(lambda: library.torch_eager(q, k, v), dev)[0],
                 measure.peak_pass(lambda: compiled(q, k, v), dev)[0])
    torch._dynamo.reset()
    return compile_rewrite_demo(case, eager, comp, seen_eager, seen, peaks, _where(device))


def compile_rewrite_demo(case, eager: tuple, comp: tuple, seen_eager: list, seen: list, peaks: tuple | None,
                         where: str) -> Demo:
    """The rewrite demonstration from its measurements: `eager` and `comp` the (p20, median, p80) ms of the eager and
    the compiled call, the SDPA operators the profiler saw in each, and their peak allocations in bytes (None on a
    CPU, which has no allocator statistics). Whether the times differ is read with the run's own rule for noise
    (attnlab.report.groups.noise_ms)."""
    shape = (case.B, case.H, case.Hkv, case.N, case.D)
    spreads = {(name, shape): {"status": "ok", "ms_p20": t[0], "ms_p80": t[2]}
               for name, t in (("eager", eager), ("compiled", comp))}
    noise = groups.noise_ms(spreads, ["eager", "compiled"], shape, eager[1])
    differ = comp[1] - eager[1]
    timing = (f"Compiled, the code written as matmul, softmax, matmul takes {comp[1]:.3g} ms against {eager[1]:.3g} "
              "ms eager")
    if abs(differ) <= noise:
        timing += (f": the same time, within the {noise:.2g} ms the lab reads as noise (the wider of "
                   f"{groups.REPEAT_SHARE:.0%} and either call's p20–p80 spread). The times give nothing away")
    else:
        timing += (f": {'slower' if differ > 0 else 'faster'} by {abs(differ):.3g} ms, beyond the {noise:.2g} ms the "
                   "lab reads as noise. The time is not the lie")
    if seen:
        lie = (timing + "; the lie is the label. The compiled call is no longer the program its name says: it calls "
               f"{', '.join(seen)}, one fused attention operator, so a row labelled 'materialised' and timed this way "
               "is fused attention under a materialised name, and a 'speedup over materialised' measured against it "
               "would be a speedup over fused attention.")
    else:
        lie = (timing + "; and the profiler sees no attention operator in the compiled call: no rewrite happened "
               "here, so on this machine the label holds.")
    rows = [("eager materialised (torch_eager)", eager[1], seen_eager),
            ("torch.compile of the same code", comp[1], seen)]
    columns = ["call", "ms", "attention operator the profiler sees"]
    evidence = pd.DataFrame([(call, ms, ", ".join(ops) or "no SDPA operator") for call, ms, ops in rows],
                            columns=columns)
    guard = ("the profiler sees " + (f"{', '.join(seen)} inside the compiled call: it is an SDPA call now, not a "
                                     "materialised baseline" if seen else "no SDPA operator in the compiled call "
                                     "(no rewrite happened here)")
             + ". The lab never compiles its materialised rows (torch_eager is plain torch, never compiled); ")
    hold = 2 * cost.nn_bytes(case.B, case.H, case.N, case.dtype)  # S and P, as cost.hold_bytes("S+P")
    if peaks is not None:
        evidence.insert(2, "peak allocation (MiB)", [peak / (1 << 20) for peak in peaks])
        flag = measure.alloc_flag(peaks[1], hold, "S+P")
        guard += (f"and the harness's allocation check, for which a build named materialised must hold S and P "
                  f"({_bytes(hold)} here), says of the compiled call: \u201c{flag or 'nothing: peak ≥ S + P'}\u201d")
    else:
        guard += ("on a GPU the harness's allocation check fires too: a build named materialised whose peak is below "
                  f"S + P ({_bytes(hold)} at this shape) is flagged in its row's alloc_flag (a CPU has no allocator "
                  "statistics).")
    title = ("torch.compile rewrites the materialised form into a fused kernel" if seen else
             "torch.compile of the materialised form (no rewrite on this machine)")
    return Demo(title, lie, guard, evidence, where)


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
                           f"({'recognised' if measure.is_recompile_limit(e) else 'NOT recognised'} as the "
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
    causal value; then what a report table says when handed both. Every time is the one report.speedup divides (ms
    net of the consumption step), so the honest ratios are the speedup table's own."""
    ok = rows[rows["status"] == "ok"]
    dtype = sorted(ok["dtype"].astype(str).unique())[0]
    ok = ok[ok["dtype"].astype(str) == dtype]
    n, d = int(ok["N"].max()), int(sorted(ok["D"].unique())[0])
    here = ok[(ok["N"] == n) & (ok["D"] == d)]
    have = set(zip(here["build"], here["causal"].astype(bool)))
    if not {(build, True), (baseline, False), (build, False), (baseline, True)} <= have:
        raise ValueError(f"rows lack {build} or {baseline} at N = {n}, D = {d} with both causal values")
    ratio = f"x_vs_{baseline}"
    table = {causal: report.speedup(group, baseline=baseline, builds=[build]).iloc[0]
             for (_, causal), group in report.split(here).items()}
    net = {(baseline, causal): t[f"{baseline}_ms"] for causal, t in table.items()}
    net.update({(build, causal): t["ms"] for causal, t in table.items()})
    mixed = net[(baseline, False)] / net[(build, True)]
    evidence = pd.DataFrame([
        (f"{baseline} non-causal / {build} causal (the lie)", net[(baseline, False)], net[(build, True)], mixed),
        (f"{baseline} / {build}, both non-causal", net[(baseline, False)], net[(build, False)], table[False][ratio]),
        (f"{baseline} / {build}, both causal", net[(baseline, True)], net[(build, True)], table[True][ratio]),
    ], columns=[f"ratio at N = {n}, D = {d} ({dtype})", "numerator ms", "denominator ms", "×"])
    honest = (table[False][ratio], table[True][ratio])
    than = ("more than either honest ratio" if mixed > max(honest) else
            "less than either honest ratio" if mixed < min(honest) else "between the two honest ratios")
    try:
        report.speedup(here, baseline=baseline)
        refusal = "nothing (the guard did not fire)"
    except ValueError as e:
        refusal = f"\u201c{e}\u201d"
    return Demo("A ratio that mixes causal and non-causal rows",
                f"Dividing the non-causal {baseline} time by the causal {build} time gives {mixed:.2f}×, {than} "
                f"({honest[0]:.2f}× non-causal, {honest[1]:.2f}× causal): the causal row skips the masked half of the "
                "work, so the number describes the mask, not the fusion. All times here are the speedup table's "
                "(each build's median less the consumption step every timed call includes, "
                "attnlab.report.speedup), so the honest ratios are the ones its table prints.",
                "Every report table takes one (dtype, causal) group and refuses a frame holding both; handed these "
                f"rows, speedup says: {refusal}. What masking saves is reported as a difference of times "
                "(causal_saving), never a ratio.", evidence, source)


def launch_overhead(device: str, rows: pd.DataFrame | None = None, source: str = "") -> Demo:
    """On a GPU: fused at SMALL timed as a CUDA-graph replay, eagerly back to back (as a user's loop calls it, in
    EAGER_ROUNDS rounds), eagerly between L2 flushes (do_bench), and the host's cost to issue one call
    (launch_overhead_demo). Without one: the lesson rows' graph-replay `ms` beside `host_ms` (and `eager_ms` where the
    rows have it) at their smallest N, from `source`."""
    from attnlab import builds

    if device.startswith("cuda"):
        case, (q, k, v) = _inputs(device)
        dev = torch.device(device)
        fused = builds.get("fused").attend
        call = lambda: fused(q, k, v)  # noqa: E731
        call()
        torch.cuda.synchronize(dev)
        rounds = [measure.eager_ms(call, dev)[0] for _ in range(EAGER_ROUNDS)]
        flushed = time_ms(call, device)
        graphs: list = []
        replay, why = measure.graphed(call, dev, graphs)
        graph_ms = time_ms(replay, device) if graphs else math.nan
        host = measure.host_ms(call, dev)
        graphs.clear()
        return launch_overhead_demo(f"fused at {_shape(case)} {case.dtype}", rounds, flushed, graph_ms, host,
                                    _where(device), why)
    if rows is None:
        raise ValueError("without a GPU, launch_overhead needs the committed GPU rows to show (rows=...)")
    ok = rows[(rows["status"] == "ok") & rows["build"].isin(("materialised", "qk_softmax", "fused"))]
    small = ok[ok["N"] == ok["N"].min()]
    cols = ["build", "causal", "D", "N", "B", "H", "ms", "host_ms"] + (["eager_ms"] if "eager_ms" in small else [])
    t = small[cols].sort_values(["causal", "D", "build"]).reset_index(drop=True)
    t["host_ms / ms"] = t["host_ms"] / t["ms"]
    slower = int((t["host_ms / ms"] >= 1).sum())
    return Demo("Launch overhead: eager calls against CUDA-graph replay (needs a GPU)",
                f"{_LAUNCH_LIE} In these rows {slower} of {len(t)} of our builds' calls take the host longer to issue "
                "than the graph-replayed kernels take to run" + (": for those an eager figure measures the host, "
                "not the GPU, and moves with whatever else the host does, so such a figure means something only "
                "beside repeated rounds of it (on a GPU this demonstration times them live)." if slower else ".")
                + f" {_COLUMNS_MEAN}",
                _LAUNCH_GUARD, t, source + " (this machine has no GPU to show it live)")


_LAUNCH_LIE = ("A timer that replays a CUDA graph reports the kernels; a user calling from Python pays the launches "
               "too. Report one without the other and the number lies to someone.")
_LAUNCH_GUARD = ("The lab's timer replays a CUDA graph (timer 'do_bench+graph') and keeps the host's cost to issue one "
                 "call in `host_ms`; where a graph cannot be captured it times eagerly and says so, and flags a row "
                 "whose issue cost is half its time or more ('host-bound' in timing_note).")
_COLUMNS_MEAN = ("`ms` is the graph replay's median (the kernels); `host_ms` is perf_counter around 20 calls issued "
                 "without waiting for the GPU, divided by 20 (the host's whole cost to issue one call); `eager_ms`, "
                 "where the rows have it, is CUDA events around a window of calls issued back to back (what a loop "
                 "of calls pays, whichever of host and GPU is slower).")


def launch_overhead_demo(label: str, rounds: list, flushed_ms: float, graph_ms: float, host_ms: float, where: str,
                         why: str = "") -> Demo:
    """The launch-overhead demonstration from its measurements of one call (`label`): `rounds` the ms per call of
    measure.eager_ms's back-to-back windows, one window per round; `flushed_ms` do_bench's median of eager calls,
    each after an L2 flush; `graph_ms` the CUDA-graph replay's median; `host_ms` measure.host_ms. Every figure
    printed is one of these; `why` says why no graph was captured."""
    us = lambda ms: f"{ms * 1e3:.3g} µs"  # noqa: E731
    eager = statistics.median(rounds)
    said = ", ".join(us(r) for r in rounds)
    if math.isfinite(graph_ms):
        kernels = (f"the kernels take {us(graph_ms)} under CUDA-graph replay; issuing one call from Python takes the "
                   f"host {us(host_ms)}" + (f", {host_ms / graph_ms:.2g}× the kernels' time" if host_ms > graph_ms
                                            else ", less than the kernels take"))
    else:
        kernels = (f"no CUDA graph could be captured, so the kernels' own time is not known here; issuing one call "
                   f"from Python takes the host {us(host_ms)}")
    lie = f"For {label}, {kernels}; called back to back, as a loop calls it, a call takes {us(eager)}. {_LAUNCH_LIE}"
    if not math.isfinite(graph_ms) or host_ms >= measure.HOST_BOUND * graph_ms:
        lie += (" An eager figure of such a call measures the host, not the GPU, and the host's pace varies: "
                f"{len(rounds)} rounds in a row here took {said} a call ({max(rounds) / min(rounds) - 1:.0%} apart), "
                "so compare eager figures of calls this short only across repeated rounds.")
    else:
        lie += (f" Here the host issues a call in under {measure.HOST_BOUND:.0%} of the kernels' time, so an eager "
                f"figure is mostly the kernels': {len(rounds)} rounds in a row took {said} a call.")
    if host_ms > flushed_ms:
        lie += (f" do_bench's eager figure ({us(flushed_ms)}) sits below the host's {us(host_ms)} because do_bench "
                "writes a buffer to clear the L2 cache before each call and records its start event after that "
                "write: the host issues the call's launches while the GPU is still busy writing, so its events "
                "bracket the kernels and only the part of the host's work that outlasts the write.")
    lie += (" The host time is perf_counter around 20 calls issued without waiting, divided by 20: the host's whole "
            "cost to issue one call; the back-to-back figure is CUDA events around a window of such calls.")
    evidence = pd.DataFrame(
        [(f"eager back to back, median of {len(rounds)} rounds (per call)", eager),
         ("eager, one call after each L2 flush (do_bench)", flushed_ms),
           ("CUDA-graph replay (the kernels)", graph_ms), ("host time to issue one eager call", host_ms)],
        columns=[label, "ms"])
    return Demo("Launch overhead: eager calls against CUDA-graph replay", lie + (f" ({why})" if why else ""),
                _LAUNCH_GUARD, evidence, where)


def as_markdown(demo: Demo):
    from IPython.display import Markdown

    return Markdown(f"### {demo.title}\n\n*Where:* {demo.where}.\n\n**The lie.** {demo.lie}\n\n**The guard.** "
                    f"{demo.guard}")
