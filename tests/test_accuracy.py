"""attnlab.accuracy's rule at its edges, on real tensors: outputs made a chosen number of times as wrong as plain
torch (the oracle's output moved along torch's own error), just inside and just outside each limit of the rule:
twice torch's error, the floor where torch is nearly exact, the cap whatever torch does, and NaN."""
import math

import pytest
import torch

from attnlab import accuracy, reference

# Softmax scales to search: a larger scale sharpens the scores, and rounding them in a low precision then costs more,
# so plain torch's error at the inputs' dtype grows (unevenly) with it. Each test takes the first scale whose error
# puts the limit it tests in play, and asserts that it found one.
SCALES = (0.125, 0.25, 0.5, 1, 2, 3, 4, 6, 8, 12, 16, 24)
# The rule's numbers, stated here apart from the module so that a changed number fails a test: dtype → (floor, cap)
RULE = {torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 1e-2), torch.bfloat16: (1.5e-2, 4e-2)}


def inputs(dtype):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, 64, 32, generator=g).to(dtype) for _ in range(3))


def torch_error(dtype, scale) -> float:
    q, k, v = inputs(dtype)
    lowp = reference.attend(q, k, v, scale=scale, dtype=dtype)
    return accuracy.rel_error(lowp, reference.attend(q, k, v, scale=scale))


def scale_where(dtype, ok) -> float:
    """The first of SCALES at which plain torch's error at `dtype` satisfies ok(err_lowp)."""
    for scale in SCALES:
        if ok(torch_error(dtype, scale)):
            return scale
    raise AssertionError(f"no scale in {SCALES} gives {dtype} a torch error the test needs")


def judged(dtype, scale, *, times=None, err=None) -> accuracy.Verdict:
    """The verdict on ref + c·(torch's output − ref): an output wrong the way plain torch is, `times` as much (or
    with relative error `err`)."""
    q, k, v = inputs(dtype)
    ref = reference.attend(q, k, v, scale=scale)
    lowp = reference.attend(q, k, v, scale=scale, dtype=dtype).to(torch.float64)
    c = times if times is not None else err / accuracy.rel_error(lowp, ref)
    verdict = accuracy.judge(ref + c * (lowp - ref), q, k, v, scale=scale)
    assert verdict.err == pytest.approx(c * verdict.err_lowp, rel=1e-9)  # the output is what it claims
    return verdict


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_an_output_may_be_twice_as_wrong_as_plain_torch_and_no_more(dtype):
    """Where twice torch's error decides (above the floor, under the cap): 1.5× passes, 3× and 5× fail."""
    floor, cap = RULE[dtype]
    scale = scale_where(dtype, lambda e: 1.5 * e > floor and 3 * e <= cap)
    inside = judged(dtype, scale, times=1.5)
    assert inside.ok and inside.limit == pytest.approx(2 * inside.err_lowp)
    assert not judged(dtype, scale, times=3).ok
    assert not judged(dtype, scale, times=5).ok


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_where_torch_is_nearly_exact_the_floor_is_the_limit(dtype):
    floor, _ = RULE[dtype]
    scale = scale_where(dtype, lambda e: 2 * e < 0.8 * floor)
    inside = judged(dtype, scale, err=0.9 * floor)
    assert inside.ok and inside.limit == pytest.approx(floor)
    assert not judged(dtype, scale, err=1.1 * floor).ok


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_where_twice_torchs_error_passes_the_cap_the_cap_is_the_limit(dtype):
    _, cap = RULE[dtype]
    scale = scale_where(dtype, lambda e: 2 * e > 1.2 * cap)
    inside = judged(dtype, scale, err=0.9 * cap)
    assert inside.ok and inside.limit == pytest.approx(cap)
    outside = judged(dtype, scale, err=1.1 * cap)
    assert not outside.ok and outside.err < 2 * outside.err_lowp  # within twice torch's error: the cap alone refuses it


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_or_inf_never_passes(bad):
    q, k, v = inputs(torch.float32)
    o = reference.attend(q, k, v)
    o[0, 1, 5, 7] = bad
    verdict = accuracy.judge(o, q, k, v)
    assert verdict.err == math.inf and not verdict.ok
