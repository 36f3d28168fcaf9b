"""The command line: sweep, check and bench delegation, run, --help on each, and bad params as one line + exit 2."""
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml

from attnlab import cli, sweep

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(device="cpu", dtype="float32", seq_lens=[32], head_dims=[16], causal=[False, True],
            batch_policy="fixed", batch=1, heads=2, builds=["fused", "torch_eager"], warmup_ms=0, reps_ms=1,
            min_reps=2)


def params_file(tmp_path, **change) -> Path:
    path = tmp_path / f"params{len(list(tmp_path.glob('params*.yaml')))}.yaml"  # a new file each call
    path.write_text(yaml.safe_dump({**TINY, **change}))
    return path


def test_sweep_writes_results_and_says_where(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["sweep", "--params", str(params_file(tmp_path)), "--out", str(out), "--quiet"]) == 0
    assert f"attnlab: 4 rows in {out}/results.csv" in capsys.readouterr().out
    df = sweep.read_results(out)
    assert len(df) == 4 and (df["status"] == "ok").all()


def test_out_flag_wins_over_the_params_out_dir(tmp_path):
    p = params_file(tmp_path, out_dir=str(tmp_path / "from_params"))
    assert cli.main(["sweep", "--params", str(p), "--out", str(tmp_path / "from_flag"), "--quiet"]) == 0
    assert (tmp_path / "from_flag" / "results.csv").exists() and not (tmp_path / "from_params").exists()


def bad_cases(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("seq_lens: [64\nbuilds: fused\n")
    return [
        (params_file(tmp_path, colour="red"), None, "params key 'colour': value 'red' is not a params key"),
        (params_file(tmp_path, builds=["fused", "nope"]), None, "params key 'builds': value 'nope' is not a build"),
        (params_file(tmp_path, seq_lens=[-1]), None, "params key 'seq_lens': value -1 must be > 0"),
        (params_file(tmp_path, dtype="float64"), None, "params key 'dtype': value 'float64' must be one of"),
        (tmp_path / "missing.yaml", None, "argument --params: no such file: '"),  # refused by the parser
        (malformed, None, "params file '"),
        (params_file(tmp_path), a_file, f"argument --out: '{a_file}' is a file, not a directory"),
    ]


def test_bad_params_give_one_line_exit_2_and_write_nothing(tmp_path, capsys):
    for params, out, message in bad_cases(tmp_path):
        target = out or tmp_path / "never"
        code = cli.main(["sweep", "--params", str(params), "--out", str(target)])
        err = capsys.readouterr().err
        assert code == 2, message
        prefix = "attnlab sweep: error: " if message.startswith("argument") else "attnlab: error: "
        assert err.startswith(prefix + message), err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert not (tmp_path / "never").exists()
        assert not out or out.read_text() == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_device_this_machine_lacks(tmp_path, capsys):
    code = cli.main(["sweep", "--params", str(params_file(tmp_path, device="cuda")), "--out", str(tmp_path / "n")])
    assert code == 2 and capsys.readouterr().err.startswith("attnlab: error: params key 'device': value 'cuda'")
    assert not (tmp_path / "n").exists()


def test_the_console_entry_prints_no_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-m", "attnlab.cli", "sweep", "--params",
                        str(params_file(tmp_path, seq_lens=[0])), "--out", str(tmp_path / "n")],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "attnlab: error: params key 'seq_lens': value 0 must be > 0\n"
    assert not (tmp_path / "n").exists()


@pytest.mark.parametrize("argv, says", [
    (["run", "--out", "{file}"], "attnlab run: error: argument --out: '{file}' is a file, not a directory"),
    (["sweep", "--params", "{tmp}/nope.yaml"], "attnlab sweep: error: argument --params: no such file"),
    (["sweep", "--params", "{params}", "--out", "{file}"], "attnlab sweep: error: argument --out: '{file}' is a file"),
    (["report", "{tmp}/nope"], "attnlab report: error: argument DIR: no such directory"),
    (["report", "{tmp}", "--baseline", "fastest"], "attnlab report: error: argument --baseline: invalid choice"),
    (["check", "--device", "tpu"], "attnlab check: error: argument --device: must be one of auto, cpu, cuda or cuda:N"),
    (["check", "--ns", "abc"], "attnlab check: error: argument --ns: expected whole numbers >= 1"),
    (["check", "--tiles", "{tmp}/missing.json"], "attnlab check: error: argument --tiles: no such file"),
    (["bench", "--ns", "0"], "attnlab bench: error: argument --ns: expected whole numbers >= 1"),
    (["bench", "--dtypes", "float8"], "attnlab bench: error: argument --dtypes: expected dtypes from"),
    (["bench", "--builds", "fused,fastest"], "attnlab bench: error: argument --builds: expected builds from"),
    (["bench", "--out", "{file}"], "attnlab bench: error: argument --out: '{file}' is a file"),
    (["bench", "--tiles", "{tmp}/missing.json"], "attnlab bench: error: argument --tiles: no such file"),
])
def test_every_command_refuses_a_bad_argument_in_one_line_before_any_work(tmp_path, monkeypatch, capsys, argv, says):
    """The gate, a sweep or a bench never starts on a bad argument: one line naming it, exit 2, nothing written."""
    import importlib

    afile = tmp_path / "a-file"
    afile.write_text("")
    fill = dict(file=str(afile), tmp=str(tmp_path), params=str(params_file(tmp_path)))
    started = []
    gate = importlib.import_module("attnlab.gate")
    monkeypatch.setattr(gate, "check_case", lambda *a, **k: started.append("gate") or [])
    monkeypatch.setattr(sweep, "run", lambda *a, **k: started.append("sweep"))
    code = cli.main([a.format(**fill) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and started == []
    assert err.startswith(says.format(**fill)) and err.count("\n") == 1, err
    assert {p.name for p in tmp_path.iterdir()} == {"a-file", "params0.yaml"}  # no results, no report


def test_usage_errors_exit_2(capsys):
    assert cli.main(["sweep"]) == 2  # --params is required
    assert "--params" in capsys.readouterr().err
    assert cli.main(["frobnicate"]) == 2
    assert cli.main([]) == 2


@pytest.mark.parametrize("argv, expected", [
    (["--help"], ["sweep", "check", "bench", "run"]),
    (["sweep", "--help"], ["--params", "--out"]),
    (["run", "--help"], ["gate", "h200.yaml", "gpu.yaml", "cpu.yaml"]),
])
def test_help(capsys, argv, expected):
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: attnlab") and all(word in out for word in expected)


def fake_module(monkeypatch, name, code=0):
    got = []
    module = types.ModuleType(name)
    module.main = lambda argv: got.append(list(argv)) or code
    monkeypatch.setitem(sys.modules, name, module)
    return got


@pytest.mark.parametrize("command, module", [("check", "attnlab.gate"), ("bench", "attnlab.bench")])
def test_check_and_bench_delegate_every_argument(monkeypatch, command, module):
    got = fake_module(monkeypatch, module, code=3)
    assert cli.main([command, "--ns", "64", "--out", "x.csv"]) == 3
    assert cli.main([command, "--help"]) == 3  # their own --help
    assert got == [["--ns", "64", "--out", "x.csv"], ["--help"]]


def test_a_missing_delegate_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "attnlab.bench", None)  # as if bench.py were not in the checkout
    assert cli.main(["bench"]) == 2
    assert capsys.readouterr().err == ("attnlab: error: attnlab.bench is not in this checkout, so `attnlab bench` "
                                       "cannot run\n")


def fake_render(monkeypatch, code=0, message="rendered"):
    from attnlab import render

    calls = []

    def render_(params, out=None, *, timeout=None, **kw):
        calls.append((Path(params), out, timeout))
        return render.Rendered(code, Path(out or "outputs/cpu/x"), Path("nb.ipynb"), None, message)

    monkeypatch.setattr(render, "render", render_)
    return calls


def test_run_renders_the_walkthrough_with_the_params_for_this_device(monkeypatch, capsys):
    calls = fake_render(monkeypatch, message="attention_lab.ipynb rendered into outputs/cpu/x")
    assert cli.main(["run"]) == 0
    expected, why = cli.params_for(torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    assert calls == [(expected, None, None)] and expected.exists()  # None: a new outputs/<device>/<time>/
    out = capsys.readouterr().out
    assert f"attnlab: {why}" in out and "attnlab: attention_lab.ipynb rendered into outputs/cpu/x" in out


def test_run_takes_a_params_file_an_out_folder_and_a_cell_timeout(monkeypatch, tmp_path):
    calls = fake_render(monkeypatch)
    p = params_file(tmp_path)
    assert cli.main(["run", "--params", str(p), "--out", str(tmp_path / "o"), "--timeout", "30"]) == 0
    assert calls == [(p, str(tmp_path / "o"), 30.0)]


def test_a_failed_render_exits_with_its_code_and_says_which_cell(monkeypatch, capsys):
    fake_render(monkeypatch, code=124, message="cell 14 ('results = lab.sweep_run(run)') timed out")
    assert cli.main(["run"]) == 124
    assert "timed out" in capsys.readouterr().err


def test_run_with_bad_params_is_one_line(tmp_path, capsys):
    assert cli.main(["run", "--params", str(params_file(tmp_path, seq_lens=[0])), "--out", str(tmp_path / "n")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error: params key 'seq_lens': value 0 must be > 0") and err.count("\n") == 1
    assert not (tmp_path / "n").exists()


def test_run_gpus_renders_once_per_gpu(monkeypatch, tmp_path, capsys):
    from attnlab import render

    got = []
    monkeypatch.setattr(render, "render_gpus", lambda params, gpus, timeout=None: got.append((Path(params), gpus))
                        or (0, [], ["GPU 0: rendered into a", "GPU 1: rendered into b"]))
    p = params_file(tmp_path)
    assert cli.main(["run", "--params", str(p), "--gpus", "0,1"]) == 0
    assert got == [(p, [0, 1])]
    assert "attnlab: GPU 1: rendered into b" in capsys.readouterr().out
    assert cli.main(["run", "--params", str(p), "--gpus", "0,x"]) == 2
    assert "argument --gpus: expected whole numbers >= 0, comma-separated" in capsys.readouterr().err
    assert cli.main(["run", "--params", str(p), "--gpus", "0", "--out", "d"]) == 2
    assert got == [(p, [0, 1])]


@pytest.mark.parametrize("name, file", [(None, "cpu.yaml"), ("NVIDIA H200", "h200.yaml"),
                                        ("NVIDIA H200 NVL", "h200.yaml"), ("NVIDIA A100-SXM4-80GB", "a100.yaml"),
                                        ("NVIDIA H100 80GB HBM3", "h100.yaml"), ("Tesla T4", "t4.yaml"),
                                        ("NVIDIA GeForce RTX 4090", "gpu.yaml")])
def test_run_picks_the_params_named_for_the_gpu(name, file):
    path, why = cli.params_for(name)
    assert path == ROOT / "params" / file and path.exists()
    assert (name or "no CUDA GPU") in why


def test_a_new_params_file_is_found_by_the_gpu_name(tmp_path):
    for f in ("cpu.yaml", "gpu.yaml", "h200.yaml", "a100.yaml"):
        (tmp_path / f).write_text("")
    assert cli.params_for("NVIDIA A100-SXM4-80GB", tmp_path)[0] == tmp_path / "a100.yaml"
    assert cli.params_for("NVIDIA H100 80GB HBM3", tmp_path)[0] == tmp_path / "gpu.yaml"


def test_train_renders_the_training_notebook_with_the_training_params_for_this_device(monkeypatch, tmp_path, capsys):
    from attnlab import render, train_lab

    calls = []
    monkeypatch.setattr(train_lab, "render_notebook", lambda params, out, timeout=None: calls.append(
        (Path(params), out, timeout)) or render.Rendered(0, tmp_path, tmp_path / "n.ipynb", None, "rendered"))
    assert cli.main(["train"]) == 0
    expected, why = cli.params_for(torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                                   cli.PARAMS / "training")
    assert calls == [(expected, None, None)] and expected.exists() and expected.parent.name == "training"
    assert f"attnlab: {why}" in capsys.readouterr().out and "params/training/" in why
    p = params_file(tmp_path)
    assert cli.main(["train", "--params", str(p), "--out", str(tmp_path / "o"), "--timeout", "30"]) == 0
    assert calls[-1] == (p, str(tmp_path / "o"), 30.0)


@pytest.mark.parametrize("name, file", [(None, "cpu.yaml"), ("NVIDIA H100 80GB HBM3", "h100.yaml"),
                                        ("NVIDIA H200", "h200.yaml"), ("NVIDIA GeForce RTX 4090", "gpu.yaml")])
def test_every_training_params_file_the_command_picks_exists_and_validates(name, file):
    from attnlab import train_sweep

    path, why = cli.params_for(name, cli.PARAMS / "training")
    assert path == ROOT / "params" / "training" / file and f"params/training/{file}" in why
    assert train_sweep.load_params(path)["passes"] == ["forward", "backward", "forward+backward"]


def test_default_out_dir_is_outputs_device_timestamp():
    out = sweep.default_out_dir("cpu")
    assert out.parts[:2] == ("outputs", "cpu") and re.fullmatch(r"\d{8}-\d{6}", out.parts[2])


def test_an_interrupted_sweep_exits_130_and_says_how_to_resume(tmp_path, monkeypatch, capsys):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run", interrupted)
    assert cli.main(["sweep", "--params", str(params_file(tmp_path))]) == 130
    assert "resume" in capsys.readouterr().err


def test_params_file_names_match_the_model_in_any_case_and_never_a_vendor_word(tmp_path):
    for f in ("cpu.yaml", "gpu.yaml", "nvidia.yaml", "H100.yaml"):
        (tmp_path / f).write_text("")
    assert cli.params_for("NVIDIA H100 80GB HBM3", tmp_path)[0] == tmp_path / "H100.yaml"
    assert cli.params_for("NVIDIA A10", tmp_path)[0] == tmp_path / "gpu.yaml"  # not nvidia.yaml


def test_a_real_sweep_renders_with_report_even_where_n_equals_d(tmp_path, capsys):
    """As a user meets it: a CPU sweep, then `attnlab report` on its directory. params/cpu.yaml has N = D = 64,
    where the S step predicts no memory saving (S is the size of O); the table says so instead of dividing by 0."""
    out = tmp_path / "out"
    p = params_file(tmp_path, seq_lens=[16, 32], head_dims=[16], causal=[False], builds=["ours"])
    assert cli.main(["sweep", "--params", str(p), "--out", str(out), "--quiet"]) == 0
    assert cli.main(["report", str(out)]) == 0
    tables = (out / "tables.txt").read_text()
    assert tables in capsys.readouterr().out  # `attnlab report` prints them; `attnlab run` names the files
    assert "no saving predicted at B=1 H=2 N=16 D=16" in tables
    assert (out / "figures.html").exists()

