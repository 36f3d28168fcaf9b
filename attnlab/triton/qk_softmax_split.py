"""The qk_softmax build's P kernel in one pass over the keys (Tiles.split_rows, label suffix `x`; PERFORMANCE.md v29):
each row's keys are split among the programs of a team, which exchange their partial softmax statistics through
global memory instead of sweeping the keys twice.

Why: attnlab.triton.qk_softmax_gluon sweeps every row's keys twice, once for the row's max and sum and once to write
P, so its QKᵀ and exponentials run twice and its first pass writes nothing (PERFORMANCE.md v16: at D = 128, N = 4096
pass 1 is ≈ 0.5 of the kernel's 1.3 ms). Here a work item is 2·BLOCK_M rows (two consumer warpgroups) by CHUNK_TILES
key tiles, and a row block's G = cdiv(N, CHUNK_TILES·BLOCK_N) items form a team:
  * each consumer computes its CHUNK_TILES score tiles once, keeps 2^(s − m) with the running max m as 16-bit values
    in registers, and writes its rows' (max, sum) to a scratch slot of its team;
  * it then signals the team (a release atomic on the team's counter, after a barrier of its warpgroup) and waits
    until every member has (acquire loads of the counter);
  * it reads the G members' (max, sum), combines them into the row's max and sum, and writes each tile once as
    2^(s − m)·2^(m − max)/sum by TMA.
So QKᵀ and the exponentials run once and P is written once; the cost is the team's wait and 8·G bytes of scratch a
row. Under a causal mask the members past a row block's diagonal only store zero tiles and take no part.

A team's members are consecutive items, and the grid is persistent: nprog = a multiple of G programs, one an SM,
program p taking items p, p + nprog, …, so a team's G members are programs that run side by side at the same step.
Every program must be resident at once for the waits to end: the launch is cooperative (CUDA refuses it otherwise
rather than hang), and a wait gives up after SPIN_LIMIT polls (P is then wrong, which the accuracy check reports,
instead of a hung GPU). CUDA graphs capture the counters' zeroing with the kernel, so a replay starts from zero too.

Exactness: the combine is the same algebra as the two-pass kernel's (max over the members, sum rescaled to it); the
one difference is P's extra rounding: 2^(s − m) held as 16-bit before the final scale (fp16 whatever P's dtype: the
values lie in [0, 1], and fp16 keeps 3 more mantissa bits than bf16).
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from attnlab.triton.fused_gluon import _needs_masks, _scores, descriptor, sm_count, tma_ready
from attnlab.triton.qk_softmax_gluon import _load_k

CHUNK_TILES = 2  # key tiles a consumer holds for one item: 4 × 32 registers a thread as 16-bit values
ROWS = gl.constexpr(2)  # consumer warpgroups a program
PBUF = gl.constexpr(2)  # P staging buffers a consumer: one filled while the other's TMA store reads it
CONSUMER_REGS = 232
MAXNREG = 168  # launch limit: 3 warpgroups (two consumers and the loader's) × 128 threads × 168 ≤ 64 Ki
SPIN_LIMIT = gl.constexpr(1 << 20)  # polls of a team counter before a wait gives up (~0.5 s: a bug, not a wait)


@gluon.jit
def _acquire(ptr):
    """An acquire load of an int32 at gpu scope: the members' statistics written before their release are seen."""
    return gl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def _where(x, N, H, GROUP, G, M, smb, smh, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CT: gl.constexpr,
           CAUSAL: gl.constexpr):
    """Work item x: batch b, query head h, k head hk, first row start_m of its ROWS·BLOCK_M rows, its team (a row
    block of a head) and member (its key tiles member·CT …), the team's active members (those with keys on or before
    the rows' last diagonal; all G without a causal mask), and the mask's (b, h) base."""
    team = x // G
    member = x % G
    n_blocks = gl.cdiv(N, ROWS * BLOCK_M)
    bh = team // n_blocks
    start_m = (team % n_blocks) * ROWS * BLOCK_M
    b = bh // H
    h = bh % H
    hi = N
    if CAUSAL:
        hi = gl.minimum(N, start_m + ROWS * BLOCK_M)
    active = gl.cdiv(hi, CT * BLOCK_N)
    m_head = M + b.to(gl.int64) * smb + h.to(gl.int64) * smh
    return b, h, h // GROUP, start_m, team, member, active, m_head


@gluon.jit
def _loader(q_desc, k_desc, q_smem, k_smem, bars, work, M, smb, smh, N, H, GROUP, G, BLOCK_M: gl.constexpr,
            BLOCK_N: gl.constexpr, CT: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """One warp: for each active item, its first K tile, then both consumers' Q (each once its consumer has released
    the previous item's), then its other K tiles, into a ring of STAGES slots."""
    q_full, q_empty, k_full, k_empty = bars
    pid, nprog, total = work
    r = 0
    it = 0
    for x in range(pid, total, nprog):
        b, h, hk, start_m, team, member, active, m_head = _where(x, N, H, GROUP, G, M, smb, smh, BLOCK_M, BLOCK_N,
                                                                 CT, CAUSAL)
        if member < active:
            _load_k(r, member * CT, k_desc, k_smem, k_full, k_empty, b, hk, BLOCK_N, STAGES)
            for w in gl.static_range(ROWS):
                mbarrier.wait(q_empty.index(w), (it & 1) ^ 1)
                mbarrier.expect(q_full.index(w), q_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [b, h, start_m + w * BLOCK_M, 0], q_full.index(w),
                                                q_smem.index(w))
            for j in range(1, CT):
                _load_k(r + j, member * CT + j, k_desc, k_smem, k_full, k_empty, b, hk, BLOCK_N, STAGES)
            r += CT
            it += 1


@gluon.jit
def _put(p, n_put, p_desc, p_smem, slot0, b, h, rows, col):
    """Store a P tile by TMA from this consumer's next staging buffer, once the store that last read it is done."""
    buf = p_smem.index(slot0 + n_put % PBUF)
    tma.store_wait(pendings=PBUF - 1)
    buf.reshape([buf.type.shape[2], buf.type.shape[3]]).store(p.to(p_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(p_desc, [b, h, rows, col], buf)
    return n_put + 1


@gluon.jit
def _scaled(s, j, rows, hi, mask_rows, offs_m, offs_n, N, smn, qk_scale, mask_scale, BLOCK_N: gl.constexpr,
            CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """A score tile scaled (by scale·log2 e, or the natural scale under no_softmax), the mask added, and entries past
    N or the diagonal −inf: fused_gluon._scores, always in scaled form."""
    if _needs_masks(j, rows, hi, BLOCK_N, CAUSAL):
        s = _scores(s, mask_rows, mask_rows, offs_m, offs_n, N, smn, qk_scale, mask_scale, True, CAUSAL, MASK_KIND,
                    NO_SOFTMAX, False)
    elif MASK_KIND != 0 or NO_SOFTMAX:
        s = _scores(s, mask_rows, mask_rows, offs_m, offs_n, N, smn, qk_scale, mask_scale, False, CAUSAL, MASK_KIND,
                    NO_SOFTMAX, False)
    else:
        s = s * qk_scale
    return s


@gluon.jit
def _consumer(q_smem, k_smem, p_smem, z_smem, p_desc, bars, stats_m, stats_l, cnt, mask, work, N, H, GROUP, G,
              qk_scale, mask_scale, WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              CT: gl.constexpr, GW: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
              MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """One warpgroup: BLOCK_M rows of each of its program's items."""
    q_full, q_empty, k_full, k_empty = bars
    pid, nprog, total = work
    M, smb, smh, smm, smn = mask
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    g_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, GW, 16])
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    local = gl.arange(0, BLOCK_M, row_s)
    g_rows = gl.arange(0, BLOCK_M, gl.SliceLayout(1, g_layout))
    g_cols = gl.arange(0, GW, gl.SliceLayout(0, g_layout))
    slot0: gl.constexpr = WG * PBUF
    r = 0
    it = 0
    n_put = 0
    for x in range(pid, total, nprog):
        b, h, hk, start_m, team, member, active, m_head = _where(x, N, H, GROUP, G, M, smb, smh, BLOCK_M, BLOCK_N,
                                                                 CT, CAUSAL)
        rows = start_m + WG * BLOCK_M
        if member < active:
            offs_m = rows + local
            mask_rows = m_head + offs_m.to(gl.int64) * smm
            hi = N
            if CAUSAL:
                hi = gl.minimum(N, rows + BLOCK_M)
            mbarrier.wait(q_full.index(WG), it & 1)
            q = q_smem.index(WG).reshape([BLOCK_M, D])
            m_run = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
            l_run = gl.zeros([BLOCK_M], gl.float32, row_s)
            ps = ()
            ms = ()
            for j in gl.static_range(CT):
                st = (r + j) % STAGES
                mbarrier.wait(k_full.index(st), ((r + j) // STAGES) & 1)
                s = warpgroup_mma(q, k_smem.index(st).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                                  is_async=True)
                s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
                mbarrier.arrive(k_empty.index(st), count=1)
                if j == CT - 1:
                    mbarrier.arrive(q_empty.index(WG), count=1)  # Q read for the last time: the next item's may load
                t = member * CT + j
                s = _scaled(s, t, rows, hi, mask_rows, offs_m, t * BLOCK_N + cols, N, smn, qk_scale, mask_scale,
                            BLOCK_N, CAUSAL, MASK_KIND, NO_SOFTMAX)
                if NO_SOFTMAX:  # the ablation: P = S, masked entries 0, written at once (no statistics, no wait)
                    n_put = _put(gl.where(s == float("-inf"), 0.0, s), n_put, p_desc, p_smem, slot0, b, h, rows,
                                 t * BLOCK_N)
                else:
                    m_new = gl.maximum(m_run, gl.max(s, axis=1))
                    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row masked so far: 2^−inf = 0, no NaN
                    p = gl.exp2(s - m_use[:, None])
                    l_run = l_run * gl.exp2(m_run - m_use) + gl.sum(p, axis=1)  # m_run = −inf: 2^−inf = 0
                    m_run = m_new
                    ps = ps + (p.to(gl.float16),)
                    ms = ms + (m_new,)  # −inf where the tile's rows are masked so far (their p is 0)
            r += CT
            it += 1
            if not NO_SOFTMAX:
                # publish this member's (max, sum), then wait for the team's other active members
                slot = (team * 2 + WG).to(gl.int64)
                gl.store(stats_m + (slot * BLOCK_M + local) * GW + member, m_run)
                gl.store(stats_l + (slot * BLOCK_M + local) * GW + member, l_run)
                gl.thread_barrier()  # every thread's stores precede the one release below (bar.sync of this group)
                gl.atomic_add(cnt + slot, 1, sem="release", scope="gpu")
                c = _acquire(cnt + slot)
                spins = 0
                while (c < active) & (spins < SPIN_LIMIT):
                    c = _acquire(cnt + slot)
                    spins += 1
                gl.thread_barrier()
                g_off = (slot * BLOCK_M + g_rows[:, None]) * GW + g_cols[None, :]
                g_ok = (g_cols < active)[None, :]
                m_all = gl.load(stats_m + g_off, mask=g_ok, other=-float("inf"), cache_modifier=".cg")
                l_all = gl.load(stats_l + g_off, mask=g_ok, other=0.0, cache_modifier=".cg")
                m_fin = gl.max(m_all, axis=1)
                m_fin = gl.where(m_fin == float("-inf"), 0.0, m_fin)
                l_fin = gl.sum(l_all * gl.exp2(m_all - m_fin[:, None]), axis=1)
                m_fin = gl.convert_layout(m_fin, row_s)
                inv = gl.convert_layout(gl.where(l_fin == 0.0, 0.0, 1.0 / l_fin), row_s)  # a fully masked row: 0
                for j in gl.static_range(CT):
                    t = member * CT + j
                    factor = gl.exp2(ms[j] - m_fin) * inv  # rows masked up to tile j: 2^−inf = 0, not 0·inf
                    n_put = _put(ps[j].to(gl.float32) * factor[:, None], n_put, p_desc, p_smem, slot0, b, h, rows,
                                 t * BLOCK_N)
        else:  # causal: keys past every row's diagonal: zero tiles, from the buffer the kernel zeroed
            for j in gl.static_range(CT):
                tma.async_copy_shared_to_global(p_desc, [b, h, rows, (member * CT + j) * BLOCK_N], z_smem)
    tma.store_wait(pendings=0)


# N is never made a constant (attnlab.triton.fused_gluon: N = 1 with a mask fails to compile in Triton 3.6 if it is).
@gluon.jit(do_not_specialize=["N"])
def qk_softmax_split_kernel(q_desc, k_desc, p_desc, M, smb, smh, smm, smn, stats_m, stats_l, cnt, N, H, GROUP, G,
                            total, qk_scale, mask_scale, D: gl.constexpr, BLOCK_M: gl.constexpr,
                            BLOCK_N: gl.constexpr, CT: gl.constexpr, GW: gl.constexpr, STAGES: gl.constexpr,
                            CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr,
                            CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """grid (nprog,), nprog a multiple of G, all resident (cooperative launch); total = G·B·H·cdiv(N, 2·BLOCK_M)
    items. q/k descriptors over (B, H or Hkv, N, D) with (1, 1, BLOCK_M or BLOCK_N, D) boxes; p_desc over the
    contiguous (B, H, N, N) P with a (1, 1, BLOCK_M, BLOCK_N) box; M the (B, H, N, N)-strided mask or any pointer when
    MASK_KIND = 0; stats_m / stats_l fp32 (2·teams, BLOCK_M, GW) scratch, cnt int32 (2·teams,) zeros; qk_scale =
    scale·log2 e (natural scale under NO_SOFTMAX)."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [ROWS, 1, 1, BLOCK_M, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], k_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [ROWS * PBUF, 1, 1, BLOCK_M, BLOCK_N], p_desc.layout)
    z_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, BLOCK_N], p_desc.layout)
    zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    z_smem.reshape([BLOCK_M, BLOCK_N]).store(gl.zeros([BLOCK_M, BLOCK_N], dtype, zl))
    q_full = gl.allocate_shared_memory(gl.int64, [ROWS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [ROWS, 1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(ROWS):
        mbarrier.init(q_full.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=ROWS)
    fence_async_shared()
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    # Each partition's arguments are written out where it is named: a tuple assigned to a name turns its constexprs
    # into tensors (qk_softmax_gluon's note).
    gl.warp_specialize([
        (_consumer, (q_smem, k_smem, p_smem, z_smem, p_desc, (q_full, q_empty, k_full, k_empty), stats_m, stats_l,
                     cnt, (M, smb, smh, smm, smn), (pid, nprog, total), N, H, GROUP, G, qk_scale, mask_scale, 0, D,
                     BLOCK_M, BLOCK_N, CT, GW, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX)),
        (_consumer, (q_smem, k_smem, p_smem, z_smem, p_desc, (q_full, q_empty, k_full, k_empty), stats_m, stats_l,
                     cnt, (M, smb, smh, smm, smn), (pid, nprog, total), N, H, GROUP, G, qk_scale, mask_scale, 1, D,
                     BLOCK_M, BLOCK_N, CT, GW, STAGES, CAUSAL, MASK_KIND, NO_SOFTMAX)),
        (_loader, (q_desc, k_desc, q_smem, k_smem, (q_full, q_empty, k_full, k_empty), (pid, nprog, total), M, smb,
                   smh, N, H, GROUP, G, BLOCK_M, BLOCK_N, CT, STAGES, CAUSAL)),
    ], [4, 1], [CONSUMER_REGS, 24])


def team_size(N: int) -> int:
    """G: the items (programs) a row's keys are split among, CHUNK_TILES key tiles of BLOCK_N = 128 each."""
    return triton.cdiv(N, CHUNK_TILES * 128)


def programs(N: int, device: torch.device) -> int:
    """The persistent grid: the most whole teams of G programs that fit one a program an SM (0 when G > SMs)."""
    G = team_size(N)
    return (sm_count(device) // G) * G


def takes(N: int, device: torch.device) -> bool:
    """Whether this kernel can write P at sequence length N: 16-byte-aligned P rows for TMA (N % 8 == 0) and a team
    no larger than the SMs (G ≤ SMs: N ≤ 67584 on 132 SMs), so that all its members are resident at once."""
    return N % 8 == 0 and programs(N, device) > 0


def launch(q, k, p, mask, mask_strides, mask_kind, *, N, H, group, qk_scale, mask_scale, causal, tiles,
           no_softmax=False) -> None:
    """Write P for checked (B, H, N, D) q and k into the contiguous (B, H, N, N) p (qk_softmax_gluon.launch sends
    Tiles.split_rows here). ValueError for tiles this kernel does not have (BLOCK_M 64, BLOCK_N 128) or an N it does
    not take."""
    BM, BN = tiles.BLOCK_M, tiles.BLOCK_N
    if (BM, BN) != (64, 128) or tiles.one_consumer or tiles.persistent:
        raise ValueError(f"tiles {tiles}: the split-row qk_softmax kernel has 64×128 tiles, two consumers and its own "
                         f"persistent grid (split_rows with BLOCK_M=64, BLOCK_N=128 and nothing else)")
    if not takes(N, q.device):
        raise ValueError(f"N = {N}: the split-row qk_softmax kernel needs N % 8 == 0 and N ≤ "
                         f"{sm_count(q.device) * CHUNK_TILES * BN} on this GPU (a team of cdiv(N, {CHUNK_TILES * BN}) "
                         f"programs, one an SM, must fit)")
    q, k = tma_ready(q), tma_ready(k)
    G = team_size(N)
    B = q.shape[0]
    teams = B * H * triton.cdiv(N, ROWS.value * BM)
    GW = max(8, triton.next_power_of_2(G))
    stats = torch.empty(2, ROWS.value * teams, BM, GW, dtype=torch.float32, device=q.device)
    cnt = torch.zeros(ROWS.value * teams, dtype=torch.int32, device=q.device)
    total = teams * G
    grid = (min(programs(N, q.device), total),)
    qk_softmax_split_kernel[grid](descriptor(q, BM), descriptor(k, BN), descriptor(p, BM, BN), mask, *mask_strides,
                                  stats[0], stats[1], cnt, N, H, group, G, total, qk_scale, mask_scale,
                                  D=q.shape[-1], BLOCK_M=BM, BLOCK_N=BN, CT=CHUNK_TILES, GW=GW,
                                  STAGES=tiles.num_stages, CAUSAL=causal, MASK_KIND=mask_kind, NO_SOFTMAX=no_softmax,
                                  CONSUMER_REGS=CONSUMER_REGS, num_warps=4, maxnreg=MAXNREG,
                                  launch_cooperative_grid=True)
