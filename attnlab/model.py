"""What a build must do, counted from its name: FLOPs, bytes through device memory, bytes held at once; and the
device's own ceilings, measured, against which achieved rates are stated.

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

A case here is anything with the fields of attnlab.measure.Case (build, B, H, Hkv, N, D, dtype, causal).
"""
from __future__ import annotations

import statistics
import time

import torch

from attnlab import builds
from attnlab.load import LoadLog
from attnlab.report.boundaries import SOFTMAX_ROW_MAX, boundary_bytes, nn_bytes

GiB = 1 << 30


def dtype_of(case) -> torch.dtype:
    """The case's dtype as a torch.dtype (cases may carry the name or the dtype itself)."""
    return case.dtype if isinstance(case.dtype, torch.dtype) else getattr(torch, case.dtype)


def sizes(case) -> dict:
    """E, Pb, qb, ob, kvb of the module docstring, in bytes."""
    E = dtype_of(case).itemsize
    Pb = case.B * case.H * case.N * case.N * E
    qb = case.B * case.H * case.N * case.D * E
    kvb = 2 * case.B * case.Hkv * case.N * case.D * E
    return dict(E=E, Pb=Pb, qb=qb, ob=qb, kvb=kvb)


def flops(case) -> int:
    """4·B·H·N²·D, halved for causal (exact: the product is a multiple of 4)."""
    f = 4 * case.B * case.H * case.N * case.N * case.D
    return f // 2 if case.causal else f


def bytes_moved(case) -> int:
    """The fewest bytes the case's build must move through device memory (module docstring)."""
    b = builds.get(case.build)
    s = sizes(case)
    moved = s["qb"] + s["kvb"] + s["ob"]
    # The S and P round trips come from the one place their formulas live (attnlab.report.boundaries), so the
    # rates in a row and the attribution tables count the same bytes.
    shape = (case.B, case.H, case.N, str(dtype_of(case)).removeprefix("torch."), bool(case.causal))
    if b.holds in ("P", "S+P"):
        moved += boundary_bytes("P round trip", *shape)  # P written in full, read (lower triangle if causal)
    if b.holds == "S+P":
        moved += boundary_bytes("S round trip", *shape)  # S written, read back by the softmax
        if b.ablation == "no_softmax" and case.N > SOFTMAX_ROW_MAX:
            moved -= nn_bytes(*shape[:4])  # the copy needs no statistics pass: a long row is read once, not twice
    if b.ablation == "no_pv":
        moved -= s["kvb"] // 2  # V never read
    elif b.ablation == "zero_mask":
        moved += case.N * case.N * s["E"]  # the (N, N) additive mask, read once
    return moved


def hold_bytes(case) -> int:
    """The bytes the build must hold at once for its name: the floor its peak allocation must reach."""
    s = sizes(case)
    return {"S+P": 2 * s["Pb"], "P": s["Pb"] + s["ob"], "none": s["ob"]}[builds.get(case.build).holds]


# -- ceilings -----------------------------------------------------------------------------------------------------

def _cpu_median_ms(fn, reps: int = 5) -> float:
    fn()  # warm-up: first-touch page faults and thread-pool start are not the rate
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _cuda_median_ms(fn) -> float:
    import triton.testing

    # A long warm-up: an idle GPU's SM clock starts low (345 MHz on an H200) and a ceiling must be the ramped rate.
    return statistics.median(triton.testing.do_bench(fn, warmup=200, rep=200, return_mode="all"))


def measure_ceilings(device, dtype) -> dict:
    """The device's own copy bandwidth and matmul rate, measured now, never a datasheet constant.

    Bandwidth: one large device-to-device copy, counting bytes read plus bytes written (2 × size), so that a
    kernel's bytes_moved / time compares with it directly. Matmul: a square product in the run's dtype (fp32 with
    torch's default, i.e. no TF32). On CUDA the copy is 1 GiB (far past any L2) and the product 8192³, timed by
    do_bench; on CPU small versions (32 MiB, 512³, perf_counter medians) keep it under a couple of seconds.
    copy_mhz and matmul_mhz: the median SM clock while each was timed (attnlab.load; None without a GPU), since a
    card at its power limit runs each workload at a clock of its own.
    """
    device = torch.device(device)
    dt = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
    cuda = device.type == "cuda"
    copy_bytes = GiB if cuda else 32 << 20
    n = 8192 if cuda else 512
    src = torch.randn(copy_bytes // 4, device=device)  # random, not zeros: nothing gets to compress or skip
    dst = torch.empty_like(src)
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    timer = _cuda_median_ms if cuda else _cpu_median_ms
    with LoadLog(device) as log:  # the clock each was measured at: a build drawing more power runs at a lower one
        t0 = time.time()
        copy_ms = timer(lambda: dst.copy_(src))
        t1 = time.time()
        mm_ms = timer(lambda: torch.mm(a, b))
        t2 = time.time()
        clocks = dict(copy_mhz=log.window(t0, t1)["sm_clock_mhz"], matmul_mhz=log.window(t1, t2)["sm_clock_mhz"])
    clocks = {k: v if v == v else None for k, v in clocks.items()}  # None, not NaN: provenance.json stays JSON
    del src, dst, a, b
    if cuda:
        torch.cuda.empty_cache()
    return dict(
        tbps=2 * copy_bytes / (copy_ms * 1e-3) / 1e12,
        tflops=2 * n**3 / (mm_ms * 1e-3) / 1e12,
        copy_bytes=copy_bytes,
        matmul_n=n,
        dtype=str(dt).removeprefix("torch."),
        device=str(device),
        timer="do_bench" if cuda else "perf_counter",
        **clocks,
    )
