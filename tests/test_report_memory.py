"""memory_table: peak bytes each step saves against the S or P it stops holding.

B=1 H=8 N=1000 D=64 float16: S and P are 16e6 bytes each, O is 1.024e6. Peaks: materialised S+P (S is freed before O
is allocated), qk_softmax O+P, fused O: the S step saves S − O, the P step saves P.
"""
import math

from attnlab import report
from attnlab.report import memory
from tests.test_report_groups import frame, row


def test_saved_bytes_equal_the_predicted_s_and_p_sizes():
    df = frame(row("materialised", peak_bytes=32_000_000), row("qk_softmax", peak_bytes=17_024_000),
               row("fused", peak_bytes=1_024_000))
    t = report.memory_table(df)
    assert list(t.columns) == [*"dtype causal D N B H Hkv".split(), *memory.COLUMNS]
    s, p = t.to_dict("records")
    assert (s["boundary"], s["tensor"], s["from_peak_bytes"], s["to_peak_bytes"]) == \
        ("S round trip", "S", 32_000_000, 17_024_000)
    assert (s["saved_bytes"], s["predicted_bytes"], s["saved_over_predicted"]) == (14_976_000, 14_976_000, 1.0)
    assert (p["boundary"], p["tensor"], p["saved_bytes"], p["predicted_bytes"]) == ("P round trip", "P", 16_000_000,
                                                                                    16_000_000)
    assert (s["note"], p["note"]) == ("", "")


def test_unknown_peak_on_cpu_gives_nan_and_the_rows_own_reason():
    why = "n/a: CPU has no allocator statistics"
    df = frame(*(row(b, peak_bytes=math.nan, peak_note=why, device="cpu")
                 for b in ("materialised", "qk_softmax", "fused")))
    s, p = report.memory_table(df).to_dict("records")
    assert math.isnan(s["saved_bytes"]) and s["predicted_bytes"] == 14_976_000
    assert s["note"] == (f"materialised peak_bytes unknown at B=1 H=8 N=1000 D=64 ({why}); "
                         f"qk_softmax peak_bytes unknown at B=1 H=8 N=1000 D=64 ({why})")


def test_a_builds_allocation_warning_reaches_the_note():
    flag = "peak 1024000 < hold 17024000: qk_softmax did not hold P"
    df = frame(row("materialised", peak_bytes=32_000_000), row("qk_softmax", peak_bytes=1_024_000, alloc_flag=flag),
               row("fused", peak_bytes=1_024_000))
    s, p = report.memory_table(df).to_dict("records")
    assert (s["saved_bytes"], s["predicted_bytes"]) == (30_976_000, 14_976_000)  # twice what it should: flagged
    assert s["note"] == p["note"] == f"qk_softmax: {flag}"


def test_no_s_saving_is_predicted_where_n_is_at_most_d_and_the_ratio_says_nothing():
    """At N = D the S the first step stops holding is the size of the O it keeps (the CPU grid has N = 64, D = 64):
    its prediction is 0, its ratio NaN with a note, not a division by zero."""
    df = frame(*(row(b, N=64, peak_bytes=pk) for b, pk in (("materialised", 131_072), ("qk_softmax", 131_072),
                                                            ("fused", 65_536))))
    s, p = report.memory_table(df).to_dict("records")
    assert s["predicted_bytes"] == 0 and math.isnan(s["saved_over_predicted"])
    assert s["note"] == ("no saving predicted at B=1 H=8 N=64 D=64: the S this step stops holding is no larger than "
                         "the O it keeps (N ≤ D)")
    assert p["saved_over_predicted"] == 65_536 / p["predicted_bytes"] and p["note"] == ""
