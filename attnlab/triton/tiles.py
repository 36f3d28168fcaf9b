"""Tile routines shared by all three builds: the same load, the same QKᵀ tile, the same mask, the same dot.

Sharing them is what makes the builds comparable: `materialised`, `qk_softmax` and `fused` compute each score tile
with `score_tile`, so a time difference between two builds is the boundary one removes, not two ways of doing QKᵀ.
"""
import triton
import triton.language as tl


@triton.jit
def dot(a, b, acc, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b in float32.

    IEEE: float32 inputs multiply in true fp32 (Triton's default for fp32 is tf32, ~3e-4 relative error, which would
    fail the FlashAttention accuracy rule against torch's fp32). UPCAST: Triton's interpreter returns garbage for
    bf16 dots, so there the tiles go through fp32; the real bf16 path is proven on the GPU.
    """
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def load_rows(ptrs, rows, cols, N, D, ROW_BOUNDS: tl.constexpr, PAD_D: tl.constexpr):
    """Load a (rows, BLOCK_D) tile of q, k or v; rows past N and columns past D read as 0.

    Bounds are checked only where a block can cross them (constexpr flags), so the steady-state loop loads unmasked.
    """
    if ROW_BOUNDS:
        if PAD_D:
            return tl.load(ptrs, mask=(rows[:, None] < N) & (cols[None, :] < D), other=0.0)
        else:
            return tl.load(ptrs, mask=rows[:, None] < N, other=0.0)
    else:
        if PAD_D:
            return tl.load(ptrs, mask=cols[None, :] < D, other=0.0)
        else:
            return tl.load(ptrs)


@triton.jit
def masked(s, mask_ptrs, inside, mask_scale, MASK_KIND: tl.constexpr):
    """A score tile with its mask tile applied (entries outside `inside`, past N, read as masked out): boolean-False
    entries -inf (MASK_KIND 1), or the additive mask times mask_scale added (MASK_KIND 2)."""
    if MASK_KIND == 1:
        keep = tl.load(mask_ptrs, mask=inside, other=0)
        s = tl.where(keep != 0, s, float("-inf"))
    elif MASK_KIND == 2:
        add = tl.load(mask_ptrs, mask=inside, other=0.0)
        s = s + add.to(tl.float32) * mask_scale
    return s


@triton.jit
def score_tile(q, k, mask_ptrs, offs_m, offs_n, N, qk_scale, mask_scale,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL_TILE: tl.constexpr, COL_BOUNDS: tl.constexpr, MASK_KIND: tl.constexpr,
               IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """One (BLOCK_M, BLOCK_N) float32 tile of S = qk_scale · q kᵀ (+ mask_scale · additive mask).

    Masked entries are -inf: boolean-False mask entries (MASK_KIND 1), future keys on a tile that crosses the
    diagonal (CAUSAL_TILE), keys past N on the ragged last tile (COL_BOUNDS). MASK_KIND 2 adds the mask tile.
    qk_scale carries log2(e) in kernels that exponentiate with exp2, and mask_scale then carries it too.
    """
    s = dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), IEEE, UPCAST)
    s = s * qk_scale
    if MASK_KIND != 0:
        s = masked(s, mask_ptrs, (offs_m[:, None] < N) & (offs_n[None, :] < N), mask_scale, MASK_KIND)
    if CAUSAL_TILE:
        s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
    if COL_BOUNDS:
        s = tl.where(offs_n[None, :] < N, s, float("-inf"))
    return s


@triton.jit
def row_length(N, ELEM_BITS: tl.constexpr, ROWS_16B: tl.constexpr):
    """N, the length of a row of an (…, N, N) S or P, as the bounds masks compare with it (the rows themselves lie
    a separate stride apart, a multiple of 128 bytes: attnlab.triton.layout.scores_buffer). Under ROWS_16B (the
    launcher's promise that N × element size is a multiple of 16 bytes, see attnlab.triton.layout.rows_16b) it is
    written (N // v) · v, v the elements in 16 bytes: the same value, in a form the compiler can see is a multiple of
    v, so that no 16-byte vector straddles the mask's edge. Triton's own
    specialisation only notices N % 16 == 0, so at N = 3000 it read and wrote these rows two bytes at a time: the PV
    kernel's P loads were `ld.global.b16` instead of pipelined 16-byte copies."""
    if ROWS_16B:
        VEC: tl.constexpr = 128 // ELEM_BITS
        N = (N // VEC) * VEC
    return N


@triton.jit
def padded_length(N, ELEM_BITS: tl.constexpr, ROWS_PAD: tl.constexpr):
    """The bound for the column masks of loads and stores of S's and P's rows: N, or under ROWS_PAD (the launcher's
    promise, attnlab.triton.layout.rows_pad, that each row's padding reaches the next 16-byte vector past N and may
    be read and written) N rounded up to whole 16-byte vectors, in a form the compiler sees is a multiple of one, so
    that rows whose N × element size is not a multiple of 16 bytes (N = 2999) still move 16 bytes at a time
    (attnlab.triton.layout.vector_end is its host twin). Writers under ROWS_PAD fill the padding with their masked
    value (S −inf, P 0); the softmax kernel still masks what it reads from S's there (`past_n`), the PV kernel takes
    P's as it lies (masking it there cost the PV kernel registers). With 2-byte accesses the materialised build at
    N = 2999 ran 3.4× its time at N = 3000."""
    if ROWS_PAD:
        VEC: tl.constexpr = 128 // ELEM_BITS
        N = ((N + VEC - 1) // VEC) * VEC
    return N


@triton.jit
def past_n(x, cols, N, value, ROWS_PAD: tl.constexpr):
    """x with its columns at or past N set to `value` under ROWS_PAD (they were read from a row's padding,
    padded_length), else x itself."""
    if ROWS_PAD:
        x = tl.where(cols[None, :] < N, x, value).to(x.dtype)
    return x


@triton.jit
def masked_to_zero(s):
    """s with its -inf (masked) entries 0: the no_softmax ablation's P (the scores themselves), and a row max before
    exp2(s - max), so that a row every key of which is masked so far gives exp2(-inf) = 0, never NaN."""
    return tl.where(s == float("-inf"), 0.0, s)


@triton.jit
def nonzero_sum(l):
    """A row's sum of exponentials to divide by: a fully masked row (sum 0) gets 1, so its P (and O) is 0."""
    return tl.where(l == 0.0, 1.0, l)


# The no_pv ablation consumes P as Σ_n P[i, n] · n/N instead of P V: V is never read and no matmul runs, but every
# element of P still reaches O. Its accumulator is (rows, BLOCK_N): one FMA per score in the loop, one reduction over
# columns after it (at D = 64 a reduction per tile costs more than the tensor-core PV it replaces).

@triton.jit
def pv_accumulator(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NO_PV: tl.constexpr):
    """Zeros for O's accumulator: (BLOCK_M, BLOCK_D), or (BLOCK_M, BLOCK_N) under no_pv."""
    if NO_PV:
        return tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    else:
        return tl.zeros([BLOCK_M, BLOCK_D], tl.float32)


@triton.jit
def no_pv_step(acc, p, offs_n, inv_n):
    """acc + p · n/N for this tile's key columns n."""
    return acc + p.to(tl.float32) * (offs_n.to(tl.float32) * inv_n)[None, :]


@triton.jit
def no_pv_output(acc, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """The no_pv accumulator summed over its columns, broadcast over D: the (BLOCK_M, BLOCK_D) O it stands for."""
    return tl.sum(acc, 1)[:, None] + tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
