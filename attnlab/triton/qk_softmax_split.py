"""The qk_softmax build's P kernel in one pass for rows too long for one program: each row block's keys split among a
group of G programs that swap their rows' (max, sum) through global memory (Tiles.split_row, label `k`;
PERFORMANCE.md v53). Hopper, Gluon; D = 64 or 128, fp16 or bf16, non-causal, no mask.

Why: the two-pass kernel (attnlab.triton.qk_softmax_gluon) computes every score twice, because a row of N keys does
not fit on chip; v40's one-pass kernel (attnlab.triton.qk_softmax_row) keeps the whole row in one program and so
stops at N = 1024. Here a row block of BLOCK_M = 64 rows is shared by G programs, each holding SEG_TILES key tiles of
it (N / G keys) in shared memory, so each score is computed and exponentiated once at any N:
  * a group is G consecutive programs, all resident at once (a persistent grid of G · ⌊SMs / G⌋ programs, one an
    SM: the row buffers take most of its shared memory); group g takes row blocks g, g + groups, …, and its program
    of rank r the key tiles r · SEG_TILES … of each;
  * in a program, a loader warp brings each item's Q and its key tiles (TMA, a ring of STAGES slots); the two
    consumer warpgroups take alternate tiles, and for each write 2^(s − m_j) as fp16 into the tile's slot of the row
    buffer with the tile's row max m_j beside it, folding the tile into a running (max, sum);
  * each consumer then publishes its (max, sum) into the group's slot of `stats` and counts itself in the group's
    counter (a release atomic); the 2·G consumers of the group are its members;
  * while the other members publish, the consumer computes its next item into the other row buffer; then it waits
    for the group's count (acquire), merges the 2·G (max, sum), rescales its tiles of the previous item in place to
    P = 2^(s − m_j) · 2^(m_j − max) / sum in the build's dtype, and stores them by TMA, which drain while the item
    after is computed (a slot is written again only once its store has read it).
So the swap's round trip runs under a whole item's matmuls. Members publish into 4 slots in turn: a member
publishes item i + 4 only after every member has read item i's (module notes, `_consumer`).

The wait is bounded (SPIN_LIMIT polls): if a group never completes (a program not resident, which a grid of at most
one program an SM with this shared memory excludes on an otherwise idle GPU), the kernel records it in
`count[groups]` and goes on with wrong P rather than hang; `launch` leaves the counter tensor on the result so a
check can read it (`timed_out`).

The no_softmax ablation writes S itself from the same schedule with no swap (the same stores, one item later).
P is rounded twice, as in v40 (2^(s − m_j) to fp16, then P to the dtype), inside the FlashAttention rule.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from attnlab.triton.fused_gluon import SMEM_SPARE, descriptor, sm_count, smem_limit, tma_ready
from attnlab.triton.qk_softmax_gluon import CONSUMER_REGS, _bias, _load_k
from attnlab.triton.qk_softmax_row import _merge, _tile_exp

SLOTS = gl.constexpr(4)  # stats slots a group cycles through (a member is at most 3 items ahead of a reader)
SPIN_LIMIT = gl.constexpr(1 << 20)  # polls of the group's counter before the kernel gives up (about a second)


@gluon.jit
def _segment(pid, N, BLOCK_N: gl.constexpr, SEG_TILES: gl.constexpr, G: gl.constexpr):
    """A program's place: its group, its rank in it, its first key tile and how many tiles of each row it holds (the
    last rank may hold fewer)."""
    g = pid // G
    r = pid % G
    t_lo = r * SEG_TILES
    n_seg = gl.maximum(gl.minimum(SEG_TILES, gl.cdiv(N, BLOCK_N) - t_lo), 0)
    return g, r, t_lo, n_seg


@gluon.jit
def _row_block(x, N, H, GROUP, BLOCK_M: gl.constexpr):
    """Row block x's batch, query head, k head and first row (row blocks run through a head before the next)."""
    n_blocks = gl.cdiv(N, BLOCK_M)
    bh = x // n_blocks
    h = bh % H
    return bh // H, h, h // GROUP, (x % n_blocks) * BLOCK_M


@gluon.jit
def _loader(q_desc, k_desc, q_smem, k_smem, bars, pid, groups, total, N, H, GROUP, BLOCK_M: gl.constexpr,
            BLOCK_N: gl.constexpr, STAGES: gl.constexpr, SEG_TILES: gl.constexpr, G: gl.constexpr):
    """One warp: each item's first key tile, its Q (once both consumers have read the last item's) and the rest of
    the program's key tiles of it, each once, into the ring (each slot read by one consumer: `empty` counts 1)."""
    q_full, q_empty, k_full, k_empty = bars
    g, r, t_lo, n_seg = _segment(pid, N, BLOCK_N, SEG_TILES, G)
    no_mask = (k_desc, k_smem, 0, 0, 0)  # _load_k's mask box, unused without MASK_TMA
    t0 = 0
    it = 0
    for x in range(g, total, groups):
        b, h, hk, start_m = _row_block(x, N, H, GROUP, BLOCK_M)
        if n_seg > 0:
            _load_k(t0, t_lo, k_desc, k_smem, k_full, k_empty, b, hk, no_mask, BLOCK_N, STAGES, False)
        mbarrier.wait(q_empty, (it & 1) ^ 1)
        mbarrier.expect(q_full, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, start_m, 0], q_full, q_smem)
        for t in range(1, n_seg):
            _load_k(t0 + t, t_lo + t, k_desc, k_smem, k_full, k_empty, b, hk, no_mask, BLOCK_N, STAGES, False)
        t0 += n_seg
        it += 1


@gluon.jit
def _compute(it, t0, t_lo, n_seg, q, k_smem, k_full, k_empty, row_smem, exps, tmax_smem, start_m, offs_m, cols, zero_s,
             N, qk_scale, WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             STAGES: gl.constexpr, SEG_TILES: gl.constexpr, OWN: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """This consumer's key tiles of item `it` (segment tiles WG, WG + 2, … < n_seg, ring positions from t0) into
    row buffer it % 2: 2^(s − m_j) as fp16 and m_j, folded into the returned (max, sum); under no_softmax S itself.
    Each slot is written once the store that last read it (item it − 2's, issued one item ago) has: the stores
    leave in slot order, so at own tile i at most n_own − 1 − i of them may still be pending."""
    row_s: gl.constexpr = gl.SliceLayout(1, zero_s.type.layout)
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    n_own = (n_seg + 1 - WG) // 2
    slot0 = (it % 2) * SEG_TILES
    for i in gl.static_range(OWN):
        j = WG + 2 * i
        if j < n_seg:
            t = t0 + j
            st = t % STAGES
            mbarrier.wait(k_full.index(st), (t // STAGES) & 1)
            s = warpgroup_mma(q, k_smem.index(st).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                              is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
            mbarrier.arrive(k_empty.index(st), count=1)
            # t_lo + j is the key tile; masks only where it reaches past N (non-causal)
            m_j, p, l_j = _tile_exp(s, t_lo + j, start_m, N, offs_m, cols, N, qk_scale, BLOCK_N, False, NO_SOFTMAX)
            if n_own == OWN:
                tma.store_wait(pendings=OWN - 1 - i)
            else:  # the last rank's shorter segment: wait for all
                tma.store_wait(pendings=0)
            if NO_SOFTMAX:
                row_smem.index(slot0 + j).reshape([BLOCK_M, BLOCK_N]).store(p.to(row_smem.dtype))
            else:
                exps.index(slot0 + j).reshape([BLOCK_M, BLOCK_N]).store(p.to(gl.float16))
                tmax_smem.index(slot0 + j).store(m_j)
                m_i, l_i = _merge(m_i, l_i, m_j, l_j)
    return m_i, l_i


@gluon.jit
def _publish(stats, count, g, member, it, m_i, l_i, rows, BLOCK_M: gl.constexpr, G: gl.constexpr):
    """This member's (max, sum) of item `it` into its group's slot it % SLOTS, then its count (release: the stores
    of the whole warpgroup, ordered by the barrier, before the add)."""
    base = stats + (((g * SLOTS + it % SLOTS) * (2 * G) + member) * 2) * BLOCK_M
    gl.store(base + rows, m_i)
    gl.store(base + BLOCK_M + rows, l_i)
    gl.thread_barrier()
    gl.atomic_add(count + g, 1, sem="release", scope="gpu")


@gluon.jit
def _group_bias(stats, count, groups, g, it, rows, BLOCK_M: gl.constexpr, G: gl.constexpr):
    """Once all 2·G members of group g have published item `it` (its count reaches 2·G·(it + 1); acquire), the rows'
    bias max + log2(sum) over the whole row from their (max, sum)."""
    target = 2 * G * (it + 1)
    seen = gl.atomic_add(count + g, 0, sem="acquire", scope="gpu")
    polls = 0
    while (seen < target) & (polls < SPIN_LIMIT):
        seen = gl.atomic_add(count + g, 0, sem="acquire", scope="gpu")
        polls += 1
    if seen < target:  # never completed: say so (count[groups]) and go on
        gl.atomic_or(count + groups, 1, sem="relaxed", scope="gpu")
    base = stats + ((g * SLOTS + it % SLOTS) * (2 * G) * 2) * BLOCK_M
    # from L2 (.cg): this SM's L1 may hold the slot as it was SLOTS items ago
    m_i = gl.load(base + rows, cache_modifier=".cg")
    l_i = gl.load(base + BLOCK_M + rows, cache_modifier=".cg")
    for u in gl.static_range(1, 2 * G):
        m_i, l_i = _merge(m_i, l_i, gl.load(base + (2 * u) * BLOCK_M + rows, cache_modifier=".cg"),
                          gl.load(base + (2 * u + 1) * BLOCK_M + rows, cache_modifier=".cg"))
    return _bias(m_i, l_i)


@gluon.jit
def _finish(it, n_seg, t_lo, bias, row_smem, exps, tmax_smem, p_desc, b, h, start_m, s_layout: gl.constexpr,
            WG: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SEG_TILES: gl.constexpr,
            OWN: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """Item `it`'s tiles of this consumer (row buffer it % 2) to P in place with the row's bias, then out by TMA at
    key tiles t_lo + j; under no_softmax S as it lies."""
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    slot0 = (it % 2) * SEG_TILES
    if not NO_SOFTMAX:
        for i in gl.static_range(OWN):
            j = WG + 2 * i
            if j < n_seg:
                scale = gl.exp2(tmax_smem.index(slot0 + j).load(row_s) - bias)  # 0 where the tile hid the row
                e = exps.index(slot0 + j).reshape([BLOCK_M, BLOCK_N]).load(s_layout)
                row_smem.index(slot0 + j).reshape([BLOCK_M, BLOCK_N]).store(
                    (e.to(gl.float32) * scale[:, None]).to(row_smem.dtype))
    fence_async_shared()
    for i in gl.static_range(OWN):
        j = WG + 2 * i
        if j < n_seg:
            tma.async_copy_shared_to_global(p_desc, [b, h, start_m, (t_lo + j) * BLOCK_N], row_smem.index(slot0 + j))


@gluon.jit
def _consumer(q_smem, k_smem, row_smem, tmax_smem, p_desc, stats, count, bars, pid, groups, total, N, H, GROUP,
              qk_scale, WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, SEG_TILES: gl.constexpr, G: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """One warpgroup, a member of its group: item it's tiles computed and its (max, sum) published, then item
    it − 1 finished with the group's bias (module notes). Why 4 slots: a member publishes item i + 4 after its wait
    for item i + 2, which needs every member's item i + 2, each published after that member read item i."""
    q_full, q_empty, k_full, k_empty = bars
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    rows = gl.arange(0, BLOCK_M, row_s)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    exps = row_smem._reinterpret(gl.float16, row_smem.type.shape, row_smem.type.layout)  # 2^(s − m_j), in place
    q = q_smem.reshape([BLOCK_M, D])
    OWN: gl.constexpr = (SEG_TILES + 1 - WG) // 2  # this consumer's tiles of a full segment
    g, r, t_lo, n_seg = _segment(pid, N, BLOCK_N, SEG_TILES, G)
    member = 2 * r + WG
    t0 = 0
    it = 0
    pb = 0
    ph = 0
    pm = 0
    for x in range(g, total, groups):
        b, h, hk, start_m = _row_block(x, N, H, GROUP, BLOCK_M)
        mbarrier.wait(q_full, it & 1)  # every consumer waits, tiles or none: the phases stay in step
        m_i, l_i = _compute(it, t0, t_lo, n_seg, q, k_smem, k_full, k_empty, row_smem, exps, tmax_smem, start_m,
                            start_m + rows, cols, zero_s, N, qk_scale, WG, D, BLOCK_M, BLOCK_N, STAGES, SEG_TILES,
                            OWN, NO_SOFTMAX)
        mbarrier.arrive(q_empty, count=1)  # its last QKᵀ has read Q
        if not NO_SOFTMAX:
            _publish(stats, count, g, member, it, m_i, l_i, rows, BLOCK_M, G)
        if it > 0:
            bias = gl.zeros([BLOCK_M], gl.float32, row_s)
            if not NO_SOFTMAX:
                bias = _group_bias(stats, count, groups, g, it - 1, rows, BLOCK_M, G)
            _finish(it - 1, n_seg, t_lo, bias, row_smem, exps, tmax_smem, p_desc, pb, ph, pm, s_layout, WG, BLOCK_M,
                    BLOCK_N, SEG_TILES, OWN, NO_SOFTMAX)
        pb = b
        ph = h
        pm = start_m
        t0 += n_seg
        it += 1
    if it > 0:  # the last item
        bias = gl.zeros([BLOCK_M], gl.float32, row_s)
        if not NO_SOFTMAX:
            bias = _group_bias(stats, count, groups, g, it - 1, rows, BLOCK_M, G)
        _finish(it - 1, n_seg, t_lo, bias, row_smem, exps, tmax_smem, p_desc, pb, ph, pm, s_layout, WG, BLOCK_M,
                BLOCK_N, SEG_TILES, OWN, NO_SOFTMAX)
    tma.store_wait(pendings=0)


# N is never made a constant (attnlab.triton.fused_gluon: N = 1 with a mask fails to compile in Triton 3.6 if it is).
@gluon.jit(do_not_specialize=["N"])
def qk_softmax_split_kernel(q_desc, k_desc, p_desc, stats, count, N, H, GROUP, total, qk_scale, D: gl.constexpr,
                            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                            SEG_TILES: gl.constexpr, G: gl.constexpr, NO_SOFTMAX: gl.constexpr,
                            CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """Persistent grid of groups · G programs (one an SM) over total = cdiv(N, BLOCK_M)·B·H row blocks; num_warps = 4
    (a warpgroup a consumer, two consumers and a loader warp). q/k descriptors over (B, H or Hkv, N, D) with
    (1, 1, BLOCK_M or BLOCK_N, D) boxes; p_desc over the (B, H, N, N) P (rows on 128-byte lines:
    launch.scores_buffer) with a (1, 1, BLOCK_M, BLOCK_N) box; stats: groups · SLOTS · 2G · 2 · BLOCK_M floats;
    count: groups + 1 int32 zeros (the last: 1 if a wait gave up); qk_scale = scale·log2 e (the natural scale under
    NO_SOFTMAX)."""
    dtype: gl.constexpr = q_desc.dtype
    pid = gl.program_id(0)
    groups = gl.num_programs(0) // G
    q_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], k_desc.layout)
    row_smem = gl.allocate_shared_memory(dtype, [2 * SEG_TILES, 1, 1, BLOCK_M, BLOCK_N], p_desc.layout)
    flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])  # rows of floats
    tmax_smem = gl.allocate_shared_memory(gl.float32, [2 * SEG_TILES, BLOCK_M], flat)
    q_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_full, count=1)
    mbarrier.init(q_empty, count=2)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=1)
    fence_async_shared()
    # Each partition's arguments are written out where it is named: a tuple assigned to a name turns its constexprs
    # into tensors.
    gl.warp_specialize([
        (_consumer, (q_smem, k_smem, row_smem, tmax_smem, p_desc, stats, count, (q_full, q_empty, k_full, k_empty),
                     pid, groups, total, N, H, GROUP, qk_scale, 0, D, BLOCK_M, BLOCK_N, STAGES, SEG_TILES, G,
                     NO_SOFTMAX)),
        (_consumer, (q_smem, k_smem, row_smem, tmax_smem, p_desc, stats, count, (q_full, q_empty, k_full, k_empty),
                     pid, groups, total, N, H, GROUP, qk_scale, 1, D, BLOCK_M, BLOCK_N, STAGES, SEG_TILES, G,
                     NO_SOFTMAX)),
        (_loader, (q_desc, k_desc, q_smem, k_smem, (q_full, q_empty, k_full, k_empty), pid, groups, total, N, H,
                   GROUP, BLOCK_M, BLOCK_N, STAGES, SEG_TILES, G)),
    ], [4, 1], [CONSUMER_REGS, 24])


def smem_bytes(tiles, seg_tiles: int, D: int, itemsize: int) -> int:
    """A program's shared memory: Q, the K ring, two row buffers of seg_tiles P tiles, their tiles' maxima, and the
    barriers' spare."""
    BM, BN = tiles.BLOCK_M, tiles.BLOCK_N
    return ((BM * D + tiles.num_stages * BN * D + 2 * seg_tiles * BM * BN) * itemsize + 2 * seg_tiles * BM * 4
            + SMEM_SPARE)


def segment_tiles(tiles, D: int, itemsize: int) -> int:
    """The most key tiles a program can hold of a row (two row buffers of them): even, so both consumers take as
    many; 0 where not even 2 fit."""
    s = 2
    while smem_bytes(tiles, s + 2, D, itemsize) <= smem_limit(tiles):
        s += 2
    return s if smem_bytes(tiles, s, D, itemsize) <= smem_limit(tiles) else 0


def plan(tiles, N: int, D: int, itemsize: int, sms: int):
    """(G, SEG_TILES, groups) for a call at sequence length N on a GPU of `sms` SMs: the fewest programs a group whose
    segments fit, the tiles spread evenly over them; None where that cannot be (segments do not fit at all, or a
    group would need more programs than the GPU has)."""
    most = segment_tiles(tiles, D, itemsize)
    if most == 0:
        return None
    n_tiles = triton.cdiv(N, tiles.BLOCK_N)
    G = triton.cdiv(n_tiles, most)
    seg = triton.cdiv(n_tiles, G)
    seg += seg % 2  # even: both consumers hold as many tiles of a full segment
    if G > sms:
        return None
    return G, seg, sms // G


def fits(tiles, N: int, D: int, itemsize: int, sms: int = 132) -> bool:
    """Whether this kernel can write P for these tiles at sequence length N (plan is not None)."""
    return plan(tiles, N, D, itemsize, sms) is not None


def launch(q, k, p, *, N, H, group, qk_scale, causal, tiles, no_softmax=False) -> torch.Tensor:
    """Write P for checked (B, H, N, D) q and k into the (B, H, N, N) p (qk_softmax_gluon.launch sends
    Tiles.split_row here, non-causal; ValueError where it cannot run). Returns the group counters, whose last
    element is 1 if a group's wait gave up (timed_out)."""
    if causal:
        raise ValueError(f"tiles {tiles}: the split-row P kernel takes no causal mask (qk_softmax_gluon.as_run gives "
                         f"the tiles a causal call runs with)")
    D, itemsize = q.shape[-1], q.element_size()
    sms = sm_count(q.device)
    got = plan(tiles, N, D, itemsize, sms)
    if got is None:
        raise ValueError(f"tiles {tiles}: the split-row P kernel cannot hold N = {N} keys on {sms} SMs (its segments "
                         f"of at most {segment_tiles(tiles, D, itemsize)} tiles of {tiles.BLOCK_N} keys, two row "
                         f"buffers in {smem_limit(tiles)} bytes)")
    G, seg, groups = got
    q, k = tma_ready(q), tma_ready(k)
    total = triton.cdiv(N, tiles.BLOCK_M) * q.shape[0] * H
    stats = torch.empty(groups * SLOTS.value * 2 * G * 2 * tiles.BLOCK_M, dtype=torch.float32, device=q.device)
    count = torch.zeros(groups + 1, dtype=torch.int32, device=q.device)
    qk_softmax_split_kernel[(groups * G,)](descriptor(q, tiles.BLOCK_M), descriptor(k, tiles.BLOCK_N),
                                          descriptor(p, tiles.BLOCK_M, tiles.BLOCK_N), stats, count, N, H, group,
                                          total, qk_scale,
                                          **constexprs(tiles, D=D, G=G, seg_tiles=seg, no_softmax=no_softmax),
                                          num_warps=4)
    return count


def timed_out(count: torch.Tensor) -> bool:
    """Whether a launch's group wait gave up (its counters, as launch returns them; reads the device)."""
    return bool(count[-1].item())


def constexprs(tiles, *, D: int, G: int, seg_tiles: int, no_softmax: bool = False) -> dict:
    """The kernel's constexpr arguments: what `launch` passes and what attnlab.triton.resources compiles offline."""
    return dict(D=D, BLOCK_M=tiles.BLOCK_M, BLOCK_N=tiles.BLOCK_N, STAGES=tiles.num_stages, SEG_TILES=seg_tiles, G=G,
                NO_SOFTMAX=no_softmax, CONSUMER_REGS=CONSUMER_REGS)
