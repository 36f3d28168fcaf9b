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
