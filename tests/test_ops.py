"""Our builds as torch.library ops (attnlab.builds.ops), in Triton's interpreter: torch's own operator checks pass
(schema, fake tensors, autograd registration, AOT dispatch with dynamic shapes), torch.compile traces a function and
a transformers model that call them in one graph, and the transformers integration runs them."""
import pytest
import torch

from attnlab import builds
from attnlab.builds import ops
from tests.conftest import rand_qkv

CASES = {  # small shapes: the interpreter runs every kernel in numpy
    "plain": dict(B=1, H=2, N=24, D=16),
    "causal": dict(B=1, H=2, N=24, D=16, causal=True),
    "gqa": dict(B=2, H=4, Hkv=2, N=16, D=16, causal=True),
    "bool_mask": dict(B=1, H=2, N=24, D=16, mask="bool"),
    "additive_mask": dict(B=1, H=2, N=20, D=32, mask="additive", scale=0.3),
}


def _args(B, H, N, D, Hkv=None, causal=False, mask=None, scale=None):
    q, k, v = rand_qkv(B=B, H=H, Hkv=Hkv, N=N, D=D, seed=N)
    m = None
    if mask == "bool":
        m = torch.rand(N, N, generator=torch.Generator().manual_seed(1)) > 0.3
    elif mask == "additive":
        m = torch.randn(1, H, N, N, generator=torch.Generator().manual_seed(1))
    return (q, k, v, m, causal, scale)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", ops.OPS)
def test_torchs_operator_checks_pass(name, case):
    torch.library.opcheck(ops.get(name), _args(**CASES[case]))


@pytest.mark.parametrize("name", ops.OPS)
def test_an_op_gives_its_builds_output(name):
    q, k, v, m, causal, scale = _args(**CASES["bool_mask"])
    want = builds.get(name).attend(q, k, v, causal=causal, attn_mask=m, scale=scale)
    assert torch.equal(ops.get(name)(q, k, v, m, causal, scale), want)


def recording(graphs: list):
    """A torch.compile backend that keeps each graph Dynamo hands it and runs it as it is (no code generated)."""
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return backend


def op_calls(graphs: list, name: str) -> int:
    return sum(1 for gm in graphs for node in gm.graph.nodes if f"attnlab.{name}" in str(node.target))


def test_a_compiled_function_calling_an_op_is_one_graph():
    """torch.compile(fullgraph=True) traces the op with the code around it into one graph that holds it (fullgraph: a
    break is an error); Dynamo's own account counts no break."""
    def block(q, k, v):
        o = torch.ops.attnlab.fused(q * 0.5, k, v, None, True, None)
        return (o + q).sum(dim=-1)

    q, k, v = rand_qkv(B=1, H=2, N=24, D=16)
    graphs = []
    torch._dynamo.reset()
    compiled = torch.compile(block, backend=recording(graphs), fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), block(q, k, v))
    assert len(graphs) == 1 and op_calls(graphs, "fused") == 1
    explained = torch._dynamo.explain(block)(q, k, v)
    assert explained.graph_count == 1 and explained.graph_break_count == 0


def test_a_compiled_transformers_model_with_our_attention_is_one_graph():
    """A tiny random-init Llama whose attention is our fused op: torch.compile traces its whole forward in one graph
    (fullgraph) holding the op once a layer, and the compiled logits are the eager ones."""
    pytest.importorskip("transformers", reason="the model extra: pip install -e '.[model]'")
    from attnlab import hf_attention, model_forward as mf

    spec = mf.ModelSpec("tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=128)
    model = mf.build(spec, seed=0)
    hf_attention.register()
    model.set_attn_implementation(hf_attention.impl_name("fused"))
    ids = mf.token_ids(spec, 1, 16, 0, "cpu")
    torch._dynamo.reset()
    graphs = []
    with torch.no_grad():
        eager = model(ids).logits
        compiled = torch.compile(model, backend=recording(graphs), fullgraph=True)(ids).logits
    torch.testing.assert_close(compiled, eager)
    assert len(graphs) == 1 and op_calls(graphs, "fused") == spec.layers


def test_the_transformers_integration_calls_the_ops(monkeypatch):
    """hf_attention's function for one of our builds runs its op (what torch.compile then sees), the library rows
    their own functions."""
    pytest.importorskip("transformers", reason="the model extra: pip install -e '.[model]'")
    from attnlab import hf_attention

    called = []
    real = ops.get("qk_softmax")
    monkeypatch.setattr(ops, "get", lambda name: lambda *a: called.append(name) or real(*a))
    q, k, v = rand_qkv(B=1, H=2, N=16, D=16)
    module = torch.nn.Module()
    module.is_causal = True
    o, weights = hf_attention.attention_function("qk_softmax")(module, q, k, v, None, scaling=0.25)
    assert called == ["qk_softmax"] and weights is None
    want = builds.get("qk_softmax").attend(q, k, v, causal=True, scale=0.25)
    torch.testing.assert_close(o, want.transpose(1, 2))
