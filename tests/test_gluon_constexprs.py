"""The offline compile checks the kernels a launch runs: for the same tiles and call, the constexpr arguments each
Gluon kernel's plan (attnlab.triton.plan) has its `run` hand it equal those attnlab.triton.resources compiles (whose shared memory, registers and
spills tests/test_resources.py checks for every table entry), and they follow the tiles and the call (its head dim,
mask, causal flag and ablation) as the kernel's own docs say. Without a GPU: the kernels are replaced by stand-ins
that record what a launch hands them, on CPU tensors (a TMA descriptor is only a record of shape, strides and box),
and the offline compile is stopped where it hands its source to Triton."""
import pytest
import torch

from attnlab.triton import config, launch, plan, resources
from attnlab.triton.hopper import fused as fused_gluon
from attnlab.triton.hopper import pv as pv_gluon
from attnlab.triton.hopper import qk_softmax as qk_softmax_gluon
from attnlab.triton.hopper import qk_softmax_row
from attnlab.triton.layout import mask_layout
from attnlab.triton.resources import parse_tiles
from attnlab.validate import check
from tests.conftest import KernelStandIn


# each kernel's constexpr parameters, read before any test puts a stand-in in its place
PARAMS = {k.__name__: {p.name for p in k.params if p.is_constexpr} for k in (
    fused_gluon.fused_gluon_kernel, qk_softmax_gluon.qk_softmax_gluon_kernel, qk_softmax_row.qk_softmax_row_kernel,
    pv_gluon.pv_gluon_kernel)}


class _Compiled(Exception):
    pass


def offline_constexprs(monkeypatch, kernel, D, causal, label, mask_kind=0, n=256, **flags) -> dict:
    """The constexprs resources.compile_info hands Triton for this configuration, taken at the source it builds."""
    import triton.experimental.gluon._runtime as gluon_runtime

    def source(fn, signature, constexprs, attrs):
        raise _Compiled(constexprs)

    monkeypatch.setattr(gluon_runtime, "GluonASTSource", source)
    with pytest.raises(_Compiled) as got:
        resources.compile_info(kernel, D, causal, parse_tiles(label), mask_kind, n=n, **flags)
    return got.value.args[0]


def _record(monkeypatch, module, name):
    got = []
    monkeypatch.setattr(module, name, KernelStandIn(lambda grid, kw: got.append(kw)))
    monkeypatch.setattr(config, "sm_count", lambda device: 132)  # a persistent grid on "an H200"
    return got


def _qkv(D, N=256, B=2, H=4, dtype=torch.bfloat16):
    return (torch.randn(B, H, N, D, dtype=dtype) for _ in range(3))


def _mask(N=256, H=4, B=2, dtype=torch.uint8):
    return torch.zeros(N, N, dtype=dtype).expand(B, H, N, N)


@pytest.mark.parametrize("label", ["64x128w4s2hgmco", "64x64w4s2hgmcou", "64x128w4s2g"])
@pytest.mark.parametrize("mask_kind", [0, 1])
@pytest.mark.parametrize("ablation", [{}, {"no_softmax": True}, {"no_pv": True}])
def test_fused_launch_passes_exactly_its_constexprs(monkeypatch, label, mask_kind, ablation):
    tiles = parse_tiles(label)
    flags = {name.upper(): True for name in ablation}
    offline = offline_constexprs(monkeypatch, "fused", 64, True, label, mask_kind, **flags)
    got = _record(monkeypatch, fused_gluon, "fused_gluon_kernel")
    q, k, v = _qkv(64)
    mask = _mask() if mask_kind else None
    pf = plan.plan_fused(8, 256, 64, q.dtype, True, mask_layout(mask, mask_kind), q.device, next(iter(ablation), None),
                         tiles=tiles)
    fused_gluon.run(pf, q, k, v, torch.empty_like(q), mask, (0, 0, 256, 1) if mask_kind else (0, 0, 0, 0), 256, 4, 1,
                    0.1, 1.0, 1 / 256)
    flags = {name.upper(): True for name in ablation}
    (kw,) = got
    params = PARAMS["fused_gluon_kernel"]
    assert {name: kw[name] for name in params} == {name: offline[name] for name in params}
    assert kw["num_warps"] == 4 and kw["MASK_TMA"] == (mask_kind == 1 and tiles.mask_tma)
    assert (kw["D"], kw["BLOCK_M"], kw["BLOCK_N"], kw["STAGES"]) == (64, tiles.BLOCK_M, tiles.BLOCK_N, tiles.num_stages)
    assert (kw["CAUSAL"], kw["HEAVY_FIRST"], kw["MASK_KIND"], kw["PERSISTENT"]) == (True, tiles.heavy_first, mask_kind,
                                                                                    tiles.persistent)
    assert (kw["NO_SOFTMAX"], kw["NO_PV"]) == (ablation.get("no_softmax", False), ablation.get("no_pv", False))
    assert kw["ROWS"] == (1 if tiles.one_consumer else 2)
    assert kw["O_TMA"] <= tiles.o_tma  # O by TMA only where the tiles ask for it (and there is room)


@pytest.mark.parametrize("label", ["64x128w4s3hg", "64x128w4s3hgmc", "64x128w4s2hgcu", "64x128w4s3gf"])
@pytest.mark.parametrize("mask_kind", [0, 2])
@pytest.mark.parametrize("no_softmax", [False, True])
def test_qk_softmax_launch_passes_exactly_its_constexprs(monkeypatch, label, mask_kind, no_softmax):
    tiles = parse_tiles(label)
    offline = offline_constexprs(monkeypatch, "qk_softmax", 128, False, label, mask_kind, NO_SOFTMAX=no_softmax)
    got = _record(monkeypatch, qk_softmax_gluon, "qk_softmax_gluon_kernel")
    q, k, _ = _qkv(128, H=2)
    p = torch.empty(2, 2, 256, 256, dtype=q.dtype)
    mask = _mask(H=2, dtype=q.dtype) if mask_kind else None
    flags = torch.empty(2 * 2 * 256, dtype=torch.int8)
    pp = plan.plan_qk_softmax(4, 256, 128, q.dtype, False, mask_layout(mask, mask_kind), q.device,
                              "no_softmax" if no_softmax else None, tiles=tiles)
    qk_softmax_gluon.run(pp, q, k, p, mask, (0, 0, 256, 1) if mask_kind else (0, 0, 0, 0), 256, 2, 1, 0.1, 1.0,
                         flags)
    (kw,) = got
    params = PARAMS["qk_softmax_gluon_kernel"]
    assert {name: kw[name] for name in params} == {name: offline[name] for name in params}
    assert kw["REF1"] == (tiles.fixed_reference and not no_softmax)  # no_softmax has no pass 1
    assert kw["MASK_TMA"] == (mask_kind != 0 and tiles.mask_tma)
    assert (kw["D"], kw["BLOCK_M"], kw["BLOCK_N"], kw["STAGES"]) == (128, tiles.BLOCK_M, tiles.BLOCK_N,
                                                                     tiles.num_stages)
    assert (kw["MASK_KIND"], kw["NO_SOFTMAX"], kw["CAUSAL"]) == (mask_kind, no_softmax, False)


@pytest.mark.parametrize("label", ["64x128w4s2ga", "64x128w4s4ga", "64x128w4s2hga"])
@pytest.mark.parametrize("N, D", [(256, 64), (1024, 128), (1001, 64)])
@pytest.mark.parametrize("causal, no_softmax", [(False, False), (True, False), (False, True)])
def test_one_pass_launch_passes_exactly_its_constexprs(monkeypatch, label, N, D, causal, no_softmax):
    """The one-pass P kernel (qk_softmax_row, the rules' choice below N = 1025): its row's tiles and row buffers are
    constants of N, so a launch at another N must hand the kernel the N-dependent ones."""
    tiles = parse_tiles(label)
    if not qk_softmax_row.fits(tiles, N, D, 2):
        pytest.skip(f"{label} does not fit N = {N}, D = {D}")  # its plan refuses it (tests/test_qk_softmax_gluon.py)
    # the offline compile describes an unpadded P, which TMA can take only with 16-byte rows (N % 8 == 0)
    offline = offline_constexprs(monkeypatch, "qk_softmax", D, causal, label, 0, n=N, NO_SOFTMAX=no_softmax) if (
        N % 8 == 0) else None
    got = _record(monkeypatch, qk_softmax_row, "qk_softmax_row_kernel")
    q, k, v = _qkv(D, N=N, H=2)
    p = launch.scores_buffer(check(q, k, v))  # the build's P: rows on lines, which TMA takes at any N
    pp = plan.plan_qk_softmax(4, N, D, q.dtype, causal, None, q.device, "no_softmax" if no_softmax else None,
                              tiles=tiles)
    qk_softmax_row.run(pp, q, k, p, N, 2, 1, 0.1)
    (kw,) = got
    params = PARAMS["qk_softmax_row_kernel"]
    assert offline is None or {name: kw[name] for name in params} == {name: offline[name] for name in params}
    assert kw["ROW_TILES"] == -(-N // tiles.BLOCK_N) and kw["ROW_BUFS"] in (1, 2)  # the whole row, in key tiles
    assert kw["ROW_BUFS"] == qk_softmax_row.row_buffers(tiles, N, D, 2)


@pytest.mark.parametrize("label", ["128x64w4s4gc", "64x128w4s3hg", "64x128w4s2hgu"])
@pytest.mark.parametrize("causal", [False, True])
def test_pv_launch_passes_exactly_its_constexprs(monkeypatch, label, causal):
    tiles = parse_tiles(label)
    offline = offline_constexprs(monkeypatch, "pv", 64, causal, label)
    got = _record(monkeypatch, pv_gluon, "pv_gluon_kernel")
    v = torch.randn(2, 4, 256, 64, dtype=torch.bfloat16)
    p = torch.empty(2, 4, 256, 256, dtype=v.dtype)
    pv_gluon.run(plan.plan_pv(8, 256, 64, v.dtype, causal, v.device, tiles=tiles), p, v, torch.empty_like(v), 256, 4,
                 1, 1 / 256)
    (kw,) = got
    params = PARAMS["pv_gluon_kernel"]
    assert {name: kw[name] for name in params} == {name: offline[name] for name in params}
    assert kw["HEAVY_FIRST"] == (causal and tiles.heavy_first)  # the order matters only under a causal mask
    assert (kw["D"], kw["BLOCK_M"], kw["STAGES"], kw["PERSISTENT"], kw["NO_PV"]) == (64, tiles.BLOCK_M,
                                                                                    tiles.num_stages,
                                                                                    tiles.persistent, False)
