"""The gradient gate as a user runs it (`attnlab check --grad`), on the CPU with Triton's interpreter: it passes the
builds' real gradients, fails a planted wrong one or an unwritten element, and keeps every other row."""
import pandas as pd
import pytest
import torch

from attnlab import cli, gate, grad_gate
from attnlab.triton import train_launch
from tests.conftest import out_of_memory_once

QUICK = ["--device", "cpu", "--quick", "--ns", "40", "--dtypes", "float32,bfloat16"]


def shapes(dtypes=("float32", "bfloat16")):
    return [c for c in gate.grid(torch.device("cpu"), quick=True, ns=(40,)) if c.dtype in dtypes]


def test_the_gate_passes_real_gradients_and_writes_a_row_per_gradient(tmp_path, capsys):
    out = tmp_path / "grad.csv"
    code = cli.main(["check", "--grad", *QUICK, "--builds", "materialised,qk_softmax,torch_eager", "--out", str(out)])
    rows = pd.read_csv(out)
    assert code == 0
    assert len(rows) == 3 * 3 * len(shapes())  # (build, shape, gradient)
    assert set(rows.grad) == {"dq", "dk", "dv"} and set(rows.dtype) == {"float32", "bfloat16"}
    assert (rows.status == "ok").all() and (rows.err <= rows.limit).all() and (rows.unwritten == 0).all()
    assert f"grad gate: {len(rows)} passed, 0 failed" in capsys.readouterr().out


def planted(change):
    """qk_softmax's backward with `change` applied to its (dq, dk, dv)."""
    real = train_launch.qk_softmax_backward

    def backward(*args, **kw):
        return change(real(*args, **kw))
    return backward


def one_too_big(grads):  # dK 1 % too large: an error of 1e-2 against fp32's limit of 1e-5
    dq, dk, dv = grads
    return dq, dk.mul_(1.01), dv


def one_unwritten(grads):  # one element of dV left as the NaN the gate filled it with
    dq, dk, dv = grads
    dv[0, 0, -1, 0] = float("nan")
    return dq, dk, dv


@pytest.mark.parametrize("change, bad", [(one_too_big, "dk"), (one_unwritten, "dv")])
def test_a_planted_wrong_gradient_fails_the_gate_and_keeps_the_other_rows(change, bad, monkeypatch, tmp_path,
                                                                           capsys):
    monkeypatch.setattr(train_launch, "qk_softmax_backward", planted(change))
    out = tmp_path / "grad.csv"
    code = grad_gate.main([*QUICK, "--dtypes", "float32", "--builds", "qk_softmax,materialised", "--out", str(out)])
    rows = pd.read_csv(out)
    assert code == 1
    failed = rows[rows.status == "FAIL"]
    assert set(failed.build) == {"qk_softmax"} and set(failed.grad) == {bad}
    assert len(failed) == len(shapes(("float32",)))
    assert (rows[rows.status != "FAIL"].status == "ok").all() and len(rows) == 2 * 3 * len(shapes(("float32",)))
    assert f"FAIL qk_softmax {bad}" in capsys.readouterr().out


def test_a_build_that_raises_fails_its_rows_only(monkeypatch, tmp_path):
    def broken(*args, **kw):
        raise RuntimeError("kernel fell over")

    monkeypatch.setattr(train_launch, "materialised_backward", broken)
    out = tmp_path / "grad.csv"
    assert grad_gate.main([*QUICK, "--dtypes", "float32", "--builds", "materialised,torch_eager", "--out",
                           str(out)]) == 1
    rows = pd.read_csv(out)
    assert (rows[rows.build == "materialised"].status == "FAIL: RuntimeError: kernel fell over").all()
    assert (rows[rows.build == "torch_eager"].status == "ok").all()


def test_an_oracle_out_of_memory_skips_its_shape_and_the_process_goes_on(monkeypatch, tmp_path, capsys):
    """The fp64 oracle of one shape not fitting (processes of --jobs sharing a card) makes that shape's rows "oom",
    skipped and saying why; the shapes after it are still judged, and nothing counts as passed unjudged."""
    from attnlab import accuracy

    calls = out_of_memory_once(monkeypatch, accuracy, "grad_refs")
    out = tmp_path / "grad.csv"
    assert grad_gate.main([*QUICK, "--dtypes", "float32", "--builds", "fused,torch_eager", "--out", str(out)]) == 0
    rows = pd.read_csv(out)
    first = rows[rows["shape"] == rows["shape"].min()]
    assert len(first) == 6 and (first.status == "oom: the fp64 oracle").all() and first.err.isna().all()
    rest = rows[rows["shape"] != rows["shape"].min()]
    assert len(calls) > 1 and len(rest) == 6 * (len(calls) - 1) and (rest.status == "ok").all()
    assert f"{len(rest)} passed, 0 failed, 6 skipped" in capsys.readouterr().out


@pytest.mark.parametrize("builds", ["fused-no_pv", "nope"])
def test_a_build_without_a_backward_is_a_usage_error(builds, capsys):
    assert grad_gate.main(["--device", "cpu", "--quick", "--builds", builds]) == 2
    assert "--builds" in capsys.readouterr().err
