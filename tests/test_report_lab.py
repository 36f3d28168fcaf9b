"""The report functions the walkthrough adds: the correctness table, peak_table, the speedup curves and their trend,
the attribution figure and the roofline, each checked for the numbers and labels it draws."""
import math

import pandas as pd
import pytest

from attnlab.report import correctness as cr
from attnlab.report import curves, roofline
from attnlab.report.memory import peak_table
from tests.test_report_groups import frame, row


def gate_row(build, status="ok", err=1e-3, limit=1e-2, unwritten=0, N=64):
    return dict(build=build, shape=0, B=1, H=2, Hkv=2, N=N, D=32, dtype="float32", causal=False, status=status,
                err=err, limit=limit, err_lowp=limit / 2, unwritten=unwritten)


def test_correctness_table_judges_each_gate_row():
    rows = [gate_row("fused"), gate_row("qk_softmax", err=0.02), gate_row("materialised", unwritten=3),
            gate_row("sdpa_flash", status="unsupported: sdpa_flash refused this case", err=math.nan, limit=math.nan),
            gate_row("flex", status="FAIL: RuntimeError: boom", err=math.nan, limit=math.nan)]
    t = cr.correctness_table(rows)
    assert list(t["verdict"]) == ["pass", "FAIL", "FAIL", "not run", "FAIL"]
    assert t.loc[0, "err_over_limit"] == pytest.approx(0.1)
    assert "err 0.02 > limit 0.01" in t.loc[1, "note"]
    assert "3 output elements never written" in t.loc[2, "note"]
    assert t.loc[3, "note"].startswith("unsupported: sdpa_flash refused") and "boom" in t.loc[4, "note"]
    s = cr.correctness_summary(pd.concat([t, t.iloc[[0]].assign(N=128, err_over_limit=0.4)]))
    fused = s[s.build == "fused"].iloc[0]
    assert (fused.shapes, fused.passed, fused.failed, fused.worst_err_over_limit) == (2, 2, 0, pytest.approx(0.4))
    assert s[s.build == "sdpa_flash"].iloc[0].not_run == 1


def test_correctness_table_reads_results_rows_too():
    df = frame(row("fused", err=1e-3, err_limit=2e-3), row("materialised", err=5e-3, err_limit=2e-3),
               row("qk_softmax", status="oom: 10 bytes wanted", err=math.nan, err_limit=math.nan))
    t = cr.correctness_table(df)
    assert list(t["verdict"]) == ["pass", "FAIL", "not run"]
    assert t.loc[0, "limit"] == 2e-3 and t.loc[2, "note"] == "oom: 10 bytes wanted"


def test_a_frame_that_is_neither_is_refused():
    with pytest.raises(ValueError, match="lack column"):
        cr.correctness_table(pd.DataFrame({"build": ["fused"]}))


def test_peak_table_sets_each_peak_beside_s_p_and_the_hold():
    df = frame(row("materialised", peak_bytes=33e6, hold_bytes=32_000_000),
               row("fused", peak_bytes=0.5e6, hold_bytes=1_024_000),
               row("fused-no_pv", peak_bytes=1e6, hold_bytes=1_024_000),
               row("torch_eager", peak_bytes=math.nan, peak_note="n/a: CPU has no allocator statistics",
                   hold_bytes=32_000_000))
    t = peak_table(df)
    assert list(t["build"]) == ["materialised", "fused", "torch_eager"]  # no ablations unless asked
    assert set(t["s_bytes"]) == {8 * 1000 * 1000 * 2} and (t["s_bytes"] == t["p_bytes"]).all()  # B·H·N²·fp16
    assert list(t["holds"]) == ["S+P", "none", "S+P"]
    assert t.loc[0, "peak_over_hold"] == pytest.approx(33 / 32)
    assert t.loc[1, "peak_over_hold"] == pytest.approx(0.5e6 / 1_024_000)
    assert math.isnan(t.loc[2, "peak_bytes"]) and "no allocator statistics" in t.loc[2, "note"]


def _group(causal, D=64):
    rows = []
    for N, fused_ms, speedup in ((512, 1.0, 2.0), (1024, 2.0, 3.0), (2048, 4.0, 3.05)):
        for build, ms in (("materialised", fused_ms * speedup), ("qk_softmax", fused_ms * 1.5), ("fused", fused_ms),
                          ("torch_eager", fused_ms * speedup * 1.1)):
            rows.append(row(build, ms=ms, N=N, D=D, causal=causal, flops=4e9 * N, bytes_moved=1e6 * N,
                            consume_ms=0.0, tflops=4e9 * N / (ms * 1e9), ceiling_tflops=100.0, ceiling_tbps=2.0))
    return rows


def test_speedup_curves_draw_speedup_latency_and_rate_per_causal_panel():
    df = frame(*_group(False), *_group(True), *_group(False, D=128))
    fig = curves.speedup_curves(df, "float16")
    assert "Speedup over materialised" in fig.layout.title.text and "float16" in fig.layout.title.text
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:2] == ["non-causal: × faster than materialised", "causal: × faster than materialised"]
    assert "non-causal: latency (ms)" in titles and "causal: achieved TFLOP/s" in titles
    assert fig.layout.xaxis5.title.text == "sequence length N (tokens)"
    assert fig.layout.yaxis.title.text == "× faster than materialised (ratio of times)"
    assert fig.layout.yaxis3.title.text == "latency (ms)" and fig.layout.yaxis5.title.text == "achieved rate (TFLOP/s)"
    names = {t.name for t in fig.data}
    assert names == {f"{b}, D={d}" for b in ("materialised", "qk_softmax", "fused") for d in (64, 128)}
    fused = [t for t in fig.data if t.name == "fused, D=64"]
    assert len(fused) == 6  # 3 rows × 2 causal panels
    speed, latency, rate = fused[:3]  # non-causal column first
    assert list(speed.y) == pytest.approx([2.0, 3.0, 3.05]) and list(latency.y) == pytest.approx([1.0, 2.0, 4.0])
    assert list(rate.y) == pytest.approx([4e9 * n / (ms * 1e9) for n, ms in ((512, 1), (1024, 2), (2048, 4))])
    assert fused[0].line.dash == "solid" and [t for t in fig.data if t.name == "fused, D=128"][0].line.dash == "dash"


def test_the_library_curves_set_each_library_thin_beside_fused_bold_a_panel_per_head_dim_and_causal_value():
    df = frame(*_group(False), *_group(True), *_group(False, D=128))
    fig = curves.library_curves(df, "float16")
    assert [a.text for a in fig.layout.annotations] == ["non-causal, D = 64", "causal, D = 64", "non-causal, D = 128",
                                                        "causal, D = 128"]
    eager = [t for t in fig.data if t.name == "torch_eager"]
    fused = [t for t in fig.data if t.name == "fused"]
    assert len(eager) == len(fused) == 3  # the causal D = 128 panel has no rows
    assert list(eager[0].y) == pytest.approx([1 / 1.1] * 3) and list(fused[0].y) == pytest.approx([2.0, 3.0, 3.05])
    assert eager[0].line.width < fused[0].line.width and [t.showlegend for t in eager] == [True, False, False]
    assert curves.library_curves(frame(*[r for r in _group(False) if r["build"] != "torch_eager"]), "float16") is None


def test_speedup_curves_take_one_dtype_that_exists():
    with pytest.raises(ValueError, match="no rows of dtype 'bfloat16'"):
        curves.speedup_curves(frame(*_group(False)), "bfloat16")


def test_speedup_trend_names_the_shape_of_each_curve():
    rising = [r for r in _group(True) if True]
    for r in rising:  # causal: 2 → 3 → 4, still rising
        if r["build"] == "materialised" and r["N"] == 2048:
            r["ms"] = 4.0 * 4.0
    flat = _group(False, D=128)
    for r in flat:
        if r["build"] == "materialised":
            r["ms"] = {512: 2.0, 1024: 2.0 * 2.05, 2048: 4.0 * 2.1}[r["N"]]
    t = curves.speedup_trend(frame(*_group(False), *rising, *flat))
    got = {(c, d): s for c, d, s in zip(t["causal"], t["D"], t["shape"])}
    assert got == {(False, 64): "rises then flattens", (False, 128): "flat", (True, 64): "still rising"}
    first = t[(t.causal == False) & (t.D == 64)].iloc[0]  # noqa: E712
    assert (first.first_N, first.first, first.last_N, first.last) == (512, 2.0, 2048, pytest.approx(3.05))
    assert first.last_step == pytest.approx(3.05 / 3 - 1)


def test_attribution_figure_sets_each_saving_beside_its_bytes():
    df = frame(*[r for r in _group(False) if r["build"] != "torch_eager"])
    fig = curves.attribution_figure(df)
    assert "What each removed boundary saves" in fig.layout.title.text
    assert [a.text for a in fig.layout.annotations] == ["S round trip (materialised → qk_softmax), D = 64",
                                                         "P round trip (qk_softmax → fused), D = 64"]
    measured = [t for t in fig.data if t.name == "saved, measured (Δ ms)"]
    assert list(measured[0].y) == pytest.approx([2.0 - 1.5, 6.0 - 3.0, 12.2 - 6.0])  # materialised − qk_softmax
    assert list(measured[1].y) == pytest.approx([0.5, 1.0, 2.0])  # qk_softmax − fused
    assert fig.layout.yaxis.title.text == "time (ms)" and fig.layout.xaxis2.title.text == "sequence length N (tokens)"


def test_roofline_places_every_build_at_its_intensity_under_the_measured_roof():
    df = frame(*_group(False), *_group(True))
    t = roofline.roofline_table(df, "float16")
    assert set(t["build"]) == {"materialised", "qk_softmax", "fused", "torch_eager"}
    assert (t["intensity"] == 4e3).all()  # 4e9·N FLOPs over 1e6·N bytes
    assert (t["roof_tflops"] == min(100.0, 4e3 * 2.0)).all() and (t["bound"] == "compute").all()
    fig = roofline.roofline_figure(df, "float16")
    roof = fig.data[0]
    assert roof.name == "roof (measured ceilings)" and max(roof.y) == pytest.approx(100.0)
    assert fig.layout.xaxis.title.text.startswith("arithmetic intensity (FLOP per byte")
    assert fig.layout.yaxis.title.text == "achieved rate (TFLOP/s)" and "2 TB/s" in fig.layout.title.text
    fused = [tr for tr in fig.data if tr.name == "fused"][0]  # one trace a build, the marker says causal or not
    assert list(fused.marker.symbol) == ["circle"] * 3 + ["diamond"] * 3 and len(fused.x) == 6
    assert [tr.name for tr in fig.data][1:4] == ["materialised", "qk_softmax", "fused"]  # ours first


def test_a_roofline_refuses_rows_of_two_runs():
    df = frame(*_group(False), row("fused", N=4096, ceiling_tbps=3.0, ceiling_tflops=100.0, flops=1.0,
                                   bytes_moved=1.0, tflops=1.0))
    with pytest.raises(ValueError, match="one pair of measured ceilings"):
        roofline.roofline_table(df, "float16")


def test_the_trend_judges_the_last_doubling_of_n_whatever_the_grid_step():
    """A grid in steps of 512 is judged from N/2 to N, as one in powers of two: 3.0 at 4096 → 3.3 at 8192 is +10 %
    over the last doubling, though the last step (7680 → 8192) moves it under 1 %."""
    n = list(range(512, 8193, 512))
    x = [2.0 + 0.1 * i for i in range(7)] + [3.0 + 0.3 * i / 8 for i in range(1, 9)] + [3.3]
    x = x[:len(n)]
    first, last = curves.doubling_changes(n, x)
    assert first == pytest.approx(x[1] / x[0] - 1)  # 512 → 1024
    assert last == pytest.approx(x[-1] / x[n.index(4096)] - 1) and last > curves.FLAT
    assert x[-1] / x[-2] - 1 < 0.01
    assert curves.doubling_changes([512, 1024, 2048], [1.0, 2.0, 2.1]) == pytest.approx((1.0, 0.05))
    assert all(math.isnan(v) for v in curves.doubling_changes([512], [1.0]))
