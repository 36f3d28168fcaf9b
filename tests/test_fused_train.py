"""The fused build's training path (attnlab.triton.fused_train) in the interpreter: the forward gives the inference
build's O and each row's logsumexp; the backward's dQ, dK, dV stand against torch.autograd through the fp64 oracle
under the accuracy rule, written into NaN-poisoned buffers; bad input is one ValueError before any kernel runs."""
import pytest
import torch

from attnlab import accuracy, reference
from attnlab.triton import config, fused_backward, fused_train, launch, plan
from tests.conftest import rand_qkv
from tests.offline import Compiles, compiles

B, H, HKV, N = 1, 4, 2, 77  # grouped-query heads; N ragged against every block, several blocks of 32 in the backward


def masks(kind, dtype, seed=1):
    """None, a boolean (N, N) mask broadcast over batch and heads with row 5 hidden, or an additive (1, H, N, N) one in
    q's dtype that varies over heads, with row 3 of head 1 all -inf; the hidden row, as (head or None, row)."""
    g = torch.Generator().manual_seed(seed)
    if kind is None:
        return None, None
    if kind == "bool":
        m = torch.rand(N, N, generator=g) > 0.3
        m.fill_diagonal_(True)  # under a causal mask too, only the hidden row sees nothing
        m[5] = False
        return m, (None, 5)
    m = torch.randn(1, H, N, N, generator=g).to(dtype)
    m[0, 1, 3] = float("-inf")
    return m, (1, 3)


def hidden_rows(x, hidden):
    """The (…, N, ·) rows of x that the mask hides entirely."""
    head, row = hidden
    return x[:, :, row] if head is None else x[:, head, row]


def assert_grads_accurate(got, do, q, k, v, **kw):
    """Each of dq, dk, dv within the forward's rule against torch.autograd through the fp64 oracle
    (attnlab.accuracy.judge_grads): at most twice plain torch autograd's error in the same dtype."""
    verdicts = accuracy.judge_grads(got, accuracy.grad_refs(do, q, k, v, **kw))
    for name, v in verdicts.items():
        assert v.ok, f"{name}: err {v.err:.3e} > limit {v.limit:.3e} (torch autograd {v.err_lowp:.3e})"


def poisoned_grads(q, k):
    return torch.full_like(q, float("nan")), torch.full_like(k, float("nan")), torch.full_like(k, float("nan"))


@pytest.mark.parametrize("dtype, D, causal, kind", [
    (torch.float32, 32, False, None),
    (torch.bfloat16, 64, True, "bool"),
    (torch.float16, 40, False, "additive"),  # D = 40: the head dim padded to BLOCK_D = 64
], ids=str)
def test_forward_gives_the_inference_builds_o_and_each_rows_logsumexp(dtype, D, causal, kind):
    q, k, v = rand_qkv(B, H, HKV, N, D, dtype, seed=2)
    m, hidden = masks(kind, dtype)
    o, lse = fused_train.forward(q, k, v, causal=causal, attn_mask=m)
    assert torch.equal(o, launch.fused(q, k, v, causal=causal, attn_mask=m))  # the same tiles in the interpreter
    assert lse.dtype == torch.float32 and lse.shape == (B, H, N)
    want = reference.scores(q, k, causal=causal, attn_mask=m).logsumexp(-1)  # fp64; -inf where all is masked
    seen = torch.isfinite(want)
    torch.testing.assert_close(lse.double()[seen], want[seen], rtol=0, atol=2e-5)
    assert (lse[~seen] == float("inf")).all()  # a hidden row's lse is +inf, so the backward's exp(s - lse) is 0
    assert (~seen).sum() == (0 if hidden is None else H if hidden[0] is None else 1)
    if hidden is not None:
        assert (hidden_rows(lse, hidden) == float("inf")).all() and (hidden_rows(o, hidden) == 0).all()


def test_forward_keeps_the_logsumexp_of_both_row_blocks_of_the_paired_loop(small_tiles):
    """Under forced tiles (small_tiles: 32×16, single and paired) the training forward runs them too, and every row
    of either block of a paired program gets its logsumexp."""
    q, k, v = rand_qkv(B, H, HKV, N, 32, seed=3)
    o, lse = fused_train.forward(q, k, v, causal=True)
    assert torch.equal(o, launch.fused(q, k, v, causal=True))
    torch.testing.assert_close(lse.double(), reference.scores(q, k, causal=True).logsumexp(-1), rtol=0, atol=2e-5)


@pytest.mark.parametrize("dtype, D, causal, kind", [
    (torch.float32, 32, False, None),
    (torch.float32, 64, True, "bool"),
    (torch.bfloat16, 32, False, "additive"),
    (torch.bfloat16, 64, True, None),
    (torch.float16, 32, True, "additive"),
], ids=str)
def test_gradients_match_the_fp64_oracle_and_write_every_element(dtype, D, causal, kind):
    q, k, v = rand_qkv(B, H, HKV, N, D, dtype, seed=5)
    do = torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(6)).to(dtype)
    m, hidden = masks(kind, dtype)
    o, lse = fused_train.forward(q, k, v, causal=causal, attn_mask=m)
    out = poisoned_grads(q, k)
    got = fused_train.backward(do, q, k, v, o, lse, causal=causal, attn_mask=m, out=out)
    assert all(g is buf for g, buf in zip(got, out))
    assert_grads_accurate(got, do, q, k, v, causal=causal, attn_mask=m)  # NaN anywhere fails: rel_error is inf
    if hidden is not None:
        assert (hidden_rows(got[0], hidden) == 0).all()  # a row that sees no key has no gradient


def test_gradients_with_unequal_tiles_a_custom_scale_and_strided_inputs(monkeypatch, fresh_plans):
    """dK/dV programs that own 32 keys and step 16 rows, dQ programs the other way round (two steps across each
    causal diagonal); a scale of our own; do and q that are views with a non-unit last stride."""
    tiles = {"dkdv": config.Tiles(16, 32), "dq": config.Tiles(32, 16)}
    monkeypatch.setattr(plan, "fused_backward_tiles", lambda kernel, *rest: tiles[kernel])
    g = torch.Generator().manual_seed(7)
    q = torch.randn(B, H, 32, N, generator=g).transpose(-1, -2)
    _, k, v = rand_qkv(B, H, HKV, N, 32, seed=8)
    do = torch.randn(B, H, 32, N, generator=g).transpose(-1, -2)
    kw = dict(causal=True, scale=0.3)
    o, lse = fused_train.forward(q, k, v, **kw)
    got = fused_train.backward(do, q, k, v, o, lse, **kw)
    assert [t.shape for t in got] == [q.shape, k.shape, v.shape]
    assert_grads_accurate(got, do, q, k, v, **kw)


def test_without_grouped_query_heads_and_one_row():
    for n in (1, 40):  # a single row; N past one block but not two
        q, k, v = rand_qkv(1, 2, 2, n, 32, seed=9)
        do = torch.randn_like(q)
        o, lse = fused_train.forward(q, k, v, causal=True)
        assert_grads_accurate(fused_train.backward(do, q, k, v, o, lse, causal=True), do, q, k, v, causal=True)


@pytest.fixture
def no_launch(monkeypatch):
    """Any launch of a kernel of the backward fails the test: bad input must be refused before."""
    class Refused:
        def __getitem__(self, grid):
            raise AssertionError("a kernel was launched")

    for name in ("delta_kernel", "dkdv_kernel", "dq_kernel"):
        monkeypatch.setattr(fused_backward, name, Refused())


def test_bad_input_is_one_clear_error_before_any_kernel(no_launch):
    q, k, v = rand_qkv(B, H, HKV, 8, 16, seed=10)
    o, do = torch.zeros_like(q), torch.zeros_like(q)
    lse = torch.zeros(B, H, 8)
    good = poisoned_grads(q, k)
    cases = [
        (dict(do=do[..., :8]), r"do must be a torch.float32 tensor of shape \(B, H, N, D\)"),
        (dict(do=do.half()), "do must be a torch.float32"),
        (dict(do=None), "do must be a torch.Tensor"),
        (dict(o=o[:, :2]), "o must be"),
        (dict(lse=lse.half()), "lse must be a torch.float32 tensor of shape"),
        (dict(lse=lse[..., :7]), "lse must be"),
        (dict(q=q[..., :8]), r"k.shape\[3\]"),  # the call's own checks (attnlab.validate)
        (dict(out=good[:2]), r"out must be None or a tuple \(dq, dk, dv\)"),
        (dict(out=(good[0], good[0], good[2])),
         r"out\[1\] \(dk\) must be a torch.float32 tensor of shape \(1, 2, 8, 16\)"),
        (dict(out=(good[0], good[1], good[2].double())), r"out\[2\] \(dv\)"),
        (dict(out=(good[0].transpose(-1, -2).contiguous().transpose(-1, -2), good[1], good[2])),
         r"out\[0\] \(dq\) .* unit last stride"),
    ]
    for change, message in cases:
        args = dict(do=do, q=q, k=k, v=v, o=o, lse=lse, out=good) | change
        out = args.pop("out")
        with pytest.raises(ValueError, match=message):
            fused_train.backward(*args.values(), out=out)


def test_backward_tiles_that_split_a_diagonal_are_refused(monkeypatch, fresh_plans):
    with pytest.raises(ValueError, match="kernel must be 'dkdv' or 'dq'"):
        plan.fused_backward_tiles("pv", "interpreter", 64, 2)
    monkeypatch.setattr(plan, "fused_backward_tiles", lambda kernel, *rest: config.Tiles(32, 16))
    with pytest.raises(ValueError, match="dkdv tiles need"):
        plan.plan_fused_dkdv(2, 64, 32, torch.float32, True, None, torch.device("cpu"))
    assert plan.plan_fused_dq(2, 64, 32, torch.float32, True, None, torch.device("cpu")).grid == (2, 2)


def _training_compiles():
    """The sm90 bf16 compiles a training step runs at D = 64 and 128, causal and not, unmasked and with an additive
    mask: the forward's fused kernel under STORE_LSE at plan_fused_train's tiles, the backward's two kernels at
    fused_backward_tiles'."""
    out = Compiles()
    for D in (64, 128):
        for causal in (False, True):
            forward = plan.lookup("fused", "sm90", D, causal, 2, gluon=False, N=4096)
            out += compiles("fused", D, causal, forward.label, masks=(0, 2), flags={"STORE_LSE": True})
            for kernel in ("dkdv", "dq"):
                tiles = plan.fused_backward_tiles(kernel, "sm90", D, 2)
                out += compiles(f"fused_{kernel}", D, causal, tiles.label, masks=(0, 2))
    return out


TRAINING_COMPILES = _training_compiles()


@pytest.mark.parametrize("offline", [TRAINING_COMPILES], ids=["sm90"], indirect=True)
def test_the_training_kernels_compile_for_sm90_within_shared_memory(offline):
    """Each compiles for sm_90a and fits an SM's shared memory; the 16-bit D = 64 backward spills nothing."""
    assert len(offline) == len(TRAINING_COMPILES) > 0
    for c, r in zip(TRAINING_COMPILES, offline):
        assert r["fits"], f"{c}: {r['smem_kib']:.0f} KiB does not fit"
        if c.kernel != "fused" and c.D == 64:
            assert r["spill_stores"] == 0, f"{c}: {r['spill_stores']} bytes spilled"
