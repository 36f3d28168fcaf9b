"""The walkthrough's GPU path rendered on a CPU: papermill executes the real notebook while the sweep's rows come from
a stand-in GPU (tests/standin/walkthrough.py: measure and the ceilings replaced in the kernel, nothing else), in two
parts, the first interrupted mid-sweep and the second resuming it. A committed GPU run sits in ATTNLAB_OUTPUTS
meanwhile: every section must show the stand-in's numbers, of both parts, and never the committed run's."""
import base64
import json
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
import yaml

from attnlab import lab, render, sweep
from tests import gpu_run, page_budget
from tests.standin import installed
from tests.standin import walkthrough as standin

ROOT = Path(__file__).resolve().parent.parent
PARAMS = dict(name="standin", device="cpu", dtype="float32", seq_lens=[64, 128, 256], head_dims=[16],
              causal=[False, True], batch_policy="fixed", batch=1, heads=2,
              builds=["ours", "ablation", "torch_eager", "sdpa_default"], warmup_ms=0, reps_ms=1, min_reps=1,
              ref_budget_gib=1, seed=0)


def _render(params: Path, out: Path, outputs: Path, **env) -> render.Rendered:
    """render.render with the stand-in installed in the kernel it starts."""
    with installed("tests.standin.walkthrough", ATTNLAB_OUTPUTS=str(outputs), **env):
        return render.render(params, out)


@pytest.fixture(scope="module")
def two_parts(tmp_path_factory):
    base = tmp_path_factory.mktemp("gpu-path")
    outputs = base / "outputs"
    gpu_run.write_gpu_run(outputs / "test-gpu" / "committed")  # what the page must not show
    params = base / "standin.yaml"
    params.write_text(yaml.safe_dump(PARAMS))
    cases = sweep.grid(sweep.load_params(params), "cpu")
    first = sum(not c.causal for c in cases)  # part 1 measures the non-causal cases, part 2 the causal ones
    assert 0 < first < len(cases) and all(not c.causal for c in cases[:first])
    part1 = _render(params, base / "run", outputs, ATTNLAB_STANDIN_STOP_AFTER=str(first))
    part2 = _render(params, base / "run", outputs)
    return part1, part2, first, len(cases)


def _cells(rendered) -> dict:
    """Each code cell's source → its outputs' text (plain, markdown and html, joined)."""
    nb = nbformat.read(str(rendered.notebook), as_version=4)
    out = {}
    for c in nb.cells:
        if c.cell_type == "code":
            texts = [o.get("text", "") for o in c.outputs] + [
                str(o.get("data", {}).get(kind, "")) for o in c.outputs
                for kind in ("text/plain", "text/markdown", "text/html")]
            out[c.source] = "\n".join(texts)
    return out


def _cell(cells: dict, call: str) -> str:
    """The outputs' text of the one code cell whose source makes `call` (a cell may fold what the call returns)."""
    [text] = [t for src, t in cells.items() if call in src]
    return text


def _figures(rendered, call: str) -> list[dict]:
    nb = nbformat.read(str(rendered.notebook), as_version=4)
    [cell] = [c for c in nb.cells if c.cell_type == "code" and call in c.source]
    return [o["data"]["application/vnd.plotly.v1+json"] for o in cell.outputs
            if "application/vnd.plotly.v1+json" in o.get("data", {})]


def _values(v):
    if isinstance(v, dict) and "bdata" in v:
        return list(np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]))
    return list(v)


def _shown(df) -> str:
    """A table as the page prints it (lab.setup's display options)."""
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.max_colwidth", 250):
        return repr(df)


def test_an_interrupted_render_keeps_its_rows_and_the_resumed_one_finishes_them(two_parts):
    part1, part2, first, total = two_parts
    assert part1.code == render.FAILED and "stand-in: stopped after" in part1.message
    assert f"{first} finished row(s)" in part1.message
    assert part2.code == 0, part2.message
    rows = sweep.read_results(part2.out)
    assert len(rows) == total and (rows["status"] == "ok").all()
    assert set(rows["device_name"]) == {standin.DEVICE_NAME} and set(rows["causal"]) == {False, True}
    sessions = json.loads((part2.out / sweep.PROVENANCE).read_text())["sessions"]
    assert [s["interrupted"] for s in sessions] == [True, False]


def test_every_section_of_the_resumed_render_shows_this_runs_rows_of_both_parts(two_parts):
    _, part2, _, _ = two_parts
    cells = _cells(part2)
    page = "\n".join(cells[s] for s in cells if "lab.sweep_run" not in s)
    assert gpu_run.DEVICE_NAME not in page  # the committed run never stands in for this one
    les = lab.lessons(lab.load(part2.out))
    assert les.own and les.device_name == standin.DEVICE_NAME
    assert f"**Measured here:** this run, measured on {standin.DEVICE_NAME}" in _cell(cells, "lab.source_note(run)")
    # the speedup curve and its table: the stand-in's ratios, both causal values (part 1 measured only non-causal)
    speed = _figures(part2, "display(*lab.speedup_figures(run))")[0]
    fused = [_values(t["y"]) for t in speed["data"] if t["name"] == "fused, D=16" and t["xaxis"] in ("x", "x2")]
    assert sorted(map(tuple, np.round(fused, 2).tolist())) == sorted(
        tuple(standin.SPEEDUP[c][n] for n in PARAMS["seq_lens"]) for c in (False, True))
    table = _cell(cells, "lab.speedup_table(run)")
    assert _shown(lab.speedup_table(les)) in table
    assert "2.17  3.41  3.46" in table and "3.08  4.19  5.37" in table
    trend = _cell(cells, "lab.trend(run)")
    assert _shown(lab.trend(les)) in trend and "rises then flattens" in trend and "still rising" in trend
    # memory: every build's measured peak (the stand-in's hold × PEAK_OVER_HOLD), the attribution and the ablations
    memory = _cell(cells, "lab.memory_details(run)")
    assert all(_shown(t.table) in memory for t in lab.memory_details(les))
    assert "1.17 MiB" in memory  # materialised's peak at N = 256: 1 MiB held, × 1.17
    peaks = _figures(part2, "lab.memory_figure(run)")[0]["data"]
    held = [t for t in peaks if t["name"] == "materialised must hold" and t["xaxis"] == "x"][0]
    peak = [t for t in peaks if t["name"] == "materialised" and t["xaxis"] == "x"][0]
    assert np.allclose(_values(peak["y"]), np.array(_values(held["y"])) * standin.PEAK_OVER_HOLD)
    attribution = _cell(cells, "lab.attribution(run)")
    assert _shown(lab.noted(lab.attribution(les)).table) in attribution
    ms = standin.times(256, False)
    assert f"{ms['materialised'] - ms['qk_softmax']:.6f}" in attribution  # the S round trip's Δ at N = 256
    ablations = _cell(cells, 'lab.ablations(run, "fused")')
    assert _shown(lab.noted(lab.ablations(les, "fused")).table) in ablations
    assert f"{ms['fused'] - ms['fused-no_softmax']:.6f}" in ablations
    roof = _figures(part2, "display(*lab.roofline_figures(run))")[0]["layout"]["title"]["text"]
    assert f"{standin.CEILINGS['tbps']:.3g} TB/s" in roof and f"{standin.CEILINGS['tflops']:.3g} TFLOP/s" in roof
    for name in ("mixed_ratio", "launch_overhead"):
        assert standin.DEVICE_NAME in _cell(cells, f'display(*lab.lie("{name}", run))')
    # check yourself and the experiment record, answered from the same rows
    answers = _cell(cells, "lab.check_yourself(run)")
    big = standin.times(256, False)  # the questions read the largest N, non-causal, of part 1
    assert "at N = 256, D = 16 (B = 1, H = 2, float32, non-causal)" in answers
    assert (f"measured {big['materialised']:.3g} ms" in answers and f"measured {big['fused']:.3g} ms" in answers
            and "measured 3.46×" in answers)
    assert f"{standin.CEILINGS['tbps']:.3g} TB/s copy bandwidth and {standin.CEILINGS['tflops']:.3g} TFLOP/s" in answers
    assert "(rises then flattens)" in answers and "(still rising)" in answers
    assert "At N = 256, predict what removing S" in answers  # the largest N, not the first
    record = _cell(cells, "lab.record(run)")
    assert "non-causal D = 16: 2.17× → 3.46×" in record and "causal D = 16: 3.08× → 5.37×" in record
    assert "supported in 1 of 2" in record


def test_the_resumed_page_keeps_to_its_budget_and_folds_its_detail(two_parts):
    """A GPU render's page (tests/page_budget.py defines each count): at most 8 tables open, at most 2,500 words of
    generated text, no note said on two rows of one table, no frozen bar or warning; the detail is folded, not gone:
    the correctness grid's every cell is inside a <details> of the exported page."""
    _, part2, _, _ = two_parts
    nb = nbformat.read(str(part2.notebook), as_version=4)
    budget = page_budget.report(nb)
    assert budget["expanded_tables"] <= page_budget.BUDGET_TABLES, page_budget.expanded_tables(nb)
    assert budget["generated_words"] <= page_budget.BUDGET_WORDS, page_budget.words_by_cell(nb)
    assert budget["repeated_notes"] == [] and budget["noise"] == []
    grid = _cell(_cells(part2), "lab.fold(grid")
    assert "<details><summary>The full grid" in grid and grid.count("✓") >= 2 * len(PARAMS["seq_lens"])
    page = part2.html.read_text(encoding="utf-8")
    assert page.count("<details>") >= 10 and "<summary>The full grid" in page
    sweep_line = _cell(_cells(part2), "lab.sweep_run(run)")
    assert "sweep: " in sweep_line and " cases in " in sweep_line  # the bar's one summary line, nothing frozen


def test_the_stand_in_replaces_only_what_a_gpu_measures(tmp_path, monkeypatch):
    """The stand-in patches attnlab.measure.measure and the ceilings, by attribute; the gate and the rest stay
    real: a real measure of the same case on this CPU is not the stand-in's row."""
    from attnlab import ceilings, measure

    real_measure, real_ceilings = measure.measure, ceilings.measure_ceilings
    monkeypatch.setattr(measure, "measure", real_measure)
    monkeypatch.setattr(ceilings, "measure_ceilings", real_ceilings)
    monkeypatch.setattr(sweep, "measure_ceilings", sweep.measure_ceilings)
    standin.install()
    case = measure.Case("fused", 1, 2, 2, 64, 16, "float32", False, "cpu")
    row = measure.measure(case, ceilings=ceilings.measure_ceilings("cpu", "float32"))
    assert row["device"] == "cuda:0" and row["device_name"] == standin.DEVICE_NAME
    assert row["ms"] == standin.times(64, False)["fused"] and row["ceiling_tbps"] == standin.CEILINGS["tbps"]
    assert measure.measure is not real_measure


def test_the_page_check_passes_the_stand_in_page_and_fails_it_under_other_rows(two_parts, tmp_path):
    from attnlab import page_check

    _, part2, _, _ = two_parts
    assert page_check.check(part2.out) == []
    other = gpu_run.write_gpu_run(tmp_path / "other")  # another run's rows under this page
    (other / page_check.NOTEBOOK).write_bytes((part2.out / page_check.NOTEBOOK).read_bytes())
    problems = page_check.check(other)
    assert any("source note" in p and gpu_run.DEVICE_NAME in p for p in problems)
    assert any(p.startswith("the speedup table shows") for p in problems)
    assert any("the experiment record lacks the rows' non-causal D = 64 curve, 2.50× → 3.30×" in p for p in problems)
    assert any(f"{gpu_run.TBPS:.3g} TB/s" in p for p in problems) and any("rows of results.csv" in p for p in problems)
    assert page_check.main([str(other)]) == 1 and page_check.main([str(part2.out)]) == 0
    with pytest.raises(ValueError, match="holds no attention_lab.ipynb"):
        page_check.check(tmp_path)


def test_the_explanations_and_the_seeds_sections_show_the_stand_ins_rows(two_parts):
    """Issue 60's items 3 and 4 on the resumed page: each section's numbers are the stand-in's, at the largest N of
    part 1 (non-causal) or the first shape the sweep measured."""
    _, part2, _, _ = two_parts
    cells = _cells(part2)
    big = standin.times(256, False)
    assert "The gate checked N = 64, 128, 256. Ragged here: N = 64 (tiles 128 × 128)" in _cell(cells, "lab.ragged(run)")
    replay = _cell(cells, "lab.graph_replay(run)")
    small = standin.times(64, True)["fused"]
    assert f"fused at N = 64 (D = 16, causal, where eager and replay part most): {small:.3g} ms replayed" in replay
    assert f"{small + standin.HOST_MS:.3g} ms eager" in replay
    assert f"median {big['fused']:.4g} ms" in _cell(cells, "lab.timing_spread(run)")
    cold = _cell(cells, "display(*lab.warm_cold(run))")
    assert f"(materialised: {standin.COLD_FIRST_S['materialised'] * 1e3:.4g} ms against" in cold
    assert f"our builds' first calls took a median {standin.COLD_LATER_S * 1e3:.3g} ms" in cold
    memory = _cell(cells, "lab.memory_hierarchy(run)")
    assert "<svg" in memory and f"{standin.CEILINGS['tbps']:.3g} TB/s copy bandwidth, measured" in memory
    assert "S alone is 512 KiB" in memory and f"of its measured {big['materialised']:.3g} ms" in memory
    loop = _cell(cells, "lab.tile_loop(run)")
    assert "<svg" in loop and "Each of the B·H·⌈N / 128⌉ = 4 work items streams 2 K/V tile pairs" in loop
    assert "the same, to" in _cell(cells, "lab.online_softmax()")
    gqa = _cell(cells, "lab.gqa(run)")
    assert "G = 2 (Hkv = 1) shrinks K and V from 64 KiB to 32 KiB" in gqa and "every row has Hkv = H" in gqa
