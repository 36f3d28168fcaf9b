"""Input checks shared by every build: one clear ValueError per bad input, before any kernel sees it.

Every message names the argument, the value it got and the constraint it broke, so a user never meets a Triton
compile error, an assertion or a silently wrong answer instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class Spec:
    """The checked shape of one attention call: q (B, H, N, D), k and v (B, Hkv, N, D)."""

    B: int
    H: int
    Hkv: int
    N: int
    D: int
    dtype: torch.dtype
    device: torch.device
    causal: bool
    scale: float
    mask_kind: str  # "none" | "bool" | "additive"

    @property
    def group(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        return self.H // self.Hkv


def check(q, k, v, *, causal=False, attn_mask=None, scale=None) -> Spec:
    """Validate one call's arguments and return its Spec; raise ValueError naming the first bad argument."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions (B, H, N, D), got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise ValueError(f"{name}.dtype must be one of float16, bfloat16, float32, got {t.dtype}")
    B, H, N, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    Bk, Hkv, Nk, Dk = k.shape
    if Bk != B:
        raise ValueError(f"k.shape[0] (batch) must equal q.shape[0] = {B}, got {Bk}")
    if Nk != N:
        raise ValueError(f"k.shape[2] (sequence length) must equal q.shape[2] = {N}, got {Nk}")
    if Dk != D:
        raise ValueError(f"k.shape[3] (head dim) must equal q.shape[3] = {D}, got {Dk}")
    if B < 1 or H < 1 or Hkv < 1:
        raise ValueError(f"batch and head counts must be >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if N < 1:
        raise ValueError(f"sequence length q.shape[2] must be >= 1, got {N}")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim q.shape[3] must be between 1 and {MAX_HEAD_DIM}, got {D}")
    if H % Hkv:
        raise ValueError(f"q heads H={H} must be a multiple of k/v heads Hkv={Hkv} (grouped-query attention)")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite positive number or None, got {scale!r}")
    mask_kind = "none"
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise ValueError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
        if attn_mask.device != q.device:
            raise ValueError(f"attn_mask must be on q's device {q.device}, got {attn_mask.device}")
        if attn_mask.dtype == torch.bool:
            mask_kind = "bool"
        elif attn_mask.dtype in DTYPES:
            mask_kind = "additive"
        else:
            raise ValueError(f"attn_mask.dtype must be bool (True = attend) or a float dtype (added), got {attn_mask.dtype}")
        if attn_mask.dim() > 4 or not _broadcasts(tuple(attn_mask.shape), (B, H, N, N)):
            raise ValueError(
                f"attn_mask shape {tuple(attn_mask.shape)} must broadcast to (B, H, N, N) = {(B, H, N, N)}"
            )
    return Spec(B, H, Hkv, N, D, q.dtype, q.device, causal, float(scale), mask_kind)


def _broadcasts(shape: tuple, target: tuple) -> bool:
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def mask_4d(attn_mask: torch.Tensor, spec: Spec) -> torch.Tensor:
    """The mask as a (B, H, N, N) view; broadcast dimensions get stride 0, so nothing is copied."""
    m = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
    return m.expand(spec.B, spec.H, spec.N, spec.N)
