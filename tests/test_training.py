"""Training through our builds and the library's (attnlab.builds.training), and through the custom ops
(attnlab.builds.ops), in Triton's interpreter: gradients by autograd within the accuracy rule for every build with a
backward, what each keeps for its backward, names without a backward and masks that require grad refused, torch's
operator checks with the autograd registration, and a compiled forward and backward that holds our ops."""
import importlib.util

import pytest
import torch

from attnlab import accuracy
from attnlab.builds import Unsupported, ops, training
from attnlab.triton import launch
from tests.conftest import rand_qkv

HAS_FUSED_TRAIN = importlib.util.find_spec(training.FUSED_TRAIN) is not None
NO_FUSED_TRAIN = f"{training.FUSED_TRAIN} is not in this checkout: the fused build's backward comes with it"


def skip_without_backward(name):
    if name == "fused" and not HAS_FUSED_TRAIN:
        pytest.skip(NO_FUSED_TRAIN)
    if name == "flex":
        pytest.skip("compiled FlexAttention costs the CPU minutes of compile (the gates leave it to the GPU)")


def leaves(*tensors):
    return tuple(t.detach().clone().requires_grad_() for t in tensors)


def inputs(causal=True, mask=False):
    q, k, v = rand_qkv(B=1, H=4, Hkv=2, N=40, D=16, seed=3)
    do = rand_qkv(B=1, H=4, N=40, D=16, seed=4)[0]
    m = (torch.rand(40, 40, generator=torch.Generator().manual_seed(5)) > 0.3) | torch.eye(40, dtype=torch.bool)
    return do, q, k, v, dict(causal=causal, attn_mask=m if mask else None)


@pytest.mark.parametrize("name", training.names())
def test_every_build_with_a_backward_gives_gradients_within_the_rule(name):
    """attend(name): autograd through our Function or the library's call gives dq, dk, dv within the accuracy rule
    (GQA, causal; SDPA takes no mask with causal, so the library rows get the causal mask alone)."""
    skip_without_backward(name)
    do, q, k, v, kw = inputs()
    q_, k_, v_ = leaves(q, k, v)
    try:
        o = training.attend(name)(q_, k_, v_, **kw)
    except Unsupported as e:
        pytest.skip(f"{name} cannot run here: {e}")
    grads = torch.autograd.grad(o, (q_, k_, v_), do)
    verdicts = accuracy.judge_grads(grads, accuracy.grad_refs(do, q, k, v, **kw))
    assert all(v.ok for v in verdicts.values()), verdicts


@pytest.mark.parametrize("name", training.names()[:2])
def test_our_functions_run_the_train_launchers_kernels(name):
    """Our Function's gradients are the launchers' bit for bit (a mask included), and its o is the inference
    build's."""
    do, q, k, v, kw = inputs(mask=True)
    q_, k_, v_ = leaves(q, k, v)
    o = training.attend(name)(q_, k_, v_, **kw)
    grads = torch.autograd.grad(o, (q_, k_, v_), do)
    o_, P = getattr(training.train_launch, f"{name}_forward")(q, k, v, **kw)
    want = getattr(training.train_launch, f"{name}_backward")(do, q, k, v, o_, P, **kw)
    assert torch.equal(o, getattr(launch, name)(q, k, v, **kw))
    assert all(torch.equal(a, b) for a, b in zip(grads, want))


def kept_for_backward(call, *args, **kw):
    """The shapes of the tensors autograd keeps from forward to backward during call(*args)."""
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        call(*args, **kw)
    return shapes


@pytest.mark.parametrize("name", ["materialised", "qk_softmax", "fused"])
def test_what_our_builds_keep_for_backward_is_what_saved_says(name):
    """materialised and qk_softmax keep P (B, H, N, N) beside q, k, v and o; fused keeps the logsumexp (B, H, N) and
    nothing N × N."""
    skip_without_backward(name)
    do, q, k, v, kw = inputs()
    shapes = kept_for_backward(training.attend(name), *leaves(q, k, v), **kw)
    extra = [s for s in shapes if s not in (tuple(q.shape), tuple(k.shape))]
    want = {"P": [(1, 4, 40, 40)], "logsumexp": [(1, 4, 40)]}[training.saved(name)]
    assert extra == want


def test_names_and_saved_cover_ours_and_the_library():
    assert training.names()[:3] == ["materialised", "qk_softmax", "fused"]
    assert {"torch_eager", "sdpa_math", "sdpa_flash", "sdpa_cudnn", "flex"} <= set(training.names())
    assert not any("-" in n for n in training.names())  # no ablation
    assert training.saved("torch_eager") == "P" and training.saved("sdpa_flash") == "logsumexp"


@pytest.mark.parametrize("name, why", [("fused-no_pv", "ablation"), ("qk_softmax-zero_mask", "ablation"),
                                       ("nope", "not a build")])
def test_a_name_without_a_backward_is_refused(name, why):
    with pytest.raises(ValueError, match=why):
        training.attend(name)
    with pytest.raises(ValueError, match=why):
        training.saved(name)


@pytest.mark.parametrize("name", ["materialised", "torch_eager"])
def test_a_mask_that_requires_grad_is_refused_before_any_work(name, monkeypatch):
    do, q, k, v, kw = inputs(causal=False)
    monkeypatch.setattr(launch, "prepare", lambda *a, **k: pytest.fail("a kernel call was prepared"))
    mask = torch.zeros(40, 40, requires_grad=True)
    with pytest.raises(ValueError, match="attn_mask must not require grad"):
        training.attend(name)(*leaves(q, k, v), attn_mask=mask)
    with pytest.raises(ValueError, match="attn_mask must not require grad"):
        ops.get("qk_softmax")(*leaves(q, k, v), mask)


@pytest.mark.parametrize("name", ["qk_softmax", "sdpa_math"])
def test_inputs_that_are_not_floating_point_are_refused_by_name(name):
    q, k, v = (torch.ones(1, 2, 8, 16, dtype=torch.int32) for _ in range(3))
    with pytest.raises(ValueError, match=r"q.dtype must be one of float16, bfloat16, float32"):
        training.attend(name)(q, k, v)


# ---- the custom ops ------------------------------------------------------------------------------------------------

OURS = [pytest.param(n, marks=pytest.mark.skipif(n == "fused" and not HAS_FUSED_TRAIN, reason=NO_FUSED_TRAIN))
        for n in ops.OPS]


@pytest.mark.parametrize("name", OURS)
def test_torchs_operator_checks_pass_with_gradients(name):
    """opcheck on the public op with inputs that require grad (its forward op and registered autograd run), and on
    the forward and backward ops themselves: schema, fake tensors (P's padded rows included), autograd registration,
    AOT dispatch with dynamic shapes (forward and backward traced)."""
    q, k, v = rand_qkv(B=1, H=2, Hkv=1, N=12, D=16, seed=6)  # each check runs the op several times: tiny shapes
    do, mask = torch.randn_like(q), torch.rand(12, 12, generator=torch.Generator().manual_seed(6)) > 0.3
    args = (*leaves(q, k, v), mask, True, 0.3)
    torch.library.opcheck(ops.get(name), args)
    torch.library.opcheck(getattr(torch.ops.attnlab, f"{name}_forward"), args)
    o, kept = getattr(torch.ops.attnlab, f"{name}_forward")(q, k, v, mask, True, 0.3)
    torch.library.opcheck(getattr(torch.ops.attnlab, f"{name}_backward"), (do, q, k, v, o, kept, mask, True, 0.3))


@pytest.mark.parametrize("name", OURS)
def test_the_ops_gradients_are_the_functions(name):
    do, q, k, v, kw = inputs(mask=True)
    by_op, by_function = leaves(q, k, v), leaves(q, k, v)
    o = ops.get(name)(*by_op, kw["attn_mask"], True, None)
    want = torch.autograd.grad(training.attend(name)(*by_function, **kw), by_function, do)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(o, by_op, do), want))


def test_a_compiled_training_step_sees_the_op_and_its_backward():
    """torch.compile(fullgraph=True) of a function calling torch.ops.attnlab.materialised: with inputs that require
    grad, AOT autograd's forward graph holds the forward op (whose P it passes to the backward graph) and its backward
    graph the backward op, and the compiled gradients are the eager ones; under no_grad the inference op runs."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = {"forward": [], "backward": []}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append(gm)
            return make_boxed_func(gm.forward)
        return compiler

    def step(q, k, v):
        return (torch.ops.attnlab.materialised(q * 0.5, k, v, None, True, None) * v.mean()).sum()

    do, q, k, v, kw = inputs()
    torch._dynamo.reset()
    compiled = torch.compile(step, backend=aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward")),
                             fullgraph=True)
    got, want = leaves(q, k, v), leaves(q, k, v)
    grads = torch.autograd.grad(compiled(*got), got)
    for a, b in zip(grads, torch.autograd.grad(step(*want), want)):
        torch.testing.assert_close(a, b)

    def targets(kind):
        return [str(n.target) for gm in graphs[kind] for n in gm.graph.nodes if "attnlab" in str(n.target)]

    assert targets("forward") == ["attnlab.materialised_forward.default"]
    assert targets("backward") == ["attnlab.materialised_backward.default"]
    with torch.no_grad():
        compiled(q, k, v)
    assert targets("forward")[-1] == "attnlab.materialised_inference.default"
