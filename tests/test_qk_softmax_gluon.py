"""The qk_softmax build's Gluon kernel (attnlab.triton.qk_softmax_gluon) without a GPU: which calls take it, that the
build and its ablations take the same kernel, what the rows record, and that every variant compiles for sm_90a.

Its arithmetic is checked on the GPU (scripts/experiments/qk_gluon.py: P itself in a NaN-poisoned buffer against an
fp32 softmax, O against the fp64 oracle; `attnlab check`); here the compile runs offline in a child process.
"""
from dataclasses import replace

import pytest
import torch

from attnlab.triton import config, launch, pv_gluon, qk_softmax_gluon
from attnlab.triton.resources import label
from attnlab.validate import check
from tests.conftest import KernelStandIn, offline_compile

GLUON_TILES = config.Tiles(64, 128, 4, 2, gluon=True)


@pytest.fixture
def hopper_dispatch(monkeypatch):
    """Pretend the CPU tensors sit on an sm90 GPU; record which P kernel the launcher starts (the PV kernel, which
    both share, is not run: neither the Triton one nor, where the table takes it, the Gluon one)."""
    calls = []

    def gluon_launch(q, k, p, mask, mask_strides, mask_kind, **kw):
        calls.append(("gluon", mask_kind, kw["no_softmax"], kw["tiles"], kw.get("flags")))

    monkeypatch.setattr(config, "family", lambda device: "sm90")
    monkeypatch.setattr(qk_softmax_gluon, "launch", gluon_launch)
    monkeypatch.setattr(launch._qks, "qk_softmax_kernel", KernelStandIn(
        lambda grid, kw: calls.append(("triton", kw["MASK_KIND"], kw["NO_SOFTMAX"], None, kw.get("FLAGS")))))
    monkeypatch.setattr(launch._pv_mod, "pv_kernel", KernelStandIn())
    monkeypatch.setattr(pv_gluon, "launch", lambda *a, **kw: None)
    return calls


def _inputs(N, D=128, dtype=torch.bfloat16):
    return [torch.randn(1, 2, N, D, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize("N,kernel", [(1024, "gluon"), (3000, "gluon"), (1000, "gluon"), (512, "gluon"),
                                      (504, "triton"), (1020, "triton"), (1, "triton")])
def test_the_build_and_all_its_ablations_run_one_p_kernel(hopper_dispatch, N, kernel):
    """Lab guard: no_softmax, no_pv and zero_mask savings are differences against `qk_softmax`, so a mask or an
    ablation flag never moves a call to the other P kernel. N decides it (TMA stores P rows only when N % 8 == 0;
    below MIN_N = 512 the Triton kernel is faster), for every variant alike."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    q, k, v = _inputs(N)
    zero = torch.zeros(N, N, dtype=torch.bfloat16)
    with config.forced("qk_softmax", GLUON_TILES):
        for ablation, mask in ((None, None), ("no_softmax", None), ("no_pv", None), (None, zero),
                               (None, torch.ones(N, N, dtype=torch.bool))):
            launch.qk_softmax(q, k, v, causal=True, attn_mask=mask, ablation=ablation)
        recorded = launch.tile_config("qk_softmax", check(q, k, v, causal=True))["qk_softmax"]
    assert {c[0] for c in hopper_dispatch} == {kernel}
    assert [c[1:3] for c in hopper_dispatch] == [(0, False), (0, True), (0, False), (2, False), (1, False)]
    assert recorded["gluon"] is (kernel == "gluon")  # the row says which kernel wrote P
    if kernel == "gluon":  # the same tiles, but for how a mask comes in: by TMA where it can (v30)
        assert [c[3] for c in hopper_dispatch[:3]] == [GLUON_TILES] * 3
        readable = [True, N % 16 == 0]  # the additive (2-byte) mask's rows are 16-byte aligned; the boolean one's
        assert [c[3] for c in hopper_dispatch[3:]] == [replace(GLUON_TILES, mask_tma=r) for r in readable]


def test_a_fixed_reference_hands_its_flags_to_the_triton_kernels_rewrite(hopper_dispatch):
    """Tiles.fixed_reference: the Gluon kernel gets a B·H·N int8 tensor for its rows' verdicts, and the Triton
    kernel then re-writes the flagged rows' blocks from the same tensor (REPAIR, with launch.REPAIR_TILES); under
    no_softmax (no pass 1) the Gluon kernel runs alone and gets none."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    q, k, v = _inputs(1024)
    with config.forced("qk_softmax", replace(GLUON_TILES, fixed_reference=True)):
        for ablation, mask in ((None, None), (None, torch.zeros(1024, 1024, dtype=q.dtype)), ("no_softmax", None)):
            launch.qk_softmax(q, k, v, causal=False, ablation=ablation, attn_mask=mask)
    assert [c[:3] for c in hopper_dispatch] == [("gluon", 0, False), ("triton", 0, False), ("gluon", 2, False),
                                                ("triton", 2, False), ("gluon", 0, True)]
    for gluon, repair in ((0, 1), (2, 3)):
        flags = hopper_dispatch[gluon][4]
        assert flags.dtype == torch.int8 and flags.numel() == 2 * 1024 and hopper_dispatch[repair][4] is flags
    assert hopper_dispatch[4][4] is None


def test_a_fixed_reference_without_flags_is_refused():
    q = torch.zeros(1, 2, 1024, 128, dtype=torch.bfloat16)
    p = torch.zeros(1, 2, 1024, 1024, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="needs flags, a B·H·N = 2048 int8 tensor, got None"):
        qk_softmax_gluon.launch(q, q, p, p, (0, 0, 0, 0), 0, N=1024, H=2, group=1, qk_scale=1.0, mask_scale=1.0,
                                causal=False, tiles=replace(GLUON_TILES, fixed_reference=True))


@pytest.mark.parametrize("D,causal,N,persistent,by_tma", [(64, False, 512, True, (True, True)),
                                                            (64, False, 728, False, (True, False)),
                                                            (64, True, 512, True, (True, True)),
                                                            (128, True, 1440, True, (False, False)),
                                                            (128, True, 1448, False, (True, False)),
                                                            (128, False, 512, False, (True, True))])
def test_a_masked_call_runs_the_tiles_as_run_gives_and_the_row_says_so(hopper_dispatch, D, causal, N, persistent,
                                                                       by_tma):
    """Lab guard (v28, v30): a masked call (the zero_mask ablation's 2-byte mask, or a boolean one of the call's own)
    brings its mask by TMA where the loader can read it (16-byte-aligned rows: a boolean mask needs N % 16 == 0)
    and a ring of mask tiles fits beside the entry's (D = 128 one consumer: none does); it keeps a persistent entry
    persistent only then (with the consumers' loads the persistent kernel spills). What each launch ran is what its
    row records (the ablation report notes tiles that differ from the build's); every other field is the same."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    from attnlab import builds

    q, k, v = _inputs(N, D)
    spec = check(q, k, v, causal=causal)
    recorded = []
    for name in ("qk_softmax", "qk_softmax-zero_mask", "qk_softmax-no_softmax"):
        build = builds.get(name)
        build.attend(q, k, v, causal=causal)
        recorded.append(config.Tiles(**launch.tile_config(build.base, spec, build.ablation)["qk_softmax"]))
    launch.qk_softmax(q, k, v, causal=causal, attn_mask=torch.ones(N, N, dtype=torch.bool))
    ran = [c[3] for c in hopper_dispatch]
    assert ran[:3] == recorded
    masked = [ran[1], ran[3]]
    assert [t.mask_tma for t in masked] == list(by_tma)
    assert [t.persistent for t in ran] == [persistent, persistent and by_tma[0], persistent, persistent and by_tma[1]]
    assert len({replace(t, persistent=False, mask_tma=False, num_stages=2) for t in ran}) == 1
    assert ran[0] == ran[2]


def test_gluon_tiles_refuse_what_the_kernel_cannot_do(hopper_dispatch):
    """Tiles forced onto an fp32 or D = 96 call: one clear error naming the constraint, not a bad launch."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    for D, dtype in ((96, torch.bfloat16), (128, torch.float32)):
        q, k, v = _inputs(64, D, dtype)
        with config.forced("qk_softmax", GLUON_TILES):
            with pytest.raises(ValueError, match="Gluon qk_softmax kernel needs fp16 or bf16 and D = 64 or 128"):
                launch.qk_softmax(q, k, v)
    assert hopper_dispatch == []


@pytest.mark.parametrize("D,dtype,gluon", [(64, torch.bfloat16, True), (128, torch.float16, True),
                                            (96, torch.bfloat16, False), (48, torch.bfloat16, False),
                                            (128, torch.float32, False)])
def test_which_calls_take_the_gluon_kernel_on_hopper(D, dtype, gluon):
    """D = 64 and 128 exactly in 16-bit (TMA boxes are exactly D wide); everything else, and every other GPU family,
    the Triton kernel."""
    for causal in (False, True):
        assert config.lookup("qk_softmax", "sm90", D, causal, dtype.itemsize).gluon is gluon
        assert not config.lookup("qk_softmax", "sm80", D, causal, dtype.itemsize).gluon
        assert not config.lookup("qk_softmax", "interpreter", D, causal, dtype.itemsize).gluon


def test_the_sequence_lengths_the_kernel_takes():
    """16-byte-aligned P rows (N % 8 == 0) from MIN_N = 512 on (session 13: the Gluon kernel faster there)."""
    assert [n for n in (1, 8, 504, 512, 1000, 1020, 1024, 1028, 3000, 4096) if qk_softmax_gluon.takes(n)] == [
        512, 1000, 1024, 3000, 4096]


TWO_CONSUMERS, ONE_CONSUMER = (config.Tiles(64, 128, 4, 3, heavy_first=True, gluon=True, one_consumer=u)
                               for u in (False, True))
# session 13's short-N entries (v28): persistent
SHORT_64, SHORT_64_CAUSAL, SHORT_128_CAUSAL = (config.Tiles(64, 128, 4, s, heavy_first=h, gluon=True, persistent=True,
                                                            one_consumer=u)
                                               for s, h, u in ((3, False, False), (3, True, True), (2, True, True)))


@pytest.mark.parametrize("flags", [None, "NO_SOFTMAX=1"])
@pytest.mark.parametrize("tiles,head_dims,causal", [(TWO_CONSUMERS, "64,128", "0,1"), (ONE_CONSUMER, "64", "1"),
                                                    (SHORT_64, "64", "0"), (SHORT_64_CAUSAL, "64", "1"),
                                                    (SHORT_128_CAUSAL, "128", "1")],
                         ids=lambda x: label(x) if isinstance(x, config.Tiles) else x)
def test_every_variant_of_the_gluon_kernel_compiles_for_sm90_within_limits(tiles, head_dims, causal, flags):
    """The table's tiles for the keys they serve, no mask / boolean / additive (a persistent entry: no mask, as
    masked calls run it one item a program, qk_softmax_gluon.as_run): fits shared memory (a program's share of the
    SM: half with one consumer, v27), matmuls asynchronous (no C7514/C7515: the first version of this kernel had
    every wgmma serialised), no spills without a mask (the benchmark's path), at most 128 bytes with one (the
    zero_mask ablation's path)."""
    masks = "0" if tiles.persistent else "0,1,2"
    rows = offline_compile("--kernels", "qk_softmax", "--head-dims", head_dims, "--causal", causal, "--masks",
                           masks, "--tiles", label(tiles), *(["--flags", flags] if flags else []))
    assert len(rows) == len(masks.split(",")) * len(head_dims.split(",")) * len(causal.split(","))
    for r in rows:
        assert r["fits"] and not r["wgmma_serialised"], r
        assert r["spill_stores"] <= (128 if r["mask_kind"] else 0), r


def test_the_table_takes_the_gluon_kernel_with_one_or_two_consumers():
    """Session 13's autotune (PERFORMANCE.md v27, v28): two consumers a program without a causal mask and from
    N = 1448 at D = 128 causal; one consumer a program (two programs an SM) at D = 64 causal; below 724 at D = 64 and
    below 1448 at D = 128 causal the persistent kernel."""
    def at(D, causal, N=None):
        return config.lookup("qk_softmax", "sm90", D, causal, 2, N=N)

    assert at(128, False) == at(128, False, 512) == replace(TWO_CONSUMERS, heavy_first=False)
    assert at(64, False) == at(64, False, 724) == replace(TWO_CONSUMERS, heavy_first=False)
    assert at(64, False, 512) == at(64, False, 723) == SHORT_64
    assert at(64, True) == at(64, True, 724) == ONE_CONSUMER
    assert at(64, True, 512) == at(64, True, 723) == SHORT_64_CAUSAL
    assert at(128, True) == at(128, True, 1448) == TWO_CONSUMERS
    assert at(128, True, 512) == at(128, True, 1447) == SHORT_128_CAUSAL


def test_q_in_registers_compiles_without_spills_and_no_table_entry_sets_it():
    """Tiles.q_registers (PERFORMANCE.md v17): Q as QKᵀ's register operand, D 64 and 128, causal and not, without a
    mask (the benchmark's path): fits, no serialised wgmma, no spills. Measured within ±1.1 % of Q in shared memory
    on the H200, so no table entry sets it."""
    rows = offline_compile("--kernels", "qk_softmax", "--head-dims", "64,128", "--causal", "0,1", "--masks", "0",
                           "--tiles", "64x128w4s3hgr")
    assert len(rows) == 4
    for r in rows:
        assert r["tiles"] == "64x128w4s3hgr" and r["fits"] and not r["wgmma_serialised"], r
        assert r["spill_stores"] == 0, r
    assert not any(t.q_registers for t in config.TABLE.values())


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
    with config.forced("qk_softmax", tiles):
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
    """qk_softmax_gluon.as_run (v30): the most stages (up to the entry's) whose K and mask rings fit beside Q and the
    P buffers; None: not even 2 fit, so the consumers load the mask and the entry runs one item a program. A mask
    TMA cannot read (rows not 16-byte aligned) takes the consumers' loads too; no mask leaves the tiles alone."""
    N = 1024
    mask = torch.empty(N, N, dtype=mask_dtype, device="meta").expand(2, 16, N, N)
    if mask_dtype == torch.bool:
        mask = mask.view(torch.uint8)
    ran = qk_softmax_gluon.as_run(tiles, mask, D, 2)
    if stages is None:
        assert ran == replace(tiles, mask_tma=False, persistent=False)
    else:
        assert ran == replace(tiles, mask_tma=True, num_stages=stages)
    ragged = torch.empty(1000, 1000, dtype=torch.uint8, device="meta").expand(2, 16, 1000, 1000)
    assert qk_softmax_gluon.as_run(tiles, ragged, D, 2) == replace(tiles, mask_tma=False, persistent=False)
    assert qk_softmax_gluon.as_run(tiles, None, D, 2) == tiles


@pytest.mark.parametrize("tiles,head_dims,causal,masks", [
    ("64x128w4s2hgm", "64,128", "0,1", "1,2"),  # two consumers, 2 stages: what as_run gives at D = 128
    ("64x128w4s3hgm", "64,128", "0", "2"),  # 3 stages: fits at D = 64 (224 KiB), not at D = 128 (288 KiB)
    ("64x128w4s2hgmc", "64,128", "0,1", "2"),  # persistent
    ("64x128w4s2hgmu", "64", "1", "1,2"),  # one consumer (D = 64 causal's entry)
    ("64x128w4s2hgmcu", "64", "1", "1,2"),  # its short-N persistent entry
])
def test_masks_by_tma_compiles_within_limits_and_mask_fits_agrees_with_the_compiler(tiles, head_dims, causal, masks):
    """Masks by TMA (v30): where qk_softmax_gluon.mask_fits says a configuration fits, the compiler's shared memory
    fits the SM's share and nothing serialises; without a persistent loop nothing spills (the consumers' loads spilled
    in the persistent kernel, v28), with one at most 128 bytes; where mask_fits says it does not fit, neither does
    the compile."""
    from attnlab.triton.resources import parse_tiles

    t = parse_tiles(tiles)
    rows = offline_compile("--kernels", "qk_softmax", "--head-dims", head_dims, "--causal", causal, "--masks", masks,
                           "--tiles", tiles)
    assert len(rows) == len(head_dims.split(",")) * len(causal.split(",")) * len(masks.split(","))
    for r in rows:
        fits = qk_softmax_gluon.mask_fits(t, t.num_stages, r["D"], 2, 1 if r["mask_kind"] == 1 else 2)
        assert r["fits"] is fits, r
        if fits:
            assert not r["wgmma_serialised"], r
            assert r["spill_stores"] <= (128 if t.persistent else 0), r
