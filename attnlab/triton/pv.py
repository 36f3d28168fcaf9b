"""O = P V from a P that lives in device memory: the last kernel of `materialised` and of `qk_softmax` alike."""
import triton
import triton.language as tl

from attnlab.triton.tiles import dot, load_rows, no_pv_output, no_pv_step, padded_length, pv_accumulator, row_length


@triton.jit
def pv_kernel(P, V, O,
              svb, svh, svn, sob, soh, son,
              N, H, GROUP, inv_n, spn,
              D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, NO_PV: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
              STAGES: tl.constexpr, ROWS_16B: tl.constexpr = False, ROWS_PAD: tl.constexpr = False):
    # grid: (cdiv(N, BLOCK_M), B·H). P is (B, H, N, N), rows spn apart (layout.scores_buffer); V is (B, Hkv, N, D)
    # with unit last stride. Under ROWS_PAD P's rows are read to the next 16-byte vector past N (padded_length), and
    # what lies there is taken as it lies: every writer of P leaves 0 there (layout.padded_view). Masking it here
    # instead took P's tiles into registers: 145 a thread against 97 at 8 warps.
    N = row_length(N, P.dtype.element_ty.primitive_bitwidth, ROWS_16B)
    NC = padded_length(N, P.dtype.element_ty.primitive_bitwidth, ROWS_PAD)
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # int64: bh · N² overflows int32 from N = 11586 at B·H = 16
    b = bh // H
    h = bh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    p_base = P + bh * N * spn + offs_m.to(tl.int64)[:, None] * spn
    v_base = V + b * svb + (h // GROUP) * svh
    acc = pv_accumulator(BLOCK_M, BLOCK_N, BLOCK_D, NO_PV)
    hi = N
    if CAUSAL:
        hi = (start_m + 1) * BLOCK_M  # P is 0 past the diagonal: those tiles are never read
    if NO_PV:
        # Ablation (attnlab.triton.tiles: no_pv_step). Triton pipelines loads through shared memory only for loops
        # it is told to, or that feed a tl.dot: without num_stages this loop read P straight into registers (0 bytes
        # of shared memory, attnlab.triton.resources) while the base pipelines it, and under a causal mask the
        # stand-in ran slower than the PV it replaces.
        for start_n in tl.range(0, hi, BLOCK_N, num_stages=STAGES):  # STAGES: the launch's num_stages
            offs_n = start_n + tl.arange(0, BLOCK_N)
            p = tl.load(p_base + offs_n[None, :], mask=(offs_m[:, None] < N) & (offs_n[None, :] < NC), other=0.0)
            acc = no_pv_step(acc, p, offs_n, inv_n)
    else:
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            p = tl.load(p_base + offs_n[None, :], mask=(offs_m[:, None] < N) & (offs_n[None, :] < NC), other=0.0)
            v = load_rows(v_base + offs_n[:, None] * svn + offs_d[None, :], offs_n, offs_d, N, D, True, BLOCK_D != D)
            acc = dot(p, v, acc, IEEE, UPCAST)
    if NO_PV:
        acc = no_pv_output(acc, BLOCK_M, BLOCK_D)
    o_ptrs = O + b * sob + h * soh + offs_m[:, None] * son + offs_d[None, :]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < N) & (offs_d[None, :] < D))
