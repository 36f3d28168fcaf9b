"""How right is right: relative error against the fp64 oracle, judged by FlashAttention's rule.

    err = ‖o − ref‖ / ‖ref‖                         (ref: attnlab.reference.attend in float64)
    ok  ⇔ err ≤ max(2 · err_lowp, FLOOR[dtype])  and  err ≤ CAP[dtype]

err_lowp is the error of the same math done by plain torch in the inputs' dtype (reference.attend(dtype=q.dtype)):
a build may be at most twice as wrong as straightforward torch. FLOOR keeps the rule meaningful where torch is
nearly exact; CAP is the hard ceiling per dtype whatever torch does (METHOD.md: bf16 between 1e-3 and 1e-2).
NaN or inf never passes.

Gradients (judge_grads) follow the same rule: err is the largest of dQ's, dK's and dV's relative errors against
torch.autograd through the oracle in float64, err_lowp the largest of plain torch autograd's in the inputs' dtype.
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
    err = rel_error(o, ref)
    err_lowp = rel_error(reference.attend(q, k, v, dtype=q.dtype, **kw), ref)
    most = limit(err_lowp, q.dtype)
    return Verdict(err, err_lowp, most, err <= most)


def limit(err_lowp: float, dtype: torch.dtype) -> float:
    """The most a build's error may be: twice plain torch's, within FLOOR and CAP for the dtype."""
    return min(max(2 * err_lowp, FLOOR[dtype]), CAP[dtype])


def oracle_grads(q, k, v, do, *, dtype=torch.float64, **kw) -> tuple:
    """(dQ, dK, dV) of reference.attend computed in `dtype` for the output gradient `do`, through torch.autograd."""
    leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    o = reference.attend(*leaves, dtype=dtype, **kw)
    return torch.autograd.grad(o, leaves, do.to(dtype))


def judge_grads(grads, q, k, v, do, *, causal=False, attn_mask=None, scale=None) -> Verdict:
    """Compare one build's (dQ, dK, dV) for the output gradient `do` with the oracle's under the forward's rule."""
    kw = dict(causal=causal, attn_mask=attn_mask, scale=scale)
    ref = oracle_grads(q, k, v, do, **kw)
    err = max(rel_error(g, r) for g, r in zip(grads, ref))
    err_lowp = max(rel_error(g, r) for g, r in zip(oracle_grads(q, k, v, do, dtype=q.dtype, **kw), ref))
    most = limit(err_lowp, q.dtype)
    return Verdict(err, err_lowp, most, err <= most)
