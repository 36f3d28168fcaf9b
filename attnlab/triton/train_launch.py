"""Launchers for training with `materialised` and `qk_softmax`: a forward that keeps P for the backward, and the
backward from it (attnlab.triton.backward says what each kernel computes).

    materialised_forward(q, k, v, *, causal, attn_mask, scale) -> (o, P)
    qk_softmax_forward(q, k, v, *, causal, attn_mask, scale) -> (o, P)
    materialised_backward(do, q, k, v, o, P, *, causal, attn_mask, scale, out=None) -> (dq, dk, dv)
    qk_softmax_backward(do, q, k, v, o, P, *, causal, attn_mask, scale, out=None) -> (dq, dk, dv)

The forwards run the inference build's own kernels (attnlab.triton.launch) and return its P, the (B, H, N, N)
scores_buffer the PV kernel read, instead of freeing it: that is what these builds hold from forward to backward. The
backward takes the forward's arguments again (the mask only as part of the call: P already carries it, as zeros) and
returns dq (B, H, N, D), dk and dv (B, Hkv, N, D) in the inputs' dtype, or writes them into `out=(dq, dk, dv)`.
Every argument is checked before any kernel runs; a bad one is a ValueError that names it.
"""
from __future__ import annotations

import torch

from attnlab.triton import backward, direct, launch, plan
from attnlab.triton.layout import row_stride, scores_buffer
from attnlab.validate import Spec


def materialised_forward(q, k, v, *, causal=False, attn_mask=None, scale=None):
    """O and P as the materialised build computes them: S → memory, P = softmax(S) → memory (S freed), O = P V."""
    c = launch.prepare(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    P = launch.materialised_p(c)
    return launch.pv(c.spec, P, c.v), P


def qk_softmax_forward(q, k, v, *, causal=False, attn_mask=None, scale=None):
    """O and P as the qk_softmax build computes them: P by one kernel (S on chip) → memory, O = P V."""
    c = launch.prepare(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    P = launch.qk_softmax_p(c)
    return launch.pv(c.spec, P, c.v), P


def materialised_backward(do, q, k, v, o, P, *, causal=False, attn_mask=None, scale=None, out=None):
    """dq, dk, dv from the forward's P, one kernel a step, dP and dS through device memory."""
    c, do, o, (dq, dk, dv) = _checked(do, q, k, v, o, P, causal, attn_mask, scale, out)
    s = c.spec
    _transposed(s, P, do, dv)  # dV = Pᵀ dO
    dP = scores_buffer(s)
    launch.scores(launch.prepare(do, c.v, c.v, causal=s.causal, scale=1.0), dP)  # dP = dO Vᵀ: S's kernel on (dO, V)
    dS = scores_buffer(s)
    _ds(s, P, dP, do, o, c.v, dS, dp_on_chip=False)  # dS = P ∘ (dP − Δ), scaled
    del dP  # dead once dS exists, as P's S is once P exists
    launch.pv(s, dS, c.k, out=dq)  # dQ = dS K: the PV kernel on (dS, K)
    _transposed(s, dS, c.q, dk)  # dK = dSᵀ Q
    return dq, dk, dv


def qk_softmax_backward(do, q, k, v, o, P, *, causal=False, attn_mask=None, scale=None, out=None):
    """dq, dk, dv from the forward's P; dP never leaves the chip (the dS kernel computes it from dO and V)."""
    c, do, o, (dq, dk, dv) = _checked(do, q, k, v, o, P, causal, attn_mask, scale, out)
    s = c.spec
    _transposed(s, P, do, dv)  # dV = Pᵀ dO
    dS = scores_buffer(s)
    _ds(s, P, P, do, o, c.v, dS, dp_on_chip=True)  # dS = P ∘ (dO Vᵀ − Δ), scaled; the DP argument is never read
    launch.pv(s, dS, c.k, out=dq)  # dQ = dS K
    _transposed(s, dS, c.q, dk)  # dK = dSᵀ Q
    return dq, dk, dv


def _checked(do, q, k, v, o, P, causal, attn_mask, scale, out):
    """The prepared call (launch.prepare), dO and O with unit last stride, and the gradients' tensors: out's, checked,
    or fresh. ValueError naming the argument, before any kernel runs."""
    c = launch.prepare(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    s = c.spec
    qshape = (s.B, s.H, s.N, s.D)
    for name, t in (("do", do), ("o", o)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != qshape or t.dtype != s.dtype or t.device != s.device:
            raise ValueError(f"{name} must be a {s.dtype} tensor of q's shape {qshape} on {s.device}, "
                             f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    if not isinstance(P, torch.Tensor) or P.device != s.device:
        raise ValueError(f"P must be the forward's P, a tensor on {s.device}, got "
                         f"{P.device if isinstance(P, torch.Tensor) else type(P).__name__}")
    row_stride(P, s, "P")
    do, o = (t if t.stride(-1) == 1 else t.contiguous() for t in (do, o))
    return c, do, o, _grads(s, out)


def _grads(s: Spec, out) -> tuple:
    """(dq, dk, dv): fresh, or the caller's `out` once each is checked (tests pass NaN-poisoned ones, to prove every
    element is written)."""
    shapes = {"dq": (s.B, s.H, s.N, s.D), "dk": (s.B, s.Hkv, s.N, s.D), "dv": (s.B, s.Hkv, s.N, s.D)}
    if out is None:
        return tuple(torch.empty(shape, dtype=s.dtype, device=s.device) for shape in shapes.values())
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise ValueError(f"out must be a tuple (dq, dk, dv), got {type(out).__name__}")
    for (name, shape), t in zip(shapes.items(), out):
        if (not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != s.dtype or t.device != s.device
                or t.stride(-1) != 1):
            got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"out's {name} must be a {s.dtype} tensor of shape {shape} on {s.device} with unit last "
                             f"stride, got {got}")
    return tuple(out)


def _ds(s: Spec, P, dP, do, o, v, dS, dp_on_chip: bool) -> None:
    """dS = scale · P ∘ (dP − rowsum(dO ∘ O)) into dS (a scores_buffer); dP read from memory, or computed on chip."""
    pd = plan.plan_ds(s.B * s.H, s.N, s.D, s.dtype, s.causal, s.device, dp_on_chip)
    direct.run(backward.ds_kernel, pd, P, dP, do, o, v, dS, *do.stride()[:3], *o.stride()[:3], *v.stride()[:3],
               s.N, s.H, s.group, s.scale, P.stride(2), dP.stride(2), dS.stride(2))


def _transposed(s: Spec, A, X, Y) -> None:
    """Y = Σ over each k/v head's group of Aᵀ X: dV = Pᵀ dO, dK = dSᵀ Q."""
    pt = plan.plan_transposed(s.B * s.Hkv, s.N, s.D, s.dtype, s.causal, s.device)
    direct.run(backward.transposed_kernel, pt, A, X, Y, *X.stride()[:3], *Y.stride()[:3], s.N, s.Hkv, s.group,
               A.stride(2))
