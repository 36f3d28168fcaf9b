"""attnlab.report.training on rows made here (no kernels run), and train_lab's hook for a real model's training step:
a gradient over its limit fails, a build with no ok row is 'not run', a speedup needs the baseline at the same shape,
the memory table reads one causal value, the recompute trade's ratio is 1.5·E·R/D at every N, and a run with no model step says why it shows
none."""
import math

import pandas as pd
import pytest

from attnlab import cost, train_lab, train_sweep
from attnlab.measure import Case, base_row
from attnlab.report import training as rt

CEILINGS = {"tbps": 2.0, "tflops": 500.0}


def rows_of(spec) -> pd.DataFrame:
    """Rows as the sweep writes them, for (build, N, causal, pass, status, ms, held, err) tuples, with the model's
    columns (train_sweep.with_model)."""
    out = []
    for build, N, causal, pass_, status, ms, held, err in spec:
        case = Case(build, 4, 8, 8, N, 64, "bfloat16", causal, "cpu", pass_)
        r = base_row(case, ceilings=CEILINGS)
        r.update(device="cuda:0", status=status, ms=ms, consume_ms=0.0, held_bytes=held, err=err, err_limit=1e-2)
        out.append(r)
    return train_sweep.with_model(pd.DataFrame(out))


def test_gradients_fail_a_row_over_its_limit_and_name_what_did_not_run():
    t = rt.gradients(rows_of([
        ("fused", 64, False, "backward", "ok", 1.0, 8.0, 5e-3),
        ("fused", 128, False, "backward", "ok", 1.0, 8.0, 2e-2),
        ("qk_softmax", 64, False, "backward", "ok", 1.0, 8.0, 1e-2),
        ("materialised", 64, False, "backward", "oom: 8 bytes wanted (the failed allocation)", math.nan, math.nan,
         math.nan)]))
    assert list(t["verdict"]) == ["FAIL", "pass", "not run"]  # at its limit is within it
    assert t["worst_err_over_limit"].iloc[0] == pytest.approx(2.0)
    assert t["why_not_run"].iloc[2].startswith("oom: 8 bytes wanted")


def test_a_speedup_needs_the_baseline_at_the_same_shape_and_mixed_dtypes_are_refused():
    r = rows_of([("materialised", 64, False, "forward+backward", "ok", 3.0, 1.0, 0.0),
                 ("fused", 64, False, "forward+backward", "ok", 1.0, 1.0, 0.0),
                 ("fused", 64, True, "forward+backward", "ok", 0.5, 1.0, 0.0),
                 ("fused", 64, False, "backward", "ok", 0.25, 1.0, 0.0)])
    t = rt.speedups(r).set_index(["build", "causal"])
    assert t.loc[("fused", False), "speedup"] == pytest.approx(3.0)
    assert math.isnan(t.loc[("fused", True), "speedup"])  # no causal materialised row: no ratio across masks
    r.loc[0, "dtype"] = "float16"
    with pytest.raises(ValueError, match="one dtype"):
        rt.speedups(r)


def test_held_reads_the_non_causal_rows_and_says_why_a_build_has_none():
    r = rows_of([("materialised", 64, False, "backward", "ok", 1.0, 70000.0, 0.0),
                 ("materialised", 64, False, "forward+backward", "ok", 1.0, 65536.0, 0.0),
                 ("materialised", 64, True, "backward", "ok", 1.0, 1.0, 0.0),
                 ("materialised", 128, False, "forward+backward", "oom: 9 bytes wanted", math.nan, math.nan, 0.0)])
    t = rt.held(r).set_index("N")
    assert t.attrs["causal"] is False and t.loc[64, "held_bytes"] == 70000.0  # the larger of the two passes
    assert t.loc[64, "saved_bytes"] == 4 * 8 * 64 * 64 * 2
    assert math.isnan(t.loc[128, "held_bytes"]) and t.loc[128, "status"] == "oom: 9 bytes wanted"


def test_the_recompute_trade_is_the_same_ratio_at_every_n_and_twice_it_causal():
    r = rows_of([("fused", n, c, "backward", "ok", 1.0, 1.0, 0.0) for n in (64, 256, 1024) for c in (False, True)])
    t = rt.recompute(r, CEILINGS)
    ridge = CEILINGS["tflops"] / CEILINGS["tbps"]
    assert t.loc[~t["causal"], "p_over_recompute"].tolist() == pytest.approx([1.5 * 2 * ridge / 64] * 3)
    assert t.loc[t["causal"], "p_over_recompute"].tolist() == pytest.approx([3 * 2 * ridge / 64] * 3)
    one = t.iloc[0]
    assert one["p_bytes"] == cost.kept_p_bytes(Case("qk_softmax", 4, 8, 8, 64, 64, "bfloat16"))
    assert one["fused_backward_ms"] == 1.0 and math.isnan(one["qk_softmax_backward_ms"])


def test_a_run_without_a_model_step_says_so_and_why(tmp_path, monkeypatch):
    from attnlab.lab import Run

    monkeypatch.setenv("ATTNLAB_OUTPUTS", str(tmp_path / "none"))  # no committed training run either
    [note] = train_lab.real_model(Run(tmp_path, {"model_step": None}, "cpu", {}))
    assert note.data.startswith("*A real model's training step: not measured in this run (its params name no "
                                "model_step)")


def test_p_fills_the_card_at_an_n_that_follows_the_grids_batch_policy():
    from types import SimpleNamespace

    r = SimpleNamespace(B=4, H=32, N=4096)
    p = cost.saved_bytes(Case("materialised", 4, 32, 32, 4096, 64, "bfloat16"))
    assert train_lab.fills_at(p, r, "bfloat16", True) == 4096  # B·H·N fixed: P grows as N
    assert train_lab.fills_at(4 * p, r, "bfloat16", False) == pytest.approx(8192)  # B, H fixed: as N²


def test_the_training_notebooks_parameters_are_its_params_keys():
    from pathlib import Path

    import nbformat
    import papermill
    import yaml

    names = set(papermill.inspect_notebook(str(train_lab.NOTEBOOK)))
    assert names == set(train_lab.KEYS) | {"out_dir"}
    nb = nbformat.read(str(train_lab.NOTEBOOK), as_version=4)
    assert sum("parameters" in c.metadata.get("tags", []) for c in nb.cells) == 1
    for path in sorted((Path(__file__).resolve().parents[1] / "params" / "training").glob("*.yaml")):
        assert set(yaml.safe_load(path.read_text())) <= names, path  # every key of a params file lands in the cell
