"""scripts/fixed_cost.py: the fixed and per-N parts of a build's time from a bench's rows."""
import importlib.util
from pathlib import Path

import pandas as pd
import pytest

spec = importlib.util.spec_from_file_location("fixed_cost",
                                              Path(__file__).resolve().parent.parent / "scripts" / "fixed_cost.py")
fixed_cost = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fixed_cost)


def _rows(build, fixed, slope, ns=(512, 1024, 2048, 4096), D=128, status="ok"):
    return [dict(build=build, B=16384 // n, H=2048 // D, N=n, D=D, dtype="bfloat16", causal=False, status=status,
                 ms=fixed + slope * n / 1000) for n in ns]


def test_a_line_through_the_rows_gives_back_its_fixed_part_and_slope():
    bench = pd.DataFrame(_rows("fused", 0.06, 0.21) + _rows("sdpa_cudnn", 0.03, 0.22))
    t = fixed_cost.fit(bench).set_index("build")
    assert t.loc["fused", "fixed_ms"] == pytest.approx(0.06) and t.loc["fused", "ms_per_1k_N"] == pytest.approx(0.21)
    assert t.loc["sdpa_cudnn", "fixed_ms"] == pytest.approx(0.03)
    assert t.max_resid_pct.max() == pytest.approx(0, abs=1e-9)


def test_only_flashattention_shapes_ok_rows_and_three_points_or_more_count():
    """An untuned shape (B = 1, H = 64, N = 8192) is off the line's grid, a failed row has no time to fit, and a build
    with two shapes left gets no line."""
    odd = dict(build="fused", B=1, H=64, N=8192, D=128, dtype="bfloat16", causal=False, status="ok", ms=99.0)
    bench = pd.DataFrame(_rows("fused", 0.05, 0.3) + [odd] + _rows("fused", 0, 1, ns=(8192,), status="error: oom")
                         + _rows("sdpa_flash", 0.1, 0.4, ns=(512, 1024)))
    t = fixed_cost.fit(bench)
    assert list(t.build) == ["fused"] and t.points.iloc[0] == 4
    assert t.fixed_ms.iloc[0] == pytest.approx(0.05)
