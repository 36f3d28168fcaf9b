"""Our three builds as operators torch knows (torch.library), so that torch.compile traces a model that calls them
with no graph break, mode="reduce-overhead" captures them in CUDA graphs, and a compiled training step sees each op
with its backward:

    torch.ops.attnlab.materialised(q, k, v, attn_mask=None, causal=False, scale=None) -> o
    torch.ops.attnlab.qk_softmax(q, k, v, attn_mask=None, causal=False, scale=None) -> o
    torch.ops.attnlab.fused(q, k, v, attn_mask=None, causal=False, scale=None) -> o

q (B, H, N, D), k and v (B, Hkv, N, D) with H % Hkv == 0, an optional mask that broadcasts to (B, H, N, N) (boolean,
True = attend, or additive); o (B, H, N, D) in q's dtype, a fresh tensor, differentiable in q, k and v. Each public
op picks one of its build's custom ops, as torch's own scaled_dot_product_attention picks a kernel:

    attnlab::<build>_inference(q, k, v, attn_mask, causal, scale) -> o               no input requires grad
    attnlab::<build>_forward(q, k, v, attn_mask, causal, scale) -> (o, kept)          else; its autograd runs
    attnlab::<build>_backward(do, q, k, v, o, kept, attn_mask, causal, scale) -> (dq, dk, dv)

The inference op runs the build's launcher (attnlab.triton.launch) as it is. The forward op runs its training
forward and returns what the backward needs beside q, k, v and o (kept: P for materialised and qk_softmax, the
logsumexp for fused; attnlab.builds.training); its autograd (torch.library.register_autograd) keeps what the build's
autograd Function keeps (training.keep_for_backward) and calls the backward op. The compiler sees the ops, not their
kernels (custom_op; the Gluon kernels are not traceable as Triton ops), and their fake implementations, which check
the arguments as the launchers do, give each output's shape, dtype, strides and device. The launchers allocate
through torch's caching allocator and never synchronise, which a CUDA graph needs. A mask that requires grad is an
error: no build gives a gradient for it. Importing this module registers the ops.
"""
from __future__ import annotations

import torch

from attnlab.builds import training
from attnlab.triton import launch
from attnlab.triton.layout import scores_buffer
from attnlab.validate import check

NAMESPACE = "attnlab"
OPS = ("materialised", "qk_softmax", "fused")
SCHEMA = "(Tensor q, Tensor k, Tensor v, Tensor? attn_mask=None, bool causal=False, float? scale=None) -> Tensor"


def _kept_like(name: str, q, k, v, attn_mask, causal, scale) -> torch.Tensor:
    """An empty tensor laid out as the build's forward keeps for its backward: P, a scores_buffer (B, H, N, N); or
    the logsumexp, (B, H, N) float32."""
    spec = check(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    if name == "fused":
        return q.new_empty((spec.B, spec.H, spec.N), dtype=torch.float32)
    return scores_buffer(spec)


def _register(name: str):
    """The build's inference, forward and backward custom ops, its forward's autograd, and its public op."""
    forward, backward = training.forward_of(name), training.backward_of(name)

    @torch.library.custom_op(f"{NAMESPACE}::{name}_inference", mutates_args=(), device_types=None)
    def inference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                  causal: bool = False, scale: float | None = None) -> torch.Tensor:
        return getattr(launch, name)(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)

    @inference.register_fake
    def _(q, k, v, attn_mask=None, causal=False, scale=None):
        check(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @torch.library.custom_op(f"{NAMESPACE}::{name}_forward", mutates_args=(), device_types=None)
    def forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                   causal: bool = False, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return forward(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)

    @forward_op.register_fake
    def _(q, k, v, attn_mask=None, causal=False, scale=None):
        return (torch.empty_like(q, memory_format=torch.contiguous_format),
                _kept_like(name, q, k, v, attn_mask, causal, scale))

    @torch.library.custom_op(f"{NAMESPACE}::{name}_backward", mutates_args=(), device_types=None)
    def backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                    kept: torch.Tensor, attn_mask: torch.Tensor | None = None, causal: bool = False,
                    scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return backward(do, q, k, v, o, kept, causal=causal, attn_mask=attn_mask, scale=scale)

    @backward_op.register_fake
    def _(do, q, k, v, o, kept, attn_mask=None, causal=False, scale=None):
        check(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
        return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))

    def grads(ctx, do, _kept):
        q, k, v, o, kept, attn_mask = ctx.saved_tensors
        dq, dk, dv = backward_op(do, q, k, v, o, kept, attn_mask, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None

    forward_op.register_autograd(grads, setup_context=training.keep_for_backward)

    torch.library.define(f"{NAMESPACE}::{name}", SCHEMA)

    @torch.library.impl(f"{NAMESPACE}::{name}", "CompositeImplicitAutograd")
    def public(q, k, v, attn_mask=None, causal=False, scale=None):
        training.refuse_mask_grad(attn_mask)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            return forward_op(q, k, v, attn_mask, causal, scale)[0]
        return inference(q, k, v, attn_mask, causal, scale)

    inference.__doc__ = f"The {name} build (attnlab.triton.launch.{name}) for inference."
    forward_op.__doc__ = f"The {name} build's training forward: o and what its backward needs."
    backward_op.__doc__ = f"The {name} build's backward: dq, dk, dv."


for _name in OPS:
    _register(_name)


def get(name: str):
    """torch.ops.attnlab.<name>, one of OPS: the public op, differentiable."""
    if name not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}; got {name!r}")
    return getattr(torch.ops.attnlab, name)
