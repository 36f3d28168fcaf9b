"""Launchers for our three builds: check the inputs, look up each kernel's plan, allocate the outputs, launch.

Every launcher has the build signature `(q, k, v, *, causal=False, attn_mask=None, scale=None) -> o` plus the
keywords `ablation` (None, "no_softmax" or "no_pv"; "zero_mask" is a mask the caller passes, not a kernel flag) and
`out` (write O there instead of a fresh tensor). Which kernel runs, with which tiles, grid and constexprs, is the
kernel's plan (attnlab.triton.plan), made once per shape, dtype, mask layout and device; `tile_config` records the
plans' tiles in every result row.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.triton import fused as _fused
from attnlab.triton import materialised as _mat
from attnlab.triton import pv as _pv_mod
from attnlab.triton import qk_softmax as _qks
from attnlab.triton import direct, plan
from attnlab.triton.config import Tiles, unsupported_reason
from attnlab.triton.layout import (MaskLayout, mask_layout, row_stride, rows_pad, scores_buffer,
                                   tma_can_read)
from attnlab.validate import Spec, check, mask_4d

KERNEL_ABLATIONS = (None, "no_softmax", "no_pv")
MAX_GRID_YZ = 65535  # CUDA's limit on a grid's second and third axes, where our kernels put B·H


class Unsupported(RuntimeError):
    """This build cannot run this case here (device, dtype, shape); the message says why. Never a fallback."""


@dataclass(frozen=True)
class _Call:
    """The checked arguments of one call, in the form every kernel takes them."""

    spec: Spec
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor  # (B, H, N, N) view, or q as a never-read placeholder when there is no mask
    mask_strides: tuple
    mask_kind: int  # 0 none, 1 boolean (True = attend), 2 additive
    layout: MaskLayout | None  # what of the mask's layout its kernels' plans read; None without a mask


def _prepare(q, k, v, causal, attn_mask, scale, ablation) -> _Call:
    spec = check(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    if ablation not in KERNEL_ABLATIONS:
        raise ValueError(f"ablation must be one of {KERNEL_ABLATIONS}, got {ablation!r}")
    why = unsupported_reason(spec.device)
    if why:
        raise Unsupported(why)
    if spec.B * spec.H > MAX_GRID_YZ:
        raise Unsupported(f"B·H = {spec.B * spec.H} exceeds {MAX_GRID_YZ}, the CUDA grid-axis limit our kernels put "
                          "batch × heads on; split the batch")
    # Kernels index the last dim with unit stride; other strides are passed through.
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if attn_mask is None:
        return _Call(spec, q, k, v, q, (0, 0, 0, 0), 0, None)
    mask = mask_4d(attn_mask, spec)
    if mask.dtype == torch.bool:
        mask, kind = mask.view(torch.uint8), 1
    else:
        kind = 2
    return _Call(spec, q, k, v, mask, mask.stride(), kind, mask_layout(mask, kind))


def prepare(q, k, v, *, causal=False, attn_mask=None, scale=None, ablation=None) -> _Call:
    """The checked call every launcher starts from, for launchers outside this module (attnlab.triton.train_launch):
    the inputs validated (attnlab.validate.check, then this device's limits), each with unit last stride, and the
    mask as a (B, H, N, N) view with its kind and layout."""
    return _prepare(q, k, v, causal, attn_mask, scale, ablation)


def _out(spec: Spec, out) -> torch.Tensor:
    """O, freshly allocated or the caller's (tests pass a NaN-poisoned `out` to prove every element is written)."""
    shape = (spec.B, spec.H, spec.N, spec.D)
    if out is None:
        return torch.empty(shape, dtype=spec.dtype, device=spec.device)
    if tuple(out.shape) != shape or out.dtype != spec.dtype or out.device != spec.device:
        raise ValueError(f"out must be a {spec.dtype} tensor of shape {shape} on {spec.device}, "
                         f"got {out.dtype} {tuple(out.shape)} on {out.device}")
    return out


def pv(spec: Spec, p: torch.Tensor, v: torch.Tensor, *, ablation=None, out=None) -> torch.Tensor:
    """O = P V (or, under no_pv, O = Σ_n P[:, n]·n/N broadcast over D) from a (B, H, N, N) P in device memory (the
    build's scores_buffer) and a (B, Hkv, N, D) V with unit last stride, for the call `spec` describes: the Gluon
    kernel where the plan picks it, else the Triton one. The training backward's dQ = dS K is this product too
    (attnlab.triton.train_launch)."""
    s = spec
    o = _out(s, out)
    spn = row_stride(p, s, "P")
    pp = plan.plan_pv(s.B * s.H, s.N, s.D, s.dtype, s.causal, s.device, ablation)
    if pp.gluon:
        from attnlab.triton.hopper import pv as pv_gluon

        pv_gluon.run(pp, p, v, o, s.N, s.H, s.group, 1.0 / s.N)
        return o
    direct.run(_pv_mod.pv_kernel, pp, p, v, o, *v.stride()[:3], *o.stride()[:3], s.N, s.H, s.group, 1.0 / s.N, spn)
    return o


def scores(c: _Call, S: torch.Tensor) -> None:
    """materialised's first kernel: S = scale·QKᵀ (+mask) of a prepared call into S (a scores_buffer),
    -inf where masked. The training backward's dP = dO Vᵀ is this product too, on a call prepared with dO for Q, V for
    K and scale 1 (attnlab.triton.train_launch)."""
    s = c.spec
    ps = plan.plan_scores(s.B * s.H, s.N, s.D, s.dtype, s.causal, c.layout, s.device)
    direct.run(_mat.scores_kernel, ps, c.q, c.k, S, c.mask, *c.q.stride()[:3], *c.k.stride()[:3], *c.mask_strides,
               s.N, s.H, s.group, s.scale, S.stride(2))


def materialised_p(c: _Call, ablation: str | None = None) -> torch.Tensor:
    """The materialised build's P for a prepared call, in a fresh scores_buffer: S = scale·QKᵀ (+mask) → memory,
    P = softmax(S) → memory (S itself under no_softmax); S is freed before it returns."""
    s = c.spec
    S = scores_buffer(s)
    scores(c, S)
    P = scores_buffer(s)
    sm = plan.plan_softmax(s.B * s.H, s.N, s.dtype, ablation)
    direct.run(_mat.softmax_kernel, sm, S, P, s.B * s.H * s.N, s.N, S.stride(2), P.stride(2))
    del S  # S is dead once P exists; freeing it here keeps the peak at S + P, as a user's code would
    return P


def qk_softmax_p(c: _Call, ablation: str | None = None) -> torch.Tensor:
    """The qk_softmax build's P for a prepared call, in a fresh scores_buffer, by its one P kernel (S stays on
    chip)."""
    s = c.spec
    P = scores_buffer(s)
    _write_p(c, P, plan.plan_qk_softmax(s.B * s.H, s.N, s.D, s.dtype, s.causal, c.layout, s.device, ablation))
    return P


def materialised(q, k, v, *, causal=False, attn_mask=None, scale=None, ablation=None, out=None) -> torch.Tensor:
    """S = scale·QKᵀ (+mask) → memory; P = softmax(S) → memory; O = P V."""
    c = _prepare(q, k, v, causal, attn_mask, scale, ablation)
    return pv(c.spec, materialised_p(c, ablation), c.v, ablation=ablation, out=out)


def qk_softmax(q, k, v, *, causal=False, attn_mask=None, scale=None, ablation=None, out=None) -> torch.Tensor:
    """P = softmax(scale·QKᵀ + mask) in one kernel (S stays on chip) → memory; O = P V."""
    c = _prepare(q, k, v, causal, attn_mask, scale, ablation)
    return pv(c.spec, qk_softmax_p(c, ablation), c.v, ablation=ablation, out=out)


def write_p(c: _Call, P: torch.Tensor, chosen: Tiles, no_softmax: bool = False) -> None:
    """The qk_softmax build's first kernel with `chosen` tiles, at any N: P = softmax(scale·QKᵀ + mask) into the
    (B, H, N, N) P (S itself under the no_softmax ablation): the Gluon kernel for Gluon tiles, else the Triton one.
    P: the build's scores_buffer, or any layout row_stride takes."""
    s = c.spec
    _write_p(c, P, plan.plan_qk_softmax(s.B * s.H, s.N, s.D, s.dtype, s.causal, c.layout, s.device,
                                        "no_softmax" if no_softmax else None, tiles=chosen,
                                        rows_pad=rows_pad(s.N, P)))


def _write_p(c: _Call, P: torch.Tensor, pp) -> None:
    """P by the P kernel `pp` plans. Under a pass 1 against a fixed reference the Gluon kernel flags the rows it
    leaves wrong, and the Triton kernel then re-writes their blocks (pp.repair: a second launch, which returns at
    once where nothing is flagged)."""
    s = c.spec
    spn = row_stride(P, s, "P")
    qk_scale = s.scale * pp.log_scale  # softmax in exp2 units; the copy ablation writes S itself
    if not pp.gluon:
        _triton_p(c, P, spn, pp, qk_scale)
        return
    if pp.one_pass:
        from attnlab.triton.hopper import qk_softmax_row

        qk_softmax_row.run(pp, c.q, c.k, P, s.N, s.H, s.group, qk_scale)
        return
    from attnlab.triton.hopper import qk_softmax as qk_softmax_gluon

    flags = None if pp.repair is None else torch.empty(s.B * s.H * s.N, dtype=torch.int8, device=s.device)
    qk_softmax_gluon.run(pp, c.q, c.k, P, c.mask, c.mask_strides, s.N, s.H, s.group, qk_scale, pp.log_scale, flags)
    if flags is not None:
        _triton_p(c, P, spn, pp.repair, qk_scale, FLAGS=flags)


def _triton_p(c: _Call, P: torch.Tensor, spn: int, pp, qk_scale: float, **flags) -> None:
    """The Triton P kernel as `pp` plans it: every block of P (rows spn apart, write_p's row_stride), or (a repair
    plan, given FLAGS) only those with a flagged row."""
    s = c.spec
    direct.run(_qks.qk_softmax_kernel, pp, c.q, c.k, P, c.mask, *c.q.stride()[:3], *c.k.stride()[:3],
               *c.mask_strides, s.N, s.H, s.group, qk_scale, pp.log_scale, spn, **flags)


def fused(q, k, v, *, causal=False, attn_mask=None, scale=None, ablation=None, out=None) -> torch.Tensor:
    """O = softmax(scale·QKᵀ + mask) V in one kernel; S and P never leave the chip."""
    c = _prepare(q, k, v, causal, attn_mask, scale, ablation)
    s = c.spec
    pf = plan.plan_fused(s.B * s.H, s.N, s.D, s.dtype, causal, c.layout, s.device, ablation)
    o = _out(s, out)
    if pf.gluon:  # the warp-specialised kernel (sm90, 16-bit), for the build and all its ablations and masks
        from attnlab.triton.hopper import fused as fused_gluon

        fused_gluon.run(pf, c.q, c.k, c.v, o, c.mask, c.mask_strides, s.N, s.H, s.group, s.scale * pf.log_scale,
                        pf.log_scale, 1.0 / s.N)
        return o
    triton_fused(c, pf, o)
    return o


def triton_fused(c: _Call, pf: plan.FusedPlan, o: torch.Tensor, lse: torch.Tensor | None = None) -> None:
    """The Triton fused kernel as `pf` plans it, on a prepared call, O into `o`; under a training plan
    (plan.plan_fused_train: STORE_LSE) each row's logsumexp into `lse` as well (fp32, (B, H, N), contiguous: what the
    training forward keeps for the backward, attnlab.triton.fused_train)."""
    s = c.spec
    if pf.constexprs.get("STORE_LSE", False) != (lse is not None):
        raise ValueError("lse is given exactly when the plan keeps each row's logsumexp (plan.plan_fused_train)")
    lse_arg = {} if lse is None else {"LSE": lse}
    direct.run(_fused.fused_kernel, pf, c.q, c.k, c.v, o, c.mask, *c.q.stride()[:3], *c.k.stride()[:3],
               *c.v.stride()[:3], *o.stride()[:3], *c.mask_strides, s.N, s.H, s.group, s.scale * pf.log_scale,
               pf.log_scale, 1.0 / s.N, **lse_arg)


def plans(build: str, spec: Spec, ablation: str | None = None) -> dict:
    """Each kernel's plan for a build (or its ablation) on this case, {kernel: plan}, as its launch makes them, with
    the mask the case implies: its spec's mask kind, or the zero_mask ablation's additive one, an (N, N) mask
    broadcast over B and H (builds._zero_mask's) in q's dtype, or boolean. The mask is a meta tensor: no storage, only
    the strides and dtype that decide how a kernel reads it."""
    kind = {"none": 0, "bool": 1, "additive": 2}[spec.mask_kind]
    if ablation == "zero_mask":
        kind, ablation = 2, None
    layout = None
    if kind:
        meta = torch.empty(spec.N, spec.N, dtype=torch.uint8 if kind == 1 else spec.dtype,
                           device="meta").expand(spec.B, spec.H, spec.N, spec.N)
        layout = MaskLayout(kind, meta.element_size(), tma_can_read(meta), False, False)
    heads, s = spec.B * spec.H, spec
    make = {"scores": lambda: plan.plan_scores(heads, s.N, s.D, s.dtype, s.causal, layout, s.device),
            "qk_softmax": lambda: plan.plan_qk_softmax(heads, s.N, s.D, s.dtype, s.causal, layout, s.device,
                                                       ablation),
            "pv": lambda: plan.plan_pv(heads, s.N, s.D, s.dtype, s.causal, s.device, ablation),
            "fused": lambda: plan.plan_fused(heads, s.N, s.D, s.dtype, s.causal, layout, s.device, ablation)}
    kernels = {"materialised": ("scores", "pv"), "qk_softmax": ("qk_softmax", "pv"), "fused": ("fused",)}[build]
    return {kn: make[kn]() for kn in kernels}


def tile_config(build: str, spec: Spec, ablation: str | None = None) -> dict:
    """The tiles each kernel of a build (or of its ablation) runs for this case (plans' tiles: their label is
    plan.label), {kernel: Tiles fields}: recorded in every result row."""
    return {kn: p.tiles.as_dict() for kn, p in plans(build, spec, ablation).items()}
