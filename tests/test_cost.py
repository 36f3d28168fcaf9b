"""The FLOP, byte and hold model against hand-computed numbers, and the ceilings measured on this machine."""
import math

import pytest
import torch

from attnlab import builds, cost
from attnlab.ceilings import measure_ceilings
from attnlab.measure import Case

# B=1, H=2, N=64, D=32, fp32: Pb = 1·2·64·64·4 = 32768; qb = ob = 1·2·64·32·4 = 16384; kvb = 2·16384 = 32768
PB, QB, KVB = 32768, 16384, 32768
IO = QB + KVB + QB  # Q, K, V read once, O written once


def case(build, causal=False, **kw):
    shape = dict(B=1, H=2, Hkv=2, N=64, D=32, dtype="float32")
    shape.update(kw)
    return Case(build, causal=causal, **shape)


def test_flops_is_4_B_H_N2_D_halved_for_causal():
    assert cost.flops(case("fused")) == 4 * 1 * 2 * 64 * 64 * 32
    assert cost.flops(case("fused", causal=True)) == 2 * 1 * 2 * 64 * 64 * 32
    assert cost.flops(case("materialised", B=3, H=4, Hkv=1)) == 4 * 3 * 4 * 64 * 64 * 32


@pytest.mark.parametrize("build, causal, expected", [
    ("fused", False, IO),
    ("fused", True, IO),  # causal skips work, not reads of Q, K, V
    ("qk_softmax", False, IO + PB + PB),  # P written, P read
    ("qk_softmax", True, IO + PB + PB // 2),  # P written in full, lower triangle read
    ("materialised", False, IO + 2 * PB + 2 * PB),  # + S written and read
    ("materialised", True, IO + PB + PB // 2 + 2 * PB),
    ("fused-no_pv", False, IO - KVB // 2),  # V never read
    ("qk_softmax-no_pv", True, IO + PB + PB // 2 - KVB // 2),
    ("fused-zero_mask", False, IO + 64 * 64 * 4),  # the (N, N) mask read once
    ("materialised-zero_mask", False, IO + 4 * PB + 64 * 64 * 4),
    ("fused-no_softmax", False, IO),  # same bytes as its base
    ("qk_softmax-no_softmax", False, IO + 2 * PB),
    # library rows follow what they hold
    ("torch_eager", False, IO + 4 * PB), ("sdpa_math", True, IO + PB + PB // 2 + 2 * PB),
    ("sdpa_flash", False, IO), ("sdpa_default", False, IO), ("flex", True, IO),
])
def test_bytes_moved_matches_the_hand_count(build, causal, expected):
    assert cost.bytes_moved(case(build, causal)) == expected


def test_bytes_use_kv_heads_and_the_dtype_size():
    gqa = case("fused", Hkv=1)  # one k/v head for two query heads: K and V are half as big
    assert cost.bytes_moved(gqa) == QB + KVB // 2 + QB
    half = case("qk_softmax", dtype=torch.bfloat16)  # a torch.dtype is accepted too
    assert cost.bytes_moved(half) == (IO + 2 * PB) // 2


def test_each_fusion_step_moves_and_holds_less():
    for n in (64, 1000, 4096):
        for causal in (False, True):
            moved = [cost.bytes_moved(case(b, causal, N=n)) for b in builds.OURS]
            held = [cost.hold_bytes(case(b, causal, N=n)) for b in builds.OURS]
            assert moved[0] > moved[1] > moved[2] and held[0] > held[1] > held[2]


@pytest.mark.parametrize("build, expected", [
    ("materialised", 2 * PB), ("torch_eager", 2 * PB), ("sdpa_math", 2 * PB), ("materialised-no_pv", 2 * PB),
    ("qk_softmax", PB + QB), ("qk_softmax-zero_mask", PB + QB),
    ("fused", QB), ("sdpa_flash", QB), ("flex", QB), ("fused-no_softmax", QB),
])
def test_hold_bytes_by_what_the_build_holds(build, expected):
    assert cost.hold_bytes(case(build)) == expected


def test_unknown_build_is_refused():
    with pytest.raises(ValueError, match="build must be one of"):
        cost.bytes_moved(case("nope"))


def test_cpu_ceilings_are_measured_positive_rates():
    c = measure_ceilings("cpu", "float32")
    assert c["timer"] == "perf_counter" and c["device"] == "cpu" and c["dtype"] == "float32"
    assert math.isfinite(c["tbps"]) and c["tbps"] > 0
    assert math.isfinite(c["tflops"]) and c["tflops"] > 0
    b = measure_ceilings("cpu", torch.bfloat16)
    assert b["dtype"] == "bfloat16" and b["tflops"] > 0
    assert c["copy_mhz"] is None and c["matmul_mhz"] is None  # no GPU clock to sample here (None: JSON has no NaN)


def test_a_copy_softmax_reads_a_long_row_once():
    """Past SOFTMAX_ROW_MAX the softmax streams S twice (statistics, then P); its copy ablation needs one read."""
    from attnlab.cost import SOFTMAX_ROW_MAX

    N = SOFTMAX_ROW_MAX * 2
    base = Case("materialised", 1, 1, 1, N, 16, "bfloat16")
    copy = Case("materialised-no_softmax", 1, 1, 1, N, 16, "bfloat16")
    assert cost.bytes_moved(base) - cost.bytes_moved(copy) == N * N * 2
    short = SOFTMAX_ROW_MAX
    assert cost.bytes_moved(Case("materialised", 1, 1, 1, short, 16, "bfloat16")) == \
        cost.bytes_moved(Case("materialised-no_softmax", 1, 1, 1, short, 16, "bfloat16"))


def test_training_counts_what_each_build_saves_recomputes_and_moves():
    from attnlab import cost
    from attnlab.measure import Case

    B, H, Hkv, N, D = 2, 8, 2, 1024, 64
    case = {b: Case(b, B, H, Hkv, N, D, "bfloat16", False) for b in ("materialised", "qk_softmax", "fused", "sdpa_flash")}
    P = B * H * N * N * 2
    assert cost.saved_bytes(case["materialised"]) == cost.saved_bytes(case["qk_softmax"]) == P
    assert cost.saved_bytes(case["fused"]) == cost.saved_bytes(case["sdpa_flash"]) == B * H * N * 4  # fp32 rows
    fwd = cost.flops(case["fused"])
    assert cost.backward_flops(case["fused"]) == 2.5 * fwd and cost.backward_flops(case["materialised"]) == 2 * fwd
    assert cost.recompute_flops(case["fused"]) == fwd // 2 and cost.recompute_flops(case["qk_softmax"]) == 0
    causal = Case("fused", B, H, Hkv, N, D, "bfloat16", True)
    assert cost.backward_flops(causal) == cost.backward_flops(case["fused"]) // 2
    io = 4 * B * H * N * D * 2 + 2 * 2 * B * Hkv * N * D * 2
    assert cost.backward_bytes(case["fused"]) == io
    assert cost.backward_bytes(case["qk_softmax"]) == io + 5 * P
    assert cost.backward_bytes(case["materialised"]) == io + 7 * P
