"""Figures drawn from the tables: the same numbers, one group per figure, a page that draws offline."""
import math
import re

import pandas as pd
import pytest

from attnlab.report import figures
from attnlab.report.units import BYTE_TITLE
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
    assert list(held.y) == [9 * 512, 9 * 1024] and held.line.dash == "dash"
    assert held.line.color == fused.line.color and held.line.width < fused.line.width
    ab = figures.ablation_figure(g)
    softmax = [t for t in ab.data if t.name == "softmax (→ copy)"][0]
    assert list(softmax.y) == pytest.approx([0.3, 1.2])


def test_the_mask_bar_is_drawn_apart_from_what_removing_a_stage_saves():
    """zero_mask adds a stage the base program lacks: its bar is a cost, so it sits on an axis of its own, never on the
    axis of savings; the savings' axis holds the two stages removed and nothing else."""
    ab = figures.ablation_figure(frame(*_results().query("not causal").to_dict("records")))  # D = 64 and 128

    def y_title(trace):  # a panel's own title, or that of the axis it shares (the panel row's first)
        axis = ab.layout[f"yaxis{trace.yaxis[1:]}"]
        return axis.title.text or ab.layout[f"yaxis{axis.matches[1:]}"].title.text

    assert {t.name: y_title(t) for t in ab.data} == {"softmax (→ copy)": "what removing each stage saves (ms)",
                                                     "PV (dropped)": "what removing each stage saves (ms)",
                                                     "mask": "what applying an all-zero mask adds (ms)"}
    assert len({(t.name, y_title(t)) for t in ab.data}) == 3  # the same in every panel
    saves = {ab.layout[f"yaxis{t.yaxis[1:]}"].domain for t in ab.data if t.name != "mask"}
    adds = {ab.layout[f"yaxis{t.yaxis[1:]}"].domain for t in ab.data if t.name == "mask"}
    assert len(saves) == len(adds) == 1 and not saves & adds  # two rows of panels, the mask's below
    mask = [t for t in ab.data if t.name == "mask"][0]
    assert list(mask.y) == pytest.approx([0.2, 0.4])  # D = 64: zero_mask − fused, an added cost, drawn positive
    colours = {t.name: {u.marker.color for u in ab.data if u.name == t.name} for t in ab.data}
    assert all(len(c) == 1 for c in colours.values()) and len({next(iter(c)) for c in colours.values()}) == 3


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


def _results():
    """Two groups (non-causal, causal) at D = 64 and 128, N = 512 and 1024: our builds, fused's ablations and a
    library build, each shape's times and peaks distinct, so a value drawn from the wrong row shows."""
    rows = []
    for causal in (False, True):
        for D in (64, 128):
            for N in (512, 1024):
                scale = (N / 512) * (D / 64) * (0.5 if causal else 1.0)
                for i, (build, ms) in enumerate((("materialised", 4.0), ("qk_softmax", 2.0), ("fused", 1.0),
                                                 ("fused-no_softmax", 0.7), ("fused-no_pv", 0.9),
                                                 ("fused-zero_mask", 1.2), ("sdpa_flash", 1.5))):
                    rows.append(row(build, ms=ms * scale, N=N, D=D, causal=causal, peak_bytes=float(10**6 * (i + 1) * scale),
                                    hold_bytes=int(10**5 * (i + 1) * scale), reps=10, flops=10**9, bytes_moved=10**6))
    return frame(*rows)


def _by_panel(fig, name):
    """{D: (x, y)} of the traces called `name`, one per panel (D = 64 in the first column, 128 in the second; the
    ablation figure's mask row below: x3, x4)."""
    panel = {"x": 64, "x2": 128, "x3": 64, "x4": 128}
    return {panel[t.xaxis]: (list(t.x), list(t.y)) for t in fig.data if t.name == name}


@pytest.mark.parametrize("baseline", ["materialised", "qk_softmax"])
def test_the_report_draws_for_each_group_the_speedup_memory_and_ablation_figures_with_the_tables_values(baseline):
    """What `attnlab report` draws (text.figures): per (dtype, causal) group, the speedup over the baseline, the peak
    allocation and fused's ablations (the only base measured with ablations here); titles naming the group and the
    baseline, axes titled with their units, one panel per head dim, one trace per build (ablations only in their
    figure), each point the value of the table it is drawn from."""
    from attnlab.report import ablation_table, speedup, split
    from attnlab.report.text import figures as report_figures

    results = _results()
    figs = report_figures(results, baseline=baseline)
    assert len(figs) == 2 * 3
    builds = {"materialised", "qk_softmax", "fused", "sdpa_flash"}
    for (dtype, causal), (speed, memory, ablation) in zip(split(results), zip(*[iter(figs)] * 3)):
        group = split(results)[(dtype, causal)]
        kind = "causal" if causal else "non-causal"
        assert speed.layout.title.text.startswith(f"speedup over {baseline} ({dtype}, {kind};")
        assert memory.layout.title.text.startswith(f"peak allocation per call ({dtype}, {kind})")
        assert ablation.layout.title.text.startswith(f"what removing each stage of fused saves ({dtype}, {kind})")
        for fig in (speed, memory):
            assert [a.text for a in fig.layout.annotations] == ["D = 64", "D = 128"]
        assert [a.text for a in ablation.layout.annotations] == ["D = 64", "D = 128", "D = 64, all-zero mask",
                                                                 "D = 128, all-zero mask"]
        assert speed.layout.xaxis.title.text == memory.layout.xaxis.title.text == "sequence length N (tokens)"
        assert speed.layout.yaxis.title.text == f"× faster than {baseline} (ratio of times)"
        assert memory.layout.yaxis.title.text == f"{figures.MEMORY_AXIS} ({BYTE_TITLE})"
        assert ablation.layout.yaxis.title.text == "what removing each stage saves (ms)"
        assert ablation.layout.yaxis3.title.text == "what applying an all-zero mask adds (ms)"
        assert {t.name for t in speed.data} == builds
        assert {t.name for t in memory.data} == builds | {f"{b} must hold" for b in builds}
        table = speedup(group, baseline=baseline)
        for build in builds:
            for D, (x, y) in _by_panel(speed, build).items():
                want = table[(table.build == build) & (table.D == D)].sort_values("N")
                assert x == list(want.N) and y == pytest.approx(list(want[f"x_vs_{baseline}"]))
            for D, (x, y) in _by_panel(memory, build).items():
                ok = group[(group.build == build) & (group.D == D)].sort_values("N")
                assert x == list(ok.N) and y == pytest.approx(list(ok.peak_bytes))
                assert _by_panel(memory, f"{build} must hold")[D][1] == pytest.approx(list(ok.hold_bytes))
        saved = ablation_table(group, base="fused")
        for name, column in (("softmax (→ copy)", "softmax_saving_ms"), ("PV (dropped)", "pv_saving_ms"),
                             ("mask", "mask_cost_ms")):
            for D, (x, y) in _by_panel(ablation, name).items():
                want = saved[saved.D == D].sort_values("N")
                assert x == [str(n) for n in want.N] and y == pytest.approx(list(want[column]))


def test_report_with_another_baseline_names_it_in_every_speedup_table_and_figure(tmp_path, capsys):
    """`attnlab report DIR --baseline qk_softmax`: the speedup tables and figures are relative to qk_softmax (its
    ms beside each build's, the ratio named for it), and nothing is relative to the default materialised."""
    from attnlab import cli

    _results().to_csv(tmp_path / "results.csv", index=False)
    assert cli.main(["report", str(tmp_path), "--baseline", "qk_softmax"]) == 0
    tables = (tmp_path / "tables.txt").read_text()
    assert tables.count("## speedup over qk_softmax") == 2 and "speedup over materialised" not in tables
    section = tables.split("## speedup over qk_softmax (float16, non-causal)")[1].split("##")[0]
    header, first = [line for line in section.splitlines() if line.strip()][:2]
    assert header.split()[-3:-1] == ["qk_softmax_ms", "x_vs_qk_softmax"] and "x_vs_materialised" not in tables
    cells = dict(zip(header.split(), first.split()))  # N = 512, D = 64, materialised: 2.0 / 4.0
    assert (cells["build"], float(cells["qk_softmax_ms"]), float(cells["x_vs_qk_softmax"])) == ("materialised", 2.0,
                                                                                               0.5)
    page = (tmp_path / "figures.html").read_text()
    assert page.count("speedup over qk_softmax") == 2 and "speedup over materialised" not in page
    assert "faster than qk_softmax" in page and "faster than materialised" not in page
    assert tables.strip() == capsys.readouterr().out.strip()


# -- one palette, readable units ----------------------------------------------------------------------------------

def test_every_build_has_a_colour_of_its_own_and_ours_are_drawn_bold():
    from attnlab import builds
    from attnlab.report import palette

    named = [b for b in builds.names() if "-" not in b]
    colours = [palette.colour(b) for b in named]
    assert len(set(colours)) == len(named) and palette.OTHER not in colours
    assert palette.colour("materialised") != palette.colour("sdpa_flash")
    assert palette.colour("fused-no_pv") == palette.colour("fused")  # an ablation keeps its base's colour
    assert not set(colours) & (set(palette.QUANTITY_COLOURS.values()) | set(palette.SERIES))  # never a build's
    ours, library = palette.style("fused"), palette.style("sdpa_flash", "dot")
    assert ours["line"]["width"] > library["line"]["width"] and library["line"]["dash"] == "dot"
    assert ours["meta"] == {"build": "fused"}


def test_a_panel_draws_at_most_eight_traces_libraries_hidden_first():
    import plotly.graph_objects as go

    from attnlab.report import palette

    fig = go.Figure()
    for b in ("materialised", "qk_softmax", "fused", "sdpa_flash", "sdpa_cudnn", "flex"):
        for d in (64, 128):
            fig.add_trace(go.Scatter(x=[1], y=[1], name=f"{b}, D={d}", legendgroup=b, showlegend=d == 64,
                                     **palette.style(b)))
    palette.limit_visible(fig)
    drawn = [t.name for t in fig.data if t.visible in (None, True)]
    assert drawn == [f"{b}, D={d}" for b in palette.OURS for d in (64, 128)]
    hidden = [t for t in fig.data if t.visible == "legendonly"]
    assert len(hidden) == 6 and all(t.showlegend is not False or t.name.endswith("128") for t in hidden)
    small = go.Figure([go.Scatter(x=[1], y=[1], **palette.style(b)) for b in ("fused", "sdpa_flash")])
    assert all(t.visible in (None, True) for t in palette.limit_visible(small).data)


@pytest.mark.parametrize("values, ticks", [
    ([1e6, 7.8e10], ["64 KiB", "1 MiB", "16 MiB", "256 MiB", "4 GiB", "64 GiB", "1 TiB"]),
    ([3e9, 5e9], ["2 GiB", "4 GiB", "8 GiB"]),
    ([5120.0, 10240.0], ["4 KiB", "8 KiB", "16 KiB"]),
])
def test_a_byte_axis_is_labelled_in_binary_units_at_powers_of_two(values, ticks):
    from attnlab.report.units import byte_axis

    axis = byte_axis(values)
    assert axis["type"] == "log" and axis["ticktext"] == ticks
    assert all(v == 2 ** round(math.log2(v)) for v in axis["tickvals"])
    assert len(axis["tickvals"]) <= 8 and not any(t.endswith(("B", "G", "M", "k")) and " " not in t for t in ticks)


def test_the_memory_figure_labels_its_byte_axis_in_gib_never_in_si():
    g = _group()
    g["peak_bytes"], g["hold_bytes"] = g["peak_bytes"] * 1e7, g["hold_bytes"] * 1e7  # up to ~100 GB
    axis = figures.memory_figure(g).layout.yaxis
    assert axis.type == "log" and list(axis.ticktext)[-1].endswith("GiB") and len(axis.tickvals) <= 8


@pytest.mark.parametrize("ns, ticks", [([512, 1024, 2048], [512, 1024, 2048]),
                                       (range(512, 8193, 512), [512, 1024, 2048, 4096, 8192]),
                                       ([3, 5, 7, 9, 11, 13, 15, 17, 19, 21], [3, 7, 11, 15, 21])])
def test_a_sequence_axis_names_at_most_eight_n_in_full(ns, ticks):
    from attnlab.report.units import n_axis

    axis = n_axis(ns)
    assert axis["tickvals"] == ticks and axis["ticktext"] == [str(n) for n in ticks]


def test_the_memory_figure_refuses_rows_without_a_measured_peak():
    g = _group()
    g["peak_bytes"] = math.nan  # a CPU run: no device allocator to read a peak from
    with pytest.raises(ValueError, match="no row holds a measured peak allocation"):
        figures.memory_figure(g)


def test_the_speedup_axis_is_ticked_in_full_at_values_the_figure_draws():
    from attnlab.report.units import log_ticks

    fig = figures.speedup_figure(_group())
    axis = fig.layout.yaxis
    assert axis.type == "log" and all(re.fullmatch(r"\d+(\.\d+)?", t) for t in axis.ticktext)
    drawn = [v for t in fig.data if t.yaxis in (None, "y") for v in t.y]
    assert list(axis.tickvals) == log_ticks(drawn)[0]
