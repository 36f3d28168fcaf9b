"""Figures drawn from the tables: the same numbers, one group per figure, a page that draws offline."""
import re

import pandas as pd
import pytest

from attnlab.report import figures
from tests.test_report_groups import frame, row


def _group(causal=False):
    rows = []
    for N, scale in ((512, 1.0), (1024, 4.0)):
        for build, ms in (("materialised", 4.0), ("qk_softmax", 2.0), ("fused", 1.0), ("fused-no_softmax", 0.7),
                          ("fused-no_pv", 0.9), ("fused-zero_mask", 1.2)):
            rows.append(row(build, ms=ms * scale, N=N, causal=causal, peak_bytes=10.0 * N, hold_bytes=9 * N))
    return frame(*rows)


def test_speedup_figure_plots_the_speedup_table():
    fig = figures.speedup_figure(_group())
    fused = [t for t in fig.data if t.name == "fused"][0]
    assert list(fused.x) == [512, 1024] and list(fused.y) == pytest.approx([4.0, 4.0])
    assert "speedup over materialised (float16, non-causal" in fig.layout.title.text
    assert {t.name for t in fig.data} == {"materialised", "qk_softmax", "fused"}  # ablations are not builds here


def test_a_figure_takes_one_group_only():
    mixed = frame(*_group(False).to_dict("records"), *_group(True).to_dict("records"))
    with pytest.raises(ValueError, match="one dtype and one causal value"):
        figures.speedup_figure(mixed)


def test_memory_and_ablation_figures_carry_the_measured_values():
    g = _group()
    mem = figures.memory_figure(g)
    fused = [t for t in mem.data if t.name == "fused"][0]
    assert list(fused.y) == [5120.0, 10240.0]
    held = [t for t in mem.data if t.name == "fused must hold"][0]
    assert list(held.y) == [9 * 512, 9 * 1024] and held.line.dash == "dot"
    ab = figures.ablation_figure(g)
    softmax = [t for t in ab.data if t.name == "softmax (→ copy)"][0]
    assert list(softmax.y) == pytest.approx([0.3, 1.2])


def test_the_page_draws_offline():
    page = figures.to_html([figures.speedup_figure(_group()), figures.memory_figure(_group())])
    assert page.count("Plotly.newPlot") == 2
    assert not re.search(r"<script[^>]*\bsrc=", page)  # no script is fetched: plotly.js is inline, once
    assert len(page) > 1_000_000


def test_runs_side_by_side_get_one_panel_each_and_the_speedup_table_s_values():
    fig = figures.speedup_by_run({"run A": _group(), "run B": _group()})
    assert [a.text for a in fig.layout.annotations] == ["run A", "run B"]
    fused = [t for t in fig.data if t.name == "fused, D=64"]
    assert [t.xaxis for t in fused] == ["x", "x2"] and [t.showlegend for t in fused] == [True, False]
    assert all(list(t.y) == pytest.approx([4.0, 4.0]) for t in fused)
    assert fig.layout.xaxis.title.text == "sequence length N (tokens)"
    assert fig.layout.yaxis.title.text == "× faster than materialised (ratio of times)"


def test_runs_side_by_side_must_share_one_dtype_and_causal_value():
    with pytest.raises(ValueError, match="one dtype and one causal value, got run A: float16 non-causal, "
                                         "run B: float16 causal"):
        figures.speedup_by_run({"run A": _group(False), "run B": _group(True)})
    with pytest.raises(ValueError, match="one dtype, one causal value and one of our builds"):
        figures.ratio_by_run({"run A": pd.DataFrame(dict(dtype=["float16"] * 2, causal=[False, True], D=64, N=512,
                                                          B=1, H=8, Hkv=8, ours="fused", library="sdpa_flash",
                                                          library_over_ours=1.0))})
