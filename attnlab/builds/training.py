"""The builds that have a backward, as differentiable attention calls for training.

    attend(name) -> callable (q, k, v, *, causal=False, attn_mask=None, scale=None) -> o, differentiable in q, k, v
    names()      -> the builds with a backward: ours, then the library rows
    saved(name)  -> what the build holds from forward to backward beside q, k, v and o, in words

Ours are one torch.autograd.Function each: materialised and qk_softmax keep their forward's P, (B, H, N, N), and run
their backward from it (attnlab.triton.train_launch); fused keeps each row's logsumexp, (B, H, N) in float32, and
recomputes P tile by tile in FlashAttention-2's backward (attnlab.triton.fused_train). The library rows are the
callables of attnlab.builds as they are: torch's autograd gives their backward. The ablations are forward-only
programs and have none. No build gives a gradient for the mask: a mask that requires grad is an error, as is a name
without a backward, before any work starts.
"""
from __future__ import annotations

import importlib
from typing import Callable

import torch
from torch.autograd.function import once_differentiable

from attnlab import builds
from attnlab.triton import train_launch
from attnlab.triton.launch import Unsupported

FUSED_TRAIN = "attnlab.triton.fused_train"  # the fused build's forward (with logsumexp) and backward

SAVED = {
    "materialised": "P",
    "qk_softmax": "P",
    "fused": "logsumexp",
    "torch_eager": "P",  # softmax's output, which its backward and P V's both read
    "sdpa_math": "P",
    "sdpa_flash": "logsumexp",
    "sdpa_efficient": "logsumexp",
    "sdpa_cudnn": "logsumexp",
    "sdpa_default": "the chosen backend's: P (math) or logsumexp (flash, efficient, cudnn)",
    "flex": "logsumexp",
}


def names() -> list[str]:
    """The builds with a backward: ours, then the library rows, in attnlab.builds' order."""
    return [n for n, b in builds.BUILDS.items() if b.family in ("ours", "library")]


def saved(name: str) -> str:
    """What `name` holds from forward to backward beside its inputs and output: "P" (B·H·N² elements), "logsumexp"
    (B·H·N in float32), or for sdpa_default whichever its chosen backend holds."""
    _known(name)
    return SAVED[name]


def _known(name: str) -> None:
    if name not in names():
        b = builds.BUILDS.get(name)
        why = (f"{name!r} is an ablation: a forward-only program, with no backward" if b and b.family == "ablation"
               else f"{name!r} is not a build")
        raise ValueError(f"build must be one with a backward ({', '.join(names())}); {why}")


def fused_train():
    """attnlab.triton.fused_train, the fused build's training kernels; Unsupported where this checkout lacks it."""
    try:
        return importlib.import_module(FUSED_TRAIN)
    except ModuleNotFoundError as e:
        if e.name != FUSED_TRAIN:
            raise
        raise Unsupported(f"{FUSED_TRAIN} is not in this checkout: the fused build has no backward here") from None


def forward_of(name: str) -> Callable:
    """Our build's training forward, (q, k, v, *, causal, attn_mask, scale) -> (o, what it saves)."""
    if name == "fused":
        return lambda *a, **kw: fused_train().forward(*a, **kw)
    return getattr(train_launch, f"{name}_forward")


def backward_of(name: str) -> Callable:
    """Our build's backward, (do, q, k, v, o, what it saved, *, causal, attn_mask, scale) -> (dq, dk, dv)."""
    if name == "fused":
        return lambda *a, **kw: fused_train().backward(*a, **kw)
    return getattr(train_launch, f"{name}_backward")


def keep_for_backward(ctx, inputs, output) -> None:
    """What one of our builds keeps for its backward, from its forward's inputs (q, k, v, attn_mask, causal, scale)
    and output (o, kept): q, k, v, o, kept and the mask as saved tensors, causal and scale on ctx; kept is no output
    a caller differentiates. The autograd Functions here and the custom ops' autograd (attnlab.builds.ops) both
    set up their context with it."""
    q, k, v, attn_mask, causal, scale = inputs
    o, kept = output
    ctx.mark_non_differentiable(kept)
    ctx.save_for_backward(q, k, v, o, kept, attn_mask)
    ctx.causal, ctx.scale = causal, scale


def _function(name: str) -> type[torch.autograd.Function]:
    """The torch.autograd.Function of one of our builds."""
    forward, backward = forward_of(name), backward_of(name)

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(q, k, v, attn_mask, causal, scale):
            return forward(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)

        @staticmethod
        def setup_context(ctx, inputs, output):
            keep_for_backward(ctx, inputs, output)

        @staticmethod
        @once_differentiable
        def backward(ctx, do, _kept):
            q, k, v, o, kept, attn_mask = ctx.saved_tensors
            dq, dk, dv = backward(do, q, k, v, o, kept, causal=ctx.causal, attn_mask=attn_mask, scale=ctx.scale)
            return dq, dk, dv, None, None, None

    Attention.__name__ = Attention.__qualname__ = "".join(w.capitalize() for w in name.split("_"))
    return Attention


FUNCTIONS = {name: _function(name) for name in builds.OURS}


def refuse_mask_grad(attn_mask) -> None:
    """A mask that requires grad is an error: no build gives a gradient for it."""
    if isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad:
        raise ValueError("attn_mask must not require grad: no build gives a gradient for the mask (pass "
                         "attn_mask.detach())")


def attend(name: str) -> Callable:
    """The differentiable call of a build with a backward (names()): (q, k, v, *, causal=False, attn_mask=None,
    scale=None) -> o, whose backward gives dq, dk and dv. ValueError for an ablation or an unknown name."""
    _known(name)
    if name in FUNCTIONS:
        function = FUNCTIONS[name]

        def call(q, k, v, *, causal=False, attn_mask=None, scale=None):
            refuse_mask_grad(attn_mask)
            return function.apply(q, k, v, attn_mask, causal, scale)[0]
    else:
        library = builds.get(name).attend

        def call(q, k, v, *, causal=False, attn_mask=None, scale=None):
            refuse_mask_grad(attn_mask)
            return library(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)

    call.__name__ = name
    return call
