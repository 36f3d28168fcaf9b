"""`attnlab slurm`: the walkthrough rendered on a Slurm cluster, one params file per task of a job array, then the
comparison of the array's renders, submitted with sbatch (scripts/slurm/render.sbatch, scripts/slurm/compare.sbatch).

    attnlab slurm submit PARAMS... [--outputs DIR] [-- SBATCH_OPTION...]
        task i renders the i-th params file into OUTPUTS/<device>/<time>-<array job id>-<i>/ (<device>: the card the
        scheduler gave the task, or cpu); a second job starts once every task has succeeded (afterok) and renders
        notebooks/compare_gpus.ipynb over them into OUTPUTS/compare/<time>-<array job id>/
    attnlab slurm resume FOLDER... [-- SBATCH_OPTION...]
        each stopped task resubmitted alone into its own folder, where the sweep measures only the rows its
        results.csv lacks; then the comparison again, over every folder of the array
    attnlab slurm compare OUTPUTS GROUP
        the comparison job's step: compare_gpus over every OUTPUTS/<device>/GROUP-<task>/ (GROUP: <time>-<job id>)

A task asks for one GPU (--gres=gpu:1) unless every params file runs on the CPU (device: cpu); the options after `--`
go to sbatch for both jobs (a partition, an account, a time limit). Every argument is checked before anything is
written or submitted (a params file that does not exist or does not validate, no params file at all, an outputs
folder that cannot be written, no sbatch on PATH): one line, `attnlab slurm <command>: error: ...`, exit 2; an sbatch
that fails after that is one such line and exit 1. Slurm's
own logs go to OUTPUTS/slurm/. The jobs run this checkout (sbatch --chdir) with this Python (ATTNLAB_PYTHON), so
both must be on a filesystem the compute nodes share.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from attnlab import provenance, render, runs, sweep
from attnlab.args import Parser, existing_dir, existing_file

SCRIPTS = provenance.REPO / "scripts" / "slurm"
RENDER_JOB, COMPARE_JOB = SCRIPTS / "render.sbatch", SCRIPTS / "compare.sbatch"
LOGS = "slurm"  # Slurm's log of each job, in OUTPUTS/slurm/
# A task's run folder: <time>-<array job id>-<task>; the group, <time>-<array job id>, names the array's comparison.
FOLDER = re.compile(r"(?P<group>\d{8}-\d{6}-(?P<job>\d+))-(?P<task>\d+)")


class SlurmError(ValueError):
    """A bad argument: `str()` is the one line the command prints (exit 2)."""


class SubmitFailed(SlurmError):
    """sbatch refused or failed after every argument was checked (exit 1)."""


@dataclass(frozen=True)
class Submitted:
    """What was submitted: the render job (an array for `submit`, one job per folder for `resume`), the comparison
    job, and where each writes."""

    renders: list[str]  # job ids
    compare: str
    folders: list[str]  # each task's run folder; '<device>' stands for the card's folder name
    comparison: Path
    logs: Path


def check_params(path) -> dict:
    """The params file validated (sweep.load_params), and refused where it names a GPU index above 0: a task sees
    only the GPU the scheduler gave it, as cuda:0."""
    try:
        params = sweep.load_params(path)
    except sweep.ParamsError as e:
        raise SlurmError(str(e)) from None
    if re.fullmatch(r"cuda:[1-9]\d*", str(params["device"])):
        raise SlurmError(f"params file {str(path)!r}: device {params['device']!r} names a GPU index, but a task sees "
                         "only the GPU the scheduler gave it, as cuda:0: use device: cuda or auto")
    return params


def check_outputs(outputs: Path) -> Path:
    """`outputs` made absolute, or SlurmError unless it is, or can be made, a writable folder."""
    try:
        sweep.check_out_dir(outputs)
    except sweep.ParamsError as e:
        raise SlurmError(f"the outputs folder {str(outputs)!r} {e.constraint}") from None
    return outputs.resolve()


def find_sbatch() -> str:
    found = shutil.which("sbatch")
    if not found:
        raise SlurmError("sbatch is not on PATH: run this on a machine that submits to the cluster (a login node), "
                         "with Slurm's commands on PATH")
    return found


def gres(params: list[dict]) -> list[str]:
    """One GPU per task, unless every params file runs on the CPU."""
    return [] if all(p["device"] == "cpu" for p in params) else ["--gres=gpu:1"]


def common(logs: Path, log_name: str) -> list[str]:
    """The options every job takes: this checkout as its working folder, this Python, Slurm's log in `logs`."""
    return [f"--chdir={provenance.REPO}", f"--output={logs / log_name}", f"--export=ALL,ATTNLAB_PYTHON={sys.executable}"]


def sbatch(argv: list[str]) -> str:
    """Run one sbatch command line (with --parsable) and return the job id it printed."""
    done = subprocess.run(argv, capture_output=True, text=True)
    lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
    if done.returncode:
        raise SubmitFailed(f"sbatch exited {done.returncode}: {lines[-1] if lines else 'no message'}")
    job = done.stdout.strip().split(";")[0]  # --parsable: '<job id>' or '<job id>;<cluster>'
    if not job.isdigit():
        raise SubmitFailed(f"sbatch printed no job id: {done.stdout.strip()!r}")
    return job


def submit_compare(sbatch_path: str, outputs: Path, group: str, after: list[str], extra: list[str]) -> str:
    """The comparison job, started once every job of `after` has succeeded; removed by Slurm if one fails
    (--kill-on-invalid-dep), so it never waits for a dependency that cannot be met."""
    logs = outputs / LOGS
    return sbatch([sbatch_path, "--parsable", f"--dependency=afterok:{':'.join(after)}", "--kill-on-invalid-dep=yes",
                   *common(logs, f"{group}-compare-%j.log"), *extra, str(COMPARE_JOB), str(outputs), group])


def submit(params_files: list[str], outputs=None, extra: list[str] = ()) -> Submitted:
    """One array task per params file, then the comparison after them; every argument checked first."""
    if not params_files:
        raise SlurmError("an array of zero tasks: give at least one params file (e.g. params/cpu.yaml)")
    params = [check_params(p) for p in params_files]
    outputs = check_outputs(Path(outputs) if outputs is not None else runs.outputs_root())
    sbatch_path = find_sbatch()
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    logs = outputs / LOGS
    logs.mkdir(parents=True, exist_ok=True)
    files = [str(Path(p).resolve()) for p in params_files]
    job = sbatch([sbatch_path, "--parsable", f"--array=0-{len(files) - 1}", *common(logs, f"{stamp}-%A-%a.log"),
                  *gres(params), *extra, str(RENDER_JOB), str(outputs), stamp, *files])
    group = f"{stamp}-{job}"
    try:
        compare = submit_compare(sbatch_path, outputs, group, [job], list(extra))
    except SubmitFailed as e:
        raise SubmitFailed(f"the render array is job {job}, but its comparison was not submitted: {e}") from None
    return Submitted([job], compare, [str(outputs / "<device>" / f"{group}-{i}") for i in range(len(files))],
                     outputs / "compare" / group, logs)


def check_folder(folder) -> tuple[Path, str, dict]:
    """A task's run folder to resume: (its outputs folder, its group, its params), or SlurmError."""
    folder = Path(folder).resolve()
    match = FOLDER.fullmatch(folder.name)
    if not match:
        raise SlurmError(f"{str(folder)!r} is not a task's run folder: its name is not "
                         "<time>-<array job id>-<task> (as `attnlab slurm submit` names them)")
    from attnlab.lab.run import PARAMS  # the params the render began with, written into its folder

    if not (folder / PARAMS).is_file():
        raise SlurmError(f"{str(folder)!r} holds no {PARAMS}: its render stopped before it began, so there is "
                         "nothing to resume; submit its params file again")
    return folder.parent.parent, match["group"], check_params(folder / PARAMS)


def resume(folders: list[str], extra: list[str] = ()) -> Submitted:
    """Each folder's render resubmitted alone into that folder (its rows kept), then the comparison again."""
    checked = [check_folder(f) for f in folders]
    if len({(str(o), g) for o, g, _ in checked}) != 1:
        raise SlurmError("the folders come from more than one array: resume one array's folders at a time")
    outputs, group, _ = checked[0]
    logs = check_outputs(outputs / LOGS)
    sbatch_path = find_sbatch()
    logs.mkdir(parents=True, exist_ok=True)
    jobs = []
    try:
        for folder, (_, _, params) in zip(folders, checked):
            folder = Path(folder).resolve()
            jobs.append(sbatch([sbatch_path, "--parsable", *common(logs, f"{folder.name}-resume-%j.log"),
                                *gres([params]), *extra, str(RENDER_JOB), "--resume", str(folder)]))
        compare = submit_compare(sbatch_path, outputs, group, jobs, list(extra))
    except SubmitFailed as e:
        if not jobs:
            raise
        raise SubmitFailed(f"resumed as job(s) {', '.join(jobs)}, but not the rest: {e}") from None
    return Submitted(jobs, compare, [str(Path(f).resolve()) for f in folders], outputs / "compare" / group, logs)


def group_folders(outputs: Path, group: str) -> list[Path]:
    """Every task's run folder of `group` under outputs (OUTPUTS/<device>/GROUP-<task>/) holding a sweep's
    provenance, in task order."""
    found = []
    for folder in Path(outputs).glob(f"*/{group}-*"):
        match = FOLDER.fullmatch(folder.name)
        if match and match["group"] == group and (folder / sweep.PROVENANCE).is_file():
            found.append((int(match["task"]), folder))
    return [folder for _, folder in sorted(found)]


def compare(outputs, group: str) -> render.Rendered:
    """notebooks/compare_gpus.ipynb over the group's run folders, into OUTPUTS/compare/GROUP/."""
    folders = group_folders(Path(outputs), group)
    if not folders:
        raise SlurmError(f"no run folder {group}-<task> with a {sweep.PROVENANCE} under {str(outputs)!r}/<device>/")
    return render.render_compare(folders, render.COMPARE, Path(outputs) / "compare" / group)


def _where(path) -> str:
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def report(done: Submitted, files: list[str] | None) -> list[str]:
    """What a submit or resume prints: the job ids and where everything lands."""
    jobs = ", ".join(done.renders)
    lines = ([f"the render array is job {jobs}: {len(done.folders)} task(s), one per params file"] if files else
             [f"resumed as job(s) {jobs}, each in its own folder, keeping its rows"])
    for i, folder in enumerate(done.folders):
        lines.append(f"  {f'task {i}: {files[i]} -> ' if files else ''}{_where(folder)}")
    lines.append(f"the comparison is job {done.compare}, once every render has succeeded -> "
                 f"{_where(done.comparison)}")
    lines.append(f"Slurm's logs: {_where(done.logs)}/; <device> is the card a task was given, or cpu")
    if files:
        pattern = _where(Path(done.folders[0]).parent / f"{done.comparison.name}-<task>")
        lines.append(f"a task that failed or was cancelled resumes alone, keeping its rows: "
                     f"attnlab slurm resume {pattern}")
    return lines


def parser() -> argparse.ArgumentParser:
    top = Parser(prog="attnlab slurm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", metavar="{submit,resume,compare}", required=True)
    s = sub.add_parser("submit", prog="attnlab slurm submit",
                       help="one render per params file as a job array, then the comparison after them",
                       description="Submit one walkthrough render per params file (a job array) and the comparison "
                                   "that starts once every render has succeeded. Options after `--` go to sbatch.")
    s.add_argument("params", nargs="*", metavar="PARAMS", type=existing_file, help="params YAML files, one per task")
    s.add_argument("--outputs", metavar="DIR", help="where the run folders go (default: this checkout's outputs/, "
                                                    "or ATTNLAB_OUTPUTS)")
    r = sub.add_parser("resume", prog="attnlab slurm resume",
                       help="stopped tasks resubmitted alone into their own folders, keeping their rows",
                       description="Resubmit each stopped task of an array alone, into its own folder (the sweep "
                                   "measures only the rows its results.csv lacks), then the comparison again. "
                                   "Options after `--` go to sbatch.")
    r.add_argument("folders", nargs="+", metavar="FOLDER", type=existing_dir,
                   help="a task's run folder, OUTPUTS/<device>/<time>-<array job id>-<task>")
    c = sub.add_parser("compare", prog="attnlab slurm compare", help="the comparison job's step",
                       description="Render notebooks/compare_gpus.ipynb over every OUTPUTS/<device>/GROUP-<task>/ "
                                   "into OUTPUTS/compare/GROUP/.")
    c.add_argument("outputs", metavar="OUTPUTS", type=existing_dir)
    c.add_argument("group", metavar="GROUP", help="<time>-<array job id>")
    return top


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # sbatch's own options
    argv = argv[:argv.index("--")] if "--" in argv else argv
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # --help (0) and usage errors (2)
        return int(e.code or 0)
    try:
        if args.command == "compare":
            result = compare(args.outputs, args.group)
            print(f"attnlab: {result.message}", file=sys.stderr if result.code else sys.stdout)
            return result.code
        done = (submit(args.params, args.outputs, extra) if args.command == "submit" else resume(args.folders, extra))
    except SlurmError as e:
        print(f"attnlab slurm {args.command}: error: {e}", file=sys.stderr)
        return 1 if isinstance(e, SubmitFailed) else 2
    for line in report(done, args.params if args.command == "submit" else None):
        print(f"attnlab: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
