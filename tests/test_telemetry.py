"""attnlab.telemetry: the card's clock, power and clock-event reasons sampled while cases are timed. NVML needs a GPU;
here a stand-in reader takes its place, and the log without a GPU is checked to be inert (NaN, '')."""
import json
import math
import time

import pandas as pd
import torch

from attnlab import bench, telemetry


def test_reason_bits_read_as_nvidia_smi_names_them():
    assert telemetry.reason_names(0x4) == "software power cap"
    assert telemetry.reason_names(0x4 | 0x8) == "software power cap + hardware slowdown"
    assert telemetry.reason_names(0) == ""


def test_a_window_holds_only_its_own_samples():
    readings = iter([(1980, 300.0, 0x0), (1500, 690.0, 0x4), (1480, 692.0, 0x4), (1470, 691.0, 0x4)] * 100)
    with telemetry.LoadLog("cpu", period_ms=5, reader=lambda: next(readings)) as log:
        time.sleep(0.05)
        t0 = time.time()
        time.sleep(0.1)
        t1 = time.time()
        w = log.window(t0, t1)
    inside = [s for s in log.samples if t0 <= s[0] <= t1]
    assert len(inside) >= 5 and len(inside) < len(log.samples)  # the samples before t0 are not its own
    assert w == telemetry.summarise(inside)
    assert 1470 <= w["sm_clock_mhz"] <= 1980 and w["clock_reasons"] in ("software power cap", "")


def test_medians_and_every_reason_seen():
    samples = [(0.0, 1500, 690.0, 0x4), (0.1, 1400, 700.0, 0x4 | 0x8), (0.2, 1600, 680.0, 0x1)]
    assert telemetry.summarise(samples) == dict(sm_clock_mhz=1500.0, power_w=690.0,
                                           clock_reasons="idle + software power cap + hardware slowdown")
    empty = telemetry.summarise([])
    assert math.isnan(empty["sm_clock_mhz"]) and math.isnan(empty["power_w"]) and empty["clock_reasons"] == ""


def test_without_a_gpu_the_log_is_inert():
    with telemetry.LoadLog("cpu") as log:
        w = log.window(0.0, time.time())
    assert log.note.startswith("no GPU") and log.samples == []
    assert math.isnan(w["sm_clock_mhz"]) and w["clock_reasons"] == ""
    if not torch.cuda.is_available():
        with telemetry.LoadLog("cuda") as log:  # asked for a GPU on a machine without one: inert too, not an error
            assert log.note.startswith("no GPU")


def test_the_bench_rows_carry_the_clock_and_the_ratio_table_each_builds(monkeypatch):
    """time_case puts the log's window over its timed graphs into the row; ratios gives each build's clock beside
    its ratios, and the summary prints them."""
    from attnlab import builds, measure
    from tests.test_bench import _FakeBuild

    monkeypatch.setattr(builds, "get", lambda name: _FakeBuild("fused"))
    monkeypatch.setattr(measure, "cold_call", lambda fn, dev: (0.5, fn()))
    monkeypatch.setattr(measure, "graphed", lambda fn, dev, graphs: (fn, "stand-in"))
    monkeypatch.setattr(measure, "_time", lambda fn, dev, **kw: ([time.sleep(0.05) or 1.0], "do_bench"))
    monkeypatch.setattr(measure, "peak_pass", lambda fn, dev: (7.0, "", None))
    monkeypatch.setattr(measure, "eager_ms", lambda fn, dev, **kw: (2.5, 10, "stand-in"))
    q = torch.zeros(1, 1, 8, 4)
    with telemetry.LoadLog("cpu", period_ms=5, reader=lambda: (1485, 692.0, 0x4)) as log:
        out = measure.time_case("fused", q, q, q, False, repeats=2, load=log)
    assert (out["sm_clock_mhz"], out["power_w"], out["clock_reasons"]) == (1485.0, 692.0, "software power cap")
    assert json.loads(out["graph_ms"]) == [1.0, 1.0] and json.loads(out["graph_mhz"]) == [1485.0, 1485.0]

    key = dict(dtype="bfloat16", D=64, causal=False, N=1024, B=16, H=32)
    rows = [dict(build="qk_softmax", ms=3.0, floor_ms=2.0, tflops=1.0, sm_clock_mhz=1485.0, **key),
            dict(build="sdpa_cudnn", ms=1.0, tflops=3.0, sm_clock_mhz=1620.0, **key)]
    r = bench.ratios(pd.DataFrame(rows))
    assert (r.iloc[0]["qk_softmax_MHz"], r.iloc[0]["sdpa_cudnn_MHz"]) == (1485.0, 1620.0)
    assert "| qk MHz | cuDNN MHz |" in bench.summary(r) and "| 1485 | 1620 |" in bench.summary(r)
