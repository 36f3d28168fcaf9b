"""attnlab.report.lines: a build's time split into what grows with N and what does not, and the bench's
qk_softmax line against its floor (attnlab.bench.floor_lines, `attnlab bench --read`)."""
import pandas as pd
import pytest
import torch

from attnlab import bench
from attnlab import cost
from attnlab.report import lines


def _qk_rows(fixed, slope, D=128, causal=False, ns=(1024, 2048, 4096, 8192), qkvo=True, status="ok"):
    """qk_softmax rows at FlashAttention's shapes whose ms lie on fixed + slope × floor, the floor and its parts as
    the bench records them at made-up ceilings."""
    ceil = dict(tbps=4.0, tflops=600.0)
    rows = []
    for n in ns:
        B, H = 16384 // n, 2048 // D
        floor = bench.qk_softmax_floor_ms(B, H, n, D, torch.bfloat16, causal, ceil)
        row = dict(build="qk_softmax", B=B, H=H, N=n, D=D, dtype="bfloat16", causal=causal, status=status,
                   ms=fixed + slope * floor, floor_ms=floor, tflops=1.0)
        if qkvo:
            row.update(bench.qk_softmax_floor_parts(B, H, n, D, torch.bfloat16, causal, ceil))
        rows.append(row)
    return rows


def test_the_line_against_the_floor_gives_back_the_steady_state_ratio_and_the_fixed_part():
    t = lines.fit(pd.DataFrame(_qk_rows(0.08, 1.28) + _qk_rows(0.13, 1.13, causal=True)), ["qk_softmax"],
                  "floor_ms").set_index("causal")
    assert t.loc[False, "slope"] == pytest.approx(1.28) and t.loc[False, "fixed_ms"] == pytest.approx(0.08)
    assert t.loc[True, "slope"] == pytest.approx(1.13) and t.loc[True, "fixed_ms"] == pytest.approx(0.13)
    assert (t.points == 4).all() and t.max_resid_pct.max() == pytest.approx(0, abs=1e-9)


def test_n_is_fitted_in_thousands_and_min_n_leaves_the_short_rows_out():
    rows = pd.DataFrame(_qk_rows(0.05, 1.2, ns=(512, 1024, 2048, 4096)))
    rows.loc[rows.N == 512, "ms"] = 99.0  # another kernel there: off the line
    t = lines.fit(rows, ["qk_softmax"], "N", min_n=1024).iloc[0]
    per_1k = (rows.ms.iloc[3] - rows.ms.iloc[2]) / 2.048  # the line's rise from N = 2048 to 4096, per 1000 keys
    assert t.slope == pytest.approx(per_1k) and t.points == 3
    assert len(lines.fit(rows, ["qk_softmax"], "N", min_n=2048)) == 0  # two rows left: no line


def _n_rows(build, fixed, slope, ns=(512, 1024, 2048, 4096), D=128, status="ok"):
    """A build's rows at FlashAttention's shapes whose ms lie on fixed + slope × N / 1000."""
    return [dict(build=build, B=16384 // n, H=2048 // D, N=n, D=D, dtype="bfloat16", causal=False, status=status,
                 ms=fixed + slope * n / 1000) for n in ns]


def test_each_build_gets_its_own_line_and_only_flashattention_shapes_and_ok_rows_count():
    """Two builds fitted apart; an untuned shape (B = 1, H = 64, N = 8192) is off the line's grid, a failed row has
    no time to fit, and a build with two shapes left gets no line."""
    odd = dict(build="fused", B=1, H=64, N=8192, D=128, dtype="bfloat16", causal=False, status="ok", ms=99.0)
    rows = pd.DataFrame(_n_rows("fused", 0.06, 0.21) + [odd] + _n_rows("fused", 0, 1, ns=(8192,), status="error: oom")
                        + _n_rows("sdpa_cudnn", 0.03, 0.22) + _n_rows("sdpa_flash", 0.1, 0.4, ns=(512, 1024)))
    t = lines.fit(rows, ["fused", "sdpa_cudnn", "sdpa_flash"], "N").set_index("build")
    assert list(t.index) == ["fused", "sdpa_cudnn"] and (t.points == 4).all()
    assert t.loc["fused", "fixed_ms"] == pytest.approx(0.06) and t.loc["fused", "slope"] == pytest.approx(0.21)
    assert (t.loc["sdpa_cudnn", "fixed_ms"], t.loc["sdpa_cudnn", "slope"]) == pytest.approx((0.03, 0.22))
    assert t.max_resid_pct.max() == pytest.approx(0, abs=1e-9)
    assert list(lines.fit(rows, ["fused"], "N").build) == ["fused"]  # only the builds asked for


def test_a_column_the_rows_lack_is_one_clear_error():
    with pytest.raises(ValueError, match="x must be a column of the bench rows, got 'floor'"):
        lines.fit(pd.DataFrame(_qk_rows(0.0, 1.0)), ["qk_softmax"], "floor")


def test_the_floor_parts_add_up_to_the_floor_and_qkvo_is_q_k_v_and_o_once():
    ceil = dict(tbps=4.0, tflops=600.0)
    parts = bench.qk_softmax_floor_parts(4, 16, 4096, 128, torch.bfloat16, True, ceil)
    assert parts["floor_p_ms"] + parts["floor_qk_ms"] == pytest.approx(
        bench.qk_softmax_floor_ms(4, 16, 4096, 128, torch.bfloat16, True, ceil))
    assert parts["qkvo_ms"] == pytest.approx(4 * 4 * 16 * 4096 * 128 * 2 / 4e12 * 1e3)
    # under GQA K and V have Hkv heads
    assert cost.qkvo_bytes(2, 8, 2, 100, 64, "float16") == (2 * 2 * 8 + 2 * 2 * 2) * 100 * 64 * 2


def test_the_bench_prints_the_line_from_n_2048_with_q_k_v_o_beside_it():
    df = pd.DataFrame(_qk_rows(0.08, 1.28, ns=(512, 1024, 2048, 4096, 8192))
                      + _qk_rows(0.1, 1.1, D=64, qkvo=False, ns=(2048, 4096, 8192, 16384)))
    df.loc[df.N == 512, "ms"] = 99.0  # the one-pass kernel's row: left out of the line
    text = bench.floor_lines(df)
    qkvo = 4 * 16384 * 2048 * 2 / 4e12 * 1e3  # the same bytes at every N of these shapes
    assert f"| bfloat16 | 128 | no | 1.280 | 0.0800 | {qkvo:.4f} | 0.0 | 3 |" in text
    assert "| bfloat16 | 64 | no | 1.100 | 0.1000 | — | 0.0 | 4 |" in text  # a bench.csv from before qkvo_ms
    assert "N ≥ 2048" in text
    assert bench.floor_lines(pd.DataFrame(_qk_rows(0.08, 1.28, ns=(2048, 4096)))) == ""  # no group of three rows
    assert bench.floor_lines(pd.DataFrame(_qk_rows(0.08, 1.28, status="error: oom"))) == ""


def test_read_prints_a_finished_bench_again_without_a_gpu(tmp_path, capsys):
    pd.DataFrame(_qk_rows(0.08, 1.28, ns=(2048, 4096, 8192))).to_csv(tmp_path / "bench.csv", index=False)
    assert bench.main(["--read", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "qk_softmax ≤ 1.25× its floor: 0 of 3" in out and "| bfloat16 | 128 | no | 1.280 | 0.0800 |" in out
    assert bench.main(["--read", str(tmp_path / "bench.csv")]) == 0
    assert bench.main(["--read", str(tmp_path / "nothing")]) == 2
    assert "argument --read: must name a bench.csv or a directory holding one, got" in capsys.readouterr().err

