"""The report's limits at their edges: each rule fed rows just inside and just outside its limit, so that a changed
limit fails a test. The curve's shape (FLAT, RISE), the clock note (CLOCK_SHARE), the noise a difference must clear
(REPEAT_SHARE) and the dead-work flag (DROPPED_SHARE)."""
from attnlab import report
from attnlab.report import curves
from tests.test_report_groups import frame, row

NS = (512, 1024, 2048)


def curve(D, ratios):
    """fused at 1 ms and materialised at ratio ms at each of NS, head dim D: fused's speedup curve is `ratios`."""
    return [r for N, x in zip(NS, ratios) for r in (row("fused", 1.0, N=N, D=D), row("materialised", x, N=N, D=D))]


def test_the_curves_shape_turns_at_five_percent_a_step_and_ten_percent_overall():
    """FLAT: a last step of 4 % has flattened, 6 % is still rising. RISE: 9 % up or down overall is flat, 11 % rose
    or fell."""
    shapes = {
        16: ([2.0, 3.0, 3.12], "rises then flattens"),  # last step +4 %
        32: ([2.0, 3.0, 3.18], "still rising"),  # last step +6 %
        48: ([2.0, 2.18, 2.18], "flat"),  # +9 % overall
        64: ([2.0, 2.22, 2.22], "rises then flattens"),  # +11 % overall, flat last step
        80: ([2.0, 1.82, 1.82], "flat"),  # −9 % overall
        96: ([2.0, 1.78, 1.78], "falls"),  # −11 % overall
    }
    t = curves.speedup_trend(frame(*(r for d, (x, _) in shapes.items() for r in curve(d, x))))
    assert dict(zip(t["D"], t["shape"])) == {d: shape for d, (_, shape) in shapes.items()}


def test_two_builds_clocks_four_percent_apart_stay_silent_and_six_percent_apart_say_so():
    df = frame(row("materialised", 4.0, sm_clock_mhz=1500.0), row("qk_softmax", 2.0, sm_clock_mhz=1560.0),
               row("fused", 1.0, sm_clock_mhz=1590.0))
    t = report.speedup(df).set_index("build")
    assert t.loc["qk_softmax", "note"] == ""
    assert t.loc["fused", "note"].startswith("ran at SM clocks 6% apart")


def stages(base_ms, no_softmax, no_pv, N):
    return [row("fused", base_ms, N=N), row("fused-no_softmax", no_softmax, N=N), row("fused-no_pv", no_pv, N=N),
            row("fused-zero_mask", base_ms, N=N)]


def test_a_difference_must_clear_two_percent_of_the_base():
    """REPEAT_SHARE of a 100 ms base is 2 ms: savings apart by 1.9 ms tie, by 2.1 ms one dominates; a largest saving
    of 1.9 ms is no evidence, of 2.1 ms it is."""
    t = report.ablation_table(frame(*stages(100.0, 90.0, 91.9, N=1000), *stages(100.0, 90.0, 92.1, N=2000),
                                    *stages(100.0, 98.1, 100.0, N=3000), *stages(100.0, 97.9, 100.0, N=4000)))
    assert t["noise_ms"].tolist() == [2.0] * 4
    assert t["dominant"].tolist() == ["", "softmax", "", "softmax"]
    assert t["note"][0].startswith("tie between softmax and pv") and t["note"][2].startswith("no stage dominates")


def test_an_ablation_under_a_quarter_of_its_base_is_flagged_and_one_over_it_is_not():
    t = report.ablation_table(frame(*stages(100.0, 90.0, 24.0, N=1000), *stages(100.0, 90.0, 26.0, N=2000)))
    assert "fused-no_pv ran in 24% of fused's time" in t["note"][0] and "consumed" in t["note"][0]
    assert "consumed" not in t["note"][1] and "ran in" not in t["note"][1]
