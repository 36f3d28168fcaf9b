"""Where the speed and memory lessons come from (`lessons(run)`): this run's own rows when it ran on a CUDA GPU and
measured our three builds; otherwise a committed GPU run (`reference_run`: the newest outputs/<gpu>/<run>/ whose
provenance names a CUDA device and whose results hold materialised, qk_softmax and fused, a card's own params before
a variant's), and every section says so. On a CPU our kernels run in Triton's interpreter, whose timings measure Python; they are never shown as
speed. ATTNLAB_OUTPUTS (an environment variable) points reference_run at another outputs folder. Also the formatters
every section shares: readable bytes and paths relative to the repository.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnlab import provenance, report, sweep
from attnlab.lab.run import OURS, Run, load
from attnlab.runs import outputs_root, reference_run, started


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


def named_device(rows: pd.DataFrame, fallback: str) -> str:
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
        return Lessons(mine, run.out, named_device(mine, run.device_name), True, run.provenance)
    folder = reference_run(root)
    if folder is None:
        return None
    results = folder / json.loads((folder / sweep.PROVENANCE).read_text()).get("results", sweep.RESULTS)
    ref = _reference(str(folder), results.stat().st_mtime if results.exists() else 0.0)
    return Lessons(ref.results, folder, ref.device_name, False, ref.provenance)


def source_note(run: Run, les: Lessons | None = None, brief: bool = False):
    """A line saying where the section's speed and memory numbers come from, and why; `brief`: where the rows come
    from alone, for a section after the first that said why. `les`: lessons(run) unless given."""
    from IPython.display import Markdown

    les = les or lessons(run)
    if brief and les is not None:
        return Markdown(f"*{'Measured here' if les.own else 'From a committed GPU run, not from this machine'}: "
                        f"{les.label}.*")
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


def committed_source_note(les: Lessons | None, gpu: bool, *, kind: str, make_one: str, lacking: str, head: str,
                          tail: str = ""):
    """The source note of a page that reads a committed GPU run of its `kind` where its own rows hold none (the
    model and training pages): nothing to draw on (and `make_one`, how to make such a run), measured here, or
    `head`: the committed run, then why this run's rows do not serve (no GPU; `lacking`: the rows it has none
    of), then `tail`."""
    from IPython.display import Markdown

    if les is None:
        return Markdown(f"**No GPU measurements to draw on:** this run has none, and no committed GPU {kind} run was "
                        f"found under `{relative_path(outputs_root())}`. To make one: {make_one}.")
    if les.own:
        return Markdown(f"**Measured here:** {les.label}.")
    why = ("this machine has no GPU: our kernels run in Triton's interpreter here, whose times measure Python"
           if not gpu else f"this run has no {lacking} of our builds (yet)")
    return Markdown(f"**{head}:** {les.label}. Here {why}{tail}.")


def rows_line(les: Lessons):
    """The one line above a section's numbers that names their rows: this run's, or a committed GPU run's."""
    from IPython.display import Markdown

    where = "" if les.own else "from a committed GPU run, not from this machine: "
    return Markdown(f"*Rows: {where}{les.label}.*")


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


def readable_bytes(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(x) >= size:
            return f"{x / size:.3g} {unit}"
    return f"{int(x)} B"


def readable(t: pd.DataFrame, columns=None) -> pd.DataFrame:
    """Byte counts as KiB / MiB / GiB: `columns`, or those whose name ends in 'bytes'."""
    t = t.copy()
    for c in columns if columns is not None else [c for c in t.columns if c.endswith("bytes")]:
        t[c] = t[c].map(readable_bytes)
    return t


def groups_of(les: Lessons) -> dict:
    return report.split(les.results)
