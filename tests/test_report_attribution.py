"""attribution and the boundary formulas, on synthetic rows whose answers are known by construction.

Shape B=1 H=8 N=1000 D=64 float16: S and P are 8e6 elements, 16e6 bytes each. A round trip (write + read) is 32e6
bytes; at a copy ceiling of 0.02 TB/s (2e7 bytes/ms) that is 1.6 ms. One QKᵀ pass is 2·8·1000²·64 = 1.024e9 FLOPs,
0.1024 ms at 10 TFLOP/s.
"""
import math

import pytest

from attnlab import report
from attnlab.report import boundary_time
from attnlab import cost as bd
from tests.test_report_groups import frame, row

EXACT = dict(rel=1e-12)
# qk_softmax's recorded tiles: two QKᵀ passes (the row's max and sum, then P), or one with the row held on chip
TWO_PASSES = '{"qk_softmax": {"gluon": true, "one_pass": false}}'
ONE_PASS = '{"qk_softmax": {"gluon": true, "one_pass": true}}'


def test_boundary_bytes_by_hand():
    assert bd.nn_bytes(1, 8, 1000, "float16") == 16_000_000
    assert bd.boundary_bytes("S round trip", 1, 8, 1000, "float16", causal=False) == 32_000_000
    assert bd.boundary_bytes("S round trip", 1, 8, 1000, "float16", causal=True) == 32_000_000  # S is full N×N
    assert bd.boundary_bytes("P round trip", 1, 8, 1000, "float16", causal=False) == 32_000_000
    assert bd.boundary_bytes("P round trip", 1, 8, 1000, "float16", causal=True) == 24_000_000  # PV reads half
    assert bd.boundary_bytes("S round trip", 1, 1, 16384, "float32", False) == 2 * 16384**2 * 4  # one read of S
    assert bd.boundary_bytes("S round trip", 1, 1, 20000, "float32", False) == 3 * 1_600_000_000  # two reads
    assert bd.qk_pass_flops(1, 8, 1000, 64, causal=False) == 1.024e9
    assert bd.qk_pass_flops(1, 8, 1000, 64, causal=True) == 0.512e9


def test_unknown_dtype_and_boundary_are_refused():
    with pytest.raises(ValueError, match="dtype must be one of bfloat16, float16, float32, got 'float64'"):
        bd.itemsize("float64")
    with pytest.raises(ValueError, match="boundary must be one of"):
        bd.boundary_bytes("O round trip", 1, 1, 1, "float16", False)


def test_non_causal_deltas_against_bytes_at_bandwidth():
    df = frame(row("materialised", 5.0), row("qk_softmax", 3.0, tiles=TWO_PASSES), row("fused", 1.4),
               row("sdpa_flash", 0.9))
    t = report.attribution(df)
    assert list(t.columns) == [*"dtype causal D N B H Hkv".split(), *boundary_time.COLUMNS]
    s, p = t.iloc[0], t.iloc[1]
    assert (s["boundary"], s["from_build"], s["to_build"]) == ("S round trip", "materialised", "qk_softmax")
    assert (s["from_ms"], s["to_ms"], s["delta_ms"]) == (5.0, 3.0, 2.0)
    assert s["bytes"] == 32_000_000
    assert s["predicted_ms"] == pytest.approx(1.6, **EXACT)
    assert s["measured_over_predicted"] == pytest.approx(1.25, **EXACT)
    assert s["qk_removed_ms"] == pytest.approx(-0.1024, **EXACT)  # qk_softmax adds a QKᵀ pass
    assert (p["boundary"], p["from_build"], p["to_build"]) == ("P round trip", "qk_softmax", "fused")
    assert p["delta_ms"] == pytest.approx(1.6, **EXACT)
    assert p["measured_over_predicted"] == pytest.approx(1.0, **EXACT)
    assert p["qk_removed_ms"] == pytest.approx(0.1024, **EXACT)  # fused drops it again
    assert list(t["note"]) == ["", ""]
    assert (s["dtype"], s["causal"], s["D"], s["N"], s["B"], s["H"], s["Hkv"]) == ("float16", False, 64, 1000, 1, 8, 8)


def test_causal_p_boundary_reads_half_of_p():
    df = frame(*(row(b, ms, causal=True, tiles=TWO_PASSES if b == "qk_softmax" else "")
                 for b, ms in [("materialised", 5.0), ("qk_softmax", 3.0), ("fused", 1.5)]))
    s, p = report.attribution(df).itertuples(index=False)
    assert s.predicted_ms == pytest.approx(1.6, **EXACT)  # S written and read in full even when causal
    assert p.bytes == 24_000_000
    assert p.predicted_ms == pytest.approx(1.2, **EXACT)
    assert p.measured_over_predicted == pytest.approx(1.25, **EXACT)
    assert p.qk_removed_ms == pytest.approx(0.0512, **EXACT)


def test_a_failed_build_gives_nan_and_a_note_not_a_number():
    df = frame(row("materialised", 5.0), row("qk_softmax", 3.0, tiles=TWO_PASSES),
               row("fused", math.nan, status="oom: 17179869184 bytes wanted"),
               row("materialised", 9.0, N=2000), row("fused", 2.0, N=2000))
    t = report.attribution(df)
    assert list(t["N"]) == [1000, 1000, 2000, 2000]
    assert t.iloc[0]["delta_ms"] == 2.0 and t.iloc[0]["note"] == ""
    assert math.isnan(t.iloc[1]["delta_ms"]) and math.isnan(t.iloc[1]["measured_over_predicted"])
    assert t.iloc[1]["note"] == "fused oom: 17179869184 bytes wanted at B=1 H=8 N=1000 D=64"
    assert t.iloc[1]["bytes"] == 32_000_000  # the prediction stands without a measurement
    assert t["note"].tolist()[2:] == ["qk_softmax not measured at B=1 H=8 N=2000 D=64"] * 2
    assert math.isnan(t.iloc[2]["delta_ms"]) and math.isnan(t.iloc[3]["delta_ms"])


def test_rows_from_two_runs_with_different_ceilings_give_no_prediction():
    df = frame(row("materialised", 5.0), row("qk_softmax", 3.0, ceiling_tbps=0.03, tiles=TWO_PASSES),
               row("fused", 1.4, ceiling_tbps=0.03))
    s, p = report.attribution(df).itertuples(index=False)
    assert s.delta_ms == 2.0 and math.isnan(s.predicted_ms) and math.isnan(s.measured_over_predicted)
    assert s.note == ("ceiling_tbps differs between materialised, qk_softmax at B=1 H=8 N=1000 D=64 ([0.02, 0.03]): "
                      "rows of two runs")
    assert p.predicted_ms == pytest.approx(32e6 / 3e7, **EXACT) and p.note == ""


def test_the_qk_pass_is_set_beside_the_bytes_and_a_delta_within_noise_is_said():
    df = frame(row("materialised", 5.0), row("qk_softmax", 3.0, tiles=TWO_PASSES), row("fused", 1.4))
    s, p = report.attribution(df).to_dict("records")
    assert s["predicted_with_qk_ms"] == pytest.approx(1.6 - 0.1024, **EXACT)
    assert s["measured_over_with_qk"] == pytest.approx(2.0 / 1.4976, **EXACT)
    assert p["predicted_with_qk_ms"] == pytest.approx(1.7024, **EXACT)
    assert (s["noise_ms"], p["noise_ms"]) == (pytest.approx(0.1), pytest.approx(0.06))  # 2 % of from_ms
    close = frame(row("materialised", 5.0), row("qk_softmax", 4.95, ms_p20=4.5, ms_p80=5.2, tiles=TWO_PASSES),
                  row("fused", 1.4))
    s, p = report.attribution(close).to_dict("records")
    assert s["noise_ms"] == pytest.approx(0.7) and s["note"] == "Δ 0.05 ms is within the noise (0.7 ms)"
    assert p["note"] == ""


def test_an_added_qk_pass_larger_than_the_bytes_is_explained_not_a_silent_nan():
    # fp32 scores at a tiny copy ceiling against a slow matmul: the S step's added pass outweighs its bytes
    df = frame(row("materialised", 5.0, ceiling_tbps=1e3, ceiling_tflops=0.001), row("qk_softmax", 3.0,
               ceiling_tbps=1e3, ceiling_tflops=0.001, tiles=TWO_PASSES), row("fused", 1.4, ceiling_tbps=1e3, ceiling_tflops=0.001))
    s = report.attribution(df).iloc[0]
    assert math.isnan(s["measured_over_with_qk"]) and "outweighs the bytes it removes" in s["note"]


def test_builds_whose_kernels_are_written_differently_are_said_to_be():
    """Lab guard: on Hopper qk_softmax's P kernel is Gluon (warp-specialised, TMA stores) while materialised's are
    Triton, so the S step's Δ holds an implementation difference as well as the S round trip: the note says so."""
    tri = '{"pv": {"gluon": false}, "scores": {"gluon": false}}'
    qk_g = '{"pv": {"gluon": false}, "qk_softmax": {"gluon": true, "one_pass": false}}'
    fu_g = '{"fused": {"gluon": true}}'
    df = frame(row("materialised", 5.0, tiles=tri), row("qk_softmax", 3.0, tiles=qk_g), row("fused", 1.4, tiles=fu_g))
    s, p = report.attribution(df).to_dict("records")
    assert s["note"] == ("kernels written differently at B=1 H=8 N=1000 D=64 (materialised triton, qk_softmax gluon): "
                         "Δ includes the implementation, not the boundary alone")
    assert p["note"] == ""  # both Gluon
    # the shared PV kernel on Hopper (the Gluon one non-causal at D = 128, and at D = 64 from N = 2048): in both rows
    # with the same tiles, it says nothing about the S step's Δ, which still holds Triton scores against a Gluon P
    # kernel
    pv_g = '"pv": {"gluon": true, "BLOCK_M": 128}'
    both = frame(row("materialised", 5.0, tiles=tri.replace('"pv": {"gluon": false}', pv_g)),
                 row("qk_softmax", 3.0, tiles=qk_g.replace('"pv": {"gluon": false}', pv_g)), row("fused", 1.4, tiles=fu_g))
    s, p = report.attribution(both).to_dict("records")
    assert s["note"] == ("kernels written differently at B=1 H=8 N=1000 D=64 (materialised triton, qk_softmax gluon): "
                         "Δ includes the implementation, not the boundary alone")
    assert p["note"] == ""
    same = frame(row("materialised", 5.0, tiles=tri), row("qk_softmax", 3.0, tiles=tri.replace('"scores": {"gluon": false}',
                                                                  '"qk_softmax": {"gluon": false, "one_pass": false}')),
                 row("fused", 1.4))  # no tiles recorded (an old run): not compared
    assert [r["note"] for r in report.attribution(same).to_dict("records")] == ["", ""]


def test_the_qk_pass_is_charged_only_where_qk_softmax_ran_two_passes():
    """qk_softmax's one-pass kernel (Hopper, N ≤ 1024) computes each score once: neither step then changes the QKᵀ
    work. Its row's tiles say which kernel ran; one table may hold both (one pass at N = 1000, two at N = 2000)."""
    df = frame(row("materialised", 5.0), row("qk_softmax", 3.0, tiles=ONE_PASS), row("fused", 1.4),
               row("materialised", 20.0, N=2000), row("qk_softmax", 12.0, N=2000, tiles=TWO_PASSES),
               row("fused", 5.6, N=2000))
    t = report.attribution(df)
    short, long_ = t[t["N"] == 1000].to_dict("records"), t[t["N"] == 2000].to_dict("records")
    assert [r["qk_passes"] for r in short] == [1, 1] and [r["qk_passes"] for r in long_] == [2, 2]
    for r in short:  # one pass: no QKᵀ charged either way, so the prediction is the bytes alone
        assert r["qk_removed_ms"] == 0 and r["predicted_with_qk_ms"] == r["predicted_ms"]
        assert r["measured_over_with_qk"] == pytest.approx(r["measured_over_predicted"], **EXACT)
    s, p = long_  # two passes at N = 2000: 4× the N = 1000 pass, 0.4096 ms at 10 TFLOP/s
    assert s["qk_removed_ms"] == pytest.approx(-0.4096, **EXACT) and p["qk_removed_ms"] == pytest.approx(0.4096, **EXACT)
    assert list(t["note"]) == ["", "", "", ""]


def test_a_qk_softmax_row_without_one_pass_leaves_the_qk_pass_unknown_and_says_so():
    for tiles in (math.nan, "", "not json", '{"pv": {"gluon": true}}', '{"qk_softmax": {"gluon": true}}'):
        df = frame(row("materialised", 5.0), row("qk_softmax", 3.0, tiles=tiles), row("fused", 1.4))
        for r in report.attribution(df).to_dict("records"):
            assert math.isnan(r["qk_passes"]) and math.isnan(r["qk_removed_ms"])
            assert math.isnan(r["measured_over_with_qk"]) and r["delta_ms"] > 0  # Δ and the bytes still stand
            assert r["note"] == ("qk_softmax's row at B=1 H=8 N=1000 D=64 records no one_pass in its tiles: whether "
                                 "it computed QKᵀ once or twice is unknown, so qk_removed_ms is NaN")
