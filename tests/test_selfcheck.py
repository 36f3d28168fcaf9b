"""The GPU self-check's verdict (a pure function) and its refusal on a machine without CUDA."""
import pytest
import torch

from attnlab import selfcheck


def test_verdict_applies_the_issue_bounds():
    # run 8's qk_softmax case: within 3 % of both timers, 0.9 % apart measured twice
    v = selfcheck.verdict(2.4230, 2.4446, 2.4910, 2.4830)
    assert v["ok"] and v["vs_events"] == pytest.approx(-0.0273, abs=1e-4) and v["repeat"] == pytest.approx(0.0089,
                                                                                                            abs=1e-4)
    # run 10's fused causal case: 3.5 % under do_bench fails, though the event timer and the repeat agree
    v = selfcheck.verdict(2.336, 2.317, 2.353, 2.421)
    assert not v["ok"] and v["vs_do_bench"] == pytest.approx(-0.0351, abs=1e-4)
    # run 7's sdpa_flash case: 8 % apart measured twice fails on its own
    assert not selfcheck.verdict(2.006, 1.845, 2.0, 2.0)["ok"]


@pytest.mark.parametrize("inside, outside", [((2.0, 2.038, 2.0, 2.0), (2.0, 2.042, 2.0, 2.0)),  # repeat 1.9 / 2.1 %
                                             ((2.0, 2.0, 2.058, 2.0), (2.0, 2.0, 2.066, 2.0)),  # events 2.8 / 3.2 %
                                             ((2.0, 2.0, 2.0, 1.943), (2.0, 2.0, 2.0, 1.937))],  # do_bench 2.9 / 3.3 %
                         ids=["repeat", "vs_events", "vs_do_bench"])
def test_each_bound_holds_just_inside_and_fails_just_outside(inside, outside):
    """REPEAT is 2 % between the two measurements, AGREE 3 % against either other timer."""
    assert selfcheck.verdict(*inside)["ok"] and not selfcheck.verdict(*outside)["ok"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_2(capsys):
    assert selfcheck.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "attnlab selfcheck: error: needs a CUDA GPU"


def test_a_nan_event_time_fails_the_verdict_in_either_position():
    # max() with a NaN depends on argument order; the verdict must not
    assert not selfcheck.verdict(2.0, 2.0, float("nan"), 2.0)["ok"]
    assert not selfcheck.verdict(2.0, 2.0, 2.0, float("nan"))["ok"]


def test_the_lead_covers_several_host_issue_times():
    # as measured on the H200: qk_softmax's host issue 1.283 ms against a 1.886 ms call; sdpa_flash 0.202 against 1.84
    assert selfcheck.lead_calls(1.283, 1.886) == 3  # 3 × 1.886 ≥ 4 × 1.283
    assert selfcheck.lead_calls(0.202, 1.84) == 2  # never fewer than 2
    assert selfcheck.lead_calls(2.0, 1.0) == 8
    with pytest.raises(ValueError, match="host_ms must be >= 0 and call_ms > 0"):
        selfcheck.lead_calls(float("nan"), 1.0)
    with pytest.raises(ValueError, match="call_ms > 0"):
        selfcheck.lead_calls(0.1, 0.0)


def test_uncovered_repetitions_are_left_out_and_counted():
    assert selfcheck.covered_median([2.0, 2.3, 2.1, 2.2], [True, False, True, True]) == (2.1, 1)
    median, missed = selfcheck.covered_median([2.3, 2.4, 2.0], [False, False, True])  # most measured the host
    assert missed == 2 and median != median  # NaN


class _FakeEvent:
    def __init__(self, log, name, pending):
        self.log, self.name, self.pending = log, name, pending

    def record(self):
        self.log.append(f"{self.name}.record")

    def query(self):  # True once the GPU has passed the event
        return not self.pending

    def synchronize(self):
        self.log.append(f"{self.name}.sync")

    def elapsed_time(self, end):
        return 2.0


class _FakeCuda:
    """torch.cuda's Event as the event timer uses it, logging the order of what it queues."""

    def __init__(self, pending):
        self.log, self.pending, self.n = [], pending, 0

    def Event(self, enable_timing):  # noqa: N802 - torch.cuda's name
        self.n += 1
        return _FakeEvent(self.log, "start" if self.n % 2 else "end", self.pending)


def test_the_event_timer_leads_with_untimed_calls_then_flushes_then_times(monkeypatch):
    flush = type("Flush", (), {"zero_": lambda self: log.append("flush")})
    monkeypatch.setattr(selfcheck.torch, "empty", lambda *a, **k: flush())
    fake = _FakeCuda(pending=True)
    log = fake.log
    ms, missed = selfcheck._event_median_ms(lambda: log.append("step"), lead=2, reps=3, cuda=fake)
    assert (ms, missed) == (2.0, 0)
    assert log[:5] == ["step"] * 5  # warm-up
    rep = ["step", "step", "flush", "start.record", "step", "end.record"]
    assert log[5:] == rep * 3 + ["end.sync"]  # one wait, after the last: the GPU never idles between repetitions
    # a GPU that had already passed the first event when the call was queued: every repetition left out
    fake = _FakeCuda(pending=False)
    log = fake.log
    ms, missed = selfcheck._event_median_ms(lambda: None, lead=2, reps=4, cuda=fake)
    assert missed == 4 and ms != ms


def test_the_cap_name_is_the_load_logs():
    from attnlab.telemetry import REASONS

    assert selfcheck.CAPPED == REASONS[0x4]


def _row(**kw):
    row = dict(ok=True, repeat=0.0, vs_events=0.0, vs_do_bench=0.0, reasons="", mhz_1=1980.0, mhz_2=1980.0)
    row.update(kw)
    return row


def test_a_failure_says_whether_the_card_was_at_its_power_cap():
    # as measured on the H200: qk_softmax's repeat -2.7 % at the cap
    note = selfcheck.failure_note(_row(ok=False, repeat=-0.0271, reasons="software power cap", mhz_1=1455.0,
                                       mhz_2=1500.0))
    assert note == ("repeat -2.7% at the software power cap (the two measurements' sampled SM clocks, medians of "
                    "50 ms samples, 1455 and 1500 MHz)")
    # the same repeat below the cap is not excused: only the bound is said
    assert selfcheck.failure_note(_row(ok=False, repeat=-0.0271)) == ""
    # timers apart are said whatever the card did
    note = selfcheck.failure_note(_row(ok=False, repeat=-0.0288, vs_do_bench=0.0379, reasons="software power cap"))
    assert note.endswith("; +3.8% against the do_bench") and note.startswith("repeat -2.9%")
    assert selfcheck.failure_note(_row(ok=False, vs_events=float("nan"))) == "+nan% against the event pairs"
    assert selfcheck.failure_note(_row()) == ""


def test_the_summary_counts_the_failures_at_the_cap():
    import pandas as pd

    rows = [_row(), _row(ok=False, repeat=-0.03, reasons="software power cap"), _row(ok=False, vs_events=0.05)]
    df = pd.DataFrame([{**r, "note": selfcheck.failure_note(r)} for r in rows])
    assert selfcheck.summary(df) == ("selfcheck: 1 passed, 2 failed (1 of them a repeat at the software power cap: "
                                     "the card's clock moved between two measurements of the same case; see note)")
    assert selfcheck.summary(df.iloc[:1]) == "selfcheck: 1 passed, 0 failed"
