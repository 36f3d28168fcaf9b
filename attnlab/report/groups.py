"""Which rows may share a table: one dtype, one causal value, one row per (build, shape).

A causal build skips the masked half of the work and two dtypes move different bytes, so a ratio or a difference
across either compares two different programs. Every table in attnlab.report therefore takes one group, and `split`
cuts a results table (attnlab.schema) into groups. Two rows for one case (say, two runs concatenated) are refused,
never averaged or silently picked.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from attnlab import schema

SHAPE = ("B", "H", "Hkv", "N", "D")
STEP_COLUMNS = {  # the leading columns of every per-boundary table (attribution, memory)
    "boundary": "the memory round trip the step removes",
    "from_build": "the build that has the boundary", "to_build": "the build without it",
}
LEADING = ("dtype", "causal", "D", "N", "B", "H", "Hkv")  # first columns of every table, in this order
_SORT = ("D", "N", "B", "H", "Hkv")


def require(results: pd.DataFrame, columns) -> None:
    """A ValueError naming the missing columns, or a causal column that is not boolean."""
    missing = [c for c in columns if c not in results.columns]
    if missing:
        raise ValueError(f"results lack column(s) {missing}; see attnlab.schema.COLUMNS")
    if "causal" in columns:
        odd = sorted({repr(v) for v in results["causal"] if not isinstance(v, (bool, np.bool_))})
        if odd:  # the string 'False' is truthy: refuse it rather than file a non-causal row as causal
            raise ValueError(f"causal must hold booleans, got {', '.join(odd)}")


def split(results: pd.DataFrame) -> dict[tuple[str, bool], pd.DataFrame]:
    """The results cut into (dtype, causal) groups, the unit every table function takes."""
    require(results, ("dtype", "causal"))
    return {(str(dtype), bool(causal)): group.reset_index(drop=True)
            for (dtype, causal), group in results.groupby(["dtype", "causal"], sort=True)}


def one_group(results: pd.DataFrame, columns=()) -> tuple[str, bool]:
    """The (dtype, causal) of a frame that holds exactly one group; a ValueError naming the mix otherwise."""
    require(results, ("dtype", "causal", "build", "status", *SHAPE, *columns))
    if results.empty:
        raise ValueError("results hold no rows")
    dtypes = sorted(results["dtype"].astype(str).unique())
    causals = sorted(bool(c) for c in results["causal"].unique())
    if len(dtypes) > 1 or len(causals) > 1:
        raise ValueError(f"a table takes one dtype and one causal value, got dtype {dtypes} and causal {causals}: "
                         "pass one group of attnlab.report.split(results)")
    return dtypes[0], causals[0]


def shapes(group: pd.DataFrame) -> list[tuple]:
    """Every (B, H, Hkv, N, D) in the group, sorted by D, then N, then B, H, Hkv."""
    found = {tuple(int(x) for x in t) for t in group[list(SHAPE)].itertuples(index=False)}
    order = [SHAPE.index(c) for c in _SORT]
    return sorted(found, key=lambda s: tuple(s[i] for i in order))


def where(shape: tuple) -> str:
    """A shape as a note names it: 'B=1 H=8 N=4096 D=64' (Hkv shown only when it differs from H)."""
    B, H, Hkv, N, D = shape
    return f"B={B} H={H}" + (f" Hkv={Hkv}" if Hkv != H else "") + f" N={N} D={D}"


def leading(dtype: str, causal: bool, shape: tuple) -> dict:
    """The first columns of a table row: the group and the shape."""
    named = dict(zip(SHAPE, shape))
    return {"dtype": dtype, "causal": causal, **{c: named[c] for c in LEADING[2:]}}


def cases(group: pd.DataFrame) -> dict[tuple[str, tuple], pd.Series]:
    """The group's rows keyed by (build, shape); two rows for one key is a ValueError naming it."""
    out: dict[tuple[str, tuple], pd.Series] = {}
    for _, row in group.iterrows():
        key = (row["build"], tuple(int(row[c]) for c in SHAPE))
        if key in out:
            runs = sorted({str(r.get("run_id", "?")) for r in (out[key], row)})
            raise ValueError(f"two rows for {key[0]} at {where(key[1])} (run_id {runs}): select one run first")
        out[key] = row
    return out


_NOTE_OF = {"peak_bytes": "peak_note", "err": "err_note"}


def value(found: dict, build: str, shape: tuple, column: str = "ms", role: str = "") -> tuple[float, str]:
    """`column` of build's ok row at shape, or (NaN, why not). `role` prefixes the note, e.g. 'baseline'."""
    who = f"{role} {build}".strip()
    row = found.get((build, shape))
    if row is None:
        return math.nan, f"{who} not measured at {where(shape)}"
    if row["status"] != "ok":
        return math.nan, f"{who} {row['status']} at {where(shape)}"
    v = row[column]
    if pd.isna(v):
        why = row.get(_NOTE_OF.get(column, ""), "")
        because = f" ({why})" if isinstance(why, str) and why else ""
        return math.nan, f"{who} {column} unknown at {where(shape)}{because}"
    err_note = row.get("err_note", "")
    if isinstance(err_note, str) and "FAILS" in err_note:  # status stays ok (the time is real), the program is wrong
        return float(v), f"{who} at {where(shape)}: {err_note}"
    timing = row.get("timing_note", "")
    if column == "ms" and isinstance(timing, str) and timing:
        return float(v), f"{who} at {where(shape)}: {timing}"
    return float(v), ""


def net_ms(found: dict, build: str, shape: tuple, role: str = "") -> tuple[float, str]:
    """build's median ms less its consume_ms (less_consumption), or (NaN, why not)."""
    ms, why = value(found, build, shape, "ms", role)
    consume = found[(build, shape)].get("consume_ms", math.nan) if (build, shape) in found else math.nan
    return schema.less_consumption(ms, consume), why


def shared(found: dict, builds, shape: tuple, column: str) -> tuple[float, str]:
    """A per-run figure (a ceiling) read from the rows of `builds` at shape, any status; it must agree across them."""
    seen = sorted({float(found[(b, shape)][column]) for b in builds
                   if (b, shape) in found and not pd.isna(found[(b, shape)][column])})
    if not seen:
        return math.nan, f"{column} unknown at {where(shape)}"
    if len(seen) > 1:
        return math.nan, f"{column} differs between {', '.join(builds)} at {where(shape)} ({seen}): rows of two runs"
    if seen[0] <= 0:
        return math.nan, f"{column} is {seen[0]} at {where(shape)}, not a rate"
    return seen[0], ""


def same_code(found: dict, builds, shape: tuple) -> str:
    """'' or a note that the rows of `builds` at shape were measured by different code (a baseline that changed:
    e.g. a results file resumed after a kernel edit). Rows without a `code` fingerprint are not compared."""
    codes = {b: str(found[(b, shape)].get("code", "")) for b in builds if (b, shape) in found}
    codes = {b: c for b, c in codes.items() if c and c != "nan"}
    if len(set(codes.values())) <= 1:
        return ""
    return f"measured by different code at {where(shape)}: " + ", ".join(f"{b} {c}" for b, c in codes.items())


# Two builds' median SM clocks may differ by this share before a ratio between them says it includes the clock.
CLOCK_SHARE = 0.05


def same_clock(found: dict, builds, shape: tuple) -> str:
    """'' or a note that the rows of `builds` at shape ran at SM clocks more than CLOCK_SHARE apart (attnlab.telemetry: a
    card at its power limit lowers its clock, by how much depends on the build's draw): their difference then
    includes the clock, not the work alone. Rows without a clock (a CPU, older runs) are not compared."""
    clocks = {b: float(found[(b, shape)].get("sm_clock_mhz", math.nan)) for b in builds if (b, shape) in found}
    clocks = {b: c for b, c in clocks.items() if c > 0}  # NaN compares False
    if len(clocks) < 2 or max(clocks.values()) <= (1 + CLOCK_SHARE) * min(clocks.values()):
        return ""
    reasons = dict.fromkeys(r for b in clocks for r in str(found[(b, shape)].get("clock_reasons", "")).split(" + ")
                            if r and r != "nan")
    return (f"ran at SM clocks {max(clocks.values()) / min(clocks.values()) - 1:.0%} apart at {where(shape)} ("
            + ", ".join(f"{b} {c:.0f} MHz" for b, c in clocks.items()) + (f"; {', '.join(reasons)}" if reasons else "")
            + "): Δ includes the clock, not the work alone")


def same_implementation(found: dict, builds, shape: tuple) -> str:
    """'' or a note that the rows of `builds` at shape ran kernels written differently (a Gluon kernel on one side,
    Triton on the other): their difference is then the boundary plus a different implementation, not the boundary
    alone (on Hopper, qk_softmax and fused take warp-specialised Gluon kernels at some D while materialised does not).
    A kernel every compared row runs with the same tiles (materialised's and qk_softmax's shared PV kernel, Gluon at
    some shapes) is left out: it is in both sides of the difference, so it says nothing about it."""
    recorded = {b: schema.recorded_tiles(found[(b, shape)].get("tiles")) for b in builds if (b, shape) in found}
    recorded = {b: r for b, r in recorded.items() if r}
    shared = {k for k, t in next(iter(recorded.values()), {}).items()
              if all(r.get(k) == t for r in recorded.values())} if len(recorded) > 1 else set()
    kinds = {b: ("gluon" if any(t.get("gluon") for k, t in r.items() if k not in shared) else "triton")
             for b, r in recorded.items() if any(k not in shared for k in r)}
    if len(set(kinds.values())) <= 1:
        return ""
    return (f"kernels written differently at {where(shape)} (" + ", ".join(f"{b} {k}" for b, k in kinds.items())
            + "): Δ includes the implementation, not the boundary alone")


def notes(*parts: str) -> str:
    """Non-empty notes joined, each once, in order."""
    return "; ".join(dict.fromkeys(p for p in parts if p))


# The same case timed twice in one run may differ by this share (the bound attnlab.selfcheck holds a GPU to):
# a difference below it is not evidence of anything.
REPEAT_SHARE = 0.02


def noise_ms(found: dict, names, shape: tuple, base_ms: float) -> float:
    """The smallest difference between the named builds' times at `shape` read as real: REPEAT_SHARE of base_ms,
    or the widest p20–p80 spread among their ok rows if wider (NaN when base_ms is)."""
    if not math.isfinite(base_ms):
        return math.nan
    spreads = [found[(n, shape)].get("ms_p80", math.nan) - found[(n, shape)].get("ms_p20", math.nan)
               for n in names if (n, shape) in found and found[(n, shape)].get("status") == "ok"]
    return max([REPEAT_SHARE * base_ms, *(x for x in spreads if isinstance(x, float) and math.isfinite(x))])

