"""Reference solutions to the exercises of notebooks/exercises.ipynb, one per check in attnlab.exercises.checks.

They are written from first principles, as a student would write them, never by calling what the checks compare
against (the model's formulas, the oracle, the harness's guards): a solution that called its own yardstick would pass
by construction and prove nothing. The tests run each through its check, and the notebook with `solutions=True`
checks these in place of the student's cells.
"""
from __future__ import annotations

import math

import torch
import triton.language as tl

from attnlab.exercises.frame import interpreted_jit

# -- 1. bytes ------------------------------------------------------------------------------------------------------


def moved_and_held(build: str, B: int, H: int, N: int, D: int, dtype: str, causal: bool) -> tuple[int, int]:
    """(bytes the build must move through device memory, bytes it must hold at once), Hkv = H."""
    E = {"float16": 2, "bfloat16": 2, "float32": 4}[dtype]
    nn = B * H * N * N * E  # one (B, H, N, N) tensor: S or P
    o = B * H * N * D * E  # Q, or O
    moved = o + 2 * o + o  # Q read, K and V read, O written: every build
    held = o
    if build in ("qk_softmax", "materialised"):
        moved += nn + (nn // 2 if causal else nn)  # P written in full, read by PV (only its lower half when causal)
        held = nn + o  # P lives until PV has written O
    if build == "materialised":
        moved += nn * (2 if N <= 16384 else 3)  # S written, read back once (twice past 16384: max and sum, then P)
        held = 2 * nn  # S and P together while the softmax runs; S is freed before O exists
    return moved, held


# -- 2. the online softmax -----------------------------------------------------------------------------------------


def online_softmax(q: torch.Tensor, tiles, scale: float) -> torch.Tensor:
    """O for one block of query rows q (M, D), the keys and values arriving as (k_tile, v_tile) pairs."""
    M, D = q.shape
    m = torch.full((M,), -math.inf, dtype=q.dtype)  # running row max
    l = torch.zeros(M, dtype=q.dtype)  # running sum of exp(s - m)
    acc = torch.zeros(M, D, dtype=q.dtype)  # running Σ exp(s - m) v
    for k, v in tiles:
        s = (q @ k.T) * scale  # (M, n)
        m_new = torch.maximum(m, s.amax(dim=1))
        alpha = torch.exp(m - m_new)  # what the old terms are worth under the new max (0 on the first tile)
        p = torch.exp(s - m_new[:, None])
        l = l * alpha + p.sum(dim=1)
        acc = acc * alpha[:, None] + p @ v
        m = m_new
    return acc / l[:, None]


# -- 3. the fused kernel's inner loop, in Triton ---------------------------------------------------------------------


@interpreted_jit
def attend_block(q, k_ptr, v_ptr, offs_m, N, stride_n, qk_scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    offs_d = tl.arange(0, D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    hi = N
    if CAUSAL:
        hi = tl.minimum(N, tl.max(offs_m) + 1)  # no key past this block's last row counts
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        live = offs_n[None, :] < N  # the last tile is ragged when N % BLOCK_N != 0
        k = tl.load(k_ptr + offs_n[:, None] * stride_n + offs_d[None, :], mask=offs_n[:, None] < N, other=0.0)
        v = tl.load(v_ptr + offs_n[:, None] * stride_n + offs_d[None, :], mask=offs_n[:, None] < N, other=0.0)
        if CAUSAL:
            live = live & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(live, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite from the first tile on: key 0 is live for every row
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    return acc, l_i


# -- 4. causal skipping --------------------------------------------------------------------------------------------


def key_blocks(m: int, N: int, BLOCK_M: int, BLOCK_N: int) -> list[int]:
    """The key blocks query block m must visit under a causal mask: those holding a key at or before its last row."""
    last_row = min((m + 1) * BLOCK_M, N) - 1
    return list(range(last_row // BLOCK_N + 1))


def causal_flops_saved(B: int, H: int, N: int, D: int, BLOCK_M: int, BLOCK_N: int) -> int:
    """FLOPs the skipped tiles would have cost, each tile whole: 4·BLOCK_M·BLOCK_N·D (QKᵀ and PV) per head."""
    blocks_m, blocks_n = -(-N // BLOCK_M), -(-N // BLOCK_N)
    visited = sum(len(key_blocks(m, N, BLOCK_M, BLOCK_N)) for m in range(blocks_m))
    return B * H * (blocks_m * blocks_n - visited) * 4 * BLOCK_M * BLOCK_N * D


# -- 5. a legal ablation -------------------------------------------------------------------------------------------


def no_softmax(q, k, v):
    """The materialised program with its softmax replaced by a copy, returning O: the timer consumes what it gets,
    so the work that makes O stays in the program."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # S, (B, H, N, N)
    p = s.clone()  # the softmax's stand-in: a copy, still a pass over S
    return p @ v  # O, (B, H, N, D)


# -- 6. find the lie -----------------------------------------------------------------------------------------------

LYING_ROWS = {
    4: "mixed_ratio",  # fused causal, its ratio taken over row 0, materialised non-causal: the mask's work, not fusion
    5: "timer",  # the only CUDA-graph replay beside eager do_bench rows: it leaves out the launch cost they carry
    6: "allocation",  # named materialised (torch_eager under torch.compile), but its peak is O's size, not S + P
}
