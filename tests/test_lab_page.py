"""How a table sits on the walkthrough's page (attnlab.lab.page): folded into <details> with its numbers still in the
plain text, its per-row notes said once beneath it; and the progress line a long cell leaves (one summary line)."""
import json

import nbformat
import pandas as pd
import pytest
from nbclient import NotebookClient

from attnlab import lab, lies
from attnlab.lab import page
from tests import page_budget

TILES_A = {"fused": {"BLOCK_M": 64, "o_tma": False, "gluon": True}}
TILES_B = {"fused": {"BLOCK_M": 64, "o_tma": True, "gluon": True}}


def _notes() -> pd.DataFrame:
    """Four rows whose notes repeat per row, as the attribution's and the ablations' do: one note differing only in
    its numbers, one naming the row's shape, one carrying raw tile JSON, one row without a note."""
    clock = "ran at SM clocks {p}% apart at B=1 H=8 N={n} D=64 (fused {f} MHz; power cap): Δ includes the clock"
    impl = "kernels written differently at B=1 H=8 N={n} D=64 (materialised triton): Δ includes the implementation"
    tiles = f"fused-zero_mask ran other tiles than fused ({json.dumps(TILES_A)} vs {json.dumps(TILES_B)})"
    notes = [f"{impl.format(n=512)}; {clock.format(p=6, n=512, f=1980)}",
             f"{impl.format(n=1024)}; {clock.format(p=31, n=1024, f=1485)}; {tiles}",
             impl.format(n=2048), ""]
    return pd.DataFrame({"N": [512, 1024, 2048, 4096], "ms": [0.1, 0.2, 0.4, 0.8], "note": notes})


def test_each_note_is_said_once_its_numbers_as_a_range_its_shape_and_json_left_out():
    n = page.noted(_notes())
    assert list(n.table["notes"]) == ["a, b", "a, b, c", "a", ""]
    assert "note" not in n.table and list(n.table["ms"]) == [0.1, 0.2, 0.4, 0.8]
    a, b, c = n.notes
    assert a == ("**a** (3 of 4 rows): kernels written differently (materialised triton): Δ includes the "
                 "implementation")
    assert b == "**b** (2 of 4 rows): ran at SM clocks 6 to 31% apart (fused 1485 to 1980 MHz; power cap): Δ includes " \
                "the clock"
    assert c == '**c** (1 of 4 rows): fused-zero_mask ran other tiles than fused (o_tma false vs true)'
    html = n._repr_html_()
    assert html.count("kernels written differently") == 1 and "BLOCK_M" not in html
    assert "<details>" not in html  # not folded unless asked


def test_a_note_split_at_semicolons_outside_brackets_only():
    assert page.pieces("a (x; y): z; b {1; 2}; c") == ["a (x; y): z", "b {1; 2}", "c"]


def test_a_table_without_notes_and_a_section_that_has_nothing_to_show_pass_through():
    t = pd.DataFrame({"N": [1], "ms": [1.0]})
    assert page.noted(t).notes == [] and page.noted(t).table.equals(t)
    nothing = lab.no_lessons()
    assert page.noted(nothing) is nothing and page.fold(nothing, "x") is nothing


def test_a_folded_table_keeps_its_numbers_in_the_plain_text_and_draws_as_details():
    t = pd.DataFrame({"N": [512, 1024], "x": [2.5, 3.25]})
    f = page.fold(t, "The numbers <behind> the curve")
    html = f._repr_html_()
    assert html.startswith("<details><summary>The numbers &lt;behind&gt; the curve (2 rows)</summary>")
    assert html.rstrip().endswith("</details>") and "<table" in html and "3.25" in html
    assert repr(f) == repr(t)  # what a reader of the notebook's text/plain (page_check) sees: the table itself
    kind, text = "text/html", html
    assert page_budget.tables_in(kind, text) == 0 and page_budget.words(page_budget.plain(kind, text)) == []


def test_a_folded_noted_table_keeps_its_notes_inside_the_fold_and_counts_them_on_its_face():
    html = page.noted(_notes(), fold="Per shape")._repr_html_()
    assert html.startswith("<details><summary>Per shape, 3 notes beneath it (4 rows)</summary>")
    inside, _, outside = html.partition("</details>")
    assert inside.index("<table") < inside.index("kernels written differently") and not outside.strip()
    assert "(3 of 4 rows)" in inside


def test_fold_all_moves_a_tables_one_line_caption_onto_its_fold():
    from IPython.display import Markdown

    t = pd.DataFrame({"name": ["k"], "ms": [1.0]})
    out = page.fold_all([Markdown("Some words first.\n\nTwo paragraphs."), Markdown("**fused**: 1 kernel(s)"), t,
                         t, Markdown("after")])
    assert [type(o).__name__ for o in out] == ["Markdown", "Folded", "Folded", "Markdown"]
    assert out[1].summary == "fused: 1 kernel(s)" and out[2].summary == "the table"


def test_a_lie_keeps_its_title_and_lie_open_and_folds_the_guard_with_its_evidence():
    demo = lies.Demo("A lie", "the **lie** itself", "the guard `acc += o.sum()`", pd.DataFrame({"ms": [1.0]}),
                     "here")
    md, folded = lab.lie_outputs(demo)
    assert md.data.startswith("### A lie") and "the **lie** itself" in md.data and "guard" not in md.data
    html = folded._repr_html_()
    assert "<summary>The guard that catches it, and the evidence (1 row)</summary>" in html
    assert "<b>The guard.</b> the guard <code>acc += o.sum()</code>" in html
    assert html.index("The guard.") < html.index("<table") < html.index("</details>")
    assert "the guard acc += o.sum()" in repr(folded)


def _run_cell(source: str) -> list:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    NotebookClient(nb, kernel_name="python3", timeout=120).execute()
    return nb.cells[0].outputs


def test_a_progress_bar_in_a_kernel_leaves_one_summary_line_and_no_widget():
    outputs = _run_cell("from attnlab.lab.notebook import progress_bar\n"
                        "for _ in progress_bar('gate')(range(3), unit='shape'):\n    pass\nprint('after')")
    assert [o["output_type"] for o in outputs] == ["display_data", "stream"]
    assert outputs[0]["data"] == {"text/plain": outputs[0]["data"]["text/plain"]}  # text only: no widget
    assert outputs[0]["data"]["text/plain"].startswith("gate: 3 of 3 shapes in ")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("", outputs=outputs)]
    assert page_budget.noise(nb) == []


@pytest.mark.parametrize("text, found", [("  0%|          | 0/456 [00:00<?, ?case/s]", True),
                                         ("gate: 3 of 3 shapes in 2 s", False), ("91%|█████████ ", True)])
def test_the_budget_finds_a_frozen_bar(text, found):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x", outputs=[nbformat.v4.new_output("display_data",
                                                                              data={"text/plain": text})])]
    assert bool(page_budget.noise(nb)) == found
