"""attnlab.train_sweep on the CPU, our kernels in Triton's interpreter at one tiny shape: a row per (build, pass) with
its held bytes beside the byte model's, gradients within the accuracy rule, a run stopped part way resumed into the
same folder, a case out of memory written as a row while the sweep goes on, and bad params refused before anything is
written."""
import json

import pytest
import torch

from attnlab import cost, measure, train_sweep
from attnlab.builds import training
from attnlab.sweep import ParamsError

TINY = dict(name="t", device="cpu", dtype="float32", seq_lens=[16], head_dims=[16], causal=[True],
            batch_policy="fixed", batch=1, heads=2, builds=["materialised", "fused"],
            passes=["backward", "forward+backward"], warmup_ms=0, reps_ms=1, min_reps=1)
STEP_MODEL = dict(name="tiny", layers=1, hidden=32, heads=2, kv_heads=1, head_dim=16, intermediate=64, vocab=64)


def test_rows_hold_each_pass_with_held_bytes_beside_the_model_and_a_stopped_run_resumes(tmp_path, monkeypatch):
    real, calls = measure.measure, []

    def stops_at_the_third(case, **kw):
        calls.append(case.case_id)
        if len(calls) == 3:
            raise KeyboardInterrupt("stopped as a user would")
        return real(case, **kw)

    monkeypatch.setattr(measure, "measure", stops_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        train_sweep.run(TINY, tmp_path, progress=False)
    assert len(train_sweep.read_results(tmp_path)) == 2  # the two finished rows are kept
    monkeypatch.setattr(measure, "measure", real)
    rows = train_sweep.run(TINY, tmp_path, progress=False)
    sessions = json.loads((tmp_path / train_sweep.PROVENANCE).read_text())["sessions"]
    assert [(s["already_measured"], s["measured"], s["interrupted"]) for s in sessions] == [(0, 2, True),
                                                                                             (2, 2, False)]
    assert not (tmp_path / "results.csv").exists()  # a training run is never taken for an attention run
    assert list(zip(rows["build"], rows["pass"])) == [("materialised", "backward"),
                                                      ("materialised", "forward+backward"),
                                                      ("fused", "backward"), ("fused", "forward+backward")]
    assert (rows["status"] == "ok").all() and (rows["timer"] == "perf_counter").all()
    assert (rows["err"] <= rows["err_limit"]).all() and rows["err_note"].str.contains("gradient nearest").all()
    for r in rows.itertuples():
        case = measure.Case(r.build, 1, 2, 2, 16, 16, "float32", True)
        assert (r.saved_bytes, r.backward_flops, r.recompute_flops, r.backward_bytes) == (
            cost.saved_bytes(case), cost.backward_flops(case), cost.recompute_flops(case), cost.backward_bytes(case))
    fused = rows[rows["build"] == "fused"]
    assert (fused["held_bytes"] == 1 * 2 * 16 * 4).all()  # the logsumexp alone: B·H·N float32
    assert (fused["recompute_flops"] > 0).all() and (rows.loc[rows["build"] == "materialised", "recompute_flops"]
                                                     == 0).all()
    mat = rows[rows["build"] == "materialised"]
    assert (mat["held_bytes"] >= mat["saved_bytes"]).all()  # P, in rows padded to whole 128-byte lines


def test_a_case_out_of_memory_is_a_row_and_the_sweep_goes_on(tmp_path, monkeypatch):
    real = measure.differentiable

    def short_of_memory(name):
        if name != "materialised":
            return real(name)

        def attend(*a, **k):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return attend

    monkeypatch.setattr(measure, "differentiable", short_of_memory)
    rows = train_sweep.run({**TINY, "builds": ["materialised", "torch_eager"], "passes": ["forward+backward"]},
                           tmp_path, progress=False)
    assert list(rows["status"]) == ["oom: 2147483648 bytes wanted (the failed allocation)", "ok"]


@pytest.mark.parametrize("change, says", [
    (dict(builds=["fused", "fused-no_pv"]), "params key 'builds': value 'fused-no_pv' has no backward"),
    (dict(builds="ablation"), "params key 'builds': value 'materialised-no_softmax' has no backward"),
    (dict(passes=["forward"]), "params key 'passes': value ['forward'] must include 'backward' or "
                               "'forward+backward'"),
    (dict(passes=["sideways"]), "params key 'passes': value ['sideways'] must list passes of"),
    (dict(seq_lens=[0]), "params key 'seq_lens': value 0 must be > 0"),
    (dict(epochs=3), "params key 'epochs': value 3 is not a params key"),
    (dict(model_step=dict(model=STEP_MODEL, batch=1, seq_len=32)), "params key 'model_step': value"),
    (dict(model_step=dict(model={**STEP_MODEL, "vocab": 0}, batch=1, seq_len=32, builds=["fused"])),
     "params key 'model_step.model': value"),
    (dict(model_step=dict(model=STEP_MODEL, batch=1, seq_len=1, builds=["fused"])),
     "params key 'model_step.seq_len': value 1 must be >= 2"),
    (dict(model_step=dict(model=STEP_MODEL, batch=1, seq_len=32, builds=["fused-no_pv"])),
     "params key 'model_step.builds': value 'fused-no_pv' is not a build with a backward here"),
])
def test_bad_params_are_one_error_before_anything_is_written(tmp_path, change, says):
    out = tmp_path / "run"
    with pytest.raises(ParamsError) as e:
        train_sweep.run({**TINY, **change}, out, progress=False)
    assert str(e.value).startswith(says), str(e.value)
    assert not out.exists()


def test_all_builds_means_every_build_with_a_backward_and_passes_default_to_all_three():
    p = train_sweep.validate({k: v for k, v in {**TINY, "builds": "all"}.items() if k != "passes"})
    assert p["builds"] == training.names() and p["passes"] == ["forward", "backward", "forward+backward"]


def test_the_command_line_says_one_line_for_bad_params(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndevice: cpu\ndtype: float32\nseq_lens: [16]\nhead_dims: [16]\nbatch_policy: fixed\n"
                   "batch: 1\nheads: 2\nbuilds: [fused-no_pv]\n")
    assert train_sweep.main(["--params", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: params key 'builds'") and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_a_model_step_is_measured_once_after_the_grid_into_its_own_file(tmp_path, monkeypatch):
    import pandas as pd

    from attnlab import hf_attention, model_train

    calls = []
    monkeypatch.setattr(hf_attention, "available", lambda: True)
    monkeypatch.setattr(model_train, "measure", lambda spec, builds, **kw: calls.append((spec.name, builds, kw))
                        or pd.DataFrame({c: ["x"] for c in model_train.COLUMNS}))
    step = dict(model=STEP_MODEL, batch=2, seq_len=32, builds=["fused", "materialised"])
    params = {**TINY, "builds": ["torch_eager"], "passes": ["forward+backward"], "model_step": step, "seed": 3}
    train_sweep.run(params, tmp_path, progress=False)
    assert calls == [("tiny", ["fused", "materialised"], dict(B=2, N=32, dtype="float32", device="cpu", seed=3,
                                                              reps_ms=1.0, min_reps=1))]
    assert list(train_sweep.read_step(tmp_path).columns) == list(model_train.COLUMNS)
    train_sweep.run(params, tmp_path, progress=False)  # resumed: the step is there already
    assert len(calls) == 1
