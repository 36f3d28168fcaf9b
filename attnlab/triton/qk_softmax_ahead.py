"""The qk_softmax build's P kernel with pass 1 in a warpgroup of its own, an item ahead (Tiles.pass1_ahead, label `j`;
PERFORMANCE.md v41). Hopper, Gluon; D = 64 or 128, fp16 or bf16, N a multiple of 8, no mask, not causal, not the
no_softmax ablation (qk_softmax_gluon.as_run sends those calls to the two-pass kernel).

Why: the two-pass kernel (attnlab.triton.qk_softmax_gluon) runs pass 1 (each row's max and sum: a QKᵀ and a tile of
exponentials a key tile, nothing written) and then pass 2 (the QKᵀ again, P written) in the same two consumer
warpgroups, one after the other, so while an SM is in pass 1 it stores nothing: at D = 64, N = 4096 the P kernel is its
one writing pass (1.29 ms, P's stores about as fast as a kernel that stores zeros) plus 0.74 ms of pass 1 (v35).
Every earlier attempt to run one pass beside the other (v14 paired, v15 staggered, v25 consumers a pass apart, v33
chained) did so in the same warps, or took a storing consumer away; here the two passes run in different warps:
  * two consumer warpgroups (BLOCK_M rows each) run only pass 2 — the QKᵀ, P = 2^(s·c − bias), P by TMA from two
    buffers each — exactly qk_softmax_gluon's writing pass, over a K ring of their own;
  * two more warpgroups run pass 1 of the *next* item, one for each consumer's rows (qk_softmax_gluon._pass, not
    writing, over a second K ring of P1_N-key tiles), and hand each row's bias = max + log2(sum) to the consumers
    through shared memory (two slots, `full`/`empty` mbarriers), so their matmuls and exponentials run under the
    consumers' stores (session 23's first form, one pass-1 warpgroup for both consumers' rows, was the slowest part
    of its program: v41);
  * two loader warps, one a ring: one brings each item's Q (two slots, released by all three warpgroups) and the
    pass-1 ring's K tiles, the other the consumers' ring.
Persistent: one program an SM takes items pid, pid + grid, … (fused_gluon._items). Each score is still computed twice
and exponentiated twice; what changes is that the writes no longer wait for pass 1.

Registers are the limit: 18 warps launch as 20 at MAXNREG registers a thread, which setmaxnreg shares out as
PASS1_REGS for each pass-1 warpgroup, 24 for the loaders' warpgroup and the rest, alike, for the two consumers.
"""
from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from attnlab.triton.fused_gluon import SMEM_SPARE, _items, _step_item, descriptor, sm_count, smem_limit, tma_ready
from attnlab.triton.qk_softmax_gluon import PBUF, _bias, _load_k, _next_scores, _pass, _scores_done, _step

P1_N = 64  # keys a pass-1 tile (two 64 × 64 fp32 score tiles live at once: one in flight)
P1_STAGES = 4  # the pass-1 ring's slots
# 18 warps launch as 20 (five warpgroups: two consumers, two pass-1, the loaders'), 96 registers a thread: 5 · 96 =
# 480 a warpgroup's thread to share out by setmaxnreg, 24 of them the loaders'
MAXNREG = 96
PASS1_REGS = 112  # setmaxnreg of each pass-1 warpgroup (a multiple of 8)
CONSUMER_REGS = (5 * MAXNREG - 24 - 2 * PASS1_REGS) // 2 // 8 * 8  # each consumer's: the rest
IN_FLIGHT = False  # True: consumers keep the next tile's QKᵀ in flight (qk_softmax_gluon._pass; spills at 120)


@gluon.jit
def _q_loader(q_desc, k1_desc, q_smem, k1_smem, bars, work, M, N, H, GROUP, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, P1N: gl.constexpr, STAGES1: gl.constexpr):
    """One warp: each item's Q (both consumers' rows, into slot it % 2 once all three warpgroups have released the
    item two before) and the pass-1 ring's K tiles."""
    q_full, q_empty, k1_full, k1_empty = bars
    pid, nprog, total = work
    no_mask = (k1_desc, k1_smem, 0, 0, 0)  # _load_k's mask box, unused without MASK_TMA
    t0 = 0
    it = 0
    start, end, step = _items(pid, nprog, total, False)
    for x in range(start, end, step):
        b, h, hk, start_m, n_tiles, m_head = _step_item(x, work, M, 0, 0, N, H, GROUP, BLOCK_M, BLOCK_N, False,
                                                        False, 2)
        slot = it % 2
        mbarrier.wait(q_empty.index(slot), ((it // 2) & 1) ^ 1)  # a fresh barrier passes the phase before 0
        mbarrier.expect(q_full.index(slot), 2 * q_desc.block_type.nbytes)
        for w in gl.static_range(2):
            tma.async_copy_global_to_shared(q_desc, [b, h, start_m + w * BLOCK_M, 0], q_full.index(slot),
                                            q_smem.index(2 * slot + w))
        n1 = gl.cdiv(N, P1N)
        for t in range(n1):
            _load_k(t0 + t, t, k1_desc, k1_smem, k1_full, k1_empty, b, hk, no_mask, P1N, STAGES1, False)
        t0 += n1
        it += 1


@gluon.jit
def _k_loader(k_desc, k_smem, bars, work, M, N, H, GROUP, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr):
    """One warp: the consumers' ring, each item's K tiles once (both consumers read each slot: `empty` counts 2)."""
    k_full, k_empty = bars
    pid, nprog, total = work
    no_mask = (k_desc, k_smem, 0, 0, 0)
    t0 = 0
    start, end, step = _items(pid, nprog, total, False)
    for x in range(start, end, step):
        b, h, hk, start_m, n_tiles, m_head = _step_item(x, work, M, 0, 0, N, H, GROUP, BLOCK_M, BLOCK_N, False,
                                                        False, 2)
        for t in range(n_tiles):
            _load_k(t0 + t, t, k_desc, k_smem, k_full, k_empty, b, hk, no_mask, BLOCK_N, STAGES, False)
        t0 += n_tiles


@gluon.jit
def _pass1(q_smem, k1_smem, stats_smem, bars, work, M, N, H, GROUP, qk_scale, HALF: gl.constexpr, D: gl.constexpr,
           BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, P1N: gl.constexpr, STAGES1: gl.constexpr):
    """One of the two pass-1 warpgroups: pass 1 (qk_softmax_gluon._pass, not writing) of consumer HALF's BLOCK_M rows
    of each item over the pass-1 ring, then their bias into stats slot it % 2."""
    q_full, q_empty, k1_full, k1_empty, b_full, b_empty = bars
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, P1N, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols = gl.arange(0, P1N, gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([BLOCK_M, P1N], gl.float32, s_layout)
    pid, nprog, total = work
    t0 = 0
    it = 0
    start, end, step = _items(pid, nprog, total, False)
    for x in range(start, end, step):
        b, h, hk, start_m, n_tiles, m_head = _step_item(x, work, M, 0, 0, N, H, GROUP, BLOCK_M, BLOCK_N, False,
                                                        False, 2)
        slot = it % 2
        rows = start_m + HALF * BLOCK_M
        offs_m = rows + gl.arange(0, BLOCK_M, row_s)
        m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
        mbarrier.wait(q_full.index(slot), (it // 2) & 1)
        q = q_smem.index(2 * slot + HALF).reshape([BLOCK_M, D])
        n1 = gl.cdiv(N, P1N)
        m_i, l_i = _pass(q, k1_smem, k1_full, k1_empty, q_empty.index(slot), t0, n1, zero_s, m_i, l_i, m_i, q_smem,
                         q_smem, 0, 0, b, h, rows, N, offs_m, q_smem, offs_m, cols, N, 0, qk_scale, 1.0, False, True,
                         D, P1N, STAGES1, False, 0, False, False, HALF, 2, False)
        mbarrier.wait(b_empty.index(slot), ((it // 2) & 1) ^ 1)  # the consumers have the bias of two items before
        stats_smem.index(2 * slot + HALF).store(_bias(m_i, l_i))
        gl.thread_barrier()  # the warpgroup's stores before its one arrival
        mbarrier.arrive(b_full.index(slot), count=1)
        t0 += n1
        it += 1


@gluon.jit
def _consumer(q_smem, k_smem, p_smem, stats_smem, p_desc, bars, work, M, N, H, GROUP, qk_scale, WG: gl.constexpr,
              D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              IN_FLIGHT: gl.constexpr):
    """One warpgroup: its BLOCK_M rows of each item, pass 2 only (qk_softmax_gluon._pass writing P), with the bias
    the pass-1 warpgroup left in stats slot it % 2."""
    q_full, q_empty, k_full, k_empty, b_full, b_empty = bars
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    slot0: gl.constexpr = WG * PBUF  # this warpgroup's P buffers in p_smem
    pid, nprog, total = work
    t0 = 0
    pbase = 0
    it = 0
    start, end, step = _items(pid, nprog, total, False)
    for x in range(start, end, step):
        b, h, hk, start_m, n_tiles, m_head = _step_item(x, work, M, 0, 0, N, H, GROUP, BLOCK_M, BLOCK_N, False,
                                                        False, 2)
        slot = it % 2
        rows = start_m + WG * BLOCK_M
        offs_m = rows + gl.arange(0, BLOCK_M, row_s)
        mbarrier.wait(b_full.index(slot), (it // 2) & 1)
        bias = stats_smem.index(2 * slot + WG).load(row_s)
        gl.thread_barrier()  # every thread's load before the warpgroup's one arrival
        mbarrier.arrive(b_empty.index(slot), count=1)
        mbarrier.wait(q_full.index(slot), (it // 2) & 1)
        q = q_smem.index(2 * slot + WG).reshape([BLOCK_M, D])
        if IN_FLIGHT:  # the next tile's QKᵀ on the tensor cores while this one's P is made
            _pass(q, k_smem, k_full, k_empty, q_empty.index(slot), t0, n_tiles, zero_s, bias, bias, bias, p_desc,
                  p_smem, slot0, pbase, b, h, rows, N, offs_m, p_smem, offs_m, cols, N, 0, qk_scale, 1.0, True, True,
                  D, BLOCK_N, STAGES, False, 0, False, False, WG, 2, False)
        else:  # one QKᵀ at a time: the other two warpgroups' matmuls fill the tensor cores
            masks = (offs_m, p_smem, k_empty)
            for j in range(n_tiles):
                s = _scores_done(_next_scores(q, k_smem, k_full, t0 + j, zero_s, BLOCK_N, D, STAGES), k_empty,
                                 t0 + j, STAGES, False)
                if j == n_tiles - 1:
                    mbarrier.arrive(q_empty.index(slot), count=1)  # the item's last QKᵀ has read Q
                _step(s, j, t0 + j, bias, bias, bias, p_desc, p_smem, slot0, pbase, b, h, rows, N, masks, offs_m,
                      cols, N, 0, qk_scale, 1.0, True, BLOCK_N, STAGES, False, 0, False, False, WG, 2, False)
        t0 += n_tiles
        pbase += n_tiles
        it += 1
    tma.store_wait(pendings=0)


# N is never made a constant (attnlab.triton.fused_gluon: N = 1 with a mask fails to compile in Triton 3.6 if it is).
@gluon.jit(do_not_specialize=["N"])
def qk_softmax_ahead_kernel(q_desc, k_desc, k1_desc, p_desc, M, N, H, GROUP, total, qk_scale, D: gl.constexpr,
                            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, P1N: gl.constexpr,
                            STAGES1: gl.constexpr, CONSUMER_REGS: gl.constexpr, PASS1_REGS: gl.constexpr,
                            IN_FLIGHT: gl.constexpr, num_warps: gl.constexpr):
    """Persistent grid (≤ one program an SM) over total = cdiv(N, 2·BLOCK_M)·B·H items of 2·BLOCK_M rows;
    num_warps = 4. q_desc over (B, H, N, D) with a (1, 1, BLOCK_M, D) box, k_desc and k1_desc over (B, Hkv, N, D)
    with (1, 1, BLOCK_N or P1N, D) boxes, p_desc over the contiguous (B, H, N, N) P with a (1, 1, BLOCK_M, BLOCK_N)
    box; M any pointer (items carry a mask pointer this kernel never reads); qk_scale = scale·log2 e."""
    dtype: gl.constexpr = q_desc.dtype
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    q_smem = gl.allocate_shared_memory(dtype, [4, 1, 1, BLOCK_M, D], q_desc.layout)  # 2 slots × 2 consumers' rows
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], k_desc.layout)
    k1_smem = gl.allocate_shared_memory(dtype, [STAGES1, 1, 1, P1N, D], k1_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [2 * PBUF, 1, 1, BLOCK_M, BLOCK_N], p_desc.layout)
    flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])  # rows of floats
    stats_smem = gl.allocate_shared_memory(gl.float32, [4, BLOCK_M], flat)  # 2 slots × 2 consumers' rows
    q_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    b_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    b_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k1_full = gl.allocate_shared_memory(gl.int64, [STAGES1, 1], mbarrier.MBarrierLayout())
    k1_empty = gl.allocate_shared_memory(gl.int64, [STAGES1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_full.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=4)  # both pass-1 warpgroups and both consumers
        mbarrier.init(b_full.index(i), count=2)
        mbarrier.init(b_empty.index(i), count=2)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
    for i in gl.static_range(STAGES1):
        mbarrier.init(k1_full.index(i), count=1)
        mbarrier.init(k1_empty.index(i), count=2)
    fence_async_shared()
    # Each partition's arguments are written out where it is named: a tuple assigned to a name turns its constexprs
    # into tensors.
    gl.warp_specialize([
        (_consumer, (q_smem, k_smem, p_smem, stats_smem, p_desc, (q_full, q_empty, k_full, k_empty, b_full, b_empty),
                     (pid, nprog, total), M, N, H, GROUP, qk_scale, 0, D, BLOCK_M, BLOCK_N, STAGES, IN_FLIGHT)),
        (_consumer, (q_smem, k_smem, p_smem, stats_smem, p_desc, (q_full, q_empty, k_full, k_empty, b_full, b_empty),
                     (pid, nprog, total), M, N, H, GROUP, qk_scale, 1, D, BLOCK_M, BLOCK_N, STAGES, IN_FLIGHT)),
        (_pass1, (q_smem, k1_smem, stats_smem, (q_full, q_empty, k1_full, k1_empty, b_full, b_empty),
                  (pid, nprog, total), M, N, H, GROUP, qk_scale, 0, D, BLOCK_M, BLOCK_N, P1N, STAGES1)),
        (_pass1, (q_smem, k1_smem, stats_smem, (q_full, q_empty, k1_full, k1_empty, b_full, b_empty),
                  (pid, nprog, total), M, N, H, GROUP, qk_scale, 1, D, BLOCK_M, BLOCK_N, P1N, STAGES1)),
        (_q_loader, (q_desc, k1_desc, q_smem, k1_smem, (q_full, q_empty, k1_full, k1_empty), (pid, nprog, total), M,
                     N, H, GROUP, BLOCK_M, BLOCK_N, P1N, STAGES1)),
        (_k_loader, (k_desc, k_smem, (k_full, k_empty), (pid, nprog, total), M, N, H, GROUP, BLOCK_M, BLOCK_N,
                     STAGES)),
    ], [4, 4, 4, 1, 1], [CONSUMER_REGS, PASS1_REGS, PASS1_REGS, 24, 24])


def smem_bytes(tiles, D: int, itemsize: int, p1_stages: int = P1_STAGES) -> int:
    """A program's shared memory: two slots of both consumers' Q, the consumers' K ring, the pass-1 ring, the P
    buffers, the bias slots and the barriers' spare."""
    BM, BN = tiles.BLOCK_M, tiles.BLOCK_N
    return ((4 * BM * D + tiles.num_stages * BN * D + p1_stages * P1_N * D + 2 * PBUF.value * BM * BN) * itemsize
            + 4 * BM * 4 + SMEM_SPARE)


def pass1_stages(tiles, D: int, itemsize: int) -> int:
    """The pass-1 ring's slots: P1_STAGES where they fit, else as many as do (at least 2; 0: none fit)."""
    for s in range(P1_STAGES, 1, -1):
        if smem_bytes(tiles, D, itemsize, s) <= smem_limit(tiles):
            return s
    return 0


def fits(tiles, D: int, itemsize: int) -> bool:
    """Whether this kernel can run these tiles: two consumers of BLOCK_M = 64 rows (the pass-1 warpgroup's halves),
    and a pass-1 ring of at least two slots beside everything else in a program's shared memory."""
    return tiles.BLOCK_M == 64 and not tiles.one_consumer and pass1_stages(tiles, D, itemsize) >= 2


def launch(q, k, p, *, N, H, group, qk_scale, tiles) -> None:
    """Write P for checked (B, H, N, D) q and k into the contiguous (B, H, N, N) p (qk_softmax_gluon.launch sends
    Tiles.pass1_ahead here for unmasked, non-causal calls; ValueError where the tiles do not `fit`)."""
    D, itemsize = q.shape[-1], q.element_size()
    if not fits(tiles, D, itemsize):
        raise ValueError(f"tiles {tiles}: pass 1 a warpgroup ahead needs BLOCK_M = 64, two consumers and a pass-1 "
                         f"ring of 2 or more slots in the {smem_limit(tiles)} bytes of shared memory a program has "
                         f"(2 slots: {smem_bytes(tiles, D, itemsize, 2)})")
    q, k = tma_ready(q), tma_ready(k)
    total = triton.cdiv(N, 2 * tiles.BLOCK_M) * q.shape[0] * H
    grid = (min(total, sm_count(q.device)),)
    qk_softmax_ahead_kernel[grid](descriptor(q, tiles.BLOCK_M), descriptor(k, tiles.BLOCK_N), descriptor(k, P1_N),
                                  descriptor(p, tiles.BLOCK_M, tiles.BLOCK_N), p, N, H, group, total, qk_scale,
                                  **constexprs(tiles, D=D, itemsize=itemsize), num_warps=4, maxnreg=MAXNREG)


def constexprs(tiles, *, D: int, itemsize: int) -> dict:
    """The kernel's constexpr arguments: what `launch` passes and what attnlab.triton.resources compiles offline."""
    return dict(D=D, BLOCK_M=tiles.BLOCK_M, BLOCK_N=tiles.BLOCK_N, STAGES=tiles.num_stages, P1N=P1_N,
                STAGES1=pass1_stages(tiles, D, itemsize), CONSUMER_REGS=CONSUMER_REGS, PASS1_REGS=PASS1_REGS,
                IN_FLIGHT=IN_FLIGHT)
