"""The PV kernel in Gluon (attnlab.triton.hopper.pv) without a GPU: which calls take it, that a build and its no_pv
ablation take the same PV kernel, what the rows record, and that it compiles for sm_90a within the SM's limits.

Its arithmetic is checked on the GPU (`attnlab check`: O against the fp64 oracle, the output NaN-poisoned); here the
compile runs offline in a child process.
"""
import contextlib

import pytest
import torch

from attnlab.triton import config, launch, plan
from attnlab.triton.hopper import common
from attnlab.triton.hopper import pv as pv_gluon
from attnlab.triton.resources import parse_tiles
from tests.conftest import KernelStandIn
from tests.offline import compiles

GLUON_PV = config.Tiles(64, 128, 4, 3, gluon=True)


@pytest.fixture
def pv_dispatch(monkeypatch):
    """Pretend the CPU tensors sit on an sm90 GPU and record which PV kernel the launcher starts (the P kernels,
    which these tests do not ask about, run nowhere)."""
    calls = []
    monkeypatch.setattr(config, "family", lambda device: "sm90")
    monkeypatch.setattr(pv_gluon, "run", lambda pp, *a: calls.append(("gluon", pp.constexprs["NO_PV"], pp.tiles)))
    monkeypatch.setattr(launch._pv_mod, "pv_kernel",
                        KernelStandIn(lambda grid, kw: calls.append(("triton", kw["NO_PV"], kw["BLOCK_M"]))))
    for module, name in ((launch._qks, "qk_softmax_kernel"), (launch._mat, "scores_kernel"),
                         (launch._mat, "softmax_kernel")):
        monkeypatch.setattr(module, name, KernelStandIn())
    monkeypatch.setattr(launch, "_write_p", lambda *a, **kw: None)  # qk_softmax's P kernel, Gluon or Triton
    return calls


def _inputs(N, D=128, dtype=torch.bfloat16):
    return [torch.randn(1, 2, N, D, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize("build", ["qk_softmax", "materialised"])
@pytest.mark.parametrize("N,D,dtype,entry", [(1024, 128, torch.bfloat16, "forced"), (1000, 64, torch.float16, "forced"),
                                             (8, 128, torch.bfloat16, "forced"), (1020, 128, torch.bfloat16, "forced"),
                                             (1, 64, torch.bfloat16, "forced"), (2999, 64, torch.float16, "table"),
                                             (1020, 128, torch.bfloat16, "table")])
def test_a_build_and_its_no_pv_ablation_run_one_pv_kernel(pv_dispatch, build, N, D, dtype, entry):
    """Lab guard: the no_pv saving is a difference against the build, so the ablation flag never moves a call to the
    other PV kernel. The Gluon kernel takes 16-bit P at D = 64 or 128 at any N (scores_buffer starts P's rows on
    128-byte lines, so TMA reads them at N % 8 ≠ 0 too, N = 1020 and 2999 here), for forced Gluon tiles; with the
    table's own entry, whichever kernel it names runs both."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    q, k, v = _inputs(N, D, dtype)
    fn = getattr(launch, build)
    tiles = GLUON_PV if entry == "forced" else plan.lookup("pv", "sm90", D, False, dtype.itemsize, N=N)
    with plan.forced("pv", GLUON_PV) if entry == "forced" else contextlib.nullcontext():
        for ablation in (None, "no_pv"):
            fn(q, k, v, ablation=ablation)
    if tiles.gluon:  # forced, or where the table's entry is a Gluon one
        assert pv_dispatch == [("gluon", False, tiles), ("gluon", True, tiles)]
    else:
        assert pv_dispatch == [("triton", False, tiles.BLOCK_M), ("triton", True, tiles.BLOCK_M)]


@pytest.mark.parametrize("D,dtype", [(80, torch.bfloat16), (128, torch.float32)])
def test_forced_gluon_pv_tiles_refuse_a_case_the_kernel_cannot_compile(pv_dispatch, D, dtype):
    """One clear error naming the constraint, never a silent switch to the Triton kernel (the table itself holds
    Gluon PV entries only for 16-bit inputs at D = 64 and 128)."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    q, k, v = _inputs(512, D, dtype)
    with plan.forced("pv", GLUON_PV), pytest.raises(ValueError, match="Gluon PV kernel needs fp16 or bf16 and D = 64"):
        launch.qk_softmax(q, k, v)
    assert pv_dispatch == []


def test_the_rows_record_the_pv_kernel_that_ran(pv_dispatch):
    """tile_config names the PV tiles the launch uses: the forced Gluon entry at every N, N % 8 ≠ 0 too, and
    the Triton one where the forced tiles are Triton's."""
    from attnlab.validate import check

    triton_pv = config.Tiles(64, 64, 4, 2)
    for tiles, N, gluon in ((GLUON_PV, 1024, True), (GLUON_PV, 1020, True), (triton_pv, 1020, False)):
        with plan.forced("pv", tiles):
            q, k, v = _inputs(N)
            spec = check(q, k, v)
            for build in ("qk_softmax", "materialised"):
                for ablation in (None, "no_pv"):
                    assert launch.tile_config(build, spec, ablation)["pv"]["gluon"] is gluon


def test_the_cases_the_kernel_compiles_for():
    # the dtypes and D it compiles for: fp32 and D = 80 are refused (test_forced_gluon_pv_tiles_refuse_…)
    assert not common.compiles_for(torch.float32, 128)
    assert not common.compiles_for(torch.bfloat16, 80)


PV_VARIANTS = ("64x128w4s2g", "64x128w4s3g", "64x64w4s6hgc", "128x64w4s4hgc", "64x128w4s2gcu", "64x64w4s3hgu")


@pytest.mark.parametrize("offline", [compiles("pv", D=(64, 128), causal=(0, 1), tiles=PV_VARIANTS, flags=f)
                                     for f in (None, {"NO_PV": True})], ids=["build", "NO_PV"], indirect=True)
def test_every_variant_compiles_for_sm90_within_limits(offline):
    """Two consumers with 2 or 3 stages, 64-wide keys with 6, 128-row consumers, one consumer a program (two programs
    an SM), one item a program or persistent: shared memory within the program's share, no spills, no serialised
    wgmma, at D = 64 and 128, causal or not, for the build and its no_pv ablation."""
    assert len(offline) == 2 * 2 * 6
    for r in offline:
        assert r["fits"], r
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
        assert not r["wgmma_serialised"], r
    # the ablation never loads V: its shared memory is P's ring alone
    by = {(r["D"], r["causal"], r["tiles"]): r["smem_kib"] for r in offline}
    stages_p = 3 * 2 * 64 * 128 * 2 / 1024  # 64x128w4s3g: three slots of two consumers' P boxes
    v = 0 if offline[0].get("NO_PV") else 3 * 128 * 128 * 2 / 1024
    assert by[(128, False, "64x128w4s3g")] == pytest.approx(stages_p + v, abs=1)


def test_a_launch_counts_every_item_and_a_persistent_one_has_one_program_an_sm(monkeypatch):
    """The grid and what the kernel is told: cdiv(N, rows a program) items of each of B·H heads, one program an item,
    or Tiles.persistent: as many programs as SMs (twice as many with one consumer: two an SM), each taking items in
    turn up to `total`; heavy-first only under a causal mask (the order cannot matter otherwise)."""
    launched = []
    monkeypatch.setattr(pv_gluon, "pv_gluon_kernel", KernelStandIn(lambda grid, call: launched.append((grid, call)),
                                                                   pv_gluon.pv_gluon_kernel.arg_names))
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    B, H, D = 2, 16, 128
    cases = ((512, "128x64w4s4gc", False), (512, "128x64w4s4hgc", True), (1000, "64x128w4s3g", False),
             (8192, "64x128w4s2hgcu", True), (64, "128x64w4s4gc", False))
    for N, tiles, causal in cases:  # meta tensors: shapes and strides are all a launch reads of them here
        p = torch.empty(B, H, N, N, dtype=torch.bfloat16, device="meta")
        v = torch.empty(B, H, N, D, dtype=torch.bfloat16, device="meta")
        pp = plan.plan_pv(B * H, N, D, v.dtype, causal, v.device, tiles=parse_tiles(tiles))
        pv_gluon.run(pp, p, v, torch.empty_like(v), N, H, 1, 1.0 / N)
    got = [(grid, c["total"], c["PERSISTENT"], c["ROWS"], c["HEAVY_FIRST"], c["BLOCK_M"], c["STAGES"])
           for grid, c in launched]
    assert got == [((64,), 64, True, 2, False, 128, 4),  # 2 row blocks of 256 × 32 heads: fewer than the SMs
                   ((64,), 64, True, 2, True, 128, 4),
                   ((256,), 256, False, 2, False, 64, 3),  # one item a program: cdiv(1000, 128) × 32
                   ((264,), 4096, True, 1, True, 64, 2),  # one consumer: two programs an SM, 128 × 32 items
                   ((32,), 32, True, 2, False, 128, 4)]


@pytest.mark.parametrize("offline", [
    compiles("pv", D=(64, 128), causal=(0, 1), tiles=("128x64w4s3gcu", "128x64w4s4gc", "64x128w4s2gcu"),
             flags={"NO_PV": True})
    + compiles("qk_softmax", D=64, causal=0, tiles="64x128w4s3grcf")], indirect=True)
def test_releases_after_ordinary_shared_loads_are_fenced_from_the_loaders_next_tma(offline):
    """Lab guard: a consumer that reads a TMA-filled slot with ordinary shared loads (the generic proxy) and then
    hands the slot back must put a proxy fence between, or the loader's next TMA write (the async proxy) may land
    while the reads are unordered with it. Without it the one-consumer PV kernel's no_pv form came out wrong in 7-14
    of 30-40 runs on the H200, with it in 0 of 40. The compile's report counts such releases
    (attnlab.triton.resources.unfenced_releases): the PV kernel's no_pv forms, and the persistent qk_softmax
    configuration that keeps Q in registers (its Q buffer refilled for the next item), have none."""
    assert len(offline) == 2 * 2 * 3 + 1
    assert all(r["unfenced_releases"] == 0 for r in offline), [r for r in offline if r["unfenced_releases"]]


def test_the_fence_count_sees_an_unfenced_release():
    """The count itself: generic reads then an arrival count once; a fence between, the producer's expect_tx
    arrival, or an arrival with no read before it, do not."""
    from attnlab.triton.resources import unfenced_releases

    read = "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1, %r2, %r3, %r4}, [%r5];"
    fence = "fence.proxy.async.shared::cta;"
    arrive = "@%p9 mbarrier.arrive.shared::cta.b64 _, [%r6];"
    expect = "@%p5 mbarrier.arrive.expect_tx.shared.b64 _, [%r7], 16384;"
    assert unfenced_releases("\n".join([read, "bar.sync 0, 128;", arrive])) == 1
    assert unfenced_releases("\n".join([read, fence, arrive])) == 0
    assert unfenced_releases("\n".join([read, expect])) == 0
    assert unfenced_releases("\n".join([arrive, "ld.shared.v4.b32 {%r1, %r2, %r3, %r4}, [%r8];", arrive, arrive])) == 1
