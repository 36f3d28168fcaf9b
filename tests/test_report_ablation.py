"""ablation_table and causal_saving on synthetic rows: times are binary fractions so every difference is exact."""
import math

import pytest

from attnlab import report
from attnlab.report import ablation
from tests.test_report_groups import frame, row


def fused_family(base_ms, no_softmax, no_pv, zero_mask, base="fused", **kw):
    return [row(base, base_ms, **kw), row(f"{base}-no_softmax", no_softmax, **kw),
            row(f"{base}-no_pv", no_pv, **kw), row(f"{base}-zero_mask", zero_mask, **kw)]


def test_savings_mask_cost_and_the_dominant_stage_per_shape():
    df = frame(*fused_family(2.0, 1.75, 1.25, 2.125, N=1000),  # PV saves 0.75, softmax 0.25
               *fused_family(4.0, 2.5, 3.5, 4.5, N=2000),  # softmax saves 1.5, PV 0.5
               *fused_family(8.0, 1.0, 1.0, 8.0, N=3000, base="qk_softmax"))  # another base: not in this table
    t = report.ablation_table(df, base="fused")
    assert list(t.columns) == [*"dtype causal D N B H Hkv".split(), *ablation.COLUMNS]
    assert list(t["N"]) == [1000, 2000, 3000]
    a, b, c = t.to_dict("records")
    assert (a["base_ms"], a["no_softmax_ms"], a["no_pv_ms"], a["zero_mask_ms"]) == (2.0, 1.75, 1.25, 2.125)
    assert (a["softmax_saving_ms"], a["pv_saving_ms"], a["mask_cost_ms"]) == (0.25, 0.75, 0.125)
    assert (a["dominant"], a["note"]) == ("pv", "")
    assert (b["softmax_saving_ms"], b["pv_saving_ms"], b["mask_cost_ms"]) == (1.5, 0.5, 0.5)
    assert (b["dominant"], b["note"]) == ("softmax", "")
    assert c["dominant"] == "" and math.isnan(c["base_ms"])
    assert c["note"].startswith("fused not measured at B=1 H=8 N=3000 D=64; fused-no_softmax not measured")


def test_each_of_our_builds_can_be_the_base():
    df = frame(*fused_family(2.0, 1.75, 1.25, 2.125), *fused_family(6.0, 3.0, 5.0, 6.5, base="qk_softmax"))
    t = report.ablation_table(df, base="qk_softmax")
    assert t.iloc[0][["base", "softmax_saving_ms", "pv_saving_ms", "mask_cost_ms", "dominant"]].tolist() == \
        ["qk_softmax", 3.0, 1.0, 0.5, "softmax"]
    with pytest.raises(ValueError, match="base must be one of materialised, qk_softmax, fused, got 'sdpa_flash'"):
        report.ablation_table(df, base="sdpa_flash")


def test_a_missing_ablation_leaves_dominance_unknown():
    rows = fused_family(2.0, 1.75, 1.25, 2.125)
    rows[2] = row("fused-no_pv", math.nan, status="error: launch failed")
    t = report.ablation_table(frame(*rows))
    assert t.iloc[0]["softmax_saving_ms"] == 0.25 and math.isnan(t.iloc[0]["pv_saving_ms"])
    assert t.iloc[0]["dominant"] == ""
    assert t.iloc[0]["note"] == ("fused-no_pv error: launch failed at B=1 H=8 N=1000 D=64; "
                                 "dominant unknown: an ablation or the base is missing")


def test_ties_and_no_saving_name_no_dominant_stage():
    t = report.ablation_table(frame(*fused_family(2.0, 1.5, 1.5, 2.0, N=1000),
                                    *fused_family(2.0, 2.0, 2.25, 2.0, N=2000)))
    assert t["dominant"].tolist() == ["", ""]
    assert t["note"][0].startswith("tie between softmax and pv: their savings differ by 0 ms")
    assert "no ablation saves time" in t["note"][1] and "no_pv ran 0.25 ms slower than fused" in t["note"][1]


def test_causal_saving_is_a_difference_with_its_meaning_never_a_ratio():
    df = frame(row("fused", 2.0), row("fused", 1.25, causal=True),
               row("fused", 8.0, N=2000), row("materialised", 3.0, causal=True))
    t = report.causal_saving(df, "fused")
    assert list(t.columns) == ["dtype", "D", "N", "B", "H", "Hkv", "build", "noncausal_ms", "causal_ms", "saved_ms",
                               "measures", "note"]
    a, b = t.to_dict("records")
    assert (a["noncausal_ms"], a["causal_ms"], a["saved_ms"], a["note"]) == (2.0, 1.25, 0.75, "")
    assert a["measures"] == ablation.CAUSAL_MEASURES["fused"]
    assert math.isnan(b["saved_ms"]) and b["note"] == "causal fused not measured at B=1 H=8 N=2000 D=64"
    assert report.causal_saving(df, "materialised").iloc[0]["measures"].endswith("still reads all of S")
    with pytest.raises(ValueError, match=r"one dtype, got \['bfloat16', 'float16'\]"):
        report.causal_saving(frame(row("fused"), row("fused", dtype="bfloat16", causal=True)))


def test_a_slower_ablation_is_explained_not_hidden():
    """On the H200 the materialised no_pv stand-in (a row reduction) ran slower than the tensor-core PV it replaced."""
    from attnlab.report import ablation_table
    from tests.test_report_groups import frame, row

    t = ablation_table(frame(row("materialised", 2.0), row("materialised-no_softmax", 1.5),
                             row("materialised-no_pv", 2.2), row("materialised-zero_mask", 2.1)), base="materialised")
    assert t.loc[0, "pv_saving_ms"] == pytest.approx(-0.2)
    assert t.loc[0, "dominant"] == "softmax"
    # base − ablation is the stage less its stand-in: −0.2 ms says the PV costs at least 0.2 ms less than the
    # stand-in, and bounds the PV's own cost from neither side otherwise
    note = t.loc[0, "note"]
    assert "no_pv ran 0.2 ms slower than materialised" in note
    assert "the pv costs at least 0.2 ms less than the stand-in" in note
    assert "does not bound" in note and "at most" not in note


def test_an_ablation_with_other_tiles_is_noted():
    """The difference between an ablation and its base is a stage only if both ran the same kernel configuration."""
    from attnlab.report import ablation_table
    from tests.test_report_groups import frame, row

    same, other = '{"fused": {"BLOCK_M": 128}}', '{"fused": {"BLOCK_M": 64}}'
    t = ablation_table(frame(row("fused", 2.0, tiles=same), row("fused-no_softmax", 1.5, tiles=same),
                             row("fused-no_pv", 1.8, tiles=same), row("fused-zero_mask", 2.4, tiles=other)))
    note = t.loc[0, "note"]
    assert "fused-zero_mask ran other tiles than fused" in note
    assert "no_softmax ran other" not in note and "no_pv ran other" not in note


def test_savings_within_the_noise_name_no_dominant_stage():
    """A saving below REPEAT_SHARE of the base, or below a row's p20–p80 spread, is not evidence; nor are two
    savings closer than that (the H200's materialised build: 0.11 ms of 19.6 ms)."""
    small = fused_family(16.0, 15.875, 15.9375, 16.5, N=1000)  # saves 0.125 and 0.0625 < 2 % of 16 = 0.32
    close = fused_family(16.0, 14.0, 14.25, 16.5, N=2000)  # 2.0 vs 1.75: apart by 0.25 < 0.32
    wide = fused_family(16.0, 14.0, 15.0, 16.5, N=3000)  # 2.0 vs 1.0, but the base's p20–p80 spans 1.5 ms
    wide[0].update(ms_p20=15.0, ms_p80=16.5)
    clear = fused_family(16.0, 14.0, 15.0, 16.5, N=4000)  # 2.0 vs 1.0, apart by 1.0 > 0.32
    t = report.ablation_table(frame(*small, *close, *wide, *clear))
    assert t["dominant"].tolist() == ["", "", "", "softmax"]
    assert t["noise_ms"].tolist() == [0.32, 0.32, 1.5, 0.32]
    assert t["note"][0].startswith("no stage dominates measurably: the largest saving (softmax, 0.125 ms) is within")
    assert t["note"][1].startswith("tie between softmax and pv: their savings differ by 0.25 ms, within the noise")
    assert t["note"][2].startswith("tie between softmax and pv: their savings differ by 1 ms, within the noise (1.5")


def test_an_ablation_too_fast_to_be_one_stage_is_flagged():
    """The unconsumed-ablation lie: a variant whose work was dropped runs in a sliver of its base's time."""
    t = report.ablation_table(frame(*fused_family(2.0, 0.25, 1.5, 2.125)))
    assert "fused-no_softmax ran in 12% of fused's time" in t["note"][0] and "consumed" in t["note"][0]
    assert "no_pv ran in" not in t["note"][0]


def test_the_tables_ablations_are_the_build_tables():
    from attnlab import builds

    assert ablation.VARIANTS == tuple(builds.ABLATIONS) and ablation.OURS == builds.OURS


def test_stage_savings_name_the_kernel_that_runs_each_stage_and_its_kind():
    """fused runs both stages in one kernel, Gluon here; qk_softmax's PV has a kernel of its own; a row without tiles
    says ''. PV's FLOPs are one of fused's two N×N×D products: half its count."""
    from attnlab import cost
    from attnlab.measure import Case

    flops = cost.flops(Case("fused", 1, 8, 8, 1000, 64, "float16", False, "cuda:0"))
    g = '{"fused": {"gluon": true}}'
    t = ablation.stage_savings(frame(*(row(b, ms, tiles=g, flops=flops) for b, ms in
                                       (("fused", 2.0), ("fused-no_softmax", 1.5), ("fused-no_pv", 2.1),
                                        ("fused-zero_mask", 2.2)))))
    assert list(t.columns) == [*"dtype causal D N B H Hkv".split(), *ablation.STAGE_COLUMNS]
    soft, pv = t.to_dict("records")
    assert (soft["stage"], soft["saving_ms"], soft["share"], soft["kernel"], soft["kernel_kind"]) == \
        ("softmax", 0.5, 0.25, "fused", "gluon")
    assert math.isnan(soft["flop_share"]) and pv["flop_share"] == 0.5
    assert (pv["saving_ms"], pv["share"], pv["kernel"]) == (pytest.approx(-0.1), pytest.approx(-0.05), "fused")
    qk = ablation.stage_savings(frame(row("qk_softmax", 2.0), row("qk_softmax-no_softmax", 1.9),
                                      row("qk_softmax-no_pv", 1.95), row("qk_softmax-zero_mask", 2.2)), base="qk_softmax")
    assert [(r["stage"], r["kernel"], r["kernel_kind"]) for r in qk.to_dict("records")] == \
        [("softmax", "qk_softmax", ""), ("pv", "", "")]
