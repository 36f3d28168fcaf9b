# The fused kernel as of commit ab5adfe (session 2), kept verbatim for the A/B timing in ab_fused.py.
"""Build 3, `fused`: one flash-style kernel; neither S nor P leaves on-chip memory, only O is written.

Each program owns BLOCK_M query rows and streams K/V in BLOCK_N tiles with the online softmax (FlashAttention-2,
arXiv:2307.08691): running row max m_i, running sum l_i, unnormalised accumulator acc, rescaled by
alpha = exp2(m_old - m_new) whenever the max grows, divided by l_i once at the end.

The key range is split in two so the steady-state loop carries no per-element mask:
  phase 1  key tiles that need no mask: for causal, those wholly left of this query block; else every full tile;
  phase 2  the rest, masked element by element: the diagonal tiles (causal) or the ragged tail (N % BLOCK_N).
Causal tiles past the diagonal are never visited.
"""
import triton
import triton.language as tl

from attnlab.triton.tiles import dot, load_rows, masked_to_zero, positions, score_tile


@triton.jit
def _stream_kv(acc, l_i, m_i, q, k_base, v_base, m_base, DK, DV, kv_head, offs_m, lo, hi, N, skn, svn, smn,
               qk_scale, mask_scale, inv_n,
               D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
               NO_SOFTMAX: tl.constexpr, NO_PV: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
               TMA: tl.constexpr):
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if TMA:
            # Hopper's bulk tensor copy: one descriptor per (B·Hkv, N, D) tensor; rows past N come back as zeros.
            k = DK.load([kv_head, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        else:
            k = load_rows(k_base + offs_n[:, None] * skn, offs_n, offs_d, N, D, MASKED, BLOCK_D != D)
        if (not MASKED) and (MASK_KIND == 0) and (not NO_SOFTMAX):
            # Steady state: raw scores, the scale folded into exp2's argument (one FMA per score, not MUL + SUB).
            s = dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE, UPCAST)
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_use = m_new
            p = tl.math.exp2(s * qk_scale - m_use[:, None])
        else:
            s = score_tile(q, k, m_base + offs_n[None, :] * smn, offs_m, offs_n, N, qk_scale, mask_scale,
                           BLOCK_M, BLOCK_N, MASKED and CAUSAL, MASKED, MASK_KIND, IEEE, UPCAST)
            if NO_SOFTMAX:
                p = masked_to_zero(s)  # ablation: P = S; no max, no exp, no rescale
            else:
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_use = m_new
                if MASK_KIND != 0:
                    # An explicit mask can hide a whole row so far: subtract 0 then, so exp2 gives 0, not NaN. The
                    # running max itself stays -inf: were the 0 kept, scores far below 0 in later tiles would
                    # underflow to p = 0 in fp16 and the row would come out all zeros.
                    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                p = tl.math.exp2(s - m_use[:, None])
        if not NO_SOFTMAX:
            alpha = tl.math.exp2(m_i - m_use)  # rescales what was accumulated under the old max
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            m_i = m_new
        if NO_PV:
            # Ablation: V is never read and no matmul runs, but every element of P still reaches O. acc is
            # (BLOCK_M, BLOCK_N) here: one FMA per score, reduced over columns once, after the loop.
            acc += p * positions(offs_n, inv_n)[None, :]
        else:
            if TMA:
                v = DV.load([kv_head, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
            else:
                v = load_rows(v_base + offs_n[:, None] * svn, offs_n, offs_d, N, D, MASKED, BLOCK_D != D)
            acc = dot(p.to(v.dtype), v, acc, IEEE, UPCAST)
    return acc, l_i, m_i


@triton.jit
def fused_kernel(Q, K, V, O, M, DK, DV,
                 sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, smb, smh, smm, smn,
                 N, H, GROUP, qk_scale, mask_scale, inv_n,
                 D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, NO_SOFTMAX: tl.constexpr, NO_PV: tl.constexpr,
                 IEEE: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr, HEAVY_FIRST: tl.constexpr):
    # grid: (cdiv(N, BLOCK_M), B·H). Requires BLOCK_M % BLOCK_N == 0 (the causal split is in whole key tiles).
    # qk_scale = scale · log2 e (natural scale under NO_SOFTMAX, whose P is S itself).
    start_m = tl.program_id(0)
    if HEAVY_FIRST:
        # the GPU starts programs roughly in order of id: under a causal mask the last query block has the most key
        # tiles, so hand it out first and let the short blocks fill the gaps at the end of the grid
        start_m = tl.num_programs(0) - 1 - start_m
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    hk = h // GROUP  # grouped-query attention: GROUP query heads read one k/v head
    kv_head = (b * (H // GROUP) + hk).to(tl.int32)  # row of the (B·Hkv, N, D) TMA descriptors
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(Q + b * sqb + h * sqh + offs_m[:, None] * sqn + offs_d[None, :], offs_m, offs_d, N, D,
                  True, BLOCK_D != D)
    k_base = K + b * skb + hk * skh + offs_d[None, :]
    v_base = V + b * svb + hk * svh + offs_d[None, :]
    m_base = M + b * smb + h * smh + offs_m.to(tl.int64)[:, None] * smm  # int64: row · N overflows past N = 46340

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if NO_PV:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)  # Σ_n p·n/N per column slot, summed after the loop
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        free_hi = start_m * BLOCK_M
        masked_lo = free_hi
        masked_hi = (start_m + 1) * BLOCK_M  # past N on the last block: those keys are masked
    else:
        free_hi = (N // BLOCK_N) * BLOCK_N
        masked_lo = free_hi
        masked_hi = N
    acc, l_i, m_i = _stream_kv(acc, l_i, m_i, q, k_base, v_base, m_base, DK, DV, kv_head, offs_m, 0, free_hi, N,
                               skn, svn, smn, qk_scale, mask_scale, inv_n, D, BLOCK_D, BLOCK_M, BLOCK_N,
                               False, CAUSAL, MASK_KIND, NO_SOFTMAX, NO_PV, IEEE, UPCAST, TMA)
    acc, l_i, m_i = _stream_kv(acc, l_i, m_i, q, k_base, v_base, m_base, DK, DV, kv_head, offs_m, masked_lo,
                               masked_hi, N, skn, svn, smn, qk_scale, mask_scale, inv_n, D, BLOCK_D, BLOCK_M,
                               BLOCK_N, True, CAUSAL, MASK_KIND, NO_SOFTMAX, NO_PV, IEEE, UPCAST, TMA)
    if NO_PV:
        acc = tl.sum(acc, 1)[:, None] + tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # broadcast over D
    if not NO_SOFTMAX:
        acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a fully masked row gives O = 0
    o_ptrs = O + b * sob + h * soh + offs_m[:, None] * son + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < N) & (offs_d[None, :] < D))
