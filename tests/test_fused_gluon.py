"""The fused build's Gluon kernel (attnlab.triton.hopper.fused) without a GPU: which calls take it, that a build and its
ablations take the same kernel, and that every variant compiles for sm_90a within the SM's limits.

Gluon has no CPU interpreter, so its arithmetic is checked on the GPU (`attnlab check`: ragged N, GQA, both
ablations, the output NaN-poisoned, against the fp64 oracle); here the compile runs offline in a child process, as
`python -m attnlab.triton.resources` does.
"""
from dataclasses import replace

import pytest
import torch

from attnlab import schema
from attnlab.triton import config, launch, plan
from attnlab.triton.hopper import common
from attnlab.triton.hopper import fused as fused_gluon
from attnlab.triton.resources import parse_tiles
from tests.conftest import KernelStandIn
from tests.offline import compiles


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("D", [64, 80, 96, 128])
def test_only_calls_the_gluon_kernel_compiles_for_take_it_on_hopper(D, dtype):
    """Whatever the rules say: the Gluon kernel serves only 16-bit D = 64 or 128 (its TMA boxes are exactly D wide,
    its matmuls wgmma), at every N, causal or not; no other GPU family and not the interpreter ever gets it; the
    short causal tiles give way to the long-sequence ones from their bound on."""
    for causal in (False, True):
        entry = plan.lookup("fused", "sm90", D, causal, dtype.itemsize)
        below = plan.FUSED_ONE_CONSUMER_BELOW.get(D, 0) if causal and entry.gluon else 0
        for N in (1, 64, 512, 723, 724, 1447, 1448, 4096, 16384):
            t = plan.lookup("fused", "sm90", D, causal, dtype.itemsize, N=N)
            assert not t.gluon or common.compiles_for(dtype, D), (D, dtype, causal, N, t)
            assert t == entry or (N < below and t.one_consumer), (D, causal, N, t)
        assert not plan.lookup("fused", "sm80", D, causal, dtype.itemsize).gluon  # TMA/wgmma: Hopper only
        assert not plan.lookup("fused", "interpreter", D, causal, dtype.itemsize).gluon


@pytest.mark.parametrize("nprog", [1, 3, 132, 264])
@pytest.mark.parametrize("total", [1, 2, 7, 131, 132, 133, 264, 1000, 2048])
def test_a_persistent_program_s_items_cover_the_work_once(nprog, total):
    """The kernel's own index functions (run on Python ints through .fn): round robin, and under a causal mask with
    heavy_first pairs of consecutive items, every item exactly once over the programs of the grid (min(total, grid)
    programs, as `launch` starts them)."""
    for pairs in (False, True):
        taken = []
        for pid in range(min(total, nprog)):
            start, end, step = common.items.fn(pid, nprog, total, pairs)
            taken += [common.item_at.fn(x, pid, nprog, pairs) for x in range(start, end, step)]
        assert sorted(taken) == list(range(total)), (pairs, total, nprog)


@pytest.mark.parametrize("n_blocks", [1, 2, 3, 4, 8, 16, 64])
def test_pairs_of_causal_row_blocks_weigh_alike(n_blocks):
    """A head's row blocks in pair order (heaviest, lightest, …) are each block once, and for an even count
    every pair of consecutive positions holds n_blocks + 1 key tiles (block r has r + 1), so programs taking pairs
    carry equal loads."""
    order = [common.pair_order.fn(pos, n_blocks) for pos in range(n_blocks)]
    assert sorted(order) == list(range(n_blocks)) and order[0] == n_blocks - 1
    if n_blocks % 2 == 0:
        assert {order[i] + order[i + 1] + 2 for i in range(0, n_blocks, 2)} == {n_blocks + 1}


def test_an_unchecked_triton_release_runs_the_triton_kernel(monkeypatch):
    """Gluon is experimental and its API moves between releases: the kernel is used only on a Triton it was checked
    on (3.6 here); on another the table's next entry (the Triton kernel) serves D = 128."""
    import triton

    assert plan.lookup("fused", "sm90", 128, False, 2).gluon  # this environment's Triton is a checked one
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    t = plan.lookup("fused", "sm90", 128, False, 2)
    assert not t.gluon and t.paired  # D = 128's Triton entry
    assert not plan.lookup("fused", "sm90", 128, True, 2).gluon


def test_the_recorded_tiles_say_which_kernel_ran():
    """Result rows carry tile_config(): a Gluon row must be told apart from a Triton one."""
    t = plan.lookup("fused", "sm90", 128, False, 2)
    assert t.as_dict()["gluon"] is True
    assert plan.lookup("fused", "sm90", 80, True, 2).as_dict()["gluon"] is False


@pytest.fixture
def hopper_dispatch(monkeypatch):
    """Pretend the CPU tensors sit on an sm90 GPU, and record which kernel the fused launcher would start."""
    calls = []

    def gluon_run(p, *args):
        c = p.constexprs
        calls.append(("gluon", c["MASK_KIND"], c["NO_SOFTMAX"], c["NO_PV"], p.tiles))

    class TritonKernel:
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append(("triton", kw["MASK_KIND"], kw["NO_SOFTMAX"], kw["NO_PV"], None))

    monkeypatch.setattr(config, "family", lambda device: "sm90")
    monkeypatch.setattr(fused_gluon, "run", gluon_run)
    monkeypatch.setattr(launch._fused, "fused_kernel", TritonKernel())
    return calls


@pytest.mark.parametrize("D", [128, 64, 96])
def test_a_fused_build_and_all_its_ablations_run_one_kernel(hopper_dispatch, D):
    """Lab guard: the ablations' savings are differences against `fused`, so no_softmax, no_pv and zero_mask must
    run the kernel the build runs (a mask or an ablation flag never moves a call to the other kernel): the one the
    table names for the call."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    kernel = "gluon" if plan.lookup("fused", "sm90", D, True, 2, N=64).gluon else "triton"
    q, k, v = (torch.randn(1, 2, 64, D, dtype=torch.bfloat16) for _ in range(3))
    zero = torch.zeros(64, 64, dtype=torch.bfloat16)
    for ablation, mask in ((None, None), ("no_softmax", None), ("no_pv", None), (None, zero),
                           (None, torch.ones(64, 64, dtype=torch.bool))):
        launch.fused(q, k, v, causal=True, attn_mask=mask, ablation=ablation)
    assert {c[0] for c in hopper_dispatch} == {kernel}
    assert [c[1:4] for c in hopper_dispatch] == [(0, False, False), (0, True, False), (0, False, True),
                                                 (2, False, False), (1, False, False)]
    if kernel == "gluon":  # N = 64: the tiles for the call's N, for the build and every ablation (O's store as the
        want = plan.lookup("fused", "sm90", D, True, 2, N=64)  # mask leaves room for it)
        assert all(replace(c[4], o_tma=want.o_tma) == want for c in hopper_dispatch)


def test_a_descriptor_made_from_a_plans_box_is_the_one_tritons_constructor_makes():
    """common.described fills a TensorDescriptor in without its constructor's checks, which tma_ready and the box
    (checked once, when the plan is made) stand for: the same descriptor, for q's (B, H, N, D) view and P's rows."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    q = torch.randn(2, 64, 4, 128, dtype=torch.bfloat16).transpose(1, 2)
    p = torch.empty(2, 4, 100, 128, dtype=torch.bfloat16)[..., :100]
    for x, rows, cols in ((q, 64, None), (p, 64, 128)):
        box = common.box(tuple(x.shape), x.dtype, rows, cols)
        checked = TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, rows, cols or x.shape[-1]], box[1])
        assert common.described(x, box) == checked == common.descriptor(x, rows, cols)
    with pytest.raises((AssertionError, ValueError)):  # a box Triton refuses is refused when the plan is made
        common.box((2, 4, 100, 128), torch.bfloat16, 100)


def test_tma_takes_strided_views_and_copies_only_what_it_cannot_read():
    base = torch.randn(2, 64, 4, 128, dtype=torch.bfloat16)
    view = base.transpose(1, 2)  # (B, H, N, D) over a (B, N, H, D) tensor: 16-byte strides, read in place
    assert common.tma_ready(view) is view
    odd = torch.randn(2 * 4 * 64 * 128 + 1, dtype=torch.bfloat16)[1:].view(2, 4, 64, 128)  # base 2 bytes off
    fixed = common.tma_ready(odd)
    assert fixed is not odd and fixed.data_ptr() % 16 == 0 and torch.equal(fixed, odd)


VARIANTS = ("64x128w4s2hg", "64x128w4s2hgc")  # one item a program, persistent; the consumers load the mask


@pytest.mark.parametrize("offline", [
    compiles("fused", D=(64, 128), causal=(0, 1), masks=(0, 1, 2), tiles=VARIANTS),
    compiles("fused", D=(64, 128), causal=(0, 1), tiles=VARIANTS, flags={"NO_PV": True}),
    compiles("fused", D=(64, 128), causal=(0, 1), tiles=VARIANTS, flags={"NO_SOFTMAX": True}),
], ids=["build", "NO_PV", "NO_SOFTMAX"], indirect=True)
def test_every_variant_of_the_gluon_kernel_compiles_for_sm90_within_limits(offline):
    """D 64 and 128, causal and not, one program a work item or persistent, the build with no mask / a boolean one /
    an additive one, and its ablations as the lab runs them (fused-no_softmax and fused-no_pv take no mask; the
    zero_mask ablation is the build with a mask): fits shared memory, matmuls asynchronous. Spills (ptxas, offline):
    none without a mask (the benchmark's path) except the persistent kernel's no_softmax ablation; with a mask a few
    hundred bytes (the mask tile's 64-bit pointers; it costs the zero_mask ablation a little)."""
    rows = offline
    assert {r["tiles"] for r in rows} == set(VARIANTS)  # c: persistent
    for r in rows:
        assert r["fits"] and not r["wgmma_serialised"], r
        persistent = r["tiles"].endswith("c")
        if not r["mask_kind"] and (not r.get("NO_SOFTMAX") or not persistent):
            allowed = 0
        elif not r["mask_kind"]:  # persistent no_softmax: 12–256 bytes, on that ablation's path only
            allowed = 256
        elif persistent:  # with a mask: 536–700 bytes, the zero_mask ablation's and a user mask's path
            allowed = 704
        else:  # one item a program: at most 260 (causal, additive, no_softmax)
            allowed = 264
        assert r["spill_stores"] <= allowed, r


@pytest.mark.parametrize("offline", [compiles("fused", D=128, causal=0, masks=(1, 2), tiles="64x128w4s2g", n=1)],
                         indirect=True)
def test_one_row_with_a_mask_compiles(offline):
    """N = 1 with a mask failed to compile on the H200 while Triton specialised N = 1 into a constant (Triton 3.6
    lowering error); the kernel now keeps N an argument."""
    assert [r["mask_kind"] for r in offline] == [1, 2] and all(r["fits"] for r in offline)
    # the offline compile specialises as the JIT would: N stays an argument because the kernel says so
    assert [p.name for p in fused_gluon.fused_gluon_kernel.params if p.do_not_specialize] == ["N"]


def test_gluon_tiles_refuse_what_the_kernel_cannot_do(hopper_dispatch):
    """Tiles forced by hand or by the autotune onto an fp32 or D = 96 call: one clear error, not a bad launch."""
    if not config.interpreting():
        pytest.skip("CPU tensors reach the launcher only under the interpreter")
    for D, dtype in ((96, torch.bfloat16), (128, torch.float32)):
        q = torch.randn(1, 2, 64, D, dtype=dtype)
        with plan.forced("fused", config.Tiles(64, 128, 4, 2, gluon=True)):
            with pytest.raises(ValueError, match="Gluon kernel needs fp16 or bf16 and D = 64 or 128"):
                launch.fused(q, q, q)
    assert hopper_dispatch == []


def test_rows_name_the_fused_kernel_from_their_recorded_tiles():
    assert schema.kernel_label('{"fused": {"BLOCK_M": 64, "gluon": true}}') == "gluon"
    assert schema.kernel_label('{"fused": {"BLOCK_M": 128, "paired": true}}') == "triton"  # rows from before the Gluon kernel
    assert schema.kernel_label('{"qk_softmax": {}, "pv": {}}') == "" and schema.kernel_label(float("nan")) == ""


def test_which_masks_tma_can_bring():
    """Tiles.mask_tma: a mask the loader can fetch by TMA (1- or 2-byte elements, 16-byte-aligned rows); broadcast
    batch/head dims become size-1 dims (coordinate 0); anything else keeps the consumers' loads."""
    N = 256
    flat = torch.zeros(N, N, dtype=torch.bfloat16).expand(2, 4, N, N)  # the zero_mask ablation's broadcast mask
    desc, vary_b, vary_h = common.mask_descriptor(flat, 128, 128)
    assert (vary_b, vary_h) == (0, 0) and list(desc.shape) == [1, 1, N, N] and list(desc.block_shape) == [1, 1, 128, 128]
    per_batch = torch.zeros(2, 1, N, N, dtype=torch.uint8).expand(2, 4, N, N)
    desc, vary_b, vary_h = common.mask_descriptor(per_batch, 128, 128)
    assert (vary_b, vary_h) == (1, 0) and list(desc.shape) == [2, 1, N, N] and desc.strides[0] == N * N
    full = torch.zeros(2, 4, N, N, dtype=torch.float16)
    assert common.mask_descriptor(full, 128, 128)[1:] == (1, 1)
    assert common.mask_descriptor(torch.zeros(N, N).expand(2, 4, N, N), 128, 128) is None  # fp32: no room
    assert common.mask_descriptor(torch.zeros(100, 100, dtype=torch.uint8).expand(1, 1, 100, 100), 128,
                                       128) is None  # 100-byte rows
    assert common.mask_descriptor(torch.zeros(129, 129, dtype=torch.bfloat16).expand(1, 1, 129, 129), 128,
                                       128) is None  # 258-byte rows


@pytest.mark.parametrize("offline", [compiles("fused", D=(64, 128), causal=(0, 1), masks=(1, 2), tiles="64x128w4s2hgm")],
                         indirect=True)
def test_the_mask_by_tma_variant_compiles_within_limits(offline):
    """With the mask tile in the ring beside K, D = 128 and a bf16 mask use 224 KiB of shared memory (the limit is
    227); fewer spills than the consumers' loads, matmuls asynchronous."""
    assert len(offline) == 8
    for r in offline:
        assert r["fits"] and not r["wgmma_serialised"] and r["spill_stores"] <= 64, r
    assert 224 <= max(r["smem_kib"] for r in offline) < 227


@pytest.fixture
def gluon_launches(monkeypatch):
    """The Gluon kernel stood in for: each launch appends (grid, its arguments and keywords by name)."""
    launched = []
    monkeypatch.setattr(fused_gluon, "fused_gluon_kernel", KernelStandIn(
        lambda grid, call: launched.append((grid, call)), fused_gluon.fused_gluon_kernel.arg_names))
    return launched


def run_tiles(q, tiles, causal):
    """The Gluon kernel's launch with these tiles on q as q, k, v and O's shape, no mask."""
    B, H, N, D = q.shape
    p = plan.plan_fused(B * H, N, D, q.dtype, causal, None, q.device, tiles=tiles)
    fused_gluon.run(p, q, q, q, torch.empty_like(q), q, (0, 0, 0, 0), N, H, 1, 1.0, 1.0, 1.0)


def test_a_persistent_launch_has_one_program_an_sm_and_counts_every_item(monkeypatch, gluon_launches):
    """Tiles.persistent: the grid is the SM count (or the items, when fewer), and the kernel is told how many work
    items there are, so that each program can take pid, pid + grid, … up to the last; otherwise one program an
    item."""
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    B, H, D = 2, 16, 128
    for N, persistent in ((512, False), (512, True), (1000, True), (64, True)):
        q = torch.zeros(B, H, N, D, dtype=torch.bfloat16)
        run_tiles(q, config.Tiles(64, 128, 4, 2, gluon=True, persistent=persistent), causal=False)
    # items: cdiv(N, 2·64) row blocks of each of B·H = 32 heads
    launched = [(grid, a["total"], a["PERSISTENT"], a["O_TMA"]) for grid, a in gluon_launches]
    assert launched == [((128,), 128, False, False), ((128,), 128, True, False), ((132,), 8 * 32, True, False),
                        ((32,), 32, True, False)]


def test_o_by_tma_only_where_persistent_asked_for_and_there_is_room():
    """Tiles.o_tma: the persistent kernel's own O tiles (2 × 16 KiB at D = 128) fit beside Q, the K/V ring and a
    1-byte mask ring (224 KiB of 227), not beside a 2-byte one (256); the one-item kernel has O go out through Q's
    buffer anyway, and without o_tma the persistent kernel keeps its plain stores."""
    t = config.Tiles(64, 128, 4, 2, gluon=True, mask_tma=True, persistent=True, o_tma=True)
    assert [fused_gluon.o_by_tma(t, 128, 2, m) for m in (0, 1, 2)] == [True, True, False]
    assert fused_gluon.o_by_tma(t, 64, 2, 2)  # D = 64: 160 KiB with a 2-byte mask
    assert not fused_gluon.o_by_tma(replace(t, persistent=False), 128, 2, 0)
    assert not fused_gluon.o_by_tma(replace(t, o_tma=False), 128, 2, 0)


@pytest.mark.parametrize("offline", [compiles("fused", D=(64, 128), causal=(0, 1), tiles=("64x128w4s2hgco", "64x128w4s2hgc"))],
                         indirect=True)
def test_the_persistent_kernel_with_o_by_tma_compiles_within_limits(offline):
    """Its shared memory is the plain persistent kernel's plus the two O tiles that o_by_tma accounts for (a
    consumer's BLOCK_M × D each), within the budget o_by_tma grants them; no spills without a mask but 4 bytes at
    D = 128 causal; matmuls asynchronous."""
    by = {(r["D"], r["causal"], r["tiles"]): r for r in offline}
    assert len(by) == 8
    with_o = [r for r in offline if r["tiles"].endswith("o")]
    for r in with_o:
        assert r["fits"] and not r["wgmma_serialised"], r
        assert r["spill_stores"] <= (4 if r["causal"] and r["D"] == 128 else 0), r
        t = parse_tiles(r["tiles"])
        assert fused_gluon.o_by_tma(t, r["D"], 2, 0)  # the launch stores O by TMA here, so it must fit
        o_tiles = common.partitions(t)[0] * t.BLOCK_M * r["D"] * 2 / 1024  # KiB: one bf16 O tile a consumer
        plain = by[(r["D"], r["causal"], "64x128w4s2hgc")]
        assert r["smem_kib"] - plain["smem_kib"] == pytest.approx(o_tiles, abs=1), (r, plain)


@pytest.mark.parametrize("causal,N", [(False, 512), (True, 512), (True, 2048)])
@pytest.mark.parametrize("D", [128, 64])
def test_rows_record_the_o_store_path_the_launch_takes(monkeypatch, gluon_launches, D, causal, N):
    """Lab guard: the zero_mask ablation's 2-byte mask by TMA leaves no room for O's own tiles at D = 128 with
    two consumers a program, so there O goes out by plain stores while fused stores it by TMA; a one-consumer program
    (causal at short N) has room in its half of the SM. The row's tiles must say what the launch ran
    (the ablation report then notes the different tiles), here checked against the kernel's O_TMA, ROWS and
    BLOCK_N."""
    from attnlab import builds

    monkeypatch.setattr(config, "family", lambda device: "sm90")
    q = torch.zeros(2, 4, N, D, dtype=torch.bfloat16)
    spec = launch.check(q, q, q, causal=causal)
    for name in ("fused", "fused-zero_mask"):
        build = builds.get(name)
        build.attend(q, q, q, causal=causal)
        recorded = launch.tile_config(build.base, spec, build.ablation)["fused"]
        given = gluon_launches[-1][1]
        assert (recorded["o_tma"], recorded["one_consumer"], recorded["BLOCK_N"]) == (
            given["O_TMA"], given["ROWS"] == 1, given["BLOCK_N"]), (name, recorded)
    entry = plan.lookup("fused", "sm90", D, causal, 2, N=N)
    # the build by TMA where its tiles ask for it; its zero_mask ablation, whose 2-byte mask by TMA takes room, only
    # where O's tiles still fit: at D = 64, or in a one-consumer program's half of the SM (at D = 128 with two
    # consumers: 256 KiB of 227)
    room = D == 64 or entry.one_consumer
    assert [a["O_TMA"] for _, a in gluon_launches] == [entry.o_tma, entry.o_tma and (room or not entry.mask_tma)]
    assert {a["ROWS"] for _, a in gluon_launches} == {common.partitions(entry)[0]}


FUSED_SHORT = [(D, True, below) for D, below in plan.FUSED_ONE_CONSUMER_BELOW.items()]


@pytest.mark.parametrize("D,causal,below", FUSED_SHORT, ids=[f"{d}-{c}" for d, c, _ in FUSED_SHORT])
def test_the_fused_build_takes_a_short_entry_below_its_bound_only(monkeypatch, gluon_launches, D, causal, below):
    """Every Gluon SHORT entry of the fused kernel as a call meets it: the launch the build makes (its rows a program
    and key tile width) and the tiles its row records are the short entry's up to N = below − 1 and the TABLE
    entry's from N = below on; a call of the other causal setting never takes it."""
    from attnlab import builds

    monkeypatch.setattr(config, "family", lambda device: "sm90")
    short, entry = plan.lookup("fused", "sm90", D, causal, 2, N=below - 1), plan.lookup("fused", "sm90", D, causal, 2)
    assert short != entry
    for N in (below - 1, below):
        q = torch.zeros(1, 2, N, D, dtype=torch.bfloat16)
        for c in (causal, not causal):
            builds.get("fused").attend(q, q, q, causal=c)
            given = gluon_launches[-1][1]
            recorded = config.Tiles(**launch.tile_config("fused", launch.check(q, q, q, causal=c))["fused"])
            want = short if (c == causal and N < below) else plan.lookup("fused", "sm90", D, c, 2)
            assert (given["ROWS"], given["BLOCK_N"]) == (common.partitions(want)[0], want.BLOCK_N), (N, c)
            assert replace(recorded, o_tma=want.o_tma) == want, (N, c, recorded)


def test_the_fused_build_takes_the_short_entry_where_its_grid_is_one_wave(monkeypatch, gluon_launches):
    """config.ONE_WAVE as a call meets it on a 132-SM GPU: D = 128 causal at N = 1024, past SHORT's bound, launches
    SHORT's one-consumer tiles at B·H = 16 (TABLE's would make 16 · 8 = 128 items) and TABLE's at B·H = 17 (136
    items), and a non-causal call (no SHORT entry) TABLE's; the row records the tiles launched."""
    from attnlab import builds

    monkeypatch.setattr(config, "family", lambda device: "sm90")
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    short = plan.lookup("fused", "sm90", 128, True, 2, N=plan.FUSED_ONE_CONSUMER_BELOW[128] - 1)
    entry = plan.lookup("fused", "sm90", 128, True, 2)
    for B, H, causal, want in ((1, 16, True, short), (2, 8, True, short), (1, 17, True, entry),
                               (1, 16, False, plan.lookup("fused", "sm90", 128, False, 2))):
        q = torch.zeros(B, H, 1024, 128, dtype=torch.bfloat16)
        builds.get("fused").attend(q, q, q, causal=causal)
        given = gluon_launches[-1][1]
        recorded = config.Tiles(**launch.tile_config("fused", launch.check(q, q, q, causal=causal))["fused"])
        assert (given["ROWS"], given["BLOCK_N"]) == (common.partitions(want)[0], want.BLOCK_N), (B, H, causal)
        assert replace(recorded, o_tma=want.o_tma) == want, (B, H, causal, recorded)


def test_one_consumer_programs_launch_an_item_of_block_m_rows_and_two_fit_an_sm(monkeypatch, gluon_launches):
    """Tiles.one_consumer: a program is one consumer warpgroup and the loader (8 warps at
    launch), so its items are BLOCK_M rows and its launch asks for 128 registers a thread: two programs fill an SM's
    64 Ki. Persistent, the grid is then two programs an SM."""
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    B, H, N, D = 2, 16, 1000, 128
    q = torch.zeros(B, H, N, D, dtype=torch.bfloat16)
    for one, persistent in ((False, False), (True, False), (True, True)):
        run_tiles(q, config.Tiles(64, 64, 4, 2, gluon=True, persistent=persistent, one_consumer=one), causal=True)
    launched = [(grid, a["total"], a["ROWS"], a["maxnreg"]) for grid, a in gluon_launches]
    assert launched == [((8 * 32,), 8 * 32, 2, common.MAXNREG), ((16 * 32,), 16 * 32, 1, 128),
                        ((264,), 16 * 32, 1, 128)]
    assert 2 * 256 * common.MAXNREG_ONE <= 64 * 1024


@pytest.mark.parametrize("offline", [compiles("fused", D=(64, 128), causal=(0, 1), masks=(0, 2), tiles="64x64w4s2hgmu")],
                         indirect=True)
def test_one_consumer_variant_compiles_small_enough_for_two_programs_an_sm(offline):
    """64×64 tiles, 2 stages: at most half an SM's shared memory with any mask (two programs fit), no spills at the
    registers a one-consumer launch grants, matmuls asynchronous (offline)."""
    assert len(offline) == 8
    for r in offline:
        assert r["fits"] and not r["wgmma_serialised"] and r["spill_stores"] == 0, r
        assert r["smem_kib"] * 1024 <= common.smem_limit(parse_tiles(r["tiles"])), r
        assert r["registers"] == common.MAXNREG_ONE, r
