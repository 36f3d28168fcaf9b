"""The qk_softmax build's P kernel in one pass, for rows short enough to stay on chip (Tiles.one_pass, label `a`).
Hopper, Gluon; D = 64 or 128, fp16 or bf16, any N up to ROW_MAX (P's rows on 128-byte lines, layout.scores_buffer).

Why: the two-pass kernel (attnlab.triton.hopper.qk_softmax) computes every score twice, once for the row's max and
sum and once to write P, because a row of N keys does not fit on chip. At N ≤ 1024 the N keys of BLOCK_M = 64 rows
do: 64 × 1024 16-bit values are 128 KiB of shared memory. Here each score is computed once (at N ≤ 1024 the
softmax's second QKᵀ and exponentials are 0.37–0.45 of the build's floor):
  * a work item is BLOCK_M rows of a head with all their keys; a loader warp brings its Q once and each K tile once
    (TMA, into a ring of STAGES slots);
  * the two consumer warpgroups share the item's rows and split its key tiles, even tiles to one, odd to the other;
    for each tile a consumer takes the tile's row max m_j, writes 2^(s − m_j) as fp16 into the tile's slot of the row
    buffer and m_j beside it, and folds the tile into its own running (max, sum);
  * the two consumers swap their (max, sum) through shared memory (an mbarrier both arrive on), so each has the
    row's;
  * each rescales its own tiles in place, P = 2^(s − m_j) · 2^(m_j − max) / sum in the build's dtype, and stores
    them by TMA, which drains while the next item is computed.
Persistent (one program an SM: the row buffer takes most of its shared memory); under a causal mask the tiles past
the item's diagonal are stored as zeros by the consumer that owns them, and HEAVY_FIRST takes items in heavy/light
pairs (common.items). The no_softmax ablation writes S itself from the same loop, with no swap and no rescale.
Masks are not taken here: hopper.qk_softmax.as_run sends a masked call to the two-pass kernel, and the row says so.

P is rounded twice (2^(s − m_j) to fp16, then P to the dtype): at most one unit in the last place of fp16 more than
the two-pass kernel's one rounding, inside the FlashAttention rule the gate applies.
"""
from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from attnlab.triton import direct
from attnlab.triton.hopper.common import (P_CONSUMER_REGS, SMEM_SPARE, check_p_rows, described, items, load_k_tile,
                                          needs_masks, p_bias, scores, smem_limit, step_item, tma_ready)
from attnlab.triton.layout import padded_view

ROW_MAX = 1024  # the longest row a program keeps on chip (with 64 rows: 128 KiB of shared memory)
STATS = gl.constexpr(8)  # the swap's shared floats per row: 2 items in flight (parity) × 2 consumers × (max, sum)


@gluon.jit
def _loader(q_desc, k_desc, q_smem, k_smem, bars, work, M, N, H, GROUP, BLOCK_M: gl.constexpr,
            BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, HEAVY_FIRST: gl.constexpr):
    """One warp: each item's first K tile, its Q (once both consumers have released the last item's) and the rest of
    its K tiles, each once, into the ring (every slot read by one consumer: `empty` counts 1)."""
    q_full, q_empty, k_full, k_empty, x_bars = bars
    pid, nprog, total = work
    t0 = 0
    it = 0
    start, end, step = items(pid, nprog, total, CAUSAL and HEAVY_FIRST)
    for x in range(start, end, step):
        b, h, hk, start_m, n_tiles, m_head = step_item(x, work, M, 0, 0, N, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL,
                                                        HEAVY_FIRST, 1)
        no_mask = (k_desc, k_smem, 0, 0, 0)  # load_k_tile's mask box, unused without MASK_TMA
        load_k_tile(t0, 0, k_desc, k_smem, k_full, k_empty, b, hk, no_mask, BLOCK_N, STAGES, False)
        mbarrier.wait(q_empty, (it & 1) ^ 1)
        mbarrier.expect(q_full, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, start_m, 0], q_full, q_smem)
        for t in range(1, n_tiles):
            load_k_tile(t0 + t, t, k_desc, k_smem, k_full, k_empty, b, hk, no_mask, BLOCK_N, STAGES, False)
        t0 += n_tiles
        it += 1


@gluon.jit
def _merge(m_a, l_a, m_b, l_b):
    """The (max, sum) of two parts of a row, each sum taken against its own max; a part the mask hides entirely has
    max −inf and sum 0 (and both hidden give −inf, 0: never NaN)."""
    m = gl.maximum(m_a, m_b)
    m_safe = gl.where(m == -float("inf"), 0.0, m)
    return m, l_a * gl.exp2(m_a - m_safe) + l_b * gl.exp2(m_b - m_safe)


@gluon.jit
def _exponentials(s, NO_SOFTMAX: gl.constexpr):
    """Scaled, masked scores → (row max, 2^(s − max)); a row hidden entirely gets −inf and zeros, never NaN. Under
    no_softmax (the max, unused: the compiler drops it; S with masked entries 0)."""
    m = gl.max(s, axis=1)
    if NO_SOFTMAX:
        p = gl.where(s == -float("inf"), 0.0, s)
    else:
        p = gl.exp2(s - gl.where(m == -float("inf"), 0.0, m)[:, None])
    return m, p


@gluon.jit
def _tile_exp(s, j, start_m, hi, offs_m, cols, N, qk_scale, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
              NO_SOFTMAX: gl.constexpr):
    """Key tile j's raw q·kᵀ → (its row max m_j in exp2 units, 2^(s − m_j), its row sum); under no_softmax the second
    is S with masked entries 0 (the others unused). Element masks only where the tile crosses the diagonal or N
    (common.needs_masks)."""
    offs_n = j * BLOCK_N + cols
    if needs_masks(j, start_m, hi, BLOCK_N, CAUSAL):
        s = scores(s, offs_m, offs_m, offs_m, offs_n, N, 0, qk_scale, 1.0, True, CAUSAL, 0, NO_SOFTMAX, False)
        m_j, p = _exponentials(s, NO_SOFTMAX)
    else:
        s = scores(s, offs_m, offs_m, offs_m, offs_n, N, 0, qk_scale, 1.0, False, CAUSAL, 0, NO_SOFTMAX, False)
        if NO_SOFTMAX:  # scores scaled it
            m_j, p = _exponentials(s, True)
        else:  # the steady state: raw scores, the scale riding in exp2's FMA
            m_j = gl.max(s, axis=1) * qk_scale
            p = gl.exp2(s * qk_scale - m_j[:, None])
    return m_j, p, gl.sum(p, axis=1)


@gluon.jit
def _tiles_out(row_smem, slot0, p_desc, b, h, start_m, first, end, BLOCK_N: gl.constexpr):
    """TMA stores of this consumer's tiles first, first + 2, … < end of the item's row buffer (its slots from slot0),
    once what the consumer wrote there is visible to the copy engine."""
    fence_async_shared()
    for j in range(first, end, 2):
        tma.async_copy_shared_to_global(p_desc, [b, h, start_m, j * BLOCK_N], row_smem.index(slot0 + j))


@gluon.jit
def _own_tile(j, t0, q, k_smem, k_full, k_empty, row_smem, exps, slot0, tmax_smem, m_i, l_i, zero_s, start_m, hi,
              offs_m, cols, N, qk_scale, PENDING: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """Key tile j of the item whose tiles start at ring position t0: QKᵀ, its slot handed back, then (once at most
    PENDING of this consumer's stores are still reading shared memory; −1: no wait) 2^(s − m_j) as fp16 into row slot
    j with m_j beside it, folded into the running (max, sum); under no_softmax S itself, in the dtype."""
    t = t0 + j
    st = t % STAGES
    mbarrier.wait(k_full.index(st), (t // STAGES) & 1)
    s = warpgroup_mma(q, k_smem.index(st).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                      is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
    mbarrier.arrive(k_empty.index(st), count=1)
    m_j, p, l_j = _tile_exp(s, j, start_m, hi, offs_m, cols, N, qk_scale, BLOCK_N, CAUSAL, NO_SOFTMAX)
    if PENDING >= 0:
        tma.store_wait(pendings=PENDING)
    if NO_SOFTMAX:
        row_smem.index(slot0 + j).reshape([BLOCK_M, BLOCK_N]).store(p.to(row_smem.dtype))
    else:
        exps.index(slot0 + j).reshape([BLOCK_M, BLOCK_N]).store(p.to(gl.float16))
        tmax_smem.index(j).store(m_j)
        m_i, l_i = _merge(m_i, l_i, m_j, l_j)
    return m_i, l_i


@gluon.jit
def _consumer(q_smem, k_smem, row_smem, tmax_smem, stats_smem, p_desc, bars, work, M, N, H, GROUP, qk_scale,
              WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, ROW_TILES: gl.constexpr, ROW_BUFS: gl.constexpr, CAUSAL: gl.constexpr,
              NO_SOFTMAX: gl.constexpr, HEAVY_FIRST: gl.constexpr):
    """One warpgroup: its key tiles (j ≡ WG mod 2) of each item — exponentials into the row buffer, then, with the
    other consumer's (max, sum), P in place and out by TMA."""
    q_full, q_empty, k_full, k_empty, x_bars = bars
    dtype: gl.constexpr = p_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    exps = row_smem._reinterpret(gl.float16, row_smem.type.shape, row_smem.type.layout)  # 2^(s − m_j), in place
    q = q_smem.reshape([BLOCK_M, D])
    all_tiles = gl.cdiv(N, BLOCK_N)
    OWN: gl.constexpr = (ROW_TILES + 1 - WG) // 2  # this consumer's tiles of a row of ROW_TILES
    pid, nprog, total = work
    t0 = 0
    it = 0
    start, end, step = items(pid, nprog, total, CAUSAL and HEAVY_FIRST)
    for x in range(start, end, step):
        b, h, hk, start_m, n_tiles, m_head = step_item(x, work, M, 0, 0, N, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL,
                                                        HEAVY_FIRST, 1)
        offs_m = start_m + gl.arange(0, BLOCK_M, row_s)
        slot0 = (it % ROW_BUFS) * ROW_TILES  # this item's row buffer: its stores drain under the next item's work
        hi = N
        if CAUSAL:
            hi = gl.minimum(N, start_m + BLOCK_M)
        if CAUSAL:  # its tiles past the diagonal: zeros, as the materialised build's softmax writes them
            # every item, this consumer stores OWN tiles (zeros and P): wait for those that last read this buffer
            tma.store_wait(pendings=(ROW_BUFS - 1) * OWN)
            z0 = n_tiles + (n_tiles + WG) % 2
            for j in range(z0, all_tiles, 2):
                row_smem.index(slot0 + j).reshape([BLOCK_M, BLOCK_N]).store(zero_s.to(dtype))
            _tiles_out(row_smem, slot0, p_desc, b, h, start_m, z0, all_tiles, BLOCK_N)
        mbarrier.wait(q_full, it & 1)  # every consumer waits, tiles or none: the phases stay in step
        m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
        if CAUSAL:  # its tiles j = WG, WG + 2, … below the item's diagonal
            for j in range(WG, n_tiles, 2):
                m_i, l_i = _own_tile(j, t0, q, k_smem, k_full, k_empty, row_smem, exps, slot0, tmax_smem, m_i, l_i,
                                     zero_s, start_m, hi, offs_m, cols, N, qk_scale, -1, D, BLOCK_M, BLOCK_N, STAGES,
                                     CAUSAL, NO_SOFTMAX)
        else:  # all OWN of them, unrolled: the store that last read a slot (ROW_BUFS items ago; one store a slot, in
            # slot order) is waited for just before the slot is written, the stores after it still draining
            for i in gl.static_range(OWN):
                m_i, l_i = _own_tile(WG + 2 * i, t0, q, k_smem, k_full, k_empty, row_smem, exps, slot0, tmax_smem, m_i,
                                     l_i, zero_s, start_m, hi, offs_m, cols, N, qk_scale, ROW_BUFS * OWN - 1 - i, D,
                                     BLOCK_M, BLOCK_N, STAGES, CAUSAL, NO_SOFTMAX)
        mbarrier.arrive(q_empty, count=1)  # its last QKᵀ has read Q
        if NO_SOFTMAX:
            _tiles_out(row_smem, slot0, p_desc, b, h, start_m, WG, n_tiles, BLOCK_N)
        else:
            # the swap: each consumer's (max, sum) into its half of this item's stats, then the other's out
            par = (it % 2) * 4
            stats_smem.index(par + 2 * WG).store(m_i)
            stats_smem.index(par + 2 * WG + 1).store(l_i)
            gl.thread_barrier()  # the warpgroup's stores before its one arrival
            mbarrier.arrive(x_bars.index(it % 2), count=1)
            mbarrier.wait(x_bars.index(it % 2), (it // 2) & 1)
            m_i, l_i = _merge(m_i, l_i, stats_smem.index(par + 2 - 2 * WG).load(row_s),
                              stats_smem.index(par + 3 - 2 * WG).load(row_s))
            bias = p_bias(m_i, l_i)  # max + log2(sum): P = 2^(s − m_j) · 2^(m_j − bias)
            for j in range(WG, n_tiles, 2):
                scale = gl.exp2(tmax_smem.index(j).load(row_s) - bias)  # 0 where the tile hid the row (m_j −inf)
                e = exps.index(slot0 + j).reshape([BLOCK_M, BLOCK_N]).load(s_layout)
                row_smem.index(slot0 + j).reshape([BLOCK_M, BLOCK_N]).store(
                    (e.to(gl.float32) * scale[:, None]).to(dtype))
            _tiles_out(row_smem, slot0, p_desc, b, h, start_m, WG, n_tiles, BLOCK_N)
        t0 += n_tiles
        it += 1
    tma.store_wait(pendings=0)


# N is never made a constant: as a constant 1 with a mask it fails the Gluon lowering (attnlab.triton.hopper.fused).
@gluon.jit(do_not_specialize=["N"])
def qk_softmax_row_kernel(q_desc, k_desc, p_desc, M, N, H, GROUP, total, qk_scale, D: gl.constexpr,
                          BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                          ROW_TILES: gl.constexpr, ROW_BUFS: gl.constexpr, CAUSAL: gl.constexpr,
                          NO_SOFTMAX: gl.constexpr,
                          HEAVY_FIRST: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """Persistent grid (≤ one program an SM) over total = cdiv(N, BLOCK_M)·B·H items of BLOCK_M rows; num_warps = 4
    (a warpgroup a consumer, two consumers and a loader warp). q/k descriptors over (B, H or Hkv, N, D) with
    (1, 1, BLOCK_M or BLOCK_N, D) boxes; p_desc over the (B, H, N, N) P (rows on 128-byte lines:
    layout.scores_buffer) with a (1, 1, BLOCK_M, BLOCK_N) box; ROW_TILES = cdiv(N, BLOCK_N), the row buffer's
    tiles; STAGES even (a ring slot then returns to the consumer that last read it, or to the other only across the
    swap of an item boundary); M any pointer (items carry a
    mask pointer this kernel never reads); qk_scale = scale·log2 e (the natural scale under NO_SOFTMAX)."""
    dtype: gl.constexpr = q_desc.dtype
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    q_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], k_desc.layout)
    row_smem = gl.allocate_shared_memory(dtype, [ROW_BUFS * ROW_TILES, 1, 1, BLOCK_M, BLOCK_N], p_desc.layout)
    flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])  # rows of floats
    tmax_smem = gl.allocate_shared_memory(gl.float32, [ROW_TILES, BLOCK_M], flat)
    stats_smem = gl.allocate_shared_memory(gl.float32, [STATS, BLOCK_M], flat)
    q_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    x_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_full, count=1)
    mbarrier.init(q_empty, count=2)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(x_bars.index(i), count=2)
    fence_async_shared()
    # Each partition's arguments are written out where it is named: a tuple assigned to a name turns its constexprs
    # into tensors.
    gl.warp_specialize([
        (_consumer, (q_smem, k_smem, row_smem, tmax_smem, stats_smem, p_desc,
                     (q_full, q_empty, k_full, k_empty, x_bars), (pid, nprog, total), M, N, H, GROUP, qk_scale, 0, D,
                     BLOCK_M, BLOCK_N, STAGES, ROW_TILES, ROW_BUFS, CAUSAL, NO_SOFTMAX, HEAVY_FIRST)),
        (_consumer, (q_smem, k_smem, row_smem, tmax_smem, stats_smem, p_desc,
                     (q_full, q_empty, k_full, k_empty, x_bars), (pid, nprog, total), M, N, H, GROUP, qk_scale, 1, D,
                     BLOCK_M, BLOCK_N, STAGES, ROW_TILES, ROW_BUFS, CAUSAL, NO_SOFTMAX, HEAVY_FIRST)),
        (_loader, (q_desc, k_desc, q_smem, k_smem, (q_full, q_empty, k_full, k_empty, x_bars), (pid, nprog, total), M,
                   N, H, GROUP, BLOCK_M, BLOCK_N, STAGES, CAUSAL, HEAVY_FIRST)),
    ], [4, 1], [CONSUMER_REGS, 24])


def smem_bytes(tiles, N: int, D: int, itemsize: int, row_bufs: int = 1) -> int:
    """A program's shared memory at sequence length N: Q, the K ring, row_bufs row buffers (cdiv(N, BLOCK_N) P tiles
    each), the tiles' maxima and the swap's floats, and the barriers' spare."""
    BM, BN = tiles.BLOCK_M, tiles.BLOCK_N
    row_tiles = triton.cdiv(N, BN)
    return ((BM * D + tiles.num_stages * BN * D + row_bufs * row_tiles * BM * BN) * itemsize
            + (row_tiles + STATS.value) * BM * 4 + SMEM_SPARE)


def fits(tiles, N: int, D: int, itemsize: int) -> bool:
    """Whether this kernel can write P for these tiles at sequence length N: N ≤ ROW_MAX, an even number of stages
    (qk_softmax_row_kernel) and one row buffer within a program's shared memory."""
    return N <= ROW_MAX and tiles.num_stages % 2 == 0 and smem_bytes(tiles, N, D, itemsize) <= smem_limit(tiles)


def row_buffers(tiles, N: int, D: int, itemsize: int) -> int:
    """Row buffers a program keeps: two where they fit (items alternate, one's stores draining while the next is
    computed: N ≤ 512 at 64 rows), else one (the next item's tiles then wait, slot by slot, for the stores)."""
    return 2 if smem_bytes(tiles, N, D, itemsize, 2) <= smem_limit(tiles) else 1


def run(plan, q, k, p, N, H, group, qk_scale) -> None:
    """Write P for checked (B, H, N, D) q and k into the (B, H, N, N) p, one pass, as `plan`
    (attnlab.triton.plan.QkSoftmaxRowPlan, made only where the row `fits`) says. P's rows must start 16 bytes apart
    (common.check_p_rows); where their padding reaches the next 16-byte vector past N, P's descriptor spans it
    (layout.padded_view), whose columns past N get 0 for the PV kernel to read as they lie."""
    check_p_rows(p)
    p = padded_view(p, N)
    q, k = tma_ready(q), tma_ready(k)
    q_box, k_box, p_box = plan.boxes
    direct.run(qk_softmax_row_kernel, plan, described(q, q_box), described(k, k_box), described(p, p_box), p, N, H,
               group, plan.total, qk_scale)


def constexprs(tiles, *, D: int, N: int, itemsize: int, causal: bool, no_softmax: bool = False) -> dict:
    """The kernel's constexpr arguments: what the plan holds and what attnlab.triton.resources compiles offline."""
    return dict(D=D, BLOCK_M=tiles.BLOCK_M, BLOCK_N=tiles.BLOCK_N, STAGES=tiles.num_stages,
                ROW_TILES=triton.cdiv(N, tiles.BLOCK_N), ROW_BUFS=row_buffers(tiles, N, D, itemsize), CAUSAL=causal,
                NO_SOFTMAX=no_softmax, HEAVY_FIRST=tiles.heavy_first, CONSUMER_REGS=P_CONSUMER_REGS)
