"""The fused build's training path: a forward that keeps each row's logsumexp, and FlashAttention-2's backward.

    forward(q, k, v, *, causal, attn_mask, scale)                    -> (o, lse)
    backward(do, q, k, v, o, lse, *, causal, attn_mask, scale, out)  -> (dq, dk, dv)

lse is fp32 (B, H, N): ln Σ_n exp(s_n) over each row's scaled and masked scores, +inf for a row every key of which
is masked. dq is (B, H, N, D), dk and dv (B, Hkv, N, D), in the inputs' dtype; a fully masked row's o and gradients
are 0. What the forward keeps for the backward is O and lse, B·H·N floats beside O, where materialised keeps P's
B·H·N².

The forward runs the Triton fused kernel with STORE_LSE (attnlab.triton.fused) on every device, Hopper included,
where inference runs the Gluon kernel; the backward runs attnlab.triton.fused_backward's three kernels. Their plans
(tiles, grids, constexprs) are attnlab.triton.plan's plan_fused_train, plan_fused_delta, plan_fused_dkdv and
plan_fused_dq; the backward's tiles are chosen in one place, plan.fused_backward_tiles.
"""
from __future__ import annotations

import torch

from attnlab.triton import fused_backward as fb
from attnlab.triton import direct, launch, plan
from attnlab.triton.config import LOG2E
from attnlab.validate import Spec


def forward(q, k, v, *, causal=False, attn_mask=None, scale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """O = softmax(scale·QKᵀ + mask) V in one kernel, and each row's logsumexp (fp32, (B, H, N)) for backward."""
    c = launch.prepare(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    s = c.spec
    pf = plan.plan_fused_train(s.B * s.H, s.N, s.D, s.dtype, s.causal, c.layout, s.device)
    o = torch.empty(s.B, s.H, s.N, s.D, dtype=s.dtype, device=s.device)
    lse = torch.empty(s.B, s.H, s.N, dtype=torch.float32, device=s.device)
    launch.triton_fused(c, pf, o, lse)
    return o, lse


def backward(do, q, k, v, o, lse, *, causal=False, attn_mask=None, scale=None,
             out=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of O = attention(q, k, v) given dO, from forward's o and lse (the arguments as forward took them).
    `out=(dq, dk, dv)` writes into the caller's tensors (unit last stride). Every input is checked before any
    work."""
    c = launch.prepare(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    s = c.spec
    o = _like_o("o", o, s)
    do = _like_o("do", do, s)
    lse = _checked_lse(lse, s)
    dq, dk, dv = _gradients(s, out)
    pk = plan.plan_fused_dkdv(s.B * s.Hkv, s.N, s.D, s.dtype, s.causal, c.layout, s.device)
    pq = plan.plan_fused_dq(s.B * s.H, s.N, s.D, s.dtype, s.causal, c.layout, s.device)
    delta = torch.empty(s.B, s.H, s.N, dtype=torch.float32, device=s.device)  # Δ = rowsum(dO ∘ O)
    direct.run(fb.delta_kernel, plan.plan_fused_delta(s.B * s.H, s.N, s.D, s.dtype, s.device), o, do, delta,
               *o.stride()[:3], *do.stride()[:3], s.N, s.H)
    # S in log2 units: qk_scale = scale · log2 e, an additive mask times log2 e; dK and dQ take the natural scale
    scales = (s.scale * LOG2E, LOG2E, s.scale)
    direct.run(fb.dkdv_kernel, pk, c.q, c.k, c.v, do, lse, delta, dk, dv, c.mask, *c.q.stride()[:3],
               *c.k.stride()[:3], *c.v.stride()[:3], *do.stride()[:3], *dk.stride()[:3], *dv.stride()[:3],
               *c.mask_strides, s.N, s.H, s.Hkv, s.group, *scales)
    direct.run(fb.dq_kernel, pq, c.q, c.k, c.v, do, lse, delta, dq, c.mask, *c.q.stride()[:3], *c.k.stride()[:3],
               *c.v.stride()[:3], *do.stride()[:3], *dq.stride()[:3], *c.mask_strides, s.N, s.H, s.group, *scales)
    return dq, dk, dv


def _like_o(name: str, t, s: Spec) -> torch.Tensor:
    """o or do checked against the call: a (B, H, N, D) tensor in q's dtype on q's device; given unit last stride."""
    shape = (s.B, s.H, s.N, s.D)
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape or t.dtype != s.dtype or t.device != s.device:
        raise ValueError(f"{name} must be a {s.dtype} tensor of shape (B, H, N, D) = {shape} on {s.device} (o's, as "
                         f"forward returned it), got {t.dtype} {tuple(t.shape)} on {t.device}")
    return t if t.stride(-1) == 1 else t.contiguous()


def _checked_lse(lse, s: Spec) -> torch.Tensor:
    """lse checked against the call: forward's fp32 (B, H, N) logsumexp on q's device; given contiguous."""
    shape = (s.B, s.H, s.N)
    if not isinstance(lse, torch.Tensor):
        raise ValueError(f"lse must be a torch.Tensor, got {type(lse).__name__}")
    if tuple(lse.shape) != shape or lse.dtype != torch.float32 or lse.device != s.device:
        raise ValueError(f"lse must be a torch.float32 tensor of shape (B, H, N) = {shape} on {s.device} (as forward "
                         f"returned it), got {lse.dtype} {tuple(lse.shape)} on {lse.device}")
    return lse.contiguous()


def _gradients(s: Spec, out) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq (B, H, N, D), dk and dv (B, Hkv, N, D) in the inputs' dtype: fresh, or the caller's `out` checked (tests pass
    NaN-poisoned ones to prove every element is written)."""
    shapes = {"dq": (s.B, s.H, s.N, s.D), "dk": (s.B, s.Hkv, s.N, s.D), "dv": (s.B, s.Hkv, s.N, s.D)}
    if out is None:
        return tuple(torch.empty(shape, dtype=s.dtype, device=s.device) for shape in shapes.values())
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise ValueError(f"out must be None or a tuple (dq, dk, dv) of three tensors, got {type(out).__name__}"
                         + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
    for i, ((name, shape), t) in enumerate(zip(shapes.items(), out)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != s.dtype \
                or t.device != s.device or t.stride(-1) != 1:
            got = f"{t.dtype} {tuple(t.shape)} on {t.device}, strides {t.stride()}" if isinstance(t, torch.Tensor) \
                else type(t).__name__
            raise ValueError(f"out[{i}] ({name}) must be a {s.dtype} tensor of shape {shape} on {s.device} with unit "
                             f"last stride, got {got}")
    return tuple(out)
