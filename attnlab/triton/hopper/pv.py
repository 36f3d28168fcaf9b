"""O = P V from a P in device memory, on Hopper, in Gluon: the PV kernel of `qk_softmax` and `materialised` alike
where it compiles (16-bit, D = 64 or 128, at any N: P's rows start on 128-byte lines, layout.scores_buffer;
elsewhere attnlab.triton.pv runs).

Why a second PV kernel: at D = 128 the PV stage reads P (2.15 GB at N = 4096 in FlashAttention's shapes, 0.51 ms at
the copy rate) while it does as many FLOPs as one QKᵀ (0.40 ms at the matmul rate), so it must overlap the two to
get near the read. The Triton kernel (every warp loads, then multiplies) takes 0.584 ms there on the H200.
Here, as in attnlab.triton.hopper.fused:
  * a loader warp brings each key tile's P rows (one box a consumer) and V rows by TMA into a ring of STAGES slots,
    with a `full` and an `empty` mbarrier a slot;
  * two consumer warpgroups of BLOCK_M rows each (a program covers 2·BLOCK_M rows; one under Tiles.one_consumer, two
    programs an SM) multiply straight from shared memory, one wgmma in flight while the next tile's waits, releasing
    a slot as soon as the matmul that read it is done.
Rows and keys past N read as zeros (TMA), so a ragged N needs no element masks; under a causal mask a program stops
at its last row's key tile, as the Triton kernel does (P is 0 past the diagonal, written so by every P kernel). The
no_pv ablation runs this kernel too (O = Σ_n P[:, n]·n/N broadcast over D, V never loaded), so its saving is a
difference against the same program. Gluon has no CPU interpreter: CI compiles this kernel for sm_90a
(tests/test_pv_gluon.py); its arithmetic is checked on the GPU (`attnlab check`).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

from attnlab.triton import direct
from attnlab.triton.hopper.common import (CONSUMER_REGS, check_p_rows, described, items, partitions, step_item,
                                          tma_ready)


@gluon.jit
def _loader(p_desc, v_desc, p_smem, v_smem, full, empty, work, o_ptr, N, H, GROUP, BLOCK_M: gl.constexpr,
            BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, NO_PV: gl.constexpr,
            HEAVY_FIRST: gl.constexpr, ROWS: gl.constexpr, PERSISTENT: gl.constexpr):
    """One warp: for each of the program's items, key tile j's P box of each consumer's rows and V's rows j (never
    under no_pv) into the ring, position r running on from item to item, once every consumer has released the slot
    (its `empty` barrier, count ROWS)."""
    pid, nprog, total = work
    start, end, step = items(pid, nprog, total, CAUSAL and HEAVY_FIRST and PERSISTENT)
    r = 0
    for x in range(start, end, step):
        # no mask: O's pointer stands in for program's M, and the mask head it returns is unused
        b, h, hk, start_m, n_tiles, unused = step_item(x, work, o_ptr, 0, 0, N, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL,
                                                        HEAVY_FIRST, ROWS, PERSISTENT)
        for j in range(n_tiles):
            st = r % STAGES
            mbarrier.wait(empty.index(st), ((r // STAGES) & 1) ^ 1)  # a fresh barrier passes the phase before 0
            if NO_PV:
                mbarrier.expect(full.index(st), ROWS * p_desc.block_type.nbytes)
            else:
                mbarrier.expect(full.index(st), ROWS * p_desc.block_type.nbytes + v_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(v_desc, [b, hk, j * BLOCK_N, 0], full.index(st), v_smem.index(st))
            for w in gl.static_range(ROWS):
                tma.async_copy_global_to_shared(p_desc, [b, h, start_m + w * BLOCK_M, j * BLOCK_N], full.index(st),
                                                p_smem.index(st * ROWS + w))
            r += 1


@gluon.jit
def _consumer(p_smem, v_smem, full, empty, work, o_ptr, sob, soh, son, N, H, GROUP, inv_n, WG: gl.constexpr,
              D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              CAUSAL: gl.constexpr, NO_PV: gl.constexpr, HEAVY_FIRST: gl.constexpr, ROWS: gl.constexpr,
              PERSISTENT: gl.constexpr, TRANSPOSED: gl.constexpr = False):
    """One warpgroup: for each of the program's items, O of its BLOCK_M rows accumulated over the key tiles, then
    stored from registers (rows past N dropped) while the loader already brings the next item's tiles. TRANSPOSED
    (Tiles.o_transposed): Oᵀ = Vᵀ Pᵀ instead, _transposed_item."""
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    pid, nprog, total = work
    start, end, step = items(pid, nprog, total, CAUSAL and HEAVY_FIRST and PERSISTENT)
    r = 0
    for x in range(start, end, step):
        # no mask: O's pointer stands in for program's M, and the mask head it returns is unused
        b, h, hk, start_m, n_tiles, unused = step_item(x, work, o_ptr, 0, 0, N, H, GROUP, BLOCK_M, BLOCK_N, CAUSAL,
                                                        HEAVY_FIRST, ROWS, PERSISTENT)
        if NO_PV:  # ablation: O = Σ_n P[:, n]·n/N (attnlab.triton.tiles.no_pv_step), P tiles read from shared memory
            part = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
            cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
            for j in range(n_tiles):
                st = r % STAGES
                mbarrier.wait(full.index(st), (r // STAGES) & 1)
                p = p_smem.index(st * ROWS + WG).reshape([BLOCK_M, BLOCK_N]).load(s_layout)
                part = part + p.to(gl.float32) * ((j * BLOCK_N + cols).to(gl.float32) * inv_n)[None, :]
                # these generic-proxy reads ordered before the loader's next TMA write into the slot: without the
                # proxy fence the one-consumer form (128x64w4s3gcu) came out wrong in 7-14 of 30-40 runs at N = 3000,
                # D = 128, causal, fp16, and in 0 of 40 with it
                fence_async_shared()
                mbarrier.arrive(empty.index(st), count=1)
                r += 1
            o = (gl.convert_layout(gl.sum(part, axis=1), gl.SliceLayout(1, o_layout))[:, None]
                 + gl.zeros([BLOCK_M, D], gl.float32, o_layout))
        elif TRANSPOSED:
            r = _transposed_item(p_smem, v_smem, full, empty, r, n_tiles, o_ptr, b, h, sob, soh, son,
                                 start_m + WG * BLOCK_M, N, WG, D, BLOCK_M, BLOCK_N, STAGES, ROWS)
        else:
            o, r = _accumulate(gl.zeros([BLOCK_M, D], gl.float32, o_layout), p_smem, v_smem, full, empty, r, n_tiles,
                               WG, D, BLOCK_M, BLOCK_N, STAGES, ROWS, False)
        if NO_PV or not TRANSPOSED:  # (_transposed_item stores its own)
            rows = start_m + WG * BLOCK_M
            offs_m = rows + gl.arange(0, BLOCK_M, gl.SliceLayout(1, o_layout))
            offs_d = gl.arange(0, D, gl.SliceLayout(0, o_layout))
            o_rows = o_ptr + b.to(gl.int64) * sob + h.to(gl.int64) * soh + offs_m.to(gl.int64) * son
            gl.store(o_rows[:, None] + offs_d[None, :], o.to(o_ptr.dtype.element_ty), mask=(offs_m < N)[:, None])


@gluon.jit
def _accumulate(o, p_smem, v_smem, full, empty, r, n_tiles, WG: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr, ROWS: gl.constexpr, TRANSPOSED: gl.constexpr):
    """o += P V over an item's key tiles (TRANSPOSED: Oᵀ += Vᵀ Pᵀ, both operands transposed views of the same
    slots), from ring position r: one wgmma in flight while the next tile's waits, each slot released once the
    matmul that read it is done. Returns (o, the ring position after the item)."""
    for j in range(n_tiles):
        st = r % STAGES
        mbarrier.wait(full.index(st), (r // STAGES) & 1)
        p = p_smem.index(st * ROWS + WG).reshape([BLOCK_M, BLOCK_N])
        v = v_smem.index(st).reshape([BLOCK_N, D])
        if TRANSPOSED:
            o = warpgroup_mma(v.permute((1, 0)), p.permute((1, 0)), o, is_async=True)
        else:
            o = warpgroup_mma(p, v, o, is_async=True)
        o = warpgroup_mma_wait(num_outstanding=1, deps=[o])  # the previous tile's matmul is done
        if j > 0:
            mbarrier.arrive(empty.index((r - 1) % STAGES), count=1)
        r += 1
    o = warpgroup_mma_wait(num_outstanding=0, deps=[o])
    mbarrier.arrive(empty.index((r - 1) % STAGES), count=1)  # the item's last slot (the ring runs on)
    return o, r


@gluon.jit
def _transposed_item(p_smem, v_smem, full, empty, r, n_tiles, o_ptr, b, h, sob, soh, son, rows, N, WG: gl.constexpr,
                     D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     ROWS: gl.constexpr):
    """Tiles.o_transposed: one item's Oᵀ = Vᵀ Pᵀ, D × BLOCK_M, so that each wgmma is
    m64 n(BLOCK_M) k16 with Vᵀ as A and Pᵀ as B, both straight from the ring (transposed views), where O = P V at
    D = 64 is m64 n64 k16 twice for 128 rows; then Oᵀ turned back through shared memory (convert_layout) into 16-byte
    stores along D. Returns the ring position after the item."""
    ot_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    o, r = _accumulate(gl.zeros([D, BLOCK_M], gl.float32, ot_layout), p_smem, v_smem, full, empty, r, n_tiles, WG, D,
                       BLOCK_M, BLOCK_N, STAGES, ROWS, True)
    out_layout: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1])  # 8 consecutive d a thread
    ot = gl.convert_layout(o.to(o_ptr.dtype.element_ty), out_layout)
    offs_m = rows + gl.arange(0, BLOCK_M, gl.SliceLayout(0, out_layout))
    offs_d = gl.arange(0, D, gl.SliceLayout(1, out_layout))
    o_cols = o_ptr + b.to(gl.int64) * sob + h.to(gl.int64) * soh + offs_m.to(gl.int64) * son
    gl.store(o_cols[None, :] + offs_d[:, None], ot, mask=(offs_m < N)[None, :])
    return r


# N is never made a constant (as in fused_gluon_kernel: Triton specialises an int argument equal to 1).
@gluon.jit(do_not_specialize=["N"])
def pv_gluon_kernel(p_desc, v_desc, o_ptr, sob, soh, son, N, H, GROUP, total, inv_n, D: gl.constexpr,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                    NO_PV: gl.constexpr, HEAVY_FIRST: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                    num_warps: gl.constexpr, ROWS: gl.constexpr, PERSISTENT: gl.constexpr,
                    TRANSPOSED: gl.constexpr = False):
    """grid (total,) with total = cdiv(N, ROWS·BLOCK_M)·B·H work items (ROWS·BLOCK_M rows of a head), one a program;
    PERSISTENT: a smaller grid (one program an SM, two with one consumer), each program taking items pid,
    pid + grid, … (in heavy/light pairs when causal with HEAVY_FIRST), its ring running on from item to item.
    p_desc over P's (B, H, N, N) with a (1, 1, BLOCK_M, BLOCK_N) box; v_desc over V's (B, Hkv, N, D) with
    (1, 1, BLOCK_N, D); O a (B, H, N, D)-strided pointer with unit last stride."""
    dtype: gl.constexpr = p_desc.dtype
    p_smem = gl.allocate_shared_memory(dtype, [STAGES * ROWS, 1, 1, BLOCK_M, BLOCK_N], p_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], v_desc.layout)  # unused under no_pv
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=ROWS)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    # Each partition's arguments are written out where it is named (a tuple assigned to a name turns its constexprs
    # into tensors), so the one- and two-consumer forms are spelled out apart.
    if ROWS == 1:
        gl.warp_specialize([
            (_consumer, (p_smem, v_smem, full, empty, (pid, nprog, total), o_ptr, sob, soh, son, N, H, GROUP, inv_n,
                         0, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, NO_PV, HEAVY_FIRST, ROWS, PERSISTENT,
                         TRANSPOSED)),
            (_loader, (p_desc, v_desc, p_smem, v_smem, full, empty, (pid, nprog, total), o_ptr, N, H, GROUP, BLOCK_M,
                       BLOCK_N, STAGES, CAUSAL, NO_PV, HEAVY_FIRST, ROWS, PERSISTENT)),
        ], [1], [24])
    else:
        gl.warp_specialize([
            (_consumer, (p_smem, v_smem, full, empty, (pid, nprog, total), o_ptr, sob, soh, son, N, H, GROUP, inv_n,
                         0, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, NO_PV, HEAVY_FIRST, ROWS, PERSISTENT,
                         TRANSPOSED)),
            (_consumer, (p_smem, v_smem, full, empty, (pid, nprog, total), o_ptr, sob, soh, son, N, H, GROUP, inv_n,
                         1, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, NO_PV, HEAVY_FIRST, ROWS, PERSISTENT,
                         TRANSPOSED)),
            (_loader, (p_desc, v_desc, p_smem, v_smem, full, empty, (pid, nprog, total), o_ptr, N, H, GROUP, BLOCK_M,
                       BLOCK_N, STAGES, CAUSAL, NO_PV, HEAVY_FIRST, ROWS, PERSISTENT)),
        ], [4, 1], [CONSUMER_REGS, 24])


def run(plan, p, v, o, N, H, group, inv_n) -> None:
    """Run the kernel as `plan` (attnlab.triton.plan.PvGluonPlan) says on a (B, H, N, N) P (rows 16-byte aligned,
    common.check_p_rows: layout.scores_buffer's) and a checked (B, Hkv, N, D) V into O (B, H, N, D)."""
    check_p_rows(p)
    p_box, v_box = plan.boxes
    direct.run(pv_gluon_kernel, plan, described(p, p_box), described(tma_ready(v), v_box), o, *o.stride()[:3], N, H,
               group, plan.total, inv_n)


def constexprs(tiles, *, D: int, causal: bool, no_pv: bool = False) -> dict:
    """The kernel's constexpr arguments for these tiles and this call: what the plan holds and what
    attnlab.triton.resources compiles offline, from one place so that the two cannot drift apart. heavy_first counts
    only under a causal mask (without one every row does the same work)."""
    return dict(D=D, BLOCK_M=tiles.BLOCK_M, BLOCK_N=tiles.BLOCK_N, STAGES=tiles.num_stages, CAUSAL=causal,
                NO_PV=no_pv, HEAVY_FIRST=causal and tiles.heavy_first, CONSUMER_REGS=CONSUMER_REGS,
                ROWS=partitions(tiles)[0], PERSISTENT=tiles.persistent, TRANSPOSED=tiles.o_transposed)
