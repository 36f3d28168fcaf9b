"""scripts/device.sh, the GPU machine's named steps, run here with a stand-in python3 that records what it is asked to
run: the steps its usage names exist, each runs the command it says under a timeout with its log under $OUT, an
unknown step or a failing one stops the script, and more files than the device tool brings back go in one tar."""
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device.sh"
STAND_IN = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
[ "$1" = -c ] && echo 6  # the gate's process count, gate.default_jobs()
case " $* " in *" ${FAIL_ON:-@none@} "*) echo "failed as asked" >&2; exit 3 ;; esac
exit 0
"""


def usage_steps() -> list[str]:
    """The step names the script's header lists under 'Steps:'."""
    head = SCRIPT.read_text().split("# Steps:\n", 1)[1].split("\n#\n", 1)[0]
    return re.findall(r"^#   (\w+) {2,}", head, flags=re.M)


@pytest.fixture
def checkout(tmp_path):
    """A copy of the script in a checkout of its own (it runs from its checkout's root) and a PATH whose python3 is
    the stand-in; returns a function that runs the script there and gives back (result, calls)."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "scripts" / "device.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(STAND_IN)
    (bin_dir / "python3").chmod(0o755)
    calls = tmp_path / "calls.txt"

    def run(steps=None, out=None, **env):
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(calls), **env}
        if steps is not None:
            env["STEPS"] = steps
        if out is not None:
            env["OUT"] = str(out)
        r = subprocess.run(["bash", str(root / "scripts" / "device.sh")], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
        return r, calls.read_text().splitlines() if calls.exists() else []

    run.root = root
    return run


def test_the_script_parses_and_every_step_its_usage_names_is_defined_and_accepted():
    text = SCRIPT.read_text()
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    named = usage_steps()
    assert named == ["run", "gate", "bench", "selfcheck", "autotune", "model", "train", "pages"]
    assert re.search(r'^STEP_NAMES="([^"]*)"', text, flags=re.M).group(1).split() == named
    defined = set(re.findall(r"^(\w+)\(\) \{", text, flags=re.M))
    assert set(named) <= defined


def test_each_step_runs_its_command_with_its_log_under_out(checkout, tmp_path):
    out = tmp_path / "out"
    r, calls = checkout("run gate bench selfcheck autotune", out)
    assert r.returncode == 0, r.stdout + r.stderr
    commands = [c for c in calls if not c.startswith("-c ")]
    assert commands == [
        f"-m attnlab.cli run --out {out}/run",
        f"-m attnlab.cli check --jobs 6 --out {out}/gate.csv",
        f"-m attnlab.cli check --ns 1001,2999 --dtypes bfloat16,float16 --builds materialised,qk_softmax,"
        f"qk_softmax-no_pv,materialised-no_pv,qk_softmax-zero_mask,qk_softmax-no_softmax --jobs 6 "
        f"--out {out}/gate_ragged.csv",
        f"-m attnlab.cli bench --dtypes bfloat16,float16 --out {out}/bench",
        f"-m attnlab.selfcheck --out {out}/selfcheck.csv",
        f"-m attnlab.cli bench --autotune --out {out}/autotune"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["run.log", "gate.log", "gate_ragged.log", "bench.log", "selfcheck.log", "autotune.log"])
    for name in ("run", "gate", "gate_ragged", "bench", "selfcheck", "autotune"):
        assert f"{name}: rc=0" in r.stdout


def test_the_default_step_is_the_lab_run_and_extra_arguments_reach_the_bench(checkout, tmp_path):
    _, calls = checkout(out=tmp_path / "out")
    assert calls == [f"-m attnlab.cli run --out {tmp_path}/out/run"]
    _, calls = checkout("bench", tmp_path / "out2", BENCH_ARGS="--repeats 3 --quick")
    assert calls[-1] == (f"-m attnlab.cli bench --dtypes bfloat16,float16 --repeats 3 --quick "
                         f"--out {tmp_path}/out2/bench")


def test_the_model_step_sweeps_then_renders_the_notebook_over_the_same_folder(checkout, tmp_path):
    r, calls = checkout("model", tmp_path / "out")
    assert r.returncode == 0, r.stdout + r.stderr
    assert calls == [f"-m attnlab.model_sweep --params params/model/h200.yaml --out {tmp_path}/out/model",
                     f"-m attnlab.model_lab --params params/model/h200.yaml --out {tmp_path}/out/model"]
    r, calls = checkout("model", tmp_path / "out2", MODEL_PARAMS="params/model/cpu.yaml", FAIL_ON="attnlab.model_sweep")
    assert r.returncode == 3 and calls[-1].startswith("-m attnlab.model_sweep --params params/model/cpu.yaml")


def test_the_train_step_sweeps_then_renders_the_notebook_over_the_same_folder(checkout, tmp_path):
    r, calls = checkout("train", tmp_path / "out", TRAIN_PARAMS="params/training/h100.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert calls == [f"-m attnlab.train_sweep --params params/training/h100.yaml --out {tmp_path}/out/train",
                     f"-m attnlab.cli train --params params/training/h100.yaml --out {tmp_path}/out/train"]
    _, calls = checkout("train", tmp_path / "out2")  # no TRAIN_PARAMS: the file attnlab train picks here
    assert calls[-3].startswith("-c ") and "params_here" in calls[-3]
    assert calls[-2] == f"-m attnlab.train_sweep --params 6 --out {tmp_path}/out2/train"  # the stand-in printed 6
    r, calls = checkout("train", tmp_path / "out3", TRAIN_PARAMS="p.yaml", FAIL_ON="attnlab.train_sweep")
    assert r.returncode == 3 and calls[-1].startswith("-m attnlab.train_sweep --params p.yaml")


def test_the_pages_step_renders_each_walkthrough_of_record_again_over_a_copy_of_its_rows(checkout, tmp_path):
    """Every folder holding a rendered walkthrough, its params and its rows is copied (rows, gate, provenance, params:
    never the page) and rendered there; a folder without a page is not a walkthrough of record. (The stand-in prints
    the same word for the card's name and every provenance's device, so each walkthrough here counts as this
    card's.)"""
    outputs = checkout.root / "outputs" / "card"
    for name, files in (("walk", ["attention_lab.ipynb", "params.yaml", "results.csv", "gate.csv", "provenance.json",
                                  "tables.txt"]),
                        ("model", ["model_results.csv", "model_params.yaml", "model_provenance.json"])):
        (outputs / name).mkdir(parents=True)
        for f in files:
            (outputs / name / f).write_text(f"{name}/{f}\n")
    out = tmp_path / "out"
    r, calls = checkout("pages", out)
    assert r.returncode == 0, r.stdout + r.stderr
    commands = [c for c in calls if not c.startswith("-c ")]
    assert commands == [f"-m attnlab.cli run --params {out}/pages/walk/params.yaml --out {out}/pages/walk"]
    copied = out / "pages" / "walk"
    assert sorted(p.name for p in copied.iterdir()) == ["gate.csv", "params.yaml", "provenance.json", "results.csv"]
    assert (copied / "results.csv").read_text() == "walk/results.csv\n"
    assert "page_walk: rc=0" in r.stdout and (out / "page_walk.log").exists()


def test_an_unknown_step_is_refused_before_anything_runs(checkout, tmp_path):
    r, calls = checkout("gate benhc", tmp_path / "out")
    assert r.returncode == 2 and calls == []
    assert "unknown step 'benhc'" in r.stderr and "run gate bench selfcheck autotune model train" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_failing_step_stops_the_ones_after_it_with_its_status(checkout, tmp_path):
    r, calls = checkout("selfcheck bench run", tmp_path / "out", FAIL_ON="bench")
    assert r.returncode == 3
    assert [c.split()[1] for c in calls] == ["attnlab.selfcheck", "attnlab.cli"]  # run never started
    assert "bench: rc=3" in r.stdout and "step bench failed" in r.stdout
    assert "failed as asked" in (tmp_path / "out" / "bench.log").read_text()
    before = len(calls)
    r, calls = checkout("gate bench", tmp_path / "out2", FAIL_ON="check")  # the whole gate fails: no ragged one
    assert r.returncode == 3 and calls[before].startswith("-c ")
    assert calls[before + 1:] == [f"-m attnlab.cli check --jobs 6 --out {tmp_path}/out2/gate.csv"]


def test_a_step_past_its_timeout_is_stopped_and_says_so(checkout, tmp_path):
    slow = checkout.root.parent / "bin" / "python3"
    slow.write_text(STAND_IN.replace("exit 0\n", "exec sleep 30\n"))
    r, _ = checkout("selfcheck", tmp_path / "out", SELFCHECK_TIMEOUT="1")
    assert r.returncode == 124 and "selfcheck: rc=124" in r.stdout and "timed out at 1 s" in r.stdout


def test_wheels_in_whl_are_installed_first_and_on_the_path(checkout, tmp_path):
    (checkout.root / ".whl").mkdir()
    (checkout.root / ".whl" / "plotly-6.0.0-py3-none-any.whl").write_bytes(b"")
    r, calls = checkout("selfcheck", tmp_path / "out")
    assert r.returncode == 0
    assert calls[0].startswith("-m pip install -q --no-index --no-deps") and "--target /tmp/site" in calls[0]
    assert calls[0].endswith(".whl/plotly-6.0.0-py3-none-any.whl")


def test_more_files_than_the_device_tool_returns_go_back_in_one_tar(checkout, tmp_path):
    out = tmp_path / "out"
    (out / "a" / "b" / "c").mkdir(parents=True)
    (out / "a" / "b" / "c" / "deep.txt").write_text("3 folders down")  # too deep to come back alone
    r, _ = checkout("selfcheck", out)
    assert r.returncode == 0 and [p.name for p in out.iterdir()] == ["bundle.tgz"]
    with tarfile.open(out / "bundle.tgz", "r:gz") as t:
        assert {"./selfcheck.log", "./a/b/c/deep.txt"} <= set(t.getnames())
    few = tmp_path / "few"
    checkout("selfcheck", few)
    assert [p.name for p in few.iterdir()] == ["selfcheck.log"]  # within the limits: left as it is
