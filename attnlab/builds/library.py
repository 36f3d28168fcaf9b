"""The library rows our builds stand beside: plain torch, every SDPA backend forced alone, compiled FlexAttention.

Each is an honest use of the library: no row silently falls back to another implementation. A forced SDPA backend
that cannot take the case raises Unsupported with torch's own reason; FlexAttention is compiled once per shape with
dynamic=False and refuses to run if torch._dynamo gave up compiling (the recompile-limit fallback to eager).
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnlab.triton.launch import Unsupported
from attnlab.validate import check, mask_4d


def torch_eager(q, k, v, *, causal=False, attn_mask=None, scale=None):
    """Attention as users write it in plain PyTorch: S and P materialised in the input dtype. Never compiled.

    A fully masked row gives NaN here, as it does in any such user code (softmax over all -inf).
    """
    spec = check(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    if spec.group > 1:  # grouped-query attention: each k/v head serves `group` query heads
        k = k.repeat_interleave(spec.group, dim=1)  # (B, H, N, D)
        v = v.repeat_interleave(spec.group, dim=1)  # (B, H, N, D)
    s = (q @ k.transpose(-2, -1)) * spec.scale  # (B, H, N, N)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    if causal:
        future = torch.ones(spec.N, spec.N, dtype=torch.bool, device=q.device).triu(1)  # (N, N)
        s = s.masked_fill(future, float("-inf"))
    p = torch.softmax(s, dim=-1)  # (B, H, N, N)
    return p @ v  # (B, H, N, D)


SDPA_BACKENDS = {
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa_math": SDPBackend.MATH,
}


def _sdpa_call(q, k, v, causal, attn_mask, scale):
    spec = check(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    if causal and attn_mask is not None:
        raise Unsupported("SDPA takes is_causal or attn_mask, not both")
    kw = dict(attn_mask=attn_mask, is_causal=causal, scale=spec.scale)
    if spec.group > 1:
        kw["enable_gqa"] = True
    return F.scaled_dot_product_attention(q, k, v, **kw)


def sdpa(backend: str):
    """An SDPA build with one backend forced (or torch's own choice for backend "default")."""
    chosen = SDPA_BACKENDS.get(backend)

    def attend(q, k, v, *, causal=False, attn_mask=None, scale=None):
        if chosen is None:
            return _sdpa_call(q, k, v, causal, attn_mask, scale)
        with warnings.catch_warnings(record=True) as caught, sdpa_kernel(chosen):
            warnings.simplefilter("always")
            try:
                return _sdpa_call(q, k, v, causal, attn_mask, scale)
            except RuntimeError as e:
                if "No available kernel" not in str(e) and "No viable backend" not in str(e):
                    raise
                # torch explains why in warnings (on GPUs); keep its first reason, one line.
                reasons = [str(w.message).split(" (Triggered internally")[0].strip() for w in caught]
                case = f"{q.device.type}, {q.dtype}, D={q.shape[-1]}" + (", mask" if attn_mask is not None else "")
                why = "; ".join(reasons)[:400] if reasons else "torch has no kernel for it"
                raise Unsupported(f"{backend} refused this case ({case}): {why}") from None

    attend.__name__ = f"sdpa_{backend}" if chosen is None else backend
    return attend


# -- FlexAttention ------------------------------------------------------------------------------------------------

_flex_compiled = None
_block_masks: dict = {}


def _compiled_flex():
    global _flex_compiled
    if _flex_compiled is None:
        from torch.nn.attention.flex_attention import flex_attention

        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    return _flex_compiled


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _block_mask(spec):
    """The causal block mask for one shape, built once (it is setup, not the attention being timed)."""
    from torch.nn.attention.flex_attention import create_block_mask

    key = (spec.N, str(spec.device))
    if key not in _block_masks:
        _block_masks[key] = create_block_mask(_causal, B=None, H=None, Q_LEN=spec.N, KV_LEN=spec.N,
                                              device=str(spec.device))
    return _block_masks[key]


_score_mods: dict = {}


def _score_mod(attn_mask, spec):
    """A score_mod reading an explicit mask, one function object per mask tensor: a new closure on every call
    would make torch.compile recompile on every call (and then hit the recompile limit)."""
    key = (id(attn_mask), spec.B, spec.H, spec.N)
    if key not in _score_mods:
        m = mask_4d(attn_mask, spec)  # (B, H, N, N) view, kept alive by the closure
        if m.dtype == torch.bool:
            def score_mod(score, b, h, q_idx, kv_idx):
                return torch.where(m[b, h, q_idx, kv_idx], score, -float("inf"))
        else:
            def score_mod(score, b, h, q_idx, kv_idx):
                return score + m[b, h, q_idx, kv_idx]
        _score_mods[key] = (attn_mask, score_mod)  # holding the tensor keeps its id from being reused
    return _score_mods[key][1]


def flex(q, k, v, *, causal=False, attn_mask=None, scale=None):
    """torch.compile'd FlexAttention; causal through a block mask, an explicit mask through a score_mod."""
    import torch._dynamo

    spec = check(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    score_mod = None if attn_mask is None else _score_mod(attn_mask, spec)
    block_mask = _block_mask(spec) if causal else None
    # The recompile-limit trap: past torch._dynamo's limit, a compiled function silently runs eager.
    # Failing loudly there turns the silent fallback into an error row instead of a wrong number.
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, recompile_limit=64,
                                    accumulated_recompile_limit=4096):
        return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=spec.scale,
                                enable_gqa=spec.group > 1)
