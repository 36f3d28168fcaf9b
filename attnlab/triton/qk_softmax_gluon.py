"""The qk_softmax build's Hopper kernel, written in Gluon: the same two passes as attnlab.triton.qk_softmax (row max
and sum, then P written once), warp specialised so that the P writes, the matmuls and the exponentials can overlap
(PERFORMANCE.md v12: 1.05–1.45× the Triton kernel's build from N = 1024; by the arithmetic there, the exponentials are
still mostly not hidden under the matmuls). It compiles for D = 64 and 128 exactly, fp16 and bf16, and takes N a multiple of 8 (P's rows are
then 16-byte aligned, which TMA needs) from N = 1024 on; at other N the Triton kernel runs.

Why: P is the build's traffic (N² elements written here, read by the PV kernel), and the Triton kernel's loop does
matmul, exponentials and stores one after the other in every warp. Here
  * a loader warp streams the K tiles by TMA into a ring of STAGES slots, once for each pass (full/empty mbarriers,
    as in attnlab.triton.fused_gluon);
  * two consumer warpgroups of BLOCK_M rows each issue the next tile's QKᵀ before working on this one's scores
    (so the matmul can run on the tensor cores while the exponentials run), and
  * write each P tile by TMA from a pair of shared-memory buffers: the store drains while the next tiles are
    computed. Under a causal mask the zero tiles past the diagonal are stored first, from a zeroed buffer, while
    pass 1 computes.
Scores, masks and the online max/sum are attnlab.triton.fused_gluon's functions: the same arithmetic as the fused
kernel's, flag for flag (masks, causal, ragged N, GQA, the no_softmax ablation writing P = S).
"""
from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from attnlab.triton.fused_gluon import (HEAD_DIMS, MAXNREG, ROWS_PER_PROGRAM, _needs_masks, _program, _scores,
                                        _tile, compiles_for, descriptor, tma_ready)

PBUF = gl.constexpr(2)  # P buffers per consumer: one being filled while the other's store drains
CONSUMER_REGS = 232  # setmaxnreg of the consumer warpgroups (a multiple of 8; the loader gets 24)


@gluon.jit
def _loader(q_desc, k_desc, q_smem, k_smem, bars, b, h, hk, start_m, n_tiles, BLOCK_M: gl.constexpr,
            BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """One warp: both consumers' Q, then the K tiles once per pass into the ring; a slot is refilled once both
    consumers have arrived on its `empty` barrier (count 2)."""
    q_bars, k_full, k_empty = bars
    for w in gl.static_range(ROWS_PER_PROGRAM):
        mbarrier.expect(q_bars.index(w), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, start_m + w * BLOCK_M, 0], q_bars.index(w), q_smem.index(w))
    passes = 1 if NO_SOFTMAX else 2
    for t in range(passes * n_tiles):
        st = t % STAGES
        mbarrier.wait(k_empty.index(st), ((t // STAGES) & 1) ^ 1)  # a fresh barrier passes the phase before 0
        mbarrier.expect(k_full.index(st), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, hk, (t % n_tiles) * BLOCK_N, 0], k_full.index(st),
                                        k_smem.index(st))


@gluon.jit
def _next_scores(q, k_smem, k_full, t, zero_s, BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr):
    """Issue QKᵀ of ring tile t asynchronously (once the loader's bytes are there)."""
    st = t % STAGES
    mbarrier.wait(k_full.index(st), (t // STAGES) & 1)
    return warpgroup_mma(q, k_smem.index(st).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                         is_async=True)


@gluon.jit
def _scores_done(s_next, k_empty, t, STAGES: gl.constexpr):
    """Wait for ring tile t's QKᵀ and hand its K slot back to the loader."""
    s = warpgroup_mma_wait(num_outstanding=0, deps=[s_next])
    mbarrier.arrive(k_empty.index(t % STAGES), count=1)
    return s


@gluon.jit
def _probabilities(s, bias, qk_scale, SCALED: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """P from a score tile and the row's bias = max + log2(sum): 2^(s − max) / sum as one exp2 whose argument
    carries the division (one FFMA and one MUFU an element, no multiply by 1/sum: PERFORMANCE.md v14). s is raw q·kᵀ
    unless _scores SCALED it (its masked form); under no_softmax, P is S itself with masked entries 0."""
    if NO_SOFTMAX:
        p = gl.where(s == float("-inf"), 0.0, s)
    elif SCALED:
        p = gl.exp2(s - bias[:, None])
    else:
        p = gl.exp2(s * qk_scale - bias[:, None])
    return p


@gluon.jit
def _bias(m_i, l_i):
    """max + log2(sum) of each row after pass 1; a row the mask hides entirely (max −inf, sum 0) gets 0, so its P is
    2^−inf = 0."""
    m_safe = gl.where(m_i == -float("inf"), 0.0, m_i)
    return m_safe + gl.log2(gl.where(l_i == 0.0, 1.0, l_i))


@gluon.jit
def _write_tile(s, j, bias, p_desc, p_smem, slot0, b, h, rows, hi, mask_rows, offs_m, cols, N, smn, qk_scale,
                mask_scale, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr,
                NO_SOFTMAX: gl.constexpr):
    """P of key tile j (normalised with the row's bias, or S itself under no_softmax) into buffer
    slot0 + j % PBUF, then a TMA store of it; the store that last read that buffer must have finished first."""
    offs_n = j * BLOCK_N + cols
    if _needs_masks(j, rows, hi, BLOCK_N, CAUSAL):
        s = _scores(s, mask_rows, mask_rows, offs_m, offs_n, N, smn, qk_scale, mask_scale, True, CAUSAL, MASK_KIND,
                    NO_SOFTMAX, False)
        p = _probabilities(s, bias, qk_scale, True, NO_SOFTMAX)
    else:
        s = _scores(s, mask_rows, mask_rows, offs_m, offs_n, N, smn, qk_scale, mask_scale, False, CAUSAL,
                    MASK_KIND, NO_SOFTMAX, False)
        p = _probabilities(s, bias, qk_scale, MASK_KIND != 0 or NO_SOFTMAX, NO_SOFTMAX)
    buf = p_smem.index(slot0 + j % PBUF)
    tma.store_wait(pendings=PBUF - 1)
    buf.reshape([buf.type.shape[2], buf.type.shape[3]]).store(p.to(p_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(p_desc, [b, h, rows, j * BLOCK_N], buf)


@gluon.jit
def _step(s, j, m_i, l_i, bias, p_desc, p_smem, slot0, b, h, rows, hi, mask_rows, offs_m, cols, N, smn,
          qk_scale, mask_scale, WRITE: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
          MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """Key tile j of a pass: pass 1 folds it into the running max and sum, pass 2 (WRITE) writes its P."""
    if WRITE:
        _write_tile(s, j, bias, p_desc, p_smem, slot0, b, h, rows, hi, mask_rows, offs_m, cols, N, smn,
                    qk_scale, mask_scale, BLOCK_N, CAUSAL, MASK_KIND, NO_SOFTMAX)
    else:
        p, m_i, l_i, alpha, offs_n = _tile(s, m_i, l_i, j, rows, hi, mask_rows, mask_rows, offs_m, cols, N, smn,
                                           qk_scale, mask_scale, BLOCK_N, CAUSAL, MASK_KIND, False, False)
    return m_i, l_i


@gluon.jit
def _pass(q, k_smem, k_full, k_empty, base, j0, n_tiles, zero_s, m_i, l_i, bias, p_desc, p_smem, slot0, b, h, rows,
          hi, mask_rows, offs_m, cols, N, smn, qk_scale, mask_scale, WRITE: gl.constexpr, D: gl.constexpr,
          BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr,
          NO_SOFTMAX: gl.constexpr):
    """One pass over key tiles j0 … n_tiles − 1 (ring tiles base onwards), two at a time: the next tile's QKᵀ is on
    the tensor cores while this one's scores are worked on. Two at a time because the in-flight result must not be
    the value the loop carries while the previous one is still read: a one-tile loop makes the compiler copy an
    in-flight accumulator on the back edge, and ptxas then serialises every matmul (C7514; PERFORMANCE.md v12).
    Every matmul a pass starts, it waits for. At least one tile."""
    count = n_tiles - j0
    s_flight = _next_scores(q, k_smem, k_full, base, zero_s, BLOCK_N, D, STAGES)
    for i in range((count - 1) // 2):
        t = base + 2 * i
        j = j0 + 2 * i
        s_a = _scores_done(s_flight, k_empty, t, STAGES)
        s_b_flight = _next_scores(q, k_smem, k_full, t + 1, zero_s, BLOCK_N, D, STAGES)
        m_i, l_i = _step(s_a, j, m_i, l_i, bias, p_desc, p_smem, slot0, b, h, rows, hi, mask_rows, offs_m, cols, N,
                         smn, qk_scale, mask_scale, WRITE, BLOCK_N, CAUSAL, MASK_KIND, NO_SOFTMAX)
        s_b = _scores_done(s_b_flight, k_empty, t + 1, STAGES)
        s_flight = _next_scores(q, k_smem, k_full, t + 2, zero_s, BLOCK_N, D, STAGES)
        m_i, l_i = _step(s_b, j + 1, m_i, l_i, bias, p_desc, p_smem, slot0, b, h, rows, hi, mask_rows, offs_m, cols,
                         N, smn, qk_scale, mask_scale, WRITE, BLOCK_N, CAUSAL, MASK_KIND, NO_SOFTMAX)
    jj = 2 * ((count - 1) // 2)  # one tile left (count odd) or two
    t = base + jj
    j = j0 + jj
    s_a = _scores_done(s_flight, k_empty, t, STAGES)
    if jj + 1 < count:
        s_b_flight = _next_scores(q, k_smem, k_full, t + 1, zero_s, BLOCK_N, D, STAGES)
        m_i, l_i = _step(s_a, j, m_i, l_i, bias, p_desc, p_smem, slot0, b, h, rows, hi, mask_rows, offs_m, cols, N,
                         smn, qk_scale, mask_scale, WRITE, BLOCK_N, CAUSAL, MASK_KIND, NO_SOFTMAX)
        s_b = _scores_done(s_b_flight, k_empty, t + 1, STAGES)
        m_i, l_i = _step(s_b, j + 1, m_i, l_i, bias, p_desc, p_smem, slot0, b, h, rows, hi, mask_rows, offs_m, cols,
                         N, smn, qk_scale, mask_scale, WRITE, BLOCK_N, CAUSAL, MASK_KIND, NO_SOFTMAX)
    else:
        m_i, l_i = _step(s_a, j, m_i, l_i, bias, p_desc, p_smem, slot0, b, h, rows, hi, mask_rows, offs_m, cols, N,
                         smn, qk_scale, mask_scale, WRITE, BLOCK_N, CAUSAL, MASK_KIND, NO_SOFTMAX)
    return m_i, l_i


@gluon.jit
def _consumer(q_smem, k_smem, p_smem, p_desc, bars, mask, b, h, start_m, n_tiles, N, qk_scale, mask_scale,
              WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """One warpgroup, rows start_m + WG·BLOCK_M onwards: zero tiles (causal), pass 1 (max and sum), pass 2 (P)."""
    q_bars, k_full, k_empty = bars
    m_head, smm, smn = mask
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows = start_m + WG * BLOCK_M
    offs_m = rows + gl.arange(0, BLOCK_M, row_s)
    cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    mask_rows = m_head + offs_m.to(gl.int64) * smm  # int64: row · N overflows past N = 46340
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    slot0: gl.constexpr = WG * PBUF  # this warpgroup's P buffers in p_smem
    hi = N
    if CAUSAL:
        hi = gl.minimum(N, rows + BLOCK_M)
        # The tiles past the program's diagonal hold zeros (written as the materialised build's softmax writes
        # them): stored now from a zeroed buffer, so the copy engine drains them while pass 1 computes.
        zbuf = p_smem.index(slot0)
        zbuf.reshape([BLOCK_M, BLOCK_N]).store(zero_s.to(p_desc.dtype))
        fence_async_shared()
        for j in range(n_tiles, gl.cdiv(N, BLOCK_N)):
            tma.async_copy_shared_to_global(p_desc, [b, h, rows, j * BLOCK_N], zbuf)

    mbarrier.wait(q_bars.index(WG), 0)
    q = q_smem.index(WG).reshape([BLOCK_M, D])
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    if NO_SOFTMAX:
        base = 0
    else:  # pass 1: the row max and sum
        m_i, l_i = _pass(q, k_smem, k_full, k_empty, 0, 0, n_tiles, zero_s, m_i, l_i, m_i, p_desc, p_smem, slot0,
                         b, h, rows, hi, mask_rows, offs_m, cols, N, smn, qk_scale, mask_scale, False, D, BLOCK_N,
                         STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX)
        base = n_tiles
    bias = _bias(m_i, l_i)
    if CAUSAL:
        tma.store_wait(pendings=0)  # the zero buffer is P buffer 0, written again below
    _pass(q, k_smem, k_full, k_empty, base, 0, n_tiles, zero_s, m_i, l_i, bias, p_desc, p_smem, slot0, b, h, rows,
          hi, mask_rows, offs_m, cols, N, smn, qk_scale, mask_scale, True, D, BLOCK_N, STAGES, CAUSAL, MASK_KIND,
          NO_SOFTMAX)
    tma.store_wait(pendings=0)


# Partition entry points. gl.warp_specialize calls every worker with the same argument tuple, so all three take it.
@gluon.jit
def _consumer0(q_desc, k_desc, p_desc, q_smem, k_smem, p_smem, bars, mask, b, h, hk, start_m, n_tiles, N, qk_scale,
               mask_scale, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
               CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    _consumer(q_smem, k_smem, p_smem, p_desc, bars, mask, b, h, start_m, n_tiles, N, qk_scale, mask_scale, 0, D,
              BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX)


@gluon.jit
def _consumer1(q_desc, k_desc, p_desc, q_smem, k_smem, p_smem, bars, mask, b, h, hk, start_m, n_tiles, N, qk_scale,
               mask_scale, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
               CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    _consumer(q_smem, k_smem, p_smem, p_desc, bars, mask, b, h, start_m, n_tiles, N, qk_scale, mask_scale, 1, D,
              BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX)


@gluon.jit
def _load(q_desc, k_desc, p_desc, q_smem, k_smem, p_smem, bars, mask, b, h, hk, start_m, n_tiles, N, qk_scale,
          mask_scale, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
          CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    _loader(q_desc, k_desc, q_smem, k_smem, bars, b, h, hk, start_m, n_tiles, BLOCK_M, BLOCK_N, STAGES, NO_SOFTMAX)


# N is never made a constant (attnlab.triton.fused_gluon: N = 1 with a mask fails to compile in Triton 3.6 if it is).
@gluon.jit(do_not_specialize=["N"])
def qk_softmax_gluon_kernel(q_desc, k_desc, p_desc, M, smb, smh, smm, smn, N, H, GROUP, qk_scale, mask_scale,
                            D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                            CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr,
                            HEAVY_FIRST: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """grid (cdiv(N, 2·BLOCK_M), B·H), num_warps = 4. q/k descriptors over (B, H or Hkv, N, D) with (1, 1, BLOCK_M or
    BLOCK_N, D) boxes; p_desc over the contiguous (B, H, N, N) P with a (1, 1, BLOCK_M, BLOCK_N) box; M the
    (B, H, N, N)-strided mask or any pointer when MASK_KIND = 0; qk_scale = scale·log2 e (natural scale under
    NO_SOFTMAX)."""
    dtype: gl.constexpr = q_desc.dtype
    b, h, hk, start_m, n_tiles, m_head = _program(M, smb, smh, N, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL, HEAVY_FIRST)

    q_smem = gl.allocate_shared_memory(dtype, [ROWS_PER_PROGRAM, 1, 1, BLOCK_M, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], k_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [ROWS_PER_PROGRAM * PBUF, 1, 1, BLOCK_M, BLOCK_N],
                                     p_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [ROWS_PER_PROGRAM, 1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(ROWS_PER_PROGRAM):
        mbarrier.init(q_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=ROWS_PER_PROGRAM)
    fence_async_shared()
    bars = (q_bars, k_full, k_empty)
    mask = (m_head, smm, smn)
    # The argument tuple is written out three times: a tuple assigned to a name turns its constexprs into tensors.
    gl.warp_specialize([
        (_consumer0, (q_desc, k_desc, p_desc, q_smem, k_smem, p_smem, bars, mask, b, h, hk, start_m, n_tiles, N,
                      qk_scale, mask_scale, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX)),
        (_consumer1, (q_desc, k_desc, p_desc, q_smem, k_smem, p_smem, bars, mask, b, h, hk, start_m, n_tiles, N,
                      qk_scale, mask_scale, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX)),
        (_load, (q_desc, k_desc, p_desc, q_smem, k_smem, p_smem, bars, mask, b, h, hk, start_m, n_tiles, N,
                 qk_scale, mask_scale, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX)),
    ], [4, 1], [CONSUMER_REGS, 24])


# ---- The paired kernel (Tiles.paired; PERFORMANCE.md v14): a program owns BLOCKS consecutive blocks of 2·BLOCK_M rows
# of one head and runs block i's pass 2 in the same loop as block i+1's pass 1, so every K tile feeds two matmuls and
# every loop step has exponentials, matmuls and a P store in it (the unpaired kernel's pass 1 stores nothing and its
# pass 2 is store-bound, and all programs of a wave are in the same pass at once).

@gluon.jit
def _block_tiles(start, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Key tiles the block of 2·BLOCK_M rows from `start` visits (as attnlab.triton.fused_gluon._program counts)."""
    hi = N
    if CAUSAL:
        hi = gl.minimum(N, start + ROWS_PER_PROGRAM * BLOCK_M)
    return gl.cdiv(hi, BLOCK_N)


@gluon.jit
def _rows(start, WG: gl.constexpr, N, m_head, smm, BLOCK_M: gl.constexpr, row_s: gl.constexpr,
          CAUSAL: gl.constexpr):
    """This warpgroup's rows of the block from `start`: first row, the end of the keys they see, the mask rows'
    addresses and the row indices."""
    rows = start + WG * BLOCK_M
    offs_m = rows + gl.arange(0, BLOCK_M, row_s)
    mask_rows = m_head + offs_m.to(gl.int64) * smm  # int64: row · N overflows past N = 46340
    hi = N
    if CAUSAL:
        hi = gl.minimum(N, rows + BLOCK_M)
    return rows, hi, mask_rows, offs_m


@gluon.jit
def _load_q(q_desc, q_smem, q_full, b, h, start, slot, BLOCK_M: gl.constexpr):
    """Both warpgroups' Q rows of the block from `start` into Q slot `slot` (smem index slot·2 + warpgroup)."""
    for w in gl.static_range(ROWS_PER_PROGRAM):
        mbarrier.expect(q_full.index(slot * ROWS_PER_PROGRAM + w), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, start + w * BLOCK_M, 0], q_full.index(slot * ROWS_PER_PROGRAM + w),
                                        q_smem.index(slot * ROWS_PER_PROGRAM + w))


@gluon.jit
def _stream_k(k_desc, k_smem, k_full, k_empty, b, hk, t, n, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Key tiles 0 … n − 1 into the ring from ring tile t on; returns the next ring tile."""
    for j in range(n):
        st = t % STAGES
        mbarrier.wait(k_empty.index(st), ((t // STAGES) & 1) ^ 1)  # a fresh barrier passes the phase before 0
        mbarrier.expect(k_full.index(st), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, hk, j * BLOCK_N, 0], k_full.index(st), k_smem.index(st))
        t += 1
    return t


@gluon.jit
def _paired_loader(q_desc, k_desc, p_desc, q_smem, k_smem, z_smem, bars, b, h, hk, start0, n_blocks, N,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                   NO_SOFTMAX: gl.constexpr):
    """One warp. Q of blocks 0 and 1, then K tile by tile in the consumers' order: block 0's pass 1, then for each
    block i its pass 2 together with block i+1's pass 1 (to block i+1's last tile), the last block's pass 2 alone
    (under no_softmax: each block's single pass). Q of block i+2 goes into block i's slot once both consumers have
    finished reading it. Under a causal mask it also stores each block's zero tiles past the diagonal, from the
    zeroed buffer z_smem (its bulk groups are this warp's own: the consumers' store waits do not count them)."""
    q_full, q_empty, k_full, k_empty = bars
    BLOCK_ROWS: gl.constexpr = ROWS_PER_PROGRAM * BLOCK_M
    _load_q(q_desc, q_smem, q_full, b, h, start0, 0, BLOCK_M)
    if n_blocks > 1:
        _load_q(q_desc, q_smem, q_full, b, h, start0 + BLOCK_ROWS, 1, BLOCK_M)
    t = 0
    if not NO_SOFTMAX:
        t = _stream_k(k_desc, k_smem, k_full, k_empty, b, hk, t, _block_tiles(start0, N, BLOCK_M, BLOCK_N, CAUSAL),
                      BLOCK_N, STAGES)
    for i in range(n_blocks):
        start = start0 + i * BLOCK_ROWS
        n = _block_tiles(start, N, BLOCK_M, BLOCK_N, CAUSAL)
        if CAUSAL:
            for j in range(n, gl.cdiv(N, BLOCK_N)):
                for w in gl.static_range(ROWS_PER_PROGRAM):
                    tma.async_copy_shared_to_global(p_desc, [b, h, start + w * BLOCK_M, j * BLOCK_N], z_smem)
        if not NO_SOFTMAX:
            if i + 1 < n_blocks:  # block i+1's pass 1 runs to its own last tile
                n = _block_tiles(start + BLOCK_ROWS, N, BLOCK_M, BLOCK_N, CAUSAL)
        t = _stream_k(k_desc, k_smem, k_full, k_empty, b, hk, t, n, BLOCK_N, STAGES)
        if i + 2 < n_blocks:
            mbarrier.wait(q_empty.index(i % 2), (i // 2) & 1)
            _load_q(q_desc, q_smem, q_full, b, h, start + 2 * BLOCK_ROWS, i % 2, BLOCK_M)
    tma.store_wait(pendings=0)


@gluon.jit
def _both_passes(q_w, q_s, k_smem, k_full, k_empty, q_release, base, n, zero_s, bias, w_rows, s_rows, m_i, l_i,
                 p_desc, p_smem, slot0, b, h, cols, N, smn, qk_scale, mask_scale, D: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr):
    """Key tiles 0 … n − 1 (ring tiles base onwards) for two blocks at once: block W's pass 2 (q_w, writes P with
    its `bias`) and block S's pass 1 (q_s, folds into its running m_i, l_i). Each step issues S's QKᵀ of tile j, works
    on W's tile j while it runs, then issues W's QKᵀ of tile j+1 and works on S's tile j while that runs. The value
    the loop carries in flight (W's next QKᵀ) is issued after the last read of the one before it, so no copy of an
    in-flight accumulator (C7514). Arrives on q_release once W's last matmul is done with q_w."""
    w_start, w_hi, w_mask, w_offs = w_rows
    s_start, s_hi, s_mask, s_offs = s_rows
    s_w = _next_scores(q_w, k_smem, k_full, base, zero_s, BLOCK_N, D, STAGES)
    for j in range(n - 1):
        st = (base + j) % STAGES
        s_w = warpgroup_mma_wait(num_outstanding=0, deps=[s_w])
        s_s = warpgroup_mma(q_s, k_smem.index(st).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                            is_async=True)
        _write_tile(s_w, j, bias, p_desc, p_smem, slot0, b, h, w_start, w_hi, w_mask, w_offs, cols, N, smn,
                    qk_scale, mask_scale, BLOCK_N, CAUSAL, MASK_KIND, False)
        s_s = _scores_done(s_s, k_empty, base + j, STAGES)
        s_w = _next_scores(q_w, k_smem, k_full, base + j + 1, zero_s, BLOCK_N, D, STAGES)
        m_i, l_i = _step(s_s, j, m_i, l_i, bias, p_desc, p_smem, slot0, b, h, s_start, s_hi, s_mask, s_offs, cols, N,
                         smn, qk_scale, mask_scale, False, BLOCK_N, CAUSAL, MASK_KIND, False)
    st = (base + n - 1) % STAGES
    s_w = warpgroup_mma_wait(num_outstanding=0, deps=[s_w])
    s_s = warpgroup_mma(q_s, k_smem.index(st).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                        is_async=True)
    mbarrier.arrive(q_release, count=1)
    _write_tile(s_w, n - 1, bias, p_desc, p_smem, slot0, b, h, w_start, w_hi, w_mask, w_offs, cols, N, smn, qk_scale,
                mask_scale, BLOCK_N, CAUSAL, MASK_KIND, False)
    s_s = _scores_done(s_s, k_empty, base + n - 1, STAGES)
    m_i, l_i = _step(s_s, n - 1, m_i, l_i, bias, p_desc, p_smem, slot0, b, h, s_start, s_hi, s_mask, s_offs, cols, N,
                     smn, qk_scale, mask_scale, False, BLOCK_N, CAUSAL, MASK_KIND, False)
    return m_i, l_i


@gluon.jit
def _paired_consumer(q_smem, k_smem, p_smem, p_desc, bars, mask, b, h, start0, n_blocks, N, qk_scale, mask_scale,
                     WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """One warpgroup, its BLOCK_M rows of each of the program's blocks: block 0's pass 1, then block i's pass 2
    beside block i+1's pass 1 (and, causal, block i+1's pass 1 over the tiles past block i's last), then the last
    block's pass 2. Under no_softmax each block's one pass, in turn."""
    q_full, q_empty, k_full, k_empty = bars
    m_head, smm, smn = mask
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    slot0: gl.constexpr = WG * PBUF  # this warpgroup's P buffers in p_smem
    BLOCK_ROWS: gl.constexpr = ROWS_PER_PROGRAM * BLOCK_M
    m_init = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
    l_init = gl.zeros([BLOCK_M], gl.float32, row_s)
    t = 0
    if NO_SOFTMAX:
        for i in range(n_blocks):
            start = start0 + i * BLOCK_ROWS
            n = _block_tiles(start, N, BLOCK_M, BLOCK_N, CAUSAL)
            rows, hi, mask_rows, offs_m = _rows(start, WG, N, m_head, smm, BLOCK_M, row_s, CAUSAL)
            mbarrier.wait(q_full.index((i % 2) * ROWS_PER_PROGRAM + WG), (i // 2) & 1)
            q = q_smem.index((i % 2) * ROWS_PER_PROGRAM + WG).reshape([BLOCK_M, D])
            _pass(q, k_smem, k_full, k_empty, t, 0, n, zero_s, m_init, l_init, l_init, p_desc, p_smem, slot0, b, h,
                  rows, hi, mask_rows, offs_m, cols, N, smn, qk_scale, mask_scale, True, D, BLOCK_N, STAGES, CAUSAL,
                  MASK_KIND, True)
            mbarrier.arrive(q_empty.index(i % 2), count=1)
            t += n
    else:
        n = _block_tiles(start0, N, BLOCK_M, BLOCK_N, CAUSAL)
        rows, hi, mask_rows, offs_m = _rows(start0, WG, N, m_head, smm, BLOCK_M, row_s, CAUSAL)
        mbarrier.wait(q_full.index(WG), 0)
        q = q_smem.index(WG).reshape([BLOCK_M, D])
        m_i, l_i = _pass(q, k_smem, k_full, k_empty, t, 0, n, zero_s, m_init, l_init, l_init, p_desc, p_smem, slot0,
                         b, h, rows, hi, mask_rows, offs_m, cols, N, smn, qk_scale, mask_scale, False, D, BLOCK_N,
                         STAGES, CAUSAL, MASK_KIND, False)
        t += n
        for i in range(n_blocks - 1):
            start = start0 + i * BLOCK_ROWS
            n = _block_tiles(start, N, BLOCK_M, BLOCK_N, CAUSAL)
            bias = _bias(m_i, l_i)
            mbarrier.wait(q_full.index(((i + 1) % 2) * ROWS_PER_PROGRAM + WG), ((i + 1) // 2) & 1)
            q_w = q_smem.index((i % 2) * ROWS_PER_PROGRAM + WG).reshape([BLOCK_M, D])
            q_s = q_smem.index(((i + 1) % 2) * ROWS_PER_PROGRAM + WG).reshape([BLOCK_M, D])
            w_rows = _rows(start, WG, N, m_head, smm, BLOCK_M, row_s, CAUSAL)
            s_rows = _rows(start + BLOCK_ROWS, WG, N, m_head, smm, BLOCK_M, row_s, CAUSAL)
            m_i, l_i = _both_passes(q_w, q_s, k_smem, k_full, k_empty, q_empty.index(i % 2), t, n, zero_s, bias,
                                    w_rows, s_rows, m_init, l_init, p_desc, p_smem, slot0, b, h, cols, N, smn,
                                    qk_scale, mask_scale, D, BLOCK_N, STAGES, CAUSAL, MASK_KIND)
            t += n
            if CAUSAL:  # block i+1 sees more keys than block i: its pass 1 goes on alone
                n_next = _block_tiles(start + BLOCK_ROWS, N, BLOCK_M, BLOCK_N, CAUSAL)
                if n_next > n:
                    m_i, l_i = _pass(q_s, k_smem, k_full, k_empty, t, n, n_next, zero_s, m_i, l_i, l_init, p_desc,
                                     p_smem, slot0, b, h, s_rows[0], s_rows[1], s_rows[2], s_rows[3], cols, N, smn,
                                     qk_scale, mask_scale, False, D, BLOCK_N, STAGES, CAUSAL, MASK_KIND, False)
                    t += n_next - n
        last = n_blocks - 1
        start = start0 + last * BLOCK_ROWS
        n = _block_tiles(start, N, BLOCK_M, BLOCK_N, CAUSAL)
        rows, hi, mask_rows, offs_m = _rows(start, WG, N, m_head, smm, BLOCK_M, row_s, CAUSAL)
        q = q_smem.index((last % 2) * ROWS_PER_PROGRAM + WG).reshape([BLOCK_M, D])
        _pass(q, k_smem, k_full, k_empty, t, 0, n, zero_s, m_i, l_i, _bias(m_i, l_i), p_desc, p_smem, slot0, b, h,
              rows, hi, mask_rows, offs_m, cols, N, smn, qk_scale, mask_scale, True, D, BLOCK_N, STAGES, CAUSAL,
              MASK_KIND, False)
    tma.store_wait(pendings=0)


@gluon.jit
def _paired0(q_desc, k_desc, p_desc, q_smem, k_smem, p_smem, z_smem, bars, mask, b, h, hk, start0, n_blocks, N,
             qk_scale, mask_scale, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    _paired_consumer(q_smem, k_smem, p_smem, p_desc, bars, mask, b, h, start0, n_blocks, N, qk_scale, mask_scale, 0,
                     D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX)


@gluon.jit
def _paired1(q_desc, k_desc, p_desc, q_smem, k_smem, p_smem, z_smem, bars, mask, b, h, hk, start0, n_blocks, N,
             qk_scale, mask_scale, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    _paired_consumer(q_smem, k_smem, p_smem, p_desc, bars, mask, b, h, start0, n_blocks, N, qk_scale, mask_scale, 1,
                     D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX)


@gluon.jit
def _paired_load(q_desc, k_desc, p_desc, q_smem, k_smem, p_smem, z_smem, bars, mask, b, h, hk, start0, n_blocks, N,
                 qk_scale, mask_scale, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    _paired_loader(q_desc, k_desc, p_desc, q_smem, k_smem, z_smem, bars, b, h, hk, start0, n_blocks, N, BLOCK_M,
                   BLOCK_N, STAGES, CAUSAL, NO_SOFTMAX)


@gluon.jit(do_not_specialize=["N"])
def qk_softmax_paired_kernel(q_desc, k_desc, p_desc, M, smb, smh, smm, smn, N, H, GROUP, qk_scale, mask_scale, BLOCKS,
                             D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                             CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr,
                             HEAVY_FIRST: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """qk_softmax_gluon_kernel's arguments and BLOCKS, the blocks of 2·BLOCK_M rows a program covers: grid
    (cdiv(cdiv(N, 2·BLOCK_M), BLOCKS), B·H)."""
    dtype: gl.constexpr = q_desc.dtype
    b, h, hk, first, n_tiles, m_head = _program(M, smb, smh, N, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL, HEAVY_FIRST)
    start0 = first * BLOCKS  # _program's first row counts programs of one block each
    n_blocks = gl.minimum(BLOCKS, gl.cdiv(N - start0, ROWS_PER_PROGRAM * BLOCK_M))

    q_smem = gl.allocate_shared_memory(dtype, [2 * ROWS_PER_PROGRAM, 1, 1, BLOCK_M, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], k_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [ROWS_PER_PROGRAM * PBUF, 1, 1, BLOCK_M, BLOCK_N], p_desc.layout)
    if CAUSAL:  # the zero tiles' source, written once here, read by the loader's TMA stores
        z_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, BLOCK_N], p_desc.layout)
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        z_smem.reshape([BLOCK_M, BLOCK_N]).store(gl.zeros([BLOCK_M, BLOCK_N], dtype, s_layout))
    else:
        z_smem = p_smem  # never read
    q_full = gl.allocate_shared_memory(gl.int64, [2 * ROWS_PER_PROGRAM, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2 * ROWS_PER_PROGRAM):
        mbarrier.init(q_full.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(q_empty.index(i), count=ROWS_PER_PROGRAM)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=ROWS_PER_PROGRAM)
    fence_async_shared()
    bars = (q_full, q_empty, k_full, k_empty)
    mask = (m_head, smm, smn)
    gl.warp_specialize([
        (_paired0, (q_desc, k_desc, p_desc, q_smem, k_smem, p_smem, z_smem, bars, mask, b, h, hk, start0, n_blocks,
                    N, qk_scale, mask_scale, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX)),
        (_paired1, (q_desc, k_desc, p_desc, q_smem, k_smem, p_smem, z_smem, bars, mask, b, h, hk, start0, n_blocks,
                    N, qk_scale, mask_scale, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX)),
        (_paired_load, (q_desc, k_desc, p_desc, q_smem, k_smem, p_smem, z_smem, bars, mask, b, h, hk, start0,
                        n_blocks, N, qk_scale, mask_scale, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND,
                        NO_SOFTMAX)),
    ], [4, 1], [CONSUMER_REGS, 24])


def check_case(tiles, dtype, D: int) -> None:
    """ValueError unless the kernel compiles for this dtype and head dim (a table entry for it is keyed "=64" or
    "=128"; forced tiles can ask for anything)."""
    if not compiles_for(dtype, D):
        raise ValueError(f"tiles {tiles}: the Gluon qk_softmax kernel needs fp16 or bf16 and D in {HEAD_DIMS} (its "
                         f"TMA boxes are exactly D wide), got {dtype} and D = {D}")


MIN_N = 1024  # below it the Triton kernel was faster: at N = 512 the Gluon kernel's build ran 0.80–1.06× as fast
# (bench, session 5 call 4: D = 64 causal 0.80, non-causal 0.94; D = 128 0.95–1.06), at N = 1024 0.98–1.15×.


def takes(N: int) -> bool:
    """Whether this kernel writes P at sequence length N: TMA stores P's rows only when they are 16-byte aligned
    (N % 8 == 0 for 16-bit P), and below MIN_N the Triton kernel is faster."""
    return N % 8 == 0 and N >= MIN_N


def blocks_per_program(N: int, BH: int, BLOCK_M: int, sms: int) -> int:
    """The paired kernel's BLOCKS: as many blocks of 2·BLOCK_M rows a program as keep at least two waves of programs
    on the GPU's `sms` SMs, at most 8 (each program runs one unpaired pass 1 and one unpaired pass 2, so more
    blocks a program amortise them)."""
    n_blocks = triton.cdiv(N, ROWS_PER_PROGRAM.value * BLOCK_M)
    return max(1, min(8, n_blocks, n_blocks * BH // (2 * sms)))


def launch(q, k, p, mask, mask_strides, mask_kind, *, N, H, group, qk_scale, mask_scale, causal, tiles,
           no_softmax=False, blocks=None) -> None:
    """Write P for checked (B, H, N, D) q and k into the contiguous (B, H, N, N) p (attnlab.triton.launch.qk_softmax
    calls it for Tiles.gluon when `takes(N)`); Tiles.paired starts the paired kernel, with `blocks` blocks a program
    (default: blocks_per_program; a check forces small numbers to cover partial last programs)."""
    BM, BN = tiles.BLOCK_M, tiles.BLOCK_N
    q, k = tma_ready(q), tma_ready(k)
    blocks = triton.cdiv(N, ROWS_PER_PROGRAM.value * BM)
    args = (descriptor(q, BM), descriptor(k, BN), descriptor(p, BM, BN), mask, *mask_strides, N, H, group, qk_scale,
            mask_scale)
    meta = dict(D=q.shape[-1], BLOCK_M=BM, BLOCK_N=BN, STAGES=tiles.num_stages, CAUSAL=causal, MASK_KIND=mask_kind,
                NO_SOFTMAX=no_softmax, HEAVY_FIRST=tiles.heavy_first, CONSUMER_REGS=CONSUMER_REGS, num_warps=4,
                maxnreg=MAXNREG)
    if tiles.paired:
        per = blocks or blocks_per_program(N, q.shape[0] * H, BM, _sm_count(q.device))
        qk_softmax_paired_kernel[(triton.cdiv(blocks, per), q.shape[0] * H)](*args, per, **meta)
    else:
        qk_softmax_gluon_kernel[(blocks, q.shape[0] * H)](*args, **meta)


@functools.lru_cache(maxsize=None)
def _sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count
