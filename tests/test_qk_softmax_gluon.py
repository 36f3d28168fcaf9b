"""The qk_softmax build's Gluon kernel (attnlab.triton.hopper.qk_softmax) without a GPU: which calls take it, that the
build and its ablations take the same kernel, what the rows record, and that every variant compiles for sm_90a.

Its arithmetic is checked on the GPU (`attnlab check`: O against the fp64 oracle, the output NaN-poisoned); here the
compile runs offline in a child process.
"""
from dataclasses import replace

import pytest
import torch

from attnlab.triton import config, launch, plan
from attnlab.triton.hopper import common
from attnlab.triton.hopper import pv as pv_gluon
from attnlab.triton.hopper import qk_softmax as qk_softmax_gluon
from attnlab.triton.hopper import qk_softmax_row
from attnlab.triton.layout import mask_layout
from attnlab.triton.resources import parse_tiles
from attnlab.validate import check
from tests.conftest import KernelStandIn
from tests.offline import compiles

GLUON_TILES = config.Tiles(64, 128, 4, 2, gluon=True)


@pytest.fixture
def hopper_dispatch(monkeypatch):
    """Pretend the CPU tensors sit on an sm90 GPU; record which P kernel the launcher starts (the PV kernel, which
    both share, is not run: neither the Triton one nor, where the rules take it, the Gluon one)."""
    calls = []

    def gluon_run(p, *args):  # either Gluon P kernel: the two-pass one gets flags last, where it has a pass 1
        flags = args[-1] if len(args) == 11 else None
        calls.append(("gluon", p.constexprs.get("MASK_KIND", 0), p.constexprs["NO_SOFTMAX"], p.tiles, flags))

    monkeypatch.setattr(config, "family", lambda device: "sm90")
    monkeypatch.setattr(qk_softmax_gluon, "run", gluon_run)
    monkeypatch.setattr(qk_softmax_row, "run", gluon_run)
    monkeypatch.setattr(launch._qks, "qk_softmax_kernel", KernelStandIn(
        lambda grid, kw: calls.append(("triton", kw["MASK_KIND"], kw["NO_SOFTMAX"], None, kw.get("FLAGS")))))
    monkeypatch.setattr(launch._pv_mod, "pv_kernel", KernelStandIn())
    monkeypatch.setattr(pv_gluon, "run", lambda *a, **kw: None)
    return calls


def p_plan(q, tiles, causal=False, mask=None, mask_kind=0):
    """The P kernel's plan with these tiles for q's shape (q, k alike), the mask's layout from the view given."""
    B, H, N, D = q.shape
    return plan.plan_qk_softmax(B * H, N, D, q.dtype, causal, mask_layout(mask, mask_kind), q.device, tiles=tiles)


def _inputs(N, D=128, dtype=torch.bfloat16):
    return [torch.randn(1, 2, N, D, dtype=dtype) for _ in range(3)]


MIN_N = qk_softmax_gluon.MIN_N


@pytest.mark.parametrize("N", [1, MIN_N - 8, MIN_N - 1, MIN_N, MIN_N + 1, 1000, 1020, 1024, 2999, 3000])
def test_the_build_and_all_its_ablations_run_one_p_kernel(hopper_dispatch, N):
    """Lab guard: no_softmax, no_pv and zero_mask savings are differences against `qk_softmax`, so a mask or an
    ablation flag never moves a call to the other P kernel. N decides it (below MIN_N the Triton kernel is faster;
    from it on the Gluon kernel runs at any N, N % 8 ≠ 0 too), for every variant alike."""
    kernel = "gluon" if N >= MIN_N else "triton"
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    q, k, v = _inputs(N)
    zero = torch.zeros(N, N, dtype=torch.bfloat16)
    with plan.forced("qk_softmax", GLUON_TILES):
        for ablation, mask in ((None, None), ("no_softmax", None), ("no_pv", None), (None, zero),
                               (None, torch.ones(N, N, dtype=torch.bool))):
            launch.qk_softmax(q, k, v, causal=True, attn_mask=mask, ablation=ablation)
        recorded = launch.tile_config("qk_softmax", check(q, k, v, causal=True))["qk_softmax"]
    assert {c[0] for c in hopper_dispatch} == {kernel}
    assert [c[1:3] for c in hopper_dispatch] == [(0, False), (0, True), (0, False), (2, False), (1, False)]
    assert recorded["gluon"] is (kernel == "gluon")  # the row says which kernel wrote P
    if kernel == "gluon":  # the same tiles, but for how a mask comes in: by TMA where it can
        assert [c[3] for c in hopper_dispatch[:3]] == [GLUON_TILES] * 3
        # the masks are the caller's unpadded (N, N) tensors: their rows are 16-byte aligned, so TMA reads them, only
        # where N % 8 == 0 (the additive 2-byte mask) and N % 16 == 0 (the boolean one); else the consumers load them
        readable = [N % 8 == 0, N % 16 == 0]
        assert [c[3] for c in hopper_dispatch[3:]] == [replace(GLUON_TILES, mask_tma=r) for r in readable]


def test_a_fixed_reference_hands_its_flags_to_the_triton_kernels_rewrite(hopper_dispatch):
    """Tiles.fixed_reference: the Gluon kernel gets a B·H·N int8 tensor for its rows' verdicts, and the Triton
    kernel then re-writes the flagged rows' blocks from the same tensor (REPAIR, with plan.REPAIR_TILES); under
    no_softmax (no pass 1) the Gluon kernel runs alone and gets none."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    q, k, v = _inputs(1024)
    mask = torch.zeros(1024, 1024, dtype=q.dtype)
    fixed = replace(GLUON_TILES, fixed_reference=True)
    with plan.forced("qk_softmax", fixed):
        for ablation, m in ((None, None), (None, mask), ("no_softmax", None)):
            launch.qk_softmax(q, k, v, causal=False, ablation=ablation, attn_mask=m)
    # written straight with those tiles and a mask (the build's masked call runs without them: as_run)
    launch.write_p(launch._prepare(q, k, v, False, mask, None, None), torch.empty(1, 2, 1024, 1024, dtype=q.dtype),
                   fixed)
    assert [c[:3] for c in hopper_dispatch] == [("gluon", 0, False), ("triton", 0, False), ("gluon", 2, False),
                                                ("gluon", 0, True), ("gluon", 2, False), ("triton", 2, False)]
    assert [c[3].fixed_reference for c in hopper_dispatch if c[0] == "gluon"] == [True, False, True, True]
    for gluon, repair in ((0, 1), (4, 5)):
        flags = hopper_dispatch[gluon][4]
        assert flags.dtype == torch.int8 and flags.numel() == 2 * 1024 and hopper_dispatch[repair][4] is flags
    assert hopper_dispatch[2][4] is None and hopper_dispatch[3][4] is None


def test_a_fixed_reference_without_flags_is_one_clear_error():
    q = torch.zeros(1, 2, 1024, 128, dtype=torch.bfloat16)
    p = torch.zeros(1, 2, 1024, 1024, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="needs flags, a B·H·N = 2048 int8 tensor, got None"):
        qk_softmax_gluon.run(p_plan(q, replace(GLUON_TILES, fixed_reference=True)), q, q, p, p, (0, 0, 0, 0), 1024,
                             2, 1, 1.0, 1.0)


def _run_and_record(q, k, v, causal, names):
    """Each build of `names` once, then a call with a boolean mask of the call's own; returns the tiles each build's
    row records (launch.tile_config), for the caller to set against what the launcher ran."""
    from attnlab import builds

    spec = check(q, k, v, causal=causal)
    recorded = []
    for name in names:
        build = builds.get(name)
        build.attend(q, k, v, causal=causal)
        recorded.append(config.Tiles(**launch.tile_config(build.base, spec, build.ablation)["qk_softmax"]))
    N = q.shape[2]
    launch.qk_softmax(q, k, v, causal=causal, attn_mask=torch.ones(N, N, dtype=torch.bool))
    return recorded


@pytest.mark.parametrize("D,causal,N,by_tma", [(64, False, 2048, (True, True)), (64, False, 1048, (True, False)),
                                                (64, True, 512, (True, True)), (128, True, 1440, (True, True)),
                                                (128, True, 1448, (True, False)), (128, False, 2048, (True, True)),
                                                (64, True, 2048, (True, True)), (128, False, 1032, (True, False))])
def test_a_masked_call_runs_the_tiles_as_run_gives_and_the_row_says_so(hopper_dispatch, D, causal, N, by_tma):
    """Lab guard: a masked call (the zero_mask ablation's 2-byte mask, or a boolean one of the call's own) to the
    two-pass kernel brings its mask by TMA where the loader can read it (16-byte-aligned rows: a boolean mask needs
    N % 16 == 0) and a ring of mask tiles fits beside the entry's (with two consumers at D = 128 in 2 of 3 stages);
    it keeps a persistent entry persistent only then (with the consumers' loads the persistent kernel spills). What
    each launch ran is what its row records (the ablation report notes tiles that differ from the build's); every
    other field is the same. Whatever the table's entry at (D, causal, N) is, as long as it is a two-pass one (the
    one-pass entries: the next test)."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    entry = plan.lookup("qk_softmax", "sm90", D, causal, 2, N=N)
    if entry.one_pass or not entry.gluon:
        pytest.skip(f"the table's entry at D = {D}, N = {N} is {entry}: not the two-pass Gluon kernel")
    persistent = entry.persistent
    recorded = _run_and_record(*_inputs(N, D), causal, ("qk_softmax", "qk_softmax-zero_mask", "qk_softmax-no_softmax"))
    # the Triton kernel's re-write after a pass 1 against a fixed reference (unmasked entries with pass 1)
    repairs = [i for i, c in enumerate(hopper_dispatch) if c[0] == "triton"]
    assert repairs == ([1] if entry.fixed_reference else [])
    ran = [c[3] for c in hopper_dispatch if c[0] == "gluon"]
    assert ran[:3] == recorded
    masked = [ran[1], ran[3]]
    assert [t.mask_tma for t in masked] == list(by_tma)
    assert [t.persistent for t in ran] == [persistent, persistent and by_tma[0], persistent, persistent and by_tma[1]]
    assert not any(t.fixed_reference or t.q_registers for t in masked)  # measured unmasked only: masked calls drop them
    assert len({replace(t, persistent=False, mask_tma=False, num_stages=2, fixed_reference=False, q_registers=False)
                for t in ran}) == 1
    assert ran[0] == ran[2] == entry


ONE_PASS_SHORT = [(D, causal, qk_softmax_row.ROW_MAX + 1) for D in (64, 128) for causal in (False, True)
                  if plan.lookup("qk_softmax", "sm90", D, causal, 2, N=qk_softmax_row.ROW_MAX).one_pass]


@pytest.mark.parametrize("D,causal,below", ONE_PASS_SHORT, ids=[f"{d}-{c}" for d, c, _ in ONE_PASS_SHORT])
def test_a_one_pass_entry_runs_its_kernel_where_the_row_fits_and_a_mask_runs_the_two_pass_kernel(
        hopper_dispatch, D, causal, below):
    """Lab guard: below its bound the table's one-pass entry writes P for the build and for its no_softmax and
    no_pv ablations alike (their savings are differences against one kernel); the one-pass kernel takes no mask, so
    the zero_mask ablation and a masked call run the two-pass kernel, persistent, the mask by TMA (16-byte rows: N %
    16 == 0 here), and their rows record those tiles (the ablation report then notes that zero_mask ran other tiles
    than its base). From the bound on the key's TABLE entry serves, and no row is longer than ROW_MAX on chip. Every
    one-pass SHORT entry of the table, at the shortest N its Gluon kernel takes and the longest below its bound."""
    for N in sorted({qk_softmax_gluon.MIN_N, (below - 1) // 16 * 16}):
        _one_pass_entry_case(hopper_dispatch, D, causal, N)
        hopper_dispatch.clear()


def _one_pass_entry_case(hopper_dispatch, D, causal, N):
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    entry = plan.lookup("qk_softmax", "sm90", D, causal, 2, N=N)
    assert entry.one_pass and qk_softmax_row.fits(entry, N, D, 2)  # a one-pass entry serves only where its row fits
    assert not plan.lookup("qk_softmax", "sm90", D, causal, 2, N=qk_softmax_row.ROW_MAX + 1).one_pass
    recorded = _run_and_record(*_inputs(N, D), causal, ("qk_softmax", "qk_softmax-no_softmax", "qk_softmax-no_pv",
                                                        "qk_softmax-zero_mask"))
    ran = [c[3] for c in hopper_dispatch]
    assert [c[1:3] for c in hopper_dispatch] == [(0, False), (0, True), (0, False), (2, False), (1, False)]
    assert ran[:4] == recorded
    assert ran[:3] == [entry] * 3
    two_pass = replace(entry, one_pass=False, persistent=True, mask_tma=True)
    assert [replace(t, num_stages=entry.num_stages) for t in ran[3:]] == [two_pass] * 2
    assert all(t.num_stages <= entry.num_stages for t in ran[3:])


def test_one_pass_tiles_where_the_row_does_not_fit_run_the_two_pass_kernel():
    """qk_softmax_gluon.as_run: one-pass tiles at an N past ROW_MAX, or whose ring and row buffer overflow a program's
    shared memory (4 stages of 128 keys at D = 128 and N = 1024), run the two-pass kernel, persistent, with the same
    tiles otherwise; without N (the entry as it stands) they stay."""
    t = config.Tiles(64, 128, 4, 4, gluon=True, one_pass=True)
    two_pass = replace(t, one_pass=False, persistent=True)
    assert qk_softmax_gluon.as_run(t, None, 64, 2, 1024) == t
    assert qk_softmax_gluon.as_run(t, None, 64, 2, 1032) == two_pass
    assert qk_softmax_gluon.as_run(t, None, 128, 2, 512) == t
    assert not qk_softmax_row.fits(t, 1024, 128, 2)
    assert qk_softmax_gluon.as_run(t, None, 128, 2, 1024) == two_pass
    assert qk_softmax_gluon.as_run(t, None, 128, 2) == t
    assert not qk_softmax_row.fits(replace(t, num_stages=3), 512, 64, 2)  # odd: a slot would change consumers


def test_the_one_pass_kernel_refuses_tiles_that_do_not_fit_with_one_clear_error():
    q = torch.zeros(1, 2, 1024, 128, dtype=torch.bfloat16)
    t = config.Tiles(64, 128, 4, 4, gluon=True, one_pass=True)
    with pytest.raises(ValueError, match=r"keeps a row of N ≤ 1024 keys .* N = 1024 needs \d+ bytes of the \d+"):
        p_plan(q, t)
    mask = torch.zeros(1024, 1024, dtype=q.dtype).expand(1, 2, 1024, 1024)
    with pytest.raises(ValueError, match="the one-pass P kernel takes no mask"):
        p_plan(q, replace(t, num_stages=2), mask=mask, mask_kind=2)


def test_gluon_tiles_refuse_what_the_kernel_cannot_do(hopper_dispatch):
    """Tiles forced onto an fp32 or D = 96 call: one clear error naming the constraint, not a bad launch."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    for D, dtype in ((96, torch.bfloat16), (128, torch.float32)):
        q, k, v = _inputs(64, D, dtype)
        with plan.forced("qk_softmax", GLUON_TILES):
            with pytest.raises(ValueError, match="Gluon qk_softmax kernel needs fp16 or bf16 and D = 64 or 128"):
                launch.qk_softmax(q, k, v)
    assert hopper_dispatch == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("D", [48, 64, 96, 128])
def test_only_calls_the_gluon_kernel_compiles_for_take_it_on_hopper(D, dtype):
    """Whatever the table holds: a Gluon entry serves only 16-bit D = 64 or 128 exactly (TMA boxes are exactly D
    wide), at every N, causal or not; every other GPU family and the interpreter get the Triton kernel."""
    for causal in (False, True):
        for N in (None, 512, 1024, 1025, 4096):
            t = plan.lookup("qk_softmax", "sm90", D, causal, dtype.itemsize, N=N)
            assert not t.gluon or common.compiles_for(dtype, D), (D, dtype, causal, N, t)
        assert not plan.lookup("qk_softmax", "sm80", D, causal, dtype.itemsize).gluon
        assert not plan.lookup("qk_softmax", "interpreter", D, causal, dtype.itemsize).gluon


def test_a_p_whose_rows_tma_cannot_reach_is_one_clear_error():
    """The Gluon P and PV kernels store and read P by TMA where it lies: a caller's P with rows 2040 bytes apart
    (contiguous at N = 1020) is refused before anything compiles, naming the constraint; scores_buffer's P at the
    same N (rows of 1024 elements, 2048 bytes) passes the same check."""

    N = 1020
    q, k, v = _inputs(N)
    p = torch.empty(1, 2, N, N, dtype=torch.bfloat16)
    o = torch.empty_like(q)
    pv = plan.plan_pv(2, N, 128, q.dtype, False, q.device, tiles=GLUON_TILES)
    calls = (lambda: qk_softmax_gluon.run(p_plan(q, GLUON_TILES), q, k, p, None, (0, 0, 0, 0), N, 2, 1, 1.0, 1.0),
             lambda: pv_gluon.run(pv, p, v, o, N, 2, 1, 1 / N))
    for call in calls:
        with pytest.raises(ValueError, match=r"P must have .* 16-byte aligned base and row stride .* strides "
                                             r"\(2080800, 1040400, 1020, 1\)"):
            call()
    padded = launch.scores_buffer(check(q, k, v))
    assert padded.stride(2) == 1024
    common.check_p_rows(padded)  # no error


@pytest.mark.parametrize("N,one_pass,width", [(2999, False, 3000), (3000, False, 3000), (1001, True, 1008),
                                               (1001, False, 1008), (1000, True, 1000)])
def test_p_is_stored_through_its_rows_padding_where_the_pv_kernel_reads_it(monkeypatch, N, one_pass, width):
    """Where a row of P ends inside a 16-byte vector (launch.rows_pad), both Gluon P kernels store P through a
    descriptor over layout.padded_view, so that the vector's columns past N get the kernel's 0 (its keys there are
    masked): the Triton PV kernel reads them as they lie. Elsewhere the descriptor is exactly N wide."""
    widths = []

    def described(x, box):
        widths.append(x.shape[-1])
        return x

    for mod in (qk_softmax_gluon, qk_softmax_row):
        monkeypatch.setattr(mod, "described", described)
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    monkeypatch.setattr(qk_softmax_gluon, "qk_softmax_gluon_kernel", KernelStandIn())
    monkeypatch.setattr(qk_softmax_row, "qk_softmax_row_kernel", KernelStandIn())
    q, k, v = _inputs(N, D=64)
    c = launch._prepare(q, k, v, False, None, None, None)
    launch.write_p(c, launch.scores_buffer(c.spec), replace(GLUON_TILES, one_pass=one_pass, persistent=one_pass))
    assert widths[2] == width and widths[:2] == [64, 64]  # q, k, then P


def test_the_sequence_lengths_the_kernel_takes():
    """Every N from one bound on and none below (where the Triton kernel is faster), N % 8 ≠ 0 too: scores_buffer's
    rows start on 128-byte lines, so TMA stores P's rows at any N."""
    taken = [qk_softmax_gluon.takes(n) for n in range(1, 5000)]
    assert taken == sorted(taken) and any(taken) and not taken[0]
    assert all(qk_softmax_gluon.takes(n) for n in range(taken.index(True) + 1, 5000, 7))


@pytest.mark.parametrize("offline", [
    compiles("qk_softmax", D=(64, 128), causal=(0, 1), masks=(0, 1, 2), tiles="64x128w4s3hg")
    + compiles("qk_softmax", D=64, causal=1, masks=(0, 1, 2), tiles="64x128w4s3hgu"),
    compiles("qk_softmax", D=(64, 128), causal=(0, 1), tiles="64x128w4s3hg", flags={"NO_SOFTMAX": True})
    + compiles("qk_softmax", D=64, causal=1, tiles="64x128w4s3hgu", flags={"NO_SOFTMAX": True})],
    ids=["build", "NO_SOFTMAX"], indirect=True)
def test_every_one_item_variant_of_the_gluon_kernel_compiles_for_sm90_within_limits(offline):
    """One item a program with two consumers (D 64 and 128, causal and not) or one (two programs an SM, D = 64
    causal): the build with no mask / a boolean one / an additive one, and its no_softmax ablation as the lab runs it
    (unmasked): fits a program's share of shared memory, matmuls asynchronous (no C7514/C7515: a register of an
    in-flight matmul read serialises every wgmma), no spills without a mask (the benchmark's path), at most 128
    bytes with one (the zero_mask ablation's path)."""
    assert len(offline) in (15, 5)
    for r in offline:
        assert r["fits"] and not r["wgmma_serialised"], r
        assert r["spill_stores"] <= (128 if r["mask_kind"] else 0), r


@pytest.mark.parametrize("offline", [compiles("qk_softmax", D=(64, 128), causal=(0, 1), tiles="64x128w4s3hgr")],
                         indirect=True)
def test_q_in_registers_alone_compiles_without_spills(offline):
    """Tiles.q_registers without the fixed reference (a configuration tiles.json can force): Q as QKᵀ's register
    operand, D 64 and 128, causal and not, without a mask (the benchmark's path): fits, no serialised wgmma, no
    spills."""
    assert len(offline) == 4
    for r in offline:
        assert r["tiles"] == "64x128w4s3hgr" and r["fits"] and not r["wgmma_serialised"], r
        assert r["spill_stores"] == 0, r


def test_n_stays_an_argument():
    """As in the fused Gluon kernel: N = 1 made a constant breaks Triton 3.6's lowering with a mask."""
    assert [p.name for p in qk_softmax_gluon.qk_softmax_gluon_kernel.params if p.do_not_specialize] == ["N"]


def test_a_mask_tma_cannot_read_runs_the_consumers_loads(hopper_dispatch):
    """An fp32 additive mask (4-byte elements: TMA boxes here take 1 or 2) on a bf16 call reaches the launcher with
    the consumers' loads and one item a program, though its 2-byte twin comes by TMA (launch passes the call's own
    mask to as_run)."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    N = 512
    q, k, v = _inputs(N, 64)
    tiles = config.Tiles(64, 128, 4, 3, gluon=True, persistent=True)
    with plan.forced("qk_softmax", tiles):
        for dtype in (torch.float32, torch.bfloat16):
            launch.qk_softmax(q, k, v, attn_mask=torch.zeros(N, N, dtype=dtype))
    assert [c[3] for c in hopper_dispatch] == [replace(tiles, persistent=False), replace(tiles, mask_tma=True)]


TWO_S3 = config.Tiles(64, 128, 4, 3, gluon=True)


@pytest.mark.parametrize("tiles,D,mask_dtype,stages", [
    (TWO_S3, 128, torch.bfloat16, 2),  # two consumers at D = 128: 3 K stages and 3 mask tiles do not fit, 2 do
    (TWO_S3, 64, torch.bfloat16, 3),
    (TWO_S3, 128, torch.bool, 2),
    (config.Tiles(64, 128, 4, 3, gluon=True, one_consumer=True), 64, torch.bfloat16, 2),
    (config.Tiles(64, 128, 4, 2, gluon=True, persistent=True, one_consumer=True), 128, torch.bfloat16, None),
])
def test_as_run_brings_a_mask_by_tma_in_the_stages_that_fit(tiles, D, mask_dtype, stages):
    """qk_softmax_gluon.as_run: the most stages (up to the entry's) whose K and mask rings fit beside Q and the
    P buffers; None: not even 2 fit, so the consumers load the mask and the entry runs one item a program. A mask
    TMA cannot read (rows not 16-byte aligned) takes the consumers' loads too; no mask leaves the tiles alone."""
    N = 1024
    mask = torch.empty(N, N, dtype=mask_dtype, device="meta").expand(2, 16, N, N)
    if mask_dtype == torch.bool:
        mask = mask.view(torch.uint8)
    mask = mask_layout(mask, 1 if mask_dtype == torch.bool else 2)
    ran = qk_softmax_gluon.as_run(tiles, mask, D, 2)
    if stages is None:
        assert ran == replace(tiles, mask_tma=False, persistent=False)
    else:
        assert ran == replace(tiles, mask_tma=True, num_stages=stages)
    ragged = mask_layout(torch.empty(1000, 1000, dtype=torch.uint8, device="meta").expand(2, 16, 1000, 1000), 1)
    assert qk_softmax_gluon.as_run(tiles, ragged, D, 2) == replace(tiles, mask_tma=False, persistent=False)
    assert qk_softmax_gluon.as_run(tiles, None, D, 2) == tiles
    fixed = replace(tiles, q_registers=True, fixed_reference=True)  # measured unmasked only: a mask drops them
    assert qk_softmax_gluon.as_run(fixed, mask, D, 2) == ran
    assert qk_softmax_gluon.as_run(fixed, None, D, 2) == fixed


@pytest.mark.parametrize("offline", [
    compiles("qk_softmax", D=(64, 128), causal=(0, 1), masks=(1, 2), tiles="64x128w4s2hgm"),  # two consumers, 2 stages
    compiles("qk_softmax", D=(64, 128), causal=0, masks=2, tiles="64x128w4s3hgm"),  # 3 stages: fit at D = 64 only
    compiles("qk_softmax", D=(64, 128), causal=(0, 1), masks=2, tiles="64x128w4s2hgmc"),  # persistent
    compiles("qk_softmax", D=64, causal=1, masks=(1, 2), tiles="64x128w4s2hgmu"),  # one consumer
    compiles("qk_softmax", D=64, causal=1, masks=(1, 2), tiles="64x128w4s2hgmcu"),  # one consumer, persistent
], ids=["s2", "s3", "persistent", "one-consumer", "one-consumer-persistent"], indirect=True)
def test_masks_by_tma_compiles_within_limits_and_mask_fits_agrees_with_the_compiler(offline):
    """Masks by TMA: where qk_softmax_gluon.mask_fits says a configuration fits, the compiler's shared memory fits
    the SM's share and nothing serialises; without a persistent loop nothing spills (the consumers' loads spill in
    the persistent kernel), with one at most 128 bytes; where mask_fits says it does not fit, neither does the
    compile."""
    for r in offline:
        t = parse_tiles(r["tiles"])
        fits = qk_softmax_gluon.mask_fits(t, t.num_stages, r["D"], 2, 1 if r["mask_kind"] == 1 else 2)
        assert r["fits"] is fits, r
        if fits:
            assert not r["wgmma_serialised"], r
            assert r["spill_stores"] <= (128 if t.persistent else 0), r
