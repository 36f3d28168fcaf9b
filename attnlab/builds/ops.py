"""Our three builds as operators torch knows (torch.library custom ops), so that torch.compile traces a model that
calls them with no graph break, and mode="reduce-overhead" captures them in CUDA graphs:

    torch.ops.attnlab.materialised(q, k, v, attn_mask=None, causal=False, scale=None) -> o
    torch.ops.attnlab.qk_softmax(q, k, v, attn_mask=None, causal=False, scale=None) -> o
    torch.ops.attnlab.fused(q, k, v, attn_mask=None, causal=False, scale=None) -> o

q (B, H, N, D), k and v (B, Hkv, N, D) with H % Hkv == 0, an optional mask that broadcasts to (B, H, N, N) (boolean,
True = attend, or additive); o (B, H, N, D) in q's dtype, a fresh tensor. Each op runs its launcher
(attnlab.triton.launch) as it is: the compiler sees the op, not its kernels (custom_op; the Gluon kernels are not
traceable as Triton ops), and its fake implementation, which checks the arguments as the launcher does, gives the
output's shape, dtype and device. The launchers allocate through torch's caching allocator and never synchronise,
which a CUDA graph needs. Inference only: no backward is registered, and an input that requires grad is an error.
Importing this module registers the ops.
"""
from __future__ import annotations

from typing import Callable

import torch

from attnlab.triton import launch
from attnlab.validate import check

NAMESPACE = "attnlab"
OPS = ("materialised", "qk_softmax", "fused")


def _op(name: str, launcher: Callable):
    @torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=(), device_types=None)
    def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
           causal: bool = False, scale: float | None = None) -> torch.Tensor:
        return launcher(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)

    @op.register_fake
    def _(q, k, v, attn_mask=None, causal=False, scale=None):
        check(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    op.__doc__ = f"The {name} build (attnlab.triton.launch.{name}) as torch.ops.{NAMESPACE}.{name}."
    return op


materialised = _op("materialised", launch.materialised)
qk_softmax = _op("qk_softmax", launch.qk_softmax)
fused = _op("fused", launch.fused)


def get(name: str):
    """torch.ops.attnlab.<name>, one of OPS."""
    if name not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}; got {name!r}")
    return getattr(torch.ops.attnlab, name)
