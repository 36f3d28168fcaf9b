"""The fused build's backward: FlashAttention-2's (arXiv:2307.08691, Algorithm 2), in three kernels.

The training forward (attnlab.triton.fused with STORE_LSE) keeps O and each row's logsumexp lse, B·H·N floats, not
P's B·H·N². With S = scale·QKᵀ + mask, the backward recomputes P = exp(S − lse) tile by tile on chip:

    delta_kernel  Δ  = rowsum(dO ∘ O)               reads O, dO                   writes Δ (B, H, N) fp32
    dkdv_kernel   a program per key block; for each query block of each query head of its k/v head, in tiles
                  transposed (keys down), as FlashAttention-2 and Triton's tutorial compute them:
                  Pᵀ = exp(Sᵀ − lse)                recomputed, never stored
                  dV += Pᵀ dO
                  dPᵀ = V dOᵀ
                  dSᵀ = Pᵀ ∘ (dPᵀ − Δ)
                  dK += dSᵀ Q · scale                reads Q, K, V, dO, lse, Δ      writes dK, dV
    dq_kernel     a program per query block; for each key block:
                  the same P and dS; dQ += dS K · scale                            writes dQ

Why Δ: the softmax's backward is dS = P ∘ (dP − rowsum(P ∘ dP)), and rowsum(P ∘ dP) = rowsum(P ∘ dO Vᵀ) =
rowsum(dO ∘ P V) = rowsum(dO ∘ O): one dot product a row from O, instead of a sum over every key tile.

Why a pass of its own for dQ: dK and dV sum over query rows, dQ over keys. A program that owns a key block sums its
dK and dV in registers over every query block; dQ of a query block needs every key block, so it is summed by a
second pass that owns query blocks (QKᵀ and dO Vᵀ recomputed once more) instead of by atomic adds of each key
program's part into memory. Grouped-query attention: a dK/dV program of one k/v head loops over its group's query
heads, so the group's sum also stays in registers.

As in the forward, key and query ranges are split so the steady-state loop carries no per-element mask; the masked
tiles are the causal diagonal and the ragged tail (rows or keys past N). Causal tiles above the diagonal are never
visited. Rows past N read q and dO as 0 and lse as +inf, so their P and dS
are 0; so are a fully masked row's (the forward stores lse = +inf for it): its dQ is 0 and it adds nothing to dK, dV.

Scores are in log2 units, as in the forward: S₂ = S · log2 e (qk_scale = scale · log2 e, an additive mask times
log2 e), P = exp2(S₂ − lse · log2 e).
"""
import triton
import triton.language as tl

from attnlab.triton import config
from attnlab.triton.tiles import dot, load_rows, masked, score_tile

LOG2E = tl.constexpr(config.LOG2E)  # a global a @triton.jit function reads must be a constexpr


@triton.jit
def delta_kernel(O, DO, DELTA, sob, soh, son, sdob, sdoh, sdon, N, H,
                 D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    # grid: (cdiv(N, BLOCK_M), B·H). DELTA: fp32 (B, H, N) contiguous.
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = load_rows(O + b * sob + h * soh + offs_m[:, None] * son + offs_d[None, :], offs_m, offs_d, N, D, True,
                  BLOCK_D != D)
    do = load_rows(DO + b * sdob + h * sdoh + offs_m[:, None] * sdon + offs_d[None, :], offs_m, offs_d, N, D, True,
                   BLOCK_D != D)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh * N + offs_m, delta, mask=offs_m < N)


@triton.jit
def _row_stats(lse_ptrs, delta_ptrs, offs_m, N, MASKED: tl.constexpr):
    """A query block's lse in log2 units and its Δ; rows past N read lse = +inf (so their P is 0) and Δ = 0."""
    if MASKED:
        lse = tl.load(lse_ptrs, mask=offs_m < N, other=float("inf"))
        delta = tl.load(delta_ptrs, mask=offs_m < N, other=0.0)
    else:
        lse = tl.load(lse_ptrs)
        delta = tl.load(delta_ptrs)
    return lse * LOG2E, delta


@triton.jit
def _probs(q, k, lse2, mask_ptrs, offs_m, offs_n, N, qk_scale, mask_scale,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
           MASK_KIND: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """This tile's P = exp2(S₂ − lse₂), recomputed from q, k and the rows' lse: the forward's own score tile
    (scale, mask, causal and bounds as score_tile applies them); in the steady state (no mask of any kind) the scale
    is folded into one FMA, as the forward does."""
    if (not MASKED) and (MASK_KIND == 0):
        s = dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE, UPCAST)
        return tl.math.exp2(s * qk_scale - lse2[:, None])
    s = score_tile(q, k, mask_ptrs, offs_m, offs_n, N, qk_scale, mask_scale, BLOCK_M, BLOCK_N, MASKED and CAUSAL,
                   MASKED, MASK_KIND, IEEE, UPCAST)
    return tl.math.exp2(s - lse2[:, None])  # masked entries: exp2(-inf) = 0


@triton.jit
def _dscores(p, do, v, delta, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
             UPCAST: tl.constexpr):
    """dS = P ∘ (dP − Δ), dP = dO Vᵀ: the gradient of the natural-unit scores, fp32 (BLOCK_M, BLOCK_N)."""
    dp = dot(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE, UPCAST)
    return p * (dp - delta[:, None])


@triton.jit
def _probs_t(k, q, lse2, mask_ptrs, offs_m, offs_n, N, qk_scale, mask_scale,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
             MASK_KIND: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """Pᵀ of this tile, (BLOCK_N, BLOCK_M): keys down, query rows across, the orientation of the dK/dV program's
    accumulators, so that Pᵀ and dSᵀ feed its next dots straight from registers; P itself would reach them only
    through a transpose in shared memory each step. The scores and masks of _probs, transposed (mask_ptrs address
    the mask's (key, row) entries). Keys past N are not masked: see dkdv_kernel."""
    st = dot(k, tl.trans(q), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), IEEE, UPCAST) * qk_scale
    if MASK_KIND != 0:
        st = masked(st, mask_ptrs, (offs_n[:, None] < N) & (offs_m[None, :] < N), mask_scale, MASK_KIND)
    if MASKED and CAUSAL:
        st = tl.where(offs_m[None, :] >= offs_n[:, None], st, float("-inf"))
    return tl.math.exp2(st - lse2[None, :])  # masked entries, and rows past N (lse = +inf): 0


@triton.jit
def _dkdv_over_queries(dk, dv, k, v, q_base, do_base, lse_base, delta_base, m_base, offs_n, lo, hi, N,
                       sqn, sdon, smm, smn, qk_scale, mask_scale,
                       D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
                       IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """dK (unscaled) and dV of one key block, summed over the query blocks [lo, hi) of one query head; every tile
    transposed (keys down), as _probs_t computes it."""
    offs_d = tl.arange(0, BLOCK_D)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = load_rows(q_base + offs_m[:, None] * sqn, offs_m, offs_d, N, D, MASKED, BLOCK_D != D)
        do = load_rows(do_base + offs_m[:, None] * sdon, offs_m, offs_d, N, D, MASKED, BLOCK_D != D)
        lse2, delta = _row_stats(lse_base + offs_m, delta_base + offs_m, offs_m, N, MASKED)
        mask_ptrs = m_base + offs_m.to(tl.int64)[None, :] * smm + offs_n[:, None] * smn  # int64: row · N overflows
        pt = _probs_t(k, q, lse2, mask_ptrs, offs_m, offs_n, N, qk_scale, mask_scale, BLOCK_M, BLOCK_N, MASKED,
                      CAUSAL, MASK_KIND, IEEE, UPCAST)
        dv = dot(pt.to(do.dtype), do, dv, IEEE, UPCAST)  # dV += Pᵀ dO
        dpt = dot(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32), IEEE, UPCAST)  # dPᵀ = V dOᵀ
        dst = pt * (dpt - delta[None, :])  # dSᵀ = Pᵀ ∘ (dPᵀ − Δ)
        dk = dot(dst.to(q.dtype), q, dk, IEEE, UPCAST)  # dK += dSᵀ Q; the scale once, at the end
    return dk, dv


@triton.jit
def dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, M,
                sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdon,
                sdkb, sdkh, sdkn, sdvb, sdvh, sdvn, smb, smh, smm, smn,
                N, H, HKV, GROUP, qk_scale, mask_scale, scale,
                D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    # grid: (cdiv(N, BLOCK_N), B·Hkv): a program owns BLOCK_N keys of one k/v head and streams query blocks of
    # BLOCK_M rows past them. Requires BLOCK_N % BLOCK_M == 0 (the causal diagonal is whole query blocks).
    # LSE, DELTA: fp32 (B, H, N) contiguous. qk_scale = scale · log2 e, mask_scale = log2 e.
    start_n = tl.program_id(0) * BLOCK_N
    bhk = tl.program_id(1).to(tl.int64)
    b = bhk // HKV
    hk = bhk % HKV
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_rows(K + b * skb + hk * skh + offs_n[:, None] * skn + offs_d[None, :], offs_n, offs_d, N, D, True,
                  BLOCK_D != D)
    v = load_rows(V + b * svb + hk * svh + offs_n[:, None] * svn + offs_d[None, :], offs_n, offs_d, N, D, True,
                  BLOCK_D != D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # The query blocks: causal, those that cross this key block's diagonal, masked (rows above them see none of its
    # keys, rows below see all); then the unmasked ones wholly inside N; then the ragged tail, masked. A key block
    # that runs past N needs no mask of its own: its keys past N read as 0, and whatever their columns of P and dS
    # hold reaches only rows of dK and dV past N, which are never stored.
    full = (N // BLOCK_M) * BLOCK_M
    if CAUSAL:
        diagonal_hi = start_n + BLOCK_N
    else:
        diagonal_hi = 0
    for g in range(GROUP):  # the query heads that share this k/v head: dK, dV summed over them in registers
        h = hk * GROUP + g
        q_base = Q + b * sqb + h * sqh + offs_d[None, :]
        do_base = DO + b * sdob + h * sdoh + offs_d[None, :]
        lse_base = LSE + (b * H + h) * N
        delta_base = DELTA + (b * H + h) * N
        m_base = M + b * smb + h * smh
        if CAUSAL:
            dk, dv = _dkdv_over_queries(dk, dv, k, v, q_base, do_base, lse_base, delta_base, m_base, offs_n, start_n,
                                        diagonal_hi, N, sqn, sdon, smm, smn, qk_scale, mask_scale, D, BLOCK_D, BLOCK_M,
                                        BLOCK_N, True, CAUSAL, MASK_KIND, IEEE, UPCAST)
        dk, dv = _dkdv_over_queries(dk, dv, k, v, q_base, do_base, lse_base, delta_base, m_base, offs_n, diagonal_hi,
                                    full, N, sqn, sdon, smm, smn, qk_scale, mask_scale, D, BLOCK_D, BLOCK_M, BLOCK_N,
                                    False, CAUSAL, MASK_KIND, IEEE, UPCAST)
        dk, dv = _dkdv_over_queries(dk, dv, k, v, q_base, do_base, lse_base, delta_base, m_base, offs_n,
                                    tl.maximum(diagonal_hi, full), N, N, sqn, sdon, smm, smn, qk_scale, mask_scale, D,
                                    BLOCK_D, BLOCK_M, BLOCK_N, True, CAUSAL, MASK_KIND, IEEE, UPCAST)
    inside = (offs_n[:, None] < N) & (offs_d[None, :] < D)
    tl.store(DK + b * sdkb + hk * sdkh + offs_n[:, None] * sdkn + offs_d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=inside)
    tl.store(DV + b * sdvb + hk * sdvh + offs_n[:, None] * sdvn + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=inside)


@triton.jit
def _dq_over_keys(dq, q, do, lse2, delta, k_base, v_base, m_base, offs_m, lo, hi, N, skn, svn, smn,
                  qk_scale, mask_scale,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
                  IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """dQ (unscaled) of one query block, summed over the key blocks [lo, hi)."""
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = load_rows(k_base + offs_n[:, None] * skn, offs_n, offs_d, N, D, MASKED, BLOCK_D != D)
        v = load_rows(v_base + offs_n[:, None] * svn, offs_n, offs_d, N, D, MASKED, BLOCK_D != D)
        p = _probs(q, k, lse2, m_base + offs_n[None, :] * smn, offs_m, offs_n, N, qk_scale, mask_scale, BLOCK_M,
                   BLOCK_N, MASKED, CAUSAL, MASK_KIND, IEEE, UPCAST)
        ds = _dscores(p, do, v, delta, BLOCK_M, BLOCK_N, IEEE, UPCAST)
        dq = dot(ds.to(k.dtype), k, dq, IEEE, UPCAST)  # dQ += dS K; the scale once, at the end
    return dq


@triton.jit
def dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, M,
              sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdon, sdqb, sdqh, sdqn, smb, smh, smm, smn,
              N, H, GROUP, qk_scale, mask_scale, scale,
              D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    # grid: (cdiv(N, BLOCK_M), B·H): a program owns BLOCK_M query rows of one head and streams key blocks of BLOCK_N
    # past them. Requires BLOCK_M % BLOCK_N == 0 (the causal diagonal is whole key blocks).
    row0 = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_rows(Q + b * sqb + h * sqh + offs_m[:, None] * sqn + offs_d[None, :], offs_m, offs_d, N, D, True,
                  BLOCK_D != D)
    do = load_rows(DO + b * sdob + h * sdoh + offs_m[:, None] * sdon + offs_d[None, :], offs_m, offs_d, N, D, True,
                   BLOCK_D != D)
    lse2, delta = _row_stats(LSE + bh * N + offs_m, DELTA + bh * N + offs_m, offs_m, N, True)
    k_base = K + b * skb + hk * skh + offs_d[None, :]
    v_base = V + b * svb + hk * svh + offs_d[None, :]
    m_base = M + b * smb + h * smh + offs_m.to(tl.int64)[:, None] * smm
    if CAUSAL:
        free_hi = row0  # key blocks wholly left of these rows
        masked_hi = row0 + BLOCK_M  # the diagonal blocks (past N on the last row block: those keys are masked)
    else:
        free_hi = (N // BLOCK_N) * BLOCK_N
        masked_hi = N  # the ragged tail
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq = _dq_over_keys(dq, q, do, lse2, delta, k_base, v_base, m_base, offs_m, 0, free_hi, N, skn, svn, smn,
                       qk_scale, mask_scale, D, BLOCK_D, BLOCK_M, BLOCK_N, False, CAUSAL, MASK_KIND, IEEE, UPCAST)
    dq = _dq_over_keys(dq, q, do, lse2, delta, k_base, v_base, m_base, offs_m, free_hi, masked_hi, N, skn, svn,
                       smn, qk_scale, mask_scale, D, BLOCK_D, BLOCK_M, BLOCK_N, True, CAUSAL, MASK_KIND, IEEE,
                       UPCAST)
    tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqn + offs_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=(offs_m[:, None] < N) & (offs_d[None, :] < D))
