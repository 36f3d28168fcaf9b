"""The fused build's Hopper fast path, written in Gluon (Triton's lower-level dialect): FA3's order inside a loop.

Why it exists (PERFORMANCE.md v9): compiled by stock Triton 3.6, our fused loop waits for every QKᵀ matmul at once
(`wgmma.wait_group 0`), so the tensor cores idle while the exponentials run. Gluon lets the kernel say when to wait.
Each iteration j issues QKᵀ(j) and then PV(j-1), both asynchronous, waits only for QKᵀ(j) (`num_outstanding=1`), and
runs softmax(j) while PV(j-1) is still on the tensor cores; the rescale of O waits for PV(j-1). K and V tiles arrive by
TMA into a ring of STAGES buffers, each with its own mbarrier, refilled as soon as the matmul that read it is known
to be done.

Scope: sm90 (H100/H200), bf16/fp16, D in {64, 128}, no attn_mask (causal or not), any N, GQA, no ablation. Every
other call takes the Triton kernel (attnlab.triton.fused), which is also the path CI runs: Gluon has no CPU
interpreter, so this kernel is compiled for sm_90a in CI (tests/test_fused_gluon.py) and checked against the fp64
reference on the GPU by the gate.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)


@gluon.jit
def _softmax_tile(s, m_i, l_i, qk_scale, offs_m, offs_n, N, MASKED: gl.constexpr, CAUSAL: gl.constexpr):
    """One tile of the online softmax in exp2 units: P = 2^(S·scale − m_new), and the factor α that rescales what
    was accumulated before."""
    s = s * qk_scale
    if MASKED:
        keep = offs_n[None, :] < N
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        s = gl.where(keep, s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def _load_tile(desc, bars, smem, stage, b, h, row, pred):
    bar = bars.index(stage)
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [b, h, row, 0], bar, smem.index(stage), pred=pred)


@gluon.jit
def fused_gluon_kernel(q_desc, k_desc, v_desc, o_desc, N, H, GROUP, qk_scale,
                       D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                       CAUSAL: gl.constexpr, HEAVY_FIRST: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    n_m = gl.cdiv(N, BLOCK_M)
    pid = gl.program_id(0)
    if HEAVY_FIRST:  # causal: the longest rows first, so the grid does not end on one long program
        pid = n_m - 1 - pid
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    start_m = pid * BLOCK_M

    # Two warpgroups split the rows (warps_per_cta [num_warps, 1]); S and O are wgmma accumulators, P the register
    # A operand of the PV matmul.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()

    hi = N
    if CAUSAL:
        hi = gl.minimum(N, start_m + BLOCK_M)
    n_tiles = gl.cdiv(hi, BLOCK_N)

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b, h, start_m, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _load_tile(k_desc, k_bars, k_smem, i, b, hk, i * BLOCK_N, i < n_tiles)
        _load_tile(v_desc, v_bars, v_smem, i, b, hk, i * BLOCK_N, i < n_tiles)

    offs_m = start_m + gl.arange(0, BLOCK_M, row_s)
    cols = gl.arange(0, BLOCK_N, col_s)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)

    mbarrier.wait(q_bar, 0)
    q = q_smem.reshape([BLOCK_M, D])
    # tile 0: QKᵀ alone (there is no PV before it)
    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(q, k_smem.index(0).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                      is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
    if (BLOCK_N > hi) or (CAUSAL and BLOCK_N > start_m):
        p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, offs_m, cols, N, True, CAUSAL)
    else:
        p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, offs_m, cols, N, False, CAUSAL)

    for j in range(1, n_tiles):
        stage = j % STAGES
        prev = (j - 1) % STAGES
        # K of tile j-1 was last read by QKᵀ(j-1), finished in the previous iteration: refill its slot now.
        _load_tile(k_desc, k_bars, k_smem, prev, b, hk, (j - 1 + STAGES) * BLOCK_N, j - 1 + STAGES < n_tiles)
        mbarrier.wait(k_bars.index(stage), (j // STAGES) & 1)
        s = warpgroup_mma(q, k_smem.index(stage).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                          is_async=True)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc = warpgroup_mma(p_op, v_smem.index(prev).reshape([BLOCK_N, D]), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=[s])  # QKᵀ(j) done; PV(j-1) still running
        if ((j + 1) * BLOCK_N > hi) or (CAUSAL and (j + 1) * BLOCK_N > start_m):
            p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, offs_m, j * BLOCK_N + cols, N, True, CAUSAL)
        else:
            p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, offs_m, j * BLOCK_N + cols, N, False, CAUSAL)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=[acc, p_op])
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        _load_tile(v_desc, v_bars, v_smem, prev, b, hk, (j - 1 + STAGES) * BLOCK_N, j - 1 + STAGES < n_tiles)

    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_bars.index(last), ((n_tiles - 1) // STAGES) & 1)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    acc = warpgroup_mma(p_op, v_smem.index(last).reshape([BLOCK_N, D]), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=[acc, p_op])
    acc = acc / gl.convert_layout(l_i, row_o)[:, None]

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    # Q's buffer is free once the last QKᵀ is done: O goes out through it (TMA drops the rows past N).
    q_smem.reshape([BLOCK_M, D]).store(acc.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, h, start_m, 0], q_smem)
    tma.store_wait(pendings=0)


def descriptor(x: torch.Tensor, block_rows: int):
    """A TMA descriptor over a (B, H, N, D) tensor with a (1, 1, block_rows, D) box: a box never crosses into the next
    head, rows past N read as zeros and are dropped on store."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    block = [1, 1, block_rows, x.shape[-1]]
    layout = gl.NVMMASharedLayout.get_default_for(block, getattr(gl, str(x.dtype).split(".")[-1]))
    return TensorDescriptor(x, list(x.shape), list(x.stride()), block, layout)


def launch(q, k, v, o, *, N, H, group, qk_scale, causal, tiles) -> None:
    """Run the kernel on checked (B, H, N, D) tensors; `qk_scale` is scale·log2(e)."""
    BM, BN = tiles.BLOCK_M, tiles.BLOCK_N
    grid = (triton.cdiv(N, BM), q.shape[0] * H)
    fused_gluon_kernel[grid](descriptor(q, BM), descriptor(k, BN), descriptor(v, BN), descriptor(o, BM),
                             N, H, group, qk_scale, D=q.shape[-1], BLOCK_M=BM, BLOCK_N=BN,
                             STAGES=tiles.num_stages, CAUSAL=causal, HEAVY_FIRST=tiles.heavy_first,
                             num_warps=tiles.num_warps)


# ---- v10: warp-specialised, two consumer warpgroups in ping-pong, one loader warp --------------------------------


@gluon.jit
def _ws_loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, b, h, hk, start_m, n_tiles,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """One warp: Q for both consumers, then K and V tile by tile into a ring, each slot refilled once both
    consumers have said (k_empty / v_empty, count 2) that the matmul reading it is done."""
    q_bars, k_full, v_full, k_empty, v_empty, turn = bars
    for w in gl.static_range(2):
        mbarrier.expect(q_bars.index(w), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, start_m + w * BLOCK_M, 0], q_bars.index(w), q_smem.index(w))
    for j in range(n_tiles):
        st = j % STAGES
        ph = (j // STAGES) & 1
        mbarrier.wait(k_empty.index(st), ph ^ 1)
        mbarrier.expect(k_full.index(st), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, hk, j * BLOCK_N, 0], k_full.index(st), k_smem.index(st))
        mbarrier.wait(v_empty.index(st), ph ^ 1)
        mbarrier.expect(v_full.index(st), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [b, hk, j * BLOCK_N, 0], v_full.index(st), v_smem.index(st))


@gluon.jit
def _ws_turn(turn, WG: gl.constexpr, slot, PINGPONG: gl.constexpr):
    """Wait until the other warpgroup has issued its matmuls of the slot before (WG 0 goes first)."""
    if PINGPONG:
        if WG == 0:
            mbarrier.wait(turn.index(0), (slot - 1) & 1, pred=slot > 0)
        else:
            mbarrier.wait(turn.index(1), slot & 1)


@gluon.jit
def _ws_consumer(q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, bars, b, h, hk, start_m, n_tiles, N,
                 qk_scale, WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr):
    """One warpgroup, BLOCK_M rows: the loop of fused_gluon_kernel, fed by the loader's barriers, its matmul issue
    slots alternating with the other warpgroup's."""
    q_bars, k_full, v_full, k_empty, v_empty, turn = bars
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    rows = start_m + WG * BLOCK_M
    offs_m = rows + gl.arange(0, BLOCK_M, row_s)
    cols = gl.arange(0, BLOCK_N, col_s)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
    hi = N
    if CAUSAL:
        hi = gl.minimum(N, rows + BLOCK_M)

    mbarrier.wait(q_bars.index(WG), 0)
    q = q_smem.index(WG).reshape([BLOCK_M, D])
    mbarrier.wait(k_full.index(0), 0)
    _ws_turn(turn, WG, 0, PINGPONG)
    s = warpgroup_mma(q, k_smem.index(0).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                      is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG), count=1)
    s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
    mbarrier.arrive(k_empty.index(0), count=1)
    if (BLOCK_N > hi) or (CAUSAL and BLOCK_N > rows):
        p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, offs_m, cols, N, True, CAUSAL)
    else:
        p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, offs_m, cols, N, False, CAUSAL)

    for j in range(1, n_tiles):
        stage = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_full.index(stage), (j // STAGES) & 1)
        mbarrier.wait(v_full.index(prev), ((j - 1) // STAGES) & 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        _ws_turn(turn, WG, j, PINGPONG)
        s = warpgroup_mma(q, k_smem.index(stage).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                          is_async=True)
        acc = warpgroup_mma(p_op, v_smem.index(prev).reshape([BLOCK_N, D]), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - WG), count=1)
        s = warpgroup_mma_wait(num_outstanding=1, deps=[s])
        mbarrier.arrive(k_empty.index(stage), count=1)
        if ((j + 1) * BLOCK_N > hi) or (CAUSAL and (j + 1) * BLOCK_N > rows):
            p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, offs_m, j * BLOCK_N + cols, N, True, CAUSAL)
        else:
            p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, offs_m, j * BLOCK_N + cols, N, False, CAUSAL)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=[acc, p_op])
        mbarrier.arrive(v_empty.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]

    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_full.index(last), ((n_tiles - 1) // STAGES) & 1)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    _ws_turn(turn, WG, n_tiles, PINGPONG)
    acc = warpgroup_mma(p_op, v_smem.index(last).reshape([BLOCK_N, D]), acc, is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG), count=1)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=[acc, p_op])
    mbarrier.arrive(v_empty.index(last), count=1)
    acc = acc / gl.convert_layout(l_i, row_o)[:, None]
    o_buf = q_smem.index(WG)  # this warpgroup's Q buffer, free after its last QKᵀ
    o_buf.reshape([BLOCK_M, D]).store(acc.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, h, rows, 0], o_buf)
    tma.store_wait(pendings=0)


@gluon.jit
def _ws_consumer0(q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, bars, b, h, hk, start_m, n_tiles, N,
                  qk_scale, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, PINGPONG: gl.constexpr):
    _ws_consumer(q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, bars, b, h, hk, start_m, n_tiles, N,
                 qk_scale, 0, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, PINGPONG)


@gluon.jit
def _ws_consumer1(q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, bars, b, h, hk, start_m, n_tiles, N,
                  qk_scale, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, PINGPONG: gl.constexpr):
    _ws_consumer(q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, bars, b, h, hk, start_m, n_tiles, N,
                 qk_scale, 1, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, PINGPONG)


@gluon.jit
def _ws_load(q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, bars, b, h, hk, start_m, n_tiles, N,
             qk_scale, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
             CAUSAL: gl.constexpr, PINGPONG: gl.constexpr):
    _ws_loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, b, h, hk, start_m, n_tiles, BLOCK_M, BLOCK_N,
               STAGES)


@gluon.jit
def fused_ws_kernel(q_desc, k_desc, v_desc, o_desc, N, H, GROUP, qk_scale,
                    D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                    CAUSAL: gl.constexpr, HEAVY_FIRST: gl.constexpr, PINGPONG: gl.constexpr,
                    CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """2·BLOCK_M rows a program: warpgroup w (w = 0, 1) owns rows start_m + w·BLOCK_M; num_warps must be 4 (the
    default partition is consumer 0; consumer 1 and the loader are worker partitions)."""
    dtype: gl.constexpr = q_desc.dtype
    n_m = gl.cdiv(N, 2 * BLOCK_M)
    pid = gl.program_id(0)
    if HEAVY_FIRST:
        pid = n_m - 1 - pid
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    start_m = pid * 2 * BLOCK_M
    hi = N
    if CAUSAL:
        hi = gl.minimum(N, start_m + 2 * BLOCK_M)
    n_tiles = gl.cdiv(hi, BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, BLOCK_M, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    fence_async_shared()
    bars = (q_bars, k_full, v_full, k_empty, v_empty, turn)
    # (the argument tuple is written out three times: a tuple assigned to a name turns its constexprs into tensors)
    gl.warp_specialize([
        (_ws_consumer0, (q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, bars, b, h, hk, start_m, n_tiles, N,
                         qk_scale, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, PINGPONG)),
        (_ws_consumer1, (q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, bars, b, h, hk, start_m, n_tiles, N,
                         qk_scale, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, PINGPONG)),
        (_ws_load, (q_desc, k_desc, v_desc, o_desc, q_smem, k_smem, v_smem, bars, b, h, hk, start_m, n_tiles, N,
                    qk_scale, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, PINGPONG)),
    ], [4, 1], [CONSUMER_REGS, 24])


def launch_ws(q, k, v, o, *, N, H, group, qk_scale, causal, tiles, pingpong=True, consumer_regs=240,
              maxnreg=168) -> None:
    """The warp-specialised kernel: tiles.BLOCK_M rows per consumer warpgroup, 2·BLOCK_M per program."""
    BM, BN = tiles.BLOCK_M, tiles.BLOCK_N
    grid = (triton.cdiv(N, 2 * BM), q.shape[0] * H)
    fused_ws_kernel[grid](descriptor(q, BM), descriptor(k, BN), descriptor(v, BN), descriptor(o, BM),
                          N, H, group, qk_scale, D=q.shape[-1], BLOCK_M=BM, BLOCK_N=BN, STAGES=tiles.num_stages,
                          CAUSAL=causal, HEAVY_FIRST=tiles.heavy_first, PINGPONG=pingpong,
                          CONSUMER_REGS=consumer_regs, num_warps=4, maxnreg=maxnreg)
