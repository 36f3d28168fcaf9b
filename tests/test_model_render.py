"""notebooks/model_forward.ipynb rendered by papermill down its GPU path on a CPU: the sweep's rows come from
tests/standin/model_forward.py (installed in the kernel by tests/standin/sitecustomize.py), whose numbers are known,
so the page must show them in every speed section, in two parts of one run folder as in one, and name the rows it
reads."""
import json
from pathlib import Path

import nbformat
import pytest
import yaml

from attnlab import model_lab as ml, model_sweep
from tests import page_budget
from tests.standin import installed
from tests.standin import model_forward as standin

pytest.importorskip("transformers", reason="the model extra: pip install -e '.[model]'")

TINY = dict(name="t", device="cpu", dtype="float32", models=[dict(name="tiny", layers=2, hidden=64, heads=4,
            kv_heads=2, head_dim=16, intermediate=96, vocab=128)], batches=[1], builds=["materialised", "fused"],
            baseline="materialised", windows=1, reps_ms=1, min_reps=1, compile_modes=["reduce-overhead"],
            compile_builds=["transformers_sdpa", "fused"])


def _render(tmp: Path, out: Path, seq_lens: list, env: dict):
    params = tmp / f"p{len(seq_lens)}.yaml"
    params.write_text(yaml.safe_dump({**TINY, "seq_lens": seq_lens}))
    with installed("tests.standin.model_forward", **env):
        return ml.render_notebook(params, out)


@pytest.fixture(scope="module")
def two_parts(tmp_path_factory):
    """One run folder rendered twice through the stand-in: N = 32 first, then N = 32 and 64 (only 64 measured)."""
    tmp = tmp_path_factory.mktemp("model-standin")
    (tmp / "outputs").mkdir()
    env = {"ATTNLAB_OUTPUTS": str(tmp / "outputs")}
    first = _render(tmp, tmp / "run", [32], env)
    first_nb = nbformat.read(str(first.notebook), as_version=4)  # the second part writes over it
    second = _render(tmp, tmp / "run", [32, 64], env)
    return first, first_nb, second


_page, _trace = page_budget.page, page_budget.trace  # what a page shows; a figure's trace


def test_the_first_part_shows_its_own_rows(two_parts):
    first, nb, _ = two_parts
    assert first.code == 0, first.message
    text, _ = _page(nb)
    assert f"Measured here:** this run, measured on {standin.DEVICE_NAME}" in text
    assert "From a committed GPU run" not in text and "Nothing to show" not in text
    assert "3.7903" in text and "0.1559" in text and "4.4482" not in text  # N = 32's rows, none of N = 64's
    assert "One N per model and batch" in text and "No build's attention alone stays within 20%" in text


def test_a_resumed_render_shows_both_parts_rows_in_every_section(two_parts):
    _, _, second = two_parts
    assert second.code == 0, second.message
    rows = model_sweep.read_results(second.out)
    assert len(rows) == 8 and set(rows["device"]) == {"cuda:0"}
    sessions = json.loads((second.out / model_sweep.PROVENANCE).read_text())["sessions"]
    assert [(s["already_measured"], s["measured"]) for s in sessions] == [(0, 6), (6, 6)]  # N = 64 measured second
    assert len(model_sweep.read_results(second.out, modes=None)) == 12  # each N: 4 eager rows, 2 compiled
    text, figures = _page(nbformat.read(str(second.notebook), as_version=4))
    assert text.count(f"Rows: this run, measured on {standin.DEVICE_NAME}") == 5  # speed, share, speedups, deployed,
    # memory
    # as deployed: each compiled forward over SDPA's compiled, beside the eager ratio, one line a shape
    for n in (32, 64):
        c, e = standin.COMPILED_MS[n], standin.FORWARD_MS[n]
        assert (f"tiny B = 1, N = {n}: fused's compiled forward {c['fused']:.2f} ms, "
                f"{c['fused'] / c['transformers_sdpa']:.2f}× SDPA's compiled; eagerly {e['fused']:.2f} ms, "
                f"{e['fused'] / e['transformers_sdpa']:.2f}× SDPA's eager, 0 graph breaks.") in text
    assert "From a committed GPU run" not in text and "Triton's interpreter: their times" not in text
    # the forward and the attention alone, both parts' markers
    for n in (32, 64):
        for build in ("copy_v", "materialised", "fused"):
            assert f"{standin.FORWARD_MS[n][build]:.4f}" in text and f"{standin.ATTENTION_MS[n][build]:.4f}" in text
    # the launch floor, beside the numbers: fused's attention alone flat while its FLOPs grow 4x
    assert ("fused's stays between 0.134 and 0.142 ms from N = 32 to N = 64 (tiny, B = 1) while its FLOPs grow 4×"
            in text)
    # attention's share, in the figure and the note: it falls, with the reasons the stand-in's numbers carry
    f32 = (standin.FORWARD_MS[32]["materialised"] - standin.FORWARD_MS[32]["copy_v"]) / standin.FORWARD_MS[32][
        "materialised"]
    f64 = (standin.FORWARD_MS[64]["materialised"] - standin.FORWARD_MS[64]["copy_v"]) / standin.FORWARD_MS[64][
        "materialised"]
    assert _trace(figures, "Attention's share f", "tiny, B = 1: by ablation") == pytest.approx([f32, f64])
    assert f"f = {f32:.2f} (N = 32) → {f64:.2f} (N = 64). It falls from N = 32 to N = 64" in text
    assert "materialised's attention costs 0.688 ms a layer at N = 32" in text and "4.4× its 0.156 ms" in text
    assert "copy_v's forward grows 1.48× for 2× the tokens" in text
    # the speedups: attention alone from the stand-in's times, and the floor said again under them
    s = [standin.ATTENTION_MS[n]["materialised"] / standin.ATTENTION_MS[n]["fused"] for n in (32, 64)]
    assert _trace(figures, "The attention's speedup", "attention alone (s), B = 1") == pytest.approx(s)
    # memory
    assert "234 KiB" in text and "526 KiB" in text and "413 KiB" in text
    # check yourself
    assert f"{s[1]:.2f}× at tiny at B = 1, N = 64" in text
    assert "At that shape fused's attention alone is at the launch floor" in text
    assert f"at most 1 / (1 − f) = {1 / (1 - f32):.2f}×" in text
    assert "The difference, 114 KiB, is 0.89× one layer's S and P" in text and "adds 500 B to the peak" in text
    assert f"At most {standin.LOGITS_MAXDIFF:.3g} (" in text


def test_both_parts_pages_keep_the_page_budget_and_no_bar_frozen_part_way(two_parts):
    _, first_nb, second = two_parts
    for nb in (first_nb, nbformat.read(str(second.notebook), as_version=4)):
        assert len(page_budget.expanded_tables(nb)) <= page_budget.BUDGET_TABLES, page_budget.expanded_tables(nb)
        assert page_budget.generated_words(nb) <= page_budget.BUDGET_WORDS, page_budget.words_by_cell(nb)
        assert page_budget.noise(nb) == []
