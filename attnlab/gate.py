"""The correctness gate: every build against the fp64 oracle on fresh random inputs, on the best device present.

    attnlab check                     GPU: N 512–4096, D 64/128, causal and not, bf16 and fp16, GQA at N = 1000 and
                                      3000 and at N % 8 ≠ 0 (1001, 2999); CPU: a small grid
    attnlab check --out gate.csv      also write one row per (build, case)
    attnlab check --jobs 8            the shapes shared among 8 processes at once (most of the gate's time on a GPU is
                                      Triton compiling each kernel variant, which runs on one CPU core a process)
    attnlab check --grad              the gradient gate at the same shapes, with the same options (attnlab.grad_gate)

Our builds write into a NaN-poisoned output, so an element a kernel never writes fails the gate. Accuracy is judged
by FlashAttention's rule (attnlab.accuracy). Exit status 1 when any case fails; unsupported cases are listed, not
failed (a forced SDPA backend that has no kernel for a shape says so).
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch


def grid(device: torch.device, quick: bool = False, ns=None) -> list:
    """The gate's shapes as the harness's cases (attnlab.measure.Case, build 'gate'): the issue's GPU grid, or a
    grid the CPU interpreter finishes in about a minute."""
    from attnlab.measure import Case

    def shape(B, H, Hkv, N, D, dtype, causal):
        return Case("gate", B, H, Hkv, N, D, dtype, causal, str(device))

    if device.type == "cuda":
        ns = ns or ((512, 1024) if quick else (512, 1024, 2048, 4096))
        main = [shape(2, 4, 4, n, d, dt, c) for dt, n, d, c in
                itertools.product((torch.bfloat16, torch.float16), ns, (64, 128), (False, True))]
        gqa = [shape(1, 8, 2, n, 128, torch.bfloat16, c) for n in (1000, 3000) for c in (False, True)]
        # N % 8 ≠ 0: P's rows padded to lines (launch.scores_buffer) are what lets the Gluon P and PV kernels run there
        gqa += [shape(1, 8, 2, n, d, torch.float16, c) for n, d in ((1001, 64), (2999, 128)) for c in (False, True)]
        odd_d = [shape(1, 4, 4, 300, d, torch.bfloat16, c) for d in (80, 256) for c in (False, True)]
        odd_d += [shape(1, 4, 4, 300, 64, torch.float32, c) for c in (False, True)]  # fp32: the IEEE dot path
        return main + ([] if quick else gqa + odd_d)
    ns = ns or ((64,) if quick else (64, 100))
    main = [shape(1, 2, 2, n, d, dt, c) for dt, n, d, c in
            itertools.product((torch.float32, torch.bfloat16), ns, (32, 64), (False, True))]
    return main + [shape(1, 4, 2, 77, 32, torch.float16, True)]


CASE_KEYS = ("B", "H", "Hkv", "N", "D", "dtype", "causal")
ALL_BUILDS = "(all)"  # the build named by the FAIL row of a shape whose process died before checking it


def read_cases(path: str, device: torch.device) -> list:
    """The shapes of a --cases file as the harness's cases (build 'gate'), in the file's order: shape i draws its
    inputs with seed SEED0 + i, as in the grid. A ValueError names what is wrong with the file."""
    import json

    from attnlab.measure import Case

    try:
        with open(path) as f:
            entries = json.load(f)
        if not isinstance(entries, list) or not entries:
            raise ValueError("expected a non-empty JSON list of shapes")
        return [Case("gate", *(e[k] for k in CASE_KEYS), str(device)) for e in entries]
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {type(e).__name__}: {e} (each shape: {{{', '.join(CASE_KEYS)}}})") from None


def default_builds(device: torch.device) -> list[str]:
    from attnlab import builds

    names = builds.names()
    if device.type != "cuda":  # compiled FlexAttention on the CPU costs minutes of compile for nothing the GPU lacks
        names = [n for n in names if n != "flex"]
    return names


# Processes for the gate on a GPU machine: most of its time is Triton compiling, one CPU core a process, so the
# gate's time falls with processes while cores are free. Its 14 families dealt to 8 parts leave 7 shapes at most in
# one.
JOBS_MIN, JOBS_MAX = 4, 8


def default_jobs(cores: int | None = None) -> int:
    """Processes for the gate on a GPU: one a pair of cores (a compile's own threads, and the driver's), JOBS_MIN at
    least, JOBS_MAX at most."""
    import os

    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(JOBS_MIN, min(JOBS_MAX, cores // 2))


SEED0 = 1000  # shape i of the grid draws its inputs with seed SEED0 + i (and its rows say shape = i)


def check_case(case, names: list[str], device, seed: int) -> list[dict]:
    """Run every named build on one fresh input set (the harness's: random normal, never zeros); one row each. Our
    builds run twice, each time into a NaN-filled `out`: the second call, which finds every plan the first made
    (attnlab.triton.plan), is judged and must equal the first bit for bit."""
    from attnlab import accuracy, builds, reference
    from attnlab.measure import make_inputs, one_line

    q, k, v = make_inputs(case, seed)
    refs = {}
    rows = []
    for name in names:
        b = builds.get(name)
        oracle = None if b.ablation == "zero_mask" else b.ablation
        row = dict(build=name, shape=seed - SEED0, B=case.B, H=case.H, Hkv=case.Hkv, N=case.N, D=case.D,
                   dtype=case.dtype, causal=case.causal)
        try:
            ours = b.family != "library"
            kw = {"out": torch.full_like(q, float("nan"))} if ours else {}
            o = b.attend(q, k, v, causal=case.causal, **kw)
            first = None
            if ours:  # judge the repeated call: the one a user's loop makes, from the plans the first call made
                first, kw = o, {"out": torch.full_like(q, float("nan"))}
                o = b.attend(q, k, v, causal=case.causal, **kw)
            if oracle not in refs:
                try:
                    refs[oracle] = reference.attend(q, k, v, causal=case.causal, ablation=oracle)
                except torch.OutOfMemoryError:  # the build is not to blame: its row says what did not fit
                    refs[oracle] = None
            if refs[oracle] is None:
                row.update(status="oom: the fp64 oracle")
            else:
                v_ = accuracy.judge(o, q, k, v, causal=case.causal, ablation=oracle, ref=refs[oracle])
                unwritten = int(torch.isnan(o).sum())
                repeats = first is None or torch.equal(first, o)
                ok = v_.ok and unwritten == 0 and repeats
                row.update(status="ok" if ok else "FAIL" if repeats else "FAIL: a repeated call differs from the first",
                           err=v_.err, limit=v_.limit, err_lowp=v_.err_lowp, unwritten=unwritten)
        except builds.Unsupported as e:
            row.update(status=f"unsupported: {e}")
        except torch.OutOfMemoryError:
            row.update(status="oom")
        except Exception as e:  # noqa: BLE001 - one broken build must not hide the others' results
            row.update(status=one_line(f"FAIL: {type(e).__name__}: {e}", 600))
        rows.append(row)
    return rows


def _part(text: str) -> tuple[int, int]:
    """'K/J' → (K, J) with 0 <= K < J; ValueError naming the form otherwise."""
    try:
        k, j = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--part: expected K/J (this process's share of the shapes, 0 <= K < J), got {text!r}") \
            from None
    if not 0 <= k < j:
        raise ValueError(f"--part: expected 0 <= K < J, got {text!r}")
    return k, j


def family(case) -> tuple:
    """What a shape's kernels are compiled for, but for its length and batch: shapes of one family compile the same
    kernel variants (or ones that differ by N alone), so one process should compile them."""
    return case.dtype, case.D, case.causal


def deal(cases: list, jobs: int) -> list[int]:
    """The part (0 … jobs − 1) that checks each shape: the families in the grid's order, dealt round robin, so that no
    two processes compile the same variants at once. Dealing shape i to part i % jobs does that for 4 processes on
    the GPU grid by luck of its order, and not for 8 (parts at N = 512 and 2048 against 1024 and 4096)."""
    order: dict = {}
    return [order.setdefault(family(c), len(order)) % jobs for c in cases]


def in_parallel(argv: list[str], jobs: int, owners: list[int], module: str = "attnlab.gate") -> list[dict]:
    """The gate's rows from `jobs` child processes (`python -m module`: this gate's, or the gradient gate's), child k
    taking the shapes i with owners[i] == k (deal; each with the seed a single process would give it, so the rows are
    the ones one process writes). A child that dies loses only the shapes it had not finished (its CSV is rewritten per
    shape): each of those gets one FAIL row saying so, with the end of the child's output."""
    import os
    import subprocess
    import tempfile

    import pandas as pd

    rows = []
    with tempfile.TemporaryDirectory() as d:
        children = []
        for k in range(jobs):
            log = open(os.path.join(d, f"part{k}.log"), "w")
            cmd = [sys.executable, "-m", module, *argv, "--part", f"{k}/{jobs}", "--out",
                   os.path.join(d, f"part{k}.csv")]
            children.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
        for k, (child, log) in enumerate(children):
            code = child.wait()
            log.close()
            csv = os.path.join(d, f"part{k}.csv")
            part_rows = pd.read_csv(csv).to_dict("records") if os.path.exists(csv) and os.path.getsize(csv) else []
            done = {r["shape"] for r in part_rows}
            lost = [i for i, owner in enumerate(owners) if owner == k and i not in done]
            if lost:
                with open(os.path.join(d, f"part{k}.log")) as f:
                    tail = " | ".join(f.read().strip().splitlines()[-3:])
                why = f"FAIL: part {k}/{jobs} exited with {code} before this shape's rows: {tail}"[:600]
                part_rows += [dict(build=ALL_BUILDS, shape=i, status=why, err=float("nan"), err_limit=float("nan"))
                              for i in lost]
            rows += part_rows
    return sorted(rows, key=lambda r: r["shape"])


def summarise(rows: list[dict]) -> str:
    import pandas as pd

    if not rows:
        return "(no shapes in this part)"
    df = pd.DataFrame(rows)
    df["state"] = df.status.str.split(":").str[0]
    ratio = (df.err / df.limit).where(df.state == "ok")
    keys = ["build"] + (["grad"] if "grad" in df else [])  # the gradient gate's rows: one a gradient
    out = df.assign(ratio=ratio).groupby(keys, sort=False).agg(
        cases=("status", "size"), ok=("state", lambda s: int((s == "ok").sum())),
        failed=("state", lambda s: int(s.str.startswith("FAIL").sum())),
        unsupported=("state", lambda s: int((s == "unsupported").sum())),
        worst_err=("err", "max"), worst_err_over_limit=("ratio", "max"))
    return out.to_string(float_format=lambda x: f"{x:.2e}")


@dataclass(frozen=True)
class Checker:
    """What a gate checks, for main: each shape's rows (check_case's signature), the builds it checks by default on a
    device, the build a --builds name stands for (ValueError for one it cannot check), the module a --jobs child runs,
    and the words of its command line, its report and its summary line."""

    check_case: Callable
    default_builds: Callable
    build: Callable
    module: str
    prog: str
    doc: str
    title: str
    summary: str


def _build(name: str) -> str:
    from attnlab import builds

    return builds.get(name).name


FORWARD = Checker(check_case, default_builds, _build, "attnlab.gate", "attnlab check", __doc__, "correctness gate",
                  "gate")


def main(argv: list[str] | None = None, checker: Checker = FORWARD) -> int:
    """The command line of the gate (attnlab check), or of another `checker` (attnlab.grad_gate)."""
    from attnlab import args as cli

    ap = cli.Parser(prog=checker.prog, description=checker.doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", type=cli.device, help="auto (GPU if present), cuda or cpu")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--builds", default=None, help="comma-separated build names (default: all that suit the device)")
    ap.add_argument("--tiles", default=None, type=cli.existing_file,
                    help="tile overrides: a tiles.json written by attnlab bench --autotune")
    ap.add_argument("--ns", default=None, type=cli.ints(1),
                    help="comma-separated sequence lengths (default: the grid's)")
    ap.add_argument("--dtypes", default=None, type=cli.choices(("bfloat16", "float16", "float32"), "dtypes"),
                    help="comma-separated dtypes to keep (e.g. float32; default: all)")
    ap.add_argument("--out", default=None, type=cli.out_file, help="write one CSV row per (build, case) here")
    ap.add_argument("--jobs", type=cli.positive_int, default=1, help="processes sharing the shapes (default 1)")
    ap.add_argument("--part", default=None, help="K/J: only the shapes deal() gives part K of J (what each of --jobs "
                    "J runs)")
    ap.add_argument("--cases", default=None, type=cli.existing_file,
                    help="check these shapes instead of the grid: a JSON list of {B, H, Hkv, N, D, dtype, causal} "
                         "(what the walkthrough's gate hands its processes)")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # --help (0) and usage errors (2), as a return code
        return int(e.code or 0)
    try:
        part = _part(args.part) if args.part else (0, 1)
        if args.jobs > 1 and args.part:
            raise ValueError(f"--jobs: no --part with it (each of the {args.jobs} processes gets its own part)")
        if args.cases and (args.quick or args.ns):
            raise ValueError("--cases names the shapes itself: no --quick or --ns with it")
    except ValueError as e:
        print(f"attnlab check: error: {e}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    if device.type == "cpu":
        from attnlab import environment

        environment.use_interpreter()  # before the kernels are defined
    from attnlab.triton import plan

    try:
        names = [checker.build(n) for n in args.builds.split(",")] if args.builds else checker.default_builds(device)
        overrides = plan.read_overrides(args.tiles) if args.tiles else plan.NONE
    except ValueError as e:
        print(f"attnlab check: error: --builds/--tiles: {e}", file=sys.stderr)
        return 2
    try:
        cases = read_cases(args.cases, device) if args.cases else grid(device, args.quick, args.ns)
    except ValueError as e:
        print(f"attnlab check: error: argument --cases: {e}", file=sys.stderr)
        return 2
    if args.dtypes:
        known = sorted({c.dtype for c in cases})
        if not set(args.dtypes) <= set(known):
            print(f"attnlab check: error: --dtypes: {','.join(args.dtypes)!r} is not in this grid's dtypes {known}",
                  file=sys.stderr)
            return 2
        cases = [c for c in cases if c.dtype in args.dtypes]
    with plan.overriding(overrides):
        return _run(args, argv, cases, names, device, part, checker)


def _run(args, argv, cases: list, names: list[str], device: torch.device, part: tuple[int, int],
         checker: Checker) -> int:
    """Check the cases, in this process or in --jobs children; print and write the rows; 1 where any failed."""
    print(f"{checker.title} on {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}):"
          f" {len(cases)} shapes x {len(names)} builds" + (f", {args.jobs} processes" if args.jobs > 1 else "") +
          (f", part {part[0]}/{part[1]}" if args.part else ""), flush=True)
    t0 = time.time()
    if args.jobs > 1:
        child_argv = _without(list(argv if argv is not None else sys.argv[1:]), ("--jobs", "--out"))
        rows = in_parallel(child_argv, args.jobs, deal(cases, args.jobs), checker.module)
        for r in rows:
            if str(r["status"]).startswith("FAIL"):
                _print_fail(r, f"shape {r['shape']}")
        if args.out:
            import pandas as pd

            pd.DataFrame(rows).to_csv(args.out, index=False)
    else:
        rows = []
        owners = deal(cases, part[1])
        for i, case in enumerate(cases):
            if owners[i] != part[0]:
                continue
            new = checker.check_case(case, names, device, seed=SEED0 + i)
            rows += new
            if device.type == "cuda":  # the processes of --jobs share one card: what one caches, the others lack
                torch.cuda.empty_cache()
            if args.out:
                import pandas as pd

                pd.DataFrame(rows).to_csv(args.out, index=False)  # rewritten per shape: a crash loses no finished row
            for r in new:
                if r["status"].startswith("FAIL"):
                    _print_fail(r, case)
    print(summarise(rows))
    n_fail = sum(str(r["status"]).startswith("FAIL") for r in rows)
    n_skip = sum(str(r["status"]).startswith(("unsupported", "oom")) for r in rows)
    print(f"{checker.summary}: {len(rows) - n_fail - n_skip} passed, {n_fail} failed, {n_skip} skipped "
          f"(unsupported or oom; {time.time() - t0:.0f} s)")
    return 1 if n_fail else 0


def _print_fail(row: dict, where) -> None:
    grad = f" {row['grad']}" if "grad" in row else ""
    print(f"  FAIL {row['build']}{grad} {where}: {row['status']} err={row.get('err')} limit={row.get('limit')}",
          flush=True)


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """argv less the named options and their values (as `--opt value` or `--opt=value`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not a.startswith(tuple(o + "=" for o in options)):
            out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
