"""The slips people make in exercises 2 and 3, each computed on the check's own inputs, so a failing check can say
which slip an answer matches, as a hint at what is wrong, instead of printing the numbers it expected.

    online_softmax(q, k, v, scale, block_n)     {slip: O that slip gives}: the running sum or the accumulator (or
                                                both) not rescaled when the max changes, O left undivided by the
                                                running sum, the scores left unscaled
    kernel(q, k, v, causal, block_n)            {slip: O}: the last tile's keys past N counted (read as zeros, they
                                                score 0), the causal mask left out, and both
    matching(yours, slips)                      the first slip whose O yours matches, or None
    HINTS                                       {slip: what to look at}

Each slip is computed in float64 from the inputs, never from a reference solution; none of them is the right answer.
"""
from __future__ import annotations

import torch

HINTS = {
    "nothing rescaled": "your running sum and accumulator are not rescaled when the max changes: what l and acc hold "
                        "was summed under the old max, so multiply both by exp(m_old − m_new) before adding this "
                        "tile's terms",
    "sum not rescaled": "your accumulator is rescaled when the max changes, but your running sum is not: l was "
                        "summed under the old max too",
    "accumulator not rescaled": "your running sum is rescaled when the max changes, but your accumulator is not: acc "
                                "was summed under the old max too",
    "not divided": "yours is the accumulator, not O: divide it by the running sum at the end (O = acc / l)",
    "not scaled": "the scores are not multiplied by scale: s = scale · q kᵀ",
    "keys past N": "the last key tile runs past N: its keys past N were loaded as zeros, so their scores are 0, not "
                   "absent, and each adds exp(0 − m) to the sum. Mask them to −∞ (offs_n < N)",
    "no causal mask": "the causal mask is not applied: under CAUSAL a key after the query's own row must not count "
                      "(offs_m[:, None] >= offs_n[None, :])",
    "keys past N, no causal mask": "neither mask is applied: the keys past N (read as zeros, they score 0) and, under "
                                   "CAUSAL, the keys after each query's own row all count",
}


def online_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                   block_n: int) -> dict[str, torch.Tensor]:
    """{slip: the O a tile loop with that slip returns} for query rows q (M, D) and keys k, v (N, D)."""

    def loop(rescale_sum=True, rescale_acc=True, divide=True, factor=scale):
        q64, k64, v64 = q.double(), k.double(), v.double()
        m = torch.full((q.shape[0],), -torch.inf, dtype=torch.float64)
        l = torch.zeros(q.shape[0], dtype=torch.float64)
        acc = torch.zeros(q.shape, dtype=torch.float64)
        for start in range(0, k.shape[0], block_n):
            s = (q64 @ k64[start:start + block_n].T) * factor
            m_new = torch.maximum(m, s.amax(dim=1))
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new[:, None])
            l = (l * alpha if rescale_sum else l) + p.sum(dim=1)
            acc = (acc * alpha[:, None] if rescale_acc else acc) + p @ v64[start:start + block_n]
            m = m_new
        return acc / l[:, None] if divide else acc

    return {"nothing rescaled": loop(rescale_sum=False, rescale_acc=False),
            "sum not rescaled": loop(rescale_sum=False),
            "accumulator not rescaled": loop(rescale_acc=False),
            "not divided": loop(divide=False),
            "not scaled": loop(factor=1.0)}


def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, block_n: int) -> dict[str, torch.Tensor]:
    """{slip: O} for q, k, v (B, H, N, D): the keys of the last tile past N counted as zero rows of K and V, and
    under a causal mask the mask left out (with and without the keys past N)."""
    pad = -k.shape[-2] % block_n

    def unmasked(kk, vv):  # every key counts, those past N included when kk, vv carry the zero rows
        s = (q.double() @ kk.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
        return torch.softmax(s, dim=-1) @ vv.double()

    padded = [torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (k, v)]  # the zero rows a masked load reads
    if not causal:
        return {"keys past N": unmasked(*padded)} if pad else {}
    out = {"no causal mask": unmasked(k, v)}
    if pad:
        out["keys past N, no causal mask"] = unmasked(*padded)
    return out


def matching(yours: torch.Tensor, slips: dict[str, torch.Tensor], *, rtol: float = 1e-5,
             atol: float = 1e-6) -> str | None:
    """The first slip whose O matches yours (elementwise, within rtol/atol), or None."""
    if not isinstance(yours, torch.Tensor):
        return None
    y = yours.detach().to("cpu", torch.float64)
    for name, o in slips.items():
        if tuple(o.shape) == tuple(y.shape) and torch.allclose(y, o.double(), rtol=rtol, atol=atol):
            return name
    return None
