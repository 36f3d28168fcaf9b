"""How S, P and a mask lie in device memory: rows that start on 128-byte lines (scores_buffer), the 16-byte vector
past N that the row-by-row kernels (scores, softmax, PV) may read and write where N · itemsize is not a multiple of 16
bytes (rows_pad, padded_view), and what of a mask's layout decides how a kernel reads it (MaskLayout: whether TMA can).
Shared by the launchers, the plans and the Hopper kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.validate import Spec


def rows_16b(N: int, dtype: torch.dtype) -> bool:
    """Whether to tell the kernels that read or write S or P row by row (scores, softmax, PV) that N, where their
    bounds masks cut each row, is a whole number of 16-byte vectors, which Triton cannot see when N % 16 ≠ 0
    (attnlab.triton.tiles.row_length; the rows' own starts are on 128-byte lines, scores_buffer). Only then: at
    N % 16 == 0 the compile stays the one Triton makes by itself."""
    return N % 16 != 0 and not ragged_rows(N, dtype.itemsize)


def ragged_rows(N: int, itemsize: int) -> bool:
    """Whether rows of N elements end inside a 16-byte vector (N · itemsize not a multiple of 16: N = 2999 in 16 bits)."""
    return (N * itemsize) % 16 != 0


def vector_end(N: int, itemsize: int) -> int:
    """N rounded up to whole 16-byte vectors of itemsize-byte elements: where a row of N elements ends under rows_pad
    (the host's twin of attnlab.triton.tiles.padded_length)."""
    vec = 16 // itemsize
    return -(-N // vec) * vec


def rows_pad(N: int, *rows: torch.Tensor) -> bool:
    """Whether to let the kernels that read or write S or P row by row (scores, softmax, PV) run each row on to the
    next 16-byte vector past N (attnlab.triton.tiles.padded_length), where N × element size is not a multiple of 16
    bytes: only where every such row tensor's rows start 16 bytes apart with room for that vector before the next row
    (scores_buffer's rows, whole 128-byte lines, always have it; a caller's contiguous P does not). Without it those
    rows move 2 bytes at a time (materialised at N = 2999 took 3.4× its time at N = 3000)."""
    if not rows or not ragged_rows(N, rows[0].element_size()):
        return False
    vec = 16 // rows[0].element_size()
    padded = vector_end(N, rows[0].element_size())

    def room(x):  # the last row's padding lies inside x's storage too
        return (x.storage_offset() + x.shape[0] * x.stride(0)) * x.element_size() <= x.untyped_storage().nbytes()

    return all(x.data_ptr() % 16 == 0 and x.stride(2) >= padded and x.stride(2) % vec == 0 and room(x) for x in rows)


def padded_view(x: torch.Tensor, N: int) -> torch.Tensor:
    """x, a (B, H, N, N) S or P, widened to its rows' padded length where rows_pad holds (the columns from N to the
    end of the 16-byte vector that holds each row's last element), else x itself. The Gluon P kernels store P through
    a TMA descriptor over this view, so that they write the padding too, as 0 (their keys past N are masked), as the
    Triton P kernels do: every writer of P leaves that padding 0, and the Triton PV kernel reads it as it lies instead
    of masking it in registers. `padded_view(x, N)[..., N:]` is the padding itself."""
    if not rows_pad(N, x):
        return x
    return x.as_strided((*x.shape[:3], vector_end(N, x.element_size())), x.stride(), x.storage_offset())


LINE_BYTES = 128  # an L2 line: where S's and P's rows start (scores_buffer)


def scores_buffer(spec: Spec) -> torch.Tensor:
    """A fresh (B, H, N, N) S or P in the input dtype whose rows start on 128-byte lines: a view of (B, H, N, row)
    storage, row the least length ≥ N of whole lines (row = N wherever N · itemsize is a multiple of 128, every N of
    the bench but 3000). At N = 3000 contiguous rows lie 6000 bytes apart, so each row of a TMA box straddles lines
    that the neighbouring box writes too: P's boxes stored at 1.66 TB/s against 2.92 in rows of 3008, and the P kernel
    ran 5–21 % slower. The padding is never part of S or P: where N · itemsize is not a multiple of 16 bytes the
    kernels read and write its first 16-byte vector (rows_pad, padded_view), every writer of P leaves 0 there (S's
    writer -inf), and the PV kernel takes P's as it lies; nothing touches the rest."""
    s = spec
    return torch.empty(s.B, s.H, s.N, line_row(s.N, s.dtype.itemsize), dtype=s.dtype, device=s.device)[..., :s.N]


def line_row(N: int, itemsize: int) -> int:
    """The row length, in elements, that scores_buffer gives rows of N elements: the least whole number of lines."""
    per_line = LINE_BYTES // itemsize
    return -(-N // per_line) * per_line


def row_stride(x: torch.Tensor, spec: Spec, name: str) -> int:
    """The distance in elements between rows of a (B, H, N, N) S or P a kernel reads or writes (scores_buffer's, or
    any with unit last stride and its rows evenly spaced through B and H, which is what the kernels index)."""
    B, H, N = spec.B, spec.H, spec.N
    row = x.stride(2) if x.dim() == 4 else 0
    if (tuple(x.shape) != (B, H, N, N) or x.dtype != spec.dtype or x.stride(3) != 1 or row < N
            or x.stride(1) != N * row or x.stride(0) != H * N * row):
        raise ValueError(f"{name} must be a {spec.dtype} (B, H, N, N) = {(B, H, N, N)} tensor with unit last "
                         f"stride and rows evenly spaced (strides (H·N·r, N·r, r, 1), r ≥ N; scores_buffer makes "
                         f"one), got {x.dtype} {tuple(x.shape)} with strides {x.stride()}")
    return row


def tma_readable(x: torch.Tensor) -> bool:
    """Whether TMA can read or write x as it lies: unit last stride, 16-byte aligned base and other strides."""
    strides, size = x.stride(), x.element_size()
    return strides[-1] == 1 and x.data_ptr() % 16 == 0 and all(s * size % 16 == 0 for s in strides[:-1])


def tma_can_read(mask: torch.Tensor) -> bool:
    """Whether TMA can read a (B, H, N, N)-strided mask view: 1- or 2-byte elements, unit column stride, 16-byte-aligned
    base and row stride, and batch and head strides that are 0 (broadcast) or 16-byte multiples: tma_readable's rule
    (a stride of 0 is a multiple of 16 bytes), for small elements and rows that are not broadcast."""
    return mask.element_size() <= 2 and mask.stride(2) != 0 and tma_readable(mask)


@dataclass(frozen=True)
class MaskLayout:
    """What of a (B, H, N, N)-strided mask view decides how a kernel reads it, and so enters a plan's key: its kind
    (1 boolean, read as uint8; 2 additive), its element size, whether TMA can read it as it lies (tma_can_read), and
    whether it varies over batch and over heads (a broadcast dim has stride 0)."""

    kind: int
    itemsize: int
    tma: bool
    vary_b: bool
    vary_h: bool


def mask_layout(mask: torch.Tensor | None, kind: int) -> MaskLayout | None:
    """The MaskLayout of a (B, H, N, N)-strided mask view of this kind; None without a mask (kind 0)."""
    if not kind:
        return None
    return MaskLayout(kind, mask.element_size(), tma_can_read(mask), mask.stride(0) != 0, mask.stride(1) != 0)
