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


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_2(capsys):
    assert selfcheck.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "attnlab selfcheck: error: needs a CUDA GPU"


def test_a_nan_event_time_fails_the_verdict_in_either_position():
    # max() with a NaN depends on argument order; the verdict must not
    assert not selfcheck.verdict(2.0, 2.0, float("nan"), 2.0)["ok"]
    assert not selfcheck.verdict(2.0, 2.0, 2.0, float("nan"))["ok"]


def test_the_hold_covers_several_host_issue_times_at_the_top_clock():
    # session 32: the fused build's host issue 0.237 ms at N = 512; a hold of 4 issues at 2 GHz
    assert selfcheck.hold_cycles(0.237) == int(4 * 0.237e-3 * 2e9)
    assert selfcheck.hold_cycles(0.0) == int(selfcheck.HOLD_MIN_MS * 1e-3 * 2e9)  # never shorter than the floor
    assert selfcheck.hold_cycles(0.237) / 1980e6 * 1e3 >= 4 * 0.237  # in ms at the H200's top clock, still 4 issues
    with pytest.raises(ValueError, match="host_ms must be a time in ms >= 0, got nan"):
        selfcheck.hold_cycles(float("nan"))


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
    """torch.cuda's Event and _sleep as the event timer uses them, logging the order of what it queues."""

    def __init__(self, pending):
        self.log, self.pending, self.n = [], pending, 0

    def _sleep(self, cycles):
        self.log.append(f"sleep {cycles}")

    def Event(self, enable_timing):  # noqa: N802 - torch.cuda's name
        self.n += 1
        return _FakeEvent(self.log, "start" if self.n % 2 else "end", self.pending)


def test_the_event_timer_holds_the_stream_then_flushes_then_times(monkeypatch):
    monkeypatch.setattr(selfcheck.torch, "empty", lambda *a, **k: type("Flush", (), {"zero_": lambda self: log.append("flush")})())
    fake = _FakeCuda(pending=True)
    log = fake.log
    calls = []
    ms, missed = selfcheck._event_median_ms(lambda: (calls.append(1), log.append("step")), hold=1234, reps=3, cuda=fake)
    assert (ms, missed) == (2.0, 0) and len(calls) == 5 + 3
    first = log.index("sleep 1234")
    assert log[first:first + 6] == ["sleep 1234", "flush", "start.record", "step", "end.record", "end.sync"]
    # a GPU that had already passed the first event when the call was queued: every repetition left out
    fake = _FakeCuda(pending=False)
    log = fake.log
    ms, missed = selfcheck._event_median_ms(lambda: None, hold=1, reps=4, cuda=fake)
    assert missed == 4 and ms != ms
