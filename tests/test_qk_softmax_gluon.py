"""The qk_softmax build's Gluon kernel (attnlab.triton.hopper.qk_softmax) without a GPU: which calls take it, that the
build and its ablations take the same kernel, what the rows record, and that every variant compiles for sm_90a.

Its arithmetic is checked on the GPU (`attnlab check`: O against the fp64 oracle, the output NaN-poisoned); here the
compile runs offline in a child process.
"""
from dataclasses import replace

import pytest
import torch

from attnlab.triton import config, launch
from attnlab.triton.hopper import common
from attnlab.triton.hopper import pv as pv_gluon
from attnlab.triton.hopper import qk_softmax as qk_softmax_gluon
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
                                      (504, "triton"), (1020, "gluon"), (2999, "gluon"), (1, "triton")])
def test_the_build_and_all_its_ablations_run_one_p_kernel(hopper_dispatch, N, kernel):
    """Lab guard: no_softmax, no_pv and zero_mask savings are differences against `qk_softmax`, so a mask or an
    ablation flag never moves a call to the other P kernel. N decides it (below MIN_N = 512 the Triton kernel is
    faster; from it on the Gluon kernel runs at any N, N % 8 ≠ 0 too since v54), for every variant alike."""
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
        # the masks are the caller's unpadded (N, N) tensors: their rows are 16-byte aligned, so TMA reads them, only
        # where N % 8 == 0 (the additive 2-byte mask) and N % 16 == 0 (the boolean one); else the consumers load them
        readable = [N % 8 == 0, N % 16 == 0]
        assert [c[3] for c in hopper_dispatch[3:]] == [replace(GLUON_TILES, mask_tma=r) for r in readable]


def test_a_fixed_reference_hands_its_flags_to_the_triton_kernels_rewrite(hopper_dispatch):
    """Tiles.fixed_reference: the Gluon kernel gets a B·H·N int8 tensor for its rows' verdicts, and the Triton
    kernel then re-writes the flagged rows' blocks from the same tensor (REPAIR, with launch.REPAIR_TILES); under
    no_softmax (no pass 1) the Gluon kernel runs alone and gets none."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    q, k, v = _inputs(1024)
    mask = torch.zeros(1024, 1024, dtype=q.dtype)
    fixed = replace(GLUON_TILES, fixed_reference=True)
    with config.forced("qk_softmax", fixed):
        for ablation, m in ((None, None), (None, mask), ("no_softmax", None)):
            launch.qk_softmax(q, k, v, causal=False, ablation=ablation, attn_mask=m)
    # written straight with those tiles and a mask (the build's masked call runs without them: as_run, v42)
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
        qk_softmax_gluon.launch(q, q, p, p, (0, 0, 0, 0), 0, N=1024, H=2, group=1, qk_scale=1.0, mask_scale=1.0,
                                causal=False, tiles=replace(GLUON_TILES, fixed_reference=True))


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


@pytest.mark.parametrize("D,causal,N,persistent,by_tma", [(64, False, 2048, True, (True, True)),
                                                            (64, False, 1048, True, (True, False)),
                                                            (64, True, 512, True, (True, True)),
                                                            (128, True, 1440, False, (True, True)),
                                                            (128, True, 1448, False, (True, False)),
                                                            (128, False, 2048, False, (True, True))])
def test_a_masked_call_runs_the_tiles_as_run_gives_and_the_row_says_so(hopper_dispatch, D, causal, N, persistent,
                                                                       by_tma):
    """Lab guard (v28, v30): a masked call (the zero_mask ablation's 2-byte mask, or a boolean one of the call's own)
    to the two-pass kernel brings its mask by TMA where the loader can read it (16-byte-aligned rows: a boolean mask
    needs N % 16 == 0) and a ring of mask tiles fits beside the entry's (with two consumers at D = 128 in 2 of the
    entry's 3 stages); it keeps a persistent entry persistent only then (with the consumers' loads the persistent
    kernel spills). What each launch ran is what its row records (the ablation report notes tiles that differ from
    the build's); every other field is the same. (The one-pass entries below N = 1025: the next test.)"""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    recorded = _run_and_record(*_inputs(N, D), causal, ("qk_softmax", "qk_softmax-zero_mask", "qk_softmax-no_softmax"))
    entry = config.lookup("qk_softmax", "sm90", D, causal, 2, N=N)
    # the Triton kernel's re-write after a pass 1 against a fixed reference (v42's entries, unmasked, with pass 1)
    repairs = [i for i, c in enumerate(hopper_dispatch) if c[0] == "triton"]
    assert repairs == ([1] if entry.fixed_reference else [])
    ran = [c[3] for c in hopper_dispatch if c[0] == "gluon"]
    assert ran[:3] == recorded
    masked = [ran[1], ran[3]]
    assert [t.mask_tma for t in masked] == list(by_tma)
    assert [t.persistent for t in ran] == [persistent, persistent and by_tma[0], persistent, persistent and by_tma[1]]
    assert not any(t.fixed_reference or t.q_registers for t in masked)  # v42's options: unmasked calls only
    assert len({replace(t, persistent=False, mask_tma=False, num_stages=2, fixed_reference=False, q_registers=False)
                for t in ran}) == 1
    assert ran[0] == ran[2] == entry


@pytest.mark.parametrize("D,causal,N", [(64, False, 512), (64, False, 1024), (128, False, 1024), (128, True, 512),
                                         (128, True, 1024)])
def test_a_one_pass_entry_runs_its_kernel_where_the_row_fits_and_a_mask_runs_the_two_pass_kernel(
        hopper_dispatch, D, causal, N):
    """Lab guard (v40): below N = 1025 the table's one-pass entry writes P for the build and for its no_softmax and
    no_pv ablations alike (their savings are differences against one kernel); the one-pass kernel takes no mask, so
    the zero_mask ablation and a masked call run the two-pass kernel, persistent, the mask by TMA (16-byte rows: N %
    16 == 0 here), and their rows record those tiles (the ablation report then notes that zero_mask ran other tiles
    than its base). From N = 1025 the key's TABLE entry serves: no row is longer than ROW_MAX on chip."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    from attnlab.triton.hopper import qk_softmax_row

    entry = config.lookup("qk_softmax", "sm90", D, causal, 2, N=N)
    assert entry.one_pass and qk_softmax_row.fits(entry, N, D, 2)
    assert not config.lookup("qk_softmax", "sm90", D, causal, 2, N=qk_softmax_row.ROW_MAX + 1).one_pass
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
    from attnlab.triton.hopper import qk_softmax_row

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
    from attnlab.triton.hopper import qk_softmax_row

    q = torch.zeros(1, 2, 1024, 128, dtype=torch.bfloat16)
    p = torch.zeros(1, 2, 1024, 1024, dtype=torch.bfloat16)
    t = config.Tiles(64, 128, 4, 4, gluon=True, one_pass=True)
    with pytest.raises(ValueError, match=r"keeps a row of N ≤ 1024 keys .* N = 1024 needs \d+ bytes of the \d+"):
        qk_softmax_row.launch(q, q, p, N=1024, H=2, group=1, qk_scale=1.0, causal=False, tiles=t)
    with pytest.raises(ValueError, match="the one-pass P kernel takes no mask"):
        qk_softmax_gluon.launch(q, q, p, p, (0, 0, 0, 0), 2, N=1024, H=2, group=1, qk_scale=1.0, mask_scale=1.0,
                                causal=False, tiles=replace(t, num_stages=2))


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


def test_a_p_whose_rows_tma_cannot_reach_is_one_clear_error():
    """The Gluon P and PV kernels store and read P by TMA where it lies: a caller's P with rows 2040 bytes apart
    (contiguous at N = 1020) is refused before anything compiles, naming the constraint; scores_buffer's P at the
    same N (rows of 1024 elements, 2048 bytes) passes the same check."""

    N = 1020
    q, k, v = _inputs(N)
    p = torch.empty(1, 2, N, N, dtype=torch.bfloat16)
    o = torch.empty_like(q)
    calls = (lambda: qk_softmax_gluon.launch(q, k, p, None, (0, 0, 0, 0), 0, N=N, H=2, group=1, qk_scale=1.0,
                                             mask_scale=1.0, causal=False, tiles=GLUON_TILES),
             lambda: pv_gluon.launch(p, v, o, N=N, H=2, group=1, inv_n=1 / N, causal=False, tiles=GLUON_TILES))
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
    masked): the Triton PV kernel reads them as they lie (v56). Elsewhere the descriptor is exactly N wide."""
    from attnlab.triton.hopper import qk_softmax_row

    widths = []

    def descriptor(x, block_rows, block_cols=None):
        widths.append(x.shape[-1])
        return x

    for mod in (qk_softmax_gluon, qk_softmax_row):
        monkeypatch.setattr(mod, "descriptor", descriptor)
        monkeypatch.setattr(mod, "sm_count", lambda device: 132)
    monkeypatch.setattr(qk_softmax_gluon, "qk_softmax_gluon_kernel", KernelStandIn())
    monkeypatch.setattr(qk_softmax_row, "qk_softmax_row_kernel", KernelStandIn())
    q, k, v = _inputs(N, D=64)
    p = launch.scores_buffer(check(q, k, v))
    tiles = replace(GLUON_TILES, one_pass=one_pass, persistent=one_pass)
    qk_softmax_gluon.launch(q, k, p, q, (0, 0, 0, 0), 0, N=N, H=2, group=1, qk_scale=1.0, mask_scale=1.0,
                            causal=False, tiles=tiles)
    assert widths[2] == width and widths[:2] == [64, 64]  # q, k, then P


def test_the_sequence_lengths_the_kernel_takes():
    """From MIN_N = 512 on (session 13: the Gluon kernel faster there), at any N: scores_buffer's rows start on
    128-byte lines, so TMA stores P's rows at N % 8 ≠ 0 too (v54)."""
    assert [n for n in (1, 8, 504, 511, 512, 513, 1000, 1020, 1024, 1028, 2999, 3000, 4096)
            if qk_softmax_gluon.takes(n)] == [512, 513, 1000, 1020, 1024, 1028, 2999, 3000, 4096]


TWO_CONSUMERS, ONE_CONSUMER = (config.Tiles(64, 128, 4, 3, heavy_first=True, gluon=True, one_consumer=u)
                               for u in (False, True))
# persistent (v28): D = 64 non-causal (session 22), and session 13's short entry at D = 64 causal
PERSISTENT_64, SHORT_64_CAUSAL = (config.Tiles(64, 128, 4, 3, heavy_first=h, gluon=True, persistent=True,
                                               one_consumer=u) for h, u in ((False, False), (True, True)))
# session 22's one-pass short entries (v40): 4 stages at D = 64, 2 at D = 128 (4 do not fit a 1024-key row there)
ONE_PASS_64, ONE_PASS_128 = (config.Tiles(64, 128, 4, s, gluon=True, one_pass=True) for s in (4, 2))
# session 24's (v42): pass 1 against a fixed reference with Q in registers, D = 64 non-causal and D = 128 causal
V42_64, V42_128_CAUSAL = (replace(t, q_registers=True, fixed_reference=True) for t in (PERSISTENT_64, TWO_CONSUMERS))


@pytest.mark.parametrize("flags", [None, "NO_SOFTMAX=1"])
@pytest.mark.parametrize("tiles,head_dims,causal", [(TWO_CONSUMERS, "64,128", "0,1"), (ONE_CONSUMER, "64", "1"),
                                                    (PERSISTENT_64, "64", "0"), (SHORT_64_CAUSAL, "64", "1"),
                                                    (V42_64, "64", "0"), (V42_128_CAUSAL, "128", "1")],
                         ids=lambda x: label(x) if isinstance(x, config.Tiles) else x)
def test_every_variant_of_the_gluon_kernel_compiles_for_sm90_within_limits(tiles, head_dims, causal, flags):
    """The table's tiles for the keys they serve, no mask / boolean / additive (a persistent entry: no mask, as
    masked calls run it one item a program, qk_softmax_gluon.as_run): fits shared memory (a program's share of the
    SM: half with one consumer, v27), matmuls asynchronous (no C7514/C7515: the first version of this kernel had
    every wgmma serialised), no spills without a mask (the benchmark's path), at most 128 bytes with one (the
    zero_mask ablation's path). v42's entries run without a mask only (a masked call drops their options: as_run), and
    a persistent entry's masked calls run one item a program or with the mask by TMA (the next tests)."""
    masks = "0" if tiles.persistent or tiles.fixed_reference else "0,1,2"
    rows = offline_compile("--kernels", "qk_softmax", "--head-dims", head_dims, "--causal", causal, "--masks",
                           masks, "--tiles", label(tiles), *(["--flags", flags] if flags else []))
    assert len(rows) == len(masks.split(",")) * len(head_dims.split(",")) * len(causal.split(","))
    for r in rows:
        assert r["fits"] and not r["wgmma_serialised"], r
        assert r["spill_stores"] <= (128 if r["mask_kind"] else 0), r


def test_the_table_takes_the_gluon_kernel_with_one_or_two_consumers_or_one_pass():
    """Sessions 13 and 22's autotunes (PERFORMANCE.md v27, v28, v40): two consumers a program at D = 128 and at D = 64
    without a causal mask (persistent at D = 64), one consumer a program (two programs an SM) at D = 64 causal,
    persistent below 724; below 1025 the one-pass kernel everywhere but D = 64 causal. Session 24's A/B (v42): pass 1
    against a fixed reference with Q in registers at D = 64 non-causal and D = 128 causal from 1025."""
    def at(D, causal, N=None):
        return config.lookup("qk_softmax", "sm90", D, causal, 2, N=N)

    assert at(128, False) == at(128, False, 1025) == replace(TWO_CONSUMERS, heavy_first=False)
    assert at(128, False, 512) == at(128, False, 1024) == ONE_PASS_128
    assert at(64, False) == at(64, False, 1025) == V42_64
    assert at(64, False, 512) == at(64, False, 1024) == ONE_PASS_64
    assert at(64, True) == at(64, True, 724) == ONE_CONSUMER
    assert at(64, True, 512) == at(64, True, 723) == SHORT_64_CAUSAL
    assert at(128, True) == at(128, True, 1025) == V42_128_CAUSAL
    assert at(128, True, 512) == at(128, True, 1024) == ONE_PASS_128


@pytest.mark.parametrize("n", [512, 1024])
def test_the_one_pass_entries_compile_for_sm90_within_limits_and_smem_bytes_agrees(n):
    """The one-pass entries (v40) at the N they serve, and their no_softmax ablation, D = 64 (non-causal) and 128
    (both): fit, no spills, matmuls asynchronous; qk_softmax_row.smem_bytes (which `fits` and `row_buffers` use: two
    row buffers at N = 512, one at 1024) at or above what the compiler allocates, by at most 6 KiB."""
    from attnlab.triton.hopper import qk_softmax_row

    rows = []
    for tiles, D, causal in ((ONE_PASS_64, "64", "0"), (ONE_PASS_128, "128", "0,1")):
        for flags in ([], ["--flags", "NO_SOFTMAX=1"]):
            rows += offline_compile("--kernels", "qk_softmax", "--head-dims", D, "--causal", causal, "--masks", "0",
                                    "--n", str(n), "--tiles", label(tiles), *flags)
    assert len(rows) == 6
    for r in rows:
        assert r["fits"] and not r["wgmma_serialised"] and r["spill_stores"] == 0, r
        tiles = ONE_PASS_64 if r["D"] == 64 else ONE_PASS_128
        bufs = qk_softmax_row.row_buffers(tiles, n, r["D"], 2)
        assert bufs == (2 if n == 512 else 1)
        # a bound from above: smem_bytes counts the tiles' maxima, the swap's floats and SMEM_SPARE beside the tiles,
        # 3.7–4.7 KiB more than the compiler reports for these entries (offline, Triton 3.6)
        assert 0 <= qk_softmax_row.smem_bytes(tiles, n, r["D"], 2, bufs) / 1024 - r["smem_kib"] <= 6, r


def test_q_in_registers_compiles_without_spills_and_only_with_a_fixed_reference_in_the_table():
    """Tiles.q_registers (PERFORMANCE.md v17): Q as QKᵀ's register operand, D 64 and 128, causal and not, without a
    mask (the benchmark's path): fits, no serialised wgmma, no spills. Alone it measured within ±1.1 % of Q in shared
    memory on the H200; with pass 1 against a fixed reference (v42) it won at D = 64 non-causal and D = 128 causal, so
    exactly those two entries set it, and only beside fixed_reference."""
    rows = offline_compile("--kernels", "qk_softmax", "--head-dims", "64,128", "--causal", "0,1", "--masks", "0",
                           "--tiles", "64x128w4s3hgr")
    assert len(rows) == 4
    for r in rows:
        assert r["tiles"] == "64x128w4s3hgr" and r["fits"] and not r["wgmma_serialised"], r
        assert r["spill_stores"] == 0, r
    with_q = {key[2:4] for key, t in config.TABLE.items() if t.q_registers}
    assert with_q == {("=64", False), ("=128", True)}
    assert all(t.fixed_reference for t in config.TABLE.values() if t.q_registers)


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
    v42 = replace(tiles, q_registers=True, fixed_reference=True)  # measured unmasked only: a mask drops them
    assert qk_softmax_gluon.as_run(v42, mask, D, 2) == ran
    assert qk_softmax_gluon.as_run(v42, None, D, 2) == v42


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
