"""The qk_softmax build's Triton P kernel on its own: P itself, written into a NaN-poisoned buffer, against an fp32
softmax, in both of its forms: two passes over K (a row longer than a key tile) and one tile (N ≤ BLOCK_N, where the
tile is the whole row: one QKᵀ, no statistics pass)."""
import pytest
import torch

from attnlab.triton import config, launch, plan
from tests.conftest import rand_qkv

TWO_PASSES = config.Tiles(32, 16)  # N = 100: seven key tiles a row, a ragged last one
ONE_TILE = config.Tiles(32, 128)


def reference_p(q, k, causal, mask, no_softmax):
    """softmax(scale·QKᵀ + mask) in fp32 (rows the mask hides entirely: 0), or S itself with masked entries 0."""
    H, N = q.shape[1], q.shape[2]
    kk = k.repeat_interleave(H // k.shape[1], dim=1).float()
    s = q.float() @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    if no_softmax:
        return s.masked_fill(s == float("-inf"), 0.0)
    return torch.softmax(s, dim=-1).nan_to_num(nan=0.0)


@pytest.fixture
def one_tile_flags(monkeypatch):
    """The real Triton kernel, with the ONE_TILE flag of each launch recorded."""
    flags, real = [], launch._qks.qk_softmax_kernel

    class Recording:
        def __getitem__(self, grid):
            def run(*args, **kw):
                flags.append(kw["ONE_TILE"])
                return real[grid](*args, **kw)
            return run

    monkeypatch.setattr(launch._qks, "qk_softmax_kernel", Recording())
    return flags


def _mask(kind, N):
    g = torch.Generator().manual_seed(1)
    if kind == "bool":
        keep = torch.rand(N, N, generator=g) > 0.3
        keep[5] = False  # a row the mask hides entirely: its P is 0
        return keep
    if kind == "add":
        return torch.randn(N, N, generator=g)
    return None


@pytest.mark.parametrize("variant", ["plain", "causal", "bool", "add", "gqa", "no_softmax"])
@pytest.mark.parametrize("tiles,one_tile", [(TWO_PASSES, False), (ONE_TILE, True)], ids=["two_passes", "one_tile"])
def test_p_matches_an_fp32_softmax(tiles, one_tile, variant, one_tile_flags):
    if not config.interpreting():
        pytest.skip("CPU tensors reach the kernel only under the interpreter")
    N = 100
    q, k, v = rand_qkv(B=1, H=4, Hkv=2 if variant == "gqa" else 4, N=N, D=32, dtype=torch.float16, seed=7)
    causal, mask = variant == "causal", _mask(variant, N)
    no_softmax = variant == "no_softmax"
    c = launch._prepare(q, k, v, causal, mask, None, "no_softmax" if no_softmax else None)
    p = torch.full((1, 4, N, N), float("nan"), dtype=q.dtype)
    launch.write_p(c, p, tiles, no_softmax)
    assert one_tile_flags == [one_tile]
    assert not p.isnan().any(), "P has elements the kernel never wrote"
    ref = reference_p(q, k, causal, mask, no_softmax)
    # fp16 P: 2⁻¹¹ of each element, plus a floor for entries that round to 0
    torch.testing.assert_close(p.float(), ref, rtol=2e-3, atol=1e-2 if no_softmax else 1e-5)
    if variant == "bool":
        assert (p[:, :, 5] == 0).all()
    if variant == "causal":
        assert (p.float().triu(1) == 0).all()


@pytest.mark.parametrize("variant,span", [("plain", 4096), ("causal", 4096), ("bool", 4096), ("plain", 64),
                                          ("causal", 64)])
def test_the_repair_rewrites_the_blocks_of_flagged_rows_and_only_those(variant, span, monkeypatch, fresh_plans):
    """Tiles.fixed_reference: the Gluon kernel's pass 1 flags the rows its fixed reference leaves wrong, and this
    kernel (REPAIR) re-writes every block with a flagged row. Here a flagged row's block holds NaN and must come out
    right; a block with no flag holds a sentinel and must keep it. A program reads the flags of plan.REPAIR_SPAN
    rows: with 64 of them, N = 100 takes two programs a head and head 1's flagged block is the second one's."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the kernel only under the interpreter")
    monkeypatch.setattr(plan, "REPAIR_SPAN", span)
    N, H = 100, 2
    q, k, v = rand_qkv(B=1, H=H, Hkv=H, N=N, D=32, dtype=torch.float16, seed=3)
    causal, mask = variant == "causal", _mask(variant, N)
    c = launch._prepare(q, k, v, causal, mask, None, None)
    p = torch.full((1, H, N, N), 7.0, dtype=q.dtype)  # TWO_PASSES' blocks are 32 rows: 0–31, 32–63, 64–95, 96–99
    flags = torch.zeros(H * N, dtype=torch.int8)
    for h, row in ((0, 5), (1, 97)):  # a row of the first block of head 0 and of the ragged last block of head 1
        flags[h * N + row] = 1
        block = slice(row // 32 * 32, min(N, row // 32 * 32 + 32))
        p[0, h, block] = float("nan")
    s = c.spec
    repair = plan.plan_qk_softmax(H, N, 32, q.dtype, causal, c.layout, q.device, tiles=TWO_PASSES,
                                  rows_pad=launch.rows_pad(N, p), repair=True)
    launch._triton_p(c, p, launch.row_stride(p, s, "P"), repair, s.scale * config.LOG2E, FLAGS=flags)
    ref = reference_p(q, k, causal, mask, False)
    for h, block in ((0, slice(0, 32)), (1, slice(96, 100))):
        torch.testing.assert_close(p[0, h, block].float(), ref[0, h, block], rtol=2e-3, atol=1e-5)
    assert (p[0, 0, 32:] == 7.0).all() and (p[0, 1, :96] == 7.0).all(), "a block without a flagged row was written"


def test_a_repair_span_its_blocks_do_not_divide_is_one_clear_error(monkeypatch, fresh_plans):
    monkeypatch.setattr(plan, "REPAIR_SPAN", 48)
    with pytest.raises(ValueError, match="a re-write's BLOCK_M must divide REPAIR_SPAN = 48"):
        plan.plan_qk_softmax(1, 64, 16, torch.float32, False, None, torch.device("cpu"), tiles=TWO_PASSES, repair=True)

