"""How right is right: relative error against the fp64 oracle, judged by FlashAttention's rule.

    err = ‖o − ref‖ / ‖ref‖                         (ref: attnlab.reference.attend in float64)
    ok  ⇔ err ≤ max(2 · err_lowp, FLOOR[dtype])  and  err ≤ CAP[dtype]

err_lowp is the error of the same math done by plain torch in the inputs' dtype (reference.attend(dtype=q.dtype)):
a build may be at most twice as wrong as straightforward torch. FLOOR keeps the rule meaningful where torch is
nearly exact; CAP is the hard ceiling per dtype whatever torch does (METHOD.md: bf16 between 1e-3 and 1e-2).
NaN or inf never passes. Gradients are judged by the same rule, each of dQ, dK and dV against torch.autograd's in
float64 (reference.grads), with err_lowp plain torch autograd's error in the inputs' dtype (judge_grads).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab import reference

FLOOR = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
CAP = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}


def rel_error(o: torch.Tensor, ref: torch.Tensor) -> float:
    """‖o − ref‖ / ‖ref‖ in float64 (inf when o holds NaN or inf; absolute error when ref is all zeros)."""
    o64 = o.to(torch.float64)
    if not torch.isfinite(o64).all():
        return float("inf")
    num = (o64 - ref.to(o64.device)).norm().item()
    den = ref.norm().item()
    return num / den if den > 0 else num


@dataclass(frozen=True)
class Verdict:
    err: float  # this build's relative error
    err_lowp: float  # plain torch's, same math, same dtype
    limit: float  # the most err may be
    ok: bool


def judge(o, q, k, v, *, causal=False, attn_mask=None, scale=None, ablation=None, ref=None) -> Verdict:
    """Compare one build's output with the oracle under the FlashAttention rule."""
    kw = dict(causal=causal, attn_mask=attn_mask, scale=scale, ablation=ablation)
    if ref is None:
        ref = reference.attend(q, k, v, **kw)
    return verdict(rel_error(o, ref), rel_error(reference.attend(q, k, v, dtype=q.dtype, **kw), ref), q.dtype)


def verdict(err: float, err_lowp: float, dtype: torch.dtype) -> Verdict:
    """The rule: err at most twice plain torch's err_lowp in the same dtype, FLOOR[dtype] at least, CAP[dtype] at
    most."""
    limit = min(max(2 * err_lowp, FLOOR[dtype]), CAP[dtype])
    return Verdict(err, err_lowp, limit, err <= limit)


GRADS = ("dq", "dk", "dv")


@dataclass(frozen=True)
class GradRefs:
    """What a build's gradients are judged against, for one set of inputs: the fp64 oracle's (dq, dk, dv) and plain
    torch autograd's in the inputs' dtype (reference.grads)."""

    oracle: tuple
    lowp: tuple
    dtype: torch.dtype


def grad_refs(do, q, k, v, *, causal=False, attn_mask=None, scale=None) -> GradRefs:
    kw = dict(causal=causal, attn_mask=attn_mask, scale=scale)
    return GradRefs(reference.grads(do, q, k, v, **kw), reference.grads(do, q, k, v, dtype=q.dtype, **kw), q.dtype)


def judge_grads(grads, refs: GradRefs) -> dict[str, Verdict]:
    """{"dq": Verdict, "dk": …, "dv": …}: each of a build's gradients under the rule of judge."""
    return {name: verdict(rel_error(g, ref), rel_error(low, ref), refs.dtype)
            for name, g, ref, low in zip(GRADS, grads, refs.oracle, refs.lowp)}
