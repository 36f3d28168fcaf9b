"""The materialised and qk_softmax backward kernels (attnlab.triton.backward through attnlab.triton.train_launch), in
Triton's interpreter, against torch.autograd in float64: causal and not, boolean and additive masks with a fully
masked row, grouped-query attention, ragged N, three dtypes, two head dims, NaN-poisoned outputs, and bad input
refused before any kernel runs."""
import pytest
import torch

from attnlab import accuracy
from attnlab.triton import backward, config, plan, train_launch
from tests.conftest import KernelStandIn, rand_qkv

BUILDS = ("materialised", "qk_softmax")
HIDDEN_ROW = 5  # the row every mask below hides entirely

CASES = {  # tiny shapes: the interpreter runs every kernel op in numpy
    "plain": dict(N=64, D=32, dtype=torch.float32),
    "causal_gqa_ragged": dict(H=4, Hkv=2, N=77, D=32, dtype=torch.float32, causal=True),
    "bool_mask_fp16": dict(N=77, D=64, dtype=torch.float16, mask="bool"),
    "additive_mask_causal_bf16": dict(N=48, D=64, dtype=torch.bfloat16, mask="additive", causal=True, scale=0.2),
    "gqa_bool_mask_causal_fp16": dict(H=4, Hkv=2, N=40, D=32, dtype=torch.float16, mask="bool", causal=True),
}


def inputs(N, D, dtype, H=2, Hkv=None, causal=False, mask=None, scale=None):
    q, k, v = rand_qkv(B=1, H=H, Hkv=Hkv, N=N, D=D, dtype=dtype, seed=N + D)
    do = rand_qkv(B=1, H=H, N=N, D=D, dtype=dtype, seed=N + D + 1)[0]
    g = torch.Generator().manual_seed(7)
    m = None
    if mask == "bool":  # (N, N), broadcast over batch and heads
        m = torch.rand(N, N, generator=g) > 0.3
        m[HIDDEN_ROW] = False
    elif mask == "additive":  # (1, H, N, N), broadcast over batch
        m = torch.randn(1, H, N, N, generator=g).to(dtype)
        m[..., HIDDEN_ROW, :] = float("-inf")
    return do, q, k, v, dict(causal=causal, attn_mask=m, scale=scale)


def poisoned(q, k, v):
    return tuple(torch.full_like(t, float("nan")) for t in (q, k, v))


def run(build, do, q, k, v, kw, out=None):
    o, P = getattr(train_launch, f"{build}_forward")(q, k, v, **kw)
    return getattr(train_launch, f"{build}_backward")(do, q, k, v, o, P, **kw, out=out)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("build", BUILDS)
def test_gradients_pass_the_rule_and_write_every_element(build, case):
    """dq, dk, dv into NaN-filled tensors: every element written, each gradient within the rule (at most twice plain
    torch autograd's error in the same dtype, attnlab.accuracy); a fully masked row's dq is exactly 0."""
    do, q, k, v, kw = inputs(**CASES[case])
    out = poisoned(q, k, v)
    grads = run(build, do, q, k, v, kw, out=out)
    assert all(g is o for g, o in zip(grads, out))  # written where the caller asked
    assert all(not torch.isnan(g).any() for g in grads)
    verdicts = accuracy.judge_grads(grads, accuracy.grad_refs(do, q, k, v, **kw))
    assert all(v.ok for v in verdicts.values()), verdicts
    if kw["attn_mask"] is not None:
        assert torch.equal(grads[0][:, :, HIDDEN_ROW], torch.zeros_like(grads[0][:, :, HIDDEN_ROW]))


@pytest.mark.parametrize("causal", [False, True])
def test_tiles_smaller_than_the_sequence_and_unequal_give_the_same_gradients(causal):
    """dS and dK/dV with tiles of 16 × 32 and 32 × 16 (several query and key blocks, the causal skips not aligned to
    each other) equal the one-block run's in float32, for both builds (dP from memory and on chip)."""
    do, q, k, v, kw = inputs(N=45, D=16, dtype=torch.float32, H=2, Hkv=1, causal=causal)
    for build in BUILDS:
        whole = run(build, do, q, k, v, kw)
        small = plan.Overrides(forced=(("ds", config.Tiles(16, 32)), ("transposed", config.Tiles(32, 16))))
        with plan.overriding(small):
            tiled = run(build, do, q, k, v, kw, out=poisoned(q, k, v))
        for a, b in zip(whole, tiled):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_two_builds_agree_where_only_dp_s_trip_differs():
    """materialised reads dP from memory, qk_softmax computes it on chip: in float32 their gradients agree to
    rounding, and both are the oracle's."""
    do, q, k, v, kw = inputs(N=64, D=32, dtype=torch.float32, causal=True)
    for a, b in zip(run("materialised", do, q, k, v, kw), run("qk_softmax", do, q, k, v, kw)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.fixture
def no_kernels(monkeypatch):
    """The backward's own kernels replaced by stand-ins that record each launch."""
    launched = []
    for name in ("ds_kernel", "transposed_kernel"):
        monkeypatch.setattr(backward, name, KernelStandIn(lambda grid, args, name=name: launched.append(name)))
    return launched


def bad_inputs():
    do, q, k, v, kw = inputs(N=16, D=16, dtype=torch.float32)
    o, P = train_launch.materialised_forward(q, k, v, **kw)
    return do, q, k, v, o, P, kw


@pytest.mark.parametrize("change, argument", [
    (lambda a: a.update(do=a["do"][:, :, :8]), "do"),
    (lambda a: a.update(do=a["do"].half()), "do"),
    (lambda a: a.update(o=a["o"].double()), "o"),
    (lambda a: a.update(q=a["q"].to(torch.int32)), "q.dtype"),
    (lambda a: a.update(P=a["P"][:, :, :8]), "P"),
    (lambda a: a.update(P="P"), "P"),
    (lambda a: a.update(out=(a["q"], a["k"])), "out"),
    (lambda a: a.update(out=(a["q"], a["k"], a["v"][..., :8])), "dv"),
    (lambda a: a.update(out=(a["q"].half(), a["k"], a["v"])), "dq"),
])
@pytest.mark.parametrize("build", BUILDS)
def test_bad_input_is_one_clear_error_before_any_kernel(build, change, argument, no_kernels):
    do, q, k, v, o, P, kw = bad_inputs()
    a = dict(do=do, q=q, k=k, v=v, o=o, P=P, out=None)
    change(a)
    with pytest.raises(ValueError, match=argument):
        getattr(train_launch, f"{build}_backward")(a["do"], a["q"], a["k"], a["v"], a["o"], a["P"], **kw,
                                                   out=a["out"])
    assert no_kernels == []


def test_the_kernels_run_when_the_input_is_good(no_kernels):
    """The stand-ins above see the launches a good call makes: dV and dK by the transposed kernel, dS by its own."""
    do, q, k, v, o, P, kw = bad_inputs()
    train_launch.qk_softmax_backward(do, q, k, v, o, P, **kw)
    assert no_kernels == ["transposed_kernel", "ds_kernel", "transposed_kernel"]
