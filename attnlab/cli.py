"""`attnlab`: the lab's command line.

    attnlab sweep --params params/cpu.yaml [--out DIR]   measure a grid into DIR (resumes when DIR has results)
    attnlab check [...]                                  the correctness gate alone (attnlab.gate)
    attnlab check --grad [...]                           the gradient gate: dQ, dK, dV of every build with a backward
                                                         (attnlab.grad_gate; the gate's options)
    attnlab bench [...]                                  kernel benchmark and autotune (attnlab.bench)
    attnlab run [--params FILE] [--out DIR]              the main job: the walkthrough (notebooks/attention_lab.ipynb)
                                                         rendered by papermill with the params for this device: the
                                                         gate, the sweep, every section, as a notebook and its HTML
    attnlab run --params FILE --gpus 0,1,...             one render per GPU at once, then notebooks/compare_gpus.ipynb
    attnlab train [--params FILE] [--out DIR]            training: every build with a backward timed forward,
                                                         backward and both (attnlab.train_sweep), and
                                                         notebooks/training.ipynb rendered over the rows
                                                         (attnlab.train_lab); params/training/<gpu>.yaml by default
    attnlab report DIR                                   every table of DIR/results.csv (DIR/tables.txt) and its
                                                         figures (DIR/figures.html, draws offline)
    attnlab slurm submit PARAMS... | resume FOLDER...    the walkthrough on a Slurm cluster, one render per params
                                                         file as a job array, then the comparison (attnlab.slurm)

Bad params print one line, `attnlab: error: ...`, and exit 2 with nothing written. Without a GPU, Triton's
interpreter is switched on before any kernel module is imported (kernels are bound to it when defined).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from attnlab import environment

environment.configure()  # before any kernel module is imported

PARAMS = Path(__file__).resolve().parent.parent / "params"
DELEGATED = {"check": ("attnlab.gate", "the correctness gate alone: every build against the fp64 oracle (--grad: "
                                       "every build's gradients, attnlab.grad_gate)"),
             "bench": ("attnlab.bench", "kernel benchmark and opt-in autotune sweep"),
             "slurm": ("attnlab.slurm", "the walkthrough on a Slurm cluster: one render per params file as a job "
                                        "array, then the comparison (submit, resume)")}
GRAD, GRAD_GATE = "--grad", "attnlab.grad_gate"  # `attnlab check --grad`: the gradient gate


def parser() -> argparse.ArgumentParser:
    from attnlab import args as cli
    from attnlab.builds import names

    top = cli.Parser(prog="attnlab", description="Measure what fusion buys in attention.")
    sub = top.add_subparsers(dest="command", metavar="{sweep,check,bench,run,train,report,slurm}", required=True)
    sweep = sub.add_parser("sweep", help="measure a params grid into a results directory",
                           description="Measure every case of a params file; append rows to DIR/results.csv as "
                                       "they finish; re-running with the same --out resumes.")
    sweep.add_argument("--params", required=True, metavar="FILE", type=cli.existing_file,
                       help="params YAML (e.g. params/cpu.yaml)")
    sweep.add_argument("--out", metavar="DIR", type=cli.out_dir, help="output directory (default: params out_dir, else "
                                                    "outputs/<device>/<timestamp>)")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    for name, (module, about) in DELEGATED.items():
        sub.add_parser(name, help=about, add_help=False,
                       description=f"{about}. Arguments go to {module}.main; `attnlab {name} --help` lists them.")
    run = sub.add_parser("run", help="the main job: the walkthrough notebook rendered for this device (the gate, the "
                                     "sweep, every section), as a notebook and its HTML",
                         description="Render notebooks/attention_lab.ipynb with papermill into a new "
                                     "outputs/<gpu-or-cpu>/<time>/: the executed notebook, its HTML (draws with no "
                                     "network), and what its cells write (results.csv, provenance.json, gate.csv). "
                                     "The notebook runs the correctness gate first and the sweep only if it passes. "
                                     "Params: --params FILE, else params/<gpu>.yaml when a file is named for the GPU "
                                     "(h200.yaml on an NVIDIA H200), else params/gpu.yaml; params/cpu.yaml without a "
                                     "GPU. A failing or timed-out cell exits non-zero and keeps the partial notebook "
                                     "and every row measured.")
    run.add_argument("--params", metavar="FILE", type=cli.existing_file,
                     help="params YAML (default: the one for this device, above)")
    run.add_argument("--out", metavar="DIR", type=cli.out_dir,
                     help="output directory instead of outputs/<gpu-or-cpu>/<time> (a folder holding a run's rows "
                          "resumes it); {device} in it becomes the device's folder name, e.g. nvidia-h200 or cpu")
    run.add_argument("--gpus", metavar="I,J,...", type=cli.ints(0),
                     help="render once per GPU, all at once, each pinned to its GPU by CUDA_VISIBLE_DEVICES and written "
                          "to its own folder; then notebooks/compare_gpus.ipynb over them")
    run.add_argument("--timeout", type=cli.positive_float, metavar="S",
                     help="seconds any one cell may run (default: no limit)")
    train = sub.add_parser("train", help="training: every build with a backward timed forward, backward and "
                                         "both, and notebooks/training.ipynb rendered over the rows",
                           description="Render notebooks/training.ipynb with papermill into a new "
                                       "outputs/<gpu-or-cpu>/<time>/ (or --out DIR, which resumes a folder holding "
                                       "rows): the training sweep (train_results.csv, train_provenance.json), then "
                                       "its sections, as a notebook and its HTML. Params: --params FILE, else "
                                       "params/training/<gpu>.yaml when a file is named for the GPU, else "
                                       "params/training/gpu.yaml; params/training/cpu.yaml without a GPU.")
    train.add_argument("--params", metavar="FILE", type=cli.existing_file,
                       help="training params YAML (default: the one for this device, above)")
    train.add_argument("--out", metavar="DIR", type=cli.out_dir, help="output directory (a folder holding rows "
                                                                       "resumes)")
    train.add_argument("--timeout", type=cli.positive_float, metavar="S",
                       help="seconds any one cell may run (default: no limit)")
    report = sub.add_parser("report", help="every table (speedup, attribution, memory, ablations) of a results dir",
                            description="Read DIR/results.csv; print the tables of attnlab.report per (dtype, "
                                        "causal) group, write them to DIR/tables.txt and the figures to "
                                        "DIR/figures.html (self-contained: draws offline).")
    report.add_argument("dir", metavar="DIR", type=cli.existing_dir, help="a sweep's output directory")
    report.add_argument("--baseline", default="materialised", choices=names(), metavar="BUILD",
                        help="the build every speedup is relative to (a build name; default materialised)")
    return top


def _report(directory: str, baseline: str, echo: bool = True) -> int:
    from attnlab import sweep
    from attnlab.report.figures import to_html
    from attnlab.report.text import figures, render

    path = Path(directory) / sweep.RESULTS
    if not path.is_file():
        return _error(f"report: {path} does not exist (give a sweep's output directory)")
    try:
        results = sweep.read_results(path)
        text = render(results, baseline=baseline)
        page = to_html(figures(results, baseline=baseline))
    except ValueError as e:
        return _error(f"report: {e}")
    (Path(directory) / "tables.txt").write_text(text)
    (Path(directory) / "figures.html").write_text(page)
    print(text if echo else f"attnlab: the report's tables in {directory}/tables.txt, its figures in "
                            f"{directory}/figures.html")
    return 0


def _error(msg: str) -> int:
    print(f"attnlab: error: {msg}", file=sys.stderr)
    return 2


def _delegate(command: str, rest: list[str]) -> int:
    import importlib

    module = DELEGATED[command][0]
    if command == "check" and GRAD in rest:  # the gradient gate takes the gate's options
        module, rest = GRAD_GATE, [a for a in rest if a != GRAD]
    try:
        main = importlib.import_module(module).main
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        return _error(f"{module} is not in this checkout, so `attnlab {command}` cannot run")
    return int(main(rest) or 0)


def _sweep(params, out, quiet: bool) -> tuple[int, str | None]:
    """The sweep's exit code and output directory (None where it did not finish)."""
    from attnlab import sweep

    try:
        df = sweep.run(params, out_dir=out, progress=not quiet)
    except sweep.ParamsError as e:
        return _error(str(e)), None
    except KeyboardInterrupt:
        print("attnlab: interrupted; finished rows are kept: re-run with the same --out to resume", file=sys.stderr)
        return 130, None
    bad = df[df["status"] != "ok"]
    note = "" if bad.empty else f" ({len(bad)} not ok: see their status column)"
    print(f"attnlab: {len(df)} rows in {df.attrs['out_dir']}/{sweep.RESULTS}{note}")
    return 0, df.attrs["out_dir"]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        return _delegate(argv[0], argv[1:])
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # --help (0) and usage errors (2): return the code instead of exiting
        return int(e.code or 0)
    if args.command == "sweep":
        return _sweep(args.params, args.out, args.quiet)[0]
    if args.command == "report":
        return _report(args.dir, args.baseline)
    if args.command == "train":
        return _train(args)
    return _run(args)


def _train(args) -> int:
    """`attnlab train`: notebooks/training.ipynb rendered (attnlab.train_lab) with the params for this device."""
    from attnlab import render, train_lab

    params, why = (Path(args.params), f"params {args.params}") if args.params else params_here(PARAMS / "training")
    print(f"attnlab: {why}", flush=True)
    return render.finish(lambda: train_lab.render_notebook(params, args.out, timeout=args.timeout))


def _run(args) -> int:
    """`attnlab run`: the walkthrough rendered (attnlab.render) once, or once per GPU of --gpus."""
    from attnlab import render, sweep

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    params, why = (Path(args.params), f"params {args.params}") if args.params else params_for(gpu)
    if args.gpus is None:
        print(f"attnlab: {why}", flush=True)
        return render.finish(lambda: render.render(params, args.out, timeout=args.timeout))
    if args.out:
        return _error("run: --out names one folder; with --gpus each GPU writes its own")
    print(f"attnlab: {why}; one render per GPU: {', '.join(map(str, args.gpus))}", flush=True)
    try:
        code, _, lines = render.render_gpus(params, args.gpus, timeout=args.timeout)
    except sweep.ParamsError as e:
        return _error(str(e))
    for line in lines:
        print(f"attnlab: {line}", flush=True)
    return code


def params_for(device_name: str | None, folder: Path | None = None) -> tuple[Path, str]:
    """The params file `attnlab run` sweeps on this machine (in `folder`: params/, or params/training/ for `attnlab
    train`), and why: cpu.yaml without a GPU; the file named for the GPU's model, a word of its name holding a digit
    (h200.yaml for 'NVIDIA H200'; a vendor word like 'nvidia' never matches), any case; else the generic gpu.yaml."""
    folder = folder or (PARAMS if PARAMS.exists() else Path("params"))  # the checkout's, else the working dir's
    shown = str(folder.relative_to(PARAMS.parent)) if folder.is_relative_to(PARAMS.parent) else str(folder)
    if device_name is None:
        return folder / "cpu.yaml", f"no CUDA GPU here: the CPU path, {shown}/cpu.yaml"
    words = {w for w in re.split(r"[^a-z0-9]+", device_name.lower()) if re.search(r"\d", w)}
    for f in sorted(folder.glob("*.yaml")):
        if f.stem.lower() in words:
            return f, f"{device_name}: {shown}/{f.name}"
    return folder / "gpu.yaml", (f"{device_name}: no params file is named for it, so the generic {shown}/gpu.yaml "
                                 f"(copy it to {shown}/<gpu>.yaml to tune the grid for this card)")


def params_here(folder: Path | None = None) -> tuple[Path, str]:
    """params_for this machine: its GPU's name, or None without one."""
    return params_for(torch.cuda.get_device_name() if torch.cuda.is_available() else None, folder)


if __name__ == "__main__":
    sys.exit(main())
