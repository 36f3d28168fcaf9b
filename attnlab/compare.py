"""Runs side by side: every outputs/<gpu>/<run>/ (a results file and its provenance.json), compared across cards and
across runs of one card. What notebooks/compare_gpus.ipynb calls.

    find_runs(root), reference_run(root)   where the runs are (attnlab.runs)
    load(folders)              the runs, each with its results, card, commit, code fingerprint and an 'older' note
    overview(runs)             one line per run: card, when, commit, code, rows, and the older-code note
    speedups(runs, baseline)   attnlab.report.speedup of every (dtype, causal) group of every run, stacked
    library_ratios(runs, ours) our build's time against each library row's, one (dtype, causal) group at a time
    memory(runs)               attnlab.report.memory_table of every group of every run, stacked
    figures(runs, kinds)       the side-by-side figures (attnlab.report.figures.*_by_run), per (dtype, causal)

A ratio never mixes dtypes or causal settings: every table is computed inside one group of attnlab.report.split,
and `library_ratio` refuses a frame holding two. A run measured by older code than the newest run (its provenance's
code fingerprint, or its commit where the fingerprint is missing, differs from the newest run's, and it started
earlier) says so in its label, in every table and panel that shows it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pandas as pd

from attnlab import builds, report
from attnlab.runs import find_runs, outputs_root, results_path, started
from attnlab.report import figures as fg
from attnlab.sweep import PROVENANCE, RESULTS, read_results

@dataclass
class Run:
    """One run folder, read: its results, where they came from, and how it stands against the newest run."""

    path: Path
    label: str  # the folder relative to the outputs root, e.g. 'h200/2026-12-04-grid'
    card: str  # the device's name, e.g. 'NVIDIA H200'
    device: str  # e.g. 'cuda:0' or 'cpu'
    started: datetime
    commit: str  # '' where unknown
    dirty: bool | None
    code: str  # attnlab.provenance.code_hash of the code that measured; '' where unknown
    total_memory: int | None  # the device's total memory in bytes (None where the provenance does not say)
    results: pd.DataFrame = field(repr=False)
    older: str = ""  # '' or why this run's numbers come from older code than the newest run's

    @property
    def title(self) -> str:
        """The run as a panel names it: card, folder, and 'older code' where it is."""
        return f"{self.card} · {self.label}" + (" · OLDER CODE" if self.older else "")


def _label(folder: Path, root: Path | None) -> str:
    for base in (root, outputs_root()):
        if base is not None:
            try:
                return folder.resolve().relative_to(Path(base).resolve()).as_posix()
            except ValueError:
                pass
    parts = folder.resolve().parts
    if "outputs" in parts:  # a copy of some repository's outputs/: <gpu>/<run> below it
        return "/".join(parts[len(parts) - parts[::-1].index("outputs"):])
    return "/".join(parts[-2:])  # <gpu>/<run>


def read_run(folder, root=None) -> Run:
    """One run folder as a Run (not yet compared with others: `older` is '')."""
    folder = Path(folder)
    prov_path = folder / PROVENANCE
    if not prov_path.is_file():
        raise ValueError(f"run folder {str(folder)!r} has no {PROVENANCE}: pass folders that attnlab.sweep wrote")
    prov = json.loads(prov_path.read_text())
    path = results_path(folder, prov)
    if not path.is_file():
        raise ValueError(f"run folder {str(folder)!r} has no results file {path.name!r}")
    device = prov.get("device") or {}
    git = prov.get("git") or {}
    label = _label(folder, root)
    results = read_results(path)
    results.insert(0, "run", label)
    return Run(path=folder, label=label, card=str(device.get("name") or "unknown device"),
               device=str(device.get("device") or ""), started=started(prov), commit=str(git.get("commit") or ""),
               dirty=git.get("dirty"), code=str(prov.get("code") or ""),
               total_memory=device.get("total_memory"), results=results)


def _older(run: Run, newest: Run) -> str:
    """'' or why `run` was measured by older code than `newest` (the code fingerprint decides; the commit where a
    run has none). Same code under another commit (a documentation commit) is not older."""
    if run is newest or run.started >= newest.started:
        return ""
    if run.code and newest.code:
        if run.code == newest.code:
            return ""
    elif run.commit and newest.commit:
        if run.commit == newest.commit:
            return ""
    else:
        return (f"code unknown: measured before the newest run ({newest.label}) and its provenance or the newest's "
                "names neither a code fingerprint nor a commit to compare")

    def at(r: Run) -> str:
        dirty = " with uncommitted changes" if r.dirty else ""
        return f"commit {r.commit[:8] or 'unknown'}{dirty}, code {r.code or 'unknown'}"
    return f"older code: measured at {at(run)}; the newest run ({newest.label}) at {at(newest)}"


def load(folders=None, root=None) -> list[Run]:
    """The runs in `folders` (default: every run under root, attnlab.compare.find_runs), oldest first, each labelled
    when older code than the newest run's measured it."""
    if folders is None:
        folders = find_runs(root)
    elif isinstance(folders, (str, Path)):
        folders = [folders]
    runs = sorted((read_run(f, root) for f in folders), key=lambda r: (r.started, r.label))
    if not runs:
        raise ValueError(f"no runs found under {str(root or outputs_root())!r} (a run folder holds {PROVENANCE} and "
                         f"{RESULTS})")
    labels = [r.label for r in runs]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise ValueError(f"run folder(s) {twice} given twice")
    newest = runs[-1]
    for r in runs:
        r.older = _older(r, newest)
    return runs


def overview(runs: list[Run]) -> pd.DataFrame:
    """One line per run: what it is and whether its code is older than the newest run's."""
    rows = []
    for r in runs:
        res = r.results
        rows.append(dict(run=r.label, card=r.card, device=r.device, started=r.started.isoformat(),
                         commit=r.commit[:8], code=r.code, rows=len(res), ok=int((res["status"] == "ok").sum()),
                         dtypes=", ".join(sorted(res["dtype"].astype(str).unique())),
                         causal=", ".join(str(c) for c in sorted(res["causal"].unique())),
                         older=r.older))
    return pd.DataFrame(rows)


def _groups(runs: list[Run]) -> dict[tuple[str, bool], dict[str, pd.DataFrame]]:
    """(dtype, causal) -> {run title: that run's rows of the group}, every group of every run."""
    out: dict[tuple[str, bool], dict[str, pd.DataFrame]] = {}
    for r in runs:
        if r.results.empty:
            continue
        for key, group in report.split(r.results).items():
            out.setdefault(key, {})[r.title] = group
    return dict(sorted(out.items()))


def _stack(tables: list[pd.DataFrame], run: Run) -> list[pd.DataFrame]:
    return [t.assign(run=run.label, card=run.card, older=run.older) for t in tables]


def speedups(runs: list[Run], baseline: str = "materialised") -> pd.DataFrame:
    """attnlab.report.speedup (each non-ablation build over `baseline`) for every group of every run that measured
    the baseline, stacked with the run's label, card and older-code note."""
    parts = []
    for r in runs:
        for _, group in report.split(r.results).items():
            if baseline in set(group["build"]):
                parts += _stack([report.speedup(group, baseline=baseline)], r)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


LIBRARY = tuple(name for name, b in builds.BUILDS.items() if b.family == "library")


def library_ratio(group: pd.DataFrame, ours: str = "fused", library: str = "sdpa_flash") -> pd.DataFrame:
    """library ms / ours ms at every shape of one (dtype, causal) group (above 1: ours is faster), with the note of
    attnlab.report.speedup; a frame holding two dtypes or both causal settings is refused (ValueError)."""
    t = report.speedup(group, baseline=library, builds=[ours])
    return pd.DataFrame({**{c: t[c] for c in report.groups.LEADING}, "ours": ours, "library": library,
                         "ours_ms": t["ms"], "library_ms": t[f"{library}_ms"],
                         "library_over_ours": t[f"x_vs_{library}"], "note": t["note"]})


def library_ratios(runs: list[Run], ours: str = "fused", libraries=LIBRARY) -> pd.DataFrame:
    """library_ratio for every library build each group of each run measured, stacked with the run's label."""
    parts = []
    for r in runs:
        for _, group in report.split(r.results).items():
            present = set(group["build"])
            if ours not in present:
                continue
            parts += _stack([library_ratio(group, ours, lib) for lib in libraries if lib in present], r)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def memory(runs: list[Run]) -> pd.DataFrame:
    """attnlab.report.memory_table (peak bytes each fusion step saves against the S or P it stops holding) for every
    group of every run that measured our three builds, stacked with the run's label."""
    parts = []
    for r in runs:
        for _, group in report.split(r.results).items():
            if set(builds.OURS) <= set(group["build"]):
                parts += _stack([report.memory_table(group)], r)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


KINDS = ("speedup", "memory", "libraries")


def figures(runs: list[Run], kinds=KINDS, baseline: str = "materialised", ours: str = "fused") -> list:
    """For each (dtype, causal) group, the figures of `kinds`, one panel per run side by side
    (attnlab.report.figures.*_by_run): 'speedup' over `baseline`, 'memory' (peak allocation), 'libraries' (each
    library build's time over `ours`). A run without the rows a figure needs is left out of that figure."""
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"kinds must be among {KINDS}, got {unknown}")
    out = []
    for (dtype, causal), per_run in _groups(runs).items():
        if "speedup" in kinds:
            with_base = {t: g for t, g in per_run.items() if baseline in set(g["build"])}
            if with_base:
                out.append(fg.speedup_by_run(with_base, baseline=baseline))
        if "memory" in kinds:
            out.append(fg.memory_by_run(per_run))
        if "libraries" in kinds:
            ratios = {t: pd.concat([library_ratio(g, ours, lib) for lib in LIBRARY if lib in set(g["build"])],
                                   ignore_index=True)
                      for t, g in per_run.items() if ours in set(g["build"]) and set(LIBRARY) & set(g["build"])}
            if ratios:
                out.append(fg.ratio_by_run(ratios))
    return out
