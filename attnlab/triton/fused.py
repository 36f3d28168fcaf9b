"""Build 3, `fused`: one flash-style kernel; neither S nor P leaves on-chip memory, only O is written.

Each program owns query rows and streams K/V in BLOCK_N tiles with the online softmax (FlashAttention-2,
arXiv:2307.08691): running row max m_i, running sum l_i, unnormalised accumulator acc, rescaled by
alpha = exp2(m_old - m_new) whenever the max grows, divided by l_i once at the end.

The key range is split in two so the steady-state loop carries no per-element mask:
  phase 1  key tiles that need no mask: for causal, those wholly left of the query rows; else every full tile;
  phase 2  the rest, masked element by element: the diagonal tiles (causal) or the ragged tail (N % BLOCK_N).
Causal tiles past the diagonal are never visited (in paired mode, A computes the two all-masked tiles of B's
diagonal with p = 0: see below).

Paired rows (Tiles.paired): a program owns two sub-blocks of BLOCK_M rows, A and B, and phase 1
streams each K/V tile once for both, in the order QKᵀ(A), QKᵀ(B), softmax(A), PV(A), softmax(B), PV(B). Triton
waits for a score matmul at once but leaves PV(A) running on the tensor cores (its result is next needed one
iteration later), so softmax(B) overlaps it: Hopper's matmul units and its exp/FMA units work at the same time, which
a single-block loop never lets them do. The masked tiles (the two diagonals, or the ragged tail) follow in one
masked paired pass.

Training (STORE_LSE): the kernel also writes each row's logsumexp, lse = ln Σ_n exp(s_n) of the scaled and masked
scores, fp32, (B, H, N) contiguous; +inf for a row every key of which is masked, so that the backward's
exp(s − lse) is 0 there (attnlab.triton.fused_backward recomputes P from it). Off, nothing of it is compiled in.
"""
import triton
import triton.language as tl

from attnlab.triton.tiles import (dot, load_rows, masked_to_zero, no_pv_output, no_pv_step, nonzero_sum,
                                  pv_accumulator, score_tile)

LN2 = tl.constexpr(0.6931471805599453)  # the running max and sum are in log2 units (exp2); lse is a natural log


@triton.jit
def _load_kv(base, start_n, offs_n, offs_d, N, D, stride, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
             MASKED: tl.constexpr, STEP: tl.constexpr):
    """One (BLOCK_N, BLOCK_D) tile of K or V; rows past N read as zeros.

    STEP: `base` points at the head's first tile and moves by a scalar offset (fewer live registers: the paired
    loop, which runs at the register limit, spills less); else `base` is the head's row 0 and each element's row
    is added (the single-block loop measured 1–6 % faster this way on the H200)."""
    if STEP:
        return load_rows(base + start_n * stride, offs_n, offs_d, N, D, MASKED, BLOCK_D != D)
    else:
        return load_rows(base + offs_n[:, None] * stride, offs_n, offs_d, N, D, MASKED, BLOCK_D != D)


@triton.jit
def _scores(q, k, m_base, offs_m, offs_n, N, smn, qk_scale, mask_scale,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
            MASK_KIND: tl.constexpr, NO_SOFTMAX: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """This tile's scores: raw q·kᵀ in the steady state (the scale is folded into exp2 by _online_softmax),
    else scaled, with the explicit mask added and masked entries -inf (score_tile)."""
    if (not MASKED) and (MASK_KIND == 0) and (not NO_SOFTMAX):
        return dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE, UPCAST)
    else:
        return score_tile(q, k, m_base + offs_n[None, :] * smn, offs_m, offs_n, N, qk_scale, mask_scale,
                          BLOCK_M, BLOCK_N, MASKED and CAUSAL, MASKED, MASK_KIND, IEEE, UPCAST)


@triton.jit
def _online_softmax(s, acc, l_i, m_i, qk_scale, MASKED: tl.constexpr, MASK_KIND: tl.constexpr,
                    NO_SOFTMAX: tl.constexpr):
    """P for this tile, and acc, l_i, m_i carried over to the new running max."""
    if NO_SOFTMAX:
        return masked_to_zero(s), acc, l_i, m_i  # ablation: P = S; no max, no exp, no rescale
    if (not MASKED) and (MASK_KIND == 0):
        # Steady state: one FMA per score (the scale folded into exp2's argument), not MUL + SUB.
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_use = m_new
        p = tl.math.exp2(s * qk_scale - m_use[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = m_new
        if MASK_KIND != 0:
            # An explicit mask can hide a whole row so far: subtract 0 then, so exp2 gives 0, not NaN. The running
            # max itself stays -inf: were the 0 kept, scores far below 0 in later tiles would underflow to p = 0 in
            # fp16 and the row would come out all zeros.
            m_use = masked_to_zero(m_new)
        p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)  # rescales what was accumulated under the old max
    return p, acc * alpha[:, None], l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def _accumulate(acc, p, v, offs_n, inv_n, NO_PV: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    if NO_PV:
        return no_pv_step(acc, p, offs_n, inv_n)  # ablation: V never read, every element of P still reaches O
    else:
        return dot(p.to(v.dtype), v, acc, IEEE, UPCAST)


@triton.jit
def _stream_kv(acc, l_i, m_i, q, k_base, v_base, m_base, offs_m, lo, hi, N, skn, svn, smn,
               qk_scale, mask_scale, inv_n,
               D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
               NO_SOFTMAX: tl.constexpr, NO_PV: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """One block of query rows over key tiles [lo, hi)."""
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_kv(k_base, start_n, offs_n, offs_d, N, D, skn, BLOCK_N, BLOCK_D, MASKED, False)
        s = _scores(q, k, m_base, offs_m, offs_n, N, smn, qk_scale, mask_scale, BLOCK_M, BLOCK_N, MASKED, CAUSAL,
                    MASK_KIND, NO_SOFTMAX, IEEE, UPCAST)
        p, acc, l_i, m_i = _online_softmax(s, acc, l_i, m_i, qk_scale, MASKED, MASK_KIND, NO_SOFTMAX)
        if NO_PV:
            v = k  # never read
        else:
            v = _load_kv(v_base, start_n, offs_n, offs_d, N, D, svn, BLOCK_N, BLOCK_D, MASKED, False)
        acc = _accumulate(acc, p, v, offs_n, inv_n, NO_PV, IEEE, UPCAST)
    return acc, l_i, m_i


@triton.jit
def _stream_kv_paired(acc_a, l_a, m_a, q_a, offs_a, mb_a, acc_b, l_b, m_b, q_b, offs_b, mb_b,
                      k_base, v_base, lo, hi, N, skn, svn, smn, qk_scale, mask_scale, inv_n,
                      D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
                      NO_SOFTMAX: tl.constexpr, NO_PV: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """Two blocks of query rows over key tiles [lo, hi), each K/V tile loaded once for both. The statement order is
    the point (module docstring): both score matmuls, then softmax and PV of A, then of B."""
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_kv(k_base, start_n, offs_n, offs_d, N, D, skn, BLOCK_N, BLOCK_D, MASKED, True)
        s_a = _scores(q_a, k, mb_a, offs_a, offs_n, N, smn, qk_scale, mask_scale, BLOCK_M, BLOCK_N, MASKED, CAUSAL,
                      MASK_KIND, NO_SOFTMAX, IEEE, UPCAST)
        s_b = _scores(q_b, k, mb_b, offs_b, offs_n, N, smn, qk_scale, mask_scale, BLOCK_M, BLOCK_N, MASKED, CAUSAL,
                      MASK_KIND, NO_SOFTMAX, IEEE, UPCAST)
        if NO_PV:
            v = k  # never read
        else:
            v = _load_kv(v_base, start_n, offs_n, offs_d, N, D, svn, BLOCK_N, BLOCK_D, MASKED, True)
        p_a, acc_a, l_a, m_a = _online_softmax(s_a, acc_a, l_a, m_a, qk_scale, MASKED, MASK_KIND, NO_SOFTMAX)
        acc_a = _accumulate(acc_a, p_a, v, offs_n, inv_n, NO_PV, IEEE, UPCAST)
        p_b, acc_b, l_b, m_b = _online_softmax(s_b, acc_b, l_b, m_b, qk_scale, MASKED, MASK_KIND, NO_SOFTMAX)
        acc_b = _accumulate(acc_b, p_b, v, offs_n, inv_n, NO_PV, IEEE, UPCAST)
    return acc_a, l_a, m_a, acc_b, l_b, m_b


@triton.jit
def _attend_rows(acc, l_i, m_i, q, k_base, v_base, m_base, offs_m, row0, N, skn, svn, smn,
                 qk_scale, mask_scale, inv_n,
                 D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, NO_SOFTMAX: tl.constexpr, NO_PV: tl.constexpr,
                 IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """One block of rows [row0, row0 + BLOCK_M) over its unmasked key tiles (phase 1), then its masked ones
    (phase 2)."""
    if CAUSAL:
        free_hi = row0  # key tiles wholly left of these rows
        masked_hi = row0 + BLOCK_M  # past N on the last block: those keys are masked
    else:
        free_hi = (N // BLOCK_N) * BLOCK_N
        masked_hi = N
    acc, l_i, m_i = _stream_kv(acc, l_i, m_i, q, k_base, v_base, m_base, offs_m, 0, free_hi, N,
                               skn, svn, smn, qk_scale, mask_scale, inv_n, D, BLOCK_D, BLOCK_M, BLOCK_N,
                               False, CAUSAL, MASK_KIND, NO_SOFTMAX, NO_PV, IEEE, UPCAST)
    acc, l_i, m_i = _stream_kv(acc, l_i, m_i, q, k_base, v_base, m_base, offs_m, free_hi,
                               masked_hi, N, skn, svn, smn, qk_scale, mask_scale, inv_n, D, BLOCK_D, BLOCK_M,
                               BLOCK_N, True, CAUSAL, MASK_KIND, NO_SOFTMAX, NO_PV, IEEE, UPCAST)
    return acc, l_i, m_i


@triton.jit
def _write_rows(O, acc, l_i, offs_m, offs_d, o_base, son, N, D, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                NO_SOFTMAX: tl.constexpr, NO_PV: tl.constexpr):
    if NO_PV:
        acc = no_pv_output(acc, BLOCK_M, BLOCK_D)
    if not NO_SOFTMAX:
        acc = acc / nonzero_sum(l_i)[:, None]  # a fully masked row gives O = 0
    tl.store(o_base + offs_m[:, None] * son + offs_d[None, :], acc.to(O.dtype.element_ty),
             mask=(offs_m[:, None] < N) & (offs_d[None, :] < D))


@triton.jit
def _write_lse(LSE, l_i, m_i, offs_m, bh, N):
    """Each row's logsumexp, ln 2 · (m_i + log2 l_i) (m_i, l_i: the running max and sum, in log2 units); +inf for a
    fully masked row (l_i = 0)."""
    lse = (m_i + tl.math.log2(nonzero_sum(l_i))) * LN2
    lse = tl.where(l_i == 0.0, float("inf"), lse)
    tl.store(LSE + bh * N + offs_m, lse, mask=offs_m < N)


@triton.jit
def fused_kernel(Q, K, V, O, M,
                 sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, smb, smh, smm, smn,
                 N, H, GROUP, qk_scale, mask_scale, inv_n,
                 D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, NO_SOFTMAX: tl.constexpr, NO_PV: tl.constexpr,
                 IEEE: tl.constexpr, UPCAST: tl.constexpr, HEAVY_FIRST: tl.constexpr, PAIRED: tl.constexpr,
                 LSE=None, STORE_LSE: tl.constexpr = False):
    # grid: (cdiv(N, rows per program), B·H), rows per program = BLOCK_M, or 2·BLOCK_M when PAIRED. Requires
    # BLOCK_M % BLOCK_N == 0 (the causal split is in whole key tiles). qk_scale = scale · log2 e (natural scale
    # under NO_SOFTMAX, whose P is S itself).
    # STORE_LSE (training; no ablation): each row's logsumexp into LSE, fp32 (B, H, N) contiguous (module docstring).
    start_m = tl.program_id(0)
    if HEAVY_FIRST:
        # the GPU starts programs roughly in order of id: under a causal mask the last query block has the most key
        # tiles, so hand it out first and let the short blocks fill the gaps at the end of the grid
        start_m = tl.num_programs(0) - 1 - start_m
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    hk = h // GROUP  # grouped-query attention: GROUP query heads read one k/v head
    offs_d = tl.arange(0, BLOCK_D)
    q_base = Q + b * sqb + h * sqh + offs_d[None, :]
    k_base = K + b * skb + hk * skh + offs_d[None, :]  # row 0 of this head's K, V
    v_base = V + b * svb + hk * svh + offs_d[None, :]
    o_base = O + b * sob + h * soh
    mh_base = M + b * smb + h * smh
    if PAIRED:
        row0 = start_m * 2 * BLOCK_M
    else:
        row0 = start_m * BLOCK_M
    offs_a = row0 + tl.arange(0, BLOCK_M)
    q_a = load_rows(q_base + offs_a[:, None] * sqn, offs_a, offs_d, N, D, True, BLOCK_D != D)
    mb_a = mh_base + offs_a.to(tl.int64)[:, None] * smm  # int64: row · N overflows past N = 46340
    acc_a = pv_accumulator(BLOCK_M, BLOCK_N, BLOCK_D, NO_PV)
    m_a = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_a = tl.zeros([BLOCK_M], tl.float32)
    if PAIRED:
        offs_b = offs_a + BLOCK_M
        q_b = load_rows(q_base + offs_b[:, None] * sqn, offs_b, offs_d, N, D, True, BLOCK_D != D)
        mb_b = mh_base + offs_b.to(tl.int64)[:, None] * smm
        acc_b = pv_accumulator(BLOCK_M, BLOCK_N, BLOCK_D, NO_PV)
        k_tile0 = k_base + tl.arange(0, BLOCK_N)[:, None] * skn  # the paired loop steps these by a scalar
        v_tile0 = v_base + tl.arange(0, BLOCK_N)[:, None] * svn
        m_b = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_b = tl.zeros([BLOCK_M], tl.float32)
        if CAUSAL:
            done = row0  # key tiles wholly left of both sub-blocks
            hi = row0 + 2 * BLOCK_M  # the two diagonals; A's second half is all masked (p = 0), B's first is not
        else:
            done = (N // BLOCK_N) * BLOCK_N
            hi = N  # the ragged tail, N % BLOCK_N keys
        # Phase 1 unmasked, phase 2 masked, both as one paired pass. Finishing A and B one after the other instead
        # keeps one's accumulator live across the other's loops, and ptxas then serialises every wgmma of the
        # causal kernel (its C7515 advisory; attnlab.triton.resources reports it): that cost more than the few
        # all-masked tiles of A this order computes.
        acc_a, l_a, m_a, acc_b, l_b, m_b = _stream_kv_paired(
            acc_a, l_a, m_a, q_a, offs_a, mb_a, acc_b, l_b, m_b, q_b, offs_b, mb_b, k_tile0, v_tile0,
            0, done, N, skn, svn, smn, qk_scale, mask_scale, inv_n, D, BLOCK_D, BLOCK_M, BLOCK_N, False, CAUSAL,
            MASK_KIND, NO_SOFTMAX, NO_PV, IEEE, UPCAST)
        acc_a, l_a, m_a, acc_b, l_b, m_b = _stream_kv_paired(
            acc_a, l_a, m_a, q_a, offs_a, mb_a, acc_b, l_b, m_b, q_b, offs_b, mb_b, k_tile0, v_tile0,
            done, hi, N, skn, svn, smn, qk_scale, mask_scale, inv_n, D, BLOCK_D, BLOCK_M, BLOCK_N, True, CAUSAL,
            MASK_KIND, NO_SOFTMAX, NO_PV, IEEE, UPCAST)
        _write_rows(O, acc_b, l_b, offs_b, offs_d, o_base, son, N, D, BLOCK_M, BLOCK_D, NO_SOFTMAX, NO_PV)
        if STORE_LSE:
            _write_lse(LSE, l_b, m_b, offs_b, bh, N)
    else:
        acc_a, l_a, m_a = _attend_rows(acc_a, l_a, m_a, q_a, k_base, v_base, mb_a, offs_a, row0, N, skn,
                                       svn, smn, qk_scale, mask_scale, inv_n, D, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL,
                                       MASK_KIND, NO_SOFTMAX, NO_PV, IEEE, UPCAST)
    _write_rows(O, acc_a, l_a, offs_a, offs_d, o_base, son, N, D, BLOCK_M, BLOCK_D, NO_SOFTMAX, NO_PV)
    if STORE_LSE:
        _write_lse(LSE, l_a, m_a, offs_a, bh, N)
