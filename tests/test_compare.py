"""Runs side by side (attnlab.compare) and notebooks/compare_gpus.ipynb, over run folders the tests write."""
import json
import os
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from attnlab import compare, runs
from attnlab.sweep import append_row
from tests.test_report_groups import frame, row

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "compare_gpus.ipynb"
# ms at N = 512 for each build; every build's time grows as N² here, so ratios are the same at every N
MS = {"materialised": 8.0, "qk_softmax": 4.0, "fused": 1.0, "sdpa_flash": 0.8, "torch_eager": 10.0}


def write_run(folder: Path, *, card="NVIDIA H200", device="cuda:0", commit="b" * 40, code="c0de00000001",
              started="2026-12-05T10:00:00+00:00", builds=tuple(MS), causal=(False, True), dims=(64,),
              ns=(512, 1024), scale=1.0, dtype="bfloat16", total_memory=150_000_000_000, **extra):
    """A run folder as attnlab.sweep writes one: results.csv (every schema column) and provenance.json. Causal rows
    take half the non-causal time; `scale` multiplies every time (another card)."""
    folder.mkdir(parents=True)
    for c in causal:
        for D in dims:
            for N in ns:
                for b in builds:
                    ms = MS[b] * scale * (N / 512) ** 2 * (0.5 if c else 1.0)
                    append_row(folder / "results.csv", row(
                        b, ms=ms, N=N, D=D, B=16384 // N, H=2048 // D, Hkv=2048 // D, causal=c, dtype=dtype,
                        device=device, device_name=card, peak_bytes=float(N * N * (4 if b == "materialised" else 1)),
                        hold_bytes=N * N, consume_ms=float("nan"), code=code, run_id=folder.name, reps=10,
                        flops=4 * 16384 * 2048 * N, bytes_moved=N * N, **extra))
    prov = dict(device=dict(device=device, name=card, total_memory=total_memory), git=dict(commit=commit, dirty=False),
                code=code, run_id=folder.name, results="results.csv", started=started, ended=started)
    (folder / "provenance.json").write_text(json.dumps(prov))
    return folder


@pytest.fixture
def two_runs(tmp_path):
    """A newer H200 run and an older A100 run (older commit and code, twice as slow)."""
    new = write_run(tmp_path / "outputs" / "h200" / "2026-12-05-grid")
    old = write_run(tmp_path / "outputs" / "a100" / "2026-11-01-grid", card="NVIDIA A100", commit="a" * 40,
                    code="01d000000000", started="2026-11-01T09:00:00+00:00", scale=2.0)
    return tmp_path / "outputs", new, old


def test_an_older_commit_run_is_labelled_and_the_newest_is_not(two_runs):
    root, new, old = two_runs
    runs = compare.load([new, old], root=root)
    assert [r.label for r in runs] == ["a100/2026-11-01-grid", "h200/2026-12-05-grid"]  # oldest first
    older, newest = runs
    assert older.older.startswith("older code: measured at commit aaaaaaaa, code 01d000000000")
    assert "h200/2026-12-05-grid" in older.older and newest.older == ""
    assert older.title == "NVIDIA A100 · a100/2026-11-01-grid · OLDER CODE"
    view = compare.overview(runs)
    assert list(view["older"] != "") == [True, False]
    assert set(compare.speedups(runs).query("card == 'NVIDIA A100'")["older"]) == {older.older}


def test_the_same_code_under_another_commit_is_not_older(tmp_path):
    a = write_run(tmp_path / "h200" / "a", commit="a" * 40, started="2026-11-01T09:00:00+00:00")
    b = write_run(tmp_path / "h200" / "b", commit="b" * 40)  # a documentation commit: same code fingerprint
    assert [r.older for r in compare.load([a, b], root=tmp_path)] == ["", ""]


def test_a_run_without_code_or_commit_says_its_code_is_unknown(tmp_path):
    a = write_run(tmp_path / "h200" / "a", commit="", code="", started="2026-11-01T09:00:00+00:00")
    b = write_run(tmp_path / "h200" / "b")
    assert compare.load([a, b], root=tmp_path)[0].older.startswith("code unknown")


def test_runs_are_found_at_any_depth_and_the_reference_is_the_newest_full_cuda_run(tmp_path):
    root = tmp_path / "outputs"
    full = write_run(root / "h200" / "2026-12-01-call1" / "run", started="2026-12-01T00:00:00+00:00")
    write_run(root / "h200" / "2026-12-02-partial", started="2026-12-02T00:00:00+00:00", builds=("fused",))
    write_run(root / "cpu" / "2026-12-03-render", device="cpu", card="Some CPU", started="2026-12-03T00:00:00+00:00")
    (root / "h200" / "2026-12-04-bench").mkdir(parents=True)  # no provenance: not a run
    assert [p.relative_to(root).as_posix() for p in compare.find_runs(root)] == [
        "h200/2026-12-01-call1/run", "h200/2026-12-02-partial", "cpu/2026-12-03-render"]
    assert runs.reference_run(root) == full
    assert runs.reference_run(tmp_path / "nothing") is None


def test_a_folder_that_is_not_a_run_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="has no provenance.json"):
        compare.load([tmp_path])


def test_the_library_ratio_refuses_to_mix_causal_settings():
    mixed = frame(row("fused", ms=1.0), row("sdpa_flash", ms=0.8),
                  row("fused", ms=0.5, causal=True), row("sdpa_flash", ms=0.4, causal=True))
    with pytest.raises(ValueError, match=r"one dtype and one causal value"):
        compare.library_ratio(mixed, "fused", "sdpa_flash")


def test_library_ratios_are_taken_within_each_causal_setting(two_runs):
    root, new, old = two_runs
    t = compare.library_ratios(compare.load([new], root=root))
    assert set(t["library"]) == {"sdpa_flash", "torch_eager"}
    for causal in (False, True):
        part = t[(t["causal"] == causal) & (t["library"] == "torch_eager")]
        assert list(part["library_over_ours"]) == pytest.approx([10.0, 10.0])  # 10 ms over 1 ms, both halved
        assert list(part["ours_ms"]) == pytest.approx([0.5, 2.0] if causal else [1.0, 4.0])


def test_every_comparison_figure_has_a_title_axis_units_and_one_panel_per_run(two_runs):
    root, new, old = two_runs
    runs = compare.load([new, old], root=root)
    figs = compare.figures(runs)
    assert len(figs) == 6  # speedup, memory and libraries, for each causal setting
    for fig in figs:
        assert fig.layout.title.text
        panels = [a.text for a in fig.layout.annotations]
        assert panels == [r.title for r in runs]
        assert {ax.title.text for ax in (fig.layout.xaxis, fig.layout.xaxis2)} == {"sequence length N (tokens)"}
        assert "(" in fig.layout.yaxis.title.text  # a unit: (ratio of times), (bytes), (ratio)
    speedup = figs[0]
    assert "non-causal" in speedup.layout.title.text
    fused = [t for t in speedup.data if t.name == "fused, D=64" and t.xaxis == "x"]
    assert list(fused[0].y) == pytest.approx([8.0, 8.0])  # materialised 8 ms over fused 1 ms, in each panel
    with pytest.raises(ValueError, match="kinds must be among"):
        compare.figures(runs, kinds="roofline")


def execute(notebook: Path, out: Path, parameters: dict, monkeypatch):
    """The notebook run through papermill with `parameters`, as a user's render runs it, with this checkout's attnlab
    first on the kernel's path; the executed notebook."""
    import papermill as pm

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    pm.execute_notebook(str(notebook), str(out), parameters=parameters, kernel_name="python3", cwd=str(out.parent),
                        progress_bar=False, execution_timeout=300)
    return nbformat.read(out, as_version=4)


def outputs(nb, kind=None) -> list:
    """Every output of the notebook's code cells (of one output_type when `kind` is given)."""
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if kind is None or o.output_type == kind]


def test_compare_gpus_renders_over_two_runs_passed_as_parameters(two_runs, tmp_path, monkeypatch):
    root, new, old = two_runs
    nb = execute(NOTEBOOK, tmp_path / "out.ipynb", {"runs": [str(new), str(old)]}, monkeypatch)
    assert not outputs(nb, "error")
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and str(new) in injected[0].source
    figures = [o["data"]["application/vnd.plotly.v1+json"] for o in outputs(nb)
               if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) == 6
    for fig in figures:
        layout = fig["layout"]
        assert layout["title"]["text"]
        assert layout["xaxis"]["title"]["text"] == "sequence length N (tokens)"
        assert "(" in layout["yaxis"]["title"]["text"]
        assert [a["text"] for a in layout["annotations"]] == [
            "NVIDIA A100 · a100/2026-11-01-grid · OLDER CODE", "NVIDIA H200 · h200/2026-12-05-grid"]
    tables = " ".join(o["data"].get("text/html", "") for o in outputs(nb, "execute_result"))
    assert "older code: measured at commit aaaaaaaa" in tables and "library_over_ours" in tables


def test_the_committed_notebooks_carry_no_outputs_and_name_the_python3_kernel():
    for path in (NOTEBOOK, REPO / "notebooks" / "explore_shapes.ipynb"):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert nb.metadata.kernelspec.name == "python3"
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), path
    tagged = [c for c in nbformat.read(NOTEBOOK, as_version=4).cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "runs = None" in tagged[0].source


def test_results_of_every_run_stay_apart(two_runs):
    root, new, old = two_runs
    runs = compare.load([new, old], root=root)
    t = compare.speedups(runs)
    assert set(t["run"]) == {"h200/2026-12-05-grid", "a100/2026-11-01-grid"}
    both = pd.concat([r.results for r in runs])
    assert len(t) == len(both[both["family"] != "ablation"])  # one row per build, shape, run: none merged


def marked_gpu_run(folder: Path, card: str, factor: float, peak: float, started: str) -> Path:
    """tests/gpu_run's made-up GPU run, marked: materialised `factor` times slower (so every speedup over it is
    `factor` times gpu_run.SPEEDUP's), every peak `peak` times its hold, the card named `card`."""
    from attnlab import sweep
    from tests import gpu_run

    gpu_run.write_gpu_run(folder, started=started)
    rows = sweep.read_results(folder)
    mat = rows["build"] == "materialised"
    rows.loc[mat, "ms"] *= factor
    rows["peak_bytes"] = rows["hold_bytes"] * peak
    rows["device_name"] = card
    (folder / sweep.RESULTS).unlink()
    for r in rows.to_dict("records"):
        sweep.append_row(folder / sweep.RESULTS, r)
    prov = json.loads((folder / sweep.PROVENANCE).read_text())
    prov["device"]["name"] = card
    (folder / sweep.PROVENANCE).write_text(json.dumps(prov))
    return folder


MARKS = {"MARKER GPU A": (1.36, 1.0, "2026-01-01T00:00:00+00:00"), "MARKER GPU B": (1.12, 1.5,
                                                                                  "2026-01-02T00:00:00+00:00")}


@pytest.fixture
def marked(tmp_path):
    return [marked_gpu_run(tmp_path / "outputs" / card.split()[-1].lower() / "run", card, f, p, s)
            for card, (f, p, s) in MARKS.items()]


def test_the_curves_shape_and_the_peaks_growth_are_read_off_the_rows(marked, tmp_path):
    from tests import gpu_run

    runs = compare.load(marked, root=tmp_path / "outputs")
    t = compare.curve_shapes(runs).set_index(["card", "causal", "D"])
    a = t.loc[("MARKER GPU A", False, 64)]
    assert (a["first"], a["last"]) == pytest.approx((2.5 * 1.36, 3.3 * 1.36)) and a["shape"] == "rises then flattens"
    assert t.loc[("MARKER GPU B", True, 128), "shape"] == "still rising"
    assert a["shapes"] == "B·N = 16384 at every N" and a["bytes_ratio_last"] > a["bytes_ratio_first"]
    g = compare.peak_growth(runs).set_index(["card", "causal", "D", "build"])
    mat, fused = g.loc[("MARKER GPU B", False, 64, "materialised")], g.loc[("MARKER GPU B", False, 64, "fused")]
    assert mat["exponent"] == pytest.approx(1.0) and fused["exponent"] == pytest.approx(0.0, abs=1e-9)  # tokens fixed
    assert mat["growth"] == pytest.approx(gpu_run.NS[-1] / gpu_run.NS[0]) and mat["held_exponent"] == pytest.approx(1)
    fixed_b = compare.peak_growth(compare.load([write_run(tmp_path / "h200" / "fixed", ns=(512, 1024, 2048))],
                                               root=tmp_path))  # peaks of N² at every build
    assert fixed_b["exponent"].tolist() == pytest.approx([2.0] * len(fixed_b))


def test_compare_gpus_shows_two_marked_gpu_runs(marked, tmp_path, monkeypatch):
    import html

    from tests import gpu_run

    nb = execute(NOTEBOOK, tmp_path / "out.ipynb", {"runs": [str(f) for f in marked]}, monkeypatch)
    assert not outputs(nb, "error")
    text = html.unescape("\n".join(str(o.get("data", {}).get(k, "")) for o in outputs(nb)
                                   for k in ("text/plain", "text/markdown", "text/html")))
    # the curves' shapes: each run's own marked speedups
    for card, factor in (("MARKER GPU A", 1.36), ("MARKER GPU B", 1.12)):
        first, last = 2.5 * factor, 3.3 * factor
        assert f"**{card} · {card.split()[-1].lower()}/run**, bfloat16 non-causal, fused over materialised:" in text
        assert (f"D = 64 (B·N = 16384 at every N): {first:.2f}× at N = 512 → {last:.2f}× at N = 2048, "
                "*rises then flattens*") in text
        assert f"{2.8 * factor:.2f}× at N = 512 → {4.5 * factor:.2f}× at N = 2048, *still rising*" in text
    # the peaks' growth: materialised linear in N at fixed tokens, fused flat, B's peaks 1.5 times A's
    assert ("materialised 1 GiB → 4 GiB from N = 512 to 2048 (×4.00: as N^1.00; what it must hold grows as N^1.00)"
            in text)
    assert "materialised 1.5 GiB → 6 GiB from N = 512 to 2048" in text and "fused 96 MiB → 96 MiB" in text
    assert "fused 64 MiB → 64 MiB from N = 512 to 2048 (×1.00: as N^0.00" in text
    figures = [o["data"]["application/vnd.plotly.v1+json"] for o in outputs(nb)
               if "application/vnd.plotly.v1+json" in o.get("data", {})]
    speedup = next(f for f in figures if f["layout"]["title"]["text"].startswith("speedup over materialised per run "
                                                                                  "(bfloat16, non-causal"))
    ys = [_values(t["y"]) for t in speedup["data"] if t["name"] == "fused, D=64"]  # a panel per run, oldest first
    assert ys == [pytest.approx([s * f for s in gpu_run.SPEEDUP[False].values()]) for f in (1.36, 1.12)]


def _values(v) -> list:
    """A plotly array as a notebook stores it: a list, or base64 bytes of one dtype (plotly >= 6)."""
    import base64

    import numpy as np

    if isinstance(v, dict) and "bdata" in v:
        return list(np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]))
    return list(v)
