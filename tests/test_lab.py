"""attnlab.lab and attnlab.lies: the walkthrough's logic, on small runs and made-up GPU runs the tests write."""
import json
import math
import re
import statistics
from pathlib import Path

import pandas as pd
import pytest
import torch

from attnlab import ceilings, lab, lies, cost, report, sweep
from attnlab.measure import Case
from attnlab.report import correctness as cr
from tests import gpu_run

TINY = dict(name="t", device="cpu", dtype="float32", seq_lens=[16], head_dims=[16], causal=[False],
            batch_policy="fixed", batch=1, heads=2, builds=["fused", "fused-no_pv", "torch_eager"], warmup_ms=0,
            reps_ms=1, min_reps=1)


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    root = tmp_path / "outputs"
    monkeypatch.setenv("ATTNLAB_OUTPUTS", str(root))
    return root


@pytest.fixture(scope="module")
def gpu_lessons(tmp_path_factory):
    folder = gpu_run.write_gpu_run(tmp_path_factory.mktemp("gpu") / "g")
    ref = lab.load(folder)
    return lab.Lessons(ref.results, folder, ref.device_name, False, ref.provenance)


def test_params_keeps_the_chosen_policys_keys_only():
    p = lab.params(**{**TINY, "tokens": 4096, "width": 64, "out_dir": None, "seed": None})
    assert (p["batch"], p["heads"]) == (1, 2) and "tokens" not in p and p["seed"] == 0
    p = lab.params(**{**TINY, "batch_policy": "fixed_tokens", "tokens": 64, "width": 32})
    assert (p["tokens"], p["width"]) == (64, 32) and "batch" not in p
    with pytest.raises(sweep.ParamsError, match="'colour'"):
        lab.params(**TINY, colour="red")
    with pytest.raises(sweep.ParamsError, match="'seq_lens': value 0 must be > 0"):
        lab.params(**{**TINY, "seq_lens": [0]})


def test_a_new_folder_never_reuses_a_name(tmp_path):
    a, b = lab.new_folder("cpu", root=tmp_path), lab.new_folder("cpu", root=tmp_path)
    assert a != b and a.parent == b.parent == tmp_path / "outputs" / "cpu" and a.is_dir() and b.is_dir()


def test_reference_run_is_the_newest_gpu_run_with_our_three_builds(outputs):
    old = gpu_run.write_gpu_run(outputs / "gpu-a" / "zz-older", started="2026-01-01T00:00:00+00:00")
    gpu_run.write_gpu_run(outputs / "gpu-a" / "aa-newer-but-partial", started="2026-03-01T00:00:00+00:00",
                          builds=["materialised", "qk_softmax"])
    gpu_run.write_cpu_run(outputs / "cpu" / "newest", started="2026-06-01T00:00:00+00:00")
    assert lab.reference_run() == old  # not the newer partial run, not the CPU run, not by folder name
    newest = gpu_run.write_gpu_run(outputs / "gpu-b" / "run" / "nested", started="2026-02-01T00:00:00+00:00")
    assert lab.reference_run() == newest  # a run one folder deeper is found too
    assert lab.reference_run(outputs / "nothing-here") is None
    variant = gpu_run.write_gpu_run(outputs / "gpu-b" / "variant", started="2026-04-01T00:00:00+00:00")
    prov = json.loads((variant / sweep.PROVENANCE).read_text())
    (variant / sweep.PROVENANCE).write_text(json.dumps({**prov, "params": {**prov["params"], "name": "seeds-policy"}}))
    assert lab.reference_run() == newest  # a newer variant's narrower grid does not displace a card's own params
    only = outputs / "only-variants"
    (only / "gpu").mkdir(parents=True)
    variant.rename(only / "gpu" / "variant")
    assert lab.reference_run(only) == only / "gpu" / "variant"  # with no other, the variant stands in


def test_begin_measures_the_ceilings_once_and_a_cpu_run_reads_its_lessons_from_the_reference(tmp_path, outputs,
                                                                                              monkeypatch):
    ref = gpu_run.write_gpu_run(outputs / "gpu" / "r")
    calls = []
    real = ceilings.measure_ceilings
    monkeypatch.setattr(ceilings, "measure_ceilings", lambda *a: calls.append(a) or real(*a))
    p = lab.params(**TINY, out_dir=str(tmp_path / "run"))
    run = lab.begin(p)
    assert run.out == tmp_path / "run" and (run.out / lab.PARAMS).exists()
    assert run.ceilings["tbps"] > 0 and len(calls) == 1
    assert lab.begin(p).ceilings == run.ceilings and len(calls) == 1  # reopened: the run's own ceilings kept
    les = lab.lessons(run)
    assert les.folder == ref and not les.own and les.device_name == gpu_run.DEVICE_NAME
    note = lab.source_note(run).data
    assert "From a committed GPU run, not from this machine" in note and "interpreter" in note
    assert f"measured on {gpu_run.DEVICE_NAME}" in note
    assert f"{gpu_run.TBPS:.3g} TB/s copy bandwidth and {gpu_run.TFLOPS:.3g} TFLOP/s" in note  # its ceilings, not ours
    summary = lab.summary(run)
    assert list(summary.columns) == ["what", "this run"]  # this run alone: its sweep has not run yet


def test_without_any_gpu_rows_the_sections_say_so(tmp_path, outputs):
    run = lab.begin(lab.params(**TINY, out_dir=str(tmp_path / "run")))
    assert lab.lessons(run) is None
    assert "No GPU measurements" in lab.source_note(run, None).data
    assert "Nothing to show" in lab.speedup_figures(None)[0].data and "Nothing to show" in lab.attribution(None).data
    assert lab.lie("mixed_ratio", run, None)[0].data.startswith("*Nothing to show")


def test_gate_then_sweep_then_resume(tmp_path, outputs):
    run = lab.begin(lab.params(**TINY, out_dir=str(tmp_path / "run")))
    with pytest.raises(lab.GateFailed, match="run the gate first"):
        lab.sweep_run(run, progress=False)
    rows = lab.gate(run, progress=False)
    assert set(rows["build"]) == {"fused", "fused-no_pv", "torch_eager"} and (rows["status"] == "ok").all()
    per_build, grid, not_passed = lab.correctness(run)
    assert list(per_build["passed"]) == [1, 1, 1] and not_passed.empty
    assert grid.loc[("float32", False, 16, 16), "fused-no_pv"].endswith("✓")
    results = lab.sweep_run(run, progress=False)
    assert len(results) == 3 and (results["status"] == "ok").all()
    again = lab.begin(lab.params(**TINY, out_dir=str(tmp_path / "run")))  # the same folder: nothing new to do
    assert len(again.gate) == 3 and len(lab.sweep_run(again, progress=False)) == 3


def test_the_gate_in_processes_writes_the_rows_one_process_writes(tmp_path, outputs):
    """On a GPU the walkthrough's gate deals its shapes to `attnlab check --cases` processes; each shape is seeded as
    the single process seeds it, so the rows (errors included) are the same, under the run's own shape indices."""
    p = lab.params(**{**TINY, "causal": [False, True]}, out_dir=str(tmp_path / "one"))
    one = lab.gate(lab.begin(p), progress=False)
    run = lab.begin(lab.params(**{**TINY, "causal": [False, True]}, out_dir=str(tmp_path / "two")))
    two = lab.gate(run, progress=False, jobs=2)  # the processes' path, on this machine's CPU
    key = ["shape", "build", "causal"]
    one, two = one.sort_values(key).reset_index(drop=True), two.sort_values(key).reset_index(drop=True)
    assert len(two) == len(one) == 6 and list(two["status"]) == list(one["status"]) == ["ok"] * 6
    assert two["err"].tolist() == one["err"].tolist() and set(two["shape"]) == {0, 1}
    assert not (run.out / "gate_cases.json").exists()


def test_a_gate_whose_processes_die_fails_by_shape_and_is_checked_again(tmp_path, outputs, monkeypatch):
    """Each shape a dead `attnlab check` process left is a FAIL row with that shape's columns, so the gate table and
    the sweep's refusal say what failed; the next lab.gate on the folder checks those shapes again. The children here
    are handed a GPU (cuda:7, as str(torch.device) writes it) this machine lacks, so each exits 2."""
    run = lab.begin(lab.params(**{**TINY, "causal": [False, True]}, out_dir=str(tmp_path / "run")))
    run.device = str(torch.device("cuda", 7))
    monkeypatch.setattr("attnlab.warm.warm", lambda params, jobs: [])  # nothing to compile ahead for a GPU not here
    dead = lab.gate(run, progress=False, jobs=2)
    assert list(dead["build"]) == ["(all)", "(all)"] and list(dead["causal"]) == [False, True]
    assert all("cuda:7 was asked for" in s for s in dead["status"]), dead["status"].tolist()
    verdicts = cr.correctness_table(dead)
    assert list(verdicts["verdict"]) == ["FAIL", "FAIL"]
    with pytest.raises(lab.GateFailed, match=r"failed 2 \(build, shape\) pair\(s\), of \(all\)"):
        lab.sweep_run(run, progress=False)
    run = lab.begin(lab.params(**{**TINY, "causal": [False, True]}, out_dir=str(tmp_path / "run")))
    again = lab.gate(run, progress=False, jobs=2)
    assert len(again) == 6 and (again["status"] == "ok").all() and "(all)" not in set(again["build"])


def test_the_sweep_refuses_after_a_failed_gate(tmp_path, outputs):
    run = lab.begin(lab.params(**TINY, out_dir=str(tmp_path / "run")))
    lab.gate(run, progress=False)
    run.gate.loc[1, "status"] = "FAIL"
    with pytest.raises(lab.GateFailed, match="failed 1 .* of fused-no_pv"):
        lab.sweep_run(run, progress=False)
    assert not (run.out / sweep.RESULTS).exists()


def test_byte_model_is_the_models_at_the_runs_shapes(tmp_path):
    run = lab.begin(lab.params(**{**TINY, "seq_lens": [64]}, out_dir=str(tmp_path / "run")))
    t = lab.byte_model(run).iloc[0]
    assert t["S or P"] == "32 KiB"  # 1·2·64²·4 bytes
    assert t["materialised holds"] == "64 KiB" and t["fused holds"] == "8 KiB"  # S + P; O = 1·2·64·16·4


def test_questions_answer_from_the_data(tmp_path, outputs, gpu_lessons):
    """Each question reads the largest N at D = 64, non-causal (gpu_run's N give different numbers at every N), and
    answers with the prediction from the measured ceilings beside the measurement."""
    run = lab.begin(lab.params(**TINY, out_dir=str(tmp_path / "run")))
    lab.gate(run, progress=False)
    qs = {q.question: q for q in lab.questions(run, gpu_lessons)}
    B, H, N, D = 8, 32, 2048, 64
    s = B * H * N * N * 2
    qkvo = 4 * B * H * N * D * 2
    flops = 4 * B * H * N * N * D
    ms = gpu_run.times(N, False)
    bw, rate = gpu_run.TBPS * 1e9, gpu_run.TFLOPS * 1e9  # bytes and FLOPs per ms
    times = next(q for k, q in qs.items() if k.startswith("Predict before you look"))
    assert f"at N = {N}, D = {D} (B = {B}, H = {H}, bfloat16, non-causal)" in times.question
    assert f"{gpu_run.TBPS:.3g} TB/s copy bandwidth and {gpu_run.TFLOPS:.3g} TFLOP/s" in times.question
    assert (f"materialised moves {lab.readable_bytes(qkvo + 4 * s)}: ÷ 4 TB/s = {(qkvo + 4 * s) / bw:.3g} ms; "
            f"measured {ms['materialised']:.3g} ms") in times.answer
    assert f"÷ 700 TFLOP/s = {flops / rate:.3g} ms; measured {ms['fused']:.3g} ms" in times.answer
    assert (f"Predicted speedup {(qkvo + 4 * s) / bw / (flops / rate):.2f}×, measured "
            f"{ms['materialised'] / ms['fused']:.2f}×") in times.answer and "3.30×" in times.answer
    assert gpu_lessons.label in times.source and "more than 25 % apart" in times.answer
    rows = gpu_lessons.results.copy()  # materialised made as slow as its bytes predict, fused as its FLOPs
    at = (rows["N"] == N) & (rows["D"] == D) & ~rows["causal"].astype(bool)
    rows.loc[at & (rows["build"] == "materialised"), "ms"] = (qkvo + 4 * s) / bw
    rows.loc[at & (rows["build"] == "fused"), "ms"] = flops / rate * 1.1
    near = lab.predict_times(lab.Lessons(rows, gpu_lessons.folder, "G", True, gpu_lessons.provenance))
    assert "within 25 %" in near.answer and "(1.00× the prediction)" in near.answer and "(91% of the matmul" in near.answer
    head = next(q for k, q in qs.items() if k.startswith(f"At N = {N} (bfloat16, non-causal), fused beat"))
    extra = ms["materialised"] - ms["fused"]  # D = 64; at D = 128 B stays 8 and H halves, so S halves
    assert "3.30× at D = 64. Predict the speedup at D = 128, where fused takes 1.6 ms" in head.question
    assert (f"so the extra becomes {extra / 2:.3g} ms and the speedup ({ms['fused']:.3g} + {extra / 2:.3g}) / "
            f"{ms['fused']:.3g} = {(ms['fused'] + extra / 2) / ms['fused']:.2f}×; measured 3.30×") in head.answer
    bounds = next(q for k, q in qs.items() if k.startswith("At N = 2048, predict what removing S's round trip saves"))
    assert f"D = 64, S round trip: 4 GiB predicts {2 * s / bw:.3g} ms; it saved {extra / 2:.3g} ms" in bounds.answer
    peaks = next(q for k, q in qs.items() if k.startswith("Predict the peak memory"))
    assert f"N = {N}, D = {D} (B = {B}" in peaks.question and "= 4 GiB; fused holds only O" in peaks.answer
    assert "= 64 MiB, 64× less; measured peaks: materialised 4 GiB (1.00× its prediction)" in peaks.answer
    bound = next(q for k, q in qs.items() if k.startswith("Predict whether fused and materialised are bound"))
    assert "The ridge point is 175 FLOP/byte" in bound.answer
    assert f"fused: {flops / (qkvo):,.0f} FLOP/byte, arithmetic-bound" in bound.answer  # N / 2
    assert f"materialised: {flops / (qkvo + 4 * s):,.0f} FLOP/byte, memory-bound" in bound.answer
    shape = next(q for k, q in qs.items() if k.startswith("What shape should the speedup curve have"))
    assert "non-causal D = 64: 2.50× at N = 512 → 3.30× at N = 2048 (rises then flattens)" in shape.answer
    assert "causal D = 64: 2.80× at N = 512 → 4.50× at N = 2048 (still rising)" in shape.answer
    assert shape.answer.count("Predicted:") == 1
    overlap = next(q for k, q in qs.items() if k.startswith("Does any ablation of fused"))
    assert overlap.answer.startswith("Yes. PV, in 12 shape(s)") and "-2.0%" in overlap.answer  # no_pv: 2 %
    # slower everywhere
    predicting = [k for k in qs if "predict" in k.lower()]
    assert len(predicting) >= len(qs) / 2 and len(qs) == 10
    assert not any(k.startswith(("Which build came closest", "At which N does fused first")) for k in qs)
    page = lab.check_yourself(run, gpu_lessons).data
    assert page.count("<details>") == len(qs) and "<summary>Answer (computed from" in page


def test_the_accuracy_question_predicts_the_order_of_rounding(gpu_lessons):
    rows = gpu_lessons.results.copy()
    for build, err in (("materialised", 4e-3), ("qk_softmax", 2.5e-3), ("fused", 2e-3)):
        rows.loc[rows["build"] == build, "err"] = err
    q = lab.predict_accuracy(lab.Lessons(rows, gpu_lessons.folder, "G", True, gpu_lessons.provenance))
    assert "materialised 0.004, qk_softmax 0.0025, fused 0.002 (materialised 2.00× fused): in the predicted order" \
        in q.answer and "over 36 rows" in q.answer
    rows.loc[rows["build"] == "fused", "err"] = 5e-3
    q = lab.predict_accuracy(lab.Lessons(rows, gpu_lessons.folder, "G", True, gpu_lessons.provenance))
    assert "not in the predicted order" in q.answer


def test_without_gpu_rows_the_questions_use_the_byte_model_at_the_runs_shapes(tmp_path, outputs):
    run = lab.begin(lab.params(**TINY, out_dir=str(tmp_path / "run")))
    qs = lab.questions(run, None)
    assert len(qs) == 3 and qs[-1].question.startswith("At this run's largest shape (B = 1, H = 2, N = 16, D = 16")
    assert "materialised: 4 KiB" in qs[-1].answer and "fused: 2 KiB" in qs[-1].answer  # 2·(1·2·16²·4); O = 1·2·16·16·4


def test_experiment_record_is_filled_from_the_data(tmp_path, gpu_lessons):
    run = lab.begin(lab.params(**TINY, out_dir=str(tmp_path / "run")))
    rec = lab.experiment_record(run, gpu_lessons).set_index("entry")["record"]
    assert list(rec.index) == ["hypothesis", "controlled change", "observed effect", "verdict", "tradeoff"]
    assert "supported in 2 of 4 (causal, D) curves" in rec["verdict"] and "still rising" in rec["verdict"]
    assert "non-causal D = 64: 2.50× → 3.30×" in rec["observed effect"]
    hold = cost.hold_bytes(Case("fused", 8, 32, 32, 2048, 64, "bfloat16"))
    assert f"fused must hold {lab.readable_bytes(hold)}" in rec["tradeoff"]
    # the made-up run records no tiles: whether qk_softmax computed QKᵀ once or twice is not guessed
    assert "in 12 of 12 shapes qk_softmax's rows do not record whether it ran one QKᵀ pass or two" in rec["tradeoff"]
    assert "second QKᵀ pass" not in rec["tradeoff"]
    page = lab.record(run, gpu_lessons).data
    assert page.count("\n| **") == 5 and rec["tradeoff"] in page


def _with_tiles(les, **kernels):
    """les with each base build's rows (and its ablations') carrying recorded tiles: kernels maps a base build to a
    function of N giving its tiles JSON."""
    t = les.results.copy()
    for base, tiles in kernels.items():
        mine = t["build"].str.split("-").str[0] == base
        t.loc[mine, "tiles"] = [tiles(n) for n in t.loc[mine, "N"]]
    return lab.Lessons(t, les.folder, les.device_name, les.own, les.provenance)


def _tiles(kernel, **kw):
    return lambda N: json.dumps({kernel: {"BLOCK_M": 64, **{k: v(N) if callable(v) else v for k, v in kw.items()}}})


def test_the_record_charges_qk_softmax_a_second_qk_pass_only_where_it_ran_two(tmp_path, gpu_lessons):
    run = lab.begin(lab.params(**TINY, out_dir=str(tmp_path / "run")))
    les = _with_tiles(gpu_lessons, qk_softmax=_tiles("qk_softmax", gluon=True, one_pass=lambda N: N <= 1024))
    tradeoff = lab.experiment_record(run, les).set_index("entry")["record"]["tradeoff"]
    att = pd.concat([report.attribution(g) for g in lab.groups_of(les).values()])
    most = -att[att["boundary"] == "S round trip"]["qk_removed_ms"].min()  # at N = 2048, the two-pass rows
    assert (f"qk_softmax pays for dropping S with a second QKᵀ pass in the 4 of 12 shapes where it ran two passes "
            f"(N = 2048; up to {most:.3g} ms at the matmul ceiling); it pays no second QKᵀ pass in the 8 of 12 "
            "shapes where it ran one (N ≤ 1024), the row held on chip") in tradeoff
    one = _with_tiles(gpu_lessons, qk_softmax=_tiles("qk_softmax", gluon=True, one_pass=True))
    tradeoff = lab.experiment_record(run, one).set_index("entry")["record"]["tradeoff"]
    assert "qk_softmax pays no second QKᵀ pass in the 12 of 12 shapes where it ran one (N ≤ 2048)" in tradeoff
    assert "pays for dropping S" not in tradeoff


def test_overlap_is_offered_as_the_likely_cause_only_beside_a_warp_specialised_kernel(gpu_lessons):
    """gpu_run's no_pv is 2 % slower than fused at every shape: one line for the 12 shapes, not 12 bullets. Overlap
    is the likely cause, with its evidence, only where fused's tiles say gluon."""
    gluon = _with_tiles(gpu_lessons, fused=_tiles("fused", gluon=True))
    found = lab.overlap_findings(gluon)
    assert len(found) == 1
    line = found[0]
    assert line.startswith("PV, in 12 shape(s) (bfloat16 non-causal D = 64 at N = 512–2048; bfloat16 non-causal "
                           "D = 128 at N = 512–2048; bfloat16 causal D = 64 at N = 512–2048; bfloat16 causal D = 128 at "
                           "N = 512–2048): removing it saved -2.0% of fused's time (negative: it ran slower)")
    assert "Likely cause: the PV runs under other work" in line and "50% of fused's counted FLOPs" in line
    assert "warp-specialised (its tiles say gluon)" in line and "ran under other work (overlap)" not in line
    page = lab.overlap(gluon).data
    finding, _, cause = line.partition(" Likely cause:")
    assert page.count("\n- ") == 1 and f"- {finding} <details>" in page  # the finding open, its cause folded
    assert f"<summary>Likely cause, and the evidence</summary>Likely cause:{cause}</details>" in page
    for les, said in ((_with_tiles(gpu_lessons, fused=_tiles("fused", gluon=False)), "tiles here say Triton"),
                      (gpu_lessons, "record no tiles for the fused kernel")):  # an A100's rows; rows without tiles
        found = lab.overlap_findings(les)
        assert len(found) == 1 and found[0].startswith("PV, in 12 shape(s)") and said in found[0]
        assert "Likely cause" not in found[0] and "overlap." in found[0]  # "no reason to read it as overlap."
    # the PV of qk_softmax has a kernel of its own, Gluon or not: nothing to run under
    qk = lab.overlap_findings(_with_tiles(gpu_lessons, qk_softmax=_tiles("pv", gluon=True)), base="qk_softmax")
    assert qk and all("has a kernel of its own" in f and "Likely cause" not in f for f in qk)


def _pv_saving(les, by_d):
    """les with fused-no_pv at (1 − by_d[D]) of fused's time: removing PV saves by_d[D] of it."""
    t = les.results.copy()
    for d, share in by_d.items():
        for (n, c), g in t[t["D"] == d].groupby(["N", "causal"]):
            fused = g.loc[g["build"] == "fused", "ms"].iloc[0]
            at = g.index[g["build"] == "fused-no_pv"]
            t.loc[at, ["ms", "ms_p20", "ms_p80"]] = fused * (1 - share)
    return lab.Lessons(t, les.folder, les.device_name, les.own, les.provenance)


def test_the_head_dim_sentence_is_computed_from_the_rows(gpu_lessons):
    gluon = _with_tiles(gpu_lessons, fused=_tiles("fused", gluon=True))
    text = lab.pv_by_head_dim(_pv_saving(gluon, {64: -0.03, 128: 0.12})).data
    assert text.startswith("Removing PV saves a median -3% at D = 64 (-3% over 6 shapes) and 12% at D = 128 (12% "
                           "over 6 shapes) of fused's time (negative: the ablation ran slower)")
    assert "one per 256 matmul FLOPs at D = 64 and one per 512 matmul FLOPs at D = 128" in text
    assert "take 1× its exponential's time at D = 64 and 2× its exponential's time at D = 128" in text
    assert "warp-specialised kernel (its tiles say gluon)" in text
    spread = lab.pv_by_head_dim(_pv_saving(gluon, {64: 0.01, 128: 0.09})).data  # no negative median: no aside
    assert spread.startswith("Removing PV saves a median 1% at D = 64 (1% over 6 shapes) and 9% at D = 128")
    assert "negative" not in spread
    # Triton tiles: the FLOP arithmetic stands, the reading of it as PV under the softmax does not
    triton = _with_tiles(gpu_lessons, fused=_tiles("fused", gluon=False))
    text = lab.pv_by_head_dim(_pv_saving(triton, {64: -0.03, 128: 0.12})).data
    assert "one per 256 matmul FLOPs" in text and "MUFU" not in text and "no reason to read" in text
    # no growth with D (gpu_run's 2 % slower at both): no explanation of a change the rows do not show
    flat = lab.pv_by_head_dim(gluon).data
    assert "-2% at D = 64" in flat and "does not grow with D" in flat and "Why" not in flat
    one_d = gluon.results[gluon.results["D"] == 128]
    text = lab.pv_by_head_dim(lab.Lessons(one_d, gluon.folder, gluon.device_name, gluon.own, gluon.provenance)).data
    assert "one head dim" in text and "Why" not in text


def test_dominant_stage_per_shape(gpu_lessons):
    t = lab.dominant(gpu_lessons)
    assert list(t.columns) == ["materialised", "qk_softmax", "fused"] and (t["fused"] == "softmax").all()


def test_memory_sections_read_the_lesson_rows(gpu_lessons):
    wide, odd, saved = lab.memory(gpu_lessons)
    assert wide.loc[(64, 512, 32, 32), "S or P (predicted)"] == "512 MiB"  # 32·32·512²·2
    assert wide.loc[(64, 512, 32, 32), "materialised"] == "1 GiB" and odd.empty
    assert set(saved["boundary"]) == {"S round trip", "P round trip"}


def test_mixed_ratio_demo_shows_the_lie_and_the_refusal(gpu_lessons):
    demo = lies.mixed_ratio(gpu_lessons.results, "made-up rows")
    lie = demo.evidence.iloc[0]["×"]
    t = gpu_run.times(2048, False)
    assert lie == pytest.approx(t["materialised"] / gpu_run.times(2048, True)["fused"])
    assert demo.evidence.iloc[1]["×"] == pytest.approx(3.3) and demo.evidence.iloc[2]["×"] == pytest.approx(4.5)
    assert f"gives {lie:.2f}×, more than either honest ratio (3.30× non-causal, 4.50× causal)" in demo.lie
    assert "a table takes one dtype and one causal value" in demo.guard


def test_mixed_ratio_divides_the_times_the_speedup_table_divides(gpu_lessons):
    rows = gpu_lessons.results.copy()
    rows["consume_ms"] = 0.2 * rows["ms"].min()  # the consumption step inside every timed call
    demo = lies.mixed_ratio(rows, "made-up rows")
    at = rows[(rows["N"] == 2048) & (rows["D"] == 64) & rows["build"].isin(("fused", "materialised"))]
    table = {causal: report.speedup(g, builds=["fused"]).iloc[0] for (_, causal), g in report.split(at).items()}
    honest = demo.evidence.set_index(demo.evidence.columns[0])["×"]
    assert honest["materialised / fused, both non-causal"] == pytest.approx(table[False]["x_vs_materialised"])
    assert honest["materialised / fused, both causal"] == pytest.approx(table[True]["x_vs_materialised"])
    raw = gpu_run.times(2048, False)["materialised"] / gpu_run.times(2048, True)["fused"]
    net = table[False]["materialised_ms"] / table[True]["ms"]
    assert honest.iloc[0] == pytest.approx(net) and net != pytest.approx(raw, rel=1e-3)


def test_launch_overhead_without_a_gpu_shows_the_lesson_rows(gpu_lessons):
    demo = lies.launch_overhead("cpu", gpu_lessons.results, "made-up rows")
    assert "needs a GPU" in demo.title and "made-up rows" in demo.where
    assert "In these rows 8 of 12 of our builds' calls take the host longer" in demo.lie
    assert "measures the host" in demo.lie and "repeated rounds" in demo.lie
    assert not re.search(r"\d+ µs", demo.lie)  # no figure but the rows' own
    assert set(demo.evidence["N"]) == {512} and (demo.evidence["host_ms / ms"] == 0.15 / demo.evidence["ms"]).all()
    with pytest.raises(ValueError, match="needs the committed GPU rows"):
        lies.launch_overhead("cpu")


def test_launch_overhead_prints_the_figures_it_was_fed_and_says_why_host_time_exceeds_do_bench():
    rounds, flushed, graph, host = [0.051, 0.062, 0.057], 0.031, 0.0084, 0.072  # a made-up GPU, not an H100
    demo = lies.launch_overhead_demo("fused at B=1 H=4 N=256 D=64 float16", rounds, flushed, graph, host, "a test")
    assert list(demo.evidence["ms"]) == [statistics.median(rounds), flushed, graph, host]  # each figure once
    figures = set(re.findall(r"([\d.]+) µs", demo.lie))
    assert figures == {"51", "62", "57", "31", "8.4", "72"} and "143" not in demo.lie and "221" not in demo.lie
    assert "takes the host 72 µs, 8.6× the kernels' time" in demo.lie
    assert "3 rounds in a row here took 51 µs, 62 µs, 57 µs a call (22% apart)" in demo.lie
    assert "do_bench's eager figure (31 µs) sits below the host's 72 µs because do_bench writes a buffer" in demo.lie
    quick = lies.launch_overhead_demo("fused", [0.5, 0.5, 0.5], 0.6, 0.45, 0.1, "a test")
    assert "sits below" not in quick.lie and "mostly the kernels'" in quick.lie and "less than the kernels" in quick.lie


def test_recompile_limit_demo_falls_back_silently_then_refuses():
    demo = lies.recompile_limit()
    assert list(demo.evidence["graphs compiled so far"]) == [1, 2, 2, 2]
    assert "2 call(s) ran eager" in demo.lie
    assert "FailOnRecompileLimitHit" in demo.guard and "(recognised as the recompile-limit fallback)" in demo.guard


def test_compiled_demos_show_the_dropped_work_and_the_rewrite():
    dead = lies.dead_output("cpu")
    assert list(dead.evidence["shape"]) == ["B=1 H=1 N=16 D=16", "B=1 H=4 N=256 D=64"]
    kept_ms, dead_ms = dead.evidence.iloc[-1][["output consumed (acc += o.sum()), ms", "output never read, ms"]]
    assert dead_ms < 0.25 * kept_ms and "check that its output is consumed" in dead.guard
    assert f"would 'save' {1 - dead_ms / kept_ms:.0%} of the call" in dead.lie
    rewrite = lies.compile_rewrite("cpu")
    seen = list(rewrite.evidence["attention operator the profiler sees"])
    assert seen[0] == "no SDPA operator" and "scaled_dot_product" in seen[1]
    assert rewrite.evidence["ms"].dtype == float and "peak allocation (MiB)" not in rewrite.evidence


def test_dead_output_prints_the_measured_saving_and_when_the_guard_stays_quiet():
    small = Case("fused", 1, 4, 4, 256, 64, "float16", False, "cuda:0")
    large = Case("fused", 2, 16, 16, 8192, 128, "float16", False, "cuda:0")
    demo = lies.dead_output_demo([(small, 0.174, 0.0572), (large, 2.0, 0.06)], "a test")  # the H100's small shape
    assert "nearly all" not in demo.lie and "would 'save' 97% of the call" in demo.lie
    assert "at B=1 H=4 N=256 D=64 (67.1 MFLOP) the 'saving' is 67%" in demo.lie
    assert "0.0572–0.06 ms here" in demo.lie
    assert "At B=2 H=16 N=8192 D=128 (1.1 TFLOP of matmul, and 8 GiB of S and P" in demo.lie
    assert ("at B=1 H=4 N=256 D=64, nothing: the unread call ran in 33% of the consumed one, not under 25%"
            in demo.guard)
    assert "at B=2 H=16 N=8192 D=128, \u201cmaterialised-no_softmax ran in 3% of materialised's time" in demo.guard
    assert "It stays quiet whenever the dropped-output call still takes 25% or more of its base" in demo.guard
    assert list(demo.evidence["ablation_table (flags under 25%)"]) == ["quiet", "flagged"]
    both = lies.dead_output_demo([(small, 0.174, 0.0372), (large, 2.0, 0.06)], "a test").guard  # two flags
    assert both.count("check that its output is consumed") == 1 and "at B=2 H=16 N=8192 D=128, the same, at 3%" in both
    assert list(demo.evidence["never read / consumed"]) == pytest.approx([0.0572 / 0.174, 0.03])


def test_compile_rewrite_names_equal_times_and_keeps_memory_out_of_the_ms_column():
    case = Case("fused", 1, 4, 4, 256, 64, "float16", False, "cuda:0")
    sdpa = ["aten::_scaled_dot_product_cudnn_attention"]
    peaks = (1.5 * (1 << 20), 132608.0)
    same = lies.compile_rewrite_demo(case, (0.100, 0.105, 0.112), (0.101, 0.108, 0.115), [], sdpa, peaks, "a test")
    assert "0.108 ms against 0.105 ms eager: the same time" in same.lie and "the lie is the label" in same.lie
    assert list(same.evidence.columns) == ["call", "ms", "peak allocation (MiB)",
                                           "attention operator the profiler sees"]
    assert list(same.evidence["ms"]) == [0.105, 0.108]
    assert list(same.evidence["peak allocation (MiB)"]) == [1.5, 132608 / (1 << 20)]
    assert "(1 MiB here)" in same.guard and "peak 132608 B is below the 1048576 B" in same.guard
    apart = lies.compile_rewrite_demo(case, (0.99, 1.0, 1.01), (0.49, 0.5, 0.51), [], sdpa, None, "a test")
    assert "faster by 0.5 ms, beyond the 0.02 ms the lab reads as noise" in apart.lie
    assert "the same time" not in apart.lie and "the lie is the label" in apart.lie
    kept = lies.compile_rewrite_demo(case, (0.99, 1.0, 1.01), (0.99, 1.0, 1.01), [], [], None, "a test")
    assert "no rewrite happened here" in kept.lie and "no rewrite" in kept.title


def test_the_profiler_view_on_a_cpu(tmp_path):
    run = lab.begin(lab.params(**{**TINY, "seq_lens": [64]}, out_dir=str(tmp_path / "run")))
    prof = lab.profile(run)
    assert set(prof["traces"]) == {"torch_eager", "sdpa_default"}
    assert all(json.loads(Path(t).read_text())["traceEvents"] for t in prof["traces"].values())
    eager, sdpa = prof["tables"]["torch_eager"], prof["tables"]["sdpa_default"]
    assert {"aten::bmm", "aten::_softmax"} <= set(eager["name"])
    assert [n for n in sdpa["name"] if "scaled_dot_product" in n and "flash" in n]
    assert not any("softmax" in n for n in sdpa["name"])  # one fused operator: nothing inside it to time
    page = [x.data for x in lab.profile_report(prof) if hasattr(x, "data") and isinstance(x.data, str)]
    assert any("no stage times" in p for p in page)


def test_the_offline_renderer_drops_mathjax_and_keeps_plotly():
    import plotly.graph_objects as go

    html = lab.offline_renderer().to_mimebundle(go.Figure(go.Scatter(y=[1, 2])).to_dict())["text/html"]
    assert "Plotly.newPlot" in html and not re.search(r"<script[^>]*\bsrc=", html)


def test_hypothesis_names_what_refutes_it():
    text = lab.hypothesis(lab.params(**TINY)).data
    assert "refuted" in text and "N = 16" in text and "`fixed`" in text


def test_trend_and_batch_policy_read_the_rows(gpu_lessons):
    t = lab.trend(gpu_lessons)
    assert set(t["shape"]) == {"rises then flattens", "still rising"}
    note = lab.batch_policy_note(gpu_lessons).data
    assert "fixed tokens** (B·N = 16384" in note
    shapes = {r.shape: [] for r in t.itertuples()}
    for r in t.itertuples():
        shapes[r.shape].append(f"{'causal' if r.causal else 'non-causal'} D = {r.D}")
    assert all(f"{shape} at {', '.join(names)}" in note for shape, names in shapes.items())  # each curve's shape
    assert math.isclose(lab.speedup_table(gpu_lessons).loc[("bfloat16", False, 64), 1024], 3.2)
    assert isinstance(lab.batch_policy(gpu_lessons), pd.DataFrame)


def test_every_params_file_validates_and_the_older_card_has_no_bf16():
    root = Path(__file__).resolve().parent.parent / "params"
    files = {f.stem: sweep.load_params(f) for f in sorted(root.glob("*.yaml"))}
    assert {"cpu", "gpu", "h200", "h100", "a100", "t4", "h200-fixed-bh"} <= set(files)
    assert files["t4"]["dtype"] == "float16" and "sdpa_flash" in files["t4"]["builds"]  # its rows say why not
    assert files["h100"]["seq_lens"] == files["h200"]["seq_lens"]  # the two cards compare shape for shape
    assert files["h200-fixed-bh"]["batch_policy"] == "fixed" and files["h200"]["batch_policy"] == "fixed_tokens"
    assert all(p["name"] == stem for stem, p in files.items())


def test_a_run_of_the_other_batch_policy_is_set_beside_the_lessons(outputs):
    tokens = gpu_run.write_gpu_run(outputs / "gpu" / "tokens", started="2026-02-01T00:00:00+00:00")
    fixed = outputs / "gpu" / "fixed"
    gpu_run.write_gpu_run(fixed, started="2026-01-01T00:00:00+00:00")
    rows = sweep.read_results(fixed)
    rows["B"] = 2  # the same B and H at every N: the seeds' policy
    rows.to_csv(fixed / sweep.RESULTS, index=False)
    ref = lab.load(tokens)
    les = lab.Lessons(ref.results, tokens, ref.device_name, False, ref.provenance)
    assert lab.policy_of(les.results) == "fixed_tokens" and lab.policy_of(rows) == "fixed"
    runs = lab.policy_runs(les)
    assert [k.split(" ")[0] for k in runs] == ["fixed_tokens", "fixed"]
    note = lab.batch_policy_note(les).data
    assert "On the same card under **fixed** (bfloat16, " in note and "The figure below sets the two side by side" in note
    assert "non-causal D = 64: 2.50× at N = 512, 3.30× at N = 2048 (rises then flattens)" in note  # from the rows
    fig = lab.batch_policy_figures(les)[0]
    assert "batch policy" in fig.layout.title.text and fig.layout.xaxis.title.text == "sequence length N (tokens)"
    assert {t.name.split(" ")[0] for t in fig.data} == {"fixed_tokens", "fixed"} and len(fig.data) == 2 * 2 * 2
    alone = gpu_run.write_gpu_run(outputs / "other" / "alone")
    (alone / sweep.PROVENANCE).write_text((alone / sweep.PROVENANCE).read_text().replace(gpu_run.DEVICE_NAME, "B"))
    one = lab.load(alone)
    assert lab.batch_policy_figures(lab.Lessons(one.results, alone, "B", False, one.provenance)) == []


def test_the_curves_words_and_the_head_dim_note_come_from_the_rows(gpu_lessons):
    """gpu_run: both head dims share one speedup, so 1/D's prediction (the larger D lower) does not hold there and
    the note says so; with D = 128's materialised made faster, it holds and the note says that instead."""
    words = lab.head_dim_words(gpu_lessons)
    assert len(words) == 2 and words[0].startswith("At N = 2048 (bfloat16, non-causal) fused over materialised is "
                                                   "3.30× at D = 64, 3.30× at D = 128")
    assert "0.0312 byte per FLOP at D = 64, 0.0156 byte per FLOP at D = 128" in words[0]  # 2 bytes · 4N² / 4N²D
    assert "as here" in words[0]  # equal ratios are ordered as 1/D predicts (not above it)
    rows = gpu_lessons.results.copy()
    low = (rows["build"] == "materialised") & (rows["D"] == 64)
    rows.loc[low, "ms"] = rows.loc[low, "ms"] * 0.5  # D = 64 now below D = 128: against 1/D
    flipped = lab.head_dim_words(lab.Lessons(rows, gpu_lessons.folder, "G", True, gpu_lessons.provenance))
    assert "here it does not" in flipped[0] and "1.65× at D = 64, 3.30× at D = 128" in flipped[0]
    note = lab.head_dim_note(gpu_lessons).data  # each group's numbers in a clause
    assert "1/D, since" not in note and "sits lower in every group, as predicted" in note  # why: the notebook
    assert "bfloat16 causal at N = 2048: 4.50×, 4.50× (S and P's round trips: 0.0547, 0.0273 byte per FLOP)" in note
    against = lab.head_dim_note(lab.Lessons(rows, gpu_lessons.folder, "G", True, gpu_lessons.provenance)).data
    assert "Here it does not in bfloat16 non-causal, bfloat16 causal" in against
    one = rows[rows["D"] == 64]
    assert "one head dim" in lab.head_dim_note(lab.Lessons(one, gpu_lessons.folder, "G", True, {})).data
    curve = lab.curve_words(gpu_lessons.results)
    assert "causal D = 64: 2.80× at N = 512, 4.50× at N = 2048 (still rising)" in curve
