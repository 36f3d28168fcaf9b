"""Finding run folders on disk: every outputs/<gpu>/<run>/ holding a results file and its provenance.json.

    outputs_root()             the repository's outputs/, or the folder ATTNLAB_OUTPUTS names
    started(prov)              when a run started, comparable across time zones
    find_runs(root)            every run folder under root, oldest first (a training run's: its own file names)
    reference_run(root, need)  the newest run measured on a CUDA device with ok rows of every build in `need`,
                               a card's own params before a variant's

What a render without a GPU reads its speed and memory lessons from, what the shape explorer sets beside a shape,
and what compare_gpus sets side by side: one way to find them, located afresh each call (runs are renamed and added).
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from attnlab import builds, environment, provenance
from attnlab.schema import forward_rows
from attnlab.sweep import PROVENANCE, RESULTS

_NEVER = datetime.min.replace(tzinfo=timezone.utc)


def outputs_root() -> Path:
    return Path(environment.setting("ATTNLAB_OUTPUTS") or provenance.REPO / "outputs")


def started(prov: dict) -> datetime:
    """When a run started (its provenance's 'started'; 'ended' where that is missing), comparable across zones."""
    for key in ("started", "ended"):
        try:
            t = datetime.fromisoformat(str(prov.get(key)))
        except ValueError:
            continue
        return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
    return _NEVER


def results_path(folder: Path, prov: dict) -> Path:
    return Path(folder) / (prov.get("results") or RESULTS)


def find_runs(root=None, provenance_name: str = PROVENANCE) -> list[Path]:
    """Every folder under `root` (default: outputs_root()) holding a provenance.json (or the provenance file
    `provenance_name`: a training run's, attnlab.train_sweep) and the results file it names, oldest first. A run
    folder may sit one level deeper than outputs/<gpu>/<run>/: it is found all the same."""
    root = Path(root) if root is not None else outputs_root()
    found = []
    for prov_path in root.rglob(provenance_name) if root.is_dir() else ():
        try:
            prov = json.loads(prov_path.read_text())
        except (OSError, ValueError):
            continue
        if results_path(prov_path.parent, prov).is_file():
            found.append((started(prov), prov_path.parent))
    return [folder for _, folder in sorted(found, key=lambda x: (x[0], str(x[1])))]


def reference_run(root=None, need=builds.OURS) -> Path | None:
    """The newest run (by its provenance's start time, never by a folder's name) measured on a CUDA device whose
    results hold ok forward rows of every build in `need` (default: our three), rendered with a card's own params
    where one is (a variant's params name carries a '-', as params/seeds-policy.yaml's: its grid is narrower than
    the card's, e.g. one head dim); else the newest variant; None when there is none."""
    variants = []
    for folder in reversed(find_runs(root)):
        prov = json.loads((folder / PROVENANCE).read_text())
        if not str((prov.get("device") or {}).get("device", "")).startswith("cuda"):
            continue
        try:  # the forward rows (a results file may hold other passes' beside them)
            rows = forward_rows(pd.read_csv(results_path(folder, prov), dtype=str,
                                            usecols=lambda c: c in ("build", "status", "pass")))
            ok = set(rows.loc[rows["status"] == "ok", "build"])
        except (ValueError, OSError, KeyError):  # unreadable, or not a results file (no build or status column)
            continue
        if not set(need) <= ok:
            continue
        if "-" in str((prov.get("params") or {}).get("name", "")):
            variants.append(folder)
            continue
        return folder
    return variants[0] if variants else None
