"""scripts/fused_vs_libraries.py: issue 5's ratios from a sweep's rows, net of the consumption step."""
import importlib.util
import math
from pathlib import Path

import pytest

from tests.test_report_groups import frame, row

spec = importlib.util.spec_from_file_location(
    "fused_vs_libraries", Path(__file__).resolve().parent.parent / "scripts" / "fused_vs_libraries.py")
fvl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fvl)


def test_ratios_are_library_over_ours_net_of_consumption_and_qk_softmax_is_set_against_its_floor():
    consume = 0.1
    df = frame(row("fused", 1.1, consume_ms=consume, flops=2e9), row("sdpa_flash", 1.6, consume_ms=consume),
               row("sdpa_cudnn", 0.9, consume_ms=consume), row("qk_softmax", 4.1, consume_ms=consume),
               row("fused", 2.1, consume_ms=consume, flops=4e9, causal=True),
               row("sdpa_cudnn", 1.1, consume_ms=consume, causal=True))
    t = fvl.table(df)
    nc = t[~t.causal].iloc[0]
    assert nc.fused_ms == pytest.approx(1.0) and nc.fused_TFs == pytest.approx(2.0)
    assert nc.vs_sdpa_flash == pytest.approx(1.5) and nc.vs_sdpa_cudnn == pytest.approx(0.8)
    # B=1 H=8 N=1000 D=64 fp16: P = 8e6 elements · 2 bytes, written and read, at 0.02 TB/s; QKᵀ 2·8·1000²·64 FLOPs
    # at 10 TF/s
    floor = 2 * 8 * 1000 * 1000 * 2 / 0.02e9 + 2 * 8 * 1000 * 1000 * 64 / 10e9
    assert nc.qk_softmax_over_floor == pytest.approx(4.0 / floor)
    c = t[t.causal].iloc[0]
    assert c.vs_sdpa_cudnn == pytest.approx(0.5) and math.isnan(c.vs_sdpa_flash) and math.isnan(c.qk_softmax_over_floor)


def test_causal_floor_reads_half_of_p_and_grouped_query_rows_stay_apart_and_a_group_without_libraries_is_kept():
    consume = 0.1
    df = frame(row("fused", 1.1, consume_ms=consume, flops=2e9, causal=True),
               row("qk_softmax", 2.1, consume_ms=consume, causal=True),
               row("fused", 2.1, consume_ms=consume, flops=2e9, causal=True, Hkv=2),
               row("sdpa_cudnn", 1.1, consume_ms=consume, causal=True, Hkv=2),
               row("fused", 3.1, consume_ms=consume, flops=2e9, dtype="bfloat16"))
    t = fvl.table(df)
    mha = t[(t.causal) & (t.Hkv == 8)].iloc[0]
    gqa = t[(t.causal) & (t.Hkv == 2)].iloc[0]
    assert mha.fused_ms == pytest.approx(1.0) and gqa.fused_ms == pytest.approx(2.0)
    assert math.isnan(mha.vs_sdpa_cudnn) and gqa.vs_sdpa_cudnn == pytest.approx(0.5)
    # causal: P written in full (the zeros past the diagonal too), read in its lower half only; QKᵀ for the lower half
    n2 = 8 * 1000 * 1000
    floor = (n2 * 2 + n2 // 2 * 2) / 0.02e9 + n2 * 64 / 10e9
    assert mha.qk_softmax_over_floor == pytest.approx(2.0 / floor, rel=2e-3)
    alone = t[t.dtype == "bfloat16"].iloc[0]
    assert alone.fused_ms == pytest.approx(3.0) and math.isnan(alone.vs_sdpa_cudnn)
