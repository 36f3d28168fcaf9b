"""What a check answers: passed or not, and for an answer not yet right, where it first goes wrong and a hint at why.

A check never raises and never says a bare "wrong": a failing Verdict names the input it tried, the first place the
answer differs (an index and the value yours has there) and how far off it is, then what is most likely wrong. It
never prints the value it expected: the student finds that. papermill fails a notebook on any error output, so a
check that failed must still return normally: its answer is the Verdict's text.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class Verdict:
    exercise: str
    ok: bool
    lines: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        head = f"{'PASSED' if self.ok else 'NOT YET'}: {self.exercise}"
        return "\n".join([head, *("  " + line for line in self.lines)])


def fmt(x) -> str:
    """A number as a reader compares it: integers with thousands separators, floats to 6 significant digits."""
    if isinstance(x, bool) or x is None:
        return repr(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:.6g}"
    return repr(x)


def tensor_difference(yours, expected: torch.Tensor, *, rtol: float, atol: float) -> str | None:
    """None when `yours` matches `expected` elementwise within rtol/atol, else where it first differs (row-major
    order) with your value there, how many elements differ and the farthest one's distance in tolerances; never an
    expected value."""
    if not isinstance(yours, torch.Tensor):
        return f"yours is a {type(yours).__name__}, expected a tensor of shape {tuple(expected.shape)}"
    if tuple(yours.shape) != tuple(expected.shape):
        return f"shape: yours {tuple(yours.shape)}, expected {tuple(expected.shape)}"
    y, e = yours.detach().to("cpu", torch.float64), expected.detach().to("cpu", torch.float64)
    bad = ~torch.isclose(y, e, rtol=rtol, atol=atol)  # NaN is never close, not even to NaN
    if not bad.any():
        return None
    first = tuple(int(i) for i in bad.nonzero()[0])
    off = ((y - e).abs() / (atol + rtol * e.abs())).nan_to_num(nan=float("inf"))
    worst = tuple(int(i) for i in torch.unravel_index(off.argmax(), off.shape))
    far = ("not finite" if not math.isfinite(y[worst].item()) else f"about {off[worst].item():.0e} × the tolerance")
    return (f"first difference at index {list(first)}: yours {fmt(y[first].item())}; {int(bad.sum())} of "
            f"{bad.numel()} elements differ (tolerance {atol:g} + {rtol:g}·|expected|), the farthest at "
            f"{list(worst)}: yours {fmt(y[worst].item())}, {far}")


def relative_error(yours: torch.Tensor, expected: torch.Tensor) -> float:
    """max |yours − expected| over max |expected|: how far off an answer is as a whole (inf where yours is not
    finite)."""
    y, e = yours.detach().to("cpu", torch.float64), expected.detach().to("cpu", torch.float64)
    if not torch.isfinite(y).all():
        return math.inf
    return float((y - e).abs().max() / e.abs().max().clamp_min(1e-300))
