"""The benchmark's pure parts: the qk_softmax floor, the shapes it runs, the ratio table (the timing needs a GPU)."""
import pandas as pd
import pytest
import torch

from attnlab import bench


def test_qk_softmax_floor_is_p_round_trip_plus_one_qk_pass():
    ceil = dict(tbps=4.0, tflops=500.0)
    B, H, N, D = 4, 16, 4096, 128
    p = B * H * N * N * 2  # bf16 P
    qk = 2 * B * H * N * N * D
    assert bench.qk_softmax_floor_ms(B, H, N, D, torch.bfloat16, False, ceil) == pytest.approx(
        (2 * p / 4e12 + qk / 500e12) * 1e3)
    # causal: P written in full, read in its lower half; half the QKᵀ
    assert bench.qk_softmax_floor_ms(B, H, N, D, torch.bfloat16, True, ceil) == pytest.approx(
        (1.5 * p / 4e12 + qk / 2 / 500e12) * 1e3)


def test_shapes_follow_flashattention_convention_plus_untuned_ones():
    s = bench.shapes([torch.bfloat16], [512, 16384])
    assert (32, 32, 512, 64, torch.bfloat16, False) in s and (1, 16, 16384, 128, torch.bfloat16, True) in s
    assert all(B * N == 16384 and H * D == 2048 for B, H, N, D, _, _ in s if N != 3000 and H != 64)
    assert (1, 64, 8192, 128, torch.bfloat16, False) in s and any(N == 3000 for _, _, N, _, _, _ in s)
    assert not any(N == 3000 for _, _, N, _, _, _ in bench.shapes([torch.bfloat16], [512], quick=True))


def test_ratios_are_library_time_over_ours():
    rows = [dict(build=b, dtype="bfloat16", D=64, causal=False, N=1024, B=16, H=32, ms=ms, tflops=100 / ms)
            for b, ms in (("fused", 1.0), ("sdpa_flash", 1.3), ("sdpa_cudnn", 0.8), ("flex", 1.1))]
    rows.append(dict(build="qk_softmax", dtype="bfloat16", D=64, causal=False, N=1024, B=16, H=32, ms=3.0,
                     tflops=33.3, floor_ms=2.0))
    r = bench.ratios(pd.DataFrame(rows)).iloc[0]
    assert r["fused_vs_sdpa_flash"] == pytest.approx(1.3)
    assert r["fused_vs_sdpa_cudnn"] == pytest.approx(0.8)
    assert r["qk_softmax_over_floor"] == pytest.approx(1.5)
