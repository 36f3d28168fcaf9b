"""What a check answers: passed or not, and where the answer first differs from what was expected.

A check never raises and never says a bare "wrong": a failing Verdict names the input it tried, the first place the
answer differs (an index, the value there, the value expected) and how far off the rest is, so the student can
look at one number and start from there. papermill fails a notebook on any error output, so a check that failed
must still return normally: its answer is the Verdict's text.
"""
from __future__ import annotations

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
    order): the index, both values, how many elements differ and the largest difference."""
    if not isinstance(yours, torch.Tensor):
        return f"yours is a {type(yours).__name__}, expected a tensor of shape {tuple(expected.shape)}"
    if tuple(yours.shape) != tuple(expected.shape):
        return f"shape: yours {tuple(yours.shape)}, expected {tuple(expected.shape)}"
    y, e = yours.detach().to("cpu", torch.float64), expected.detach().to("cpu", torch.float64)
    bad = ~torch.isclose(y, e, rtol=rtol, atol=atol)  # NaN is never close, not even to NaN
    if not bad.any():
        return None
    first = tuple(int(i) for i in bad.nonzero()[0])
    gap = (y - e).abs().nan_to_num(nan=float("inf"))
    worst = tuple(int(i) for i in torch.unravel_index(gap.argmax(), gap.shape))
    return (f"first difference at index {list(first)}: yours {fmt(y[first].item())}, expected "
            f"{fmt(e[first].item())}; {int(bad.sum())} of {bad.numel()} elements differ (tolerance {atol:g} + "
            f"{rtol:g}·|expected|), the largest at {list(worst)}: yours {fmt(y[worst].item())}, expected "
            f"{fmt(e[worst].item())}")


def sequence_difference(yours, expected: list) -> str | None:
    """None when the two sequences are equal, else the first position where they differ and both values there."""
    try:
        yours = list(yours)
    except TypeError:
        return f"yours is a {type(yours).__name__}, expected a list like {expected}"
    for i, (y, e) in enumerate(zip(yours, expected)):
        if y != e:
            return (f"first difference at position {i}: yours {fmt(y)}, expected {fmt(e)} (yours {yours}, expected "
                    f"{expected})")
    if len(yours) != len(expected):
        i = min(len(yours), len(expected))
        extra = f"yours has {fmt(yours[i])}" if len(yours) > i else f"expected {fmt(expected[i])}, yours ends"
        return f"first difference at position {i}: {extra} (yours {yours}, expected {expected})"
    return None
