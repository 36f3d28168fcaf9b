"""A real Slurm: a one-node cluster started on this machine (scripts/slurm/ci_cluster.sh: Debian's slurm-wlm and munge,
no cgroup plugin) runs the README's "Cluster (Slurm)" commands as written, in this checkout.

    the array      `attnlab slurm submit params/cpu.yaml params/cpu.yaml`: both tasks leave a full CPU render in
                   outputs/cpu/<time>-<job>-<task>/, and the comparison job, started after them, names both
    the resume     an array of two small CPU renders, one task cancelled (scancel) once it has written rows: the
                   comparison never starts; `attnlab slurm resume <its folder>` finishes that render in its folder,
                   every row written before the cancel still there, the other task's folder untouched, and the
                   comparison that follows names both

What the tests write under outputs/ is removed when they end. Marked `system`: `make test-system` runs them (CI,
after `make test`), never `make test`. Where Slurm cannot start (not installed, not root, a daemon refused), the tests
skip saying why; with ATTNLAB_SYSTEM_TESTS=run (CI) they fail instead, and the cluster script installs Slurm by
apt-get where it is missing.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from attnlab import sweep

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "scripts" / "slurm" / "ci_cluster.sh"
MUST_RUN = os.environ.get("ATTNLAB_SYSTEM_TESTS") == "run"  # CI: Slurm failing to start fails the tests
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
        "DEADLINE"}
# The small CPU render of the resume test: params/cpu.yaml at one N and one D (28 rows, not 112)
SMALL = {**yaml.safe_load((ROOT / "params" / "cpu.yaml").read_text()), "name": "cpu-small", "seq_lens": [64],
         "head_dims": [32]}

pytestmark = [pytest.mark.system, pytest.mark.timeout(3600)]


def readme_commands() -> list[str]:
    """The commands of the README's "Cluster (Slurm)" section: every line of its ```bash blocks, up to a comment."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Cluster \(Slurm\)\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, "README.md has no '## Cluster (Slurm)' section"
    blocks = re.findall(r"^```bash\n(.*?)^```", section.group(1), re.M | re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.split("#")[0].strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The environment that reaches a fresh one-node cluster (SLURM_CONF, this Python's `attnlab` first on PATH);
    stopped when the module ends."""
    folder = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "SLURM_CTLD_PORT": str(free_port()), "SLURM_D_PORT": str(free_port())}
    started = subprocess.run(["bash", str(CLUSTER), "start", str(folder), *(["--install"] if MUST_RUN else [])],
                             capture_output=True, text=True, env=env, timeout=900)
    if started.returncode:
        reason = f"Slurm did not start: {started.stderr.strip()[-3000:]}"
        pytest.fail(f"ATTNLAB_SYSTEM_TESTS=run, but {reason}") if MUST_RUN else pytest.skip(reason)
    env = {**env, "SLURM_CONF": str(folder / "slurm.conf"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"}
    yield env
    subprocess.run(["bash", str(CLUSTER), "stop", str(folder)], env=env, timeout=120)


@pytest.fixture
def cleanup():
    """Every array group (<time>-<job>) a test submits: its folders under outputs/ are removed at its end."""
    groups = []
    yield groups
    outputs = ROOT / "outputs"
    for group in groups:
        for path in [*outputs.glob(f"*/{group}-*"), outputs / "compare" / group]:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    for folder in (outputs / "cpu", outputs / "compare", outputs / "slurm"):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def sh(command: str, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    print(f"$ {command}\n{done.stdout}{done.stderr}")  # shown with pytest -rP, and on a failure
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def submitted(out: str, cleanup: list) -> tuple[str, str, str]:
    """(array job id, comparison job id, group) from what `attnlab slurm submit` printed."""
    array = re.search(r"the render array is job (\d+)", out)
    compare = re.search(r"the comparison is job (\d+)", out)
    group = re.search(r"task 0: \S+ -> \S+/(\d{8}-\d{6}-\d+)-0", out)
    assert array and compare and group, out
    cleanup.append(group[1])
    return array[1], compare[1], group[1]


def states(job: str, env: dict) -> dict[str, str]:
    """Each job's (or array task's, 'J_i') state, as slurmctld keeps it after the job ends (MinJobAge)."""
    shown = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True)
    found = {}
    for line in shown.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        name = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}" if "ArrayTaskId" in fields else fields["JobId"]
        found[name] = fields["JobState"]
    return found


def wait(jobs: list[str], env: dict, timeout: float = 2400) -> dict[str, str]:
    """Every job's final state, once none is pending or running."""
    deadline = time.monotonic() + timeout
    while True:
        now = {name: state for job in jobs for name, state in states(job, env).items()}
        if now and all(state in DONE for state in now.values()):
            return now
        assert time.monotonic() < deadline, f"jobs not finished after {timeout:.0f} s: {now}"
        time.sleep(2)


def log_of(prefix: str) -> str:
    logs = sorted((ROOT / "outputs" / "slurm").glob(f"{prefix}*.log"))
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs)


def folder(group: str, task: int) -> Path:
    return ROOT / "outputs" / "cpu" / f"{group}-{task}"


def assert_full_render(run: Path, params: dict) -> None:
    """A render as tests/test_render.py judges one: every code cell ran, none shows an error, every case of the
    grid is an ok row, the HTML draws its figures, and each file the walkthrough writes is there."""
    nb = nbformat.read(str(run / "attention_lab.ipynb"), as_version=4)
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code")
    results = sweep.read_results(run)
    assert len(results) == len(sweep.grid(sweep.validate(dict(params)), "cpu")) == results["case_id"].nunique()
    assert (results["status"] == "ok").all() and set(results["N"]) == set(params["seq_lens"])
    assert {"gate.csv", "provenance.json", "params.yaml", "attention_lab.html", "tables.txt"} <= {
        p.name for p in run.iterdir()}
    assert (run / "attention_lab.html").read_text(encoding="utf-8").count("Plotly.newPlot") >= 4


def assert_compared(group: str, tasks: list[int]) -> None:
    """The comparison of the group rendered, its overview naming every task's run."""
    out = ROOT / "outputs" / "compare" / group
    nb = nbformat.read(str(out / "compare_gpus.ipynb"), as_version=4)
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    [cell] = [c for c in nb.cells if c.cell_type == "code" and "compare.overview(found)" in c.source]
    overview = "\n".join(o["data"]["text/plain"] for o in cell.outputs if "text/plain" in o.get("data", {}))
    for task in tasks:
        assert f"cpu/{group}-{task}" in overview, overview
    assert (out / "compare_gpus.html").is_file()


def test_the_readmes_array_renders_both_params_files_and_then_compares_them(cluster, cleanup):
    commands = readme_commands()
    [submit] = [c for c in commands if c.startswith("attnlab slurm submit")]
    assert submit == "attnlab slurm submit params/cpu.yaml params/cpu.yaml"
    array, compare, group = submitted(sh(submit, cluster).stdout, cleanup)
    final = wait([array, compare], cluster)
    assert final == {f"{array}_0": "COMPLETED", f"{array}_1": "COMPLETED", compare: "COMPLETED"}, log_of(group)
    params = yaml.safe_load((ROOT / "params" / "cpu.yaml").read_text())
    for task in (0, 1):
        assert_full_render(folder(group, task), params)
        assert f"rendered with {ROOT / 'params' / 'cpu.yaml'} into" in log_of(f"{group}-{task}")
    assert_compared(group, [0, 1])


def complete_lines(path: Path) -> list[str]:
    text = path.read_text() if path.exists() else ""
    return text.splitlines()[1:] if text.endswith("\n") else text.splitlines()[1:-1]  # the header, a partial line


def test_a_cancelled_task_resumes_alone_in_its_folder_with_no_row_lost(cluster, cleanup, tmp_path):
    small = tmp_path / "cpu-small.yaml"
    small.write_text(yaml.safe_dump(SMALL))
    array, compare, group = submitted(sh(f"attnlab slurm submit {small} {small}", cluster).stdout, cleanup)
    results = folder(group, 1) / sweep.RESULTS
    deadline = time.monotonic() + 1200
    while len(complete_lines(results)) < 3:  # midway: a few rows measured, most of the grid still to come
        assert states(array, cluster).get(f"{array}_1") not in DONE, log_of(group)
        assert time.monotonic() < deadline, "task 1 wrote no rows in 20 minutes"
        time.sleep(0.2)
    sh(f"scancel {array}_1", cluster)
    before = complete_lines(results)
    final = wait([array, compare], cluster)
    assert final == {f"{array}_0": "COMPLETED", f"{array}_1": "CANCELLED", compare: "CANCELLED"}, log_of(group)
    assert not (ROOT / "outputs" / "compare" / group).exists()  # the comparison never started
    kept = complete_lines(results)
    total = len(sweep.grid(sweep.validate(dict(SMALL)), "cpu"))
    assert kept[:len(before)] == before and len(kept) < total  # stopped midway
    print(f"task 1 cancelled: {len(before)} rows read before scancel, {len(kept)} in its results.csv, of {total}")
    other = (folder(group, 0) / sweep.RESULTS).read_bytes()

    [resume] = [c for c in readme_commands() if c.startswith("attnlab slurm resume")]
    # the README's placeholders, filled with this task's folder (the group is <time>-<job>)
    filled = (resume.replace("<device>", "cpu").replace("<time>", group[:15]).replace("<job>", array)
              .replace("<task>", "1"))
    assert "<" not in filled and filled.endswith(f"outputs/cpu/{group}-1")
    out = sh(filled, cluster).stdout
    resumed, again = re.search(r"resumed as job\(s\) (\d+)", out), re.search(r"the comparison is job (\d+)", out)
    assert resumed and again, out
    final = wait([resumed[1], again[1]], cluster)
    assert set(final.values()) == {"COMPLETED"}, log_of(group)
    assert_full_render(folder(group, 1), SMALL)
    after = complete_lines(results)
    assert after[:len(kept)] == kept and len(after) == total  # every row before the cancel, unchanged, then the rest
    sessions = json.loads((folder(group, 1) / sweep.PROVENANCE).read_text())["sessions"]
    assert len(sessions) == 2 and sessions[1]["already_measured"] == len(kept) and not sessions[1]["interrupted"]
    assert (folder(group, 0) / sweep.RESULTS).read_bytes() == other  # the other task's rows untouched
    assert_compared(group, [0, 1])
