"""The run's lifecycle: the parameters cell validated, a run begun (device, folder, params.yaml, ceilings in
provenance.json) or loaded, the correctness gate, the timed sweep behind it, and section 3's correctness tables.

    p = params(**cell)          the notebook's parameters cell (the params files' keys + out_dir), validated
    run = begin(p)              device, output folder (a new outputs/<gpu-or-cpu>/<time>/, or out_dir to resume),
                                provenance with the ceilings measured once for the run
    gate(run)                   every build of the grid against the fp64 oracle at every shape of the run
    sweep_run(run)              the timed grid, a progress bar, appended row by row (resumable into the same folder)
    run = load(folder)          a finished run: results, provenance, gate rows
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
import yaml

from attnlab import ceilings, measure, cost, provenance, sweep
from attnlab.lab.notebook import progress_bar
from attnlab.report import correctness as cr

OURS = ("materialised", "qk_softmax", "fused")
KEYS = ("name", "device", "dtype", "seq_lens", "head_dims", "causal", "batch_policy", "batch", "heads", "tokens",
        "width", "group", "builds", "warmup_ms", "reps_ms", "min_reps", "ref_budget_gib", "seed")
GATE = "gate.csv"
PARAMS = "params.yaml"
# Builds the gate leaves to the sweep: compiled FlexAttention compiles once per shape (seconds each, minutes on a
# CPU); the sweep checks every row it measures against the same oracle and rule (its err and err_limit columns).
GATE_SKIPS = {"flex": "compiled once per shape; checked against the oracle on every sweep row instead"}
# Processes compiling our kernels at once before the gate on a GPU (attnlab.warm): most of a fresh GPU machine's first
# minutes are Triton compiling, one CPU core a process; four, because the warm cases reach the grid's largest N, where
# the materialised builds hold tens of GB each. The gate and the sweep then load the kernels from Triton's cache.
WARM_JOBS = 4


def params(**cell) -> dict:
    """The parameters cell as validated params (attnlab.sweep.validate; cell_params)."""
    return cell_params(cell, KEYS, sweep.validate)


def cell_params(cell: dict, keys, validate) -> dict:
    """A parameters cell of `keys` (and out_dir) as `validate` checks params: None means 'not given', and the keys of
    the batch policy not chosen are dropped (the cell defines both pairs so papermill can inject either); a name
    not in `keys` is a ParamsError."""
    unknown = sorted(set(cell) - set(keys) - {"out_dir"})
    if unknown:
        raise sweep.ParamsError(unknown[0], cell[unknown[0]], f"is not a params key; known: {', '.join(keys)}, "
                                                               "out_dir")
    other = [k for policy, names in sweep.POLICIES.items() if policy != cell.get("batch_policy") for k in names]
    return validate({k: v for k, v in cell.items() if v is not None and k not in other})


@dataclass
class Run:
    """One run's folder and what is in it."""

    out: Path
    params: dict
    device: str
    provenance: dict
    results: pd.DataFrame = field(default_factory=pd.DataFrame)
    gate: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def device_name(self) -> str:
        return str(self.provenance.get("device", {}).get("name", self.device))

    @property
    def ceilings(self) -> dict:
        return self.provenance.get("ceilings", {}).get(self.params["dtype"], {})


def new_folder(device: str, root: Path | None = None) -> Path:
    """outputs/<gpu-or-cpu>/<time>/ under the repository, made now; a name already taken gets a suffix, so a run never
    writes into another's folder."""
    base = (root or provenance.REPO) / sweep.default_out_dir(device)
    for i in range(1000):
        out = base if i == 0 else base.with_name(f"{base.name}-{i + 1}")
        try:
            out.mkdir(parents=True)
            return out
        except FileExistsError:
            continue
    raise FileExistsError(f"{base}: no free folder name")


def open_folder(p: dict, params_name: str = PARAMS) -> tuple[Path, str, dict]:
    """(folder, device, params with out_dir set): the params' device resolved, their out_dir made or reopened (else a
    new_folder), and the params written in it as `params_name` (each page's own name, so that the model and training
    pages can share a folder with the walkthrough's params.yaml)."""
    device = sweep.resolve_device(p)
    if p["out_dir"]:
        out = Path(p["out_dir"])
        sweep.check_out_dir(out)
        out.mkdir(parents=True, exist_ok=True)
    else:
        out = new_folder(device)
    p = {**p, "out_dir": str(out)}
    (out / params_name).write_text(yaml.safe_dump({k: v for k, v in p.items() if k != "out_dir"}, sort_keys=False))
    return out, device, p


def read_folder(run: "Run", provenance_name: str, results_name: str, read_results: Callable) -> "Run":
    """`run` with its provenance (the file provenance_name) and its rows (read_results(folder), where the file
    results_name is there) as its folder holds them now: another notebook's run (a training run, say)."""
    prov = run.out / provenance_name
    if prov.exists():
        run.provenance = json.loads(prov.read_text())
    if (run.out / results_name).exists():
        run.results = read_results(run.out)
    return run


def load_folder(folder, provenance_name: str, read: Callable[["Run"], "Run"]) -> "Run":
    """A finished run of another notebook (a training run, say) from its folder: its provenance file
    `provenance_name` (ValueError where there is none), its params and device from it, then read(run) adds its
    rows."""
    out = Path(folder)
    prov = out / provenance_name
    if not prov.exists():
        raise ValueError(f"{out} holds no {provenance_name}: give that run's output folder")
    data = json.loads(prov.read_text())
    return read(Run(out, data.get("params", {}), str(data.get("device", {}).get("device", "cpu")), data))


def begin(p: dict) -> Run:
    """Resolve the device, make or reopen the output folder and write its params.yaml (open_folder); measure the
    run's ceilings once into provenance.json (the sweep reuses them, so the rows, the roofline and section 2 quote
    one pair)."""
    out, device, p = open_folder(p)
    prov_path = out / sweep.PROVENANCE
    prov = json.loads(prov_path.read_text()) if prov_path.exists() else {}
    if p["dtype"] not in prov.get("ceilings", {}):
        here = provenance.collect(device)
        prov = {**here, **prov, "run_id": out.name, "results": sweep.RESULTS, "params": prov.get("params", p),
                "started": prov.get("started", provenance.now()), "ended": prov.get("ended"),
                "ceilings": {**prov.get("ceilings", {}), p["dtype"]: ceilings.measure_ceilings(device, p["dtype"])},
                "sessions": prov.get("sessions", [])}
        tmp = prov_path.with_name(prov_path.name + ".tmp")
        tmp.write_text(json.dumps(prov, indent=2, default=str) + "\n")
        os.replace(tmp, prov_path)
    run = Run(out, p, device, prov)
    if (out / sweep.RESULTS).exists():
        run.results = sweep.read_results(out)
    if (out / GATE).exists():
        run.gate = pd.read_csv(out / GATE)
    return run


def load(folder) -> Run:
    """A run's folder as written by begin/gate/sweep (or by `attnlab sweep`): results, provenance, gate rows."""
    out = Path(folder)
    prov_path = out / sweep.PROVENANCE
    if not prov_path.exists():
        raise ValueError(f"{out} holds no {sweep.PROVENANCE}: give a run's output folder")
    prov = json.loads(prov_path.read_text())
    run = Run(out, prov.get("params", {}), str(prov.get("device", {}).get("device", "cpu")), prov,
              sweep.read_results(out / prov.get("results", sweep.RESULTS)))
    if (out / GATE).exists():
        run.gate = pd.read_csv(out / GATE)
    return run


def run_shapes(run: Run) -> list[measure.Case]:
    """One case per distinct shape of the run's grid, in the grid's order."""
    seen = {}
    for c in sweep.grid(run.params, run.device):
        seen.setdefault((c.B, c.H, c.Hkv, c.N, c.D, c.dtype, c.causal), c)
    return list(seen.values())


def gate_builds(p: dict) -> list[str]:
    return [b for b in p["builds"] if b not in GATE_SKIPS]


def gate(run: Run, progress: bool = True, jobs: int | None = None) -> pd.DataFrame:
    """Section 3: every build of the grid (but GATE_SKIPS) against the fp64 oracle (each ablation against its own) at
    every shape of the run, on fresh random inputs and a NaN-poisoned output (attnlab.gate.check_case). A shape whose
    fp64 scores exceed ref_budget_gib is checked on fewer batches, then heads (attnlab.measure.ref_slice): the same N
    and D, the same kernels. Rows go to gate.csv shape by shape; a folder that has them is not checked again. On a
    GPU our kernels are first compiled for the grid in WARM_JOBS processes (attnlab.warm)."""
    from attnlab import gate as gate_mod

    names = gate_builds(run.params)
    path = run.out / GATE
    done = pd.read_csv(path) if path.exists() else pd.DataFrame()
    # a shape whose process died (an ALL_BUILDS row) is checked again: the death may not recur
    rows = [r for r in done.to_dict("records") if r["build"] != gate_mod.ALL_BUILDS]
    seen = {tuple(r[k] for k in ("N", "D", "dtype", "causal")) for r in rows}
    todo = [(i, c) for i, c in enumerate(run_shapes(run)) if (c.N, c.D, c.dtype, c.causal) not in seen]
    if todo and run.gpu:
        from attnlab import warm

        t0 = time.perf_counter()
        lines = warm.warm(str(run.out / PARAMS), WARM_JOBS)
        print(f"our kernels compiled for the grid in {time.perf_counter() - t0:.0f} s ({WARM_JOBS} processes)")
        for line in lines:
            if " 0 failed" not in line:  # only news is said: a case that failed here is compiled by the gate
                print(f"warm: {line.strip()}")
    budget = int(run.params["ref_budget_gib"] * cost.GiB)
    small = []  # (the shape's index in the run, the run's case, the case the gate checks: the slice ref_slice gives)
    for i, case in todo:
        b, h, _ = measure.ref_slice(case, budget)
        small.append((i, case, measure.Case("gate", b, h, h // (case.H // case.Hkv), case.N, case.D, case.dtype,
                                            case.causal, run.device)))
    if jobs is None:  # a process a family of shapes on a GPU (compiling is most of the gate there); one on a CPU
        jobs = min(gate_mod.default_jobs(), len({gate_mod.family(c) for _, _, c in small})) if run.gpu else 1
    if jobs > 1:  # the shapes' families dealt to processes, as `attnlab check --jobs` does: compiling is most of it
        rows += gate_in_processes(run, small, names, jobs)
        pd.DataFrame(rows).to_csv(path, index=False)
    one = list(enumerate(small)) if jobs == 1 else []  # in processes (jobs > 1) the shapes were checked above
    for p, (i, case, checked) in progress_bar("gate")(one, unit="shape", disable=not progress) if one else []:
        rows += [{**r, "shape": i, "run_B": case.B, "run_H": case.H}  # seeded by p, as gate_in_processes seeds it
                 for r in gate_mod.check_case(checked, names, run.device, seed=gate_mod.SEED0 + p)]
        pd.DataFrame(rows).to_csv(path, index=False)  # rewritten per shape: a crash loses no finished shape
    run.gate = pd.DataFrame(rows)
    verdicts = cr.correctness_table(run.gate)["verdict"].value_counts()
    print(f"gate: {len(run_shapes(run))} shapes x {len(names)} builds in {path}: "
          + ", ".join(f"{verdicts.get(v, 0)} {v}" for v in cr.VERDICTS)
          + (f" ({', '.join(GATE_SKIPS)} left to the sweep's own checks)" if set(GATE_SKIPS) & set(run.params['builds'])
             else ""))
    return run.gate


def gate_in_processes(run: Run, small: list, names: list[str], jobs: int) -> list[dict]:
    """The gate's rows for `small` ((index, run's case, checked case) triples) from `jobs` processes of `attnlab
    check --cases` (attnlab.gate), each shape dealt by family and seeded as the single process seeds it; a process
    that dies leaves FAIL rows for the shapes it had not finished (gate.in_parallel)."""
    from attnlab import gate as gate_mod

    cases = run.out / "gate_cases.json"
    cases.write_text(json.dumps([{k: getattr(c, k) for k in gate_mod.CASE_KEYS} for _, _, c in small]))
    argv = ["--device", str(run.device), "--builds", ",".join(names), "--cases", str(cases)]
    t0 = time.perf_counter()
    rows = gate_mod.in_parallel(argv, jobs, gate_mod.deal([c for _, _, c in small], jobs))
    cases.unlink()
    print(f"gate: {len(small)} shapes in {jobs} processes, {time.perf_counter() - t0:.0f} s")
    # the file's position p is the shape's seed offset there: give each row the run's own index and batch, and a
    # dead process's ALL_BUILDS row the shape it stands for
    out = []
    for r in rows:
        index, case, checked = small[r["shape"]]
        out.append({**{k: getattr(checked, k) for k in gate_mod.CASE_KEYS}, **r, "shape": index, "run_B": case.B,
                    "run_H": case.H})
    return out


class GateFailed(RuntimeError):
    """The gate failed a build: its timings would describe a wrong program, so the sweep does not start."""


def gate_failures(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["verdict"] == "FAIL"]


def sweep_run(run: Run, progress: bool = True) -> pd.DataFrame:
    """Section 4: the timed grid (attnlab.sweep.run) into the run's folder, a row appended as each case finishes; a
    folder holding rows resumes where it stopped. Refuses to start while the gate has a failure."""
    if run.gate.empty:
        raise GateFailed("run the gate first (lab.gate(run)): timings of an unchecked build may describe a wrong "
                         "program")
    failed = gate_failures(cr.correctness_table(run.gate))
    if len(failed):
        which = ", ".join(sorted(set(failed["build"])))
        raise GateFailed(f"the correctness gate failed {len(failed)} (build, shape) pair(s), of {which}: not timing "
                         f"wrong programs (`attnlab sweep --params {run.out / PARAMS}` times them anyway)")
    run.results = sweep.run(run.params, out_dir=run.out, progress=progress, bar=progress_bar("sweep"))
    bad = run.results[run.results["status"] != "ok"]
    print(f"{len(run.results)} rows in {run.out / sweep.RESULTS}" + (f" ({len(bad)} not ok: their status column "
                                                                      "says why)" if len(bad) else ""))
    return run.results


def correctness(run: Run) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Section 3's tables: per build (shapes, passed, failed, not run, worst err / limit); the grid of every shape
    and build, each cell err / limit and a mark (✓ pass, ✗ FAIL, — not run); the rows that failed or did not run,
    with why."""
    table = cr.correctness_table(run.gate)
    marks = {"pass": "✓", "FAIL": "✗", "not run": "—"}
    cell = [f"{x:.2f} {marks[v]}" if math.isfinite(x) else marks[v]
            for x, v in zip(table["err_over_limit"], table["verdict"])]
    grid = table.assign(cell=cell).pivot_table(index=["dtype", "causal", "D", "N"], columns="build", values="cell",
                                               aggfunc="first")
    grid = grid[[b for b in dict.fromkeys(table["build"])]]
    grid.columns.name = "err / limit"
    return cr.correctness_summary(table), grid, table[table["verdict"] != "pass"].reset_index(drop=True)
