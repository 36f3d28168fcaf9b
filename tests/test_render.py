"""The walkthrough rendered as `make run` renders it (papermill, the CPU params, an offline HTML export), a failing
and a timed-out cell, the per-GPU runner, and the committed notebooks themselves."""
import base64
import json
import os
import re
from pathlib import Path

import nbformat
import numpy as np
import papermill
import pytest
import yaml

from attnlab import lab, render, sweep
from tests import gpu_run, page_budget

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TINY = dict(device="cpu", dtype="float32", seq_lens=[16], head_dims=[16], causal=[False], batch_policy="fixed",
            batch=1, heads=2, builds=["fused", "torch_eager"], warmup_ms=0, reps_ms=1, min_reps=1)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_notebooks_carry_no_outputs(path):
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


def test_the_walkthroughs_parameters_are_the_params_keys():
    names = set(papermill.inspect_notebook(str(render.WALKTHROUGH)))
    assert names == set(lab.KEYS) | {"out_dir"}
    nb = nbformat.read(str(render.WALKTHROUGH), as_version=4)
    assert sum("parameters" in c.metadata.get("tags", []) for c in nb.cells) == 1
    cpu = yaml.safe_load((ROOT / "params" / "cpu.yaml").read_text())
    assert set(cpu) <= names  # every key of a params file lands in the cell


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The walkthrough rendered with params/cpu.yaml, its speed lessons read from a made-up GPU run."""
    base = tmp_path_factory.mktemp("render")
    gpu_run.write_gpu_run(base / "outputs" / "test-gpu" / "run")
    old = os.environ.get("ATTNLAB_OUTPUTS")
    os.environ["ATTNLAB_OUTPUTS"] = str(base / "outputs")  # the kernel inherits it
    try:
        result = render.render(ROOT / "params" / "cpu.yaml", base / "out")
    finally:
        if old is None:
            del os.environ["ATTNLAB_OUTPUTS"]
        else:
            os.environ["ATTNLAB_OUTPUTS"] = old
    return result


def _values(v):
    """A plotly array as stored in a notebook: a list, or base64 bytes of one dtype (plotly >= 6)."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"])
    return v


def _outputs(nb, kind):
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if kind in o.get("data", {}):
                yield o["data"][kind]


def test_the_cpu_render_runs_every_section_from_data(rendered):
    assert rendered.code == 0, rendered.message
    nb = nbformat.read(str(rendered.notebook), as_version=4)
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code")
    plain = "\n".join(_outputs(nb, "text/plain"))
    markdown = "\n".join(_outputs(nb, "text/markdown"))
    # where the speed lessons come from, said above them
    assert markdown.count("From a committed GPU run, not from this machine") == 3 and gpu_run.DEVICE_NAME in markdown
    # the speedup figure, drawn from the made-up run's rows
    figures = [json.loads(f) if isinstance(f, str) else f for f in _outputs(nb, "application/vnd.plotly.v1+json")]
    speed = [f for f in figures if f["layout"]["title"]["text"].startswith("Speedup over materialised")]
    assert len(speed) == 1
    fused = [t for t in speed[0]["data"] if t["name"] == "fused, D=64"][0]
    assert list(_values(fused["y"])) == pytest.approx([2.5, 3.2, 3.3])
    assert {t["name"].split(",")[0] for t in speed[0]["data"]} == {"materialised", "qk_softmax", "fused"}
    libraries = [f for f in figures if f["layout"]["title"]["text"].startswith("The library builds beside fused")]
    assert len(libraries) == 1 and {t["name"] for t in libraries[0]["data"]} >= {"fused", "sdpa_flash"}
    assert any(f["layout"]["title"]["text"].startswith("Roofline") for f in figures)
    # the memory table, the attribution table, the gate and the sweep of this run
    assert "S or P (predicted)" in plain and "512 MiB" in plain
    assert "S round trip" in plain and "P round trip" in plain and "measured_over_predicted" in plain
    assert "fused-no_pv" in plain and "worst_err_over_limit" in plain
    out = rendered.out
    results = sweep.read_results(out)
    cpu = yaml.safe_load((ROOT / "params" / "cpu.yaml").read_text())
    assert len(results) == len(sweep.grid(sweep.load_params(ROOT / "params" / "cpu.yaml"), "cpu"))
    assert (results["status"] == "ok").all() and set(results["N"]) == set(cpu["seq_lens"])
    assert {"gate.csv", "provenance.json", "params.yaml", "attention_lab.html", "tables.txt"} <= {
        p.name for p in out.iterdir()}
    assert (out / "tables.txt").read_text().startswith("# These rows were measured on a CPU")
    # check yourself: every answer computed and folded away
    html = "\n".join(_outputs(nb, "text/html"))
    assert html.count("<details>") >= 9
    assert "Predicted speedup" in html and "measured 3.30×" in html and "(rises then flattens)" in html


def test_the_cpu_render_keeps_to_the_page_budget(rendered):
    """The page's budget (tests/page_budget.py defines each count) holds on a CPU render too, whose speed lessons come
    from a committed GPU run: at most 8 tables open, at most 2,500 words of generated text, each note once a table, no
    frozen progress bar and no warning."""
    nb = nbformat.read(str(rendered.notebook), as_version=4)
    budget = page_budget.report(nb)
    assert budget["expanded_tables"] <= page_budget.BUDGET_TABLES, page_budget.expanded_tables(nb)
    assert budget["generated_words"] <= page_budget.BUDGET_WORDS, page_budget.words_by_cell(nb)
    assert budget["repeated_notes"] == [] and budget["noise"] == []
    gate = [o for c in nb.cells if c.cell_type == "code" and c.source.startswith("lab.gate(run)") for o in c.outputs]
    shapes = len(lab.load(rendered.out).gate["shape"].unique())
    assert any(o.get("data", {}).get("text/plain", "").startswith(f"gate: {shapes} of {shapes} shapes in ")
               for o in gate)  # the bar's one summary line


def test_make_runs_page_keeps_to_the_budget_over_the_committed_gpu_runs(tmp_path):
    """`make run` without a GPU: params/cpu.yaml, its speed lessons read from the newest committed GPU run (the
    repository's outputs/, not a made-up one), whose real rows say more than the stand-in's do."""
    old = os.environ.pop("ATTNLAB_OUTPUTS", None)
    try:
        result = render.render(ROOT / "params" / "cpu.yaml", tmp_path / "out")
    finally:
        if old is not None:
            os.environ["ATTNLAB_OUTPUTS"] = old
    nb = nbformat.read(str(result.notebook), as_version=4)
    budget = page_budget.report(nb)
    assert budget["expanded_tables"] <= page_budget.BUDGET_TABLES, page_budget.expanded_tables(nb)
    assert budget["generated_words"] <= page_budget.BUDGET_WORDS, page_budget.words_by_cell(nb)
    assert budget["repeated_notes"] == [] and budget["noise"] == []
    from attnlab.runs import reference_run

    named = reference_run().relative_to(ROOT).as_posix()  # the committed run the lessons came from, named on the page
    assert any(named in str(o) for c in nb.cells if c.cell_type == "code" for o in c.outputs), named


def test_the_html_export_draws_with_no_network(rendered):
    page = rendered.html.read_text(encoding="utf-8")
    assert page.count("Plotly.newPlot") >= 4
    assert len(re.findall(r"plotly\.js v\d", page)) == 1  # plotly.js inline, once
    assert not re.search(r"<script[^>]*\bsrc=", page)  # nothing fetched: no CDN, require.js, MathJax or widgets
    assert not re.search(r"<link[^>]*href=[\"']https?:", page)
    assert not re.search(r"""import\s*\(?\s*["']https?:""", page)


def _notebook(path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    params = nbformat.v4.new_code_cell("\n".join(f"{k} = None" for k in (*lab.KEYS, "out_dir")))
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, *(nbformat.v4.new_code_cell(c) for c in cells)]
    nbformat.write(nb, str(path))
    return path


SWEEP = """
from attnlab import lab, sweep
p = lab.params(**{k: v for k, v in globals().items() if k in lab.KEYS or k == "out_dir"})
sweep.run(p, out_dir=out_dir, progress=False)
"""


def _params(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", **TINY}))
    return path


def test_a_failing_cell_exits_non_zero_names_the_cell_and_keeps_the_rows(tmp_path):
    # In [1] parameters, In [2] the injected parameters, In [3] the sweep, In [4] the failing cell
    nb = _notebook(tmp_path / "fails.ipynb", SWEEP, "raise RuntimeError('boom in cell two')", "print('never')")
    result = render.render(_params(tmp_path), tmp_path / "out", notebook=nb)
    assert result.code == render.FAILED
    assert "In [4]: \"raise RuntimeError('boom in cell two')\" failed: RuntimeError: boom in cell two" in result.message
    assert "2 finished row(s) in results.csv" in result.message
    partial = nbformat.read(str(result.notebook), as_version=4)
    assert partial.cells[-1].execution_count is None  # the cell after the failure never ran
    assert len(sweep.read_results(result.out)) == 2 and result.html.exists()


def test_a_timed_out_cell_exits_124_names_the_cell_and_keeps_the_rows(tmp_path):
    nb = _notebook(tmp_path / "slow.ipynb", SWEEP, "import time\ntime.sleep(120)", "print('never')")
    result = render.render(_params(tmp_path), tmp_path / "out", notebook=nb, timeout=20)
    assert result.code == render.TIMED_OUT
    assert "In [4]: 'import time' timed out after 20 s" in result.message
    partial = nbformat.read(str(result.notebook), as_version=4)
    assert "Execution stopped" in partial.cells[0].source  # the banner papermill gives errors, not timeouts
    assert len(sweep.read_results(result.out)) == 2 and result.html.exists()


def test_a_failing_comparison_exits_non_zero_and_names_the_cell(tmp_path):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    params = nbformat.v4.new_code_cell("runs = []")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("assert runs == [], f'{len(runs)} runs'")]
    nbformat.write(nb, str(tmp_path / "compare.ipynb"))
    result = render.render_compare([tmp_path / "a", tmp_path / "b"], tmp_path / "compare.ipynb", tmp_path / "out")
    assert result.code == render.FAILED and result.html is None
    assert "compare.ipynb stopped: In [3]: \"assert runs == []" in result.message
    assert "failed: AssertionError: 2 runs" in result.message


def test_bad_params_stop_before_anything_is_written(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**TINY, "seq_lens": [-1]}))
    with pytest.raises(sweep.ParamsError, match="seq_lens"):
        render.render(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


class FakeChild:
    def __init__(self, code):
        self.code = code

    def wait(self):
        return self.code


def test_one_render_per_gpu_each_pinned_and_in_its_own_folder_then_the_comparison(tmp_path):
    started = []

    def runner(cmd, env):
        out = Path(cmd[cmd.index("--out") + 1])
        gpu_run.write_gpu_run(out, builds=["fused"])  # what a child's render leaves
        started.append((env["CUDA_VISIBLE_DEVICES"], cmd))
        return FakeChild(0 if env["CUDA_VISIBLE_DEVICES"] != "2" else 1)

    compare = _notebook(tmp_path / "compare_gpus.ipynb", "print(len(runs))")
    nb = nbformat.read(str(compare), as_version=4)
    nb.cells[0].source = "runs = []"
    nbformat.write(nb, str(compare))
    params = _params(tmp_path)
    code, folders, lines = render.render_gpus(params, [0, 1, 2], runner=runner, compare=compare, root=tmp_path / "o")
    assert [g for g, _ in started] == ["0", "1", "2"]
    assert all(cmd[1:4] == ["-m", "attnlab.render", "--params"] and str(params) in cmd for _, cmd in started)
    assert len(set(folders)) == 3 and [f.name[-5:] for f in folders] == ["-gpu0", "-gpu1", "-gpu2"]
    assert code == 1 and lines[2].startswith("GPU 2: exit 1")
    compared = list((tmp_path / "o" / "compare").glob("*/compare_gpus.ipynb"))
    assert len(compared) == 1 and "rendered over 2 run(s)" in lines[-1]  # the two that finished
    executed = nbformat.read(str(compared[0]), as_version=4)
    injected = [c.source for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])][0]
    assert str(folders[0]) in injected and str(folders[1]) in injected and str(folders[2]) not in injected


def test_the_gpu_runner_refuses_bad_indices(tmp_path):
    with pytest.raises(sweep.ParamsError, match="distinct GPU indices"):
        render.render_gpus(_params(tmp_path), [0, 0], runner=lambda *a: pytest.fail("started"))


@pytest.mark.parametrize("module", ["attnlab.render", "attnlab.model_lab"])
@pytest.mark.parametrize("argv, says", [
    (["--params", "{tmp}/nope.yaml"], "argument --params: no such file"),
    (["--params", "{params}", "--out", "{file}"], "argument --out: '{file}' is a file, not a directory"),
    (["--params", "{params}", "--timeout", "-5"], "argument --timeout: expected a number > 0, got '-5'"),
])
def test_the_render_commands_refuse_a_bad_argument_in_one_line(tmp_path, capsys, module, argv, says):
    import importlib

    afile = tmp_path / "a-file"
    afile.write_text("")
    params = tmp_path / "p.yaml"
    params.write_text("seq_lens: [64]\n")
    fill = dict(file=str(afile), tmp=str(tmp_path), params=str(params))
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(module).main([a.format(**fill) for a in argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"python -m {module}: error: {says.format(**fill)}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "p.yaml"]


def test_a_render_command_with_bad_params_is_one_line_and_exit_2(tmp_path, capsys):
    params = tmp_path / "p.yaml"
    params.write_text(yaml.safe_dump({**TINY, "seq_lens": [0]}))
    assert render.main(["--params", str(params), "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: params key 'seq_lens': value 0 must be > 0") and err.count("\n") == 1
    assert not (tmp_path / "never").exists()


def test_a_render_kernel_prints_no_warning_about_its_local_sockets(tmp_path, capfd):
    """ipykernel warns on stderr that its 127.0.0.1 sockets are unencrypted; a render's kernel logs errors only, so a
    user's terminal shows the render's own lines, while an error in a cell still fails the render."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import sys; print('ran', file=sys.stderr)")])
    nb.metadata["kernelspec"] = {"name": render.KERNEL, "display_name": "Python 3", "language": "python"}
    path = tmp_path / "one.ipynb"
    nbformat.write(nb, str(path))
    done = papermill.execute_notebook(str(path), str(tmp_path / "out.ipynb"), **render.PAPERMILL)
    assert done.cells[0].outputs[0]["text"] == "ran\n"
    err = capfd.readouterr().err
    assert "WARNING" not in err and "encryption" not in err, err
    nb.cells[0].source = "raise ValueError('a cell fails')"
    nbformat.write(nb, str(path))
    with pytest.raises(papermill.PapermillExecutionError, match="a cell fails"):
        papermill.execute_notebook(str(path), str(tmp_path / "out2.ipynb"), **render.PAPERMILL)


def test_the_page_title_is_the_first_heading_outside_code():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("# a comment, not a heading"),
        nbformat.v4.new_markdown_cell("Some prose.\n```bash\n# a shell comment\n```\n#no space, not a heading"),
        nbformat.v4.new_markdown_cell("~~~\n# fenced\n~~~\n## What fusion buys ##\n# later heading"),
    ])
    assert render.page_title(nb, "fallback") == "What fusion buys"
    nb.metadata["title"] = "Given"
    assert render.page_title(nb, "fallback") == "Given"
    assert render.page_title(nbformat.v4.new_notebook(cells=[nb.cells[0]]), "fallback") == "fallback"
