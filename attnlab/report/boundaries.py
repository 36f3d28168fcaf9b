"""What each fusion step removes, predicted from our kernels' data flow (attnlab/triton/*.py): the one place these
formulas live.

    size of S, of P   B·H·N²·itemsize, in the input dtype, full N×N even when causal: the scores kernel writes -inf
                      past the diagonal and both softmax kernels write 0 there.

    S round trip      materialised → qk_softmax
      bytes           S written once + S read by the softmax kernel: once for N ≤ SOFTMAX_ROW_MAX, twice beyond
                      (a longer row is streamed once for its max and sum, once more to write P)
      and             qk_softmax *adds* one QKᵀ pass: it recomputes the scores rather than write S

    P round trip      qk_softmax → fused
      bytes           P written once (full) + P read by the PV kernel: full, or half when causal (PV skips tiles past
                      the diagonal; ½ is the model, the diagonal tiles add N·BLOCK_M/2 elements per head)
      and             the step also *removes* that second QKᵀ pass

    one QKᵀ pass      2·B·H·N²·D FLOPs, halved when causal (the GUIDE's 4·B·H·N²·D forward is QKᵀ + PV)

    time at a ceiling ms = bytes / (TB/s · 1e9);  ms = FLOPs / (TFLOP/s · 1e9)

Not counted: Q, K, V and O traffic (B·H·N·D elements each, the same in both builds of a step, except the second
read of K in qk_softmax's extra pass), launch overheads, and the mask tensor.
"""
from __future__ import annotations

ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
SOFTMAX_ROW_MAX = 16384  # attnlab.triton.launch.SOFTMAX_ROW_MAX (a test keeps the two equal)
BOUNDARIES = {  # boundary → (the build that has it, the build without it), in the order fusion removes them
    "S round trip": ("materialised", "qk_softmax"),
    "P round trip": ("qk_softmax", "fused"),
}
QK_PASSES_REMOVED = {"S round trip": -1, "P round trip": +1}  # QKᵀ passes each step removes (−1: adds one)
STEP_COLUMNS = {  # the leading columns of every per-boundary table (attribution, memory)
    "boundary": "the memory round trip the step removes",
    "from_build": "the build that has the boundary", "to_build": "the build without it",
}


def itemsize(dtype: str) -> int:
    try:
        return ITEMSIZE[str(dtype)]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(ITEMSIZE)}, got {dtype!r}") from None


def nn_bytes(B: int, H: int, N: int, dtype: str) -> int:
    """Bytes of one (B, H, N, N) tensor, S or P, in the input dtype."""
    return B * H * N * N * itemsize(dtype)


def o_bytes(B: int, H: int, N: int, D: int, dtype: str) -> int:
    """Bytes of O, (B, H, N, D) in the input dtype."""
    return B * H * N * D * itemsize(dtype)


def qkvo_bytes(B: int, H: int, Hkv: int, N: int, D: int, dtype: str) -> int:
    """Q read, K and V read (Hkv heads), O written, each once: the traffic every build has and the floors above leave
    out (at FlashAttention's shapes the same at every N, while P's grows as N)."""
    return (2 * B * H + 2 * B * Hkv) * N * D * itemsize(dtype)


def held_saving(boundary: str, B: int, H: int, N: int, D: int, dtype: str) -> int:
    """Peak bytes a step should save: materialised peaks at S + P (it frees S before O exists), qk_softmax at P + O,
    fused at O; so the S step saves S − O and the P step saves P (attnlab.model.hold_bytes, the same three holds)."""
    size = nn_bytes(B, H, N, dtype)
    if boundary == "S round trip":
        return size - o_bytes(B, H, N, D, dtype)
    if boundary == "P round trip":
        return size
    raise ValueError(f"boundary must be one of {', '.join(BOUNDARIES)}, got {boundary!r}")


def boundary_bytes(boundary: str, B: int, H: int, N: int, dtype: str, causal: bool) -> int:
    """Bytes the boundary moves through device memory (written + read), per the module docstring."""
    size = nn_bytes(B, H, N, dtype)
    if boundary == "S round trip":
        return size * (1 + (1 if N <= SOFTMAX_ROW_MAX else 2))
    if boundary == "P round trip":
        return size + (size // 2 if causal else size)  # size is even: itemsize ≥ 2
    raise ValueError(f"boundary must be one of {', '.join(BOUNDARIES)}, got {boundary!r}")


def qk_pass_flops(B: int, H: int, N: int, D: int, causal: bool) -> int:
    """FLOPs of one QKᵀ over every live score: 2·B·H·N²·D, halved when causal."""
    return B * H * N * N * D * (1 if causal else 2)


def ms_at(amount: float, tera_per_s: float) -> float:
    """Milliseconds to move `amount` bytes at TB/s, or to do `amount` FLOPs at TFLOP/s."""
    return amount / (tera_per_s * 1e9)
