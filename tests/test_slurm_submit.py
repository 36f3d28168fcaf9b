"""`attnlab slurm` without a cluster: the sbatch command lines the submitter builds (a stand-in sbatch on PATH records
its argv), each bad argument refused in one line before anything is written or submitted, the job script's choice of
params file and run folder, and a run folder named for the device the render finds. tests/test_slurm.py drives a
real one-node Slurm."""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from attnlab import cli, provenance, render, slurm, sweep

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(device="cpu", dtype="float32", seq_lens=[16], head_dims=[16], causal=[False], batch_policy="fixed",
            batch=1, heads=2, builds=["fused"], warmup_ms=0, reps_ms=1, min_reps=1)
STAMP = r"\d{8}-\d{6}"


@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch):
    """An `sbatch` first on PATH that appends its argv to a log (one JSON list a line) and prints a job id, 100 for
    its first call, 101 for the next; FAKE_SBATCH_FAIL makes it refuse as sbatch does, from its call number
    FAKE_SBATCH_FAIL_AT on (default 0, the first)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    script = bin_dir / "sbatch"
    script.write_text(f"""#!{sys.executable}
import json, os, sys
log = {str(log)!r}
calls = open(log).read().splitlines() if os.path.exists(log) else []
with open(log, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if os.environ.get("FAKE_SBATCH_FAIL") and len(calls) >= int(os.environ.get("FAKE_SBATCH_FAIL_AT", "0")):
    sys.exit("sbatch: error: " + os.environ["FAKE_SBATCH_FAIL"])
print(100 + len(calls))
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def params_file(tmp_path, name="tiny.yaml", **change) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({**TINY, **change}))
    return path


def common(logs: Path, log_name: str) -> list[str]:
    return [f"--chdir={provenance.REPO}", f"--output={logs / log_name}", f"--export=ALL,ATTNLAB_PYTHON={sys.executable}"]


def test_submit_builds_the_array_and_the_comparison_after_it(tmp_path, fake_sbatch, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, b = params_file(tmp_path, "a.yaml"), params_file(tmp_path, "b.yaml", seq_lens=[32])
    out = tmp_path / "outputs"
    assert cli.main(["slurm", "submit", "a.yaml", "b.yaml", "--outputs", str(out), "--",
                     "--partition=debug", "--time=30"]) == 0
    array, comparison = fake_sbatch()
    stamp = array[array.index(str(slurm.RENDER_JOB)) + 2]
    assert array == ["--parsable", "--array=0-1", *common(out / "slurm", f"{stamp}-%A-%a.log"), "--partition=debug",
                     "--time=30", str(slurm.RENDER_JOB), str(out), stamp, str(a), str(b)]  # no GPU asked: cpu params
    assert comparison == ["--parsable", "--dependency=afterok:100", "--kill-on-invalid-dep=yes",
                          *common(out / "slurm", f"{stamp}-100-compare-%j.log"), "--partition=debug", "--time=30",
                          str(slurm.COMPARE_JOB), str(out), f"{stamp}-100"]
    printed = capsys.readouterr().out
    assert "the render array is job 100: 2 task(s)" in printed and "the comparison is job 101" in printed
    assert f"task 0: a.yaml -> outputs/<device>/{stamp}-100-0" in printed
    assert f"task 1: b.yaml -> outputs/<device>/{stamp}-100-1" in printed
    assert f"-> outputs/compare/{stamp}-100" in printed
    assert f"attnlab slurm resume outputs/<device>/{stamp}-100-<task>" in printed
    assert sorted(p.name for p in out.iterdir()) == ["slurm"]  # the logs' folder, made for sbatch; runs come later


@pytest.mark.parametrize("device, asks", [("cpu", []), ("auto", ["--gres=gpu:1"]), ("cuda", ["--gres=gpu:1"]),
                                          ("cuda:0", ["--gres=gpu:1"])])
def test_a_task_asks_for_one_gpu_unless_every_params_file_runs_on_the_cpu(tmp_path, fake_sbatch, device, asks):
    cpu, other = params_file(tmp_path, "cpu.yaml"), params_file(tmp_path, "other.yaml", device=device)
    slurm.submit([str(cpu), str(other)], tmp_path / "out")
    array = fake_sbatch()[0]
    assert [a for a in array if a.startswith("--gres")] == asks
    assert "--gres=gpu:1" not in fake_sbatch()[1]  # the comparison needs no GPU


BAD = [
    ([], "attnlab slurm submit: error: an array of zero tasks: give at least one params file"),
    (["{tmp}/nope.yaml"], "attnlab slurm submit: error: argument PARAMS: no such file: '{tmp}/nope.yaml'"),
    (["{bad}"], "attnlab slurm submit: error: params key 'seq_lens': value 0 must be > 0"),
    (["{indexed}"], "attnlab slurm submit: error: params file '{indexed}': device 'cuda:1' names a GPU index, but a "
                    "task sees only the GPU the scheduler gave it, as cuda:0"),
    (["{good}", "--outputs", "{file}/outputs"], "attnlab slurm submit: error: the outputs folder '{file}/outputs' "
                                                "cannot be created: '{file}' is a file"),
    (["{good}", "--outputs", "{file}"], "attnlab slurm submit: error: the outputs folder '{file}' is a file, not a "
                                        "directory"),
]


@pytest.mark.parametrize("argv, says", BAD)
def test_bad_input_is_one_line_before_anything_is_written_or_submitted(tmp_path, fake_sbatch, capsys, argv, says):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    fill = dict(tmp=str(tmp_path), file=str(a_file), good=str(params_file(tmp_path, "good.yaml")),
                bad=str(params_file(tmp_path, "bad.yaml", seq_lens=[0])),
                indexed=str(params_file(tmp_path, "indexed.yaml", device="cuda:1")))
    argv = [a.format(**fill) for a in argv]
    if "--outputs" not in argv:
        argv += ["--outputs", str(tmp_path / "outputs")]
    assert cli.main(["slurm", "submit", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(says.format(**fill)) and err.count("\n") == 1, err
    assert fake_sbatch() == [] and not (tmp_path / "outputs").exists() and a_file.read_text() == ""


def test_no_sbatch_on_path_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # a folder without sbatch
    assert slurm.main(["submit", str(params_file(tmp_path)), "--outputs", str(tmp_path / "outputs")]) == 2
    assert capsys.readouterr().err == ("attnlab slurm submit: error: sbatch is not on PATH: run this on a machine "
                                       "that submits to the cluster (a login node), with Slurm's commands on PATH\n")
    assert not (tmp_path / "outputs").exists()


def test_a_refusing_sbatch_is_one_line_and_exit_1(tmp_path, fake_sbatch, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_SBATCH_FAIL", "invalid partition specified: gpu")
    assert slurm.main(["submit", str(params_file(tmp_path)), "--outputs", str(tmp_path / "o"), "--", "-p", "gpu"]) == 1
    assert capsys.readouterr().err == ("attnlab slurm submit: error: sbatch exited 1: sbatch: error: invalid "
                                       "partition specified: gpu\n")
    assert len(fake_sbatch()) == 1  # no comparison submitted after a failed array


def test_an_array_whose_comparison_sbatch_refuses_says_which_job_was_submitted(tmp_path, fake_sbatch, monkeypatch,
                                                                               capsys):
    monkeypatch.setenv("FAKE_SBATCH_FAIL", "Batch job submission failed: Job dependency problem")
    monkeypatch.setenv("FAKE_SBATCH_FAIL_AT", "1")
    assert slurm.main(["submit", str(params_file(tmp_path)), "--outputs", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == ("attnlab slurm submit: error: the render array is job 100, but its comparison "
                                       "was not submitted: sbatch exited 1: sbatch: error: Batch job submission "
                                       "failed: Job dependency problem\n")
    assert len(fake_sbatch()) == 2


def task_folder(outputs: Path, name: str, device="cpu", **params) -> Path:
    folder = outputs / device / name
    folder.mkdir(parents=True)
    (folder / "params.yaml").write_text(yaml.safe_dump({**TINY, **params}))
    return folder


def test_resume_resubmits_each_folder_alone_then_the_comparison_of_its_array(tmp_path, fake_sbatch, capsys):
    out = tmp_path / "outputs"
    one = task_folder(out, "20260101-120000-7-1")
    three = task_folder(out, "20260101-120000-7-3", device="nvidia-h100")
    (three / "params.yaml").write_text(yaml.safe_dump({**TINY, "device": "cuda"}))  # a GPU task asks for a GPU again
    assert slurm.main(["resume", str(one), str(three), "--", "--time=30"]) == 0
    first, second, comparison = fake_sbatch()
    logs = out / "slurm"
    assert first == ["--parsable", *common(logs, f"{one.name}-resume-%j.log"), "--time=30", str(slurm.RENDER_JOB),
                     "--resume", str(one)]
    assert second == ["--parsable", *common(logs, f"{three.name}-resume-%j.log"), "--gres=gpu:1", "--time=30",
                      str(slurm.RENDER_JOB), "--resume", str(three)]
    assert comparison == ["--parsable", "--dependency=afterok:100:101", "--kill-on-invalid-dep=yes",
                          *common(logs, "20260101-120000-7-compare-%j.log"), "--time=30", str(slurm.COMPARE_JOB),
                          str(out), "20260101-120000-7"]
    printed = capsys.readouterr().out
    assert "resumed as job(s) 100, 101, each in its own folder, keeping its rows" in printed
    assert "the comparison is job 102" in printed


@pytest.mark.parametrize("make, says", [
    (lambda out: (out / "cpu" / "my-run").mkdir(parents=True) or [out / "cpu" / "my-run"],
     "is not a task's run folder: its name is not <time>-<array job id>-<task>"),
    (lambda out: (out / "cpu" / "20260101-120000-7-0").mkdir(parents=True) or [out / "cpu" / "20260101-120000-7-0"],
     "holds no params.yaml: its render stopped before it began, so there is nothing to resume"),
    (lambda out: [task_folder(out, "20260101-120000-7-0"), task_folder(out, "20260101-130000-8-0")],
     "the folders come from more than one array: resume one array's folders at a time"),
    (lambda out: [task_folder(out, "20260101-120000-7-0", seq_lens=[-4])], "params key 'seq_lens': value -4"),
])
def test_resume_refuses_a_folder_it_cannot_resume(tmp_path, fake_sbatch, capsys, make, says):
    folders = make(tmp_path / "outputs")
    assert slurm.main(["resume", *map(str, folders)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab slurm resume: error: ") and says in err and err.count("\n") == 1, err
    assert fake_sbatch() == [] and not (tmp_path / "outputs" / "slurm").exists()


def test_the_comparison_finds_every_task_folder_of_its_group_in_task_order(tmp_path):
    out = tmp_path / "outputs"
    want = []
    for device, task in (("nvidia-h100", 10), ("cpu", 2), ("nvidia-a100", 0)):
        folder = out / device / f"20260101-120000-7-{task}"
        folder.mkdir(parents=True)
        (folder / sweep.PROVENANCE).write_text("{}")
        want.append(folder)
    # another array's task; not a task's name; a task whose render stopped before its sweep began (no provenance)
    for name in ("20260101-120000-77-0", "20260101-120000-7-x", "20260101-120000-7-4"):
        (out / "cpu" / name).mkdir()
    (out / "cpu" / "20260101-120000-77-0" / sweep.PROVENANCE).write_text("{}")
    assert slurm.group_folders(out, "20260101-120000-7") == want[::-1]
    assert slurm.main(["compare", str(out), "20260101-120000-9"]) == 2


def job_script(tmp_path, *args, **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    """scripts/slurm/render.sbatch run by bash as Slurm runs it, its Python a stand-in that records its argv."""
    argv_log = tmp_path / "python-argv.json"
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(argv_log)!r}, 'w'))\n")
    python.chmod(0o755)
    done = subprocess.run(["bash", str(slurm.RENDER_JOB), *args], capture_output=True, text=True,
                          env={**os.environ, "ATTNLAB_PYTHON": str(python), **env})
    return done, json.loads(argv_log.read_text()) if argv_log.exists() else []


def test_each_array_task_renders_its_own_params_file_into_its_own_folder(tmp_path):
    done, argv = job_script(tmp_path, "/o", "20260101-120000", "a.yaml", "b.yaml",
                            SLURM_ARRAY_TASK_ID="1", SLURM_ARRAY_JOB_ID="77", SLURM_JOB_ID="78",
                            CUDA_VISIBLE_DEVICES="3")
    assert done.returncode == 0, done.stderr
    assert argv == ["-m", "attnlab.cli", "run", "--params", "b.yaml", "--out", "/o/{device}/20260101-120000-77-1"]
    assert "job 78 on" in done.stdout and "CUDA_VISIBLE_DEVICES=3" in done.stdout  # the allocation's, logged
    done, argv = job_script(tmp_path, "--resume", "/o/cpu/20260101-120000-77-1")
    assert argv == ["-m", "attnlab.cli", "run", "--params", "/o/cpu/20260101-120000-77-1/params.yaml", "--out",
                    "/o/cpu/20260101-120000-77-1"]


@pytest.mark.parametrize("args, env, says", [
    (["/o", "s", "a.yaml"], {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_JOB_ID": "7"},
     "array task 1, but 1 params file(s) were given"),
    (["/o", "s", "a.yaml"], {}, "not an array task"),
    (["/o", "s"], {"SLURM_ARRAY_TASK_ID": "0"}, "usage: render.sbatch OUTPUTS STAMP PARAMS..."),
])
def test_the_job_script_refuses_a_task_it_has_no_params_for(tmp_path, monkeypatch, args, env, says):
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    done, argv = job_script(tmp_path, *args, **env)
    assert done.returncode != 0 and says in done.stderr and argv == []


def test_a_run_folder_naming_device_is_named_for_the_device_the_render_finds(tmp_path):
    """`attnlab run --out 'DIR/{device}/NAME'` (what each array task runs): the render puts its device's folder name
    in the path, cpu here."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell("out_dir = None")]
    nbformat.write(nb, str(tmp_path / "one.ipynb"))
    given = []

    def execute(notebook, nb_out, parameters, **kw):
        given.append(parameters["out_dir"])
        nbformat.write(nbformat.read(notebook, as_version=4), nb_out)

    result = render.render(params_file(tmp_path), str(tmp_path / "outputs" / render.DEVICE / "20260101-120000-7-0"),
                           notebook=tmp_path / "one.ipynb", execute=execute)
    folder = tmp_path / "outputs" / "cpu" / "20260101-120000-7-0"
    assert result.code == 0 and result.out == folder and given == [str(folder)]
    assert (folder / "one.ipynb").exists() and (folder / "one.html").exists()
    assert render.DEVICE == "{device}"
