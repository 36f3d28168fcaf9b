"""What a build must do, counted from its name: FLOPs, bytes through device memory, bytes held at once, and what each
fusion step removes. Pure arithmetic on shapes (no torch): the device's measured ceilings are attnlab.ceilings.

Sizes of one case (E = bytes per element of the case's dtype):

    Pb  = B·H·N²·E          one (B, H, N, N) tensor: S or P
    qb  = ob = B·H·N·D·E    Q, and O
    kvb = 2·B·Hkv·N·D·E     K and V (grouped-query attention reads Hkv heads, not H)

Bytes moved (the fewest a build of that kind must move through device memory; caches may do better for small
cases, never for large ones):

    O only (holds "none": fused, sdpa_flash/efficient/cudnn/default, flex)   qb + kvb + ob
        Q, K, V read once, O written once; S and P never leave the chip.
    P      (holds "P": qk_softmax)                                            + Pb + Pb·(½ if causal else 1)
        P written in full (our kernel writes the masked zeros too), then read by the PV kernel, which skips the
        upper triangle when causal.
    S+P    (holds "S+P": materialised, torch_eager, sdpa_math)                + 2·Pb on top of "P"
        S written and read back in full by the softmax (read twice past N = 16384, where our softmax kernel
        streams a row in two passes; counted so for the library rows too).

Ablations change exactly the stage they remove: no_pv drops V's read (half of kvb), zero_mask adds one (N, N)
mask read (N²·E), no_softmax moves what its base moves.

Bytes held at once (the floor on peak allocation; a build allocating less is not what its name says):

    "S+P" → 2·Pb (S and P live together while the softmax runs; O comes after S is freed, and P + O ≤ S + P)
    "P"   → Pb + ob (P lives until the PV kernel has written O)
    "none"→ ob

FLOPs: 4·B·H·N²·D (two N×N×D products, 2 FLOPs per multiply-add), halved for causal: the count FlashAttention,
Triton's tutorial and attention-gym use, so achieved TFLOP/s compare across them. Softmax FLOPs are not counted.
A case of a backward pass (its `pass_`, 'forward' where it has none) counts five such products (QKᵀ recomputed, dV,
dP, dQ, dK: 2.5× the forward, FlashAttention's count), forward+backward seven.

Training (the backward pass, attnlab.builds.training). What a build saves for its backward, alive from the forward's
end to the backward's (inputs and O excluded: the caller holds them anyway):

    "S+P", "P" builds   P (Pb): materialised and qk_softmax keep the probabilities, torch's eager autograd and
                        sdpa_math keep softmax's output
    "none" builds       the row statistics: a logsumexp per query row, B·H·N float32 (4 bytes)

Backward FLOPs a build does (backward_flops), halved for causal: the four N×N×D products (dV = PᵀdO, dP = dO·Vᵀ,
dQ = dS·K, dK = dSᵀQ), 8·B·H·N²·D; a build that saved no P recomputes S = QKᵀ first, one more product: 10·B·H·N²·D,
2.5× the forward's 4. A row's rate divides flops() instead, five products for every build, so rates compare. Backward bytes
through device memory, beyond Q, K, V, O, dO read and dQ, dK, dV written once each (4·qb + 2·kvb):

    materialised   P read for dV, dP written and read, P read again for dS, dS written, dS read for dQ and for dK: 7·Pb
    qk_softmax     dS in one kernel from P, dO and V (dP never written): P read twice, dS written, read twice: 5·Pb
    fused          none: P is recomputed tile by tile from Q, K and the logsumexp, and never stored

The recompute trade: fused spends recompute_flops (one QKᵀ pass) to never move the P a P-keeping build stores once and
reads twice (kept_p_bytes, 3·Pb). Per score that is 2·D FLOPs (D when causal, half the scores live) against 3·E
bytes: at a card's ridge R = matmul rate / copy bandwidth, moving P takes 1.5·E·R/D times as long as recomputing it
(twice that when causal), the same at every N.

A case here is anything with the fields of attnlab.measure.Case (build, B, H, Hkv, N, D, dtype, causal). What a build
must hold comes from its name alone (HOLDS): the model sits below the builds, which take their `holds` from here.

What each fusion step removes, predicted from our kernels' data flow (attnlab/triton/*.py):

    size of S, of P   B·H·N²·itemsize, in the input dtype, full N×N even when causal: the scores kernel writes -inf
                      past the diagonal and both softmax kernels write 0 there.

    S round trip      materialised → qk_softmax
      bytes           S written once + S read by the softmax kernel: once for N ≤ SOFTMAX_ROW_MAX, twice beyond
                      (a longer row is streamed once for its max and sum, once more to write P)
      and             qk_softmax *adds* one QKᵀ pass where it runs two: it recomputes the scores rather than write
                      S (none where a row fits on chip and one pass writes P: its row's tiles say one_pass)

    P round trip      qk_softmax → fused
      bytes           P written once (full) + P read by the PV kernel: full, or half when causal (PV skips tiles past
                      the diagonal; ½ is the model, the diagonal tiles add N·BLOCK_M/2 elements per head)
      and             the step also *removes* that second QKᵀ pass

    one QKᵀ pass      2·B·H·N²·D FLOPs, halved when causal (the usual 4·B·H·N²·D forward count is QKᵀ + PV)

    time at a ceiling ms = bytes / (TB/s · 1e9);  ms = FLOPs / (TFLOP/s · 1e9)

Not counted: Q, K, V and O traffic (B·H·N·D elements each, the same in both builds of a step, except the second
read of K in qk_softmax's extra pass), launch overheads, and the mask tensor.
"""
from __future__ import annotations

GiB = 1 << 30
SOFTMAX_ROW_MAX = 16384  # rows up to this length are read once by the softmax kernel; longer ones twice
# The (B, H, N, N) tensors each base build must hold at once in device memory (attnlab.builds takes them from here).
HOLDS = {"materialised": "S+P", "qk_softmax": "P", "fused": "none",
         "torch_eager": "S+P", "sdpa_default": "none", "sdpa_flash": "none", "sdpa_efficient": "none",
         "sdpa_cudnn": "none", "sdpa_math": "S+P", "flex": "none"}


def holds(build: str) -> str:
    """'S+P', 'P' or 'none' for a build name ('<base>-<ablation>' holds what its base holds)."""
    try:
        return HOLDS[build.split("-", 1)[0]]
    except KeyError:
        raise ValueError(f"build must be one of {', '.join(HOLDS)} (or '<build>-<ablation>'); got {build!r}") from None


def ablation(build: str) -> str | None:
    """The ablation in a build name '<base>-<ablation>', or None."""
    return build.split("-", 1)[1] if "-" in build else None


# -- boundaries: what each fusion step removes (module docstring) ------------------------------------------------

ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
BOUNDARIES = {  # boundary → (the build that has it, the build without it), in the order fusion removes them
    "S round trip": ("materialised", "qk_softmax"),
    "P round trip": ("qk_softmax", "fused"),
}
# QKᵀ passes each step removes where qk_softmax runs two passes (−1: adds one); where it runs one, neither step
# changes the QKᵀ work (the qk_softmax row's recorded tiles say which: one_pass)
QK_PASSES_REMOVED = {"S round trip": -1, "P round trip": +1}


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
    fused at O; so the S step saves S − O and the P step saves P (hold_bytes, the same three holds)."""
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


# -- one case ------------------------------------------------------------------------------------------------------

def dtype_name(case) -> str:
    """The case's dtype by name, 'bfloat16' (cases may carry the name or a torch.dtype)."""
    return str(case.dtype).removeprefix("torch.")


def sizes(case) -> dict:
    """E, Pb, qb, ob, kvb of the module docstring, in bytes."""
    E = itemsize(dtype_name(case))
    Pb = case.B * case.H * case.N * case.N * E
    qb = case.B * case.H * case.N * case.D * E
    kvb = 2 * case.B * case.Hkv * case.N * case.D * E
    return dict(E=E, Pb=Pb, qb=qb, ob=qb, kvb=kvb)


# N×N×D products of each pass (module docstring)
PRODUCTS = {"forward": 2, "backward": 5, "forward+backward": 7}


def flops(case) -> int:
    """2·B·H·N²·D per N×N×D product of the case's pass (4·B·H·N²·D for the forward), halved for causal (exact: the
    product is a multiple of 2)."""
    f = 2 * PRODUCTS[getattr(case, "pass_", "forward")] * case.B * case.H * case.N * case.N * case.D
    return f // 2 if case.causal else f


def bytes_moved(case) -> int:
    """The fewest bytes the case's build must move through device memory (module docstring)."""
    held, ab = holds(case.build), ablation(case.build)
    s = sizes(case)
    moved = s["qb"] + s["kvb"] + s["ob"]
    # The S and P round trips come from boundary_bytes, so the rates in a row and the attribution tables count the
    # same bytes.
    shape = (case.B, case.H, case.N, dtype_name(case), bool(case.causal))
    if held in ("P", "S+P"):
        moved += boundary_bytes("P round trip", *shape)  # P written in full, read (lower triangle if causal)
    if held == "S+P":
        moved += boundary_bytes("S round trip", *shape)  # S written, read back by the softmax
        if ab == "no_softmax" and case.N > SOFTMAX_ROW_MAX:
            moved -= nn_bytes(*shape[:4])  # the copy needs no statistics pass: a long row is read once, not twice
    if ab == "no_pv":
        moved -= s["kvb"] // 2  # V never read
    elif ab == "zero_mask":
        moved += case.N * case.N * s["E"]  # the (N, N) additive mask, read once
    return moved


def hold_bytes(case) -> int:
    """The bytes the build must hold at once for its name: the floor its peak allocation must reach."""
    s = sizes(case)
    return {"S+P": 2 * s["Pb"], "P": s["Pb"] + s["ob"], "none": s["ob"]}[holds(case.build)]


# -- training: what the backward saves, moves and computes (module docstring) ---------------------------------------

LSE_ITEMSIZE = 4  # the logsumexp a "none" build keeps per query row is float32 whatever the inputs' dtype
BACKWARD_NN = {"materialised": 7, "qk_softmax": 5}  # (B, H, N, N) tensors' worth of bytes each backward moves


def saved_bytes(case) -> int:
    """Bytes the case's build keeps for its backward beyond its inputs and O: P, or a float32 logsumexp a row."""
    if holds(case.build) == "none":
        return case.B * case.H * case.N * LSE_ITEMSIZE
    return sizes(case)["Pb"]


def backward_flops(case) -> int:
    """8·B·H·N²·D (four products), 10·B·H·N²·D where no P was saved (S recomputed first); halved for causal."""
    f = (10 if holds(case.build) == "none" else 8) * case.B * case.H * case.N * case.N * case.D
    return f // 2 if case.causal else f


def recompute_flops(case) -> int:
    """FLOPs a build that saved no P spends recomputing S in its backward (one QKᵀ pass); 0 for the others."""
    return qk_pass_flops(case.B, case.H, case.N, case.D, bool(case.causal)) if holds(case.build) == "none" else 0


def kept_p_bytes(case) -> int:
    """The bytes of P that a build keeping it for its backward moves, and one that recomputes it never does: written
    once by the forward, read twice by the backward (dV = Pᵀ dO, then dS = P ∘ (dP − Δ)): 3·Pb, the full N × N as our
    kernels write and read it, causal or not. Set against recompute_flops, this is training's recompute trade."""
    return 3 * sizes(case)["Pb"]


def backward_bytes(case) -> int:
    """The fewest bytes the backward of the case's build moves through device memory (module docstring): Q, K, V,
    O, dO read and dQ, dK, dV written once each, plus its (N, N) traffic; the library's P-keeping builds counted as
    materialised."""
    s = sizes(case)
    nn = 0 if holds(case.build) == "none" else BACKWARD_NN.get(case.build.split("-", 1)[0], BACKWARD_NN["materialised"])
    return 4 * s["qb"] + 2 * s["kvb"] + nn * s["Pb"]
