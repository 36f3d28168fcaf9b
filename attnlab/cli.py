"""`attnlab`: the lab's command line.

    attnlab sweep --params params/cpu.yaml [--out DIR]   measure a grid into DIR (resumes when DIR has results)
    attnlab check [...]                                  the correctness gate alone (attnlab.gate)
    attnlab bench [...]                                  kernel benchmark and autotune (attnlab.bench)
    attnlab run [--out DIR]                              the main job: the gate, the sweep for this device, and
                                                         its report (DIR/tables.txt, DIR/figures.html)
    attnlab report DIR                                   every table of DIR/results.csv (DIR/tables.txt) and its
                                                         figures (DIR/figures.html, draws offline)

Bad params print one line, `attnlab: error: ...`, and exit 2 with nothing written. Without a GPU, Triton's
interpreter is switched on before any kernel module is imported (kernels are bound to it when defined).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

PARAMS = Path(__file__).resolve().parent.parent / "params"
DELEGATED = {"check": ("attnlab.gate", "the correctness gate alone: every build against the fp64 oracle"),
             "bench": ("attnlab.bench", "kernel benchmark and opt-in autotune sweep")}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="attnlab", description="Measure what fusion buys in attention.")
    sub = top.add_subparsers(dest="command", metavar="{sweep,check,bench,run,report}", required=True)
    sweep = sub.add_parser("sweep", help="measure a params grid into a results directory",
                           description="Measure every case of a params file; append rows to DIR/results.csv as "
                                       "they finish; re-running with the same --out resumes.")
    sweep.add_argument("--params", required=True, metavar="FILE", help="params YAML (e.g. params/cpu.yaml)")
    sweep.add_argument("--out", metavar="DIR", help="output directory (default: params out_dir, else "
                                                    "outputs/<device>/<timestamp>)")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    for name, (module, about) in DELEGATED.items():
        sub.add_parser(name, help=about, add_help=False,
                       description=f"{about}. Arguments go to {module}.main; `attnlab {name} --help` lists them.")
    run = sub.add_parser("run", help="the main job: correctness gate, the sweep for the best device present, and "
                                     "its report",
                         description="Run the correctness gate; if it passes, sweep the params for this machine into "
                                     "outputs/<gpu-or-cpu>/<timestamp>/: params/<gpu>.yaml when a file is named "
                                     "for the GPU (h200.yaml on an NVIDIA H200), else params/gpu.yaml; "
                                     "params/cpu.yaml without a GPU. Then write its report there (tables.txt, "
                                     "figures.html), as `attnlab report` does.")
    run.add_argument("--out", metavar="DIR", help="output directory instead of outputs/<gpu-or-cpu>/<timestamp>")
    report = sub.add_parser("report", help="every table (speedup, attribution, memory, ablations) of a results dir",
                            description="Read DIR/results.csv; print the tables of attnlab.report per (dtype, "
                                        "causal) group, write them to DIR/tables.txt and the figures to "
                                        "DIR/figures.html (self-contained: draws offline).")
    report.add_argument("dir", metavar="DIR", help="a sweep's output directory")
    report.add_argument("--baseline", default="materialised", help="the build every speedup is relative to")
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


# Processes at once on a GPU machine for `attnlab run`'s warm step, and the fewest for its gate (gate_jobs): most of
# both is Triton compiling, one CPU core a process (the gate at N = 512: 47 s in four against 135-179 s in one,
# session 7). The warm step keeps 4: its cases reach N = 16384, where the materialised builds hold tens of GB each.
GPU_JOBS = 4
# the gate's shapes are small (N ≤ 4096, B·H ≤ 8), and its 14 families dealt to 8 parts leave 7 shapes at most in one
# (session 32 on the 16-core H200 machine: 134 s in 8 processes against 233 s in 4)
GATE_JOBS_MAX = 8


def gate_jobs(cores: int | None = None) -> int:
    """Processes for `attnlab run`'s gate on a GPU: one a pair of cores (a compile's own threads, and the driver's),
    GPU_JOBS at least, GATE_JOBS_MAX at most."""
    import os

    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(GPU_JOBS, min(GATE_JOBS_MAX, cores // 2))


def _warm(params) -> None:
    """On a GPU, before `attnlab run`'s sweep: our kernels compiled for its grid in GPU_JOBS processes at once
    (attnlab.warm), so the sweep, one process, loads them from Triton's cache instead of compiling each in turn.
    Session 17 on a fresh H200: the warm step 66-88 s; the sweep after it spent 30 s in first calls (FlexAttention's
    own compiles) where one without it spent 137 s more compiling ours. A case that fails here is only reported: the
    sweep runs it and records what happens."""
    from attnlab import warm

    t0 = time.perf_counter()
    lines = warm.warm(str(params), GPU_JOBS)
    print(f"attnlab: our kernels compiled for the sweep in {time.perf_counter() - t0:.0f} s "
          f"({GPU_JOBS} processes: python -m attnlab.warm)", flush=True)
    for line in lines:
        if not re.fullmatch(r"warm part \d+/\d+: \d+ cases run, 0 failed", line.strip()):  # only news is said
            print(f"attnlab: warm: {line.strip()}", flush=True)


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
    # run: the gate first; timings of a build that fails it would describe a wrong program
    import importlib

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    gate_args = ["--jobs", str(gate_jobs())] if gpu else []  # on a GPU the gate's time is compiling: share it out
    code = int(importlib.import_module("attnlab.gate").main(gate_args) or 0)  # as _delegate loads it (tests replace it)
    if code:
        print("attnlab: the correctness gate failed; not sweeping (attnlab sweep runs the sweep anyway)",
              file=sys.stderr)
        return code
    params, why = params_for(gpu)
    print(f"attnlab: {why}", flush=True)
    if gpu:
        _warm(params)
    code, where = _sweep(params, args.out, False)
    return code or _report(where, "materialised", echo=False)  # what the run measured, as tables and figures


def params_for(device_name: str | None, folder: Path | None = None) -> tuple[Path, str]:
    """The params file `attnlab run` sweeps on this machine, and why: cpu.yaml without a GPU; the file named for the
    GPU's model, a word of its name holding a digit (h200.yaml for 'NVIDIA H200'; a vendor word like 'nvidia' never
    matches), any case; else the generic gpu.yaml."""
    folder = folder or (PARAMS if PARAMS.exists() else Path("params"))  # the checkout's, else the working dir's
    if device_name is None:
        return folder / "cpu.yaml", "no CUDA GPU here: the CPU path, params/cpu.yaml"
    words = {w for w in re.split(r"[^a-z0-9]+", device_name.lower()) if re.search(r"\d", w)}
    for f in sorted(folder.glob("*.yaml")):
        if f.stem.lower() in words:
            return f, f"{device_name}: params/{f.name}"
    return folder / "gpu.yaml", (f"{device_name}: no params file is named for it, so the generic params/gpu.yaml "
                                 "(copy it to params/<gpu>.yaml to tune the grid for this card)")


if __name__ == "__main__":
    sys.exit(main())
