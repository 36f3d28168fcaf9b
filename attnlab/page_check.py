"""A rendered walkthrough checked against its own rows: the executed attention_lab.ipynb of a run folder read back,
and each number its speed sections printed compared with the same number computed now from the folder's
results.csv and provenance.json. A page that drew on another run's rows, or on part of its own, fails.

    python -m attnlab.page_check outputs/h200/2026-12-06-render      # 'ok: …' and exit 0, else each mismatch

The comparison is of numbers, not of wording, so a page rendered by an older commit is still checked by a newer one:
  - every section that says where its rows come from says 'Measured here', naming the device of the rows;
  - the speedup table holds fused over materialised at every (dtype, causal, D, N) of the rows, to two decimals;
  - the trend's first and last speedups, and the experiment record's, are the rows' own;
  - the roofline's title quotes the ceilings this run measured;
  - the sweep's cell reports as many rows as results.csv holds.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat

from attnlab import lab

NOTEBOOK = "attention_lab.ipynb"
NUMBER = re.compile(r"-?\d+\.\d+")


def _cells(path: Path) -> dict[str, str]:
    """Each code cell's source → the text of its outputs (stream, plain, markdown, html and figure titles)."""
    nb = nbformat.read(str(path), as_version=4)
    out = {}
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        texts = []
        for o in c.get("outputs", []):
            texts.append(str(o.get("text", "")))
            data = o.get("data", {})
            for kind in ("text/plain", "text/markdown", "text/html"):
                texts.append(str(data.get(kind, "")))
            fig = data.get("application/vnd.plotly.v1+json")
            if fig:
                fig = json.loads(fig) if isinstance(fig, str) else fig
                texts.append(str(fig.get("layout", {}).get("title", {}).get("text", "")))
        out[c.source] = "\n".join(texts)
    return out


def _find(cells: dict[str, str], call: str) -> list[str]:
    return [text for src, text in cells.items() if call in src]


def _numbers(text: str) -> list[float]:
    return [float(x) for x in NUMBER.findall(text)]


def check(folder) -> list[str]:
    """Every way the folder's page disagrees with its own rows ([] when none). ValueError when the folder holds no
    rendered walkthrough or no GPU rows of our three builds (nothing to check the page against)."""
    folder = Path(folder)
    if not (folder / NOTEBOOK).exists():
        raise ValueError(f"folder {folder} holds no {NOTEBOOK}: give a rendered run's folder")
    run = lab.load(folder)
    les = lab.lessons(run)
    if les is None or not les.own:
        raise ValueError(f"folder {folder} holds no GPU rows of {', '.join(lab.OURS)}: its page drew on another run "
                         "by design, so there is nothing of its own to check it against")
    cells = _cells(folder / NOTEBOOK)
    problems = []
    notes = _find(cells, "lab.source_note(")
    if not notes:
        problems.append("no cell says where the speed rows come from")
    for text in notes:
        if "Measured here" not in text or les.device_name not in text:
            problems.append(f"a source note does not say the rows were measured here on {les.device_name}: "
                            f"{text.strip()[:160]!r}")
    sp = lab.speedup_table(les)
    shown = " ".join(_find(cells, "lab.speedup_table("))
    have = sorted(round(x, 2) for x in _numbers(shown.split("<")[0]))  # the plain text, before any html
    want = sorted(round(float(x), 2) for x in sp.to_numpy().ravel() if x == x)
    if have != want:
        problems.append(f"the speedup table shows {len(have)} ratios that differ from the rows' {len(want)}: "
                        f"first differences {[(a, b) for a, b in zip(have, want) if a != b][:4]}")
    tr = lab.trend(les)
    record = " ".join(_find(cells, "lab.record("))
    trend = " ".join(_find(cells, "lab.trend("))
    for r in tr.itertuples():
        kind = "causal" if r.causal else "non-causal"
        if f"{kind} D = {r.D}: {r.first:.2f}× → {r.last:.2f}×" not in record:
            problems.append(f"the experiment record lacks the rows' {kind} D = {r.D} curve, {r.first:.2f}× → "
                            f"{r.last:.2f}×")
        if not {round(r.first, 2), round(r.last, 2)} <= {round(x, 2) for x in _numbers(trend)}:
            problems.append(f"the trend table lacks the rows' {kind} D = {r.D} ends, {r.first:.2f} and {r.last:.2f}")
    roof = " ".join(_find(cells, "lab.roofline_figures("))
    for dtype in les.dtypes:
        c = les.provenance.get("ceilings", {}).get(dtype, {})
        if c and (f"{c['tbps']:.3g} TB/s" not in roof or f"{c['tflops']:.3g} TFLOP/s" not in roof):
            problems.append(f"the roofline's title does not quote this run's {dtype} ceilings, {c['tbps']:.3g} TB/s "
                            f"and {c['tflops']:.3g} TFLOP/s")
    rows = len(run.results)
    if f"{rows} rows in" not in " ".join(_find(cells, "lab.sweep_run(")):
        problems.append(f"the sweep's cell does not report the {rows} rows of results.csv")
    return problems


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m attnlab.page_check FOLDER", file=sys.stderr)
        return 2
    try:
        problems = check(argv[0])
    except ValueError as e:
        print(f"page_check: {e}", file=sys.stderr)
        return 2
    for p in problems:
        print(f"MISMATCH: {p}")
    if not problems:
        print(f"ok: {argv[0]}/{NOTEBOOK} shows its own rows (speedup table, trend, record, roofline, row count)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
