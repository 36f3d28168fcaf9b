"""The fused build's Hopper kernel, written in Gluon (Triton's lower-level dialect): warp specialised, one loader warp
and two consumer warpgroups. It compiles for D = 64 and 128 exactly; the plans' rules use it at both, persistent with
O stored by TMA from tiles of its own, causal items taken in heavy/light pairs, and for short causal sequences
(plan.FUSED_ONE_CONSUMER_BELOW: below N = 724 at D = 128 and 1448 at D = 64) with one consumer a program, two
programs an SM.

Why a second kernel: stock Triton 3.6 compiles our fused loop (attnlab.triton.fused) so that it waits for every QKᵀ
matmul at once and all eight warps move in step (CTA-wide barriers around every load); its own warp-specialisation
switch does not work on Hopper (its Hopper pass aborts with 4 warps and ignores the switch with 8). Gluon says both
things explicitly:
  * a loader warp streams K and V by TMA into a ring of STAGES slots; an mbarrier per slot says "full" (bytes
    arrived) and another "empty" (both consumers' matmuls that read it are done), so no warp waits for another
    except through the data it needs;
  * each consumer warpgroup owns BLOCK_M query rows and runs FlashAttention-3's order: issue QKᵀ(j) and PV(j-1)
    asynchronously, wait for QKᵀ(j) only, compute softmax(j) while PV(j-1) is still on the tensor cores. The two
    consumers are independent, so the SM's warp schedulers overlap one's softmax with the other's matmuls (an explicit
    ping-pong order between them measured the same on the H200, and was dropped).
A program covers 2·BLOCK_M rows: grid (cdiv(N, 2·BLOCK_M), B·H).

Same arithmetic as the Triton kernel, flag for flag, so that a fused row and its ablations run one kernel: scores in
exp2 units (scale·log2 e folded in), explicit masks (boolean or additive), causal, ragged N, GQA, the no_softmax
(P = S) and no_pv (O = Σ_n P·n/N, V never read) ablations, O = 0 for a fully masked row. Gluon has no CPU
interpreter: CI compiles this kernel for sm_90a (tests/test_fused_gluon.py); its accuracy is checked on the GPU by
the gate (`attnlab check`).
"""
from __future__ import annotations


from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from attnlab.triton import direct
from attnlab.triton.hopper.common import (CONSUMER_REGS, ROWS_PER_PROGRAM, SMEM_SPARE, described, items,
                                          mask_by_tma, mask_descriptor, partitions, program, smem_limit, softmax_tile,
                                          step_item, tma_ready, warpgroup_mask)


@gluon.jit
def _no_pv_step(acc, p, offs_n, inv_n, alpha, NO_SOFTMAX: gl.constexpr):
    """The no_pv ablation's O += P·n/N (attnlab.triton.tiles.no_pv_step), after the rescale by α."""
    if not NO_SOFTMAX:
        acc = acc * alpha[:, None]
    return acc + p * (offs_n.to(gl.float32) * inv_n)[None, :]


@gluon.jit
def _load_k(j, r, k_desc, k_smem, bars, mask, b, h, hk, start_m, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
            MASK_TMA: gl.constexpr, MASK_B: gl.constexpr, MASK_H: gl.constexpr):
    """Key tile j (ring position r) into its slot once both consumers have released it; under MASK_TMA the mask tile
    of both consumers' rows arrives with it, on K's barrier."""
    q_bars, q_empty, k_full, v_full, k_empty, v_empty = bars
    M, smb, smh, smm, smn, mask_desc, mask_smem = mask
    st = r % STAGES
    mbarrier.wait(k_empty.index(st), ((r // STAGES) & 1) ^ 1)  # a fresh barrier passes the phase before 0
    if MASK_TMA:
        # the consumers read the slot's last mask tile with ordinary shared loads (the generic proxy): order
        # those reads before this TMA write (the async proxy) into the same slot
        fence_async_shared()
        mbarrier.expect(k_full.index(st), k_desc.block_type.nbytes + mask_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(mask_desc, [b * MASK_B, h * MASK_H, start_m, j * BLOCK_N], k_full.index(st),
                                        mask_smem.index(st))
    else:
        mbarrier.expect(k_full.index(st), k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [b, hk, j * BLOCK_N, 0], k_full.index(st), k_smem.index(st))


@gluon.jit
def _load_v(j, r, v_desc, v_smem, bars, b, hk, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
            NO_PV: gl.constexpr):
    """Value tile j (ring position r) into its slot; never under no_pv."""
    q_bars, q_empty, k_full, v_full, k_empty, v_empty = bars
    if not NO_PV:
        st = r % STAGES
        mbarrier.wait(v_empty.index(st), ((r // STAGES) & 1) ^ 1)
        mbarrier.expect(v_full.index(st), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [b, hk, j * BLOCK_N, 0], v_full.index(st), v_smem.index(st))


@gluon.jit
def _load_item(where, t0, it, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, mask, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NO_PV: gl.constexpr, MASK_TMA: gl.constexpr,
               MASK_B: gl.constexpr, MASK_H: gl.constexpr, PERSISTENT: gl.constexpr, ROWS: gl.constexpr):
    """The loader's share of a work item (`where`: program's answer; this program's it-th item), whose key tiles
    take ring positions t0 on: K of tile 0, both consumers' Q (persistent: once each consumer has released its Q
    buffer, after its last QKᵀ of the previous item), then V of tile 0 and K and V tile by tile. Returns the next
    item's first ring position."""
    q_bars, q_empty, k_full, v_full, k_empty, v_empty = bars
    b, h, hk, start_m, n_tiles, m_head = where
    if PERSISTENT:  # K's first tile can load before the previous item's last QKᵀ has released Q
        _load_k(0, t0, k_desc, k_smem, bars, mask, b, h, hk, start_m, BLOCK_N, STAGES, MASK_TMA, MASK_B, MASK_H)
    for w in gl.static_range(ROWS):
        if PERSISTENT:
            mbarrier.wait(q_empty.index(w), (it & 1) ^ 1)
        mbarrier.expect(q_bars.index(w), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, start_m + w * BLOCK_M, 0], q_bars.index(w), q_smem.index(w))
    if not PERSISTENT:
        _load_k(0, t0, k_desc, k_smem, bars, mask, b, h, hk, start_m, BLOCK_N, STAGES, MASK_TMA, MASK_B, MASK_H)
    _load_v(0, t0, v_desc, v_smem, bars, b, hk, BLOCK_N, STAGES, NO_PV)
    for j in range(1, n_tiles):
        _load_k(j, t0 + j, k_desc, k_smem, bars, mask, b, h, hk, start_m, BLOCK_N, STAGES, MASK_TMA, MASK_B,
                MASK_H)
        _load_v(j, t0 + j, v_desc, v_smem, bars, b, hk, BLOCK_N, STAGES, NO_PV)
    return t0 + n_tiles


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, mask, work, where, N, H, GROUP,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
            HEAVY_FIRST: gl.constexpr, NO_PV: gl.constexpr, MASK_TMA: gl.constexpr, MASK_B: gl.constexpr,
            MASK_H: gl.constexpr, PERSISTENT: gl.constexpr, ROWS: gl.constexpr):
    """One warp: Q, K and V of this program's work items by TMA into the ring, a slot refilled once every consumer
    has arrived on its `empty` barrier (count ROWS). Under no_pv V is never read."""
    pid, nprog, total = work
    M, smb, smh, smm, smn, mask_desc, mask_smem = mask
    if PERSISTENT:
        t0 = 0
        it = 0
        start, end, step = items(pid, nprog, total, CAUSAL and HEAVY_FIRST)
        for x in range(start, end, step):
            where = step_item(x, work, M, smb, smh, N, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL, HEAVY_FIRST, ROWS)
            t0 = _load_item(where, t0, it, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, mask, BLOCK_M,
                            BLOCK_N, STAGES, NO_PV, MASK_TMA, MASK_B, MASK_H, True, ROWS)
            it += 1
    else:
        _load_item(where, 0, 0, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, mask, BLOCK_M, BLOCK_N, STAGES,
                   NO_PV, MASK_TMA, MASK_B, MASK_H, False, ROWS)


@gluon.jit
def _pv_issue(p, acc, v_smem, v_full, stage, j, offs_n, inv_n, dtype: gl.constexpr, p_layout: gl.constexpr,
              BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, NO_PV: gl.constexpr):
    """Start O += P·V(tile j) on the tensor cores (P as the register operand); nothing under no_pv, whose
    O += P·n/N is done as soon as P exists (softmax_tile), so P is not carried into the next iteration."""
    if NO_PV:
        p_op = p
    else:
        mbarrier.wait(v_full.index(stage), (j // STAGES) & 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc = warpgroup_mma(p_op, v_smem.index(stage).reshape([BLOCK_N, D]), acc, is_async=True)
    return acc, p_op


@gluon.jit
def _attend_item(where, t0, it, q_desc, o_desc, o_ptr, o_strides, q_smem, k_smem, v_smem, o_smem, bars, mask, N,
                 qk_scale, mask_scale, inv_n, WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr,
                 NO_SOFTMAX: gl.constexpr, NO_PV: gl.constexpr, MASK_TMA: gl.constexpr, PERSISTENT: gl.constexpr,
                 O_TMA: gl.constexpr, ROWS: gl.constexpr):
    """One warpgroup's rows of a work item (`where`: program's answer; this program's it-th item; its key tiles at
    ring positions t0 on): FA3's loop over the loader's ring, then O out. Under MASK_TMA a K slot is released only
    once this warpgroup has also read its rows of the slot's mask tile. Persistent: the Q buffer is released after
    the last QKᵀ, so the next item's Q loads under this one's last softmax, PV and store, and O goes out from
    registers (the Q buffer, which carries O by TMA otherwise, is by then the next item's), or under O_TMA by TMA
    from this warpgroup's own O tile, once the previous item's store from it has been read out. Returns the next
    item's first ring position."""
    q_bars, q_empty, k_full, v_full, k_empty, v_empty = bars
    M, smb, smh, smm, smn, mask_desc, mask_smem = mask
    b, h, hk, start_m, n_tiles, m_head = where
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    if NO_PV:
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)  # summed over its columns at the end
    else:
        acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)

    rows = start_m + WG * BLOCK_M
    offs_m = rows + gl.arange(0, BLOCK_M, row_s)
    cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    mask_rows = m_head + offs_m.to(gl.int64) * smm  # int64: row · N overflows past N = 46340
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    hi = N
    if CAUSAL:
        hi = gl.minimum(N, rows + BLOCK_M)

    mbarrier.wait(q_bars.index(WG), it & 1)
    q = q_smem.index(WG).reshape([BLOCK_M, D])
    stage = t0 % STAGES
    mbarrier.wait(k_full.index(stage), (t0 // STAGES) & 1)
    s = warpgroup_mma(q, k_smem.index(stage).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                      is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
    if not MASK_TMA:
        mbarrier.arrive(k_empty.index(stage), count=1)
    p, m_i, l_i, alpha, offs_n = softmax_tile(s, m_i, l_i, 0, rows, hi, mask_rows,
                                       warpgroup_mask(mask_smem, stage, WG, MASK_TMA, ROWS), offs_m, cols, N, smn, qk_scale,
                                       mask_scale, BLOCK_N, CAUSAL, MASK_KIND, NO_SOFTMAX, MASK_TMA)
    if MASK_TMA:
        mbarrier.arrive(k_empty.index(stage), count=1)
    if NO_PV:
        acc = _no_pv_step(acc, p, offs_n, inv_n, alpha, NO_SOFTMAX)
    for j in range(1, n_tiles):
        r = t0 + j
        stage = r % STAGES
        prev = (r - 1) % STAGES
        mbarrier.wait(k_full.index(stage), (r // STAGES) & 1)
        s = warpgroup_mma(q, k_smem.index(stage).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                          is_async=True)
        acc, p_op = _pv_issue(p, acc, v_smem, v_full, prev, r - 1, offs_n, inv_n, dtype, p_layout, BLOCK_N, D,
                              STAGES, NO_PV)
        # QKᵀ(j) done; PV(j-1), committed after it, may still run (under no_pv there is nothing after it)
        s = warpgroup_mma_wait(num_outstanding=0 if NO_PV else 1, deps=[s])
        if not MASK_TMA:
            mbarrier.arrive(k_empty.index(stage), count=1)
        p, m_i, l_i, alpha, offs_n = softmax_tile(s, m_i, l_i, j, rows, hi, mask_rows,
                                           warpgroup_mask(mask_smem, stage, WG, MASK_TMA, ROWS), offs_m, cols, N, smn,
                                           qk_scale, mask_scale, BLOCK_N, CAUSAL, MASK_KIND, NO_SOFTMAX, MASK_TMA)
        if MASK_TMA:
            mbarrier.arrive(k_empty.index(stage), count=1)
        if NO_PV:
            acc = _no_pv_step(acc, p, offs_n, inv_n, alpha, NO_SOFTMAX)
        else:
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=[acc, p_op])
            mbarrier.arrive(v_empty.index(prev), count=1)
            if not NO_SOFTMAX:
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    if PERSISTENT:
        mbarrier.arrive(q_empty.index(WG), count=1)  # every QKᵀ of the item has finished reading Q

    r_last = t0 + n_tiles - 1
    last = r_last % STAGES
    acc, p_op = _pv_issue(p, acc, v_smem, v_full, last, r_last, offs_n, inv_n, dtype, p_layout, BLOCK_N, D, STAGES,
                          NO_PV)
    if NO_PV:
        o = gl.convert_layout(gl.sum(acc, axis=1), row_o)[:, None] + gl.zeros([BLOCK_M, D], gl.float32, o_layout)
    else:
        o, p_op = warpgroup_mma_wait(num_outstanding=0, deps=[acc, p_op])
        mbarrier.arrive(v_empty.index(last), count=1)
    if not NO_SOFTMAX:
        l_o = gl.convert_layout(l_i, row_o)
        o = o / gl.where(l_o == 0.0, 1.0, l_o)[:, None]  # a fully masked row gives O = 0
    if PERSISTENT and not O_TMA:
        sob, soh, son = o_strides
        offs_mo = rows + gl.arange(0, BLOCK_M, row_o)
        offs_d = gl.arange(0, D, gl.SliceLayout(0, o_layout))
        o_rows = o_ptr + b.to(gl.int64) * sob + h.to(gl.int64) * soh + offs_mo.to(gl.int64) * son
        gl.store(o_rows[:, None] + offs_d[None, :], o.to(dtype), mask=(offs_mo < N)[:, None])
    else:
        if PERSISTENT:
            o_buf = o_smem.index(WG)
            tma.store_wait(pendings=0)  # the previous item's O has been read out of it
        else:
            o_buf = q_smem.index(WG)  # this warpgroup's Q buffer, free after its last QKᵀ
        o_buf.reshape([BLOCK_M, D]).store(o.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [b, h, rows, 0], o_buf)
        if not PERSISTENT:
            tma.store_wait(pendings=0)
    return t0 + n_tiles


@gluon.jit
def _consumer(q_desc, o_desc, o_ptr, o_strides, q_smem, k_smem, v_smem, o_smem, bars, mask, work, where, N, H,
              GROUP, qk_scale, mask_scale, inv_n, WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr,
              NO_SOFTMAX: gl.constexpr, NO_PV: gl.constexpr, MASK_TMA: gl.constexpr, HEAVY_FIRST: gl.constexpr,
              PERSISTENT: gl.constexpr, O_TMA: gl.constexpr, ROWS: gl.constexpr):
    """One warpgroup: its rows of each of this program's work items (one item unless persistent)."""
    pid, nprog, total = work
    M, smb, smh, smm, smn, mask_desc, mask_smem = mask
    if PERSISTENT:
        t0 = 0
        it = 0
        start, end, step = items(pid, nprog, total, CAUSAL and HEAVY_FIRST)
        for x in range(start, end, step):
            where = step_item(x, work, M, smb, smh, N, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL, HEAVY_FIRST, ROWS)
            t0 = _attend_item(where, t0, it, q_desc, o_desc, o_ptr, o_strides, q_smem, k_smem, v_smem, o_smem, bars,
                              mask, N, qk_scale, mask_scale, inv_n, WG, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                              MASK_KIND, NO_SOFTMAX, NO_PV, MASK_TMA, True, O_TMA, ROWS)
            it += 1
        if O_TMA:
            tma.store_wait(pendings=0)  # the last item's O
    else:
        _attend_item(where, 0, 0, q_desc, o_desc, o_ptr, o_strides, q_smem, k_smem, v_smem, o_smem, bars, mask, N,
                     qk_scale, mask_scale, inv_n, WG, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX,
                     NO_PV, MASK_TMA, False, False, ROWS)


# N is never made a constant: Triton specialises an int argument equal to 1, and at N = 1 with a mask that compile
# fails in the Gluon lowering of the Triton releases attnlab.triton.config.GLUON_TRITON names (PassManager::run
# failed; an offline sm_90a compile fails the same way).
@gluon.jit(do_not_specialize=["N"])
def fused_gluon_kernel(q_desc, k_desc, v_desc, o_desc, o_ptr, sob, soh, son, M, smb, smh, smm, smn, mask_desc, N, H,
                       GROUP, total, qk_scale, mask_scale, inv_n, D: gl.constexpr, BLOCK_M: gl.constexpr,
                       BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr,
                       NO_SOFTMAX: gl.constexpr, NO_PV: gl.constexpr, HEAVY_FIRST: gl.constexpr,
                       MASK_TMA: gl.constexpr, MASK_B: gl.constexpr, MASK_H: gl.constexpr,
                       CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr, PERSISTENT: gl.constexpr = False,
                       O_TMA: gl.constexpr = False, ROWS: gl.constexpr = ROWS_PER_PROGRAM):
    """grid (total,) with total = cdiv(N, 2·BLOCK_M)·B·H work items, one a program; PERSISTENT: any smaller grid
    (one program an SM), each program taking items pid, pid + grid, … . num_warps = 4 (the default partition is
    consumer 0). q/k/v/o descriptors over (B, H or Hkv, N, D) with (1, 1, BLOCK_M or BLOCK_N, D) boxes; o_ptr and
    its (batch, head, row) strides for the persistent kernel's O stores; M the (B, H, N, N)-strided mask or any
    pointer when MASK_KIND = 0; qk_scale = scale·log2 e (natural scale under NO_SOFTMAX). MASK_TMA: the mask tiles
    come through `mask_desc`, a descriptor over the mask's (B or 1, H or 1, N, N) with a (1, 1, 2·BLOCK_M, BLOCK_N)
    box (MASK_B, MASK_H: 1 where the mask varies over batch, heads); else `mask_desc` is an unused placeholder.
    O_TMA (persistent only): O by TMA from (BLOCK_M, D) tiles of shared memory of its own (o_by_tma). ROWS: consumer
    warpgroups a program, 2, or 1 (Tiles.one_consumer: two programs share an SM); total and the
    mask box count ROWS·BLOCK_M rows an item."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [ROWS, 1, 1, BLOCK_M, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], v_desc.layout)
    if MASK_TMA:
        mask_smem = gl.allocate_shared_memory(mask_desc.dtype, [STAGES, 1, 1, ROWS * BLOCK_M, BLOCK_N],
                                              mask_desc.layout)
    else:
        mask_smem = q_smem  # never read
    if O_TMA:
        o_smem = gl.allocate_shared_memory(dtype, [ROWS, 1, 1, BLOCK_M, D], o_desc.layout)
    else:
        o_smem = q_smem  # never read
    q_bars = gl.allocate_shared_memory(gl.int64, [ROWS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [ROWS, 1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(ROWS):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=ROWS)
        mbarrier.init(v_empty.index(i), count=ROWS)
    fence_async_shared()
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    b, h, hk, start_m, n_tiles, m_head = program(pid, M, smb, smh, N, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL,
                                                  HEAVY_FIRST, ROWS)  # one item a program; persistent: its own
    # Each partition's arguments are written out where it is named: a tuple assigned to a name turns its constexprs
    # into tensors.
    if ROWS == 1:  # one consumer (the default partition) and the loader: 8 warps launched, two programs an SM
        gl.warp_specialize([
            (_consumer, (q_desc, o_desc, o_ptr, (sob, soh, son), q_smem, k_smem, v_smem, o_smem,
                         (q_bars, q_empty, k_full, v_full, k_empty, v_empty),
                         (M, smb, smh, smm, smn, mask_desc, mask_smem), (pid, nprog, total),
                         (b, h, hk, start_m, n_tiles, m_head), N, H, GROUP, qk_scale,
                         mask_scale, inv_n, 0, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX, NO_PV,
                         MASK_TMA, HEAVY_FIRST, PERSISTENT, O_TMA, ROWS)),
            (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem,
                       (q_bars, q_empty, k_full, v_full, k_empty, v_empty),
                       (M, smb, smh, smm, smn, mask_desc, mask_smem), (pid, nprog, total),
                       (b, h, hk, start_m, n_tiles, m_head), N, H, GROUP, BLOCK_M, BLOCK_N,
                       STAGES, CAUSAL, HEAVY_FIRST, NO_PV, MASK_TMA, MASK_B, MASK_H, PERSISTENT, ROWS)),
        ], [1], [24])
    else:
        gl.warp_specialize([
            (_consumer, (q_desc, o_desc, o_ptr, (sob, soh, son), q_smem, k_smem, v_smem, o_smem,
                         (q_bars, q_empty, k_full, v_full, k_empty, v_empty),
                         (M, smb, smh, smm, smn, mask_desc, mask_smem), (pid, nprog, total),
                         (b, h, hk, start_m, n_tiles, m_head), N, H, GROUP, qk_scale,
                         mask_scale, inv_n, 0, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX, NO_PV,
                         MASK_TMA, HEAVY_FIRST, PERSISTENT, O_TMA, ROWS)),
            (_consumer, (q_desc, o_desc, o_ptr, (sob, soh, son), q_smem, k_smem, v_smem, o_smem,
                         (q_bars, q_empty, k_full, v_full, k_empty, v_empty),
                         (M, smb, smh, smm, smn, mask_desc, mask_smem), (pid, nprog, total),
                         (b, h, hk, start_m, n_tiles, m_head), N, H, GROUP, qk_scale,
                         mask_scale, inv_n, 1, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX, NO_PV,
                         MASK_TMA, HEAVY_FIRST, PERSISTENT, O_TMA, ROWS)),
            (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem,
                       (q_bars, q_empty, k_full, v_full, k_empty, v_empty),
                       (M, smb, smh, smm, smn, mask_desc, mask_smem), (pid, nprog, total),
                       (b, h, hk, start_m, n_tiles, m_head), N, H, GROUP, BLOCK_M, BLOCK_N,
                       STAGES, CAUSAL, HEAVY_FIRST, NO_PV, MASK_TMA, MASK_B, MASK_H, PERSISTENT, ROWS)),
        ], [4, 1], [CONSUMER_REGS, 24])


def o_by_tma(tiles, D: int, itemsize: int, mask_itemsize: int) -> bool:
    """Whether the persistent kernel stores O by TMA from O tiles of its own (the kernel's O_TMA): Tiles.persistent
    and Tiles.o_tma, and room for them beside Q, the K/V ring and, where the mask comes by TMA, the mask ring
    (mask_itemsize 0 otherwise). At D = 128 with 64×128 tiles and 2 stages a 2-byte mask by TMA leaves none. With
    one consumer (two programs an SM) each program has half the SM: O's tiles never cost the second program."""
    if not (tiles.persistent and tiles.o_tma):
        return False
    BM, BN, st = tiles.BLOCK_M, tiles.BLOCK_N, tiles.num_stages
    rows = partitions(tiles)[0]
    tiles_bytes = (2 * rows * BM * D + 2 * st * BN * D) * itemsize
    mask_bytes = st * rows * BM * BN * mask_itemsize
    return tiles_bytes + mask_bytes + SMEM_SPARE <= smem_limit(tiles)


def o_tma(tiles, mask, D: int, itemsize: int) -> bool:
    """Whether a launch with these tiles stores O by TMA (the kernel's O_TMA): o_by_tma, with the mask ring where the
    mask (its attnlab.triton.layout.MaskLayout, None without one) comes by TMA (common.mask_by_tma). The plan
    (attnlab.triton.plan), the offline compile (attnlab.triton.resources) and so the rows' record take it from here."""
    return o_by_tma(tiles, D, itemsize, mask.itemsize if mask_by_tma(tiles, mask) else 0)


def constexprs(tiles, *, D: int, causal: bool, mask, o_tma: bool, no_softmax: bool = False,
               no_pv: bool = False) -> dict:
    """The kernel's constexpr arguments for these tiles and this call (mask: its layout.MaskLayout or None; o_tma:
    o_tma's answer): what the plan holds and what attnlab.triton.resources compiles offline, from one place so that
    the two cannot drift apart."""
    by_tma = mask_by_tma(tiles, mask)
    return dict(D=D, BLOCK_M=tiles.BLOCK_M, BLOCK_N=tiles.BLOCK_N, STAGES=tiles.num_stages, CAUSAL=causal,
                MASK_KIND=mask.kind if mask else 0, NO_SOFTMAX=no_softmax, NO_PV=no_pv, HEAVY_FIRST=tiles.heavy_first,
                MASK_TMA=by_tma, MASK_B=int(by_tma and mask.vary_b), MASK_H=int(by_tma and mask.vary_h),
                CONSUMER_REGS=CONSUMER_REGS, PERSISTENT=tiles.persistent, O_TMA=o_tma, ROWS=partitions(tiles)[0])


def run(plan, q, k, v, o, mask, mask_strides, N, H, group, qk_scale, mask_scale, inv_n) -> None:
    """Run the kernel as `plan` (attnlab.triton.plan.FusedGluonPlan) says on checked (B, H, N, D) tensors
    (attnlab.triton.launch.fused calls it). Under its MASK_TMA the mask comes through the loader warp, else by the
    consumers' loads; q, k, v and o where TMA cannot read them as they lie go through aligned copies."""
    q, k, v = tma_ready(q), tma_ready(k), tma_ready(v)
    o_t = tma_ready(o)
    q_box, kv_box, o_box = plan.boxes
    q_desc = described(q, q_box)
    mask_desc = mask_descriptor(mask, plan.mask_rows, plan.BLOCK_N)[0] if plan.constexprs["MASK_TMA"] else q_desc
    direct.run(fused_gluon_kernel, plan, q_desc, described(k, kv_box), described(v, kv_box), described(o_t, o_box),
               o_t, *o_t.stride()[:3], mask, *mask_strides, mask_desc, N, H, group, plan.total, qk_scale, mask_scale,
               inv_n)
    if o_t is not o:
        o.copy_(o_t)
