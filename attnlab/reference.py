"""The oracle: attention in float64, dense, written to be obviously right rather than fast.

    S = scale · Q Kᵀ  (+ additive mask; boolean-False and causal-future entries set to -inf)
    P = softmax(S) row by row; a row with every entry masked gives P = 0 (so O = 0), never NaN
    O = P V

The ablated programs have their own oracles here too (see attnlab.builds.ABLATIONS):
    no_softmax: P = S with masked entries 0 instead of -inf (a copy, no max/exp/normalisation)
    no_pv:      O[i, :] = Σ_n P[i, n] · n/N for every d (P consumed, V never read)
    zero_mask:  the base program; the all-zero additive mask changes nothing

and the gradients' oracle, dQ, dK and dV by torch.autograd through the same code in float64 (grads).
"""
from __future__ import annotations

import torch

from attnlab.validate import check, mask_4d


def scores(q, k, *, causal=False, attn_mask=None, scale=None, dtype=torch.float64) -> torch.Tensor:
    """S in `dtype`, shape (B, H, N, N); masked entries are -inf."""
    spec = check(q, k, k, causal=causal, attn_mask=attn_mask, scale=scale)
    return _scores(q.to(dtype), k.to(dtype), spec, attn_mask)


def _scores(qd, kd, spec, attn_mask) -> torch.Tensor:
    """S from q and k already in the dtype of the computation."""
    kd = kd.repeat_interleave(spec.group, dim=1)  # (B, H, N, D)
    s = torch.matmul(qd, kd.transpose(-1, -2)) * spec.scale  # (B, H, N, N)
    if attn_mask is not None:
        m = mask_4d(attn_mask, spec)
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.to(qd.dtype)
    if spec.causal:
        future = torch.ones(spec.N, spec.N, dtype=torch.bool, device=qd.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    return s


def softmax(s: torch.Tensor) -> torch.Tensor:
    """Row softmax with fully masked rows (all -inf) giving zeros instead of NaN."""
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    l = e.sum(dim=-1, keepdim=True)
    return e / torch.where(l == 0, torch.ones_like(l), l)


def attend(q, k, v, *, causal=False, attn_mask=None, scale=None, ablation=None, dtype=torch.float64) -> torch.Tensor:
    """O on q's device, shape (B, H, N, D), computed in `dtype`.

    float64 (the default) is the oracle. In the inputs' own dtype it is "the same math done by plain torch in that
    dtype", the yardstick of FlashAttention's accuracy rule (attnlab.accuracy).
    """
    spec = check(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    if ablation not in (None, "no_softmax", "no_pv", "zero_mask"):
        raise ValueError(f"ablation must be None, 'no_softmax', 'no_pv' or 'zero_mask', got {ablation!r}")
    return _attend(q.to(dtype), k.to(dtype), v.to(dtype), spec, attn_mask, ablation)


def _attend(qd, kd, vd, spec, attn_mask, ablation) -> torch.Tensor:
    """O from q, k and v already in the dtype of the computation."""
    s = _scores(qd, kd, spec, attn_mask)
    if ablation == "no_softmax":
        p = torch.where(torch.isinf(s) & (s < 0), torch.zeros_like(s), s)
    else:
        p = softmax(s)
    if ablation == "no_pv":
        pos = torch.arange(spec.N, dtype=qd.dtype, device=qd.device) / spec.N  # (N,)
        return (p @ pos)[..., None].expand(spec.B, spec.H, spec.N, spec.D).contiguous()
    return p @ vd.repeat_interleave(spec.group, dim=1)  # (B, H, N, D)


def grads(do, q, k, v, *, causal=False, attn_mask=None, scale=None, dtype=torch.float64) -> tuple:
    """(dq, dk, dv), the gradients of attend's O against dO, by torch.autograd through the code above in `dtype`:
    float64 (the default) is the gradients' oracle; in the inputs' own dtype it is plain torch autograd's, the
    yardstick of the accuracy rule for gradients (attnlab.accuracy.judge_grads). A fully masked row gives zeros."""
    spec = check(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    if not isinstance(do, torch.Tensor) or do.shape != q.shape:
        raise ValueError(f"do must be a tensor of q's shape {tuple(q.shape)}, got "
                         f"{tuple(do.shape) if isinstance(do, torch.Tensor) else type(do).__name__}")
    leaves = tuple(t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        o = _attend(*leaves, spec, attn_mask, None)
        return torch.autograd.grad(o, leaves, do.to(dtype))
