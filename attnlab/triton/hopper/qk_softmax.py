"""The qk_softmax build's Hopper kernel, written in Gluon: the same two passes as attnlab.triton.qk_softmax (row max
and sum, then P written once), warp specialised so that the P writes, the matmuls and the exponentials can overlap
(1.05–1.45× the Triton kernel's build from N = 1024; with its exponentials replaced by FMAs it runs within 5 % of
itself, so they are hidden, and its time is the two passes' matmuls and pass 2's stores). It compiles for D = 64 and
128 exactly, fp16 and bf16, and takes any N from N = MIN_N on (TMA needs P's rows 16-byte aligned, and
layout.scores_buffer starts them on 128-byte lines at any N); below it the Triton kernel runs.

Why: P is the build's traffic (N² elements written here, read by the PV kernel), and the Triton kernel's loop does
matmul, exponentials and stores one after the other in every warp. Here
  * a loader warp streams the K tiles by TMA into a ring of STAGES slots, once for each pass (full/empty mbarriers,
    as in attnlab.triton.hopper.fused);
  * two consumer warpgroups of BLOCK_M rows each issue the next tile's QKᵀ before working on this one's scores
    (so the matmul can run on the tensor cores while the exponentials run), and
  * write each P tile by TMA from a pair of shared-memory buffers: the store drains while the next tiles are
    computed. Under a causal mask the zero tiles past the diagonal are stored first, from a zeroed buffer, while
    pass 1 computes.
Tiles.one_consumer puts one consumer in a program and two programs on an SM; Tiles.persistent starts one program an
SM (two with one consumer), each taking work items in turn as the persistent fused kernel does, the K ring and the P
buffers running on from item to item. A mask comes through the loader by TMA with each K tile where it can (as the
fused kernel's does), in a ring beside K's; as_run says with which tiles a masked call runs. Scores, masks and the
online max/sum are attnlab.triton.hopper.common's functions, which the fused kernel uses too: the same arithmetic as
the fused kernel's, flag for flag (masks, causal, ragged N, GQA, the no_softmax ablation writing P = S).
"""
from __future__ import annotations

from dataclasses import replace

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from attnlab.triton import direct
from attnlab.triton.hopper.common import (P_CONSUMER_REGS, ROWS_PER_PROGRAM, SMEM_SPARE, check_p_rows, described,
                                          items, load_k_tile, mask_by_tma, mask_descriptor, needs_masks, p_bias,
                                          partitions, program, scores, smem_limit, softmax_tile, step_item,
                                          tma_ready, warpgroup_mask)
from attnlab.triton.layout import padded_view

PBUF = gl.constexpr(2)  # P buffers per consumer: one being filled while the other's store drains


@gluon.jit
def _load_item(where, t0, it, q_desc, k_desc, q_smem, k_smem, bars, tma_mask, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NO_SOFTMAX: gl.constexpr, PERSISTENT: gl.constexpr,
               ROWS: gl.constexpr, MASK_TMA: gl.constexpr, MASK_B: gl.constexpr, MASK_H: gl.constexpr):
    """The loader's share of a work item (`where`: program's answer; this program's it-th item): each consumer's Q
    (persistent: once that consumer has released its Q buffer, after its last QKᵀ of the previous item, and after
    the item's first K tile, which can load before that), then the K tiles once per pass at ring positions t0 on.
    Returns the next item's first ring position."""
    q_bars, q_empty, k_full, k_empty = bars
    b, h, hk, start_m, n_tiles, m_head = where
    mask_desc, mask_smem = tma_mask
    item_mask = (mask_desc, mask_smem, b * MASK_B, h * MASK_H, start_m)
    passes = 1 if NO_SOFTMAX else 2
    first = 0
    if PERSISTENT:
        load_k_tile(t0, 0, k_desc, k_smem, k_full, k_empty, b, hk, item_mask, BLOCK_N, STAGES, MASK_TMA)
        first = 1
    for w in gl.static_range(ROWS):
        if PERSISTENT:
            mbarrier.wait(q_empty.index(w), (it & 1) ^ 1)
        mbarrier.expect(q_bars.index(w), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, start_m + w * BLOCK_M, 0], q_bars.index(w), q_smem.index(w))
    for t in range(first, passes * n_tiles):
        load_k_tile(t0 + t, t % n_tiles, k_desc, k_smem, k_full, k_empty, b, hk, item_mask, BLOCK_N, STAGES, MASK_TMA)
    return t0 + passes * n_tiles


@gluon.jit
def _loader(q_desc, k_desc, q_smem, k_smem, bars, tma_mask, work, where, M, smb, smh, N, H, GROUP,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
            HEAVY_FIRST: gl.constexpr, NO_SOFTMAX: gl.constexpr, PERSISTENT: gl.constexpr, ROWS: gl.constexpr,
            MASK_TMA: gl.constexpr, MASK_B: gl.constexpr, MASK_H: gl.constexpr):
    """One warp: Q and K of this program's work items (one item unless persistent) by TMA, K into a ring of STAGES
    slots once per pass."""
    pid, nprog, total = work
    if PERSISTENT:
        t0 = 0
        it = 0
        start, end, step = items(pid, nprog, total, CAUSAL and HEAVY_FIRST)
        for x in range(start, end, step):
            where = step_item(x, work, M, smb, smh, N, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL, HEAVY_FIRST, ROWS)
            t0 = _load_item(where, t0, it, q_desc, k_desc, q_smem, k_smem, bars, tma_mask, BLOCK_M, BLOCK_N, STAGES,
                            NO_SOFTMAX, True, ROWS, MASK_TMA, MASK_B, MASK_H)
            it += 1
    else:
        _load_item(where, 0, 0, q_desc, k_desc, q_smem, k_smem, bars, tma_mask, BLOCK_M, BLOCK_N, STAGES, NO_SOFTMAX,
                   False, ROWS, MASK_TMA, MASK_B, MASK_H)


@gluon.jit
def _next_scores(q, k_smem, k_full, t, zero_s, BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr):
    """Issue QKᵀ of ring tile t asynchronously (once the loader's bytes are there)."""
    st = t % STAGES
    mbarrier.wait(k_full.index(st), (t // STAGES) & 1)
    return warpgroup_mma(q, k_smem.index(st).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                         is_async=True)


@gluon.jit
def _scores_done(s_next, k_empty, t, STAGES: gl.constexpr, MASK_TMA: gl.constexpr):
    """Wait for ring tile t's QKᵀ and hand its K slot back to the loader (under MASK_TMA only once the tile's step has
    read the slot's mask tile too: _release)."""
    s = warpgroup_mma_wait(num_outstanding=0, deps=[s_next])
    if not MASK_TMA:
        mbarrier.arrive(k_empty.index(t % STAGES), count=1)
    return s


@gluon.jit
def _release(k_empty, t, STAGES: gl.constexpr, MASK_TMA: gl.constexpr):
    """Under MASK_TMA, hand ring tile t's slot (K and the mask tile) back once its step has read the mask."""
    if MASK_TMA:
        mbarrier.arrive(k_empty.index(t % STAGES), count=1)


@gluon.jit
def _probabilities(s, bias, qk_scale, SCALED: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """P from a score tile and the row's bias = max + log2(sum): 2^(s − max) / sum as one exp2 whose argument
    carries the division (one FFMA and one MUFU an element, no multiply by 1/sum). s is raw q·kᵀ
    unless scores SCALED it (its masked form); under no_softmax, P is S itself with masked entries 0."""
    if NO_SOFTMAX:
        p = gl.where(s == float("-inf"), 0.0, s)
    elif SCALED:
        p = gl.exp2(s - bias[:, None])
    else:
        p = gl.exp2(s * qk_scale - bias[:, None])
    return p


@gluon.jit
def _p_tile(s, j, bias, rows, hi, mask_rows, mask_tile, offs_m, cols, N, smn, qk_scale, mask_scale,
            BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr,
            MASK_TMA: gl.constexpr):
    """P of key tile j: normalised with the row's bias, or S itself under no_softmax."""
    offs_n = j * BLOCK_N + cols
    if needs_masks(j, rows, hi, BLOCK_N, CAUSAL):
        s = scores(s, mask_rows, mask_tile, offs_m, offs_n, N, smn, qk_scale, mask_scale, True, CAUSAL, MASK_KIND,
                    NO_SOFTMAX, MASK_TMA)
        p = _probabilities(s, bias, qk_scale, True, NO_SOFTMAX)
    else:
        s = scores(s, mask_rows, mask_tile, offs_m, offs_n, N, smn, qk_scale, mask_scale, False, CAUSAL,
                    MASK_KIND, NO_SOFTMAX, MASK_TMA)
        p = _probabilities(s, bias, qk_scale, MASK_KIND != 0 or NO_SOFTMAX, NO_SOFTMAX)
    return p


@gluon.jit
def _ref_tile(s, j, m_i, l_i, rows, hi, mask_rows, mask_tile, offs_m, cols, N, smn, qk_scale, mask_scale,
              BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, MASK_TMA: gl.constexpr):
    """Pass 1's key tile j against a fixed reference (Tiles.fixed_reference): m_i is the max of the row's first
    key tile (0 where the mask hides that tile entirely), taken at j = 0 and then left as it is; l_i sums
    2^(s − m_i). No max and no rescale in the loop, so a tile's exponentials do not wait for its max; _flag_rows
    says which rows that leaves wrong."""
    offs_n = j * BLOCK_N + cols
    masked = needs_masks(j, rows, hi, BLOCK_N, CAUSAL)
    if masked or MASK_KIND != 0:  # scores scales a masked tile itself
        s = scores(s, mask_rows, mask_tile, offs_m, offs_n, N, smn, qk_scale, mask_scale, masked, CAUSAL, MASK_KIND,
                    False, MASK_TMA)
        if j == 0:
            m_first = gl.max(s, axis=1)
            m_i = gl.where(m_first == float("-inf"), 0.0, m_first)
        p = gl.exp2(s - m_i[:, None])
    else:
        s = scores(s, mask_rows, mask_tile, offs_m, offs_n, N, smn, qk_scale, mask_scale, False, CAUSAL, MASK_KIND,
                    False, MASK_TMA)
        if j == 0:
            m_i = gl.max(s, axis=1) * qk_scale
        p = gl.exp2(s * qk_scale - m_i[:, None])
    return m_i, l_i + gl.sum(p, axis=1)


@gluon.jit
def _flag_rows(l_i, offs_m, flags, bh, N):
    """After a pass 1 against a fixed reference: 1 for each row whose sum is not a positive finite number (it
    overflowed, a score 2^128 or more above the reference; it is 0, the row hidden entirely or everything after a
    hidden first tile too small to register; or NaN), else 0, into the row's byte of `flags` (B·H·N of them). The
    Triton kernel re-writes the blocks of the flagged rows after this kernel (attnlab.triton.launch.write_p)."""
    good = (l_i > 0.0) & (l_i < float("inf"))
    gl.store(flags + bh * N + offs_m, gl.where(good, 0, 1).to(gl.int8), mask=offs_m < N)


@gluon.jit
def _store_p(p, j, p_desc, p_smem, slot0, pbase, b, h, rows, BLOCK_N: gl.constexpr):
    """P tile j into buffer slot0 + (pbase + j) % PBUF (pbase: the P tiles this consumer wrote for earlier items, so
    that the buffers alternate across items too), then a TMA store of it; the store that last read that buffer must
    have finished first."""
    buf = p_smem.index(slot0 + (pbase + j) % PBUF)
    tma.store_wait(pendings=PBUF - 1)
    buf.reshape([buf.type.shape[2], buf.type.shape[3]]).store(p.to(p_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(p_desc, [b, h, rows, j * BLOCK_N], buf)


@gluon.jit
def _step(s, j, t, m_i, l_i, bias, p_desc, p_smem, slot0, pbase, b, h, rows, hi, masks, offs_m, cols, N, smn,
          qk_scale, mask_scale, WRITE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
          CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr, MASK_TMA: gl.constexpr,
          WG: gl.constexpr, ROWS: gl.constexpr, REF1: gl.constexpr):
    """Key tile j of a pass (ring position t): pass 1 folds it into the running max and sum (REF1: into the sum
    against a fixed reference, _ref_tile), pass 2 (WRITE) writes its P. masks: the rows' mask pointers, the mask
    ring (MASK_TMA) and the K ring's `empty` barriers, on which the slot goes back once its mask tile has been
    read."""
    mask_rows, mask_smem, k_empty = masks
    mask_tile = warpgroup_mask(mask_smem, t % STAGES, WG, MASK_TMA, ROWS)
    if WRITE:
        p = _p_tile(s, j, bias, rows, hi, mask_rows, mask_tile, offs_m, cols, N, smn, qk_scale, mask_scale, BLOCK_N,
                    CAUSAL, MASK_KIND, NO_SOFTMAX, MASK_TMA)
        # the slot goes back before the wait for a free P buffer: with 2 stages, holding it through that wait kept
        # the loader from bringing tile t + 2
        _release(k_empty, t, STAGES, MASK_TMA)
        _store_p(p, j, p_desc, p_smem, slot0, pbase, b, h, rows, BLOCK_N)
    elif REF1:
        m_i, l_i = _ref_tile(s, j, m_i, l_i, rows, hi, mask_rows, mask_tile, offs_m, cols, N, smn, qk_scale,
                             mask_scale, BLOCK_N, CAUSAL, MASK_KIND, MASK_TMA)
        _release(k_empty, t, STAGES, MASK_TMA)
    else:
        p, m_i, l_i, alpha, offs_n = softmax_tile(s, m_i, l_i, j, rows, hi, mask_rows, mask_tile, offs_m, cols, N, smn,
                                           qk_scale, mask_scale, BLOCK_N, CAUSAL, MASK_KIND, False, MASK_TMA)
        _release(k_empty, t, STAGES, MASK_TMA)
    return m_i, l_i


@gluon.jit
def _pass(q, k_smem, k_full, k_empty, q_free, base, n_tiles, zero_s, m_i, l_i, bias, p_desc, p_smem, slot0, pbase,
          b, h, rows, hi, mask_rows, mask_smem, offs_m, cols, N, smn, qk_scale, mask_scale, WRITE: gl.constexpr,
          RELEASE_Q: gl.constexpr, D: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
          CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr, MASK_TMA: gl.constexpr,
          WG: gl.constexpr, ROWS: gl.constexpr, REF1: gl.constexpr):
    """One pass over the key tiles (ring tiles base … base + n_tiles − 1), two at a time: the next tile's QKᵀ is on
    the tensor cores while this one's scores are worked on. Two at a time because the in-flight result must not be
    the value the loop carries while the previous one is still read: a one-tile loop makes the compiler copy an
    in-flight accumulator on the back edge, and ptxas then serialises every matmul (C7514).
    Every matmul a pass starts, it waits for. RELEASE_Q: arrive on q_free once the pass's last QKᵀ has read Q (the
    persistent kernel's loader then brings the next item's Q under this pass's last tiles)."""
    masks = (mask_rows, mask_smem, k_empty)
    s_flight = _next_scores(q, k_smem, k_full, base, zero_s, BLOCK_N, D, STAGES)
    for i in range((n_tiles - 1) // 2):
        j = 2 * i
        s_a = _scores_done(s_flight, k_empty, base + j, STAGES, MASK_TMA)
        s_b_flight = _next_scores(q, k_smem, k_full, base + j + 1, zero_s, BLOCK_N, D, STAGES)
        m_i, l_i = _step(s_a, j, base + j, m_i, l_i, bias, p_desc, p_smem, slot0, pbase, b, h, rows, hi, masks, offs_m,
                         cols, N, smn, qk_scale, mask_scale, WRITE, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX,
                         MASK_TMA, WG, ROWS, REF1)
        s_b = _scores_done(s_b_flight, k_empty, base + j + 1, STAGES, MASK_TMA)
        s_flight = _next_scores(q, k_smem, k_full, base + j + 2, zero_s, BLOCK_N, D, STAGES)
        m_i, l_i = _step(s_b, j + 1, base + j + 1, m_i, l_i, bias, p_desc, p_smem, slot0, pbase, b, h, rows, hi, masks,
                         offs_m, cols, N, smn, qk_scale, mask_scale, WRITE, BLOCK_N, STAGES, CAUSAL, MASK_KIND,
                         NO_SOFTMAX, MASK_TMA, WG, ROWS, REF1)
    j = 2 * ((n_tiles - 1) // 2)  # one tile left (n_tiles odd) or two
    s_a = _scores_done(s_flight, k_empty, base + j, STAGES, MASK_TMA)
    if j + 1 < n_tiles:
        s_b_flight = _next_scores(q, k_smem, k_full, base + j + 1, zero_s, BLOCK_N, D, STAGES)
        m_i, l_i = _step(s_a, j, base + j, m_i, l_i, bias, p_desc, p_smem, slot0, pbase, b, h, rows, hi, masks, offs_m,
                         cols, N, smn, qk_scale, mask_scale, WRITE, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX,
                         MASK_TMA, WG, ROWS, REF1)
        s_b = _scores_done(s_b_flight, k_empty, base + j + 1, STAGES, MASK_TMA)
        if RELEASE_Q:
            mbarrier.arrive(q_free, count=1)
        m_i, l_i = _step(s_b, j + 1, base + j + 1, m_i, l_i, bias, p_desc, p_smem, slot0, pbase, b, h, rows, hi, masks,
                         offs_m, cols, N, smn, qk_scale, mask_scale, WRITE, BLOCK_N, STAGES, CAUSAL, MASK_KIND,
                         NO_SOFTMAX, MASK_TMA, WG, ROWS, REF1)
    else:
        if RELEASE_Q:
            mbarrier.arrive(q_free, count=1)
        m_i, l_i = _step(s_a, j, base + j, m_i, l_i, bias, p_desc, p_smem, slot0, pbase, b, h, rows, hi, masks, offs_m,
                         cols, N, smn, qk_scale, mask_scale, WRITE, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX,
                         MASK_TMA, WG, ROWS, REF1)
    return m_i, l_i


@gluon.jit
def _item(where, t0, pbase, it, q_smem, k_smem, p_smem, p_desc, bars, smm, smn, mask_smem, flagging, N, qk_scale,
          mask_scale, WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr,
          Q_REGISTERS: gl.constexpr, PERSISTENT: gl.constexpr, MASK_TMA: gl.constexpr, ROWS: gl.constexpr,
          REF1: gl.constexpr):
    """One warpgroup's rows of a work item (`where`: program's answer; this program's it-th item, its key tiles at
    ring positions t0 on, pbase P tiles written before it): zero tiles (causal), pass 1 (max and sum; REF1: the
    sum against a fixed reference, then the rows it leaves wrong flagged in `flagging`'s flags, B·H·N bytes, whose
    H it carries), pass 2 (P). Persistent: Q's buffer is released after the item's last QKᵀ. Returns the next item's
    (t0, pbase)."""
    q_bars, q_empty, k_full, k_empty = bars
    b, h, hk, start_m, n_tiles, m_head = where
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
        if PERSISTENT:
            tma.store_wait(pendings=0)  # the previous item's last P stores have read the buffer
        zbuf.reshape([BLOCK_M, BLOCK_N]).store(zero_s.to(p_desc.dtype))
        fence_async_shared()
        for j in range(n_tiles, gl.cdiv(N, BLOCK_N)):
            tma.async_copy_shared_to_global(p_desc, [b, h, rows, j * BLOCK_N], zbuf)

    mbarrier.wait(q_bars.index(WG), it & 1)
    q = q_smem.index(WG).reshape([BLOCK_M, D])
    if Q_REGISTERS:  # Q as QKᵀ's register operand: each matmul then reads only its K tile from shared memory
        q = q.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
        if PERSISTENT:
            # these generic-proxy reads ordered before the loader's TMA write of the next item's Q into the buffer:
            # without the proxy fence such a release let the next TMA overwrite a slot still being read (the Gluon
            # PV kernel's no_pv loads, 7-14 of 30-40 runs wrong)
            fence_async_shared()
            mbarrier.arrive(q_empty.index(WG), count=1)
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    base = t0
    if not NO_SOFTMAX:  # pass 1: the row max and sum
        m_i, l_i = _pass(q, k_smem, k_full, k_empty, q_empty.index(WG), base, n_tiles, zero_s, m_i, l_i, m_i,
                         p_desc, p_smem, slot0, pbase, b, h, rows, hi, mask_rows, mask_smem, offs_m, cols, N, smn,
                         qk_scale, mask_scale, False, False, D, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX,
                         MASK_TMA, WG, ROWS, REF1)
        base = t0 + n_tiles
        if REF1:
            flags, H = flagging
            _flag_rows(l_i, offs_m, flags, (b * H + h).to(gl.int64), N)
    bias = p_bias(m_i, l_i)
    if CAUSAL:
        tma.store_wait(pendings=0)  # the zero buffer is P buffer 0, written again below
    _pass(q, k_smem, k_full, k_empty, q_empty.index(WG), base, n_tiles, zero_s, m_i, l_i, bias, p_desc, p_smem,
          slot0, pbase, b, h, rows, hi, mask_rows, mask_smem, offs_m, cols, N, smn, qk_scale, mask_scale, True,
          PERSISTENT and not Q_REGISTERS, D, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX, MASK_TMA, WG, ROWS,
          False)
    return base + n_tiles, pbase + n_tiles


@gluon.jit
def _consumer(q_smem, k_smem, p_smem, p_desc, bars, mask, work, where, flags, N, H, GROUP, qk_scale, mask_scale,
              WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr,
              HEAVY_FIRST: gl.constexpr, Q_REGISTERS: gl.constexpr, PERSISTENT: gl.constexpr, ROWS: gl.constexpr,
              MASK_TMA: gl.constexpr, REF1: gl.constexpr):
    """One warpgroup: its rows of each of this program's work items (one item unless persistent), then the wait for
    its last P stores."""
    pid, nprog, total = work
    M, smb, smh, smm, smn, mask_smem = mask
    if PERSISTENT:
        t0 = 0
        pbase = 0
        it = 0
        start, end, step = items(pid, nprog, total, CAUSAL and HEAVY_FIRST)
        for x in range(start, end, step):
            where = step_item(x, work, M, smb, smh, N, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL, HEAVY_FIRST, ROWS)
            t0, pbase = _item(where, t0, pbase, it, q_smem, k_smem, p_smem, p_desc, bars, smm, smn, mask_smem,
                              (flags, H), N, qk_scale, mask_scale, WG, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                              MASK_KIND, NO_SOFTMAX, Q_REGISTERS, True, MASK_TMA, ROWS, REF1)
            it += 1
    else:
        _item(where, 0, 0, 0, q_smem, k_smem, p_smem, p_desc, bars, smm, smn, mask_smem, (flags, H), N, qk_scale,
              mask_scale, WG, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX, Q_REGISTERS, False,
              MASK_TMA, ROWS, REF1)
    tma.store_wait(pendings=0)


# N is never made a constant: as a constant 1 with a mask it fails the Gluon lowering (attnlab.triton.hopper.fused).
@gluon.jit(do_not_specialize=["N"])
def qk_softmax_gluon_kernel(q_desc, k_desc, p_desc, M, smb, smh, smm, smn, mask_desc, flags, N, H, GROUP, total,
                            qk_scale, mask_scale, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                            STAGES: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr,
                            NO_SOFTMAX: gl.constexpr, HEAVY_FIRST: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                            num_warps: gl.constexpr, Q_REGISTERS: gl.constexpr = False,
                            ROWS: gl.constexpr = ROWS_PER_PROGRAM, PERSISTENT: gl.constexpr = False,
                            MASK_TMA: gl.constexpr = False, MASK_B: gl.constexpr = 0, MASK_H: gl.constexpr = 0,
                            REF1: gl.constexpr = False):
    """grid (total,) with total = cdiv(N, ROWS·BLOCK_M)·B·H work items, one a program (attnlab.triton.hopper.fused.
    program); PERSISTENT: any smaller grid, each program taking items pid, pid + grid, … (causal with HEAVY_FIRST:
    in heavy/light pairs, common.items). num_warps = 4; ROWS consumer warpgroups a program, 2, or 1
    (Tiles.one_consumer: two programs share an SM). q/k descriptors over (B, H or Hkv, N, D) with (1, 1, BLOCK_M or
    BLOCK_N, D) boxes; p_desc over the (B, H, N, N) P (rows on 128-byte lines: layout.scores_buffer) with a
    (1, 1, BLOCK_M, BLOCK_N) box; M the (B, H, N, N)-strided mask or any pointer when MASK_KIND = 0;
    qk_scale = scale·log2 e (natural scale under NO_SOFTMAX); Q_REGISTERS: Tiles.q_registers. MASK_TMA: the mask
    tiles come through `mask_desc`, a descriptor
    over the mask's (B or 1, H or 1, N, N) with a (1, 1, ROWS·BLOCK_M, BLOCK_N) box (MASK_B, MASK_H: 1 where the mask
    varies over batch, heads), into a ring of STAGES slots beside K's; else `mask_desc` is an unused placeholder.
    REF1: pass 1 against a fixed reference (Tiles.fixed_reference), each row's verdict into `flags` (B·H·N int8, 1 =
    re-write; _flag_rows); else `flags` is an unused placeholder."""
    dtype: gl.constexpr = q_desc.dtype
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    b, h, hk, start_m, n_tiles, m_head = program(pid, M, smb, smh, N, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL,
                                                  HEAVY_FIRST, ROWS)  # one item a program; persistent: its own

    q_smem = gl.allocate_shared_memory(dtype, [ROWS, 1, 1, BLOCK_M, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], k_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [ROWS * PBUF, 1, 1, BLOCK_M, BLOCK_N], p_desc.layout)
    if MASK_TMA:
        mask_smem = gl.allocate_shared_memory(mask_desc.dtype, [STAGES, 1, 1, ROWS * BLOCK_M, BLOCK_N],
                                              mask_desc.layout)
    else:
        mask_smem = q_smem  # never read
    q_bars = gl.allocate_shared_memory(gl.int64, [ROWS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [ROWS, 1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(ROWS):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=ROWS)
    fence_async_shared()
    # Each partition's arguments are written out where it is named: a tuple assigned to a name turns its constexprs
    # into tensors.
    if ROWS == 1:  # one consumer (the default partition) and the loader: 8 warps launched, two programs an SM
        gl.warp_specialize([
            (_consumer, (q_smem, k_smem, p_smem, p_desc, (q_bars, q_empty, k_full, k_empty),
                         (M, smb, smh, smm, smn, mask_smem),
                         (pid, nprog, total), (b, h, hk, start_m, n_tiles, m_head), flags, N, H, GROUP, qk_scale,
                         mask_scale, 0, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX, HEAVY_FIRST,
                         Q_REGISTERS, PERSISTENT, ROWS, MASK_TMA, REF1)),
            (_loader, (q_desc, k_desc, q_smem, k_smem, (q_bars, q_empty, k_full, k_empty), (mask_desc, mask_smem),
                       (pid, nprog, total), (b, h, hk, start_m, n_tiles, m_head), M, smb, smh, N, H, GROUP, BLOCK_M,
                       BLOCK_N, STAGES, CAUSAL, HEAVY_FIRST, NO_SOFTMAX, PERSISTENT, ROWS, MASK_TMA, MASK_B,
                       MASK_H)),
        ], [1], [24])
    else:
        gl.warp_specialize([
            (_consumer, (q_smem, k_smem, p_smem, p_desc, (q_bars, q_empty, k_full, k_empty),
                         (M, smb, smh, smm, smn, mask_smem),
                         (pid, nprog, total), (b, h, hk, start_m, n_tiles, m_head), flags, N, H, GROUP, qk_scale,
                         mask_scale, 0, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX, HEAVY_FIRST,
                         Q_REGISTERS, PERSISTENT, ROWS, MASK_TMA, REF1)),
            (_consumer, (q_smem, k_smem, p_smem, p_desc, (q_bars, q_empty, k_full, k_empty),
                         (M, smb, smh, smm, smn, mask_smem),
                         (pid, nprog, total), (b, h, hk, start_m, n_tiles, m_head), flags, N, H, GROUP, qk_scale,
                         mask_scale, 1, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX, HEAVY_FIRST,
                         Q_REGISTERS, PERSISTENT, ROWS, MASK_TMA, REF1)),
            (_loader, (q_desc, k_desc, q_smem, k_smem, (q_bars, q_empty, k_full, k_empty), (mask_desc, mask_smem),
                       (pid, nprog, total), (b, h, hk, start_m, n_tiles, m_head), M, smb, smh, N, H, GROUP, BLOCK_M,
                       BLOCK_N, STAGES, CAUSAL, HEAVY_FIRST, NO_SOFTMAX, PERSISTENT, ROWS, MASK_TMA, MASK_B,
                       MASK_H)),
        ], [4, 1], [CONSUMER_REGS, 24])


MIN_N = 512  # below it the Triton kernel runs. At N = 512 the two-consumer kernel's build runs 0.80–1.06× as fast as
# the Triton kernel's, but with the one-consumer and persistent options the best Gluon candidate takes 3–17 % less
# time there in every key. Below 512 nothing has been measured.


def mask_fits(tiles, stages: int, D: int, itemsize: int, mask_itemsize: int) -> bool:
    """Whether a ring of `stages` mask tiles (ROWS·BLOCK_M × BLOCK_N elements of mask_itemsize bytes each) fits in a
    program's shared memory beside Q, `stages` K tiles and the P buffers."""
    rows = partitions(tiles)[0]
    BM, BN = tiles.BLOCK_M, tiles.BLOCK_N
    tiles_bytes = (rows * BM * D + stages * BN * D + rows * PBUF.value * BM * BN) * itemsize
    return tiles_bytes + stages * rows * BM * BN * mask_itemsize + SMEM_SPARE <= smem_limit(tiles)


def as_run(tiles, mask, D: int, itemsize: int, N: int | None = None):
    """The tiles a call at sequence length N runs with, given its mask's layout (attnlab.triton.layout.MaskLayout;
    None: no mask):
      * Tiles.one_pass without a mask where the row fits on chip (attnlab.triton.hopper.qk_softmax_row.fits; N = None:
        the entry as it stands): as they are; else the two-pass kernel, persistent, as below;
      * no mask: `tiles` as they are;
      * any mask: without Tiles.fixed_reference and Tiles.q_registers (options for unmasked calls; beside a mask's
        tiles they spill, offline for sm_90a 40–424 bytes a thread where the same kernels without them spill 0–56),
        and then:
      * a mask the loader can bring by TMA (layout.tma_can_read: 1- or 2-byte elements, 16-byte-aligned rows):
        mask_tma, its tiles arriving with K's in as many stages as fit (mask_fits; at most the entry's, at least 2):
        with two consumers, D = 128 and a 2-byte mask, 2 of the entry's 3;
      * any other mask, or no room even for 2 stages (one consumer at D = 128): the consumers load it, one item a
        program (Tiles.persistent then spills 0.5–1.8 KB a thread without a causal mask: the mask's pointer tile
        stays live across the item loop)."""
    if tiles.one_pass:
        from attnlab.triton.hopper import qk_softmax_row

        if mask is None and (N is None or qk_softmax_row.fits(tiles, N, D, itemsize)):
            return tiles
        tiles = replace(tiles, one_pass=False, persistent=True)
    if mask is None:
        return tiles
    tiles = replace(tiles, fixed_reference=False, q_registers=False)
    if mask.tma:
        for stages in range(tiles.num_stages, 1, -1):
            if mask_fits(tiles, stages, D, itemsize, mask.itemsize):
                return replace(tiles, mask_tma=True, num_stages=stages)
    return replace(tiles, mask_tma=False, persistent=False)


def takes(N: int) -> bool:
    """Whether the build runs this kernel at sequence length N: from MIN_N on, where it is faster than the Triton
    kernel. Any N: P's rows start on 128-byte lines (layout.scores_buffer), so TMA stores them (rows N elements
    apart would allow only N % 8 == 0)."""
    return N >= MIN_N


def run(plan, q, k, p, mask, mask_strides, N, H, group, qk_scale, mask_scale, flags=None) -> None:
    """Write P for checked (B, H, N, D) q and k into the (B, H, N, N) p as `plan`
    (attnlab.triton.plan.QkSoftmaxGluonPlan) says (attnlab.triton.launch.write_p calls it). Under its MASK_TMA the
    mask comes through the loader warp with K, else by the consumers' loads. Under its REF1 (a pass 1 against a
    fixed reference) each row's verdict goes into `flags` (B·H·N int8, the caller's: 1 where the row's P is wrong and
    must be re-written, the plan's `repair`). P's rows must start 16 bytes apart (common.check_p_rows), as
    layout.scores_buffer's do at any N. Where their padding reaches the next 16-byte vector past N (layout.rows_pad),
    P's descriptor spans it (layout.padded_view), so that the kernels store 0 there (keys past N are masked) for the
    PV kernel to read as it lies."""
    check_p_rows(p)
    p = padded_view(p, N)
    ref1 = plan.constexprs["REF1"]
    if ref1 and (flags is None or flags.dtype != torch.int8 or flags.numel() != q.shape[0] * H * N):
        got = None if flags is None else (flags.dtype, flags.numel())
        raise ValueError(f"plan {plan}: a pass 1 against a fixed reference needs flags, a B·H·N = "
                         f"{q.shape[0] * H * N} int8 tensor, got {got}")
    q, k = tma_ready(q), tma_ready(k)
    q_box, k_box, p_box = plan.boxes
    q_desc = described(q, q_box)
    mask_desc = mask_descriptor(mask, plan.mask_rows, plan.BLOCK_N)[0] if plan.constexprs["MASK_TMA"] else q_desc
    direct.run(qk_softmax_gluon_kernel, plan, q_desc, described(k, k_box), described(p, p_box), mask, *mask_strides,
               mask_desc, flags if ref1 else p, N, H, group, plan.total, qk_scale, mask_scale)


def constexprs(tiles, *, D: int, causal: bool, mask, no_softmax: bool = False) -> dict:
    """The kernel's constexpr arguments for these tiles and this call (mask: its layout.MaskLayout or None): what the
    plan holds and what attnlab.triton.resources compiles offline, from one place so that the two cannot drift
    apart. REF1 only where there is a pass 1 (no_softmax has none)."""
    by_tma = mask_by_tma(tiles, mask)
    return dict(D=D, BLOCK_M=tiles.BLOCK_M, BLOCK_N=tiles.BLOCK_N, STAGES=tiles.num_stages, CAUSAL=causal,
                MASK_KIND=mask.kind if mask else 0, NO_SOFTMAX=no_softmax, HEAVY_FIRST=tiles.heavy_first,
                CONSUMER_REGS=P_CONSUMER_REGS, Q_REGISTERS=tiles.q_registers, ROWS=partitions(tiles)[0],
                PERSISTENT=tiles.persistent, MASK_TMA=by_tma, MASK_B=int(by_tma and mask.vary_b),
                MASK_H=int(by_tma and mask.vary_h), REF1=tiles.fixed_reference and not no_softmax)
