"""The walkthrough page's budget, measured on an executed notebook: what a reader meets without opening anything.

An output's *shown text* is what the exported page draws for it: a stream's text; for display data, its first
representation of text/html, text/markdown, text/plain (nbconvert's order); nothing for a plotly figure or a widget
(a figure's title and labels are drawn, not read as prose). From shown text, `<script>` and `<style>` blocks, `<svg>`
diagrams (a picture's labels, like a figure's) and every `<details>` block (collapsed: its content is one click away,
not on the page) are removed, then the tags.

    expanded_tables(nb)      tables on the page: `<table>` elements and markdown pipe tables outside <details>
    generated_words(nb)      words of shown text outside <details>: whitespace-separated tokens holding a letter or a
                             digit (so a table's numbers count; "|", "—" and "---" do not)
    repeated_notes(nb)       sentences of four words or more of three letters or more that one table (expanded or
                             collapsed) prints on two rows or more, numbers masked: a note said per row instead of once
                             under the table (a shape, 'B=1 H=4 N=256 D=64', is no sentence)
    noise(nb)                progress bars, widgets and warnings that a static page freezes or should not show
    page(nb)                 every text the outputs hold (plain, markdown and HTML, unescaped) and the plotly figures,
                             for a test to find its known numbers in; an error output fails the test
    trace(figures, title, name, axis)   the y values of the trace `name` in the panel `axis` of the figure titled
                                        `title...`
"""
from __future__ import annotations

import html
import re
from html.parser import HTMLParser

PRIORITY = ("text/html", "text/markdown", "text/plain")
SKIP = ("application/vnd.plotly.v1+json", "application/vnd.jupyter.widget-view+json")
BUDGET_TABLES = 8
BUDGET_WORDS = 2500


def shown(output) -> tuple[str, str]:
    """(mime, text) the exported page shows for one output; ('', '') for a figure or a widget."""
    if output.get("output_type") == "stream":
        return "stream", output.get("text", "")
    if output.get("output_type") == "error":
        return "error", "\n".join(output.get("traceback", []))
    data = output.get("data", {})
    if any(k in data for k in SKIP):
        return "", ""
    for kind in PRIORITY:
        if kind in data:
            text = data[kind]
            return kind, text if isinstance(text, str) else "".join(text)
    return "", ""


def outputs(nb):
    """Every code cell's outputs, as (cell source, mime, shown text)."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            for o in cell.get("outputs", []):
                kind, text = shown(o)
                if kind:
                    yield cell.source, kind, text


def _without(text: str, tag: str) -> str:
    """`text` with every <tag>…</tag> block removed, nested ones included (innermost first)."""
    inner = re.compile(rf"<{tag}\b[^>]*>(?:(?!<{tag}\b).)*?</{tag}>", re.S | re.I)
    while True:
        text, n = inner.subn(" ", text)
        if not n:
            return text


def open_part(kind: str, text: str) -> str:
    """The shown text outside <details>, <script>, <style> and <svg> blocks (markup kept)."""
    if kind not in ("text/html", "text/markdown"):
        return text
    for tag in ("script", "style", "details", "svg"):
        text = _without(text, tag)
    return text


def plain(kind: str, text: str) -> str:
    text = open_part(kind, text)
    if kind in ("text/html", "text/markdown"):
        text = html.unescape(re.sub(r"<[^>]+>", " ", text))
    return text


MD_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?\s*$", re.M)


def tables_in(kind: str, text: str) -> int:
    part = open_part(kind, text)
    return len(re.findall(r"<table\b", part, re.I)) + (len(MD_RULE.findall(part)) if kind == "text/markdown" else 0)


def expanded_tables(nb) -> list[tuple[str, int]]:
    """(cell source's first line, tables) for each output showing a table outside <details>."""
    out = []
    for src, kind, text in outputs(nb):
        n = tables_in(kind, text)
        if n:
            out.append((src.splitlines()[0] if src else "", n))
    return out


def words(text: str) -> list[str]:
    return [t for t in text.split() if re.search(r"[^\W_]", t)]


def generated_words(nb) -> int:
    return sum(len(words(plain(kind, text))) for _, kind, text in outputs(nb))


def words_by_cell(nb) -> dict[str, int]:
    out: dict[str, int] = {}
    for src, kind, text in outputs(nb):
        key = src.splitlines()[0] if src else ""
        out[key] = out.get(key, 0) + len(words(plain(kind, text)))
    return out


class _Rows(HTMLParser):
    """Each <table>'s rows, each row the text of its cells."""

    def __init__(self):
        super().__init__()
        self.tables, self._cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.tables and self.tables[-1]:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def table_rows(kind: str, text: str) -> list[list[list[str]]]:
    """Every table in the shown text, collapsed or not: rows of cell texts."""
    if kind == "text/html" or (kind == "text/markdown" and "<table" in text):
        parser = _Rows()
        parser.feed(text)
        found = parser.tables
    else:
        found = []
    if kind == "text/markdown":
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
                if line.strip().startswith("|") and not MD_RULE.match(line)]
        if rows:
            found.append(rows)
    return found


def sentences(cell: str) -> list[str]:
    """A cell's sentences of four words or more of three letters or more, numbers masked ('#'), so a note that
    differs only in its numbers reads as the same note."""
    out = []
    for s in re.split(r"(?<=[.;!?])\s+", " ".join(cell.split())):
        s = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", s)
        if sum(bool(re.search(r"[^\W\d_]{3}", w)) for w in s.split()) >= 4:
            out.append(s)
    return out


def repeated_notes(nb) -> list[str]:
    """'<cell>: <sentence> (k rows)' for each sentence one table prints on two rows or more."""
    out = []
    for src, kind, text in outputs(nb):
        for table in table_rows(kind, text):
            seen: dict[str, int] = {}
            for row in table:
                for s in {s for cell in row for s in sentences(cell)}:
                    seen[s] = seen.get(s, 0) + 1
            out += [f"{src.splitlines()[0] if src else ''}: {s!r} ({k} rows)" for s, k in seen.items() if k > 1]
    return out


BAR = re.compile(r"\d+%\|| \d+/\d+ \[\d|it/s\]|\?\w+/s\]")


def noise(nb) -> list[str]:
    """Progress bars (a widget, or tqdm's text), and warnings, anywhere in the outputs."""
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        first = cell.source.splitlines()[0] if cell.source else ""
        for o in cell.get("outputs", []):
            if "application/vnd.jupyter.widget-view+json" in o.get("data", {}):
                out.append(f"{first}: a widget (a static page draws its last text: a frozen bar)")
            text = o.get("text", "") + "".join(str(v) for k, v in o.get("data", {}).items() if k.startswith("text/"))
            if BAR.search(text):
                out.append(f"{first}: a progress bar: {BAR.search(text).group(0)!r}")
            if re.search(r"\b\w*Warning\b", text) and o.get("name") == "stderr":
                out.append(f"{first}: a warning on stderr: {text.strip()[:120]!r}")
            if o.get("output_type") == "stream" and o.get("name") == "stderr" and text.strip():
                out.append(f"{first}: standard error: {text.strip()[:120]!r}")
    return sorted(set(out))


def report(nb) -> dict:
    return {"expanded_tables": sum(n for _, n in expanded_tables(nb)), "generated_words": generated_words(nb),
            "repeated_notes": repeated_notes(nb), "noise": noise(nb)}


def page(nb) -> tuple[str, list]:
    """Every text the executed notebook's outputs show (text/plain, text/markdown, text/html; HTML unescaped), and
    its plotly figures (dicts). An error output fails the calling test."""
    import json

    texts, figures = [], []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            assert o.get("output_type") != "error", o
            data = o.get("data", {})
            texts += [str(data.get(k, "")) for k in ("text/plain", "text/markdown", "text/html")]
            if "application/vnd.plotly.v1+json" in data:
                fig = data["application/vnd.plotly.v1+json"]
                figures.append(json.loads(fig) if isinstance(fig, str) else fig)
    return html.unescape("\n".join(texts)), figures


def trace(figures, title: str, name: str, axis: str = "x") -> list:
    """The y values of the trace named `name` on x axis `axis` of the first figure whose title starts with `title`
    (plotly >= 6 stores arrays as base64 of one dtype: decoded)."""
    import base64

    import numpy as np

    fig = next(f for f in figures if f["layout"]["title"]["text"].startswith(title))
    y = next(t for t in fig["data"] if t.get("name") == name and t.get("xaxis", "x") == axis)["y"]
    if isinstance(y, dict):
        y = np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"])
    return list(y)
