"""How right is right: relative error against the fp64 oracle, judged by FlashAttention's rule.

    err = ‖o − ref‖ / ‖ref‖                         (ref: attnlab.reference.attend in float64)
    ok  ⇔ err ≤ max(2 · err_lowp, FLOOR[dtype])  and  err ≤ CAP[dtype]

err_lowp is the error of the same math done by plain torch in the inputs' dtype (reference.attend(dtype=q.dtype)):
a build may be at most twice as wrong as straightforward torch. FLOOR keeps the rule meaningful where torch is
nearly exact; CAP is the hard ceiling per dtype whatever torch does (METHOD.md: bf16 between 1e-3 and 1e-2).
NaN or inf never passes.
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
    limit = min(max(2 * err_lowp, FLOOR[q.dtype]), CAP[q.dtype])
    return Verdict(err, err_lowp, limit, err <= limit)
