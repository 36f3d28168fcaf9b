"""Compile our kernels for a params grid before its sweep, several processes at once (`attnlab run` does this first
on a GPU; by hand:

    python -m attnlab.warm --params params/h200.yaml [--jobs 4]     then: attnlab sweep --params params/h200.yaml

On a fresh GPU machine most of a sweep's first minutes are Triton compiling our kernels (a Gluon variant takes
3–10 s), one after another in the sweep's one process. Triton keeps what it compiles in its on-disk cache, keyed by
the kernel, its constants and its arguments' specialisation (alignment, divisibility by 16), so a process that runs
the same build on the same shapes leaves the sweep nothing to compile (attnlab.triton keeps that one cache when
torch.compile would move it). This runs each of our builds and their ablations once on each shape of the params grid
(the sweep's own inputs: attnlab.measure.make_inputs), the cases dealt among `jobs` child processes; nothing is timed
and nothing is written but Triton's cache. Library builds are left out: their kernels ship compiled, and
FlexAttention compiles inside the process that times it. A case that fails here (out of memory with several
processes on one GPU, say) is reported and skipped: the sweep compiles it. On a fresh H200 after the gate, with
params/h200.yaml, this takes 72 s with the cases dealt by family (`mine`; 101 s dealt by shape), and the sweep's
first calls then take about 30 s in all (FlexAttention's compiles).
"""
from __future__ import annotations

import argparse
import subprocess
import sys

import torch

from attnlab import builds, measure, sweep


def cases(params_path: str) -> list[measure.Case]:
    """The params grid's cases of our builds and their ablations (attnlab.sweep.grid's order)."""
    p = sweep.load_params(params_path)
    return [c for c in sweep.grid(p, sweep.resolve_device(p)) if builds.get(c.build).family != "library"]


def mine(all_cases: list[measure.Case], part: int, jobs: int) -> list[measure.Case]:
    """Child `part`'s cases: each build's cases of one family (its shapes but for N and B: the kernel variants they
    compile differ by N at most) go to one child, so no two children compile the same variant at once; dealt round
    robin over the builds, shifted by the family's index, so that a child gets every build in some family where
    there are as many families as children (a build's compiles are not all in one process). The shift is the family's
    index, not the shape's: shifted by the shape, one build's six N of a family went to four children, and the same
    Gluon variants compiled in up to four processes at once."""
    families: dict = {}
    names: dict = {}
    for c in all_cases:
        families.setdefault(_family(c), len(families))
        names.setdefault(c.build, len(names))
    return [c for c in all_cases if (families[_family(c)] + names[c.build]) % jobs == part]


def _family(c: measure.Case) -> tuple:
    return c.H, c.Hkv, c.D, c.dtype, c.causal


def run_part(all_cases: list[measure.Case], part: int, jobs: int) -> tuple[int, list[str]]:
    """Run this child's share of the grid's cases once each; (cases run, one line per case that failed)."""
    ran, failed = 0, []
    for case in mine(all_cases, part, jobs):
        try:
            q, k, v = measure.make_inputs(case)
            builds.get(case.build).attend(q, k, v, causal=case.causal)
            if q.is_cuda:
                torch.cuda.synchronize(q.device)
            ran += 1
        except Exception as e:  # noqa: BLE001 - the sweep will compile (and report) this case itself
            failed.append(f"{case.case_id}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        finally:
            q = k = v = None
            measure.release(torch.device(case.device))
    return ran, failed


def warm(params_path: str, jobs: int) -> list[str]:
    """Run the parts in `jobs` child processes at once; their summary lines (one per child, then its failures)."""
    children = [subprocess.Popen([sys.executable, "-m", "attnlab.warm", "--params", params_path, "--part",
                                  f"{k}/{jobs}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for k in range(jobs)]
    lines = []
    for k, child in enumerate(children):
        out, _ = child.communicate()
        said = [line for line in out.splitlines() if line.startswith(("warm ", "  failed "))]
        lines += said or [f"warm part {k}/{jobs}: exited with {child.returncode}, no summary: "
                          + " | ".join(out.strip().splitlines()[-3:])]
    return lines


def main(argv: list[str] | None = None) -> int:
    from attnlab import args as cli

    ap = cli.Parser(prog="python -m attnlab.warm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", required=True, type=cli.existing_file, help="the params YAML the sweep will run")
    ap.add_argument("--jobs", type=cli.positive_int, default=4, help="processes compiling at once (default 4)")
    ap.add_argument("--part", default=None, help="K/J: run child K of J (what --jobs starts)")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # --help (0) and usage errors (2), as a return code, as gate and bench give them
        return int(e.code or 0)
    if args.jobs < 1:
        print(f"attnlab warm: error: --jobs must be a whole number >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    try:
        all_cases = cases(args.params)  # the params and the device they name, checked before any child starts
        if args.part:
            part, jobs = (int(x) for x in args.part.split("/"))
            if not 0 <= part < jobs:
                raise ValueError
    except sweep.ParamsError as e:
        print(f"attnlab warm: error: {e}", file=sys.stderr)
        return 2
    except ValueError:
        print(f"attnlab warm: error: --part looks like K/J with 0 <= K < J, got {args.part!r}", file=sys.stderr)
        return 2
    if args.part:
        ran, failed = run_part(all_cases, part, jobs)
        print(f"warm part {part}/{jobs}: {ran} cases run, {len(failed)} failed", flush=True)
        for line in failed:
            print(f"  failed {line}", flush=True)
        return 0
    for line in warm(args.params, args.jobs):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
