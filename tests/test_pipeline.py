"""attnlab.measure.pipeline, the measurement recipe written once, on the CPU: its steps in order, a failing step
kept as the error with the earlier steps' fields, the peak pass's out of memory losing the peak alone, and the
timers each caller chooses (Graphed, Replays, Eager)."""
import math

import pytest
import torch

from attnlab import measure as m

CPU = torch.device("cpu")


class FakeCUDA:
    type = "cuda"


def recorder():
    """A plan whose every step appends its name to `seen`; its call returns a tensor of ones."""
    seen = []

    def call():
        seen.append("call")
        return torch.ones(2, 3)

    def prepare():
        seen.append("prepare")
        return m.Plan(call, check=lambda o: seen.append("check") or {"err": float(o.sum())},
                      after=lambda o, fields: seen.append("after") or {"seen_ms": fields["ms"]})

    def timer(plan, dev):
        seen.append("timer")
        plan.call()
        return {"ms": 1.5, "timer": "fake"}

    return seen, prepare, timer


def test_the_steps_run_in_order_and_each_adds_its_fields():
    seen, prepare, timer = recorder()
    got = m.pipeline(prepare, CPU, timer)
    assert got.error is None and torch.equal(got.out, torch.ones(2, 3))  # the cold call's output
    # prepare, the cold call, the check on its output, the timer, the peak pass (a call of its own), after
    assert seen == ["prepare", "call", "check", "timer", "call", "call", "after"]
    assert list(got.fields) == ["cold_s", "err", "ms", "timer", "peak_bytes", "peak_note", "seen_ms"]
    assert got.fields["cold_s"] > 0 and got.fields["err"] == 6.0 and got.fields["seen_ms"] == 1.5
    assert math.isnan(got.fields["peak_bytes"]) and got.fields["peak_note"].startswith("n/a: CPU")
    seen.clear()
    assert "peak_bytes" not in m.pipeline(prepare, CPU, timer, peak=False).fields and seen.count("call") == 2


def test_a_failing_step_is_the_error_and_the_earlier_fields_stay():
    seen, prepare, _ = recorder()

    def breaks(plan, dev):
        raise RuntimeError("the timer broke")

    got = m.pipeline(prepare, CPU, breaks)
    assert isinstance(got.error, RuntimeError) and got.out is None
    assert list(got.fields) == ["cold_s", "err"]  # cold and check ran; nothing after the timer did
    assert "after" not in seen

    def no_inputs():
        raise torch.OutOfMemoryError("no room for q")

    got = m.pipeline(no_inputs, CPU, breaks)
    assert isinstance(got.error, torch.OutOfMemoryError) and got.fields == {}


def test_out_of_memory_in_the_peak_pass_loses_the_peak_not_the_time(monkeypatch):
    _, prepare, timer = recorder()
    monkeypatch.setattr(m, "peak_pass", lambda call, dev: (_ for _ in ()).throw(torch.OutOfMemoryError("full")))
    got = m.pipeline(prepare, CPU, timer)
    assert got.error is None and got.fields["ms"] == 1.5 and math.isnan(got.fields["peak_bytes"])
    assert got.fields["peak_note"] == "the peak pass ran out of memory: full"
    monkeypatch.setattr(m, "peak_pass", lambda call, dev: (_ for _ in ()).throw(RuntimeError("not memory")))
    assert isinstance(m.pipeline(prepare, CPU, timer).error, RuntimeError)  # any other failure is the row's


def test_a_compiled_build_is_watched_from_before_its_inputs(monkeypatch):
    counts, resets = iter([4, 5, 7]), []
    monkeypatch.setattr(m, "_dynamo_reset", lambda: resets.append(1))
    monkeypatch.setattr(m, "_graphs", lambda: next(counts))
    _, prepare, timer = recorder()
    got = m.pipeline(prepare, CPU, timer, base="flex")
    assert resets == [1] and "1 graph(s) compiled there, 2 while timing: RECOMPILED" in got.fields["compile_note"]
    assert "compile_note" not in m.pipeline(prepare, CPU, timer, base="fused").fields


def test_the_eager_timer_gives_the_median_window_and_counts_every_call():
    calls = []
    plan = m.Plan(lambda: calls.append(1))
    t = m.Eager(windows=3, reps_ms=0.5, min_reps=4)(plan, CPU)
    assert t["timer"] == "perf_counter, eager back to back" and t["reps"] >= 12
    assert len(calls) == t["reps"] + 3  # each window sizes itself from one call first
    assert 0 < t["ms_p20"] <= t["ms"] <= t["ms_p80"]


def test_the_graphed_timer_consumes_every_timed_call():
    x = torch.arange(6.0).reshape(2, 3)
    t = m.Graphed(warmup_ms=0.0, reps_ms=1.0, min_reps=3)(m.Plan(lambda: x * 2), CPU)
    assert t["checksum"] == 30.0 and t["timer"] == "perf_counter" and t["reps"] >= 3  # the mean of (2x).sum()
    assert 0 < t["ms_p20"] <= t["ms"] <= t["ms_p80"] and t["timing_note"] == "" and math.isnan(t["host_ms"])
    grads = (torch.ones(2), torch.full((3,), 2.0))  # a backward's output: each gradient's sum, summed
    assert m.Graphed(warmup_ms=0.0, reps_ms=1.0, min_reps=3)(m.Plan(lambda: grads), CPU)["checksum"] == 8.0


def cuda_stand_ins(monkeypatch):
    """The GPU pieces of the graph timers stood in for on a CPU; returns the list of calls graphed() captured."""
    captured = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: None)
    monkeypatch.setattr(m, "graphed", lambda step, dev, graphs: captured.append(step) or (step, ""))
    monkeypatch.setattr(m, "_time", lambda step, dev, **kw: ([(step(), 2.0)[1]] * 3, "do_bench"))
    monkeypatch.setattr(m, "host_ms", lambda step, dev, calls=20: 0.1)
    monkeypatch.setattr(m, "eager_ms", lambda step, dev, **kw: (2.5, 10, "stand-in"))
    return captured


def test_a_call_that_must_not_be_captured_is_timed_eagerly_and_says_why(monkeypatch):
    """A backward alone runs on the stream of a forward made outside any capture: the graph timers time it eagerly,
    and the row's timer and timing_note say so; a call that may be captured goes through graphed()."""
    captured = cuda_stand_ins(monkeypatch)
    acc, calls = torch.zeros(()), [0]

    def step():
        calls[0] += 1
        acc.add_(1.0)

    timing = dict(warmup_ms=0.0, reps_ms=1.0, min_reps=3)
    times, timer, why = m._time_call(step, acc, calls, FakeCUDA(), not_captured=m.NOT_CAPTURED, **timing)
    assert captured == [] and (timer, why) == ("do_bench", m.NOT_CAPTURED) and calls[0] == float(acc) == 1
    plan = m.Plan(lambda: torch.ones(1), not_captured=m.NOT_CAPTURED)
    r = m.Replays(repeats=2)(plan, FakeCUDA())
    assert captured == [] and r["timer"] == f"do_bench ({m.NOT_CAPTURED})" and r["graph_ms"] == "[2.0, 2.0]"
    m._time_call(step, acc, calls, FakeCUDA(), **timing)
    plan.not_captured = ""
    m.Replays(repeats=2)(plan, FakeCUDA())
    assert len(captured) == 3  # one capture for the sweep's timer, one per repeat for the benchmark's
    m._time_call(step, acc, calls, CPU, not_captured=m.NOT_CAPTURED, **timing)
    assert len(captured) == 4  # a CPU has no graphs to refuse: graphed() is the identity there


def test_each_caller_chooses_its_timer():
    """The sweep's row, the explorer's live call and the benchmark differ in the timer alone; on a CPU the first is
    the wall clock around each call and the second back-to-back windows."""
    case = m.Case("torch_eager", 1, 2, 2, 16, 8, "float32", False, "cpu")
    fast = dict(ceilings=dict(tbps=1.0, tflops=1.0), reps_ms=1.0, warmup_ms=0.0, min_reps=3)
    from attnlab import explore

    row, live = m.measure(case, **fast), explore.measure_live(case, reps_ms=1.0)
    assert (row["timer"], live["timer"]) == ("perf_counter", "perf_counter, eager back to back")
    assert row["err"] == pytest.approx(live["err"]) and live["passed"] and row["status"] == "ok"
