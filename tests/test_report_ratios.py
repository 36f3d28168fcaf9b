"""speedup: every ratio names its baseline; a baseline without an ok time gives NaN and says why."""
import math

import pytest

from attnlab import report
from tests.test_report_groups import frame, row


def test_ratio_is_baseline_over_build_in_a_column_named_for_the_baseline():
    df = frame(row("materialised", 4.0), row("qk_softmax", 2.0), row("fused", 1.0), row("fused-no_pv", 0.5),
               row("sdpa_flash", 0.8))
    t = report.speedup(df)
    assert list(t.columns) == [*"dtype causal D N B H Hkv".split(), "build", "ms", "materialised_ms",
                               "x_vs_materialised", "note"]
    assert t["build"].tolist() == ["materialised", "qk_softmax", "fused", "sdpa_flash"]  # ablations left out
    assert t["x_vs_materialised"].tolist() == [1.0, 2.0, 4.0, 5.0]
    assert t["note"].tolist() == ["", "", "", ""]
    t = report.speedup(df, baseline="fused", builds=["sdpa_flash", "fused-no_pv"])
    assert t["x_vs_fused"].tolist() == [1.25, 2.0]


def test_a_baseline_oom_gives_nan_and_a_note_never_a_substitute():
    df = frame(row("materialised", 4.0), row("fused", 1.0),
               row("materialised", math.nan, N=16384, status="oom: 34359738368 bytes wanted"),
               row("fused", 9.0, N=16384), row("sdpa_flash", 3.0, N=16384))
    t = report.speedup(df, builds=["fused", "sdpa_flash"])
    big = t[t["N"] == 16384]
    assert big["ms"].tolist() == [9.0, 3.0]
    assert big["x_vs_materialised"].isna().all() and big["materialised_ms"].isna().all()
    assert big["note"].tolist() == ["baseline materialised oom: 34359738368 bytes wanted at B=1 H=8 N=16384 D=64"] * 2
    small = t[t["N"] == 1000]
    assert small["x_vs_materialised"].tolist()[0] == 4.0
    assert small["note"].tolist() == ["", "sdpa_flash not measured at B=1 H=8 N=1000 D=64"]


def test_an_unknown_build_or_baseline_is_refused_not_a_column_of_nan():
    df = frame(row("materialised", 4.0), row("fused", 1.0))
    with pytest.raises(ValueError, match=r"\['fusd'\] have no rows"):
        report.speedup(df, builds=["fusd"])
    with pytest.raises(ValueError, match=r"\['torch_eager'\] have no rows"):
        report.speedup(df, baseline="torch_eager")


def test_a_baseline_measured_by_other_code_is_noted():
    """A results file resumed after a kernel edit holds a baseline from the old code: the ratio says so."""
    df = frame(row("materialised", 4.0, code="aaaaaaaaaaaa"), row("fused", 1.0, code="bbbbbbbbbbbb"),
               row("qk_softmax", 2.0, code="aaaaaaaaaaaa"))
    t = report.speedup(df).set_index("build")
    assert t.loc["fused", "x_vs_materialised"] == 4.0  # the number stays; the note makes it honest
    assert "measured by different code" in t.loc["fused", "note"] and "bbbbbbbbbbbb" in t.loc["fused", "note"]
    assert t.loc["qk_softmax", "note"] == ""


def test_a_build_that_fails_the_accuracy_rule_says_so_beside_its_ratio():
    bad = "FAILS accuracy rule: err 0.5 > limit 0.015"
    t = report.speedup(frame(row("materialised", 4.0), row("fused", 1.0, err_note=bad))).set_index("build")
    assert t.loc["fused", "x_vs_materialised"] == 4.0
    assert bad in t.loc["fused", "note"] and t.loc["materialised", "note"] == ""


def test_ratios_are_net_of_the_consumption_step():
    """Every timed call also sums its output (consume_ms): left in, it would pull every ratio towards 1."""
    t = report.speedup(frame(row("materialised", 4.1, consume_ms=0.1), row("fused", 1.1, consume_ms=0.1)))
    t = t.set_index("build")
    assert t.loc["fused", "ms"] == pytest.approx(1.0) and t.loc["fused", "x_vs_materialised"] == pytest.approx(4.0)


def test_a_host_bound_time_is_noted_beside_its_ratio():
    note = "host-bound: issuing a call takes 0.5 ms on the host against 0.6 ms measured"
    t = report.speedup(frame(row("materialised", 4.0), row("flex", 0.6, timing_note=note))).set_index("build")
    assert note in t.loc["flex", "note"]


def test_builds_timed_at_different_clocks_say_so_beside_their_ratio():
    """A card at its power cap lowers its clock by how much a build draws (attnlab.telemetry): a ratio between two rows
    whose clocks differ by more than 5 % says it includes the clock. Rows within 5 %, or without a clock, stay
    silent."""
    cap = "software power cap"
    df = frame(row("materialised", 4.0, sm_clock_mhz=1500.0, clock_reasons=cap),
               row("fused", 1.0, sm_clock_mhz=1700.0, clock_reasons=cap),
               row("qk_softmax", 2.0, sm_clock_mhz=1540.0, clock_reasons=cap), row("sdpa_flash", 0.8))
    t = report.speedup(df).set_index("build")
    assert t.loc["fused", "x_vs_materialised"] == 4.0  # the number stays; the note makes it honest
    assert t.loc["fused", "note"] == ("ran at SM clocks 13% apart at B=1 H=8 N=1000 D=64 (materialised 1500 MHz, "
                                      "fused 1700 MHz; software power cap): Δ includes the clock, not the work alone")
    assert t.loc["qk_softmax", "note"] == "" and t.loc["sdpa_flash", "note"] == ""
