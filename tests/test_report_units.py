"""attnlab.report.units: byte counts read in KiB … TiB, and a byte axis's ticks that cannot read as SI counts."""
import re

import pytest

from attnlab.report.units import byte_axis, byte_label, byte_ticks

SI = re.compile(r"^-?\d+(\.\d+)?[kMGTPB]$")  # plotly's own tick labels: "1T", "100B", "10G"


@pytest.mark.parametrize("n, text", [(0, "0 B"), (800, "800 B"), (1 << 10, "1 KiB"), (1536, "1.5 KiB"),
                                     (512 << 20, "512 MiB"), (1 << 30, "1 GiB"), (12.5 * (1 << 30), "12.5 GiB"),
                                     (3 << 40, "3 TiB"), (1000 << 20, "1000 MiB"), (float("nan"), "n/a")])
def test_a_byte_count_reads_in_the_largest_unit_that_leaves_at_least_one(n, text):
    assert byte_label(n) == text


@pytest.mark.parametrize("lo, hi", [(2e6, 1.1e13), (1 << 20, 1 << 30), (3e8, 5e8), (64, 1 << 45)])
def test_byte_ticks_span_the_values_at_powers_of_two_and_read_as_bytes(lo, hi):
    vals, text = byte_ticks([hi, lo, float("nan"), 0, -5])
    assert 2 <= len(vals) <= 8 and vals == sorted(vals)
    assert vals[0] <= lo and vals[-1] >= hi  # the values lie within the ticks
    assert all(v & (v - 1) == 0 for v in vals)  # powers of two
    assert text == [byte_label(v) for v in vals]
    assert all(t.endswith(("B", "KiB", "MiB", "GiB", "TiB", "PiB")) and not SI.match(t) for t in text), text
    steps = {vals[i + 1] // vals[i] for i in range(len(vals) - 1)}
    assert len(steps) == 1  # evenly spaced on the log axis


def test_the_fewest_exponents_between_ticks_that_keep_at_most_eight():
    assert byte_ticks([1 << 20, 1 << 30])[1] == ["1 MiB", "4 MiB", "16 MiB", "64 MiB", "256 MiB", "1 GiB"]
    vals, text = byte_ticks([2e6, 1.1e13])  # 2^20 … 2^44: every fourth exponent, anchored at 2^0
    assert text == ["1 MiB", "16 MiB", "256 MiB", "4 GiB", "64 GiB", "1 TiB", "16 TiB"] and len(vals) == 7
    assert byte_ticks([5, 6, 7], most=8)[1] == ["4 B", "8 B"]


def test_no_values_no_ticks_and_the_axis_arguments():
    assert byte_ticks([]) == ([], []) and byte_ticks([0, float("inf")]) == ([], [])
    assert byte_axis([1 << 20, 1 << 30]) == dict(type="log", tickmode="array",
                                                 tickvals=byte_ticks([1 << 20, 1 << 30])[0],
                                                 ticktext=byte_ticks([1 << 20, 1 << 30])[1])


@pytest.mark.parametrize("lo, hi, ticks", [
    (0.3, 40, [0.2, 0.5, 1, 2, 5, 10, 20, 50]),  # 1, 2, 5 a decade
    (0.05, 0.2, [0.05, 0.1, 0.2]),
    (1, 1e6, [1, 10, 100, 1000, 10000, 100000, 1e6]),  # too many for 1, 2, 5: decades alone
    (1e-4, 1e8, [1e-4, 1e-2, 1, 100, 1e4, 1e6, 1e8]),  # too many decades: every other one
    (2.5, 3.1, [2.5, 3, 4]),  # a narrow range: denser, so that two ticks fall among the values
])
def test_log_ticks_span_the_values_in_one_two_five_steps_and_read_in_full(lo, hi, ticks):
    from attnlab.report.units import log_ticks

    vals, text = log_ticks([hi, float("nan"), lo, -1, 0])
    assert vals == pytest.approx(ticks) and len(vals) <= 8
    assert vals[0] <= lo and vals[-1] >= hi
    assert sum(lo <= v <= hi for v in vals) >= 2
    assert all(re.fullmatch(r"\d+(\.\d+)?", t) for t in text), text  # no exponent, no SI suffix
    assert [float(t) for t in text] == pytest.approx(vals)
    assert log_ticks([]) == ([], [])


def test_every_log_axis_of_a_figure_gets_readable_ticks_of_its_own_values_except_those_that_have_ticks():
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from attnlab.report.units import log_ticks, readable_log_axes

    fig = make_subplots(rows=2, cols=2, shared_yaxes=True)
    fig.add_trace(go.Scatter(x=[1, 2], y=[0.3, 3]), row=1, col=1)
    fig.add_trace(go.Scatter(x=[1, 2], y=[5, 40]), row=1, col=2)  # matches row 1's first axis: one set for both
    fig.add_trace(go.Scatter(x=[1, 2], y=[100, 650]), row=2, col=1)
    fig.update_yaxes(type="log")
    fig.update_yaxes(tickvals=[1, 10], row=2, col=2)  # an axis with ticks of its own keeps them
    readable_log_axes(fig)
    layout = fig.layout
    assert list(layout.yaxis.tickvals) == list(layout.yaxis2.tickvals) == log_ticks([0.3, 3, 5, 40])[0]
    assert list(layout.yaxis3.tickvals) == log_ticks([100, 650])[0]
    assert list(layout.yaxis4.tickvals) == [1, 10]
    assert layout.xaxis.tickvals is None  # a linear axis is left to plotly
