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


@pytest.mark.parametrize("causal", [False, True])
def test_the_bytes_bound_counts_the_bytes_the_model_says_qk_softmax_must_move(causal):
    """bytes / floor's numerator (floor_p_ms + qkvo_ms) is attnlab.cost.bytes_moved of a qk_softmax case at the copy
    rate: the bench and the harness's rates count the same bytes."""
    from attnlab import cost
    from attnlab.measure import Case

    ceil = dict(tbps=4.0, tflops=500.0)
    B, H, N, D = 2, 8, 1024, 64
    parts = bench.qk_softmax_floor_parts(B, H, N, D, torch.bfloat16, causal, ceil)
    moved = cost.bytes_moved(Case("qk_softmax", B=B, H=H, Hkv=H, N=N, D=D, dtype="bfloat16", causal=causal))
    assert parts["floor_p_ms"] + parts["qkvo_ms"] == pytest.approx(moved / 4e12 * 1e3)


def test_shapes_follow_flashattention_convention_plus_untuned_ones():
    s = bench.shapes([torch.bfloat16], [512, 16384])
    assert (32, 32, 512, 64, torch.bfloat16, False) in s and (1, 16, 16384, 128, torch.bfloat16, True) in s
    assert all(B * N == 16384 and H * D == 2048 for B, H, N, D, _, _ in s if N != 3000 and H != 64)
    assert (1, 64, 8192, 128, torch.bfloat16, False) in s and any(N == 3000 for _, _, N, _, _, _ in s)
    assert not any(N == 3000 for _, _, N, _, _, _ in bench.shapes([torch.bfloat16], [512], quick=True))


def test_the_head_count_axis_and_odd_lengths_are_shapes_of_their_own():
    plain = bench.shapes([torch.float16], [1024], quick=True)
    s = bench.shapes([torch.float16], [1024], quick=True, heads=[16, 64], odd_ns=[1536, 6000])
    extra = [x for x in s if x not in plain]
    heads = [x for x in extra if x[0] == 1 and x[1] in (16, 64)]
    assert len(heads) == 2 * len(bench.HEAD_NS) * 2 * 2 and {x[2] for x in heads} == set(bench.HEAD_NS)
    odd = [x for x in extra if x not in heads]
    assert {x[2] for x in odd} == {1536, 6000} and len(odd) == 2 * 2 * 2
    assert all(B * N <= 16384 and H * D == 2048 for B, H, N, D, _, _ in odd)  # FlashAttention's B·N, rounded down
    assert bench.main(["--heads", "0"]) == 2 and bench.main(["--odd-ns", "x"]) == 2


def test_ratios_carry_the_eager_ratio_beside_the_graphs_one():
    """A row's eager_ms (the call issued back to back from Python) gives a ratio of its own beside the graph-replay
    ratio: where launch cost dominates, the two part."""
    rows = [dict(build=b, dtype="bfloat16", D=64, causal=False, N=1024, B=1, H=16, ms=ms, eager_ms=e, tflops=1.0)
            for b, ms, e in (("fused", 0.02, 0.29), ("sdpa_cudnn", 0.023, 0.031))]
    r = bench.ratios(pd.DataFrame(rows)).iloc[0]
    assert r["fused_vs_sdpa_cudnn"] == pytest.approx(0.023 / 0.02)
    assert r["fused_vs_sdpa_cudnn_eager"] == pytest.approx(0.031 / 0.29)


def test_ratios_are_library_time_over_ours():
    rows = [dict(build=b, dtype="bfloat16", D=64, causal=False, N=1024, B=16, H=32, ms=ms, tflops=100 / ms)
            for b, ms in (("fused", 1.0), ("sdpa_flash", 1.3), ("sdpa_cudnn", 0.8), ("flex", 1.1))]
    rows.append(dict(build="qk_softmax", dtype="bfloat16", D=64, causal=False, N=1024, B=16, H=32, ms=3.0,
                     tflops=33.3, floor_ms=2.0, floor_p_ms=1.5, floor_qk_ms=0.5, qkvo_ms=0.3))
    rows[0]["tiles"] = '{"fused": {"BLOCK_M": 64, "BLOCK_N": 128, "gluon": true}}'
    rows[-1]["tiles"] = ('{"pv": {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 4, "gluon": true, "persistent": true}, '
                         '"qk_softmax": {"gluon": false}}')
    r = bench.ratios(pd.DataFrame(rows)).iloc[0]
    # which kernels ran, beside the ratios: fused's, qk_softmax's P kernel and the PV kernel
    assert (r["fused_kernel"], r["qk_softmax_kernel"], r["pv_kernel"]) == ("gluon", "triton", "gluon")
    # and with which tiles (qk's: none recorded)
    assert (r["fused_tiles"], r["qk_softmax_tiles"], r["pv_tiles"]) == ("64x128w4s2g", "", "128x64w4s4gc")
    assert bench.recorded_label('{"fused": {"BLOCK_M": 64, "BLOCK_N": 64, "persistent": true, "gone": 1}}',
                                "fused") == ""  # a field this version does not have
    assert bench.recorded_label(float("nan"), "fused") == ""
    assert r["fused_vs_sdpa_flash"] == pytest.approx(1.3)
    assert r["fused_vs_sdpa_cudnn"] == pytest.approx(0.8)
    assert r["fused_vs_flex"] == pytest.approx(1.1)
    # every one of our builds against every library row (the issue asks for each ratio)
    assert r["qk_softmax_vs_sdpa_flash"] == pytest.approx(1.3 / 3)
    assert r["qk_softmax_vs_sdpa_cudnn"] == pytest.approx(0.8 / 3)
    assert "materialised_vs_sdpa_flash" not in r  # not measured here: no column
    assert r["qk_softmax_over_floor"] == pytest.approx(1.5)
    # the least qk / floor any build could reach: P's round trip and Q, K, V, O's bytes, QKᵀ hidden under them
    assert r["qk_softmax_bytes_over_floor"] == pytest.approx((1.5 + 0.3) / 2.0)
    assert "qk_softmax_bytes_over_floor" not in bench.ratios(pd.DataFrame(rows[:1] + [
        {k: v for k, v in rows[-1].items() if k != "qkvo_ms"}])).iloc[0]  # rows written before qkvo_ms: no column


def test_the_summary_reads_the_ratios_as_the_issue_does():
    """One line per (dtype, D, causal) at FlashAttention's shapes with each ratio across N, the targets counted
    there (fused against FA2 only from N = 1024), and the shapes nobody tunes for apart, not counted."""
    rows = []
    for N, B, H, fused, flash, cudnn, qk in ((512, 32, 32, 1.0, 0.9, 0.8, 2.6), (1024, 16, 32, 2.0, 2.2, 2.1, 4.8),
                                             (3000, 5, 32, 4.0, 5.0, 3.0, 9.0)):
        case = dict(dtype="bfloat16", D=64, causal=False, N=N, B=B, H=H)
        rows += [dict(build=b, ms=ms, tflops=10 / ms, **case)
                 for b, ms in (("fused", fused), ("sdpa_flash", flash), ("sdpa_cudnn", cudnn), ("qk_softmax", qk))]
        rows[-1].update(floor_ms=2.0, repeats=3, ms_min=qk * 0.9, ms_max=qk * 1.1, floor_p_ms=1.6, qkvo_ms=N / 1024)
    text = bench.summary(bench.ratios(pd.DataFrame(rows)))
    table = [line for line in text.splitlines() if line.startswith("| bfloat16")]
    assert table == ["| bfloat16 | 64 | no | 10 5 | 0.90 1.10 | 0.80 1.05 | 0.35 0.46 | 0.31 0.44 | 1.30 2.40 | "
                     "1.05 1.30 |"]
    assert "fused ≥ 1.0× sdpa_flash at N ≥ 1024: 1 of 1 (smallest 1.100)" in text  # N = 512's 0.90 not counted
    assert "fused ≥ 0.9× sdpa_cudnn: 1 of 2 (smallest 0.800)" in text
    assert "qk_softmax ≤ 1.25× its floor: 0 of 2 (smallest 1.300)" in text
    assert "  at each case's fastest graph: 1 of 2 (smallest 1.170)" in text  # 2.6 · 0.9 / 2
    # (1.6 + 0.5) / 2 and (1.6 + 1.0) / 2: the bytes alone allow 1.25 at N = 512, not at N = 1024
    assert ("  cells whose bytes alone (P round trip + Q, K, V, O at the copy rate) are ≤ 1.25× the floor: 1 of 2 "
            "(largest 1.300)") in text
    assert "  bfloat16 D=64 causal=False N=3000 B=5 H=32: fused TF/s 2, fused / flash 1.25" in text


@pytest.mark.parametrize("group", [1, 2])
def test_run_writes_one_checked_row_per_build_and_shape(monkeypatch, tmp_path, group):
    """bench.run's plumbing on the CPU: the GPU-only pieces (timer, clock spin-up, ceilings) stood in for. With
    --group 2 the two query heads share one key/value head: the rows say so, the builds are checked against the
    oracle at that layout, and the floor's Q, K, V, O bytes count one K and one V head."""
    import argparse

    from attnlab import builds

    real_case = bench.bench_case
    monkeypatch.setattr(bench, "bench_case", lambda *a, **kw: real_case(*a, **{**kw, "device": "cpu"}))
    monkeypatch.setattr(bench, "spin_up", lambda *a, **k: None)
    monkeypatch.setattr(bench.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench, "measure_ceilings", lambda dev, dt: dict(tbps=1.0, tflops=1.0))
    monkeypatch.setattr(bench, "shapes", lambda dtypes, ns, quick, heads, odd_ns: [(1, 2, 40, 16, torch.float32, True)])

    logs = []

    def fake_time(name, q, k, v, causal, repeats=1, load=None):  # the real attention, a made-up time and peak
        logs.append(load)
        return dict(cold_s=0.1, ms=2.0, status="ok", o=builds.get(name).attend(q, k, v, causal=causal),
                    timer="do_bench+graph", peak_bytes=1234.0)

    monkeypatch.setattr(bench, "time_case", fake_time)
    args = argparse.Namespace(dtypes=["float32"], ns=[40], builds=["fused", "qk_softmax", "sdpa_math"], quick=True,
                              out=str(tmp_path), repeats=1, heads=None, odd_ns=None, group=group)
    df = bench.run(args)
    assert df.build.tolist() == ["fused", "qk_softmax", "sdpa_math"] and (df.status == "ok").all()
    assert (df.H == 2).all() and (df.Hkv == 2 // group).all()
    assert df.loc[df.build == "fused", "accurate"].item() is True
    assert df.loc[df.build == "qk_softmax", "accurate"].item() is True
    qk = df[df.build == "qk_softmax"].iloc[0]
    assert qk.floor_ms > 0 and qk.floor_p_ms + qk.floor_qk_ms == pytest.approx(qk.floor_ms)
    heads = 2 + 2 + 2 * (2 // group)  # Q and O at H = 2, K and V at Hkv
    assert qk.qkvo_ms == pytest.approx(heads * 40 * 16 * 4 / 1e12 * 1e3)  # fp32 Q, K, V, O once at 1 TB/s
    assert df.tflops.tolist() == pytest.approx([4 * 2 * 40 * 40 * 16 / 2 / 2.0 / 1e9] * 3)
    assert (df.timer == "do_bench+graph").all()  # each row says how it was timed
    assert (df.peak_bytes == 1234.0).all()  # each row carries its build's peak allocation
    assert (tmp_path / "bench.csv").exists()
    assert len(logs) == 3 and logs[0] is logs[2] and logs[0].note.startswith("no GPU")  # one load log, inert here


class _FakeBuild:
    def __init__(self, base):
        self.base = base

    def attend(self, q, k, v, causal=False):
        return torch.zeros_like(q)


def _cpu_timing(monkeypatch, base, graph_counts, peak=lambda fn, dev: (99.0, "", None)):
    """time_case's GPU pieces stood in for: the build, torch._dynamo's graph counter, the timer, the peak pass."""
    from attnlab import builds, measure

    counts = iter(graph_counts)
    resets = []
    monkeypatch.setattr(builds, "get", lambda name: _FakeBuild(base))
    monkeypatch.setattr(measure, "_dynamo_reset", lambda: resets.append(1))
    monkeypatch.setattr(measure, "_graphs", lambda: next(counts))
    monkeypatch.setattr(measure, "cold_call", lambda fn, dev: (0.5, fn()))
    monkeypatch.setattr(measure, "graphed", lambda fn, dev, graphs: (fn, "no graph here"))
    monkeypatch.setattr(measure, "_time", lambda fn, dev, **kw: ([(fn(), 1.5)[1]], "do_bench"))
    monkeypatch.setattr(measure, "peak_pass", peak)
    monkeypatch.setattr(measure, "eager_ms", lambda fn, dev, **kw: (2.5, 10, "stand-in"))
    q = torch.zeros(1, 1, 8, 4)
    return measure.time_case("flex" if base == "flex" else "fused", q, q, q, False), resets


def test_a_compiled_build_starts_each_shape_from_a_reset_dynamo_and_says_if_it_recompiled(monkeypatch):
    """Lab guard (GUIDE.md): a benchmark of many shapes must not reach torch._dynamo's recompile limit (the sweep
    resets it per shape; so does the bench), and a warm time that includes a compile must say so."""
    out, resets = _cpu_timing(monkeypatch, "flex", [10, 11, 11])
    assert resets == [1] and out["status"] == "ok" and out["ms"] == 1.5 and out["peak_bytes"] == 99.0
    assert "1 graph(s) compiled there, 0 while timing" in out["compile_note"]
    assert "RECOMPILED" not in out["compile_note"] and out["timer"] == "do_bench (no graph here)"
    out, _ = _cpu_timing(monkeypatch, "flex", [10, 11, 13])
    assert "2 while timing: RECOMPILED during timing" in out["compile_note"]
    out, resets = _cpu_timing(monkeypatch, "fused", [])  # not compiled: no reset, no note
    assert resets == [] and "compile_note" not in out


def test_a_peak_pass_out_of_memory_keeps_the_measured_time(monkeypatch):
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)

    def oom(fn, dev):
        raise torch.OutOfMemoryError("no room")

    out, _ = _cpu_timing(monkeypatch, "fused", [], peak=oom)
    assert out["status"] == "ok" and out["ms"] == 1.5 and out["peak_bytes"] != out["peak_bytes"]  # NaN


def test_repeats_time_each_case_in_fresh_graphs_and_report_their_median_and_range(monkeypatch):
    """`attnlab bench --repeats k` (one graph's time carries 2–7 %): k captures, each timed
    alone and freed before the next; ms is the median of the k times, ms_min and ms_max their range; the ratio table
    then gives qk_softmax over its floor at both ends. k < 1 is one clear error."""
    from attnlab import builds, measure

    captured, times = [], iter([3.0, 1.0, 2.0])

    def graphed(fn, dev, graphs):
        assert graphs == []  # the previous repeat's graph (and its pool) is gone before the next capture
        graphs.append(object())
        captured.append(1)
        return fn, "stand-in"

    monkeypatch.setattr(builds, "get", lambda name: _FakeBuild("fused"))
    monkeypatch.setattr(measure, "cold_call", lambda fn, dev: (0.5, fn()))
    monkeypatch.setattr(measure, "graphed", graphed)
    monkeypatch.setattr(measure, "_time", lambda fn, dev, **kw: ([next(times)], "do_bench"))
    monkeypatch.setattr(measure, "peak_pass", lambda fn, dev: (7.0, "", None))
    monkeypatch.setattr(measure, "eager_ms", lambda fn, dev, **kw: (2.5, 10, "stand-in"))
    q = torch.zeros(1, 1, 8, 4)
    out = measure.time_case("fused", q, q, q, False, repeats=3)
    assert out["eager_ms"] == 2.5  # the eager time beside the graphs' median
    assert len(captured) == 3
    assert (out["ms"], out["ms_min"], out["ms_max"]) == (2.0, 1.0, 3.0) and out["peak_bytes"] == 7.0
    assert out["graph_ms"] == "[3.0, 1.0, 2.0]"  # each graph's own time, in the order timed

    key = dict(dtype="bfloat16", D=64, causal=False, N=1024, B=16, H=32)
    rows = [dict(build="qk_softmax", ms=3.0, ms_min=2.5, ms_max=3.5, repeats=3, floor_ms=2.0, tflops=1.0, **key),
            dict(build="sdpa_cudnn", ms=1.0, ms_min=1.0, ms_max=1.0, repeats=3, tflops=3.0, **key)]
    r = bench.ratios(pd.DataFrame(rows)).iloc[0]
    assert (r["qk_softmax_over_floor"], r["qk_softmax_over_floor_min"], r["qk_softmax_over_floor_max"]) == (
        pytest.approx(1.5), pytest.approx(1.25), pytest.approx(1.75))
    one = bench.ratios(pd.DataFrame([dict(rows[0], repeats=1)])).iloc[0]
    assert "qk_softmax_over_floor_min" not in one  # one graph a case: no range to give
    assert bench.main(["--repeats", "0"]) == 2



def test_a_group_that_does_not_divide_every_shapes_heads_is_refused_before_any_work(capsys):
    """FlashAttention's shapes hold H = 32 (D = 64) and 16 (D = 128): --group 3 divides neither, --group 5 with a
    head axis of 10 only that axis' H."""
    assert bench.main(["--quick", "--ns", "1024", "--group", "3"]) == 2
    assert capsys.readouterr().err.strip() == ("attnlab bench: error: argument --group: every shape's H must be a "
                                               "multiple of 3; H = 16, 32 is not")
    assert bench.main(["--quick", "--ns", "1024", "--heads", "10", "--group", "16"]) == 2
    assert "H = 10 is not" in capsys.readouterr().err
    assert bench.main(["--group", "0"]) == 2
    assert "argument --group" in capsys.readouterr().err


def test_ratios_keep_grouped_and_plain_shapes_apart():
    """Two rows alike but for Hkv are two cells, and the text names the grouped one's Hkv."""
    rows = []
    for hkv, fused in ((32, 1.0), (8, 0.8)):
        rows += [dict(build=b, ms=ms, tflops=1.0, dtype="bfloat16", D=64, causal=False, N=3000, B=5, H=32, Hkv=hkv)
                 for b, ms in (("fused", fused), ("sdpa_cudnn", 0.9))]
    r = bench.ratios(pd.DataFrame(rows))
    assert len(r) == 2 and sorted(r["fused_vs_sdpa_cudnn"].round(3)) == [0.9, 1.125]
    text = bench.summary(r)
    assert "N=3000 B=5 H=32 Hkv=8: " in text and "N=3000 B=5 H=32: " in text
