"""One case, measured honestly: one results row (attnlab.schema.COLUMNS) per call of `measure`.

The recipe is written once, `pipeline`, whoever measures; each caller chooses its timer and adds its own fields:

    prepare  make the inputs (random normal, seeded by the shape) and the call of the case's pass
    cold     the first call, torch.compile watched (CompileWatch)
    held     a backward pass's forward alone: what it leaves allocated for the backward (held_bytes)
    check    the first output against the fp64 oracle
    timer    the caller's: Graphed (one CUDA-graph capture, do_bench; the CPU's wall clock), Replays (k captures
             each timed alone: attnlab.bench), Eager (windows of calls back to back: the explorer, a model's forward)
    peak     one call in a pass of its own (out of memory there loses the peak, not the time)
    after    the caller's last steps (the consumption step alone; a model's attention alone)

A failing step leaves the fields of the steps before it, and the caller turns the error into its row's status:

    measure(case)          the sweep's row: Graphed                         (attnlab.sweep, attnlab.selfcheck)
    time_case(name, ...)   the benchmark's figures: Replays                 (attnlab.bench, attnlab.autotune)
    explore.measure_live   Eager, one window;   model_forward.measure_forward   Eager, `windows` windows

The sweep's row, field by field:

    pass    a case times its build's forward (the build's own call), or its backward or forward+backward
            (Case.pass_) through the build's differentiable callable (`differentiable`): dQ, dK, dV for a random
            normal dO (grad_output) through torch.autograd.grad; a backward alone walks the graph of one forward
            made before its cold call, outside every timed call. The gradients are what a backward call outputs:
            consumed, and checked against torch.autograd through the fp64 oracle where attnlab.accuracy has a rule
            for gradients (grad_verdict).
    cold    wall time of the very first call (Triton compile and autotune, torch.compile, module load), synced on
            both sides: its own figure, never mixed into the warm numbers. It is the first call *in this process*:
            Triton's and inductor's on-disk caches, and earlier cases sharing a kernel, can make it a load.
    warm    CUDA: triton.testing.do_bench, device events, L2 flushed before every repetition (so repeats do not
            measure the cache; inputs are not rotated); median, p20, p80 of all repetitions, nothing printed or
            synced inside. The call is captured once in a CUDA graph and the graph replayed (timer
            'do_bench+graph'), so the time is the kernels' and not Python's cost to launch them; `host_ms` keeps
            that cost (what an eager caller pays), and `eager_ms` times the same call issued eagerly, back to back,
            as a user's loop issues it (CUDA events around the window): where the two part, launch cost is what a
            Python caller meets. A build that cannot be captured is timed eagerly and says why, as is a backward
            alone, which runs on the stream of its forward, made outside the capture (NOT_CAPTURED).
            CPU: time.perf_counter around each call, a 64 MiB buffer written between calls (the CPU's cache
            flush); at least `min_reps` calls, more while `reps_ms` of wall time lasts.
    peak    its own pass after timing: sync, reset peak stats, run, sync; peak minus what
            was allocated before, next to cost.hold_bytes. CPU has no allocator statistics: NaN and the reason.
    held    backward passes: one forward alone, and what it leaves allocated once it returns (attnlab.schema's
            held_bytes): on CUDA the allocator's count, on a CPU the storages torch.autograd saved.
    error   ‖o − ref‖/‖ref‖ against the fp64 oracle under attnlab.accuracy's rule, at every measured shape; when
            the fp64 scores B·H·N²·8 exceed `ref_budget_bytes`, on a batch slice, then a head slice in whole
            groups of H/Hkv (so grouped-query attention stays right), and err_note says which.
    model   attnlab.cost's FLOPs and bytes; achieved TFLOP/s and TB/s at the median; % of the run's ceilings.
            The byte model counts the forward: a backward pass's row has no bytes, and no TB/s.
    status  'ok', 'unsupported: <why>', 'oom: <bytes> bytes wanted (...)' or 'error: <type>: <message>'.

Every timed call consumes its output: `acc += o.sum(dtype=float32)` on the device (a backward's, each gradient's
sum: checksum_of), the same step for every build, so no ablation's work can be dropped as dead code and the step
cancels in differences between builds. acc is read once after timing; `checksum` is acc divided by the number of
calls (the mean of o.sum(), comparable across builds of a shape whatever the repetition count). `consume_ms` times
that step alone: it is inside `ms`.

A row whose err exceeds its limit keeps status 'ok' (the timing is real) and says 'FAILS accuracy rule' in err_note;
the correctness gate (attnlab.gate) is where a wrong build fails. Inputs are random normal, never zeros, seeded by
the shape (not the build), so every build of a shape sees the same q, k, v and their checksums compare.
"""
from __future__ import annotations

import gc
import importlib.util
import json
import math
import re
import statistics
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from attnlab import accuracy, builds, cost, provenance
from attnlab.accuracy import judge
from attnlab.builds import Unsupported
from attnlab.schema import BEFORE_BACKWARD, COLUMNS, PASSES, TYPES, less_consumption
from attnlab.triton import launch
from attnlab.validate import check

COMPILED = ("flex",)  # builds that go through torch.compile: dynamo reset per shape, fallbacks reported
TOKENS, WIDTH = 16384, 2048  # FlashAttention's benchmark shapes: B·N = TOKENS, H·D = WIDTH at every N and D
REF_BUDGET = 2 * cost.GiB  # fp64 scores the reference may hold before it is computed on a slice
CPU_FLUSH_BYTES = 64 << 20  # written between CPU repetitions: larger than the last-level cache of most CPUs
MAX_CPU_REPS = 1000


@dataclass(frozen=True)
class Case:
    """One measurement. `dtype` is stored by name ('bfloat16', 'float16', 'float32'); a torch.dtype is accepted
    and converted, so cases hash, compare and print the same whichever was given. `pass_`: the pass timed
    (attnlab.schema.PASSES)."""

    build: str
    B: int
    H: int
    Hkv: int
    N: int
    D: int
    dtype: str = "float32"
    causal: bool = False
    device: str = "cpu"
    pass_: str = "forward"

    def __post_init__(self):
        if isinstance(self.dtype, torch.dtype):
            object.__setattr__(self, "dtype", str(self.dtype).removeprefix("torch."))
        if self.pass_ not in PASSES:
            raise ValueError(f"pass_ must be one of {', '.join(PASSES)}, got {self.pass_!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def mask(self) -> str:
        """'zero' for the zero_mask ablations (they apply an all-zero additive mask), 'none' otherwise."""
        return "zero" if self.build.endswith("-zero_mask") else "none"

    @property
    def case_id(self) -> str:
        """build|B|H|Hkv|N|D|dtype|causal|mask, and |pass for a backward pass (a forward's id names no pass)."""
        passed = () if self.pass_ == "forward" else (self.pass_,)
        return "|".join(str(x) for x in (self.build, self.B, self.H, self.Hkv, self.N, self.D, self.dtype,
                                         self.causal, self.mask, *passed))


# -- inputs and small rules ---------------------------------------------------------------------------------------

def shape_seed(case: Case, seed: int = 0) -> int:
    """A seed from the shape and `seed`, not the build: every build of a shape gets the same inputs."""
    key = f"{seed}|{case.B}|{case.H}|{case.Hkv}|{case.N}|{case.D}|{case.dtype}|{case.causal}"
    return zlib.crc32(key.encode())


def make_inputs(case: Case, seed: int = 0):
    """Fresh random normal q (B, H, N, D), k and v (B, Hkv, N, D) on the case's device, in its dtype."""
    dev = torch.device(case.device)
    g = torch.Generator(device=dev).manual_seed(shape_seed(case, seed))
    kw = dict(generator=g, device=dev, dtype=case.torch_dtype)
    q = torch.randn(case.B, case.H, case.N, case.D, **kw)
    k = torch.randn(case.B, case.Hkv, case.N, case.D, **kw)
    v = torch.randn(case.B, case.Hkv, case.N, case.D, **kw)
    return q, k, v


def ref_slice(case: Case, budget: int) -> tuple[int, int, str]:
    """(batches, query heads, note) on which the fp64 reference fits `budget` bytes of scores.

    Batch first; below one batch, heads in whole groups of H/Hkv so each query head keeps its own k/v head."""
    per_head = case.N * case.N * 8
    if case.B * case.H * per_head <= budget:
        return case.B, case.H, ""
    b = budget // (case.H * per_head)
    if b >= 1:
        return b, case.H, f"reference on batch 0:{b} of {case.B}"
    g = case.H // case.Hkv
    h = max(g, budget // per_head // g * g)
    return 1, h, f"reference on batch 0:1 of {case.B}, heads 0:{h} of {case.H}"


def alloc_flag(peak_bytes: float, hold: int, holds: str) -> str:
    """'' or why the peak shows the build is not what its name says (it held less than it must)."""
    if not math.isfinite(peak_bytes) or peak_bytes >= hold:
        return ""
    return (f"peak {int(peak_bytes)} B is below the {hold} B a build holding {holds!r} must hold: "
            f"not what its name says")


def one_line(x, limit: int = 300) -> str:
    """Messages go in one CSV cell on one line."""
    s = " ".join(str(x).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def oom_status(e: BaseException, hold: int) -> str:
    """'oom: <bytes> bytes wanted (...)': the allocator's request when its message names one, else hold_bytes."""
    m = re.search(r"Tried to allocate ([\d.]+) ?(B|KiB|MiB|GiB|TiB)", str(e))
    if m:
        return f"oom: {int(float(m.group(1)) * _UNITS[m.group(2)])} bytes wanted (the failed allocation)"
    return f"oom: {hold} bytes wanted (hold_bytes; the error named no size)"


def failure_status(e: BaseException, hold: int) -> str:
    """The status of a case that raised: 'oom: ...' when the allocator gave out, else 'error: <type>: <message>'."""
    return oom_status(e, hold) if is_oom(e) else one_line(f"error: {type(e).__name__}: {e}")


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "can't allocate memory" in str(e)  # CPU's allocator


def is_recompile_limit(e: BaseException) -> bool:
    return type(e).__name__ == "FailOnRecompileLimitHit" or "recompile_limit" in str(e)


# -- timing -------------------------------------------------------------------------------------------------------

def sync(dev: torch.device):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


_flush: dict = {}


def graphed(step, dev: torch.device, captured: list) -> tuple:
    """(run, why): `step` captured once in a CUDA graph and `run` replaying it, or (step, why not).

    Replaying a graph issues every launch of the call from one host call (~10 µs), so the events around it time the
    kernels and the gaps between them on the device, not Python's cost to launch them: at N = 512 issuing one of our
    calls takes 0.1-0.4 ms on the H200's host, as long as the kernels themselves (eager timing left 70 of the H200
    grid's 456 rows host-bound).
    `captured` receives the graph (the caller frees it, and with it the graph's memory pool, after timing).
    CPU: no graphs, (step, '')."""
    if dev.type != "cuda":
        return step, ""
    prev = torch.cuda.current_stream(dev)
    try:
        side = torch.cuda.Stream(dev)  # warm up off the default stream, as torch.cuda.graphs asks
        side.wait_stream(prev)
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        prev.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        captured.append(graph)
    except Exception as e:  # a build that syncs with the host, or no room for the graph's pool: time it eagerly
        # torch.cuda.graph's exit ends the capture before it restores the stream: when ending raises, the process
        # would stay on the capture stream. The first error (e.g. a sync inside the capture) is the one to report.
        torch.cuda.set_stream(prev)
        cause = e.__context__ if e.__context__ is not None else e
        torch.cuda.synchronize(dev)
        return step, one_line(f"graph capture failed, timed eagerly: {type(cause).__name__}: {cause}")
    return graph.replay, ""


def _time_call(step, acc: torch.Tensor, calls: list, dev: torch.device, *, not_captured: str = "", **timing
               ) -> tuple[list, str, str]:
    """(times, timer, why): `step` timed as graph replays where it can be captured (`why` says why not; a step that
    must not be, with `not_captured` its reason, is timed eagerly), with the checksum's accumulator and call count
    reset after the capture, so they cover the timing phase alone. The graph and its memory pool are freed before
    this returns, on an error too: they hold the call's S and P."""
    graphs: list = []
    run = None
    try:
        run, why = (step, not_captured) if not_captured and dev.type == "cuda" else graphed(step, dev, graphs)
        sync(dev)
        acc.zero_()  # the capturing call counted, but ran no kernels
        calls[0] = 0

        def timed():
            if graphs:  # a replay runs no Python: count it here (an eager step counts itself)
                calls[0] += 1
            run()

        times, timer = _time(timed, dev, **timing)
        return times, timer + ("+graph" if graphs else ""), why
    finally:
        run = timed = None
        graphs.clear()


def _time(step, dev: torch.device, *, warmup_ms: float, reps_ms: float, min_reps: int) -> tuple[list, str]:
    """Repetition times in ms of `step` and the timer's name (module docstring)."""
    if dev.type == "cuda":
        import triton.testing

        # A slow case (sdpa_math at N = 16384: 0.16 s a call) gets a window for at least min_reps repetitions,
        # sized from one synced call, rather than a second do_bench after a first one too short to use.
        sync(dev)
        t0 = time.perf_counter()
        step()
        sync(dev)
        rep = max(reps_ms, 1.2 * min_reps * (time.perf_counter() - t0) * 1e3)
        times = triton.testing.do_bench(step, warmup=warmup_ms, rep=rep, return_mode="all")
        if len(times) < min_reps:  # do_bench's own estimate (with its flush) came out slower: give it room
            times = triton.testing.do_bench(step, warmup=warmup_ms, rep=2 * min_reps * statistics.median(times),
                                            return_mode="all")
        return list(times), "do_bench"
    if "cpu" not in _flush:
        _flush["cpu"] = torch.empty(CPU_FLUSH_BYTES // 4)
    buf = _flush["cpu"]
    step()
    deadline = time.perf_counter() + warmup_ms / 1e3
    while time.perf_counter() < deadline:
        step()
    times = []
    deadline = time.perf_counter() + reps_ms / 1e3
    while len(times) < min_reps or (time.perf_counter() < deadline and len(times) < MAX_CPU_REPS):
        buf.zero_()
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return times, "perf_counter"


HOST_BOUND = 0.5  # issuing a call takes at least this share of its measured time: the GPU may be waiting on Python


def host_ms(step, dev: torch.device, calls: int = 20) -> float:
    """Host wall time to issue one call of `step` without waiting for the device (NaN on CPU).

    do_bench's events bracket each call on the device, so if the host takes longer to issue a call's launches than
    the device takes to run them, the device idles inside the bracket and the time measures Python, not kernels."""
    if dev.type != "cuda":
        return math.nan
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    issued = (time.perf_counter() - t0) * 1e3 / calls
    torch.cuda.synchronize(dev)
    return issued


def timing_note(ms: float, host: float) -> str:
    """'' or why `ms` may measure the host rather than the kernels."""
    if math.isfinite(host) and math.isfinite(ms) and host >= HOST_BOUND * ms:
        return (f"host-bound: issuing a call takes {host:.3g} ms on the host against {ms:.3g} ms measured; "
                "the GPU may wait on Python, so this time overstates the kernels")
    return ""


def percentile(times: list, p: float) -> float:
    """Linear-interpolated percentile (what numpy.percentile does by default)."""
    s = sorted(times)
    x = (len(s) - 1) * p / 100
    lo = math.floor(x)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (x - lo)


def peak_pass(run, dev: torch.device) -> tuple[float, str, torch.Tensor]:
    """(peak bytes above what was allocated before, note, o) of one call of `run`, in a pass of its own."""
    if dev.type != "cuda":
        return math.nan, "n/a: CPU has no allocator statistics", run()
    # No gc.collect() / empty_cache() here: the earlier calls' tensors are freed by reference counting, and
    # max_memory_allocated counts allocated bytes, not the allocator's reserve. gc.collect() costs ~0.2 s with
    # torch.compile loaded, and three a case would be a large share of a GPU case's time.
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    before = torch.cuda.memory_allocated(dev)
    o = run()
    torch.cuda.synchronize(dev)
    return float(torch.cuda.max_memory_allocated(dev) - before), "", o


_consume: dict = {}


def checksum_of(out) -> torch.Tensor:
    """A call's output folded into one float32 on its device: o.sum(), or the sum of each gradient's sum."""
    if isinstance(out, torch.Tensor):
        return out.sum(dtype=torch.float32)
    return torch.stack([t.sum(dtype=torch.float32) for t in out]).sum()


def _consume_ms(o, dev: torch.device, **timing) -> tuple[float, str]:
    """(ms, why): the consumption step (checksum_of) timed alone, the way `ms` is (graph replays; `why` says why
    not, and then the eager time, launch cost included, is not kept for other builds). It depends only on the
    output's shapes and dtypes, so it is timed once per shape (every build of a shape shares it): a third of the
    sweep's time otherwise."""
    outs = (o,) if isinstance(o, torch.Tensor) else tuple(o)
    key = (str(dev), *((tuple(t.shape), t.dtype) for t in outs))
    if key in _consume:
        return _consume[key], ""
    sink = torch.zeros((), dtype=torch.float32, device=dev)
    times, _, why = _time_call(lambda: sink.add_(checksum_of(o)), sink, [0], dev, **timing)
    ms = statistics.median(times)
    if not why:
        _consume[key] = ms
    return ms, why


def spin_up(dev: torch.device, seconds: float = 0.3, work=None, per_sync: int = 20) -> None:
    """Bring a GPU back to its working clock: after seconds of host-side compilation it idles (345 MHz on the
    H200), and do_bench's 25 ms warm-up does not bring it back (the first H200 autotune ran ~15 % slow that way).
    `work`, issued per_sync times between syncs for `seconds`: a 4096² bf16 matmul, or the caller's own call (the
    clock a card at its power cap gives that load: attnlab.selfcheck)."""
    if dev.type != "cuda":
        return
    if work is None:
        a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)

        def work():
            return a @ a
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(per_sync):
            work()
        torch.cuda.synchronize(dev)


COMPILED_S = 0.2  # a first call at least this slow compiled something, and the GPU idled meanwhile


def cold_call(call, dev: torch.device) -> tuple[float, object]:
    """(seconds, output) of the first call, synced on both sides: its own figure, never a warm one. A call that
    compiled (COMPILED_S) is followed by spin_up, so the warm timing that comes next starts at the working clock."""
    sync(dev)
    t0 = time.perf_counter()
    out = call()
    sync(dev)
    seconds = time.perf_counter() - t0
    if seconds > COMPILED_S:
        spin_up(dev)
    return seconds, out


def _dynamo_reset():
    """Forget every compiled graph: each shape of a compiled build compiles afresh at its cold call, so a sweep can
    never reach torch._dynamo's recompile limit (past which it would silently run eager)."""
    import torch._dynamo

    torch._dynamo.reset()


def _graphs() -> int:
    import torch._dynamo.utils

    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


class CompileWatch:
    """For a build that goes through torch.compile (COMPILED): torch._dynamo reset before its cold call, then the
    graphs compiled at that call and while the warm calls were timed, for the row's compile_note (the sweep's rows and
    attnlab bench's alike). Does nothing for the other builds.

        watch = CompileWatch(build.base)   # before the cold call
        watch.cold_done()                  # after it
        row.update(watch.note())           # after the timing: {} or {"compile_note": ...}"""

    def __init__(self, base: str):
        self.on = base in COMPILED
        if self.on:
            _dynamo_reset()
            self.g0 = _graphs()

    def cold_done(self) -> None:
        if self.on:
            self.g1 = _graphs()

    def note(self) -> dict:
        if not self.on:
            return {}
        g2 = _graphs()
        note = (f"torch._dynamo reset before the first call; {self.g1 - self.g0} graph(s) compiled there, "
                f"{g2 - self.g1} while timing")
        if g2 > self.g1:
            note += ": RECOMPILED during timing, the warm numbers include compilation"
        return {"compile_note": note}


# -- the pass: the build's forward, its backward, or both ---------------------------------------------------------

def differentiable(name: str) -> Callable:
    """Build `name`'s differentiable call (q, k, v, *, causal=False, attn_mask=None, scale=None) -> o:
    attnlab.builds.training.attend(name) where that module is installed; without it, a library build's own call,
    whose backward torch.autograd gives. An unknown name or an ablation (an ablated program has no backward) is a
    ValueError; one of our builds without attnlab.builds.training is Unsupported."""
    build = builds.get(name)
    if importlib.util.find_spec("attnlab.builds.training") is not None:
        from attnlab.builds import training

        return training.attend(name)
    if build.ablation:
        raise ValueError(f"build {name!r} is an ablation: an ablated program has no backward")
    if build.family != "library":
        raise Unsupported(f"{name} has no backward here: attnlab.builds.training is not installed")
    return build.attend


def grad_output(case: Case, seed: int = 0) -> torch.Tensor:
    """dO for a backward pass: random normal (B, H, N, D) like q, seeded by the shape (never the build), so every
    build of a shape gets the same."""
    dev = torch.device(case.device)
    g = torch.Generator(device=dev).manual_seed(shape_seed(case, seed) + 1)
    return torch.randn(case.B, case.H, case.N, case.D, generator=g, device=dev, dtype=case.torch_dtype)


# Why a backward alone is timed eagerly on CUDA: torch.autograd runs each backward op on the stream its forward op
# ran on, and that forward ran once, before the capture, on the default stream.
NOT_CAPTURED = "not captured, timed eagerly: a backward alone runs on the stream of a forward made outside the capture"


def pass_plan(attend, q, k, v, *, causal: bool, pass_: str, do: torch.Tensor | None = None) -> "Plan":
    """The Plan of one pass of `attend` at q, k, v (the check is the caller's):

        forward            call: attend(q, k, v)
        forward+backward   call: (dQ, dK, dV) of a fresh forward for dO, through torch.autograd.grad
        backward           call: (dQ, dK, dV) through the graph of one forward made here, outside every timed call
                           (retain_graph: each call walks the same graph)

    A backward pass takes q, k, v as leaves that require grad (the caller's tensors are left as they are), and
    carries its forward alone, whose leftovers are held_bytes; its forward records a graph whatever the caller's
    grad mode."""
    if pass_ == "forward":
        return Plan(lambda: attend(q, k, v, causal=causal), inputs=(q, k, v))
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))

    def forward():
        with torch.enable_grad():
            return attend(q, k, v, causal=causal)

    if pass_ == "forward+backward":
        return Plan(lambda: torch.autograd.grad(forward(), (q, k, v), do), forward=forward, inputs=(q, k, v, do))
    o = forward()
    return Plan(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), forward=forward,
                inputs=(q, k, v, do), not_captured=NOT_CAPTURED)


def held_pass(forward, dev: torch.device, inputs=()) -> float:
    """Bytes one call of `forward` leaves allocated for the backward, its output and `inputs` excluded: on CUDA the
    allocator's count after it returns less before it, less the output; on a CPU (no allocator statistics) the
    storages torch.autograd saved (saved_tensors_hooks sees every tensor a backward node keeps)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_allocated(dev)
        o = forward()
        torch.cuda.synchronize(dev)
        return float(torch.cuda.memory_allocated(dev) - before - o.untyped_storage().nbytes())
    saved: dict = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o = forward()
    theirs = {t.untyped_storage().data_ptr() for t in (*inputs, o)}
    return float(sum(n for ptr, n in saved.items() if ptr not in theirs))


# -- the timers: (plan, dev) -> the row's timing fields -------------------------------------------------------------

@dataclass(frozen=True)
class Graphed:
    """The sweep's timer (module docstring, warm): the call and its consumption step captured once in a CUDA graph
    and replayed under do_bench (CPU: the wall clock around each call, the cache flushed between); then the host's
    cost to issue a call, and on CUDA the call issued eagerly back to back. Fields: ms, ms_p20, ms_p80, reps, timer,
    checksum, host_ms, eager_ms, timing_note, and with `load` (an open attnlab.telemetry.LoadLog) the card's clock,
    power and clock-event reasons over the timed repetitions."""

    warmup_ms: float = 25.0
    reps_ms: float = 100.0
    min_reps: int = 5
    load: object = None

    def __call__(self, plan: "Plan", dev: torch.device) -> dict:
        acc = torch.zeros((), dtype=torch.float32, device=dev)
        calls = [0]

        def step():  # the timed call: attention, then consume its output (no sync, no print)
            calls[0] += 1
            acc.add_(checksum_of(plan.call()))

        # The graph is freed inside _time_call, before any eager call below: while it lives, its pool holds the
        # call's intermediates (S and P) and the eager calls need their own (at N = 16384, sdpa_math's do not fit
        # beside the graph's).
        t0 = time.time()
        times, timer, why = _time_call(step, acc, calls, dev, not_captured=plan.not_captured,
                                       warmup_ms=self.warmup_ms, reps_ms=self.reps_ms, min_reps=self.min_reps)
        out = dict(self.load.window(t0, time.time())) if self.load is not None else {}
        ms = statistics.median(times)
        out.update(checksum=acc.item() / calls[0], ms=ms, ms_p20=percentile(times, 20),
                   ms_p80=percentile(times, 80), reps=len(times), timer=timer)  # the one read of acc
        # what issuing one call eagerly costs (a user calling from Python pays it); a few calls suffice past 1 ms,
        # where the probe's sync would otherwise wait on 20 slow calls (20 s for a 1-second call)
        out["host_ms"] = host_ms(step, dev, calls=20 if ms < 1 else 3)
        if dev.type == "cuda":  # as a user calls it: back to back from Python, launch cost included
            out["eager_ms"] = eager_ms(step, dev, reps_ms=self.reps_ms, min_reps=self.min_reps)[0]
        graphed_ok = timer.endswith("+graph")
        out["timing_note"] = "; ".join(x for x in (why, "" if graphed_ok else timing_note(ms, out["host_ms"])) if x)
        return out


@dataclass(frozen=True)
class Replays:
    """The benchmark's timer: the call captured `repeats` times, each graph in a memory pool of its own (so its
    buffers lie elsewhere) and timed alone under do_bench, then freed before the next capture. Fields: ms (the
    median of the graphs' medians), ms_min, ms_max, timer, graph_ms (each graph's time, JSON), eager_ms (CUDA), and
    with `load` the card's clock, power and clock-event reasons over all the graphs and each graph's own clock
    (graph_mhz, JSON): a slow graph at a low clock is the power cap, not the graph."""

    repeats: int = 1
    load: object = None
    warmup_ms: float = 100.0
    reps_ms: float = 100.0
    min_reps: int = 10

    def __call__(self, plan: "Plan", dev: torch.device) -> dict:
        timing = dict(warmup_ms=self.warmup_ms, reps_ms=self.reps_ms, min_reps=self.min_reps)
        times, clocks, graphs, t0 = [], [], [], time.time()
        try:
            for _ in range(self.repeats):
                run, why = ((plan.call, plan.not_captured) if plan.not_captured and dev.type == "cuda"
                            else graphed(plan.call, dev, graphs))
                t1 = time.time()
                times.append(statistics.median(_time(run, dev, **timing)[0]))
                if self.load is not None:
                    clocks.append(self.load.window(t1, time.time())["sm_clock_mhz"])
                graphs.clear()  # the graph's pool: the next capture gets a fresh one, and it would count in the peak
        finally:
            graphs.clear()
        out = dict(ms=statistics.median(times), ms_min=min(times), ms_max=max(times),
                   timer="do_bench+graph" if run is not plan.call else f"do_bench ({why})",
                   graph_ms=json.dumps([round(t, 5) for t in times]))
        if self.load is not None:
            out.update(self.load.window(t0, time.time()), graph_mhz=json.dumps(clocks))
        if dev.type == "cuda":  # beside the graphs' time, the call as a user's loop issues it: launch cost included
            out["eager_ms"] = eager_ms(plan.call, dev, reps_ms=self.reps_ms, min_reps=self.min_reps)[0]
        return out


@dataclass(frozen=True)
class Eager:
    """The call as a user's loop issues it: `windows` windows of calls back to back (eager_ms: CUDA events around
    each window, launch cost included, nothing synced between calls). Fields: ms (the median window's time per
    call), ms_p20, ms_p80, reps (calls in all windows), timer."""

    windows: int = 1
    reps_ms: float = 100.0
    min_reps: int = 3

    def __call__(self, plan: "Plan", dev: torch.device) -> dict:
        times, calls, timer = [], 0, ""
        for _ in range(self.windows):
            ms, n, timer = eager_ms(plan.call, dev, reps_ms=self.reps_ms, min_reps=self.min_reps)
            times.append(ms)
            calls += n
        return dict(ms=statistics.median(times), ms_p20=percentile(times, 20), ms_p80=percentile(times, 80),
                    reps=calls, timer=timer)


# -- the pipeline -------------------------------------------------------------------------------------------------

@dataclass
class Plan:
    """One call to measure and what goes with it, as the caller's `prepare` makes it."""

    call: Callable[[], object]
    check: Callable[[object], dict] | None = None  # fields from the first output, against the fp64 oracle
    forward: Callable[[], object] | None = None  # a backward pass's forward alone: what it leaves is held_bytes
    inputs: tuple = ()  # the tensors the call reads (never counted as held)
    after: Callable[[object, dict], dict] | None = None  # the caller's last step: (first output, fields) -> fields
    not_captured: str = ""  # why the call must not be captured in a CUDA graph ('' where it may be)


@dataclass
class Measured:
    """What the pipeline found: every step's fields in the order measured (after a failure, those of the steps
    before it), the first call's output (None after a failure) and the error that stopped it."""

    fields: dict = field(default_factory=dict)
    out: object = None
    error: Exception | None = None


def pipeline(prepare: Callable[[], Plan], dev: torch.device, timer, *, base: str = "", peak: bool = True
             ) -> Measured:
    """The measurement recipe (module docstring), once: prepare, cold, held, check, timer, peak, after. `timer`
    (Graphed, Replays, Eager or the caller's own) takes the plan and the device and returns its fields; `base` names
    the build whose torch.compile is watched (CompileWatch); `peak` False skips the peak pass. Never raises what a
    step raises: it is Measured.error, and what the failure left is freed (release)."""
    got = Measured()
    f = got.fields
    try:
        watch = CompileWatch(base)
        plan = prepare()
        f["cold_s"], got.out = cold_call(plan.call, dev)
        watch.cold_done()
        if plan.forward is not None:
            f["held_bytes"] = held_pass(plan.forward, dev, plan.inputs)
        if plan.check is not None:
            f.update(plan.check(got.out))
        f.update(timer(plan, dev))
        f.update(watch.note())
        if peak:
            f.update(peak_fields(plan.call, dev))
        if plan.after is not None:
            f.update(plan.after(got.out, f))
    except Exception as e:  # a failing build is the caller's row status, never the end of a sweep
        got.error, got.out = e, None
        release(dev)  # a failure's traceback holds frames (and their tensors) in reference cycles
    return got


def peak_fields(call, dev: torch.device) -> dict:
    """peak_bytes and peak_note of one call in a pass of its own (peak_pass): running out of memory there loses
    the peak, not what was measured before it."""
    try:
        peak, note, _ = peak_pass(call, dev)
    except Exception as e:
        if not is_oom(e):
            raise
        release(dev)
        return dict(peak_bytes=math.nan, peak_note=one_line(f"the peak pass ran out of memory: {e}"))
    return dict(peak_bytes=peak, peak_note=note)


def case_plan(case: Case, seed: int = 0, ref_budget_bytes: int = REF_BUDGET) -> Plan:
    """The case's inputs (make_inputs; a backward pass's dO, grad_output) and the call of its pass, its first output
    checked against the fp64 oracle on a ref_slice (err, err_limit, err_note)."""
    build = builds.get(case.build)
    q, k, v = make_inputs(case, seed)
    if case.pass_ == "forward":
        plan = pass_plan(build.attend, q, k, v, causal=case.causal, pass_="forward")
        plan.check = lambda o: _error(case, q, k, v, o, ref_budget_bytes, build.ablation)
        return plan
    do = grad_output(case, seed)
    plan = pass_plan(differentiable(case.build), q, k, v, causal=case.causal, pass_=case.pass_, do=do)
    plan.check = lambda grads: _error(case, q, k, v, grads, ref_budget_bytes, do=do)
    return plan


# -- the row ------------------------------------------------------------------------------------------------------

def blank_row() -> dict:
    """Every column, unknown: NaN for numbers, '' for text, 0 repetitions; the pass the forward, as in a file
    written before the backward's columns (schema.BEFORE_BACKWARD)."""
    empty = {"str": "", "float": math.nan, "int": 0, "bool": False}
    return {c: BEFORE_BACKWARD["pass"] if c == "pass" else empty[TYPES[c]] for c in COLUMNS}


def base_row(case: Case, *, ceilings: dict, run_id: str = "") -> dict:
    """The row's identity, model numbers and ceilings: everything known before the build runs. The byte model
    (attnlab.cost) counts the forward: a backward pass's row has 0 for the bytes it moves and holds."""
    build = builds.get(case.build)
    dev = torch.device(case.device)
    forward = case.pass_ == "forward"
    row = blank_row()
    row.update(
        run_id=run_id, case_id=case.case_id, build=build.name, family=build.family, base=build.base,
        ablation=build.ablation or "", B=case.B, H=case.H, Hkv=case.Hkv, N=case.N, D=case.D, dtype=case.dtype,
        causal=bool(case.causal), mask=case.mask, device=str(dev), device_name=provenance.device_name(str(dev)),
        hold_bytes=cost.hold_bytes(case) if forward else 0, flops=cost.flops(case),
        bytes_moved=cost.bytes_moved(case) if forward else 0,
        ceiling_tflops=float(ceilings["tflops"]), ceiling_tbps=float(ceilings["tbps"]),
        started=provenance.now(), code=provenance.code_hash(),
    )
    row["pass"] = case.pass_
    return row


def judge_slice(case: Case, b: int, h: int, o, q, k, v, ablation=None):
    """attnlab.accuracy.judge on batches 0:b and query heads 0:h (a ref_slice), with the k/v heads those query
    heads read (ref_slice keeps whole groups of H/Hkv)."""
    hk = h // (case.H // case.Hkv)
    return judge(o[:b, :h], q[:b, :h], k[:b, :hk], v[:b, :hk], causal=case.causal, ablation=ablation)


def grad_verdict(case: Case, b: int, h: int, grads, q, k, v, do):
    """(name, Verdict) of the gradient nearest its limit (largest err / limit) under attnlab.accuracy's rule for
    gradients (grad_refs, judge_grads: each of dQ, dK, dV against torch.autograd through the oracle in float64) on
    batches 0:b and query heads 0:h, with the k/v heads those read (each k/v head's gradient sums over its whole
    group, which ref_slice keeps); None where this checkout's attnlab.accuracy has no rule for gradients."""
    if not hasattr(accuracy, "judge_grads"):
        return None
    hk = h // (case.H // case.Hkv)
    dq, dk, dv = grads
    refs = accuracy.grad_refs(do[:b, :h], q[:b, :h].detach(), k[:b, :hk].detach(), v[:b, :hk].detach(),
                              causal=case.causal)
    verdicts = accuracy.judge_grads((dq[:b, :h], dk[:b, :hk], dv[:b, :hk]), refs)
    return max(verdicts.items(), key=lambda item: item[1].err / item[1].limit)


def _error(case: Case, q, k, v, out, budget: int, ablation=None, do=None) -> dict:
    """err, err_limit and err_note of the first output: O, or with `do` the gradients (whose fp64 reference holds
    about twice the forward's scores: it gets half the budget)."""
    b, h, note = ref_slice(case, budget if do is None else budget // 2)
    notes = [note] if note else []
    try:
        if do is None:
            verdict = judge_slice(case, b, h, out, q, k, v, ablation)
        else:
            found = grad_verdict(case, b, h, out, q, k, v, do)
            if found is None:
                notes.append("gradients not checked: this checkout's attnlab.accuracy has no rule for them")
                return dict(err=math.nan, err_limit=math.nan, err_note="; ".join(notes))
            which, verdict = found
            notes.append(f"err of {which}, the gradient nearest its limit")
    except Exception as e:  # the reference failing says nothing about the build's timing
        why = oom_status(e, 0) if is_oom(e) else f"{type(e).__name__}: {e}"
        return dict(err=math.nan, err_limit=math.nan,
                    err_note=one_line("; ".join(notes + [f"reference failed: {why}"])))
    if not verdict.ok:
        notes.append(f"FAILS accuracy rule: err {verdict.err:.3g} > limit {verdict.limit:.3g}")
    return dict(err=verdict.err, err_limit=verdict.limit, err_note="; ".join(notes))


def measure(case: Case, *, ceilings: dict, reps_ms: float = 100.0, warmup_ms: float = 25.0, min_reps: int = 5,
            ref_budget_bytes: int = REF_BUDGET, seed: int = 0, run_id: str = "", load=None) -> dict:
    """Measure one case; always return a complete row (a failing build is a status, never an exception).

    The pipeline with the Graphed timer; this row's own fields: the tiles our kernels ran with (a forward pass's),
    the consumption step alone, alloc_flag, the rates. `ceilings` is attnlab.ceilings.measure's dict for the run.
    `load`: an open attnlab.telemetry.LoadLog, whose samples over the timed repetitions give the row's clock, power
    and clock-event reasons. An unknown build name raises ValueError: that is the caller's mistake, not a
    measurement."""
    build = builds.get(case.build)
    row = base_row(case, ceilings=ceilings, run_id=run_id)
    dev = torch.device(case.device)
    timing = dict(warmup_ms=warmup_ms, reps_ms=reps_ms, min_reps=min_reps)

    def prepare() -> Plan:
        plan = case_plan(case, seed, ref_budget_bytes)
        if build.family != "library" and case.pass_ == "forward":  # the backward's kernels have tiles of their own
            spec = check(*plan.inputs, causal=case.causal)
            row["tiles"] = json.dumps(launch.tile_config(build.base, spec, build.ablation), sort_keys=True)
        plan.after = lambda out, fields: consumption(out, fields, dev, **timing)
        return plan

    got = pipeline(prepare, dev, Graphed(load=load, **timing), base=build.base)
    row.update(got.fields)
    if got.error is None:
        row.update(status="ok", alloc_flag=alloc_flag(row["peak_bytes"], row["hold_bytes"], build.holds))
    else:
        row.update(failure_fields(got.error, row["hold_bytes"]))
    return rates(row)


def consumption(out, fields: dict, dev: torch.device, **timing) -> dict:
    """consume_ms, the consumption step timed alone (_consume_ms), and timing_note with why it was not captured."""
    ms, why = _consume_ms(out, dev, **timing)
    notes = (fields.get("timing_note", ""), f"consumption step: {why}" if why else "")
    return dict(consume_ms=ms, timing_note="; ".join(x for x in notes if x))


def failure_fields(e: BaseException, hold: int) -> dict:
    """The row's status (and compile_note) for a case that raised: unsupported, the recompile limit refused, out
    of memory, or an error."""
    if isinstance(e, Unsupported):
        return dict(status=one_line(f"unsupported: {e}"))
    if is_recompile_limit(e) and not is_oom(e):
        return dict(status=one_line(f"error: {type(e).__name__}: torch._dynamo hit its recompile limit"),
                    compile_note=one_line(f"recompile-limit fallback to eager refused (the row would have timed "
                                          f"eager code): {e}"))
    return dict(status=failure_status(e, hold))


def release(dev: torch.device) -> None:
    """Free what a failed case left: collect reference cycles, return cached blocks to the device."""
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def rates(row: dict) -> dict:
    """Achieved TFLOP/s and TB/s at the median time net of the consumption step, and their % of the run's
    ceilings (NaN without a time, and TB/s without a byte count)."""
    ms = less_consumption(row["ms"], row["consume_ms"])
    if isinstance(ms, float) and math.isfinite(ms) and ms > 0:
        row["tflops"] = row["flops"] / (ms * 1e-3) / 1e12
        row["pct_flops"] = 100 * row["tflops"] / row["ceiling_tflops"]
        if row["bytes_moved"] > 0:
            row["tbps"] = row["bytes_moved"] / (ms * 1e-3) / 1e12
            row["pct_bw"] = 100 * row["tbps"] / row["ceiling_tbps"]
    return row


# -- the benchmark's case: graph-replayed time, with repeats (attnlab.bench, attnlab.autotune) ---------------------

def bench_case(name, B, H, N, D, dtype, causal, device="cuda", Hkv=None, pass_="forward") -> Case:
    """A benchmark shape as a Case: Hkv key/value heads (grouped-query attention), H of them by default."""
    return Case(name, B, H, Hkv or H, N, D, dtype, causal, device, pass_)


def oracle_check(name, o, q, k, v, causal):
    """Accuracy of build `name` (an ablation against its own stand-in's reference) on the batch·head slice whose
    fp64 scores fit the harness's budget (ref_slice)."""
    B, H, N, D = q.shape
    case = Case(name, B, H, k.shape[1], N, D, q.dtype, causal, str(q.device))
    b, h, _ = ref_slice(case, REF_BUDGET)
    return judge_slice(case, b, h, o, q, k, v, builds.get(name).ablation)


BENCH_TIMING = dict(warmup_ms=100.0, reps_ms=100.0, min_reps=10)  # the benchmark's and the autotune's settings
# time_case's keys in the order a bench row holds them (any other field of the pipeline's after them, but the
# peak's note, which a bench row does not carry)
BENCH_KEYS = ("cold_s", "ms", "ms_min", "ms_max", "status", "o", "timer", "compile_note", "graph_ms", "sm_clock_mhz",
              "power_w", "clock_reasons", "graph_mhz", "eager_ms", "peak_bytes", "held_bytes")


def time_case(name, q, k, v, causal, repeats: int = 1, load=None, pass_: str = "forward", **timing) -> dict:
    """cold_s, ms (warm median), ms_min and ms_max, status, o (the output: O, or a backward pass's gradients),
    timer, peak_bytes, eager_ms (CUDA: the call issued eagerly back to back, as a user calls it), for a
    torch.compile'd build compile_note, graph_ms (each graph's time, JSON), for a backward pass held_bytes, and with
    `load` (an open attnlab.telemetry.LoadLog) the card's clock, power and clock-event reasons over the timed
    graphs, and each graph's own clock (graph_mhz, JSON). The pipeline with the Replays timer (`timing` as measure
    takes it, BENCH_TIMING by default): at N = 512 launching a call from Python can take longer than its kernels,
    and the library rows launch from C++. With `repeats` > 1 the call is captured that many times, each timed
    alone: ms is the median of their medians, ms_min and ms_max their range (a single graph's time carries 2–7 %,
    partly where P lies in memory). A call that cannot be captured is timed eagerly and says so in `timer`. As in
    the sweep, a compiled build (flex) starts each shape from a reset torch._dynamo (a bench of many shapes never
    reaches its recompile limit) and its row says so, and says if anything compiled while it was timed; peak_bytes
    comes from a pass of its own after the timing. `pass_` (attnlab.schema.PASSES) times the build's backward
    (dO: grad_output of the shape) or forward+backward instead of its forward."""
    timing = {**BENCH_TIMING, **timing}
    b = builds.get(name)
    dev = torch.device("cuda")

    def prepare() -> Plan:
        if pass_ == "forward":
            return pass_plan(b.attend, q, k, v, causal=causal, pass_=pass_)
        B, H, N, D = q.shape
        do = grad_output(Case(name, B, H, k.shape[1], N, D, q.dtype, causal, str(q.device), pass_))
        return pass_plan(differentiable(name), q, k, v, causal=causal, pass_=pass_, do=do)

    got = pipeline(prepare, dev, Replays(repeats, load, **timing), base=b.base)
    nan = float("nan")
    e = got.error
    if e is None:
        fields = {**got.fields, "status": "ok", "o": got.out}
        return {key: fields[key] for key in (*BENCH_KEYS, *fields) if key in fields and key != "peak_note"}
    if isinstance(e, Unsupported):
        status = f"unsupported: {e}"
    elif isinstance(e, torch.OutOfMemoryError):
        status = "oom"
    else:  # a failing row is recorded, the benchmark goes on
        status = one_line(f"error: {type(e).__name__}: {e}", 600)
    return dict(cold_s=nan, ms=nan, status=status, o=None, timer="")


def eager_ms(call, dev: torch.device, *, reps_ms: float = 100.0, min_reps: int = 3, max_reps: int = 1000
             ) -> tuple[float, int, str]:
    """(ms per call, calls, timer) of `call` issued eagerly, back to back, as a user calls a build from Python.

    Unlike `measure`'s graph replays this time includes Python's cost to launch each call and the allocator's work
    between calls, with no cache flush: what a caller of the build pays, not the kernels' own time. One warm call
    sizes the window (`reps_ms`, at least `min_reps` calls); CUDA events bracket the whole window, so nothing syncs
    between calls. The caller makes the cold (first) call first. On a CPU the same with time.perf_counter (there,
    with Triton's interpreter, the time measures Python: never present it as speed)."""
    dev = torch.device(dev)
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def window(n: int) -> float:
            start.record()
            for _ in range(n):
                call()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        timer = "cuda events, eager back to back"
    else:
        def window(n: int) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            return (time.perf_counter() - t0) * 1e3
        timer = "perf_counter, eager back to back"
    one = window(1)
    n = int(min(max_reps, max(min_reps, math.ceil(reps_ms / one) if one > 0 else max_reps)))
    return window(n) / n, n, timer
