"""The backward passes of `materialised` and `qk_softmax`, from the P their forward kept in device memory.

The forward is S = scale · Q Kᵀ (+ mask), P = softmax(S) row by row, O = P V. Given dO = ∂L/∂O:

    dV = Pᵀ dO                  GQA: each k/v head sums over its group's query heads
    dP = dO Vᵀ
    dS = P ∘ (dP − Δ)           Δ = rowsum(dO ∘ O) = rowsum(P ∘ dP): the softmax's Jacobian applied to dP
    dQ = dS K · scale,  dK = dSᵀ Q · scale

Masked entries have P = 0, so dS = 0 there and no gradient flows through them; a fully masked row (P = 0, O = 0)
gives zeros, never NaN. The dS buffer holds scale · dS, the gradient with respect to QKᵀ itself: the scale is applied
once per element where dS is made, so that dQ and dK are plain products.

materialised, one kernel a step, every N × N operand through device memory:

    transposed_kernel            dV = Pᵀ dO                reads P, dO              writes dV
    materialised.scores_kernel   dP = dO Vᵀ                reads dO, V              writes dP (B, H, N, N)
    ds_kernel                    dS = P ∘ (dP − Δ)         reads P, dP, dO, O       writes dS (B, H, N, N)
    pv.pv_kernel                 dQ = dS K                 reads dS, K              writes dQ
    transposed_kernel            dK = dSᵀ Q                reads dS, Q              writes dK

qk_softmax, the same minus dP's round trip: ds_kernel with DP_ON_CHIP computes each dP tile from dO and V where it
needs it and writes only dS. dP = dO Vᵀ has the form of S = Q Kᵀ, and dQ = dS K the form of O = P V, so the forward's
score and PV kernels compute them (attnlab.triton.train_launch launches each): this module holds only the two kernels
the forward has no twin of. P, dP and dS are (B, H, N, N) views whose rows lie `s*n` elements apart
(attnlab.triton.layout.scores_buffer).
"""
import triton
import triton.language as tl

from attnlab.triton.tiles import dot, load_rows, padded_length


@triton.jit
def ds_kernel(P, DP, DO, O, V, DS,
              sdob, sdoh, sdon, sob, soh, son, svb, svh, svn,
              N, H, GROUP, scale, spn, sdpn, sdsn,
              D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, DP_ON_CHIP: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
              ROWS_PAD: tl.constexpr = False):
    # grid: (cdiv(N, BLOCK_M), B·H), one block of BLOCK_M query rows a program, walking its rows' key tiles.
    # DS = scale · P ∘ (dP − Δ) in the input dtype, every element written (zeros past a causal diagonal, as P holds),
    # so that the PV kernel and transposed_kernel read it as they read P. Under ROWS_PAD (layout.rows_pad) its rows
    # are written on to the next 16-byte vector past N, 0 there, which the PV kernel reads as it lies.
    # DP_ON_CHIP (qk_softmax): dP's tile is dO · Vᵀ, computed here; DP is never read. Else (materialised) it is read
    # from DP, where the score kernel left -inf past the causal diagonal: P = 0 there, and dS is 0 wherever P is.
    NC = padded_length(N, DS.dtype.element_ty.primitive_bitwidth, ROWS_PAD)
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # int64: bh · N² overflows int32 at long N
    b = bh // H
    h = bh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    rows_ok = offs_m[:, None] < N
    do = load_rows(DO + b * sdob + h * sdoh + offs_m[:, None] * sdon + offs_d[None, :], offs_m, offs_d, N, D,
                   True, BLOCK_D != D)
    o = load_rows(O + b * sob + h * soh + offs_m[:, None] * son + offs_d[None, :], offs_m, offs_d, N, D,
                  True, BLOCK_D != D)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)  # Δ for this block's rows, once, in fp32
    p_base = P + bh * N * spn + offs_m.to(tl.int64)[:, None] * spn
    dp_base = DP + bh * N * sdpn + offs_m.to(tl.int64)[:, None] * sdpn
    ds_base = DS + bh * N * sdsn + offs_m.to(tl.int64)[:, None] * sdsn
    v_base = V + b * svb + (h // GROUP) * svh
    hi = N
    if CAUSAL:
        hi = (start_m + 1) * BLOCK_M  # keys past this block's last row have P = 0
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        inside = rows_ok & (offs_n[None, :] < N)
        p = tl.load(p_base + offs_n[None, :], mask=inside, other=0.0).to(tl.float32)
        if DP_ON_CHIP:
            v = load_rows(v_base + offs_n[:, None] * svn + offs_d[None, :], offs_n, offs_d, N, D, True, BLOCK_D != D)
            dp = dot(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE, UPCAST)
        else:
            dp = tl.load(dp_base + offs_n[None, :], mask=inside, other=0.0).to(tl.float32)
        # where P = 0 (masked, past the diagonal, past N) dS is 0 whatever dP holds there (-inf in a causal dP)
        ds = p * tl.where(p == 0.0, 0.0, dp - delta[:, None]) * scale
        tl.store(ds_base + offs_n[None, :], ds.to(DS.dtype.element_ty), mask=rows_ok & (offs_n[None, :] < NC))
    # Causal: the tiles wholly past the diagonal hold zeros, as P's do.
    for start_n in range(tl.cdiv(hi, BLOCK_N) * BLOCK_N, N, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        zero = tl.zeros([BLOCK_M, BLOCK_N], dtype=DS.dtype.element_ty)
        tl.store(ds_base + offs_n[None, :], zero, mask=rows_ok & (offs_n[None, :] < NC))


@triton.jit
def transposed_kernel(A, X, Y,
                      sxb, sxh, sxn, syb, syh, syn,
                      N, HKV, GROUP, san,
                      D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      CAUSAL: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    # grid: (cdiv(N, BLOCK_N), B·Hkv). Y[b, j] = Σ over the query heads h of k/v head j of A[b, h]ᵀ X[b, h]:
    # dV = Pᵀ dO (A = P, X = dO) and dK = dSᵀ Q (A = the scaled dS, X = Q). A program owns BLOCK_N rows of Y (keys)
    # and walks the query rows in blocks of BLOCK_M, head after head of its group: the group's sum is made in
    # registers, with no atomics and no second pass. A is (B, H, N, N), rows san apart; X (B, H, N, D) and Y
    # (B, Hkv, N, D) have unit last stride.
    start_n = tl.program_id(0)
    bj = tl.program_id(1).to(tl.int64)
    b = bj // HKV
    j = bj % HKV
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    lo = 0
    if CAUSAL:
        lo = start_n * BLOCK_N  # query rows before this block's first key see none of its keys: A is 0 there
    acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for g in range(0, GROUP):
        h = j * GROUP + g
        a_base = A + (b * HKV * GROUP + h) * N * san
        x_base = X + b * sxb + h * sxh
        for start_m in range(lo, N, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            a = tl.load(a_base + offs_m.to(tl.int64)[:, None] * san + offs_n[None, :],
                        mask=(offs_m[:, None] < N) & (offs_n[None, :] < N), other=0.0)
            x = load_rows(x_base + offs_m[:, None] * sxn + offs_d[None, :], offs_m, offs_d, N, D, True,
                          BLOCK_D != D)
            acc = dot(tl.trans(a), x, acc, IEEE, UPCAST)
    y_ptrs = Y + b * syb + j * syh + offs_n[:, None] * syn + offs_d[None, :]
    tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=(offs_n[:, None] < N) & (offs_d[None, :] < D))
