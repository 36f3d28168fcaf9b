"""Axes in units a person reads: bytes in KiB, MiB and GiB at powers of 1024, never plotly's SI suffixes (its 'B' is
a billion, so 1e11 bytes reads '100B', which looks like 100 bytes).

    byte_axis(values, log=True)   plotly axis settings for an axis of byte counts: tick values at powers of two
                                  between the data's least and greatest, labelled '256 MiB', '1 GiB', '4 GiB', …
                                  (at most MAX_TICKS), on a log axis unless log=False
    byte_label(x)                 one byte count as such a label
    BYTE_TITLE                    the unit part of such an axis's title
    n_axis(ns)                    tick values for a sequence-length axis: every N measured, or where more than
                                  MAX_TICKS, the powers of two among them (else every k-th), labelled in full ('8192',
                                  never plotly's '8k' or a bare '2')
"""
from __future__ import annotations

import math

UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
MAX_TICKS = 8
BYTE_TITLE = "bytes; ticks at powers of 2, 1 GiB = 2³⁰ bytes"


def byte_label(x: float) -> str:
    for unit, size in (("TiB", 1 << 40), *UNITS):
        if abs(x) >= size:
            v = x / size
            return f"{v:.3g} {unit}"
    return f"{x:.3g} B"


def byte_axis(values, log: bool = True) -> dict:
    """Axis settings for `values` (byte counts; non-positive and non-finite ones ignored): tick values at the powers
    of two from the least to the greatest, every `step`-th (1, 2, 4, …: the fewest that leave at most MAX_TICKS)
    and anchored at 2⁰, so the labels repeat one pattern (1 MiB, 16 MiB, 256 MiB, 4 GiB …), with byte_label text. A
    linear axis (log=False) gets 0 and the top MAX_TICKS multiples of one power of two instead."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v)) and float(v) > 0]
    if not finite:
        return dict(type="log" if log else "linear")
    if not log:
        top = max(finite)
        unit = 2.0 ** math.floor(math.log2(top / MAX_TICKS)) if top >= MAX_TICKS else 1.0
        while top / unit > MAX_TICKS:
            unit *= 2
        ticks = [unit * i for i in range(0, int(math.ceil(top / unit)) + 1)]
        return dict(type="linear", tickvals=ticks, ticktext=["0", *(byte_label(t) for t in ticks[1:])])
    lo, hi = math.floor(math.log2(min(finite))), math.ceil(math.log2(max(finite)))
    step = 1
    while len([p for p in range(lo, hi + 1) if p % step == 0]) > MAX_TICKS:
        step *= 2
    ticks = [float(2 ** p) for p in range(lo, hi + 1) if p % step == 0]
    return dict(type="log", tickvals=ticks, ticktext=[byte_label(t) for t in ticks])


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
