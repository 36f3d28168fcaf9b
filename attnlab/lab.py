"""What the walkthrough (notebooks/attention_lab.ipynb) calls: run a params grid's gate and sweep, load a run, and
every table, figure and computed answer its sections show. The notebook holds prose and calls into this module.

    p = params(**cell)          the notebook's parameters cell (the params files' keys + out_dir), validated
    run = begin(p)              device, output folder (a new outputs/<gpu-or-cpu>/<time>/, or out_dir to resume),
                                provenance with the ceilings measured once for the run
    gate(run)                   every build of the grid against the fp64 oracle at every shape of the run
    sweep(run)                  the timed grid, a progress bar, appended row by row (resumable into the same folder)
    run = load(folder)          a finished run: results, provenance, gate rows

Where the speed and memory lessons come from (`lessons(run)`): this run's own rows when it ran on a CUDA GPU and
measured our three builds; otherwise the newest committed GPU run (`reference_run`: the newest outputs/<gpu>/<run>/
whose provenance names a CUDA device and whose results hold materialised, qk_softmax and fused), and every section
says so. On a CPU our kernels run in Triton's interpreter, whose timings measure Python; they are never shown as
speed. What is true on a CPU is run there: the gate, the ablations against their own oracles, the byte and memory
model, the method. ATTNLAB_OUTPUTS (an environment variable) points reference_run at another outputs folder.
"""
from __future__ import annotations

import functools
import html
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
import yaml

from attnlab import builds, ceilings, measure, model, provenance, report, sweep
from attnlab.runs import find_runs, outputs_root, reference_run, started
from attnlab import model as bd
from attnlab.report import correctness as cr
from attnlab.report import curves, roofline
from attnlab.report.ablation import ablation_table
from attnlab.report.memory import memory_table, peak_table

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
def threshold(sp: pd.DataFrame) -> float:
    """The speedup check-yourself asks about: the first whole multiple above the slowest curve's start (3× where the
    slowest starts between 2× and 3×), so the question has an N to find on at least one curve."""
    return float(math.floor(sp.iloc[:, 0].min()) + 1)


# -- the notebook's setting up ------------------------------------------------------------------------------------

RENDERER = "plotly_mimetype+notebook_offline"


def offline_renderer():
    """plotly's 'notebook' renderer (plotly.js inline, once per kernel) without the MathJax script it adds from a CDN
    to every figure: the walkthrough's figures use no LaTeX, and an exported page must fetch nothing."""
    import re

    from plotly.io._base_renderers import NotebookRenderer

    class OfflineNotebookRenderer(NotebookRenderer):
        def to_mimebundle(self, fig_dict):
            bundle = super().to_mimebundle(fig_dict)
            bundle["text/html"] = re.sub(r'<script[^>]*\bsrc="https?://[^"]*mathjax[^"]*"[^>]*>\s*</script>', "",
                                         bundle["text/html"])
            return bundle

    return OfflineNotebookRenderer()


def setup() -> dict:
    """Figures that survive an HTML export (RENDERER: JupyterLab's own plotly view, and HTML with plotly.js inline
    once), wide tables, and what runs this kernel: its python, and where attnlab comes from (a user-level
    kernelspec can point at another environment)."""
    import plotly.io as pio

    pio.renderers["notebook_offline"] = offline_renderer()
    pio.renderers.default = RENDERER
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)
    pd.set_option("display.max_colwidth", 250)  # notes say why a number is what it is: keep them whole
    missing = [m for m in ("papermill", "ipywidgets", "plotly") if _absent(m)]
    info = {"python": sys.executable, "prefix": sys.prefix, "attnlab": str(Path(__file__).resolve().parent),
            "torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if missing:
        info["warning"] = (f"this kernel's environment lacks {', '.join(missing)}: it is not the one `make install` "
                           "built; pick that environment's kernel")
    return info


def _absent(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def params(**cell) -> dict:
    """The parameters cell as validated params (attnlab.sweep.validate): None means 'not given', and the keys of the
    batch policy not chosen are dropped (the cell defines both pairs so papermill can inject either)."""
    unknown = sorted(set(cell) - set(KEYS) - {"out_dir"})
    if unknown:
        raise sweep.ParamsError(unknown[0], cell[unknown[0]], f"is not a params key; known: {', '.join(KEYS)}, "
                                                               "out_dir")
    other = [k for policy, keys in sweep.POLICIES.items() if policy != cell.get("batch_policy") for k in keys]
    return sweep.validate({k: v for k, v in cell.items() if v is not None and k not in other})


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


def begin(p: dict) -> Run:
    """Resolve the device, make or reopen the output folder and write its params.yaml; measure the run's ceilings
    once into provenance.json (the sweep reuses them, so the rows, the roofline and section 2 quote one pair)."""
    device = sweep.resolve_device(p)
    if p["out_dir"]:
        out = Path(p["out_dir"])
        sweep.check_out_dir(out)
        out.mkdir(parents=True, exist_ok=True)
    else:
        out = new_folder(device)
    p = {**p, "out_dir": str(out)}
    (out / PARAMS).write_text(yaml.safe_dump({k: v for k, v in p.items() if k != "out_dir"}, sort_keys=False))
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


# -- sections 2 to 4: the device, the gate, the sweep -------------------------------------------------------------

def _facts(prov: dict, dtype: str, out) -> list[tuple[str, str]]:
    dev, sw, git = prov.get("device", {}), prov.get("software", {}), prov.get("git", {})
    c = prov.get("ceilings", {}).get(dtype, {})
    return [
        ("device", f"{dev.get('name')} ({dev.get('device')})"),
        ("compute capability", dev.get("capability") or "none (CPU)"),
        ("memory", readable_bytes(dev["total_memory"]) if dev.get("total_memory") else "n/a"),
        ("driver / CUDA", f"{dev.get('driver_version') or 'n/a'} / {sw.get('cuda') or 'n/a'}"),
        ("torch / triton / python", f"{sw.get('torch')} / {sw.get('triton')} / {sw.get('python')}"),
        ("Triton interpreter", "on: our kernels run as Python, so their timings measure Python"
         if sw.get("triton_interpret") == "1" else "off: our kernels are compiled for the device"),
        ("commit", f"{git.get('commit') or 'not recorded'}{' (with uncommitted changes)' if git.get('dirty') else ''}"),
        ("code fingerprint", str(prov.get("code"))),
        ("dtype", dtype),
        ("copy bandwidth, measured", f"{c.get('tbps', math.nan):.4g} TB/s (read + written; {c.get('timer')})"),
        ("matmul rate, measured", f"{c.get('tflops', math.nan):.4g} TFLOP/s ({c.get('matmul_n')}³)"),
        ("ridge point", f"{c['tflops'] / c['tbps']:.3g} FLOP/byte" if c.get("tbps") else "n/a"),
        ("folder", relative_path(out)),
    ]


def summary(run: Run) -> pd.DataFrame:
    """Section 2: the device, the software, the commit and the ceilings this run measured, one fact a line. Where
    the speed lessons come from is said after the sweep (source_note), once this run's rows exist."""
    return pd.DataFrame(_facts(run.provenance, run.params["dtype"], run.out), columns=["what", "this run"])


def _shapes(run: Run) -> list[measure.Case]:
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
    from tqdm.auto import tqdm

    from attnlab import gate as gate_mod

    names = gate_builds(run.params)
    path = run.out / GATE
    done = pd.read_csv(path) if path.exists() else pd.DataFrame()
    # a shape whose process died (an ALL_BUILDS row) is checked again: the death may not recur
    rows = [r for r in done.to_dict("records") if r["build"] != gate_mod.ALL_BUILDS]
    seen = {tuple(r[k] for k in ("N", "D", "dtype", "causal")) for r in rows}
    todo = [(i, c) for i, c in enumerate(_shapes(run)) if (c.N, c.D, c.dtype, c.causal) not in seen]
    if todo and run.gpu:
        from attnlab import warm

        t0 = time.perf_counter()
        lines = warm.warm(str(run.out / PARAMS), WARM_JOBS)
        print(f"our kernels compiled for the grid in {time.perf_counter() - t0:.0f} s ({WARM_JOBS} processes)")
        for line in lines:
            if " 0 failed" not in line:  # only news is said: a case that failed here is compiled by the gate
                print(f"warm: {line.strip()}")
    budget = int(run.params["ref_budget_gib"] * model.GiB)
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
    for p, (i, case, checked) in tqdm(list(enumerate(small)) if jobs == 1 else [], desc="gate", unit="shape",
                                      disable=not progress):
        rows += [{**r, "shape": i, "run_B": case.B, "run_H": case.H}  # seeded by p, as gate_in_processes seeds it
                 for r in gate_mod.check_case(checked, names, run.device, seed=gate_mod.SEED0 + p)]
        pd.DataFrame(rows).to_csv(path, index=False)  # rewritten per shape: a crash loses no finished shape
    run.gate = pd.DataFrame(rows)
    verdicts = cr.correctness_table(run.gate)["verdict"].value_counts()
    print(f"gate: {len(_shapes(run))} shapes x {len(names)} builds in {path}: "
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
    run.results = sweep.run(run.params, out_dir=run.out, progress=progress)
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


# -- where the speed and memory lessons come from -----------------------------------------------------------------

def has_ours(results: pd.DataFrame) -> bool:
    if results.empty:
        return False
    ok = results[results["status"] == "ok"]
    return set(OURS) <= set(ok["build"])


def gpu_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The rows measured on a CUDA device (their `device` column), whatever the machine reading them."""
    if results.empty or "device" not in results:
        return results.iloc[0:0]
    return results[results["device"].astype(str).str.startswith("cuda")]


@dataclass
class Lessons:
    """The rows the speed and memory sections draw from, and where they come from."""

    results: pd.DataFrame
    folder: Path
    device_name: str
    own: bool  # this run's rows (a GPU run) rather than a committed reference run
    provenance: dict

    @property
    def label(self) -> str:
        where = relative_path(self.folder)
        if self.own:
            return f"this run, measured on {self.device_name} ({where})"
        commit = self.provenance.get("git", {}).get("commit") or "commit not recorded"
        return f"the committed run {where}, measured on {self.device_name} ({str(started(self.provenance))[:10]}, " \
               f"{commit[:10]})"

    @property
    def dtypes(self) -> list[str]:
        return sorted(self.results["dtype"].astype(str).unique())


def relative_path(folder: Path) -> str:
    try:
        return str(Path(folder).resolve().relative_to(provenance.REPO))
    except ValueError:
        return str(folder)


def _named(rows: pd.DataFrame, fallback: str) -> str:
    """The device the rows name (their most common device_name), else `fallback`."""
    names = rows["device_name"].dropna().astype(str) if "device_name" in rows else pd.Series(dtype=str)
    names = names[names != ""]
    return str(names.mode().iloc[0]) if len(names) else fallback


@functools.lru_cache(maxsize=8)
def _reference(folder: str, stamp: float) -> Run:
    """A committed run, loaded once per state of its results file (`stamp`, its modification time)."""
    return load(folder)


def lessons(run: Run | Lessons | None, root=None) -> Lessons | None:
    """The rows the speed and memory sections read, resolved from `run` as it is now (each section calls this when
    it runs, so a cell never reads rows an earlier cell captured): this run's own rows measured on a CUDA device,
    when they hold our three builds (a resumed run: every part's rows); else the newest committed GPU run's
    (reference_run under `root`); else None. A Lessons is returned as it is."""
    if run is None or isinstance(run, Lessons):
        return run
    mine = gpu_rows(run.results)
    if has_ours(mine):
        return Lessons(mine, run.out, _named(mine, run.device_name), True, run.provenance)
    folder = reference_run(root)
    if folder is None:
        return None
    results = folder / json.loads((folder / sweep.PROVENANCE).read_text()).get("results", sweep.RESULTS)
    ref = _reference(str(folder), results.stat().st_mtime if results.exists() else 0.0)
    return Lessons(ref.results, folder, ref.device_name, False, ref.provenance)


def source_note(run: Run, les: Lessons | None = None):
    """A line saying where the section's speed and memory numbers come from, and why. `les`: lessons(run) unless
    given."""
    from IPython.display import Markdown

    les = les or lessons(run)
    if les is None:
        return Markdown("**No GPU measurements to draw on:** this run has none and no committed GPU run was found "
                        f"under `{relative_path(outputs_root())}`. Render this notebook on a GPU (`make run`) to fill the "
                        "speed and memory sections.")
    if les.own:
        return Markdown(f"**Measured here:** {les.label}.")
    why = ("this machine has no GPU: our kernels run in Triton's interpreter, whose times measure Python, not kernels"
           if not run.gpu else "this run has not measured all three of our builds on it (yet)")
    c = les.provenance.get("ceilings", {}).get(les.dtypes[0], {}) if len(les.results) else {}
    roofs = (f" That run measured {c['tbps']:.3g} TB/s copy bandwidth and {c['tflops']:.3g} TFLOP/s matmul rate "
             f"({les.dtypes[0]}) on its card." if c.get("tbps") and c.get("tflops") else "")
    return Markdown(f"**From a committed GPU run, not from this machine:** {les.label}. Here {why}, so the speed and "
                    f"memory lessons are drawn from that run's rows.{roofs}")


def no_lessons():
    from IPython.display import Markdown

    return Markdown(f"*Nothing to show: no GPU rows (this run has none, and no committed GPU run was found under "
                    f"`{relative_path(outputs_root())}`).*")


def needs_lessons(many: bool = False):
    """A section function of the lesson rows, called with a Run (its lessons resolved now: lessons(run)) or with
    Lessons; given no GPU rows anywhere it says so instead of failing: one note, or a list holding it where the
    function returns a list."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(src, *args, **kw):
            les = lessons(src)
            if les is None:
                return [no_lessons()] if many else no_lessons()
            return fn(les, *args, **kw)
        return inner
    return wrap


# -- section 1 and 5: the hypothesis and the speedup curve --------------------------------------------------------

def hypothesis(p: dict):
    from IPython.display import Markdown

    ns = sorted(p["seq_lens"])
    return Markdown(
        f"**Hypothesis.** Fused's speedup over materialised grows with N and then flattens: at small N every build "
        f"moves few bytes and launches dominate; as N grows, materialised writes and reads back S and P (4·N² elements "
        f"per head) while fused moves only Q, K, V and O, until fused itself is bound by its arithmetic "
        f"(the exponentials and the two matmuls) and the ratio stops growing. **It is refuted** if the speedup "
        f"falls with N, stays flat from the first N, or is still rising by more than 5 % over the last doubling of "
        f"N. This run's grid: N = {', '.join(map(str, ns))}; D = {', '.join(map(str, p['head_dims']))}; "
        f"{p['dtype']}; causal {', '.join(map(str, p['causal']))}; batch policy `{p['batch_policy']}`.")


@needs_lessons(many=True)
def speedup_figures(les: Lessons) -> list:
    """Section 5: one figure per dtype (attnlab.report.curves.speedup_curves)."""
    return [curves.speedup_curves(les.results, dt) for dt in les.dtypes]


@needs_lessons()
def speedup_table(les: Lessons, build: str = "fused", baseline: str = "materialised") -> pd.DataFrame:
    """build's speedup over baseline per (dtype, causal, D) and N, wide: the numbers behind the curves."""
    parts = [report.speedup(g, baseline=baseline, builds=[build]) for g in report.split(les.results).values()
             if {build, baseline} <= set(g["build"])]
    t = pd.concat(parts, ignore_index=True)
    return t.pivot_table(index=["dtype", "causal", "D"], columns="N", values=f"x_vs_{baseline}").round(2)


@needs_lessons()
def trend(les: Lessons, build: str = "fused", baseline: str = "materialised") -> pd.DataFrame:
    """Per (dtype, causal, D): the speedup at the first and last N, its change over the first and the last doubling,
    and the shape that makes of the hypothesis."""
    return curves.speedup_trend(les.results, build=build, baseline=baseline)


@needs_lessons()
def batch_policy(les: Lessons) -> pd.DataFrame:
    """The (B, H) at each (D, N) of the lesson rows, with B·N and H·D: whether the grid holds tokens fixed (B·N one
    value: FlashAttention's shapes) or B and H fixed (the seeds' policy), read from the rows themselves."""
    ours = les.results[les.results["build"] == "fused"]
    t = ours[["dtype", "D", "N", "B", "H"]].drop_duplicates().sort_values(["dtype", "D", "N"])
    t = t.assign(tokens=t["B"] * t["N"], width=t["H"] * t["D"])
    return t.reset_index(drop=True)


def policy_of(results: pd.DataFrame) -> str:
    """'fixed_tokens' when B·N is one value at every N of each (dtype, D), 'fixed' when B and H are, else 'mixed'."""
    t = results[["dtype", "D", "N", "B", "H"]].drop_duplicates()
    if t.empty or t["N"].nunique() < 2:
        return "mixed"
    by = t.assign(tokens=t["B"] * t["N"]).groupby(["dtype", "D"])
    if (by["tokens"].nunique() == 1).all():
        return "fixed_tokens"
    if (by["B"].nunique() == 1).all() and (by["H"].nunique() == 1).all():
        return "fixed"
    return "mixed"


def policy_runs(les: Lessons, root=None) -> dict:
    """The lesson rows of their first dtype and, for each other batch policy, the newest GPU run of the same card
    holding our three builds (its rows of the same dtype, else of its own first dtype): label → rows of one dtype."""
    dtype = les.dtypes[0]
    mine = policy_of(les.results[les.results["dtype"].astype(str) == dtype])
    runs = {f"{mine} ({dtype}, {relative_path(les.folder)})": les.results[les.results["dtype"].astype(str) == dtype]}
    same_card = [f for f in find_runs(root) if f != les.folder
                 and json.loads((f / sweep.PROVENANCE).read_text()).get("device", {}).get("name") == les.device_name]
    seen = {mine}
    for folder in reversed(same_card):
        try:
            rows = sweep.read_results(folder)
        except (OSError, ValueError):
            continue
        dtypes = sorted(rows["dtype"].astype(str).unique())
        if not dtypes:
            continue
        theirs = dtype if dtype in dtypes else dtypes[0]
        rows = rows[rows["dtype"].astype(str) == theirs]
        policy = policy_of(rows)
        if policy not in seen and policy != "mixed" and has_ours(rows):
            seen.add(policy)
            runs[f"{policy} ({theirs}, {relative_path(folder)})"] = rows
    return runs


def curve_words(rows: pd.DataFrame, build: str = "fused", baseline: str = "materialised") -> str:
    """Each (dtype, causal, D) curve of `build` over `baseline` in words: its first, highest and last points and the
    shape speedup_trend gives it."""
    parts = []
    for r in curves.speedup_trend(rows, build=build, baseline=baseline).itertuples():
        t = report.speedup(report.split(rows)[(r.dtype, r.causal)], baseline=baseline, builds=[build])
        line = t[t["D"] == r.D].dropna(subset=[f"x_vs_{baseline}"]).sort_values("N")
        top = line.loc[line[f"x_vs_{baseline}"].idxmax()]
        peak = (f", highest {top[f'x_vs_{baseline}']:.2f}× at N = {int(top['N'])}"
                if int(top["N"]) not in (r.first_N, r.last_N) else "")
        parts.append(f"{'causal' if r.causal else 'non-causal'} D = {r.D}: {r.first:.2f}× at N = {r.first_N}{peak}, "
                     f"{r.last:.2f}× at N = {r.last_N} ({r.shape})")
    return "; ".join(parts)


@needs_lessons()
def batch_policy_note(les: Lessons):
    """What the lesson rows' batch policy is, what their curves did, and the same card's run of the other policy
    beside them when one is committed: every number from the rows."""
    from IPython.display import Markdown

    t = batch_policy(les)
    runs = policy_runs(les)
    mine, *others = runs
    policy = mine.split(" ")[0]
    if policy == "fixed_tokens":
        text = (f"**fixed tokens** (B·N = {int(t['tokens'].iloc[0])} and H·D = {int(t['width'].iloc[0])} at every "
                "N): every call holds the same number of query rows, so every N gives the card the same amount of "
                "parallel work.")
        other = "params/seeds-policy.yaml"
    elif policy == "fixed":
        text = (f"**fixed B and H** (B = {int(t['B'].iloc[0])}, H = {int(t['H'].iloc[0])} at every N, the seeds' "
                "policy): a call at small N holds few query rows, so it may leave much of the card idle, and the "
                "work per call grows as N².")
        other = "params/<gpu>.yaml"  # the card's own params hold tokens fixed
    else:
        text = "**mixed**: B and H change between N in no single pattern; read each curve with its row's B and H."
        other = "params/seeds-policy.yaml"
    text += f" Measured here, fused over materialised: {curve_words(runs[mine])}."
    for label in others:
        text += (f" On the same card under **{label.split(' ')[0].replace('_', ' ')}** ({label.split('(', 1)[1][:-1]}"
                 f"): {curve_words(runs[label])}. The figure below sets the two side by side.")
    if not others:
        text += (f" No run of another policy on this card is committed, so these rows cannot show what the policy "
                 f"does; `attnlab run --params {other}` on the same card renders one.")
    return Markdown(f"Batch policy of these rows: {text}")


@needs_lessons(many=True)
def batch_policy_figures(les: Lessons) -> list:
    """The speedup of fused over materialised for each batch policy a run of this card holds (policy_runs); nothing
    when only one policy was measured."""
    runs = policy_runs(les)
    return [curves.policy_figure(runs)] if len(runs) > 1 else []


def head_dim_words(les: Lessons) -> list[str]:
    """Per (dtype, causal) with two head dims or more, at the largest N all of them reach: the speedup per D beside
    S and P's round-trip bytes per FLOP of attention there, which scale as 1/D (S and P hold N² elements a head
    whatever D is; the FLOPs are 4·N²·D), and whether the curves are ordered as that predicts."""
    out = []
    for (dtype, causal), g in groups_of(les).items():
        if not {"fused", "materialised"} <= set(g["build"]):
            continue
        sp = report.speedup(g, builds=["fused"]).dropna(subset=["x_vs_materialised"])
        dims = sorted(int(d) for d in sp["D"].unique())
        common = set.intersection(*(set(sp[sp["D"] == d]["N"]) for d in dims)) if dims else set()
        if len(dims) < 2 or not common:
            continue
        n = max(common)
        at = sp[sp["N"] == n].set_index("D")
        x = {d: float(at.loc[d, "x_vs_materialised"]) for d in dims}
        per_flop = {}
        for d in dims:
            r = at.loc[d]
            case = measure.Case("fused", int(r["B"]), int(r["H"]), int(r["Hkv"]), n, d, dtype, causal, "cuda")
            moved = sum(bd.boundary_bytes(k, case.B, case.H, n, dtype, causal) for k in bd.BOUNDARIES)
            per_flop[d] = moved / model.flops(case)
        ordered = all(x[a] >= x[b] for a, b in zip(dims, dims[1:]))
        out.append(
            f"At N = {n} ({dtype}, {'causal' if causal else 'non-causal'}) fused over materialised is "
            + ", ".join(f"{x[d]:.2f}× at D = {d}" for d in dims)
            + ". S and P's round trips move " + ", ".join(f"{per_flop[d]:.3g} byte per FLOP at D = {d}" for d in dims)
            + ": 1/D, since S and P hold N² elements a head whatever D is while the FLOPs are 4·N²·D. "
            + ("So a larger D leaves materialised less extra traffic per unit of work and fused less to win, and "
               "its curve sits lower, as here." if ordered else
               "1/D predicts the larger D's curve sits lower; here it does not, so at this N something besides S "
               "and P's traffic sets the ratio (the ablations below look inside)."))
    return out


@needs_lessons()
def head_dim_note(les: Lessons):
    """head_dim_words as a paragraph, or the line that these rows hold one head dim."""
    from IPython.display import Markdown

    words = head_dim_words(les)
    return Markdown(" ".join(words) if words else "These rows hold one head dim, so they cannot show how D moves "
                                                  "the curve.")


# -- section 6: memory --------------------------------------------------------------------------------------------

def readable_bytes(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(x) >= size:
            return f"{x / size:.3g} {unit}"
    return f"{int(x)} B"


def _readable(t: pd.DataFrame, columns=None) -> pd.DataFrame:
    """Byte counts as KiB / MiB / GiB: `columns`, or those whose name ends in 'bytes'."""
    t = t.copy()
    for c in columns if columns is not None else [c for c in t.columns if c.endswith("bytes")]:
        t[c] = t[c].map(readable_bytes)
    return t


@needs_lessons(many=True)
def memory(les: Lessons, dtype: str | None = None, causal: bool = False) -> list[pd.DataFrame]:
    """Section 6: per shape, the predicted size of S (= P) beside every build's measured peak allocation, and the
    builds whose peak is not what their name says they hold (peak_table); per removed boundary, the peak bytes it saved
    beside the S or P it stops holding (memory_table). Bytes readable."""
    g = report.split(les.results)[(dtype or les.dtypes[0], causal)]
    peaks = peak_table(g)
    wide = peaks.pivot_table(index=["D", "N", "B", "H"], columns="build", values="peak_bytes", aggfunc="first")
    wide = wide[list(dict.fromkeys(peaks["build"]))]
    wide.insert(0, "S or P (predicted)", peaks.groupby(["D", "N", "B", "H"])["s_bytes"].first())
    wide = wide.map(readable_bytes)
    wide.columns.name = "peak allocation"
    odd = peaks[(peaks["peak_over_hold"] < 1) | (peaks["peak_over_hold"] > 1.5) | (peaks["note"] != "")]
    odd = odd[["D", "N", "build", "holds", "peak_bytes", "hold_bytes", "peak_over_hold", "note"]]
    saved = memory_table(g)[["D", "N", "boundary", "tensor", "saved_bytes", "predicted_bytes", "saved_over_predicted",
                             "note"]]
    return [wide, _readable(odd.reset_index(drop=True)), _readable(saved)]


def byte_model(run: Run) -> pd.DataFrame:
    """The byte model at this run's own shapes, true on any device: what each of our builds must hold and move
    (attnlab.model), and what each removed boundary moves (attnlab.model.boundary_bytes)."""
    rows = []
    for c in _shapes(run):
        case = {b: measure.Case(b, c.B, c.H, c.Hkv, c.N, c.D, c.dtype, c.causal, run.device) for b in OURS}
        rows.append({"causal": c.causal, "D": c.D, "N": c.N, "B": c.B, "H": c.H,
                     "S or P": bd.nn_bytes(c.B, c.H, c.N, c.dtype),
                     **{f"{b} holds": model.hold_bytes(case[b]) for b in OURS},
                     **{f"{b} moves": model.bytes_moved(case[b]) for b in OURS},
                     **{f"{k} moves": bd.boundary_bytes(k, c.B, c.H, c.N, c.dtype, c.causal) for k in bd.BOUNDARIES}})
    t = pd.DataFrame(rows)
    return _readable(t, [c for c in t.columns if c not in ("causal", "D", "N", "B", "H")])


# -- section 7: attribution by ablation ---------------------------------------------------------------------------

def groups_of(les: Lessons) -> dict:
    return report.split(les.results)


@needs_lessons()
def attribution(les: Lessons, dtype: str | None = None, causal: bool = False) -> pd.DataFrame:
    g = groups_of(les)[(dtype or les.dtypes[0], causal)]
    cols = ["D", "N", "boundary", "delta_ms", "bytes", "predicted_ms", "measured_over_predicted", "qk_passes",
            "qk_removed_ms", "measured_over_with_qk", "note"]
    return _readable(report.attribution(g)[cols], ["bytes"])


@needs_lessons()
def attribution_figure(les: Lessons, dtype: str | None = None, causal: bool = False):
    return curves.attribution_figure(groups_of(les)[(dtype or les.dtypes[0], causal)])


@needs_lessons()
def ablations(les: Lessons, base: str = "fused", dtype: str | None = None, causal: bool = False) -> pd.DataFrame:
    g = groups_of(les)[(dtype or les.dtypes[0], causal)]
    cols = ["D", "N", "base_ms", "softmax_saving_ms", "pv_saving_ms", "mask_cost_ms", "noise_ms", "dominant", "note"]
    return ablation_table(g, base=base)[cols]


@needs_lessons()
def ablation_figure(les: Lessons, base: str = "fused", dtype: str | None = None, causal: bool = False):
    from attnlab.report.figures import ablation_figure as fig

    return fig(groups_of(les)[(dtype or les.dtypes[0], causal)], base=base)


@needs_lessons()
def dominant(les: Lessons) -> pd.DataFrame:
    """The dominant stage of each of our builds at every shape and causal value (ablation_table's `dominant`; '—'
    where no stage's saving clears the noise or another's)."""
    parts = []
    for (dtype, causal), g in groups_of(les).items():
        for base in OURS:
            if any(b.startswith(f"{base}-") for b in g["build"]):
                t = ablation_table(g, base=base)
                parts.append(t[["dtype", "causal", "D", "N", "base", "dominant"]])
    if not parts:
        return pd.DataFrame(columns=["dtype", "causal", "D", "N"])
    t = pd.concat(parts).replace({"dominant": {"": "—"}})
    return t.pivot_table(index=["dtype", "causal", "D", "N"], columns="base", values="dominant",
                         aggfunc="first")[[b for b in OURS if b in set(t["base"])]]


SMALL_SHARE = 0.05  # a stage whose removal saves less than this share of its build's time is a finding to explain
# On Hopper an SM does 4096 dense 16-bit matmul FLOPs a clock and 16 exponentials (its MUFU units): H100 SXM's 989
# TFLOP/s of matmul against 3.9 TFLOP/s of exponentials (FlashAttention-3, section 3). Warp-specialised (Gluon)
# kernels run only on Hopper here, so this ratio is read only beside them.
HOPPER_FLOPS_PER_EXP = 256


def _stage_rows(les: Lessons, base: str) -> pd.DataFrame:
    """attnlab.report.ablation.stage_savings over every (dtype, causal) group that ablates `base`."""
    from attnlab.report.ablation import stage_savings

    parts = [stage_savings(g, base=base) for g in groups_of(les).values()
             if any(b.startswith(f"{base}-") for b in g["build"])]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _n_list(ns, every) -> str:
    """N values as 'N = a–b' when they run unbroken through `every` (the N the group measured), else listed."""
    ns, every = sorted(set(ns)), sorted(set(every))
    i = every.index(ns[0])
    if len(ns) > 2 and every[i:i + len(ns)] == ns:
        return f"N = {ns[0]}–{ns[-1]}"
    return "N = " + ", ".join(str(n) for n in ns)


def _pct(x: float, digits: int = 0) -> str:
    """A share as a percent with `digits` decimals, never '-0%'."""
    return f"{round(x * 100, digits) + 0:.{digits}f}%"


def _share_range(shares, digits: int = 0) -> str:
    lo, hi = _pct(min(shares), digits), _pct(max(shares), digits)
    return lo if lo == hi else f"{lo} to {hi}"


def _why_small(stage: str, rows: pd.DataFrame, base: str) -> str:
    """Why a stage's removal saved little, as far as the rows support it: overlap is offered as the likely cause only
    where the kernel running the stage beside other stages is warp-specialised (its tiles say gluon)."""
    name = "PV" if stage == "pv" else stage
    kernel = rows["kernel"].iloc[0]
    kinds = set(rows["kernel_kind"])
    if not kernel:
        return (f"In {base} the {name} has a kernel of its own, with no other stage to run under, so these rows give "
                "no reason to read it as overlap.")
    if kinds == {"triton"}:
        return (f"The {kernel} kernel's tiles here say Triton, not a warp-specialised Gluon kernel, so these rows give "
                "no reason to read it as overlap.")
    if kinds != {"gluon"}:
        return (f"These rows record no tiles for the {kernel} kernel, so whether it is warp-specialised is unknown, "
                "and they give no reason to read it as overlap.")
    flops = rows["flop_share"].dropna()
    evidence = (f"its matmul is {_share_range(flops)} of {base}'s counted FLOPs, yet removing it saves less than "
                f"{SMALL_SHARE:.0%} of the time" if len(flops) else f"removing it saves less than {SMALL_SHARE:.0%}")
    return (f"Likely cause: the {name} runs under other work. The evidence: {evidence}; and the {kernel} kernel is "
            "warp-specialised (its tiles say gluon): a loader warp feeds consumer warpgroups whose matmuls run "
            "asynchronously on the tensor cores while the softmax runs on the CUDA cores, so one stage can run while "
            "another computes, off the critical path.")


def overlap_findings(les: Lessons, base: str = "fused") -> list[str]:
    """The ablations of `base` that saved less than SMALL_SHARE of its time or made it slower, one line per (stage,
    kind of kernel) naming the shapes, with why as far as the rows support it (_why_small)."""
    t = _stage_rows(les, base)
    if t.empty:
        return []
    t = t[t["share"].notna() & (t["share"] < SMALL_SHARE)]
    measured = {k: list(g["N"]) for k, g in groups_of(les).items()}
    out = []
    for (stage, _), rows in t.groupby(["stage", "kernel_kind"], sort=False):
        name = "PV" if stage == "pv" else stage
        where = "; ".join(f"{dt} {'causal' if c else 'non-causal'} D = {d} at {_n_list(g['N'], measured[(dt, c)])}"
                          for (dt, c, d), g in rows.groupby(["dtype", "causal", "D"], sort=False))
        slower = rows[rows["saving_ms"] < -rows["noise_ms"]]
        ran = (f"; in {len(slower)} of them it ran slower by more than the noise, so its stand-in costs more than "
               f"the {name} it replaces" if len(slower) else "")
        out.append(f"{name}, in {len(rows)} shape(s) ({where}): removing it saved {_share_range(rows['share'], 1)} "
                   f"of {base}'s time" + (" (negative: it ran slower)" if rows["share"].min() < 0 else "") + f"{ran}. "
                   + _why_small(stage, rows, base))
    return out


@needs_lessons()
def overlap(les: Lessons, base: str = "fused"):
    """overlap_findings as a list in the page, or the line that there are none."""
    from IPython.display import Markdown

    lines = overlap_findings(les, base)
    if not lines:
        return Markdown(f"No ablation of {base} saved less than {SMALL_SHARE:.0%} of its time or made it slower.")
    return Markdown(f"Ablations of {base} that saved less than {SMALL_SHARE:.0%} of its time or made it slower "
                    f"({les.label}):\n\n" + "\n".join(f"- {x}" for x in lines))


@needs_lessons()
def pv_by_head_dim(les: Lessons, base: str = "fused"):
    """What removing PV saves at each head dim, from the rows, and why D changes it as far as they support: PV's
    FLOPs grow with D as QKᵀ's do, while the exponentials stay one per score, so at small D the softmax bounds a
    warp-specialised kernel and PV runs under it."""
    from IPython.display import Markdown

    t = _stage_rows(les, base)
    t = t[(t["stage"] == "pv") & t["share"].notna()] if not t.empty else t
    if t.empty:
        return Markdown(f"No row here removes PV from {base}.")
    by_d = {int(d): g for d, g in t.groupby("D")}
    med = {d: float(g["share"].median()) for d, g in by_d.items()}
    said = " and ".join(f"{_pct(med[d])} at D = {d} ({_share_range(g['share'])} over {len(g)} shapes)"
                        for d, g in by_d.items())
    text = (f"Removing PV saves a median {said} of {base}'s time"
            + (" (negative: the ablation ran slower)" if min(med.values()) < 0 else "") + f"; {les.label}.")
    dims = sorted(by_d)
    if len(dims) < 2:
        return Markdown(text + " This run measured one head dim, so it cannot show how D changes the saving.")
    if not all(med[a] < med[b] for a, b in zip(dims, dims[1:])) or med[dims[-1]] - med[dims[0]] < SMALL_SHARE:
        return Markdown(text + f" The saving does not grow with D by {SMALL_SHARE:.0%} or more in these rows.")
    per = " and ".join(f"one per {4 * d} matmul FLOPs at D = {d}" for d in dims)
    text += (f" Why D changes it: PV is 2·N²·D FLOPs a head, as QKᵀ is, so the two matmuls do 4·N²·D FLOPs against "
             f"N² exponentials, one a score: {per}.")
    if set(t["kernel_kind"]) != {"gluon"}:
        return Markdown(text + f" Not every {base} kernel here records Gluon tiles (warp-specialised), so these rows "
                               "give no reason to read the small saving as PV hidden under the softmax.")
    ratio = " and ".join(f"{4 * d / HOPPER_FLOPS_PER_EXP:g}× its exponential's time at D = {d}" for d in dims)
    return Markdown(text + f" A Hopper SM does {HOPPER_FLOPS_PER_EXP} dense 16-bit matmul FLOPs in the time its MUFU "
                           f"units compute one exponential, so a score's two matmuls take {ratio}. Near 1× the "
                           f"softmax is the likely bound, and {base}'s kernel here, warp-specialised (its tiles say "
                           "gluon), runs PV on the tensor cores under it; as D grows the matmuls outgrow the "
                           "exponentials, and PV's time shows.")


# -- section 8: roofline ------------------------------------------------------------------------------------------

@needs_lessons(many=True)
def roofline_figures(les: Lessons) -> list:
    return [roofline.roofline_figure(les.results, dt) for dt in les.dtypes]


@needs_lessons()
def roofline_table(les: Lessons) -> pd.DataFrame:
    t = pd.concat([roofline.roofline_table(les.results, dt) for dt in les.dtypes], ignore_index=True)
    return t.groupby(["dtype", "causal", "build"])["share_of_roof"].median().unstack("build").round(2)


# -- section 9: the profiler view ---------------------------------------------------------------------------------

def _kernels():
    """The profiler module, loaded when the profiler view runs (torch.profiler is slow to import)."""
    from attnlab import profiler

    return profiler


def profile_shape(run: Run) -> measure.Case:
    """The shape the profiler view uses: the run's D of the first head dim, non-causal where measured, and the
    largest N up to 4096 (big enough for S and P to matter, small enough to profile in a second)."""
    shapes = [c for c in _shapes(run) if c.N <= 4096] or _shapes(run)
    shapes.sort(key=lambda c: (c.causal, c.D, -c.N))
    return shapes[0]


def profile(run: Run, builds_: tuple = ("materialised", "fused"), calls: int = 3) -> dict:
    """Section 9: each build at profile_shape under torch.profiler, a trace saved per build in the run's folder (open
    it in Perfetto or chrome://tracing), and the table of what the profiler saw. On a GPU: the device kernels each
    build launches, ms per call (attnlab's kernel table, kernel_times), and the stage table of a build whose stages
    are separate kernels. On a CPU our Triton kernels run in the interpreter, whose trace is Python: the CPU view
    profiles torch's own materialised form (torch_eager: matmul, softmax, matmul) beside SDPA's one fused operator
    instead, and says so."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from attnlab import lies

    case = profile_shape(run)
    if not run.gpu:
        builds_ = ("torch_eager", "sdpa_default")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.gpu else [])
    q, k, v = measure.make_inputs(measure.Case(builds_[0], case.B, case.H, case.Hkv, case.N, case.D, case.dtype,
                                               case.causal, run.device))
    dev = torch.device(run.device)
    out = {"case": case, "tables": {}, "traces": {}, "stages": {}, "device": "cuda" if run.gpu else "cpu"}
    for name in builds_:
        attend = builds.get(name).attend
        attend(q, k, v, causal=case.causal)  # compiled and warm before the profiler starts
        measure.sync(dev)
        with lies.quiet_stderr(), torch_profile(activities=activities) as prof:
            for _ in range(calls):
                attend(q, k, v, causal=case.causal)
            measure.sync(dev)
        trace = run.out / f"trace_{name}.json"
        prof.export_chrome_trace(str(trace))
        out["traces"][name] = trace
        if run.gpu:
            kernel_ms = _kernels().kernel_times(name, q, k, v, causal=case.causal, calls=calls)
            out["tables"][name] = _shares(pd.DataFrame({"name": list(kernel_ms), "ms_per_call": list(
                kernel_ms.values())}))
            if name in _kernels().STAGES:
                try:
                    out["stages"][name] = _kernels().stage_table(kernel_ms, name)
                except ValueError as e:  # kernels the stage table does not name: say so, keep the kernel table
                    out["stages"][name] = f"no stage table: {e}"
        else:
            out["tables"][name] = _cpu_ops(prof, calls)
    return out


def _shares(t: pd.DataFrame) -> pd.DataFrame:
    t = t.sort_values("ms_per_call", ascending=False).reset_index(drop=True)
    t["share"] = t["ms_per_call"] / t["ms_per_call"].sum() if len(t) else []
    return t


def _cpu_ops(prof, calls: int) -> pd.DataFrame:
    """torch's CPU operators the profiler saw, each with its own (self) time per call."""
    rows = [{"name": e.key, "calls_per_call": e.count / calls, "ms_per_call": e.self_cpu_time_total / 1e3 / calls}
            for e in prof.key_averages() if e.key.startswith("aten::") and e.self_cpu_time_total > 0]
    return _shares(pd.DataFrame(rows, columns=["name", "calls_per_call", "ms_per_call"]))


def profile_report(prof: dict) -> list:
    """Section 9's outputs in order: what was profiled, each build's table (with the stage table of a staged build on
    a GPU), the refusal of stage times for fused, and where the traces are."""
    from IPython.display import Markdown

    c = prof["case"]
    shape = f"B = {c.B}, H = {c.H}, N = {c.N}, D = {c.D}, {c.dtype}, {'causal' if c.causal else 'non-causal'}"
    traces = ", ".join(f"`{relative_path(t)}`" for t in prof["traces"].values())
    out = []
    if prof["device"] == "cuda":
        out.append(Markdown(f"torch.profiler over three calls of each build at {shape}: the device kernels each one "
                            f"launches, ms per call. Traces (open in Perfetto or chrome://tracing): {traces}."))
    else:
        out.append(Markdown(
            f"This machine has no GPU, and our Triton kernels run here in Triton's interpreter, whose profile would "
            f"time Python. So the profiler is pointed at torch's own CPU operators at {shape}: torch_eager, the "
            f"materialised form written in torch (matmul, softmax, matmul: three stages the profiler can time apart), "
            f"beside sdpa_default, which runs attention as one fused operator (one entry, nothing inside it to time). "
            f"These are a CPU's times, not a GPU's. Traces: {traces}."))
    for name, table in prof["tables"].items():
        out.append(Markdown(f"**{name}**: {len(table)} {'kernel' if prof['device'] == 'cuda' else 'operator'}(s)"))
        out.append(table)
        if name in prof["stages"]:
            stages = prof["stages"][name]
            out.append(Markdown(f"{name}'s stages, from its kernels (attnlab's kernel table)"
                                + (":" if isinstance(stages, pd.DataFrame) else f": {stages}")))
            if isinstance(stages, pd.DataFrame):
                out.append(stages)
    out.append(Markdown(f"Asked for fused's stage times, the kernel table refuses: *{fused_stages_refused()}*"))
    return out


LIES = ("dead_output", "compile_rewrite", "recompile_limit", "mixed_ratio", "launch_overhead")


def lie(name: str, run: Run, les: Lessons | None = None) -> list:
    """Section 10: one demonstration of attnlab.lies, as its prose and its evidence table; the lies that need GPU
    rows read `les` (lessons(run) unless given)."""
    from attnlab import lies

    if name not in LIES:
        raise ValueError(f"name must be one of {', '.join(LIES)}, got {name!r}")
    les = les or lessons(run)
    if name == "dead_output":
        demo = lies.dead_output(run.device)
    elif name == "compile_rewrite":
        demo = lies.compile_rewrite(run.device)
    elif name == "recompile_limit":
        demo = lies.recompile_limit()
    elif les is None:
        return [no_lessons()]
    elif name == "mixed_ratio":
        demo = lies.mixed_ratio(les.results, les.label)
    else:
        demo = lies.launch_overhead(run.device, les.results, les.label)
    return [lies.as_markdown(demo), demo.evidence]


def fused_stages_refused() -> str:
    """What the kernel table says when asked for the fused build's stage times (attnlab.profiler.stage_table)."""
    k = _kernels()
    try:
        k.stage_table({"fused_kernel": 1.0}, "fused")
    except k.StagesNotSeparable as e:
        return str(e)
    raise AssertionError("stage_table gave stage times for fused")  # the guard itself is broken


# -- section 11: check yourself -----------------------------------------------------------------------------------

@dataclass
class Question:
    question: str
    answer: str
    source: str  # where the numbers in the answer come from

    def html(self) -> str:
        return (f"<p><b>{html.escape(self.question)}</b></p><details><summary>Answer (computed from "
                f"{html.escape(self.source)})</summary><p>{html.escape(self.answer)}</p></details>")


def _first_over(t: pd.DataFrame, threshold: float) -> str:
    parts = []
    for (dtype, causal, D), row in t.iterrows():
        over = [n for n, x in row.items() if pd.notna(x) and x >= threshold]
        kind = "causal" if causal else "non-causal"
        best = row.max()
        parts.append(f"{kind} D = {D}: first at N = {over[0]} ({row[over[0]]:.2f}×)" if over else
                     f"{kind} D = {D}: never (at most {best:.2f}×, at N = {row.idxmax()})")
    return "; ".join(parts)


def _traffic_share(les: Lessons, dtype: str, causal: bool, D: int, N: int) -> tuple[float, float, float, float]:
    """At one shape: S and P's round-trip bytes, their time at the measured copy bandwidth, materialised's time and
    fused's (net times, as the speedup table divides)."""
    att = report.attribution(groups_of(les)[(dtype, causal)])
    at = att[(att["D"] == D) & (att["N"] == N)]
    found = report.speedup(groups_of(les)[(dtype, causal)], builds=["fused"])
    f = found[(found["D"] == D) & (found["N"] == N)].iloc[0]
    return at["bytes"].sum(), at["predicted_ms"].sum(), f["materialised_ms"], f["ms"]


def why_there(les: Lessons, sp: pd.DataFrame, x: float) -> str:
    """At the first curve's first N past x: how much of materialised's time S and P's bytes account for at the
    measured bandwidth, against what fused takes, and how that share moved from the N before."""
    for (dtype, causal, D), row in sp.iterrows():
        over = [n for n, v in row.items() if pd.notna(v) and v >= x]
        if not over:
            continue
        n = over[0]
        moved, pred, mat, fused = _traffic_share(les, dtype, causal, D, n)
        text = (f"At N = {n} ({'causal' if causal else 'non-causal'}, D = {D}) S and P's two round trips move "
                f"{readable_bytes(moved)}, {pred:.3g} ms at the measured bandwidth, {pred / mat:.0%} of materialised's "
                f"{mat:.3g} ms, while fused takes {fused:.3g} ms in all.")
        before = [m for m, v in row.items() if m < n and pd.notna(v)]
        if before:
            m = before[-1]
            _, pred0, mat0, _ = _traffic_share(les, dtype, causal, D, m)
            grew = pred / mat > pred0 / mat0
            text += (f" At N = {m} that traffic was {pred0 / mat0:.0%} of materialised's time and the ratio "
                     f"{row[m]:.2f}×: " + ("the share S and P take of materialised's time grew with N, and the "
                                            "ratio with it." if grew else
                                            "the share did not grow, so S and P's traffic alone does not explain "
                                            "the step in the ratio."))
        else:
            text += " It is the first N measured: the ratio starts past the threshold."
        return text
    return "No curve reaches it: S and P's traffic never outweighs fused's whole time by that much here."


def questions(run: Run, les: Lessons | None = None) -> list[Question]:
    """The seeds' three questions and questions about this run's own numbers, each answer computed from the data:
    the gate and byte model of `run`, the speed rows of `les` (lessons(run) unless given)."""
    les = les or lessons(run)
    qs = []
    here = f"this run ({relative_path(run.out)})"
    k = _kernels()
    # the seeds' questions, answered with the data at hand
    dom = dominant(les) if les is not None else pd.DataFrame()
    dom_fused = dom["fused"].value_counts().to_dict() if "fused" in dom else {}
    qs.append(Question(
        "Why can a profiler not tell you which stage dominates a fused attention kernel?",
        f"Because fused is one kernel ({', '.join(k.UNSTAGED)}): QKᵀ, softmax and PV run interleaved inside it, "
        f"overlapped across warps, and the profiler sees only its total. Asked for stage times, the kernel table "
        f"refuses: \"{fused_stages_refused()}\". The honest route is ablation: "
        + (f"across {les.label}, the stage whose removal saved the most in fused was "
           + ", ".join(f"{'no single stage (within the noise)' if s == '—' else s} at {n} shape(s)"
                       for s, n in dom_fused.items()) + "." if dom_fused else
           "the ablation table names the stage whose removal saves the most."),
        les.label if les is not None else here))
    ab = cr.correctness_table(run.gate) if not run.gate.empty else pd.DataFrame()
    ab = ab[ab["build"].str.contains("-")] if len(ab) else ab
    passed = f"{int((ab['verdict'] == 'pass').sum())} of {len(ab)}" if len(ab) else "none"
    consumed = ""
    if les is not None:
        r = les.results[(les.results["family"] == "ablation") & (les.results["status"] == "ok")]
        finite = int(r["checksum"].notna().sum())
        consumed = (f" In {les.label}, {finite} of {len(r)} ablation rows carry a finite checksum of their "
                    f"consumed output.")
    qs.append(Question(
        "What makes an ablation a valid measurement?",
        "It is still a legal program that computes something checkable, it consumes its output (else dead-code "
        "elimination deletes the work and the time collapses to a launch), it changes one stage only (same tiles, "
        f"same inputs), and its difference from the base exceeds the noise. In {here}, {passed} ablation (build, "
        f"shape) pairs matched their own oracle in the gate." + consumed,
        here + (f" and {les.label}" if les is not None else "")))
    if les is not None:
        tr = trend(les)
        shape_words = "; ".join(f"{'causal' if r.causal else 'non-causal'} D = {r.D}: {r.first:.2f}× at N = "
                                f"{r.first_N} → {r.last:.2f}× at N = {r.last_N} ({r.shape})"
                                for r in tr.itertuples())
        qs.append(Question(
            "What shape should the speedup curve have as sequence length grows, and what shape does it have here?",
            "Predicted: rising while materialised's N² traffic of S and P grows faster than fused's work can hide "
            f"it, then a plateau once fused is bound by its own arithmetic. Measured (fused over materialised): "
            f"{shape_words}. " + " ".join(head_dim_words(les)),
            les.label))
        sp = speedup_table(les)
        x = threshold(sp)
        qs.append(Question(
            f"At which N does fused first beat materialised by {x:g}×, and why there?",
            _first_over(sp, x) + ". " + why_there(les, sp, x), les.label))
        dt = les.dtypes[0]
        g = groups_of(les)[(dt, False)] if (dt, False) in groups_of(les) else next(iter(groups_of(les).values()))
        att = report.attribution(g)
        n_max = int(att["N"].max())
        last = att[att["N"] == n_max]
        qs.append(Question(
            f"At N = {n_max}, which removed boundary saves more time, and how does each compare with its bytes at "
            "the measured bandwidth?",
            "; ".join(f"D = {r.D}, {r.boundary}: saved {r.delta_ms:.3g} ms against {r.predicted_ms:.3g} ms for its "
                      f"{readable_bytes(r.bytes)} at the copy bandwidth (×{r.measured_over_predicted:.2f})"
                      for r in last.itertuples()) + ".", les.label))
        find = overlap_findings(les)
        qs.append(Question(
            "Does any ablation of fused save almost nothing, or make it slower? What does that tell you?",
            ("Yes. " + " ".join(find[:3]) + (f" (and {len(find) - 3} more findings)" if len(find) > 3 else ""))
            if find else "No: every ablation of fused saved at least 5 % of its time in these rows.", les.label))
    cases = _shapes(run)
    big = max(cases, key=lambda c: (c.N, c.D))
    mk = {b: measure.Case(b, big.B, big.H, big.Hkv, big.N, big.D, big.dtype, big.causal, run.device) for b in OURS}
    qs.append(Question(
        f"At this run's largest shape (B = {big.B}, H = {big.H}, N = {big.N}, D = {big.D}, {big.dtype}), how many "
        "bytes must materialised hold at once, and how many must fused?",
        f"materialised: {readable_bytes(model.hold_bytes(mk['materialised']))} (S and P, each "
        f"{readable_bytes(bd.nn_bytes(big.B, big.H, big.N, big.dtype))}); qk_softmax: "
        f"{readable_bytes(model.hold_bytes(mk['qk_softmax']))} (P and O); fused: {readable_bytes(model.hold_bytes(mk['fused']))} "
        f"(O only): {model.hold_bytes(mk['materialised']) / model.hold_bytes(mk['fused']):.0f}× less.",
        here + " (the byte model at its shapes)"))
    if len(run.gate):
        t = cr.correctness_table(run.gate)
        ran = t[t["verdict"] != "not run"].dropna(subset=["err_over_limit"])
        if len(ran):
            w = ran.loc[ran["err_over_limit"].idxmax()]
            qs.append(Question(
                "Which build came closest to its error limit in this run's gate, and how close?",
                f"{w['build']} at N = {w['N']}, D = {w['D']}, {'causal' if w['causal'] else 'non-causal'}: err "
                f"{w['err']:.3g} against a limit of {w['limit']:.3g} ({w['err_over_limit']:.0%} of it). "
                f"{int((t['verdict'] == 'pass').sum())} of {len(t)} (build, shape) pairs passed.", here))
    c = run.ceilings
    if c.get("tbps") and c.get("tflops"):
        s_bytes = bd.boundary_bytes("S round trip", big.B, big.H, big.N, big.dtype, big.causal)
        qs.append(Question(
            "At the copy bandwidth this run measured, how long would the S round trip take at its largest shape, "
            "and what is the ridge point of this device?",
            f"{readable_bytes(s_bytes)} at {c['tbps']:.3g} TB/s: {bd.ms_at(s_bytes, c['tbps']):.3g} ms. The ridge point is "
            f"{c['tflops'] / c['tbps']:.3g} FLOP/byte ({c['tflops']:.3g} TFLOP/s over {c['tbps']:.3g} TB/s): a "
            "kernel doing fewer FLOPs per byte moved is bound by memory here.", here + " (its measured ceilings)"))
    return qs


def check_yourself(run: Run, les: Lessons | None = None):
    from IPython.display import HTML

    return HTML("\n".join(q.html() for q in questions(run, les)))


# -- section 12: the experiment record ----------------------------------------------------------------------------

def _n_span(ns) -> str:
    lo, hi = int(min(ns)), int(max(ns))
    return f"N = {lo}" if lo == hi else f"N = {lo}–{hi}"


def _qk_tradeoff(les: Lessons) -> str:
    """What qk_softmax pays in QKᵀ for dropping S, over every group's S step (report.attribution's qk_passes): a
    second pass only where its rows say it ran two; none where one pass held the row on chip."""
    att = pd.concat([report.attribution(g) for g in groups_of(les).values()], ignore_index=True)
    s = att[att["boundary"] == "S round trip"]
    two, one, unknown = s[s["qk_passes"] == 2], s[s["qk_passes"] == 1], s[s["qk_passes"].isna()]
    parts = []
    if len(two):
        parts.append(f"qk_softmax pays for dropping S with a second QKᵀ pass in the {len(two)} of {len(s)} shapes "
                     f"where it ran two passes ({_n_span(two['N'])}; up to "
                     f"{-two['qk_removed_ms'].min():.3g} ms at the matmul ceiling)")
    if len(one):
        parts.append(f"{'it' if len(two) else 'qk_softmax'} pays no second QKᵀ pass in the {len(one)} of {len(s)} "
                     f"shapes where it ran one (N ≤ {one['N'].max()}), the row held on chip")
    if len(unknown):
        parts.append(f"in {len(unknown)} of {len(s)} shapes qk_softmax's rows do not record whether it ran one QKᵀ "
                     "pass or two")
    return "; ".join(parts)


def experiment_record(run: Run, les: Lessons | None = None) -> pd.DataFrame:
    """Hypothesis, controlled change, observed effect, tradeoff and verdict, each filled from the data (`les`:
    lessons(run) unless given)."""
    les = les or lessons(run)
    if les is None:
        return pd.DataFrame([("hypothesis", "fused's speedup over materialised grows with N, then flattens"),
                             ("observed effect", "no GPU rows to judge it by (see section 5)")],
                            columns=["entry", "record"])
    tr = trend(les)
    verdicts = tr["shape"].value_counts().to_dict()
    supported = verdicts.get("rises then flattens", 0)
    effect = "; ".join(f"{'causal' if r.causal else 'non-causal'} D = {r.D}: {r.first:.2f}× → {r.last:.2f}× "
                       f"(last doubling {r.last_step:+.0%})" for r in tr.itertuples())
    big = les.results[les.results["status"] == "ok"]
    n_max = int(big["N"].max())
    hold = big[(big["N"] == n_max) & big["build"].isin(OURS)].groupby("build")["hold_bytes"].max()
    err = big[big["build"].isin(OURS)].groupby("build")["err"].max()
    record = [
        ("hypothesis", "fused's speedup over materialised grows with N, then flattens (refuted if it falls, is flat "
                       "from the start, or still rises more than 5 % over the last doubling)"),
        ("controlled change", "one memory boundary removed at a time: materialised → qk_softmax (S no longer "
                              "written) → fused (P neither); the same shapes, inputs, dtype, timer (CUDA-graph "
                              "replay, median) and consumption step for every build"),
        ("observed effect", f"{effect} ({les.label})"),
        ("verdict", f"supported in {supported} of {len(tr)} (causal, D) curves; "
                    + ", ".join(f"{k}: {n}" for k, n in verdicts.items())),
        ("tradeoff", f"at N = {n_max} fused must hold {readable_bytes(hold.get('fused'))} against materialised's "
                     f"{readable_bytes(hold.get('materialised'))}, but keeps no P to inspect or reuse and no stage a "
                     f"profiler can time; {_qk_tradeoff(les)}; worst error against the fp64 oracle: "
                     + ", ".join(f"{b} {err.get(b, math.nan):.3g}" for b in OURS)),
    ]
    return pd.DataFrame(record, columns=["entry", "record"])


def record(run: Run, les: Lessons | None = None):
    """Section 12: the experiment record as a table in the page, each entry whole."""
    from IPython.display import Markdown

    t = experiment_record(run, les)
    return Markdown("| entry | record |\n|---|---|\n" + "\n".join(
        f"| **{e}** | {str(r).replace('|', '/')} |" for e, r in zip(t["entry"], t["record"])))
