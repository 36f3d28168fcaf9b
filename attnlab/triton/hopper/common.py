"""What the Hopper (Gluon) kernels share: the work-item order of a persistent program, the score tile with its masks
and online softmax, the K loader of the P kernels, and the host side (which shapes compile, shared memory and register
budgets, TMA descriptors, SM count).

Each kernel module (fused, qk_softmax, qk_softmax_row, pv) imports from here and from nothing of its siblings', but
qk_softmax, which hands N <= qk_softmax_row.ROW_MAX to the one-pass kernel.
"""
from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from attnlab.triton.config import HEAD_DIMS, programs_per_sm
from attnlab.triton.layout import tma_can_read, tma_readable  # noqa: F401 - the kernel modules take them here

ROWS_PER_PROGRAM = gl.constexpr(2)  # consumer warpgroups, each BLOCK_M rows




def compiles_for(dtype: torch.dtype, D: int) -> bool:
    """Whether the Gluon kernels (this one and attnlab.triton.hopper.qk_softmax) compile for this dtype and head dim:
    16-bit inputs, D in HEAD_DIMS."""
    return dtype in (torch.float16, torch.bfloat16) and D in HEAD_DIMS


def check_case(tiles, dtype: torch.dtype, D: int, kernel: str = "") -> None:
    """ValueError unless the Gluon kernels compile for this dtype and head dim (compiles_for): the rules choose them
    only there, forced tiles can ask for anything. `kernel` names it in the message (fused's says
    none)."""
    if not compiles_for(dtype, D):
        raise ValueError(f"tiles {tiles}: the Gluon {kernel + ' ' if kernel else ''}kernel needs fp16 or bf16 and "
                         f"D = {' or '.join(map(str, HEAD_DIMS))} (its TMA boxes are exactly D wide), got {dtype} and "
                         f"D = {D}")


@gluon.jit
def scores(s, mask_rows, mask_tile, offs_m, offs_n, N, smn, qk_scale, mask_scale, MASKED: gl.constexpr,
            CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr, MASK_TMA: gl.constexpr):
    """attnlab.triton.tiles.score_tile on a matmul result: raw q·kᵀ in the steady state (the scale goes into exp2's
    FMA), else scaled with the mask added and masked entries -inf. The mask tile comes from global memory, or under
    MASK_TMA from the shared-memory tile the loader brought (zeros past N, as the masked load's `other`)."""
    if MASKED or MASK_KIND != 0 or NO_SOFTMAX:
        s = s * qk_scale
        if MASK_KIND != 0:
            if MASK_TMA:
                m = mask_tile.load(s.type.layout)
            else:
                inside = (offs_m[:, None] < N) & (offs_n[None, :] < N)
                m = gl.load(mask_rows[:, None] + offs_n[None, :] * smn, mask=inside, other=0)
            if MASK_KIND == 1:
                s = gl.where(m != 0, s, float("-inf"))
            else:
                s = s + m.to(gl.float32) * mask_scale
        if MASKED:
            keep = offs_n[None, :] < N
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            s = gl.where(keep, s, float("-inf"))
    return s


@gluon.jit
def online_softmax(s, m_i, l_i, qk_scale, MASKED: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """P of this tile, the running max and sum, and α = 2^(m_old − m_new) to rescale O (attnlab.triton.fused's
    _online_softmax)."""
    if NO_SOFTMAX:  # ablation: P = S, masked entries 0; no max, no exp, no rescale
        p = gl.where(s == float("-inf"), 0.0, s)
        m_new = m_i
        alpha = m_i  # unused: there is no rescale
    elif (not MASKED) and (MASK_KIND == 0):
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        m_use = m_new
        p = gl.exp2(s * qk_scale - m_use[:, None])
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_use = m_new
        if MASK_KIND != 0:  # a row the mask hides so far: subtract 0, so exp2 gives 0, not NaN
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - m_use[:, None])
    if not NO_SOFTMAX:
        alpha = gl.exp2(m_i - m_use)
        l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def needs_masks(j, rows, hi, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Whether key tile j needs element masks for the rows from `rows` on: it reaches past `hi` (N, or under a
    causal mask the rows' last key) or, causal, past the rows' first diagonal element (both Gluon kernels)."""
    return ((j + 1) * BLOCK_N > hi) or (CAUSAL and (j + 1) * BLOCK_N > rows)


@gluon.jit
def softmax_tile(s, m_i, l_i, j, rows, hi, mask_rows, mask_tile, offs_m, cols, N, smn, qk_scale, mask_scale,
          BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr,
          MASK_TMA: gl.constexpr):
    """Scores and softmax of key tile j, element-masked only where the tile crosses the diagonal or N."""
    offs_n = j * BLOCK_N + cols
    if needs_masks(j, rows, hi, BLOCK_N, CAUSAL):
        s = scores(s, mask_rows, mask_tile, offs_m, offs_n, N, smn, qk_scale, mask_scale, True, CAUSAL, MASK_KIND,
                    NO_SOFTMAX, MASK_TMA)
        p, m_i, l_i, alpha = online_softmax(s, m_i, l_i, qk_scale, True, MASK_KIND, NO_SOFTMAX)
    else:
        s = scores(s, mask_rows, mask_tile, offs_m, offs_n, N, smn, qk_scale, mask_scale, False, CAUSAL, MASK_KIND,
                    NO_SOFTMAX, MASK_TMA)
        p, m_i, l_i, alpha = online_softmax(s, m_i, l_i, qk_scale, False, MASK_KIND, NO_SOFTMAX)
    return p, m_i, l_i, alpha, offs_n


@gluon.jit
def warpgroup_mask(mask_smem, stage, WG: gl.constexpr, MASK_TMA: gl.constexpr, ROWS: gl.constexpr):
    """This warpgroup's rows of the mask tile in ring slot `stage` (the loader brings all ROWS warpgroups' rows in one
    box); the unused placeholder without MASK_TMA."""
    if MASK_TMA:
        box = mask_smem.index(stage)
        rows: gl.constexpr = box.type.shape[2] // ROWS
        return box.reshape([box.type.shape[2], box.type.shape[3]]).slice(WG * rows, rows, dim=0)
    else:
        return mask_smem


@gluon.jit
def items(pid, nprog, total, PAIRS: gl.constexpr):
    """The range (start, end, step) a persistent program `pid` of `nprog` loops over, item_at giving each step's
    work item: pid, pid + nprog, … below total (the items themselves), or under PAIRS 0, 1, … up to its count of
    items in pairs of consecutive items, pairs pid, pid + nprog, … (the last pair of an odd total is one item)."""
    if PAIRS:  # first items of pairs u < cdiv(total, 2), second items of u < total // 2: u = pid, pid + nprog, …
        # (numerators ≥ 0, as pid < nprog: C's and Python's integer division agree)
        firsts = ((total + 1) // 2 - pid + nprog - 1) // nprog
        seconds = (total // 2 - pid + nprog - 1) // nprog
        return 0, firsts + seconds, 1
    else:
        return pid, total, nprog


@gluon.jit
def item_at(x, pid, nprog, PAIRS: gl.constexpr):
    """The work item of step x of items' range: x itself, or under PAIRS the x-th of program pid's pairs' items."""
    if PAIRS:
        return 2 * (pid + (x // 2) * nprog) + x % 2
    else:
        return x


@gluon.jit
def step_item(x, work, M, smb, smh, N, H, GROUP, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
               HEAVY_FIRST: gl.constexpr, ROWS: gl.constexpr, PERSISTENT: gl.constexpr = True):
    """Where step x of a program's loop over items' range lies: program of its work item, taken in pairs under a
    causal mask with HEAVY_FIRST when PERSISTENT (the loader and every consumer walk the same items). Not PERSISTENT
    (the PV kernel's one item a program): x is the program's item itself."""
    pid, nprog, total = work
    return program(item_at(x, pid, nprog, CAUSAL and HEAVY_FIRST and PERSISTENT), M, smb, smh, N, H, GROUP, BLOCK_M,
                    BLOCK_N, CAUSAL, HEAVY_FIRST, ROWS, PERSISTENT)


@gluon.jit
def pair_order(pos, n_blocks):
    """The row block at position `pos` of a head's items in pair order: n_blocks − 1, 0, n_blocks − 2, 1, …"""
    if pos % 2 == 0:
        return n_blocks - 1 - pos // 2
    else:
        return pos // 2


@gluon.jit
def program(item, M, smb, smh, N, H, GROUP, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
             HEAVY_FIRST: gl.constexpr, ROWS: gl.constexpr = ROWS_PER_PROGRAM, PERSISTENT: gl.constexpr = False):
    """Where work item `item` lies (both Gluon kernels): batch b, query head h, its k/v head hk, first row start_m
    of its ROWS·BLOCK_M rows (ROWS consumer warpgroups), the key tiles it visits, and its (batch, head) of the mask
    M. Items run through a head's row blocks before the next head (the order a (row block, batch·head) grid launches
    in), so the programs at work at once share a few heads' K and V in L2. Causal with HEAVY_FIRST: a grid of one
    item a program starts the longest rows first; a persistent one takes items in pairs (item_at), so a head's
    blocks go heaviest, lightest, second heaviest, second lightest, …: the two items of a pair (n_blocks + 1 key tiles
    in all, for an even n_blocks) weigh alike, so every program carries about the same load, and at any moment the
    programs run items of different lengths."""
    n_blocks = gl.cdiv(N, ROWS * BLOCK_M)
    bh = item // n_blocks
    blk = item % n_blocks
    if CAUSAL and HEAVY_FIRST and PERSISTENT:
        blk = pair_order(blk, n_blocks)
    elif HEAVY_FIRST:  # causal: the longest rows first, so the grid does not end on one long program
        blk = n_blocks - 1 - blk
    b = bh // H
    h = bh % H
    hk = h // GROUP  # grouped-query attention: GROUP query heads read one k/v head
    start_m = blk * ROWS * BLOCK_M
    hi = N
    if CAUSAL:
        hi = gl.minimum(N, start_m + ROWS * BLOCK_M)
    n_tiles = gl.cdiv(hi, BLOCK_N)
    m_head = M + b.to(gl.int64) * smb + h.to(gl.int64) * smh
    return b, h, hk, start_m, n_tiles, m_head


SMEM_SM = 228 * 1024  # bytes of shared memory an SM has on sm_90 (H100/H200)


SMEM_RESERVED = 1024  # of them reserved for each block the SM runs


SMEM_SPARE = 1024  # the barriers and alignment, beside the tiles o_by_tma counts


CONSUMER_REGS = 240  # registers per thread of the consumer warpgroups (setmaxnreg); the loader gets 24


MAXNREG = 168  # the launch's per-thread limit: 3 warpgroups × 128 threads × 168 ≤ 64 Ki registers per SM


# Tiles.one_consumer: 5 warps launch as 8, two programs an SM, so 128 registers a thread at launch (2 · 256 · 128 =
# 64 Ki); the loader's setmaxnreg 24 leaves the consumer 232.
MAXNREG_ONE = 128


def partitions(tiles) -> tuple[int, int]:
    """(consumer warpgroups a program, the launch's maxnreg) for these tiles: what the plan holds and what
    attnlab.triton.resources compiles offline."""
    return (1, MAXNREG_ONE) if tiles.one_consumer else (ROWS_PER_PROGRAM.value, MAXNREG)


def smem_limit(tiles) -> int:
    """The shared memory one program of these tiles may use: its share of the SM, less what the SM keeps a block."""
    return SMEM_SM // programs_per_sm(tiles) - SMEM_RESERVED


def mask_by_tma(tiles, mask) -> bool:
    """Whether a launch with these tiles brings the mask (its attnlab.triton.layout.MaskLayout; None without one) by
    TMA, a box of mask_rows(tiles) by BLOCK_N: Tiles.mask_tma and a mask TMA can read; else the consumers load it. The
    rule of the fused and qk_softmax Gluon kernels' plans and of their offline compile."""
    return mask is not None and tiles.mask_tma and mask.tma


def mask_rows(tiles) -> int:
    """The rows of a mask box brought by TMA: all of a program's consumers' rows."""
    return partitions(tiles)[0] * tiles.BLOCK_M


def box(x_shape: tuple, dtype: torch.dtype, block_rows: int, block_cols: int | None = None) -> tuple:
    """(block, layout) of a TMA descriptor over a (B, H, rows, cols) tensor of this shape and dtype: a (1, 1,
    block_rows, block_cols) box (block_cols: the whole last dim by default), checked as TensorDescriptor checks it,
    and its swizzled shared-memory layout. It depends on no pointer, so a plan keeps it (attnlab.triton.plan)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    block = (1, 1, block_rows, x_shape[-1] if block_cols is None else block_cols)
    meta = torch.empty(block, dtype=dtype, device="meta")  # the box alone, for its constructor's checks of the box
    d = TensorDescriptor(meta, list(block), list(meta.stride()), list(block), _smem_layout(block, dtype))
    return d.block_shape, d.layout


def described(x: torch.Tensor, box: tuple):
    """A TMA descriptor over a (B, H, rows, cols) tensor — q, k, v, o as (B, H, N, D), or qk_softmax's P as
    (B, H, N, N) — with a box from `box`: a box never crosses into the next head, elements past the edges read as
    zeros and are dropped on store. x must be tma_readable (tma_ready makes it so): the checks TensorDescriptor's
    constructor repeats at every call (alignment, strides, the box's shape) are that and `box`'s, so the descriptor is
    filled in without them, a third of a Gluon launch's own host time."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    d = object.__new__(TensorDescriptor)
    d.base, d.shape, d.strides, d.padding = x, list(x.shape), list(x.stride()), "zero"
    d.block_shape, d.layout = box
    return d


def descriptor(x: torch.Tensor, block_rows: int, block_cols: int | None = None):
    """described(x, box(...)): a descriptor over x with a (1, 1, block_rows, block_cols) box."""
    return described(x, box(tuple(x.shape), x.dtype, block_rows, block_cols))


@functools.lru_cache(maxsize=None)
def _smem_layout(block: tuple, dtype: torch.dtype):
    """The swizzled shared-memory layout of a TMA box (cached: computing it was most of the launch's host time, which
    at N = 512 exceeds the kernel's)."""
    return gl.NVMMASharedLayout.get_default_for(list(block), getattr(gl, str(dtype).split(".")[-1]))


def tma_ready(x: torch.Tensor) -> torch.Tensor:
    """x itself when TMA can read it (tma_readable), else a fresh contiguous copy (the caching allocator aligns it;
    .contiguous() would hand back a misaligned but contiguous x unchanged)."""
    return x if tma_readable(x) else torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)


def check_p_rows(p: torch.Tensor) -> None:
    """The P kernels' TMA boxes store and read P where it lies, so its rows must start 16 bytes apart: one ValueError
    naming the constraint otherwise (attnlab.triton.layout.scores_buffer's rows start on 128-byte lines at any N)."""
    if not tma_readable(p):
        raise ValueError(f"P must have unit last stride and a 16-byte aligned base and row stride for the Gluon "
                         f"kernels' TMA (attnlab.triton.launch.scores_buffer makes one at any N), got strides "
                         f"{tuple(p.stride())} of {p.element_size()}-byte elements at address {p.data_ptr():#x}")


def mask_descriptor(mask: torch.Tensor, rows: int, cols: int):
    """(descriptor, varies over batch, varies over heads) for a (B, H, N, N)-strided mask view that TMA can read
    (tma_can_read), else None. Broadcast batch or head dims (stride 0) become dims of size 1, whose coordinate the
    kernel pins to 0."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if not tma_can_read(mask):
        return None
    sb, sh, sm, _ = mask.stride()
    B, H, N, _ = mask.shape
    vary_b, vary_h = int(sb != 0), int(sh != 0)
    sh_, shape_h = (sh, H) if vary_h else (N * sm, 1)
    sb_, shape_b = (sb, B) if vary_b else (shape_h * sh_, 1)
    block = [1, 1, rows, cols]
    desc = TensorDescriptor(mask, [shape_b, shape_h, N, N], [sb_, sh_, sm, 1], block, _smem_layout(tuple(block),
                                                                                                   mask.dtype))
    return desc, vary_b, vary_h


P_CONSUMER_REGS = 232  # setmaxnreg of the P kernels' consumer warpgroups (a multiple of 8; the loader gets 24)


@gluon.jit
def load_k_tile(r, t, k_desc, k_smem, k_full, k_empty, b, hk, tma_mask, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
            MASK_TMA: gl.constexpr):
    """K tile t into ring position r, once every consumer has released the slot (its `empty` barrier, count ROWS);
    under MASK_TMA the mask tile of the item's rows and these keys arrives with it, on K's barrier (tma_mask: the
    mask's descriptor, its ring, and the box's batch, head and first row)."""
    mask_desc, mask_smem, mb, mh, start_m = tma_mask
    st = r % STAGES
    mbarrier.wait(k_empty.index(st), ((r // STAGES) & 1) ^ 1)  # a fresh barrier passes the phase before 0
    if MASK_TMA:
        # the consumers read the slot's last mask tile with ordinary shared loads (the generic proxy): order those
        # reads before this TMA write (the async proxy) into the same slot
        fence_async_shared()
        mbarrier.expect(k_full.index(st), k_desc.block_type.nbytes + mask_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(mask_desc, [mb, mh, start_m, t * BLOCK_N], k_full.index(st),
                                        mask_smem.index(st))
    else:
        mbarrier.expect(k_full.index(st), k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [b, hk, t * BLOCK_N, 0], k_full.index(st), k_smem.index(st))


@gluon.jit
def p_bias(m_i, l_i):
    """max + log2(sum) of each row after pass 1; a row the mask hides entirely (max −inf, sum 0) gets 0, so its P is
    2^−inf = 0."""
    m_safe = gl.where(m_i == -float("inf"), 0.0, m_i)
    return m_safe + gl.log2(gl.where(l_i == 0.0, 1.0, l_i))
