"""One case measured on the CPU (Triton kernels in the interpreter): complete rows, honest statuses, a checksum that
is the output's, the reference on a slice, and the guards (under-allocation, accuracy, compiled fallback)."""
import gc
import json
import math
import time
from pathlib import Path

import pytest
import torch

from attnlab import builds, cost
from attnlab import measure as m
from attnlab.builds import Build, Unsupported
from attnlab.measure import Case, measure
from attnlab.reference import attend as oracle
from attnlab.schema import COLUMNS

CEIL = dict(tbps=0.05, tflops=0.2)  # stand-in ceilings: the row's % must follow from them
FAST = dict(ceilings=CEIL, reps_ms=1.0, warmup_ms=0.0, min_reps=3)


def case(build="fused", N=64, D=16, causal=False, B=1, H=2, Hkv=2, dtype="float32"):
    return Case(build, B, H, Hkv, N, D, dtype, causal, "cpu")


def fake_build(monkeypatch, name, attend, holds="none", family="library"):
    monkeypatch.setitem(builds.BUILDS, name, Build(name, attend, family, name, None, "a test build"))
    monkeypatch.setitem(cost.HOLDS, name, holds)


def test_case_keeps_dtype_by_name_and_a_stable_id():
    c = Case("fused-zero_mask", 1, 2, 1, 64, 16, torch.bfloat16, True, "cpu")
    assert c.dtype == "bfloat16" and c.torch_dtype is torch.bfloat16 and c.mask == "zero"
    assert c.case_id == "fused-zero_mask|1|2|1|64|16|bfloat16|True|zero"
    assert c == Case("fused-zero_mask", 1, 2, 1, 64, 16, "bfloat16", True, "cpu")


def test_a_fused_row_is_complete_and_consistent():
    row = measure(case("fused", causal=True), run_id="r1", **FAST)
    assert list(row) == list(COLUMNS)
    assert row["status"] == "ok" and row["run_id"] == "r1" and row["timer"] == "perf_counter"
    assert (row["family"], row["base"], row["ablation"], row["mask"]) == ("ours", "fused", "", "none")
    assert row["cold_s"] > 0 and row["reps"] >= 3
    assert 0 < row["ms_p20"] <= row["ms"] <= row["ms_p80"]
    assert 0 < row["consume_ms"]
    # peak on a CPU: unknown, with the reason, never 0
    assert math.isnan(row["peak_bytes"]) and row["peak_note"] == "n/a: CPU has no allocator statistics"
    assert row["alloc_flag"] == ""
    assert 0 <= row["err"] < row["err_limit"] and row["err_note"] == ""
    c = case("fused", causal=True)
    assert (row["flops"], row["bytes_moved"], row["hold_bytes"]) == (cost.flops(c), cost.bytes_moved(c),
                                                                   cost.hold_bytes(c))
    net = row["ms"] - row["consume_ms"]  # rates leave out the consumption step
    assert 0 < net < row["ms"]
    assert row["tflops"] == pytest.approx(row["flops"] / (net * 1e-3) / 1e12)
    assert row["tbps"] == pytest.approx(row["bytes_moved"] / (net * 1e-3) / 1e12)
    assert row["pct_flops"] == pytest.approx(100 * row["tflops"] / 0.2)
    assert row["pct_bw"] == pytest.approx(100 * row["tbps"] / 0.05)
    assert (row["ceiling_tflops"], row["ceiling_tbps"]) == (0.2, 0.05)
    assert set(json.loads(row["tiles"])) == {"fused"}


def test_ablation_and_library_rows_say_what_they_are():
    zm = measure(case("qk_softmax-zero_mask"), **FAST)
    assert zm["status"] == "ok" and zm["mask"] == "zero" and zm["ablation"] == "zero_mask"
    assert zm["family"] == "ablation" and zm["base"] == "qk_softmax"
    assert set(json.loads(zm["tiles"])) == {"qk_softmax", "pv"}
    lib = measure(case("torch_eager"), **FAST)
    assert lib["status"] == "ok" and lib["tiles"] == "" and lib["family"] == "library"


def test_checksum_is_the_consumed_output_and_follows_the_inputs():
    for build in ("fused", "fused-no_pv"):
        a, b, a2 = (measure(case(build), seed=s, **FAST) for s in (0, 1, 0))
        for r in (a, b):
            assert math.isfinite(r["checksum"]) and r["checksum"] != 0
        assert a["checksum"] != b["checksum"]  # other inputs, other output, other checksum
        assert a["checksum"] == pytest.approx(a2["checksum"], rel=1e-6)
        # it is the sum of this build's output on the case's inputs (mean over calls), not a constant
        q, k, v = m.make_inputs(case(build), 0)
        expected = oracle(q, k, v, ablation=builds.get(build).ablation).sum().item()
        assert a["checksum"] == pytest.approx(expected, rel=1e-4, abs=1e-3)


def test_every_build_of_a_shape_gets_the_same_inputs():
    fused, eager = measure(case("fused"), **FAST), measure(case("torch_eager"), **FAST)
    assert fused["checksum"] == pytest.approx(eager["checksum"], rel=1e-4, abs=1e-3)


def test_an_unsupported_build_is_a_status_with_its_reason(monkeypatch):
    def refuses(q, k, v, **kw):
        raise Unsupported("no kernel for this\ncase here")

    fake_build(monkeypatch, "refuses", refuses)
    row = measure(case("refuses"), **FAST)
    assert row["status"] == "unsupported: no kernel for this case here"
    assert math.isnan(row["ms"]) and math.isnan(row["err"]) and row["reps"] == 0
    assert list(row) == list(COLUMNS)


def test_an_exception_is_an_error_row_on_one_line(monkeypatch):
    calls = []

    def breaks(q, k, v, **kw):
        calls.append(1)
        if len(calls) > 1:  # the cold call succeeds, a warm one breaks: the cold figure is kept
            raise RuntimeError("boom\n  at line 2")
        return q.clone()

    fake_build(monkeypatch, "breaks", breaks)
    row = measure(case("breaks"), **FAST)
    assert row["status"] == "error: RuntimeError: boom at line 2"
    assert row["cold_s"] > 0 and math.isnan(row["ms"])


@pytest.mark.parametrize("message, wanted", [
    ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB", 2 << 30),
    ("CUDA out of memory. Tried to allocate 512.00 MiB.", 512 << 20),
    ("out of memory", None),  # no size in the message: the model's hold_bytes
])
def test_out_of_memory_is_an_oom_row_with_the_bytes_wanted(monkeypatch, message, wanted):
    def hungry(q, k, v, **kw):
        raise torch.OutOfMemoryError(message)

    fake_build(monkeypatch, "hungry", hungry, holds="S+P")
    row = measure(case("hungry"), **FAST)
    wanted = wanted if wanted is not None else cost.hold_bytes(case("hungry"))
    assert row["status"].startswith(f"oom: {wanted} bytes wanted")
    assert math.isnan(row["ms"])


def test_ref_slice_takes_batches_then_whole_head_groups():
    per_head = 64 * 64 * 8
    c = case(B=4, H=8, Hkv=2, N=64)
    assert m.ref_slice(c, 4 * 8 * per_head) == (4, 8, "")
    assert m.ref_slice(c, 2 * 8 * per_head + 5) == (2, 8, "reference on batch 0:2 of 4")
    # under one batch: heads in multiples of H/Hkv = 4, so every query head keeps its k/v head
    assert m.ref_slice(c, 7 * per_head) == (1, 4, "reference on batch 0:1 of 4, heads 0:4 of 8")
    assert m.ref_slice(c, 1) == (1, 4, "reference on batch 0:1 of 4, heads 0:4 of 8")


def test_error_on_a_slice_says_so_and_stays_right_under_gqa():
    c = case("fused", B=2, H=4, Hkv=2, N=64, causal=True)
    row = measure(c, ref_budget_bytes=2 * 64 * 64 * 8, **FAST)
    assert row["status"] == "ok"
    assert row["err_note"] == "reference on batch 0:1 of 2, heads 0:2 of 4"
    assert 0 <= row["err"] < row["err_limit"]


def test_an_inaccurate_build_keeps_its_timing_and_shows_the_failure(monkeypatch):
    def sloppy(q, k, v, *, causal=False, **kw):
        o = builds.get("torch_eager").attend(q, k, v, causal=causal)
        return o + 1e-2 * o.abs().mean()

    fake_build(monkeypatch, "sloppy", sloppy)
    row = measure(case("sloppy"), **FAST)
    assert row["status"] == "ok" and row["err"] > row["err_limit"]
    assert "FAILS accuracy rule" in row["err_note"]


def test_alloc_flag_rule():
    assert m.alloc_flag(math.nan, 100, "S+P") == ""
    assert m.alloc_flag(100.0, 100, "S+P") == ""
    assert "below" in m.alloc_flag(99.0, 100, "S+P")


def profiler_peak(run, dev):
    """A stand-in for CUDA's allocator statistics on the CPU: the peak of live bytes in the profiler's memory
    events during one call (allocations positive, frees negative)."""
    gc.collect()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        o = run()
    try:
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    except AttributeError:
        pytest.skip("this torch's profiler exposes no memory events")
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return float(peak), "", o


def test_an_under_allocating_materialised_build_is_flagged(monkeypatch):
    monkeypatch.setattr(m, "peak_pass", profiler_peak)
    # a "materialised" build that is really the fused kernel: it never holds S or P
    fake_build(monkeypatch, "cheat_materialised", builds.get("fused").attend, holds="S+P")
    cheat = measure(case("cheat_materialised", N=128), **FAST)
    honest = measure(case("materialised", N=128), **FAST)
    assert cheat["status"] == honest["status"] == "ok"
    assert cheat["peak_bytes"] < cheat["hold_bytes"] == 2 * 2 * 128 * 128 * 4
    assert "not what its name says" in cheat["alloc_flag"]
    assert honest["peak_bytes"] >= honest["hold_bytes"] and honest["alloc_flag"] == ""


def test_a_compiled_row_never_times_the_eager_fallback(monkeypatch):
    """FlexAttention past torch._dynamo's recompile limit would silently run eager. A limit of 1 forced on every
    config.patch: the per-shape reset keeps every row compiled; without it the row refuses, and says why."""
    cls = type(torch._dynamo.config)
    patch = cls.patch

    def tiny_limit(self, *args, **kw):
        if "recompile_limit" in kw:
            kw["recompile_limit"] = 1
        return patch(self, *args, **kw)

    monkeypatch.setattr(cls, "patch", tiny_limit)
    for n in (32, 48):
        row = measure(case("flex", N=n), **FAST)
        assert row["status"] == "ok", row["status"]
        assert row["compile_note"].startswith("torch._dynamo reset before the first call")
        assert "RECOMPILED" not in row["compile_note"]
    monkeypatch.setattr(m, "_dynamo_reset", lambda: None)
    row = measure(case("flex", N=64), **FAST)
    assert row["status"].startswith("error: ") and "recompile limit" in row["status"]
    assert "fallback to eager refused" in row["compile_note"]
    assert math.isnan(row["ms"]) and math.isnan(row["checksum"])


def test_rows_carry_the_code_fingerprint(monkeypatch):
    from attnlab import provenance

    monkeypatch.setattr(provenance, "code_hash", lambda: "0123456789ab")
    row = m.base_row(Case("fused", 1, 2, 2, 16, 16), ceilings=dict(tbps=1.0, tflops=1.0))
    assert row["code"] == "0123456789ab"


def _fingerprint(pkg) -> str:
    """provenance.code_hash of the package copy at `pkg`: its provenance module loaded from there, fresh."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("provenance_of_copy", pkg / "provenance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.code_hash()


def test_the_code_fingerprint_changes_with_any_source_file_and_only_with_one(tmp_path):
    """On a copy of the package: the same files give the same 12 hex digits; an edit anywhere in attnlab/**/*.py, a
    new module or a renamed one gives another; a file that is not Python source leaves it."""
    import shutil

    from attnlab import provenance

    pkg = tmp_path / "attnlab"
    shutil.copytree(Path(provenance.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    first = _fingerprint(pkg)
    assert len(first) == 12 and int(first, 16) >= 0
    assert _fingerprint(pkg) == first  # nothing changed
    (pkg / "notes.txt").write_text("not code")
    assert _fingerprint(pkg) == first
    seen = {first}
    kernel = pkg / "triton" / "hopper" / "fused.py"
    for change in (lambda: kernel.write_text(kernel.read_text() + "\n# one more line\n"),
                   lambda: (pkg / "report" / "extra.py").write_text(""),
                   lambda: (pkg / "report" / "extra.py").rename(pkg / "report" / "other.py")):
        change()
        now = _fingerprint(pkg)
        assert now not in seen, change
        seen.add(now)


def test_rates_leave_out_the_consumption_step():
    row = dict(ms=2.0, consume_ms=0.5, flops=3e9, bytes_moved=3e6, ceiling_tflops=10.0, ceiling_tbps=1.0)
    m.rates(row)
    assert row["tflops"] == pytest.approx(3e9 / 1.5e-3 / 1e12) and row["pct_bw"] == pytest.approx(0.2)


def test_a_host_bound_time_is_flagged():
    """do_bench brackets each call on the device: when issuing it takes the host about as long, ms measures Python."""
    assert m.timing_note(0.2, 0.15).startswith("host-bound: issuing a call takes 0.15 ms on the host against 0.2 ms")
    assert m.timing_note(1.0, 0.05) == ""
    assert m.timing_note(1.0, math.nan) == ""  # CPU: calls are synchronous, nothing to compare
    assert math.isnan(m.host_ms(lambda: None, torch.device("cpu")))


def test_a_call_is_host_bound_from_half_its_measured_time():
    assert m.timing_note(1.0, 0.51).startswith("host-bound: issuing a call takes 0.51 ms on the host against 1 ms")
    assert m.timing_note(1.0, 0.49) == ""


def test_cpu_is_never_graphed_and_its_checksum_covers_the_timing_phase_only():
    """graphed() is the identity on CPU; the row's checksum is the mean o.sum() of the timed calls (the capture and
    the host-cost probe are not in it), so it equals one call's o.sum()."""
    step = lambda: None  # noqa: E731
    assert m.graphed(step, torch.device("cpu"), []) == (step, "")
    case = m.Case("torch_eager", 1, 2, 2, 16, 8, "float32", False, "cpu")
    row = m.measure(case, **FAST)
    q, k, v = m.make_inputs(case)
    from attnlab import builds
    assert row["checksum"] == pytest.approx(float(builds.get("torch_eager").attend(q, k, v).sum()), rel=1e-5)
    assert row["timer"] == "perf_counter" and row["timing_note"] == ""


class _FakeGraph:
    """Stands in for a captured CUDA graph on the CPU: replaying it does the step's device work (acc += x) without
    running the step's Python (which is what counts calls)."""

    def __init__(self, acc, x):
        self.acc, self.x, self.replays = acc, x, 0

    def replay(self):
        self.replays += 1
        self.acc.add_(self.x)


def test_graph_replays_are_counted_and_the_graph_is_freed_on_return(monkeypatch):
    import weakref

    acc, calls, x = torch.zeros(()), [0], torch.tensor(2.0)
    made = []

    def fake_graphed(step, dev, captured):
        step()  # the capturing call: Python runs (and counts), as in a real capture
        g = _FakeGraph(acc, x)
        captured.append(g)
        made.append(weakref.ref(g))
        return g.replay, ""

    def step():
        calls[0] += 1
        acc.add_(x)

    monkeypatch.setattr(m, "graphed", fake_graphed)
    times, timer, why = m._time_call(step, acc, calls, torch.device("cpu"), warmup_ms=0, reps_ms=1, min_reps=5)
    assert timer == "perf_counter+graph" and why == ""
    assert made[0]() is None  # the graph (and on a GPU its memory pool) is gone once timing returns
    assert calls[0] >= len(times) >= 5 and float(acc) == 2.0 * calls[0]  # every replay counted, the capture not


def test_the_graph_is_freed_even_when_timing_fails(monkeypatch):
    import weakref

    made = []

    def fake_graphed(step, dev, captured):
        g = _FakeGraph(torch.zeros(()), torch.tensor(1.0))
        captured.append(g)
        made.append(weakref.ref(g))
        return g.replay, ""

    monkeypatch.setattr(m, "graphed", fake_graphed)
    monkeypatch.setattr(m, "_time", lambda *a, **k: (_ for _ in ()).throw(torch.OutOfMemoryError("replay")))
    with pytest.raises(torch.OutOfMemoryError):
        m._time_call(lambda: None, torch.zeros(()), [0], torch.device("cpu"), warmup_ms=0, reps_ms=1, min_reps=1)
    assert made[0]() is None


def test_a_failed_consumption_capture_is_said_and_not_reused(monkeypatch):
    m._consume.clear()
    monkeypatch.setattr(m, "graphed", lambda step, dev, captured: (step, "graph capture failed, timed eagerly: X"))
    o = torch.ones(1, 2, 3, 4)
    ms, why = m._consume_ms(o, torch.device("cpu"), warmup_ms=0, reps_ms=1, min_reps=3)
    assert ms > 0 and why.startswith("graph capture failed") and not m._consume


def test_spin_up_runs_the_callers_work_between_syncs(monkeypatch):
    """attnlab.selfcheck settles the card on the case's own call: spin_up issues it per_sync times between syncs,
    for at least `seconds`; on a CPU it does nothing."""
    syncs, calls = [], []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: syncs.append(len(calls)))
    m.spin_up(type("Dev", (), {"type": "cuda"})(), 0.01, work=lambda: calls.append(1), per_sync=4)
    assert syncs and syncs == [4 * (i + 1) for i in range(len(syncs))]
    m.spin_up(torch.device("cpu"), 1.0, work=lambda: calls.append(1))
    assert len(calls) == syncs[-1]


def test_eager_ms_times_back_to_back_calls_and_sizes_its_window_from_one():
    calls = []
    ms, n, timer = m.eager_ms(lambda: calls.append(1), torch.device("cpu"), reps_ms=1.0, min_reps=7,
                                    max_reps=50)
    assert 7 <= n <= 50 and len(calls) == 1 + n  # one call sizes the window, then n timed back to back
    assert ms > 0 and timer == "perf_counter, eager back to back"
    _, n, _ = m.eager_ms(lambda: time.sleep(0.002), torch.device("cpu"), reps_ms=1.0, min_reps=3)
    assert n == 3  # a call longer than the window still gets min_reps


def test_the_commit_a_sender_names_wins_over_the_copys_own_git(monkeypatch):
    """A working tree copied to another machine carries a .git whose HEAD is not the tree's: ATTNLAB_COMMIT names it."""
    from attnlab import provenance

    monkeypatch.delenv("ATTNLAB_COMMIT", raising=False)
    own = provenance.git_state()
    monkeypatch.setenv("ATTNLAB_COMMIT", "0123abc")
    named = provenance.git_state()
    assert named["commit"] == "0123abc" and named["commit"] != own["commit"] and "ATTNLAB_COMMIT" in named["note"]
