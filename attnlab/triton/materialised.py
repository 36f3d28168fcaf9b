"""Build 1, `materialised`: S and P both make a round trip through device memory.

    scores_kernel   S = scale · Q Kᵀ (+ mask)      reads Q, K        writes S (B, H, N, N)
    softmax_kernel  P = softmax(S) row by row       reads S           writes P (B, H, N, N)
    pv.pv_kernel    O = P V                         reads P, V        writes O

S and P are (B, H, N, N) views whose rows lie `ssn` and `spn` elements apart (attnlab.triton.layout.scores_buffer:
N, or more where N rows would not start on 128-byte lines).
"""
import triton
import triton.language as tl

from attnlab.triton.tiles import (load_rows, masked_to_zero, nonzero_sum, padded_length, past_n, row_length,
                                  score_tile)

LOG2E = tl.constexpr(1.4426950408889634)  # a global a @triton.jit function reads must be a constexpr


@triton.jit
def scores_kernel(Q, K, S, M,
                  sqb, sqh, sqn, skb, skh, skn, smb, smh, smm, smn,
                  N, H, GROUP, qk_scale, ssn,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
                  ROWS_16B: tl.constexpr = False, ROWS_PAD: tl.constexpr = False):
    # grid: (cdiv(N, BLOCK_M), cdiv(N, BLOCK_N), B·H); S is (B, H, N, N), rows ssn apart, in the input dtype,
    # in natural units (not log2), so the S a reader inspects is the S of the formula. Under ROWS_PAD the columns
    # from N to the next 16-byte vector are written too, as -inf (COL_BOUNDS), into the row's padding.
    N = row_length(N, S.dtype.element_ty.primitive_bitwidth, ROWS_16B)
    NC = padded_length(N, S.dtype.element_ty.primitive_bitwidth, ROWS_PAD)
    start_m = tl.program_id(0)
    start_n = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b = bh // H
    h = bh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    n_live = N
    if CAUSAL:
        n_live = (start_m + 1) * BLOCK_M  # a tile wholly past the diagonal is all -inf: no dot
    if start_n * BLOCK_N < n_live:
        q = load_rows(Q + b * sqb + h * sqh + offs_m[:, None] * sqn + offs_d[None, :], offs_m, offs_d, N, D,
                      True, BLOCK_D != D)
        k = load_rows(K + b * skb + (h // GROUP) * skh + offs_n[:, None] * skn + offs_d[None, :], offs_n, offs_d,
                      N, D, True, BLOCK_D != D)
        m_ptrs = M + b * smb + h * smh + offs_m.to(tl.int64)[:, None] * smm + offs_n[None, :] * smn
        s = score_tile(q, k, m_ptrs, offs_m, offs_n, N, qk_scale, 1.0, BLOCK_M, BLOCK_N,
                       CAUSAL, True, MASK_KIND, IEEE, UPCAST)
    else:
        s = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32)
    s_ptrs = S + bh * N * ssn + offs_m.to(tl.int64)[:, None] * ssn + offs_n[None, :]
    tl.store(s_ptrs, s.to(S.dtype.element_ty), mask=(offs_m[:, None] < N) & (offs_n[None, :] < NC))


@triton.jit
def softmax_kernel(S, P, n_rows, N, ssn, spn,
                   ROWS: tl.constexpr, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr, NO_SOFTMAX: tl.constexpr,
                   ROWS_16B: tl.constexpr = False, ROWS_PAD: tl.constexpr = False):
    # grid: (cdiv(B·H·N, ROWS),). Each program owns ROWS whole rows of S (length N, ssn apart; P's spn apart).
    # ONE_PASS (the row fits one block): S is read exactly once. Otherwise the row is streamed twice: once for its
    # max and sum (online, as in the fused kernel), once to write P. Under ROWS_PAD rows are read and written to the
    # next 16-byte vector past N (padded_length), what is read there counts as -inf, and P is 0 there.
    N = row_length(N, S.dtype.element_ty.primitive_bitwidth, ROWS_16B)
    NC = padded_length(N, S.dtype.element_ty.primitive_bitwidth, ROWS_PAD)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    s_row = S + rows.to(tl.int64)[:, None] * ssn
    p_row = P + rows.to(tl.int64)[:, None] * spn
    cols = tl.arange(0, BLOCK)
    if ONE_PASS:
        ok = row_ok[:, None] & (cols[None, :] < NC)
        s = past_n(tl.load(s_row + cols[None, :], mask=ok, other=float("-inf")).to(tl.float32), cols, N,
                   float("-inf"), ROWS_PAD)
        if NO_SOFTMAX:
            p = masked_to_zero(s)  # ablation: softmax → copy; same bytes in, same bytes out
        else:
            m = tl.max(s, 1)
            m = masked_to_zero(m)  # a fully masked row: exp2(-inf) = 0, never NaN
            e = tl.math.exp2((s - m[:, None]) * LOG2E)
            l = tl.sum(e, 1)
            p = e / nonzero_sum(l)[:, None]
        tl.store(p_row + cols[None, :], p.to(P.dtype.element_ty), mask=ok)
    else:
        m_i = tl.full([ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([ROWS], tl.float32)
        if not NO_SOFTMAX:
            for start in range(0, N, BLOCK):
                ok = row_ok[:, None] & (start + cols[None, :] < NC)
                s = past_n(tl.load(s_row + start + cols[None, :], mask=ok, other=float("-inf")).to(tl.float32),
                           start + cols, N, float("-inf"), ROWS_PAD)
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_safe = masked_to_zero(m_new)
                l_i = l_i * tl.math.exp2((m_i - m_safe) * LOG2E) + tl.sum(tl.math.exp2((s - m_safe[:, None]) * LOG2E), 1)
                m_i = m_new
        m_safe = masked_to_zero(m_i)
        inv_l = 1.0 / nonzero_sum(l_i)
        for start in range(0, N, BLOCK):
            ok = row_ok[:, None] & (start + cols[None, :] < NC)
            s = past_n(tl.load(s_row + start + cols[None, :], mask=ok, other=float("-inf")).to(tl.float32),
                       start + cols, N, float("-inf"), ROWS_PAD)
            if NO_SOFTMAX:
                p = masked_to_zero(s)
            else:
                p = tl.math.exp2((s - m_safe[:, None]) * LOG2E) * inv_l[:, None]
            tl.store(p_row + start + cols[None, :], p.to(P.dtype.element_ty), mask=ok)
