"""Build 2, `qk_softmax`: QKᵀ, scale, mask and softmax in one kernel that writes only P (S never leaves the chip).

A row's softmax needs the whole row's max and sum before any P can be written, and a (BLOCK_M, N) row block of S does
not fit on chip for long N. So the kernel makes two passes over K: the first only accumulates each row's max and sum
(online, as the fused kernel does), the second recomputes the same score tiles and writes P. Removing the S round
trip costs one extra QKᵀ: the attribution tables count it.
"""
import triton
import triton.language as tl

from attnlab.triton.tiles import load_rows, masked_to_zero, nonzero_sum, padded_length, score_tile


@triton.jit
def qk_softmax_kernel(Q, K, P, M,
                      sqb, sqh, sqn, skb, skh, skn, smb, smh, smm, smn,
                      N, H, GROUP, qk_scale, mask_scale, spn,
                      D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, NO_SOFTMAX: tl.constexpr,
                      IEEE: tl.constexpr, UPCAST: tl.constexpr, ONE_TILE: tl.constexpr = False,
                      FLAGS=None, REPAIR: tl.constexpr = False, REPAIR_SPAN: tl.constexpr = 4096,
                      ROWS_PAD: tl.constexpr = False):
    # grid: (cdiv(N, BLOCK_M), B·H), one block of BLOCK_M rows a program. P is (B, H, N, N) in the input dtype, rows
    # spn apart (layout.scores_buffer).
    # ONE_TILE: N ≤ BLOCK_N (the launcher's promise), so pass 1 is skipped and pass 2's one tile takes its
    # statistics from itself.
    # ROWS_PAD (layout.rows_pad): P's rows are written on to the next 16-byte vector past N, 0 there (its keys are
    # masked), which the PV kernel reads as it lies (layout.padded_view).
    # REPAIR: after the Gluon kernel's pass 1 against a fixed reference (Tiles.fixed_reference), only the blocks with
    # a row flagged in FLAGS (B·H·N int8, 1 = its P is wrong) are written, every row of them. Then the grid is
    # (cdiv(N, REPAIR_SPAN), B·H): a program reads the flags of REPAIR_SPAN rows (a multiple of BLOCK_M) in one load
    # and returns where none is set, as every program does on inputs the fixed reference serves (a program a block
    # of 64 rows took 0.010 ms a call to find nothing at N = 4096 D = 64, 8192 programs); else it writes its flagged
    # blocks one after another.
    # Scores are in log2 units (qk_scale = scale · log2 e) so the softmax uses exp2; NO_SOFTMAX passes the natural
    # scale and writes P = S (masked entries 0): no statistics pass, no exp, no normalisation.
    bh = tl.program_id(1).to(tl.int64)
    if REPAIR:
        rows = tl.program_id(0) * REPAIR_SPAN + tl.arange(0, REPAIR_SPAN)
        span = tl.load(FLAGS + bh * N + rows, mask=rows < N, other=0)
        if tl.max(span.to(tl.int32), 0) != 0:
            for i in range(0, REPAIR_SPAN // BLOCK_M):
                start_m = tl.program_id(0) * (REPAIR_SPAN // BLOCK_M) + i
                offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
                flagged = tl.load(FLAGS + bh * N + offs_m, mask=offs_m < N, other=0)
                if tl.max(flagged.to(tl.int32), 0) != 0:
                    _p_block(Q, K, P, M, sqb, sqh, sqn, skb, skh, skn, smb, smh, smm, smn, N, H, GROUP, qk_scale,
                             mask_scale, spn, start_m, bh, D, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, MASK_KIND,
                             NO_SOFTMAX, IEEE, UPCAST, ONE_TILE, ROWS_PAD)
    else:
        _p_block(Q, K, P, M, sqb, sqh, sqn, skb, skh, skn, smb, smh, smm, smn, N, H, GROUP, qk_scale, mask_scale,
                 spn, tl.program_id(0), bh, D, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, MASK_KIND, NO_SOFTMAX, IEEE,
                 UPCAST, ONE_TILE, ROWS_PAD)


@triton.jit
def _p_block(Q, K, P, M, sqb, sqh, sqn, skb, skh, skn, smb, smh, smm, smn, N, H, GROUP, qk_scale, mask_scale, spn,
             start_m, bh, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, NO_SOFTMAX: tl.constexpr, IEEE: tl.constexpr,
             UPCAST: tl.constexpr, ONE_TILE: tl.constexpr, ROWS_PAD: tl.constexpr):
    """P's block start_m (rows start_m·BLOCK_M …) of head bh = b·H + h: both passes, and the zero tiles past the
    diagonal under a causal mask."""
    NC = padded_length(N, P.dtype.element_ty.primitive_bitwidth, ROWS_PAD)
    b = bh // H
    h = bh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(Q + b * sqb + h * sqh + offs_m[:, None] * sqn + offs_d[None, :], offs_m, offs_d, N, D,
                  True, BLOCK_D != D)
    k_base = K + b * skb + (h // GROUP) * skh + offs_d[None, :]
    m_base = M + b * smb + h * smh + offs_m.to(tl.int64)[:, None] * smm
    p_base = P + bh * N * spn + offs_m.to(tl.int64)[:, None] * spn
    hi = N
    if CAUSAL:
        hi = (start_m + 1) * BLOCK_M  # keys past this block's last row are all masked (and keys past N)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if not NO_SOFTMAX and not ONE_TILE:
        # Pass 1: row max and sum, nothing written.
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = load_rows(k_base + offs_n[:, None] * skn, offs_n, offs_d, N, D, True, BLOCK_D != D)
            s = score_tile(q, k, m_base + offs_n[None, :] * smn, offs_m, offs_n, N, qk_scale, mask_scale,
                           BLOCK_M, BLOCK_N, CAUSAL, True, MASK_KIND, IEEE, UPCAST)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = masked_to_zero(m_new)
            l_i = l_i * tl.math.exp2(m_i - m_safe) + tl.sum(tl.math.exp2(s - m_safe[:, None]), 1)
            m_i = m_new
    if ONE_TILE:
        hi = BLOCK_N  # one tile: under a causal mask its entries past the diagonal come out 0 from the mask

    # Pass 2: the same tiles again, normalised, written once.
    out_ok = offs_m[:, None] < N
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = load_rows(k_base + offs_n[:, None] * skn, offs_n, offs_d, N, D, True, BLOCK_D != D)
        s = score_tile(q, k, m_base + offs_n[None, :] * smn, offs_m, offs_n, N, qk_scale, mask_scale,
                       BLOCK_M, BLOCK_N, CAUSAL, True, MASK_KIND, IEEE, UPCAST)
        if NO_SOFTMAX:
            p = masked_to_zero(s)
        else:
            if ONE_TILE:  # the whole row is this tile: its max first
                m_i = tl.max(s, 1)
            e = tl.math.exp2(s - masked_to_zero(m_i)[:, None])
            if ONE_TILE:  # and its sum
                l_i = tl.sum(e, 1)
            p = e * (1.0 / nonzero_sum(l_i))[:, None]
        tl.store(p_base + offs_n[None, :], p.to(P.dtype.element_ty), mask=out_ok & (offs_n[None, :] < NC))
    # Causal: the tiles past the diagonal hold zeros, written like the materialised build's softmax writes them,
    # so the two builds differ by the S round trip alone.
    hi_tiles = tl.cdiv(hi, BLOCK_N) * BLOCK_N
    for start_n in range(hi_tiles, N, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        zero = tl.zeros([BLOCK_M, BLOCK_N], dtype=P.dtype.element_ty)
        tl.store(p_base + offs_n[None, :], zero, mask=out_ok & (offs_n[None, :] < NC))
