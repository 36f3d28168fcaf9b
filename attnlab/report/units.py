"""Byte counts as people read them, on figures too: labels in KiB, MiB, GiB and TiB (powers of 1024), and the ticks
of a log axis of bytes at powers of two, each labelled with its unit. Plotly's own ticks on a byte axis are SI
("1T", "100B"): "100B" means 100 billion bytes but reads as 100 bytes, and "1G" is not a GiB.

    byte_label(n)                 '1 GiB', '512 MiB', '1.5 KiB', '800 B'
    byte_ticks(values, most=8)    (tickvals, ticktext): powers of two spanning the values, labelled by byte_label
    byte_axis(values)             the same as keyword arguments of fig.update_yaxes (tickmode 'array')
"""
from __future__ import annotations

import math

UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
STEPS = (1, 2, 5, 10, 20, 30)  # exponents of 2 between ticks: 5 and 10 keep a tick on every 1 KiB, 1 MiB, 1 GiB …


def byte_label(n: float) -> str:
    """Bytes in the largest unit (powers of 1024) that leaves at least 1, to three significant digits (four from
    1000 to 1023 of a unit)."""
    if not isinstance(n, (int, float)) or not math.isfinite(n):
        return "n/a"
    value, unit = float(n), UNITS[0]
    for unit in UNITS:
        if abs(value) < 1024 or unit == UNITS[-1]:
            break
        value /= 1024
    return f"{value:.0f} {unit}" if abs(value) >= 1000 else f"{value:.3g} {unit}"  # 1000–1023: no exponent


def byte_ticks(values, most: int = 8) -> tuple[list[int], list[str]]:
    """Ticks for a log axis of bytes holding `values` (positive ones; others ignored): powers of two from the
    largest at or below the smallest value to the smallest at or above the largest, every STEPS-th exponent so that
    at most `most` remain (two or more where the values allow), each labelled by byte_label."""
    positive = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    if not positive:
        return [], []
    lo, hi = math.floor(math.log2(min(positive))), math.ceil(math.log2(max(positive)))
    step = next((s for s in STEPS if -(-hi // s) - lo // s + 1 <= most), STEPS[-1])
    exps = range(lo // step * step, -(-hi // step) * step + 1, step)  # from a multiple of the step below lo
    ticks = [2 ** e for e in exps]
    return ticks, [byte_label(t) for t in ticks]


def byte_axis(values, most: int = 8) -> dict:
    """Keyword arguments of fig.update_yaxes (or update_xaxes) that put byte_ticks(values) on the axis."""
    vals, text = byte_ticks(values, most)
    return dict(tickmode="array", tickvals=vals, ticktext=text)
