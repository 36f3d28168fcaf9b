"""How a table sits on the walkthrough's page: folded into a `<details>` block a reader opens when they want it, and
its per-row notes said once beneath it instead of on every row.

    fold(table, summary)            the table inside <details>, `summary` on its closed face; the page's text/plain is
                                    the table's own, so whatever reads the notebook's plain text reads the numbers
    noted(table, column, fold=...)  the table with its note column turned into letters (a, b, …), each note said once
                                    beneath the table with how many rows it applies to; notes that differ only in their
                                    numbers are one note, its numbers given as the range they take; the shape a note
                                    names (the row's own columns) and raw tile JSON (which fields differ, instead) left
                                    out; folded as fold() when `fold` gives a summary, the notes inside the fold
    fold_all(outputs)               a section's list of outputs with every table folded, a one-line caption
                                    before a table moved onto its fold's face

The HTML is plain `<details>`, so it draws in JupyterLab and in the exported page with no script.
"""
from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field

import pandas as pd

SHAPE = re.compile(r"\s*\bat B=\d+ H=\d+ N=\d+ D=\d+")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def inline_markdown(text: str) -> str:
    """`text`'s **bold**, *italic* and `code` as HTML, everything else escaped."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    return re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<i>\1</i>", out)


def plain_text(fragment: str) -> str:
    """An HTML fragment's text, tags dropped."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


def details(summary: str, body_html: str) -> str:
    return f"<details><summary>{html.escape(summary)}</summary>\n{body_html}\n</details>"


def table_html(table: pd.DataFrame) -> str:
    return table.to_html(na_rep="n/a", float_format=lambda x: f"{x:.4g}", border=0, classes="dataframe")


@dataclass
class Folded:
    """A table folded into <details> (fold): `before_html` and `below_html` inside the fold, above and below the
    table; the plain text is the table's, then the text of both."""

    table: pd.DataFrame
    summary: str
    before_html: str = ""
    below_html: str = ""

    def _repr_html_(self) -> str:
        rows = f"{len(self.table)} row{'s' if len(self.table) != 1 else ''}"
        return details(f"{self.summary} ({rows})", self.before_html + table_html(self.table) + self.below_html)

    def __repr__(self) -> str:
        extra = " ".join(plain_text(h) for h in (self.before_html, self.below_html) if h)
        return repr(self.table) + (f"\n{extra}" if extra else "")

    def _repr_pretty_(self, p, cycle):
        p.text(repr(self))


@dataclass
class Noted:
    """A table whose notes are said once beneath it (noted)."""

    table: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    fold: str | None = None

    def _notes_html(self) -> str:
        if not self.notes:
            return ""
        items = "".join(f"<li>{inline_markdown(n)}</li>" for n in self.notes)
        return f"<p>Notes (the table's <code>notes</code> column names the rows):</p><ul>{items}</ul>"

    def _notes_text(self) -> str:
        return "\n".join(f"- {n}" for n in self.notes)

    def _repr_html_(self) -> str:
        if self.fold:  # a folded table's notes are its detail too: inside the fold, the count on its face
            count = f", {len(self.notes)} note{'s' if len(self.notes) != 1 else ''} beneath it" if self.notes else ""
            return Folded(self.table, self.fold + count, below_html=self._notes_html())._repr_html_()
        return table_html(self.table) + self._notes_html()

    def __repr__(self) -> str:
        return repr(self.table) + (f"\n{self._notes_text()}" if self.notes else "")

    def _repr_pretty_(self, p, cycle):
        p.text(repr(self))


def fold(table, summary: str):
    """`table` folded under `summary`; anything but a DataFrame (a section's 'nothing to show' line) as it is."""
    return Folded(table, summary) if isinstance(table, pd.DataFrame) else table


def _caption(output) -> str | None:
    """A one-line Markdown output's text, its emphasis dropped; None for anything else."""
    text = getattr(output, "data", None)
    if type(output).__name__ != "Markdown" or not isinstance(text, str) or "\n" in text.strip():
        return None
    return re.sub(r"[*_`]", "", text).strip().rstrip(":")


def fold_all(outputs: list) -> list:
    """A section's outputs with every DataFrame folded: a one-line Markdown caption just before a table becomes its
    fold's summary (and leaves the page), else 'the table'."""
    out = []
    for o in outputs:
        if isinstance(o, pd.DataFrame):
            caption = _caption(out[-1]) if out else None
            if caption is not None:
                out.pop()
            out.append(Folded(o, caption or "the table"))
        else:
            out.append(o)
    return out


def pieces(note: str) -> list[str]:
    """A note's parts: split at '; ' outside parentheses, brackets and braces."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(note):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0 and note.startswith("; ", i):
            out.append(note[start:i])
            start = i + 2
    out.append(note[start:])
    return [p.strip() for p in out if p.strip()]


def _json_objects(text: str) -> list[tuple[int, int, dict]]:
    """(start, end, value) of each balanced {...} in `text` that parses as a JSON object."""
    found, i = [], 0
    while (i := text.find("{", i)) >= 0:
        depth = 0
        for j in range(i, len(text)):
            depth += text[j] == "{"
            depth -= text[j] == "}"
            if depth == 0:
                try:
                    value = json.loads(text[i:j + 1])
                except ValueError:
                    break
                if isinstance(value, dict):
                    found.append((i, j + 1, value))
                i = j
                break
        i += 1
    return found


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def without_json(piece: str) -> str:
    """A note part with a pair of JSON objects ('({…} vs {…})') replaced by the fields that differ between them,
    and a lone JSON object by '(tiles recorded)'."""
    objs = _json_objects(piece)
    if len(objs) == 2:
        (a0, a1, a), (b0, b1, b) = objs
        fa, fb = _flat(a), _flat(b)
        keys = [k for k in dict.fromkeys([*fa, *fb]) if fa.get(k) != fb.get(k)]
        diff = ", ".join(f"{k.rpartition('.')[2]} {json.dumps(fa.get(k))} vs {json.dumps(fb.get(k))}" for k in keys)
        return piece[:a0] + (diff or "the same fields") + piece[b1:]
    for start, end, _ in reversed(objs):
        piece = piece[:start] + "tiles recorded" + piece[end:]
    return piece


def _spread(values: list[str]) -> str:
    nums = [float(v) for v in values]
    lo, hi = values[nums.index(min(nums))], values[nums.index(max(nums))]
    return lo if lo == hi else f"{lo} to {hi}"


def said_once(notes) -> tuple[list[str], list[str]]:
    """(each row's letters, each distinct note once): a note is a part of a row's note (pieces), the shape it names
    and raw JSON left out (without_json); parts that differ only in their numbers are one note, its numbers the range
    they take over its rows."""
    kinds: dict[str, list[list[str]]] = {}
    texts: dict[str, str] = {}
    rows = []
    for note in notes:
        mine = []
        for p in pieces(str(note) if isinstance(note, str) else ""):
            p = without_json(SHAPE.sub("", p))
            key = NUMBER.sub("#", p)
            kinds.setdefault(key, []).append(NUMBER.findall(p))
            texts.setdefault(key, p)
            if key not in mine:
                mine.append(key)
        rows.append(mine)
    order = list(kinds)
    letters = [", ".join(sorted(LETTERS[order.index(k) % len(LETTERS)] for k in mine)) for mine in rows]
    said = []
    for i, key in enumerate(order):
        columns = list(zip(*kinds[key]))  # each number's values over the rows
        parts = key.split("#")
        text = parts[0] + "".join(_spread(list(col)) + rest for col, rest in zip(columns, parts[1:]))
        n = len({j for j, mine in enumerate(rows) if key in mine})
        said.append(f"**{LETTERS[i % len(LETTERS)]}** ({n} of {len(rows)} rows): {text}")
    return letters, said


def noted(table, column: str = "note", fold: str | None = None):
    """`table` with `column` (free-text notes, one per row) turned into letters, each note said once beneath it
    (said_once); a table without the column, or with only empty notes, is shown as it is; anything but a DataFrame
    (a section's 'nothing to show' line) is returned as it is."""
    if not isinstance(table, pd.DataFrame):
        return table
    if column not in table:
        return Noted(table, [], fold)
    letters, said = said_once(table[column].fillna(""))
    t = table.drop(columns=[column])
    if said:
        t = t.assign(notes=letters)
    return Noted(t, said, fold)
