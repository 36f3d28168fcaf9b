"""The notebooks as a person meets them: a real JupyterLab server and Debian's Chromium driven by Playwright
(tests/browser.py). One server for the module, on 127.0.0.1 with its own port, token, settings and workspaces, serving
a temporary folder with copies of the notebooks; stopped when the module ends, also after a failure.

    the explorer      Run All, then a slider and a dropdown change the figure's data; an impossible shape gets its
                      one-line refusal
    the walkthrough   Run All with its CPU defaults (its own out_dir in the temporary folder): the speedup figure, the
                      memory table and the check-yourself answers are in the page, and no cell shows an error
    the reports       the walkthrough's HTML (exported from the notebook the browser ran and saved, as `attnlab run`
                      exports it) and every committed page of record (outputs/*/*/*.html), opened with every network
                      request blocked: each plotly figure draws its traces

Each test's screenshots go to its temporary folder; a failure lists them (tests/conftest.py). The tests skip, saying
why, only where Chromium or Playwright is missing; with ATTNLAB_BROWSER_TESTS=run (CI) they fail instead.

Under pytest-xdist the module wants one worker: one server, and one run of the walkthrough that two tests read.
`--dist loadscope` (or loadfile) gives it one; the xdist_group mark does under `--dist loadgroup` with pytest < 9.2
(pytest-xdist's loadgroup marks a test by rewriting its node id, which pytest 9.2 no longer reads). Split over two
workers the tests still pass, the walkthrough then run once on each.
"""
from __future__ import annotations

import dataclasses
import re
import shutil
import sys

import nbformat
import pytest

from attnlab import explore, lab as walk, cost, render
from tests import browser as bw
from tests.conftest import committed
from tests.test_accessibility import page_outline, skipped

REASON = bw.missing()
pytestmark = [pytest.mark.system, pytest.mark.xdist_group("browser"),
              pytest.mark.skipif(bool(REASON) and not bw.MUST_RUN, reason=f"browser tests: {REASON}")]

VIEWPORT = {"width": 1600, "height": 1000}
COMMITTED = bw.ROOT / "outputs" / "h200" / "2026-12-06-render" / "attention_lab.html"
EXPLORER_FIGURE = f"{bw.PANEL} .jp-OutputArea .widget-vbox .js-plotly-plot"  # the FigureWidget in the explorer's box


@pytest.fixture(scope="module")
def chromium():
    if REASON:
        pytest.fail(f"ATTNLAB_BROWSER_TESTS=run, but {REASON}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=bw.CHROMIUM, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The folder the server serves: the explorer as committed, and the walkthrough with its parameters cell's
    defaults (params/cpu.yaml's grid) but for out_dir, injected as papermill injects it, so the run writes into the
    temporary folder instead of the checkout's outputs/."""
    from papermill.iorw import load_notebook_node, write_ipynb
    from papermill.parameterize import parameterize_notebook

    base = tmp_path_factory.mktemp("browser")
    root = base / "notebooks"
    root.mkdir()
    shutil.copy(bw.ROOT / "notebooks" / "explore_shapes.ipynb", root)
    nb = parameterize_notebook(load_notebook_node(str(render.WALKTHROUGH)), {"out_dir": str(base / "run")})
    write_ipynb(nb, str(root / render.WALKTHROUGH.name))
    return base


@pytest.fixture(scope="module")
def lab(served):
    # the committed GPU runs are the explorer's and the walkthrough's reference, whatever the caller's environment
    with bw.Lab(served / "notebooks", served / "home", env={"ATTNLAB_OUTPUTS": str(bw.ROOT / "outputs")}) as server:
        yield server


def new_page(chromium):
    """A page in a browser context of its own, at VIEWPORT, each action waiting at most a minute."""
    context = chromium.new_context(viewport=VIEWPORT)
    context.set_default_timeout(60_000)
    return context.new_page()


@pytest.fixture
def page(chromium):
    page = new_page(chromium)
    yield page
    page.context.close()


@pytest.fixture
def shots(request, tmp_path):
    return bw.Shots(tmp_path / "screenshots", request.node)


def figure(page, selector: str) -> dict:
    return page.eval_on_selector(selector, bw.FIGURE_JS)


def redrawn(page, selector: str, title: str, traces: int, timeout_ms: int = 120_000) -> dict:
    """The figure once its title starts with `title` and it holds `traces` traces. The explorer redraws in steps
    (the old traces deleted, the new ones added, then the title set), so any change alone may be a step between."""
    page.wait_for_function(f"([sel, title, n]) => {{ const el = document.querySelector(sel); if (!el) return false;"
                           f" const f = ({bw.FIGURE_JS})(el);"
                           " return f.title.startsWith(title) && f.data.length === n; }",
                           arg=[selector, title, traces], timeout=timeout_ms, polling=250)
    return figure(page, selector)


def marked(fig: dict) -> set:
    """The N each trace marks large (the explorer's chosen N)."""
    return {x for t in fig["data"] if t["size"] and len(t["size"]) == len(t["x"])
            for x, s in zip(t["x"], t["size"]) if s == max(t["size"])}


def control(page, kind: str, description: str):
    """An ipywidgets control of the shown notebook by its class and its description label."""
    label = page.locator("label.widget-label", has_text=re.compile(f"^{re.escape(description)}$"))
    return page.locator(f"{bw.PANEL} .{kind}").filter(has=label)


def test_the_explorer_redraws_its_data_on_a_slider_and_a_dropdown_and_refuses_an_impossible_shape(lab, page, shots):
    descriptions = {k: w.description for k, w in explore.controls().items()}
    d = explore.DEFAULT
    with shots.kept(page):
        bw.open_notebook(page, lab, "explore_shapes.ipynb")
        bw.run_all(page, lab, 240_000)
        assert not bw.errors(page)
        assert page.get_by_text(f"kernel: {sys.prefix}").is_visible()  # this venv's kernel ran the page
        page.wait_for_selector(f"{EXPLORER_FIGURE} svg.main-svg g.trace")
        page.locator(EXPLORER_FIGURE).scroll_into_view_if_needed()
        shots.take(page, "explorer-ran")
        first = figure(page, EXPLORER_FIGURE)
        shape = explore.Shape(d["B"], d["H"], d["Hkv"], d["N"], d["D"], d["dtype"], d["causal"])
        assert marked(first) == {d["N"]} and first["title"].startswith(shape.where)
        traces = len(first["data"])

        # the N slider one step right: every trace marks the next N
        handle = control(page, "widget-slider", descriptions["N"]).locator(".noUi-handle")
        handle.focus()
        page.keyboard.press("ArrowRight")
        shape = dataclasses.replace(shape, N=min(n for n in explore.N_OPTIONS if n > d["N"]))
        slid = redrawn(page, EXPLORER_FIGURE, f"{shape.where}:", traces)
        assert marked(slid) == {shape.N} and [t["size"] for t in slid["data"]] != [t["size"] for t in first["data"]]
        shots.take(page, "slider-moved")

        # the head dim dropdown: every byte count is the model's at the new D
        control(page, "widget-dropdown", descriptions["D"]).locator("select").select_option("128")
        shape = dataclasses.replace(shape, D=128)
        dropped = redrawn(page, EXPLORER_FIGURE, f"{shape.where}:", traces)
        moved = next(t for t in dropped["data"] if t["name"] == "materialised (model)")
        expect = [cost.bytes_moved(dataclasses.replace(shape, N=n).case("materialised", "cpu")) for n in moved["x"]]
        before = next(t for t in slid["data"] if t["name"] == "materialised (model)")
        assert moved["y"] == pytest.approx(expect) and moved["y"] != before["y"]
        shots.take(page, "dropdown-changed")

        # Hkv = 3 does not divide H = 16: the figure empties and the page says why, in one line
        box = control(page, "widget-text", descriptions["Hkv"]).locator("input")
        box.fill("3")
        box.press("Enter")
        shape = dataclasses.replace(shape, Hkv=3)
        why = explore.problem(shape)
        refused = redrawn(page, EXPLORER_FIGURE, f"no figure for {shape.where}: the shape is refused (why: below)", 3)
        assert why and all(t["x"] == [] for t in refused["data"])  # an empty trace a panel, to keep its axes
        line = page.get_by_text(f"this shape is refused before anything runs: {why}", exact=True)
        line.scroll_into_view_if_needed()
        assert line.is_visible()
        shots.take(page, "impossible-shape")
        assert not bw.errors(page)


# What overflows the notebook's outputs: per output area of the shown notebook, its scroll and client widths, and
# each drawn part (a figure's svg, its legend and title, a widget box, a slider, a table) whose box runs past the
# area's left or right edge; and the N slider's track width.
FIT_JS = """panel => {
    const root = document.querySelector(panel);
    const parts = 'svg.main-svg, g.legend, g.g-gtitle, .widget-box, .widget-slider, table';
    const areas = [...root.querySelectorAll('.jp-OutputArea-output')].map(area => {
        const a = area.getBoundingClientRect();
        const over = [...area.querySelectorAll(parts)].map(el => [el, el.getBoundingClientRect()])
            .filter(([el, r]) => r.width > 0 && (r.right > a.right + 1 || r.left < a.left - 1))
            .map(([el, r]) => `${el.tagName}.${el.getAttribute('class')}: ${r.left}-${r.right} in ${a.left}-${a.right}`);
        return {scroll: area.scrollWidth, client: area.clientWidth, over};
    });
    const track = root.querySelector('.widget-slider .noUi-base');
    return {areas, track: track ? track.getBoundingClientRect().width : 0};
}"""
# The tick labels of a plotly figure's y axes, by axis ('y', 'y2', …), as drawn.
TICKS_JS = """el => Object.fromEntries(['y', 'y2', 'y3'].map(a => [a,
    [...el.querySelectorAll(`g.${a}tick text`)].map(t => t.textContent)]))"""
NARROW = {"width": 1280, "height": 900}  # JupyterLab with its file browser open leaves the cells about 850 px
SI = re.compile(r"^-?[\d.]+[kMGTPB]$")  # plotly's own tick labels on a byte axis: "1T", "100B"


def test_the_explorer_fits_its_cell_at_1280_px_with_a_slider_track_and_byte_ticks(lab, chromium, shots):
    page = chromium.new_context(viewport=NARROW).new_page()
    page.set_default_timeout(60_000)
    try:
        with shots.kept(page):
            bw.open_notebook(page, lab, "explore_shapes.ipynb")
            bw.run_all(page, lab, 240_000)
            assert not bw.errors(page)
            page.wait_for_selector(f"{EXPLORER_FIGURE} svg.main-svg g.trace")
            static = f"{bw.PANEL} .jp-RenderedPlotly.js-plotly-plot"
            page.wait_for_selector(f"{static} svg.main-svg g.trace")
            control(page, "widget-slider", explore.controls()["N"].description).scroll_into_view_if_needed()
            shots.take(page, "explorer-controls-1280")
            for name, selector in (("explorer-figure", EXPLORER_FIGURE), ("static-view", static)):
                page.locator(selector).scroll_into_view_if_needed()
                shots.take(page, f"{name}-1280")

            fit = page.evaluate(FIT_JS, bw.PANEL)
            assert fit["areas"] and all(a["scroll"] <= a["client"] for a in fit["areas"]), fit
            assert not [o for a in fit["areas"] for o in a["over"]], fit
            assert fit["track"] >= 100, fit  # the slider's track, not a handle alone

            # byte axes: binary units, never plotly's SI ("1T" for a trillion bytes, "100B" for 100 billion)
            bytes_axes = ((EXPLORER_FIGURE, ("y", "y2")), (static, ("y2",)))  # teach mode: moved, held; memory
            for selector, axes in bytes_axes:
                ticks = page.eval_on_selector(selector, TICKS_JS)
                for a in axes:
                    assert ticks[a] and all(t.endswith("iB") or t.endswith(" B") for t in ticks[a]), ticks
                    assert not [t for t in ticks[a] if SI.match(t)], ticks
    finally:
        page.context.close()


@pytest.fixture(scope="module")
def walkthrough(chromium, lab, served, request, tmp_path_factory):
    """The walkthrough run in the browser (Run All) and saved: the page, still open, and the run's folder."""
    shots = bw.Shots(tmp_path_factory.mktemp("walkthrough-screenshots"), request.node)
    page = new_page(chromium)
    with shots.kept(page):
        bw.open_notebook(page, lab, render.WALKTHROUGH.name)
        bw.run_all(page, lab, 300_000)
        shots.take(page, "walkthrough-ran")
        bw.save(page, served / "notebooks" / render.WALKTHROUGH.name)
    yield page, shots, served / "run"
    page.context.close()


def test_the_walkthrough_runs_every_cell_and_shows_its_figure_table_and_answers(walkthrough):
    page, shots, out = walkthrough
    run = walk.load(out)
    les = walk.lessons(run)
    with shots.kept(page):
        assert not bw.errors(page)
        code = bw.cells(page)
        assert code and all(c["count"] for c in code)  # every code cell ran
        stderr = [o["text"] for c in code for o in c["outputs"] if o["type"] == "stream" and o["name"] == "stderr"]
        assert all("Warning" in t for t in stderr), stderr  # stderr carries warnings only
        saved = nbformat.read(str(out.parent / "notebooks" / render.WALKTHROUGH.name), as_version=4)
        assert not [o for c in saved.cells for o in c.get("outputs", []) if o.output_type == "error"]
        assert page.get_by_text(str(bw.ROOT / "attnlab")).first.is_visible()  # lab.setup: this checkout's attnlab
        assert run.device == "cpu" and len(run.results)  # the CPU path: the sweep ran here, in the interpreter

        # the speedup figure, drawn from the lesson rows as the package draws it
        expected = walk.speedup_figures(les)[0]
        selector = f"{bw.PANEL} .js-plotly-plot >> nth={_index(page, 'Speedup over materialised')}"
        speed = page.locator(selector)
        speed.scroll_into_view_if_needed()
        assert speed.is_visible()
        drawn = figure(page, selector)
        assert drawn["title"] == expected.layout.title.text
        assert [t["name"] for t in drawn["data"]] == [t.name for t in expected.data]
        assert speed.evaluate(bw.DRAWN_JS)["inked"] > 0
        shots.take(speed, "speedup-figure")

        # the memory table, folded: closed, then opened, the predicted size of S beside each build's peak, as
        # lab.memory computes it
        wide = walk.memory(les)[0]
        fold = page.locator(f"{bw.PANEL} details").filter(has_text="S or P (predicted)").first
        table = fold.locator("table")
        fold.scroll_into_view_if_needed()
        assert fold.is_visible() and not table.is_visible()
        fold.locator("summary").click()
        assert table.is_visible()
        shown = table.locator("tbody tr").evaluate_all("rows => rows.map(r => r.innerText)")
        assert len(shown) == len(wide)
        assert all(s in row for row, s in zip(shown, wide["S or P (predicted)"]))
        shots.take(page, "memory-table")

        # check yourself: every question the package asks, each answer shown when opened
        heading = page.locator(f"{bw.PANEL} h2", has_text="Check yourself")
        heading.scroll_into_view_if_needed()
        assert heading.is_visible()
        qs = walk.questions(run, les)
        answers = page.locator(f"{bw.PANEL} details").filter(has=page.locator("summary", has_text="Answer"))
        assert answers.count() == len(qs) >= 5
        for q, details in zip(qs, answers.all()):
            assert page.get_by_text(q.question, exact=True).is_visible()
            details.locator("summary").click()
            answer = details.locator("p")
            assert answer.is_visible() and answer.inner_text() == q.answer
        heading.scroll_into_view_if_needed()
        shots.take(page, "check-yourself-open")


def _index(page, title: str) -> int:
    """The position, among the shown notebook's plotly figures, of the first whose title starts with `title`."""
    titles = page.eval_on_selector_all(f"{bw.PANEL} .js-plotly-plot",
                                       "els => els.map(e => (e.layout && e.layout.title && e.layout.title.text) || '')")
    return next(i for i, t in enumerate(titles) if t.startswith(title))


def offline(page, html, shots) -> dict:
    """`html` opened with every request but the file itself aborted: the requests aborted, the number of plotly
    figures, what each drew (DRAWN_JS), the page's title and its heading levels."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    url = html.resolve().as_uri()
    blocked = []

    def route(r):
        if r.request.url == url:
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(url, wait_until="load")
    try:  # a figure that cannot draw offline never gets its svg: the assertions below say which
        page.wait_for_function("() => [...document.querySelectorAll('.plotly-graph-div')]"
                               ".every(d => d.querySelector('svg.main-svg'))", timeout=60_000)
    except PlaywrightTimeout:
        pass
    shots.take(page, f"{html.stem}-top")
    figures = page.locator(".plotly-graph-div")
    found = {"blocked": blocked, "divs": figures.count(), "drawn": [f.evaluate(bw.DRAWN_JS) for f in figures.all()],
             "title": page.title(), "levels": page.eval_on_selector_all("h1, h2, h3, h4, h5, h6",
                                                                        "els => els.map(e => +e.tagName[1])")}
    for i, f in enumerate(figures.all()):
        f.scroll_into_view_if_needed()
        shots.take(f, f"{html.stem}-figure-{i + 1}")
    return found


def test_the_walkthroughs_html_report_draws_every_figure_offline(walkthrough, page, shots, tmp_path):
    _, _, out = walkthrough
    notebook = out.parent / "notebooks" / render.WALKTHROUGH.name
    html = render.export_html(notebook, tmp_path / "attention_lab.html")  # what `attnlab run` exports
    with shots.kept(page):
        found = offline(page, html, shots)
        assert found["divs"] >= 4 and all(d["svg"] and d["traces"] and d["inked"] for d in found["drawn"]), found
        assert not found["blocked"]  # and it asked for nothing
        assert found["title"] == render.page_title(nbformat.read(str(notebook), as_version=4), "") != ""
        assert not skipped(found["levels"]), found["levels"]
        # the same outline as the file read without a browser
        assert page_outline(html.read_text(encoding="utf-8")) == ([found["title"]], found["levels"])


PAGES_OF_RECORD = "outputs/*/*/*.html"  # every committed HTML page of record


@pytest.mark.parametrize("name", committed(PAGES_OF_RECORD))
def test_every_committed_page_of_record_draws_every_figure_offline(page, shots, name):
    """Each HTML page under outputs/ (walkthroughs, model and training pages, reports), as a reader opens it from
    the repository: every request but the file's own blocked, and every plotly figure drawn with its traces."""
    with shots.kept(page):
        found = offline(page, bw.ROOT / name, shots)
        assert found["divs"] >= 2 and all(d["svg"] and d["traces"] and d["inked"] for d in found["drawn"]), found
        assert not found["blocked"]


def test_the_committed_pages_include_the_walkthroughs_of_record():
    assert str(COMMITTED.relative_to(bw.ROOT)) in committed(PAGES_OF_RECORD)
