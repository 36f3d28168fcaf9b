"""Every attention implementation the lab measures, in one explicit, ordered table.

Each build has one call: `attend(q, k, v, *, causal=False, attn_mask=None, scale=None) -> o`, q (B, H, N, D),
k and v (B, Hkv, N, D) with H % Hkv == 0. A build that cannot run a case raises `Unsupported` with the reason; an
explicitly requested build never falls back to another. The fp64 oracle is `attnlab.reference.attend`.

    ours       materialised → qk_softmax → fused: each removes one memory boundary (S, then P)
    ablations  "<build>-<ablation>": the same kernels with one stage removed, still legal, output still consumed
    library    torch_eager, sdpa_default and each SDPA backend forced alone, flex (compiled FlexAttention)

For training, attnlab.builds.training gives ours and the library rows as differentiable calls (the ablations have no
backward), and attnlab.builds.ops our builds as torch.library ops with their backward.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from attnlab import cost
from attnlab.builds import library
from attnlab.triton import launch
from attnlab.triton.launch import Unsupported

__all__ = ["Build", "BUILDS", "ABLATIONS", "OURS", "Unsupported", "get", "names"]

OURS = ("materialised", "qk_softmax", "fused")
ABLATIONS = {
    "no_softmax": "softmax replaced by a copy: P = S (masked entries 0); no max, exp or normalisation",
    "no_pv": "PV contraction dropped: V never read, O[i, :] = Σ_n P[i, n]·n/N so every P element is consumed",
    "zero_mask": "an all-zero additive (N, N) mask loaded and applied: the cost of the mask stage itself",
}


@dataclass(frozen=True)
class Build:
    name: str
    attend: Callable
    family: str  # "ours", "ablation" or "library"
    base: str  # the build an ablation modifies; the build's own name otherwise
    ablation: str | None
    about: str

    @property
    def holds(self) -> str:
        """The (B, H, N, N) tensors it must hold at once in device memory: "S+P", "P" or "none" (attnlab.cost)."""
        return cost.holds(self.name)


_zero_masks: dict = {}


def _zero_mask(q) -> torch.Tensor:
    """The all-zero additive mask for q's N, dtype and device; made once, outside any timed call."""
    key = (q.shape[2], q.dtype, str(q.device))
    if key not in _zero_masks:
        _zero_masks.clear()  # one shape at a time: a sweep's N×N masks would otherwise pile up on the device
        _zero_masks[key] = torch.zeros(q.shape[2], q.shape[2], dtype=q.dtype, device=q.device)
    return _zero_masks[key]


def _with_zero_mask(attend, q, k, v, *, causal=False, attn_mask=None, scale=None, **kw):
    if attn_mask is not None:
        raise ValueError("attn_mask must be None for a zero_mask ablation: it supplies its own all-zero mask")
    return attend(q, k, v, causal=causal, attn_mask=_zero_mask(q), scale=scale, **kw)


def _ablated(base: str, ablation: str) -> Callable:
    launcher = getattr(launch, base)
    if ablation == "zero_mask":
        return partial(_with_zero_mask, launcher)
    return partial(launcher, ablation=ablation)


_ABOUT = {
    "materialised": "Triton: S = QKᵀ to memory, softmax reads S writes P, PV reads P",
    "qk_softmax": "Triton: QKᵀ+scale+mask+softmax in one kernel writes only P; then the same PV kernel",
    "fused": "Triton: one flash-style kernel (online softmax); S and P stay on chip",
}

BUILDS: dict[str, Build] = {}
for _name in OURS:
    BUILDS[_name] = Build(_name, getattr(launch, _name), "ours", _name, None, _ABOUT[_name])
for _name in OURS:
    for _ab, _what in ABLATIONS.items():
        BUILDS[f"{_name}-{_ab}"] = Build(f"{_name}-{_ab}", _ablated(_name, _ab), "ablation", _name, _ab,
                                         f"{_name} with {_what}")
BUILDS.update({
    "torch_eager": Build("torch_eager", library.torch_eager, "library", "torch_eager", None,
                         "plain PyTorch ops (matmul, softmax, matmul) as users write them, never compiled"),
    "sdpa_default": Build("sdpa_default", library.sdpa("default"), "library", "sdpa_default", None,
                          "F.scaled_dot_product_attention, torch picks the backend"),
    **{n: Build(n, library.sdpa(n), "library", n, None,
                f"F.scaled_dot_product_attention forced to the {b.name} backend alone")
       for n, b in library.SDPA_BACKENDS.items()},
    "flex": Build("flex", library.flex, "library", "flex", None,
                  "FlexAttention through torch.compile(dynamic=False), causal by block mask"),
})


def names() -> list[str]:
    return list(BUILDS)


def get(name: str) -> Build:
    try:
        return BUILDS[name]
    except KeyError:
        raise ValueError(f"build must be one of {', '.join(BUILDS)}; got {name!r}") from None
