"""Runs side by side: every outputs/<gpu>/<run>/ (a results file and its provenance.json), compared across cards and
across runs of one card. What notebooks/compare_gpus.ipynb calls.

    find_runs(root), reference_run(root)   where the runs are (attnlab.runs)
    load(folders)              the runs, each with its results, card, commit, code fingerprint and an 'older' note
    overview(runs)             one line per run: card, when, commit, code, rows, and the older-code note
    speedups(runs, baseline)   attnlab.report.speedup of every (dtype, causal) group of every run, stacked
    library_ratios(runs, ours) our build's time against each library row's, one (dtype, causal) group at a time
    memory(runs)               attnlab.report.memory_table of every group of every run, stacked
    figures(runs, kinds)       the side-by-side figures (attnlab.report.figures.*_by_run), per (dtype, causal)
    curve_shapes(runs), shape_note(runs)   what each speedup curve does with N, beside the bytes per FLOP of both
                               builds at its ends (the rows' bytes_moved and flops)
    peak_growth(runs), growth_note(runs)   how each build's peak grows with N (a fitted exponent), beside what it
                               must hold (the rows' hold_bytes)

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


# -- what the curves and peaks do with N, said from the rows -------------------------------------------------------

def _causal_word(causal: bool) -> str:
    return "causal" if causal else "non-causal"


def _tokens(rows: pd.DataFrame) -> str:
    """How the rows' shapes change with N: 'B·N = <t> at every N' (tokens fixed), 'B = <b>, H = <h> at every N', or
    'B·N from <a> to <b>'."""
    t = rows["B"] * rows["N"]
    if t.nunique() == 1:
        return f"B·N = {int(t.iloc[0])} at every N"
    if rows["B"].nunique() == 1 and rows["H"].nunique() == 1:
        return f"B = {int(rows['B'].iloc[0])}, H = {int(rows['H'].iloc[0])} at every N"
    return f"B·N from {int(t.min())} to {int(t.max())}"


def _ok_line(group: pd.DataFrame, build: str, D: int) -> pd.DataFrame:
    """One build's ok rows at one head dim of one group, one row per N (the first where a grid holds two shapes)."""
    rows = group[(group["build"] == build) & (group["D"] == D) & (group["status"] == "ok")]
    return rows.sort_values("N").drop_duplicates("N").set_index("N", drop=False)


def curve_shapes(runs: list[Run], baseline: str = "materialised", build: str = "fused") -> pd.DataFrame:
    """Per run, (dtype, causal) group and head dim: `build`'s speedup over `baseline` at the first and the last N
    and the curve's shape between (attnlab.report.curves.speedup_trend), beside what the rows' byte and FLOP counts
    say at those N: the bytes each build moves per FLOP, and how many times the baseline's bytes are the build's
    (the same FLOPs: both compute the same attention)."""
    from attnlab.report.curves import speedup_trend

    rows = []
    for r in runs:
        trend = speedup_trend(r.results, build=build, baseline=baseline)
        for t in trend.itertuples():
            group = r.results[(r.results["dtype"].astype(str) == t.dtype) & (r.results["causal"] == t.causal)]
            b, x = _ok_line(group, baseline, t.D), _ok_line(group, build, t.D)
            ends = [n for n in (t.first_N, t.last_N) if n in b.index and n in x.index]
            if len(ends) < 2:
                continue

            def per_flop(line, n):
                return line.loc[n, "bytes_moved"] / line.loc[n, "flops"]

            rows.append(dict(
                run=r.label, card=r.card, dtype=t.dtype, causal=t.causal, D=t.D, shapes=_tokens(x),
                first_N=t.first_N, first=t.first, last_N=t.last_N, last=t.last, shape=t.shape,
                base_bytes_per_flop_first=per_flop(b, t.first_N), base_bytes_per_flop_last=per_flop(b, t.last_N),
                build_bytes_per_flop_first=per_flop(x, t.first_N), build_bytes_per_flop_last=per_flop(x, t.last_N),
                bytes_ratio_first=b.loc[t.first_N, "bytes_moved"] / x.loc[t.first_N, "bytes_moved"],
                bytes_ratio_last=b.loc[t.last_N, "bytes_moved"] / x.loc[t.last_N, "bytes_moved"], older=r.older))
    return pd.DataFrame(rows)


def _fit_exponent(ns, values) -> float:
    """The slope of log(value) against log(N), least squares: how a quantity grows with N (1: linearly, 2: as N²)."""
    import numpy as np

    x, y = np.log(np.asarray(ns, dtype=float)), np.log(np.asarray(values, dtype=float))
    return float(np.polyfit(x, y, 1)[0])


def peak_growth(runs: list[Run], names=builds.OURS) -> pd.DataFrame:
    """Per run, (dtype, causal) group, head dim and build (of `names`) with a peak at two N or more: the peak
    allocation at the first and the last N, their ratio, the exponent of N it grows by (a least-squares fit over
    every N), and the exponent of what the build must hold (the rows' hold_bytes, attnlab.cost.hold_bytes: S and P
    are B·H·N² elements each, Q, K, V and O B·H·N·D)."""
    rows = []
    for r in runs:
        for (dtype, causal), group in report.split(r.results).items():
            for D in sorted(group["D"].unique()):
                for b in names:
                    line = _ok_line(group, b, D)
                    line = line[line["peak_bytes"] > 0]
                    if len(line) < 2:
                        continue
                    ns = list(line.index)
                    rows.append(dict(
                        run=r.label, card=r.card, dtype=dtype, causal=causal, D=int(D), build=b, shapes=_tokens(line),
                        first_N=int(ns[0]), last_N=int(ns[-1]), first_peak=line["peak_bytes"].iloc[0],
                        last_peak=line["peak_bytes"].iloc[-1],
                        growth=line["peak_bytes"].iloc[-1] / line["peak_bytes"].iloc[0],
                        exponent=_fit_exponent(ns, line["peak_bytes"]),
                        held_exponent=_fit_exponent(ns, line["hold_bytes"].astype(float)), older=r.older))
    return pd.DataFrame(rows)


def _readable(x: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(x) >= size:
            return f"{x / size:.3g} {unit}"
    return f"{int(x)} B"


def shape_note(runs: list[Run], baseline: str = "materialised", build: str = "fused"):
    """What each speedup curve does with N, from its rows (curve_shapes): per run and group, per head dim the
    speedup at the first and last N and its shape, the bytes per FLOP of both builds there, and how the speedup's
    growth compares with the byte ratio's; where a group holds two head dims or more, the speedup at the last N of
    each beside the baseline's bytes per FLOP."""
    from IPython.display import Markdown

    t = curve_shapes(runs, baseline, build)
    if t.empty:
        return Markdown(f"*No run holds {build} and {baseline} at two N or more: no curve to describe.*")
    lines = []
    for (label, card, dtype, causal, older), g in t.groupby(["run", "card", "dtype", "causal", "older"],
                                                            sort=False):
        lines.append(f"- **{card} · {label}**{' (older code)' if older else ''}, {dtype} {_causal_word(causal)}, "
                     f"{build} over {baseline}:")
        for r in g.itertuples():
            lines.append(
                f"    - D = {r.D} ({r.shapes}): {r.first:.2f}× at N = {r.first_N} → {r.last:.2f}× at N = "
                f"{r.last_N}, *{r.shape}*. Bytes per FLOP: {baseline} {r.base_bytes_per_flop_first:.3g} → "
                f"{r.base_bytes_per_flop_last:.3g}, {build} {r.build_bytes_per_flop_first:.3g} → "
                f"{r.build_bytes_per_flop_last:.3g}; the byte ratio grows "
                f"{r.bytes_ratio_last / r.bytes_ratio_first:.2f}× where the speedup grows {r.last / r.first:.2f}×.")
        last = g[g["last_N"] == g["last_N"].max()]
        if len(last) > 1:
            lines.append(f"    - At N = {int(last['last_N'].iloc[0])}: " + ", ".join(
                f"{r.last:.2f}× at D = {r.D} ({baseline}: {r.base_bytes_per_flop_last:.3g} bytes per FLOP)"
                for r in last.itertuples()) + ".")
    return Markdown("\n".join(lines))


def growth_note(runs: list[Run], names=builds.OURS):
    """How each build's peak grows with N, from its rows (peak_growth), one line per run, group and head dim."""
    from IPython.display import Markdown

    t = peak_growth(runs, names)
    if t.empty:
        return Markdown("*No run holds a peak allocation at two N or more: nothing to say of how it grows.*")
    lines = []
    for (label, card, dtype, causal, D, shapes), g in t.groupby(["run", "card", "dtype", "causal", "D", "shapes"],
                                                                 sort=False):
        parts = [f"{r.build} {_readable(r.first_peak)} → {_readable(r.last_peak)} from N = {r.first_N} to {r.last_N} "
                 f"(×{r.growth:.2f}: as N^{round(r.exponent, 2) + 0:.2f}; what it must hold grows as "
                 f"N^{round(r.held_exponent, 2) + 0:.2f})"  # + 0: a -0.0 left by rounding reads 0.00
                 for r in g.itertuples()]
        lines.append(f"- **{card} · {label}**, {dtype} {_causal_word(causal)}, D = {D} ({shapes}): "
                     + "; ".join(parts) + ".")
    return Markdown("\n".join(lines))
