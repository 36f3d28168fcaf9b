"""Axes and labels in units a person reads: byte counts in KiB, MiB, GiB and TiB (powers of 1024), never plotly's SI
suffixes on a byte axis (its "100B" means 100 billion bytes but reads as 100 bytes, and "1G" is not a GiB), and
sequence lengths written in full.

    byte_label(n)                 '1 GiB', '512 MiB', '1.5 KiB', '800 B'
    byte_ticks(values, most)      (tickvals, ticktext): powers of two spanning the values, every step-th exponent
                                  (1, 2, 4, … anchored at 2⁰, so the labels repeat one pattern: 1 MiB, 16 MiB,
                                  256 MiB, 4 GiB …), at most `most` of them, labelled by byte_label
    byte_axis(values, log=True)   those ticks as plotly axis settings (a log axis), or on a linear axis 0 and
                                  multiples of one power of two
    BYTE_TITLE                    the unit part of such an axis's title
    log_ticks(values, most)       (tickvals, ticktext) for a log axis of other quantities: 1, 2 and 5 × 10ᵏ spanning
                                  the values (sparser where that leaves too many, denser on a narrow range),
                                  labelled in full ('0.2', '50'), never a bare minor digit beside its decade
    readable_log_axes(fig)        log_ticks on every log axis of a figure that has no ticks of its own, from the
                                  values its traces draw there (axes that match share one set)
    n_axis(ns)                    tick values for a sequence-length axis: every N measured, or where more than
                                  MAX_TICKS, the powers of two among them (else every k-th), labelled in full ('8192',
                                  never plotly's '8k')
"""
from __future__ import annotations

import math

UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
MAX_TICKS = 8
BYTE_TITLE = "bytes; ticks at powers of 2, 1 GiB = 2³⁰ bytes"


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


def _positive(values) -> list[float]:
    out = []
    for v in values:
        try:
            v = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v) and v > 0:
            out.append(v)
    return out


def byte_ticks(values, most: int = MAX_TICKS) -> tuple[list[int], list[str]]:
    """Ticks for a log axis of bytes holding `values` (positive, finite ones; others ignored): the powers of two
    from the largest at or below the least value to the smallest at or above the greatest, every step-th exponent
    (the smallest power-of-two step that leaves at most `most`), from the step's multiple at or below the least to
    the one at or above the greatest, each labelled by byte_label."""
    positive = _positive(values)
    if not positive:
        return [], []
    lo, hi = math.floor(math.log2(min(positive))), math.ceil(math.log2(max(positive)))
    step = 1
    while -(-hi // step) - lo // step + 1 > most:
        step *= 2
    ticks = [2 ** (step * k) for k in range(lo // step, -(-hi // step) + 1)]  # the values lie within them
    return ticks, [byte_label(t) for t in ticks]


def byte_axis(values, log: bool = True, most: int = MAX_TICKS) -> dict:
    """Plotly axis settings for an axis of byte counts: byte_ticks on a log axis; on a linear one (log=False), 0 and
    the multiples of one power of two up to the greatest value, at most `most` of them."""
    positive = _positive(values)
    if not positive:
        return dict(type="log" if log else "linear")
    if log:
        vals, text = byte_ticks(positive, most)
        return dict(type="log", tickmode="array", tickvals=vals, ticktext=text)
    top = max(positive)
    unit = 2.0 ** math.floor(math.log2(top / most)) if top >= most else 1.0
    while top / unit > most:
        unit *= 2
    ticks = [unit * i for i in range(0, int(math.ceil(top / unit)) + 1)]
    return dict(type="linear", tickmode="array", tickvals=ticks, ticktext=["0", *(byte_label(t) for t in ticks[1:])])


LADDER = ((1,), (1, 3), (1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8))  # mantissas a decade
USUAL = 2  # LADDER's index of 1, 2, 5


def log_ticks(values, most: int = MAX_TICKS) -> tuple[list[float], list[str]]:
    """Ticks for a log axis holding `values` (positive, finite ones; others ignored): m × 10ᵏ from the greatest at or
    below the least value to the least at or above the greatest, for mantissas m of LADDER: 1, 2, 5, or sparser
    where that gives more than `most` ticks (10ᵏ alone, every step-th decade, past that), or denser where fewer than
    two ticks would fall among the values (a narrow range); each labelled in full."""
    positive = _positive(values)
    if not positive:
        return [], []
    lo, hi = min(positive), max(positive)

    def inside(ticks):
        return sum(lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9) for t in ticks)

    rung = USUAL
    while rung > 0 and len(_decade_ticks(lo, hi, LADDER[rung], 1)) > most:
        rung -= 1
    while rung < len(LADDER) - 1 and inside(_decade_ticks(lo, hi, LADDER[rung], 1)) < 2:
        rung += 1
    step = 1
    while len(ticks := _decade_ticks(lo, hi, LADDER[rung], step)) > most:
        step += 1
    return ticks, [_number(t) for t in ticks]


def _decade_ticks(lo: float, hi: float, mantissas, step: int) -> list[float]:
    """m × 10ᵏ (k a multiple of step) from the greatest at or below lo to the least at or above hi."""
    every = [float(f"{m}e{k}") for k in range(math.floor(math.log10(lo)) - step, math.ceil(math.log10(hi)) + step + 1)
             if k % step == 0 for m in mantissas]
    below = [t for t in every if t <= lo * (1 + 1e-9)]
    above = [t for t in every if t >= hi * (1 - 1e-9)]
    first, last = (below[-1] if below else every[0]), (above[0] if above else every[-1])
    return [t for t in every if first <= t <= last]


def _number(t: float) -> str:
    """A tick in full: '0.05', '1.5', '300', '20000' (no exponent, no SI suffix)."""
    return f"{t:.10f}".rstrip("0").rstrip(".")


def readable_log_axes(fig):
    """Give every log axis of plotly figure `fig` without tick values of its own log_ticks of the values its traces
    draw on it (an axis that `matches` another shares that one's set), in place; returns fig. Plotly's own log
    ticks label minor ticks with a bare '2' and '5' between the decades, which read as values."""
    layout = fig.layout
    groups: dict[str, list[str]] = {}
    for name in [k for k in layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]:
        axis = layout[name]
        if axis.type != "log" or axis.tickvals is not None:
            continue
        short = name[0] + name[5:]  # 'yaxis2' → 'y2'
        groups.setdefault(axis.matches or short, []).append(short)
    for shorts in groups.values():
        values = [v for trace in fig.data for letter in "xy"
                  if (getattr(trace, f"{letter}axis", None) or letter) in shorts and getattr(trace, letter) is not None
                  for v in getattr(trace, letter)]
        vals, text = log_ticks(values)
        if vals:
            for short in shorts:
                layout[short[0] + "axis" + short[1:]].update(tickmode="array", tickvals=vals, ticktext=text)
    return fig


def n_axis(ns, most: int = MAX_TICKS) -> dict:
    ns = sorted({int(n) for n in ns})
    if len(ns) > most:
        twos = [n for n in ns if n & (n - 1) == 0]
        if 2 <= len(twos) <= most:
            ns = twos
        else:
            step = math.ceil(len(ns) / most)
            ns = ns[::step] if ns[::step][-1] == ns[-1] else ns[::step][:-1] + [ns[-1]]
    return dict(tickvals=ns, ticktext=[str(n) for n in ns])
