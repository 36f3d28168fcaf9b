"""Correctness first: every build at every shape against the fp64 oracle, its error beside its limit, pass or fail.

Two sources give the same table:

    gate rows      attnlab.gate.check_case: status 'ok' / 'FAIL[: why]' / 'unsupported: why' / 'oom[: what]', err,
                   limit, unwritten (elements of a NaN-poisoned output the build never wrote)
    results rows   attnlab.schema: status, err, err_limit, err_note (the sweep judges every measured row the same way)

    correctness_table(rows)     one row per (build, shape): err, limit, err / limit, verdict, note
    correctness_summary(table)  one row per build: shapes, passed, failed, not run, worst err / limit

A verdict is 'pass' (err ≤ limit, every element written), 'FAIL', 'not run' (unsupported, out of memory, or the
oracle could not be computed: the note says which); a FAIL is never averaged away by the other shapes.
"""
from __future__ import annotations

import math

import pandas as pd

SHAPE = ("dtype", "causal", "N", "D", "B", "H", "Hkv")
COLUMNS = {
    "build": "the build checked",
    **{c: c for c in SHAPE},
    "err": "‖o − ref‖ / ‖ref‖ against the fp64 oracle (the ablation's own oracle for an ablation)",
    "limit": "the most err may be (attnlab.accuracy: 2× plain torch's error in the same dtype, within a floor and a "
             "cap)",
    "err_over_limit": "err / limit: at most 1 passes",
    "verdict": "'pass', 'FAIL' or 'not run'",
    "note": "why a row is FAIL or not run",
}
VERDICTS = ("pass", "FAIL", "not run")


def _verdict(status: str, err: float, limit: float, unwritten: float, err_note: str) -> tuple[str, str]:
    status = str(status)
    head, _, why = status.partition(":")
    if head in ("unsupported", "oom", "error"):
        return "not run", status
    if head == "FAIL":
        return "FAIL", why.strip() or (f"err {err:.3g} > limit {limit:.3g}" if err > limit else "failed")
    if head != "ok":
        return "not run", status
    if isinstance(unwritten, (int, float)) and unwritten == unwritten and unwritten > 0:
        return "FAIL", f"{int(unwritten)} output elements never written"
    if not (math.isfinite(err) and math.isfinite(limit)):
        if err == math.inf:
            return "FAIL", "output holds NaN or inf"
        return "not run", err_note or "no error against the oracle was computed"
    if err > limit:
        return "FAIL", f"err {err:.3g} > limit {limit:.3g}"
    return "pass", err_note


def correctness_table(rows) -> pd.DataFrame:
    """One row per (build, shape) of gate rows or results rows (module docstring), in their order."""
    df = pd.DataFrame(rows)
    limit_col = "limit" if "limit" in df.columns else "err_limit"
    missing = [c for c in ("build", "status", "err", limit_col, *SHAPE) if c not in df.columns]
    if missing:
        raise ValueError(f"rows lack column(s) {missing}: give attnlab.gate rows or a results table")
    out = []
    for _, r in df.iterrows():
        err = float(r["err"]) if pd.notna(r["err"]) else math.nan
        limit = float(r[limit_col]) if pd.notna(r[limit_col]) else math.nan
        note = r.get("err_note", "")
        verdict, why = _verdict(r["status"], err, limit, r.get("unwritten", 0),
                                note if isinstance(note, str) else "")
        out.append({"build": r["build"], **{c: r[c] for c in SHAPE}, "err": err, "limit": limit,
                    "err_over_limit": err / limit if limit > 0 and math.isfinite(err) else math.nan,
                    "verdict": verdict, "note": why})
    table = pd.DataFrame(out, columns=list(COLUMNS))
    table["causal"] = table["causal"].astype(bool)
    return table


def correctness_summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per build of a correctness_table: shapes checked, how many passed, failed, were not run, and the worst
    err / limit among the shapes it ran."""
    rows = []
    for build, g in table.groupby("build", sort=False):
        ran = g[g["verdict"] != "not run"]
        rows.append({"build": build, "shapes": len(g), "passed": int((g["verdict"] == "pass").sum()),
                     "failed": int((g["verdict"] == "FAIL").sum()), "not_run": int((g["verdict"] == "not run").sum()),
                     "worst_err_over_limit": ran["err_over_limit"].max() if len(ran) else math.nan})
    return pd.DataFrame(rows, columns=["build", "shapes", "passed", "failed", "not_run", "worst_err_over_limit"])
