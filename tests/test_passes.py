"""Rows of a backward pass, measured on the CPU with the library builds torch's autograd differentiates (torch_eager,
sdpa_math): the pass column, what the forward leaves held for the backward, the gradients consumed and checked, the
seam to attnlab.builds.training; and results files: old ones read as forward rows, and every report reads the
forward rows unless it names other passes."""
import importlib.machinery
import json
import math
import re
import sys
import types

import pytest
import torch

from attnlab import accuracy, builds, cost, runs, schema, sweep
from attnlab import measure as m
from attnlab.accuracy import Verdict, rel_error
from tests.test_compare import write_run
from tests.test_report_groups import row

FAST = dict(ceilings=dict(tbps=0.05, tflops=0.2), reps_ms=1.0, warmup_ms=0.0, min_reps=3)


def case(build="torch_eager", pass_="backward", causal=False, H=2, Hkv=2, N=32):
    return m.Case(build, 1, H, Hkv, N, 16, "float32", causal, "cpu", pass_)


def torch_grads(c: m.Case):
    """dQ, dK, dV of torch_eager at the case's inputs and dO, by torch.autograd directly."""
    leaves = [x.requires_grad_() for x in m.make_inputs(c)]
    o = builds.get("torch_eager").attend(*leaves, causal=c.causal)
    return torch.autograd.grad(o, leaves, m.grad_output(c))


def test_a_case_names_its_pass_and_a_forward_ones_id_is_unchanged():
    fwd = case(pass_="forward")
    assert fwd.case_id == "torch_eager|1|2|2|32|16|float32|False|none" and fwd == case(pass_="forward")
    assert case().case_id == fwd.case_id + "|backward" and case() != fwd
    assert case(pass_="forward+backward").case_id.endswith("|none|forward+backward")
    with pytest.raises(ValueError, match="pass_ must be one of forward, backward, forward\\+backward, got 'fwd'"):
        case(pass_="fwd")
    # FLOPs: five N×N×D products for the backward (2.5× the forward's two), seven for both
    assert (cost.flops(case()), cost.flops(case(pass_="forward+backward"))) == (
        2.5 * cost.flops(fwd), 3.5 * cost.flops(fwd))


@pytest.mark.parametrize("pass_", ["backward", "forward+backward"])
def test_a_backward_row_consumes_the_gradients_and_holds_what_the_forward_saved(pass_):
    c = case(pass_=pass_)
    r = m.measure(c, run_id="r", **FAST)
    assert r["status"] == "ok" and r["pass"] == pass_ and r["case_id"] == c.case_id and r["timer"] == "perf_counter"
    assert r["cold_s"] > 0 and r["reps"] >= 3 and 0 < r["consume_ms"] < r["ms"]
    # torch_eager keeps P (B·H·N², float32) for the backward: softmax's output, which P V's backward reads too
    assert r["held_bytes"] == 2 * 32 * 32 * 4
    expected = sum(float(g.sum()) for g in torch_grads(c))  # the mean over calls of the gradients' sums
    assert r["checksum"] == pytest.approx(expected, rel=1e-5)
    # the byte model counts the forward: no bytes, no TB/s; the FLOPs are the pass's
    assert (r["hold_bytes"], r["bytes_moved"]) == (0, 0) and math.isnan(r["tbps"]) and r["alloc_flag"] == ""
    assert r["flops"] == cost.flops(c) and r["tflops"] > 0


def test_what_a_forward_leaves_held_is_its_saved_tensors_without_its_inputs_and_output():
    """torch_eager under a causal mask also keeps the (N, N) mask; with grouped-query attention the k and v it
    repeats to H heads (new tensors, not its inputs); sdpa_math keeps more than P. A forward row holds nothing."""
    assert math.isnan(m.measure(case(pass_="forward"), **FAST)["held_bytes"])  # nothing is kept for a backward
    P = 2 * 32 * 32 * 4

    def held(c):
        q, k, v = m.make_inputs(c)
        plan = m.pass_plan(m.differentiable(c.build), q, k, v, causal=c.causal, pass_=c.pass_, do=m.grad_output(c))
        return m.held_pass(plan.forward, torch.device("cpu"), plan.inputs)

    assert held(case(causal=True)) == P + 32 * 32  # the bool mask
    assert held(case(Hkv=1)) == P + 2 * (2 * 32 * 16 * 4)  # k and v repeated to 2 heads
    assert held(case("sdpa_math")) >= P


def test_our_builds_need_attnlab_builds_training_and_an_ablation_has_no_backward(monkeypatch):
    from attnlab.measure import differentiable

    if importlib.util.find_spec("attnlab.builds.training") is None:
        assert differentiable("torch_eager") is builds.get("torch_eager").attend
        with pytest.raises(builds.Unsupported, match="attnlab.builds.training is not installed"):
            differentiable("fused")
        assert m.measure(case("fused"), **FAST)["status"] == ("unsupported: fused has no backward here: "
                                                             "attnlab.builds.training is not installed")
    r = m.measure(case("fused-no_pv"), **FAST)
    assert r["status"].startswith("error: ValueError:") and "ablation" in r["status"] and math.isnan(r["ms"])
    with pytest.raises(ValueError, match="build must be one of"):
        differentiable("nope")


def test_where_attnlab_builds_training_is_installed_its_callables_are_measured(monkeypatch):
    """The seam: differentiable(name) is attnlab.builds.training.attend(name) whenever that module exists."""
    asked = []

    def attend(name):
        asked.append(name)
        return builds.get("torch_eager").attend  # a differentiable stand-in for our build's Function

    fake = types.ModuleType("attnlab.builds.training")
    fake.__spec__ = importlib.machinery.ModuleSpec("attnlab.builds.training", None)
    fake.attend = attend
    monkeypatch.setitem(sys.modules, "attnlab.builds.training", fake)
    monkeypatch.setattr(builds, "training", fake, raising=False)
    r = m.measure(case("fused"), **FAST)
    assert asked == ["fused"] and r["status"] == "ok" and r["held_bytes"] == 2 * 32 * 32 * 4
    assert r["tiles"] == ""  # the backward's kernels have tiles of their own, not the forward's


def fake_rule(monkeypatch):
    """attnlab.accuracy's rule for gradients stood in for (its interface: grad_refs, judge_grads): torch_eager's own
    float32 gradients as the reference, limit 1e-5."""
    def grad_refs(do, q, k, v, *, causal=False):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        return torch.autograd.grad(builds.get("torch_eager").attend(*leaves, causal=causal), leaves, do)

    def judge_grads(grads, refs):
        return {n: Verdict(rel_error(g, r.double()), 0.0, 1e-5, rel_error(g, r.double()) <= 1e-5)
                for n, g, r in zip(("dq", "dk", "dv"), grads, refs)}

    monkeypatch.setattr(accuracy, "grad_refs", grad_refs, raising=False)
    monkeypatch.setattr(accuracy, "judge_grads", judge_grads, raising=False)


def test_the_gradients_are_checked_on_the_gradient_nearest_its_limit(monkeypatch):
    fake_rule(monkeypatch)
    r = m.measure(case(causal=True, H=4, Hkv=2), **FAST)
    assert r["err"] < r["err_limit"] == 1e-5 and r["err_note"].startswith("err of d")
    real = m.differentiable

    def sloppy_dv(name):  # the same O, with dV 1 % too large and dQ, dK right
        attend = real(name)

        def call(q, k, v, *, causal=False):
            through_v = attend(q.detach(), k.detach(), v, causal=causal)
            return attend(q, k, v, causal=causal) + 0.01 * (through_v - through_v.detach())
        return call

    monkeypatch.setattr(m, "differentiable", sloppy_dv)
    r = m.measure(case(causal=True, H=4, Hkv=2), **FAST)
    assert r["status"] == "ok" and r["err"] > r["err_limit"]  # the time is real; the program is wrong
    assert r["err_note"].startswith("err of dv, the gradient nearest its limit; FAILS accuracy rule")
    # on a slice of the batch and heads: dK and dV of the k/v heads the kept query heads read
    sliced = m.measure(m.Case("torch_eager", 2, 4, 2, 32, 16, "float32", True, "cpu", "backward"),
                       ref_budget_bytes=2 * 2 * 32 * 32 * 8, **FAST)
    assert sliced["err_note"].startswith("reference on batch 0:1 of 2, heads 0:2 of 4; err of d")


def test_without_a_rule_for_gradients_the_row_says_they_were_not_checked(monkeypatch):
    monkeypatch.delattr(accuracy, "judge_grads", raising=False)
    r = m.measure(case(), **FAST)
    assert r["status"] == "ok" and math.isnan(r["err"])
    assert r["err_note"] == "gradients not checked: this checkout's attnlab.accuracy has no rule for them"


@pytest.mark.skipif(not hasattr(accuracy, "judge_grads"), reason="attnlab.accuracy has no rule for gradients yet")
def test_a_library_builds_gradients_pass_the_real_rule():
    r = m.measure(case(causal=True, H=4, Hkv=2), **FAST)
    assert r["status"] == "ok" and 0 <= r["err"] <= r["err_limit"], r["err_note"]


def test_the_benchmark_times_a_backward_alone_eagerly_with_what_its_forward_held(monkeypatch):
    from tests.test_pipeline import cuda_stand_ins

    captured = cuda_stand_ins(monkeypatch)
    monkeypatch.setattr(m, "cold_call", lambda fn, dev: (0.5, fn()))
    monkeypatch.setattr(m, "peak_pass", lambda fn, dev: (7.0, "", None))
    monkeypatch.setattr(m, "held_pass", lambda forward, dev, inputs: float(len(inputs)))
    q, k, v = m.make_inputs(case())
    out = m.time_case("torch_eager", q, k, v, False, repeats=2, pass_="backward")
    assert out["status"] == "ok" and captured == [] and out["timer"] == f"do_bench ({m.NOT_CAPTURED})"
    assert out["held_bytes"] == 4.0 and len(out["o"]) == 3  # q, k, v and dO excluded; the output is the gradients
    assert list(out)[:6] == ["cold_s", "ms", "ms_min", "ms_max", "status", "o"]  # a bench row's order
    assert not q.requires_grad  # the caller's inputs are left as they were
    fwd = m.time_case("torch_eager", q, k, v, False)
    assert len(captured) == 1 and "held_bytes" not in fwd  # a forward may be captured


# -- results files --------------------------------------------------------------------------------------------------

def test_a_file_without_the_pass_column_reads_as_forward_rows(tmp_path):
    df = sweep.run(TINY, tmp_path / "run", progress=False)
    old = df.drop(columns=list(schema.BEFORE_BACKWARD))
    old.to_csv(tmp_path / "run" / sweep.RESULTS, index=False)
    back = sweep.read_results(tmp_path / "run")
    assert list(back.columns) == list(schema.COLUMNS) and len(back) == len(df)
    assert (back["pass"] == "forward").all() and back["held_bytes"].isna().all()
    # a sweep never appends whole rows to it: the table says why (sweep.run refuses a resume with cases left)
    assert re.search(r"columns of another schema \(\['held_bytes', 'pass'\] differ\)", back.attrs[sweep.OLDER])


TINY = dict(device="cpu", dtype="float32", seq_lens=[16], head_dims=[16], causal=[False], batch_policy="fixed",
            batch=1, heads=2, builds=["torch_eager", "fused-no_pv"], warmup_ms=0.0, reps_ms=1.0, min_reps=2)


def test_a_sweep_measures_each_pass_and_its_reader_gives_the_forward_rows_unless_told(tmp_path):
    p = {**TINY, "passes": ["forward", "backward"]}
    cases = sweep.grid(sweep.validate(p), "cpu")
    assert [(c.build, c.pass_) for c in cases] == [("torch_eager", "forward"), ("torch_eager", "backward"),
                                                   ("fused-no_pv", "forward")]  # an ablation has no backward
    out = tmp_path / "run"
    df = sweep.run(p, out, progress=False)
    assert list(df["case_id"]) == [cases[0].case_id, cases[2].case_id] and (df["pass"] == "forward").all()
    every = sweep.read_results(out, passes=None)
    assert list(every["pass"]) == ["forward", "backward", "forward"] and (every["status"] == "ok").all()
    assert list(sweep.read_results(out, passes=["backward"])["case_id"]) == [cases[1].case_id]
    assert every.loc[1, "held_bytes"] == 2 * 16 * 16 * 4 and math.isnan(every.loc[0, "held_bytes"])
    sweep.run(p, out, progress=False)  # resumed: every pass's row is there, nothing is measured twice
    assert json.loads((out / sweep.PROVENANCE).read_text())["sessions"][1]["measured"] == 0
    with pytest.raises(sweep.ParamsError, match="params key 'passes': value 'sideways' must list passes of"):
        sweep.validate({**TINY, "passes": "sideways"})


def test_every_report_reads_the_forward_rows(tmp_path):
    """The same cases timed forward and backward: the report's tables take the forward rows; given every row they
    would meet two rows for one case."""
    from attnlab.report.text import render

    path = tmp_path / sweep.RESULTS
    for pass_ in ("forward", "backward"):
        for b, ms in (("materialised", 4.0), ("fused", 1.0)):
            sweep.append_row(path, row(b, ms=ms * (2.5 if pass_ == "backward" else 1), reps=3, hold_bytes=1,
                                       flops=1, bytes_moved=1, **{"pass": pass_}))
    forward = sweep.read_results(path)
    assert list(forward["ms"]) == [4.0, 1.0] and "speedup over materialised" in render(forward, "materialised")
    with pytest.raises(ValueError, match="two rows for"):
        render(sweep.read_results(path, passes=None), baseline="materialised")
    mixed = sweep.read_results(path, passes=None)
    assert list(schema.forward_rows(mixed)["pass"]) == ["forward", "forward"]
    assert len(schema.forward_rows(mixed.drop(columns=["pass"]))) == 4  # a table without the column: all forward


def test_a_run_whose_ours_ran_only_backward_teaches_no_forward_lesson(tmp_path):
    backward = write_run(tmp_path / "outputs" / "h200" / "bwd", started="2026-12-06T10:00:00+00:00",
                         **{"pass": "backward"})
    assert runs.reference_run(tmp_path / "outputs") is None
    forward = write_run(tmp_path / "outputs" / "h200" / "fwd")  # older, but with forward rows
    assert runs.reference_run(tmp_path / "outputs") == forward != backward
