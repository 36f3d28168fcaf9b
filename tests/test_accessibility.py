"""Accessibility basics, without a browser: every widget control says what it sets, every figure has a title and
axis titles with units, and the pages have a title and headings that never skip a level.

The figures are built over the made-up GPU runs the other tests read (tests/gpu_run.py), one of each batch policy,
through the functions the notebooks call (attnlab.lab, attnlab.report, attnlab.compare, attnlab.explore,
attnlab.model_lab). tests/test_browser.py checks the same of the rendered report in a browser.
"""
from __future__ import annotations

import ast
import re
from html.parser import HTMLParser
from pathlib import Path

import ipywidgets as widgets
import nbformat
import pandas as pd
import pytest

from attnlab import builds, compare, explore, lab, lies, model_forward, model_lab, render, sweep
from attnlab.report import text
from tests import gpu_run
from tests.test_explore import live

ROOT = Path(__file__).resolve().parent.parent

# What may stand in an axis title's parentheses, first: a unit, or a word saying the quantity is a ratio.
UNITS = ("tokens", "ms", "s", "bytes", "KiB", "MiB", "GiB", "TFLOP/s", "TB/s", "FLOP per byte", "×", "ratio",
         "fraction")


def has_unit(title: str) -> bool:
    """A parenthesised part of `title` starts with one of UNITS: 'time per call (ms, CUDA events)'."""
    for group in re.findall(r"\(([^()]*)\)", title):
        first = re.split(r"[,;]", group)[0].strip()
        if first in UNITS or any(first.startswith(u + " ") for u in UNITS):
            return True
    return False


@pytest.mark.parametrize("title, ok", [("sequence length N (tokens)", True), ("time per call (ms, CUDA events)", True),
                                       ("memory (bytes; solid: peak)", True), ("speedup (×)", True),
                                       ("× faster than materialised (ratio of times)", True), ("bytes", False),
                                       ("bytes moved per call (model)", False), ("tokens per forward (B·N)", False),
                                       ("achieved TFLOP/s", False), ("f", False)])
def test_a_unit_is_what_the_parentheses_start_with(title, ok):
    assert has_unit(title) == ok


def axis_problems(fig) -> list[str]:
    """What a figure lacks: a title; for each axis a trace is drawn on, an axis title with a unit (has_unit), its own
    or that of an axis in the same column (x) or row (y) of a subplot grid, where plotly shows one title for all."""
    layout = fig.layout
    out = [] if (layout.title.text or "").strip() else ["the figure has no title"]
    used = {ref for t in fig.data for ref in (getattr(t, "xaxis", None) or "x", getattr(t, "yaxis", None) or "y")}
    if not fig.data:
        out.append("the figure has no traces to check")
    names = [n for n in layout if re.fullmatch(r"[xy]axis\d*", n)] + ["xaxis", "yaxis"]
    for ref in sorted(used):
        name = f"{ref[0]}axis{ref[1:]}"
        axis = layout[name]
        span = tuple(axis.domain or (0, 1))
        titles = [layout[n].title.text for n in names if n[0] == ref[0] and tuple(layout[n].domain or (0, 1)) == span
                  and layout[n].title.text]
        if not titles:
            out.append(f"{name} has no title, nor has any axis beside it")
        elif not has_unit(axis.title.text or titles[0]):
            out.append(f"{name}: {(axis.title.text or titles[0])!r} names no unit in parentheses")
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two made-up GPU runs of one card: the newest holds the tokens fixed, the other B and H (the lessons' run sets
    the two side by side)."""
    base = tmp_path_factory.mktemp("a11y") / "outputs"
    tokens = gpu_run.write_gpu_run(base / "gpu" / "tokens", started="2026-02-01T00:00:00+00:00")
    fixed = gpu_run.write_gpu_run(base / "gpu" / "fixed", started="2026-01-01T00:00:00+00:00")
    rows = sweep.read_results(fixed)
    rows["B"] = 2  # the same B and H at every N: the other batch policy
    rows.to_csv(fixed / sweep.RESULTS, index=False)
    return base, tokens, fixed


def _model_table() -> pd.DataFrame:
    rows = []
    for N, build, fwd, attn in ((1024, "materialised", 10.0, 1.0), (1024, "copy_v", 6.0, 0.05),
                                (1024, "fused", 7.0, 0.25), (4096, "materialised", 30.0, 8.0),
                                (4096, "copy_v", 14.0, 0.2), (4096, "fused", 17.0, 2.0)):
        row = model_forward.blank_row()
        row.update(model="m", B=1, N=N, build=build, status="ok", forward_ms=fwd, attention_ms=attn, layers=4,
                   device="cuda:0", case_id=f"m|1|{N}|bfloat16|{build}", dtype="bfloat16", H=16, Hkv=4, D=128)
        rows.append(row)
    return model_lab.amdahl_table(pd.DataFrame(rows))


def _figures(runs) -> dict:
    base, tokens, fixed = runs
    run = lab.load(tokens)
    les = lab.lessons(run, base)
    amdahl = _model_table()
    return {
        "lab.speedup_figures": lab.speedup_figures(les),
        "lab.batch_policy_figures": lab.batch_policy_figures(les),
        "lab.attribution_figure": [lab.attribution_figure(les), lab.attribution_figure(les, causal=True)],
        "lab.ablation_figure": [lab.ablation_figure(les, b) for b in ("fused", "qk_softmax", "materialised")],
        "lab.roofline_figures": lab.roofline_figures(les),
        "lab.memory_figure": [lab.memory_figure(les), lab.memory_figure(les, causal=True)],
        "report.text.figures": text.figures(run.results),
        "compare.figures": compare.figures([compare.read_run(tokens), compare.read_run(fixed)]),
        "explore.Explorer (teach)": [explore.Explorer("cpu", reference=tokens, check=False).figure],
        "explore.Explorer (live)": [live()[0].figure],
        "explore.static_view": [explore.static_view(tokens), explore.static_view(None)],
        "model_lab": [model_lab.amdahl_curves(), model_lab.speedup_figure(amdahl), model_lab.share_figure(amdahl)],
    }


def test_every_figure_has_a_title_and_axis_titles_with_units(runs, monkeypatch):
    monkeypatch.setenv("ATTNLAB_OUTPUTS", str(runs[0]))  # policy_runs looks for the other run there
    found = _figures(runs)
    assert all(found.values()), [k for k, v in found.items() if not v]  # each builder drew at least one figure
    problems = {f"{name} #{i}: {fig.layout.title.text!r}": p for name, figs in found.items()
                for i, fig in enumerate(figs) if (p := axis_problems(fig))}
    assert not problems, problems


def drawn_per_panel(fig) -> dict:
    """{(x axis, y axis): traces drawn at once} (a trace behind its legend entry, visible='legendonly', is not)."""
    out: dict = {}
    for t in fig.data:
        if t.visible in (None, True):
            key = (getattr(t, "xaxis", None) or "x", getattr(t, "yaxis", None) or "y")
            out[key] = out.get(key, 0) + 1
    return out


def test_no_panel_draws_more_than_eight_traces_at_once(runs, monkeypatch):
    monkeypatch.setenv("ATTNLAB_OUTPUTS", str(runs[0]))
    crowded = {f"{name} #{i}: {fig.layout.title.text!r}": panels for name, figs in _figures(runs).items()
               for i, fig in enumerate(figs) if (panels := {k: n for k, n in drawn_per_panel(fig).items() if n > 8})}
    assert not crowded, crowded


BUILDS = set(builds.names())
# The figures the walkthrough, the comparison and the report draw; their builds share attnlab.report.palette.
PALETTE_FIGURES = ("lab.", "report.text.figures", "compare.figures")


def build_of(trace) -> str | None:
    """The build a trace draws: its name's first word ('fused, D=64', 'fused must hold', 'fused (causal)')."""
    first = re.split(r"[ ,(]", trace.name or "", maxsplit=1)[0]
    return first if first in BUILDS else None


def colour_of(trace) -> str | None:
    line = getattr(trace, "line", None)
    if line is not None and line.color and "lines" in (getattr(trace, "mode", None) or "lines"):
        return line.color
    return getattr(trace.marker, "color", None) if getattr(trace, "marker", None) is not None else None


def test_every_build_keeps_one_colour_in_every_figure_and_ours_are_bold(runs, monkeypatch):
    monkeypatch.setenv("ATTNLAB_OUTPUTS", str(runs[0]))
    colours: dict = {}
    widths: dict = {}
    for name, figs in _figures(runs).items():
        if not name.startswith(PALETTE_FIGURES):
            continue
        for fig in figs:
            for t in fig.data:
                build = build_of(t)
                if build and colour_of(t):
                    colours.setdefault(build, set()).add(colour_of(t))
                    if t.type == "scatter" and "lines" in (t.mode or "") and not (t.name or "").endswith("hold"):
                        widths.setdefault(build, set()).add(t.line.width)
    assert {"materialised", "qk_softmax", "fused", "sdpa_flash"} <= set(colours)
    assert all(len(c) == 1 for c in colours.values()), {b: c for b, c in colours.items() if len(c) > 1}
    assert len({next(iter(c)) for c in colours.values()}) == len(colours)  # and no two builds share one
    ours = {w for b in ("materialised", "qk_softmax", "fused") for w in widths.get(b, ())}
    libraries = {w for b, ws in widths.items() if b not in ("materialised", "qk_softmax", "fused") for w in ws}
    assert ours and libraries and min(ours) > max(libraries)


def test_the_explorers_figure_keeps_its_axis_titles_when_a_shape_is_refused():
    ex = explore.Explorer("cpu", reference=None, check=False)
    ex.controls["Hkv"].value = 3
    layout = ex.figure.layout
    assert "no figure for" in layout.title.text
    assert all(has_unit(layout[f"{a}axis{i}"].title.text) for a in "xy" for i in ("", "2", "3"))


# -- widgets ------------------------------------------------------------------------------------------------------

def _controls(widget) -> list:
    """Every value-holding control under `widget` (what a person sets or reads), HTML and labels aside."""
    out = []
    if isinstance(widget, widgets.ValueWidget) and not isinstance(widget, (widgets.HTML, widgets.HTMLMath,
                                                                           widgets.Label)):
        out.append(widget)
    for child in getattr(widget, "children", ()):
        out += _controls(child)
    return out


def test_every_control_of_the_explorer_has_a_description():
    for ex in (explore.Explorer("cpu", reference=None, check=False), live()[0]):
        controls = _controls(ex.widget)
        assert set(ex.controls.values()) <= set(controls) and len(controls) == len(ex.controls) + 1  # + progress
        assert all(c.description.strip() for c in controls), [type(c).__name__ for c in controls
                                                              if not c.description.strip()]
        assert all(c.tooltip for c in ex.controls.values())


def test_the_explorer_is_the_only_module_that_builds_widgets():
    """A module that starts building widgets must have its controls checked above: this lists the builders."""
    builders = set()
    for path in (ROOT / "attnlab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "ipywidgets" for n in names):
                builders.add(path.relative_to(ROOT).as_posix())
    assert builders == {"attnlab/explore.py"}


# -- pages: a title, headings in order ----------------------------------------------------------------------------

class _Headings(HTMLParser):
    def __init__(self):
        super().__init__()
        self.levels, self.titles, self._in_title, self._depth = [], [], False, 0

    def handle_starttag(self, tag, attrs):
        if re.fullmatch(r"h[1-6]", tag):
            self.levels.append(int(tag[1]))
        if tag == "svg":
            self._depth += 1  # an svg's <title> names a picture, not the page
        if tag == "title" and not self._depth:
            self._in_title = True
            self.titles.append("")

    def handle_endtag(self, tag):
        if tag == "svg":
            self._depth -= 1
        if tag == "title":
            self._in_title = False

    def handle_data(self, data):
        if self._in_title:
            self.titles[-1] += data


def page_outline(html: str) -> tuple[list[str], list[int]]:
    """The page's <title> texts (outside any svg) and its heading levels, in order."""
    parser = _Headings()
    parser.feed(html)
    return [t.strip() for t in parser.titles], parser.levels


def skipped(levels: list[int]) -> list[str]:
    """Where headings skip a level: the first is not h1, or one is more than a level below the one before it."""
    out = [] if not levels or levels[0] == 1 else [f"the first heading is h{levels[0]}"]
    out += [f"h{a} then h{b} (heading {i + 2})" for i, (a, b) in enumerate(zip(levels, levels[1:])) if b > a + 1]
    return out


def markdown_levels(source: str) -> list[int]:
    """The levels of a markdown text's '#' headings (outside code fences) and of its <h1>…<h6> tags."""
    levels, fence = [], False
    for line in source.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"(#{1,6})\s+\S", line)):
            levels.append(len(m.group(1)))
        levels += [int(h) for h in re.findall(r"<h([1-6])\b", line)] if not fence else []
    return levels


@pytest.mark.parametrize("levels, found", [([1, 2, 3, 2, 2, 3], []), ([1, 3], ["h1 then h3 (heading 2)"]),
                                           ([2, 3], ["the first heading is h2"]), ([], [])])
def test_a_skipped_level_is_found(levels, found):
    assert skipped(levels) == found


NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_each_notebooks_headings_never_skip_a_level(path):
    nb = nbformat.read(str(path), as_version=4)
    levels = [lv for c in nb.cells if c.cell_type == "markdown" for lv in markdown_levels(c.source)]
    assert levels and not skipped(levels), (levels, skipped(levels))


def test_the_lies_headings_sit_one_level_below_their_section():
    nb = nbformat.read(str(render.WALKTHROUGH), as_version=4)
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "lab.lie(" in c.source)
    section = [lv for c in nb.cells[:first] if c.cell_type == "markdown" for lv in markdown_levels(c.source)][-1]
    demo = lies.Demo("A lie", "the lie", "the guard", pd.DataFrame(), "here")
    assert markdown_levels(lab.lie_outputs(demo)[0].data) == [section + 1]


def test_the_exported_page_is_titled_by_its_first_heading_and_keeps_heading_order(tmp_path):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    demo = lies.Demo("A lie", "the lie", "the guard", pd.DataFrame(), "here")
    shown = nbformat.v4.new_code_cell("", outputs=[nbformat.v4.new_output(
        "display_data", data={"text/markdown": lies.as_markdown(demo).data, "text/plain": "demo"})])
    nb.cells = [nbformat.v4.new_markdown_cell("Some words first.\n\n# The page's subject"),
                nbformat.v4.new_markdown_cell("## A section"), shown, nbformat.v4.new_markdown_cell("## Another")]
    nbformat.write(nb, str(tmp_path / "report.ipynb"))
    titles, levels = page_outline(render.export_html(tmp_path / "report.ipynb").read_text(encoding="utf-8"))
    assert titles == ["The page's subject"]
    assert levels == [1, 2, 3, 2]  # the demo's markdown output is a heading of the page too
    nb.cells = [nbformat.v4.new_markdown_cell("no heading at all")]
    nbformat.write(nb, str(tmp_path / "untitled.ipynb"))
    titles, _ = page_outline(render.export_html(tmp_path / "untitled.ipynb").read_text(encoding="utf-8"))
    assert titles == ["untitled"]  # the file's name, never nbconvert's 'Notebook'
