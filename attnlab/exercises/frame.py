"""The Triton kernel around the exercise's piece: it owns a block of query rows, hands the piece its q tile and where
this head's K and V start, and writes O = acc / l from what the piece returns.

The piece is the fused kernel's inner loop (attnlab.triton.fused, _attend_rows and _online_softmax): stream K and V
in BLOCK_N tiles, keep the running max m_i, the running sum l_i and the unnormalised accumulator acc, and mask what
must not count. Its signature, fixed by this frame:

    piece(q, k_ptr, v_ptr, offs_m, N, stride_n, qk_scale, D, BLOCK_M, BLOCK_N, CAUSAL) -> (acc, l_i)

    q        (BLOCK_M, D) float32 tile of queries; rows at or past N were loaded as 0 and are never stored
    k_ptr    pointer to this head's key row 0 (row n lies n·stride_n elements further; D elements a row, contiguous)
    v_ptr    the same for V
    offs_m   (BLOCK_M,) the query rows of this block
    qk_scale the softmax scale, natural units (use tl.exp, or fold log2 e in yourself and use tl.math.exp2)
    acc      (BLOCK_M, D) float32, Σ_n exp(s_n − m) v_n;  l_i (BLOCK_M,) float32, Σ_n exp(s_n − m)

Everything here runs in Triton's interpreter on CPU tensors, on any machine: the exercises are about what the kernel
computes, and the interpreter shows it at once. The interpreter is chosen when a function is decorated, so the piece
must be decorated after `attnlab.exercises.setup()` (or under `interpreted()`). The interpreter computes bf16 `tl.dot`
wrongly; the tensors here are float32, whose dots it computes exactly.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnlab.environment import interpreted


def interpreted_jit(fn):
    """triton.jit(fn), run in Triton's interpreter whatever the process's setting."""
    with interpreted():
        return triton.jit(fn)


def is_interpreted(fn) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(fn, InterpretedFunction)


@interpreted_jit
def frame_kernel(Q, K, V, O, N, H, sb, sh, sn, qk_scale, piece: tl.constexpr,
                 D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # grid: (cdiv(N, BLOCK_M), B·H); Q, K, V, O are (B, H, N, D) with D contiguous
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    head = (bh // H) * sb + (bh % H) * sh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    rows = offs_m[:, None] * sn + offs_d[None, :]
    q = tl.load(Q + head + rows, mask=offs_m[:, None] < N, other=0.0)
    acc, l_i = piece(q, K + head, V + head, offs_m, N, sn, qk_scale, D, BLOCK_M, BLOCK_N, CAUSAL)
    tl.store(O + head + rows, acc / l_i[:, None], mask=offs_m[:, None] < N)


def run_piece(piece, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, block_m: int,
              block_n: int) -> torch.Tensor:
    """O from the frame around `piece` for q, k, v of shape (B, H, N, D), float32 on the CPU. O starts as NaN, so a
    row the piece leaves unwritten or divides by zero shows."""
    B, H, N, D = q.shape
    o = torch.full_like(q, float("nan"))
    grid = (triton.cdiv(N, block_m), B * H)
    frame_kernel[grid](q, k, v, o, N, H, q.stride(0), q.stride(1), q.stride(2), D ** -0.5, piece,
                       D, block_m, block_n, causal)
    return o
