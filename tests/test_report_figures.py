"""Figures drawn from the tables: the same numbers, one group per figure, a page that draws offline."""
import re

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
