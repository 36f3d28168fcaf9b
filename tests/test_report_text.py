"""`attnlab report`: every table of a results directory, per (dtype, causal) group, as a user meets it."""
import re


from attnlab import cli
from attnlab.report.text import render
from tests.test_report_groups import frame, row


def _results(no_pv_ms=0.9):
    rows = []
    for causal in (False, True):
        for build, ms in (("materialised", 4.0), ("qk_softmax", 3.0), ("fused", 1.0), ("fused-no_softmax", 0.7),
                          ("fused-no_pv", no_pv_ms), ("fused-zero_mask", 1.2), ("sdpa_flash", 1.5)):
            rows.append(row(build, ms=ms / (2 if causal else 1), causal=causal, peak_bytes=1e6, hold_bytes=10**6,
                            reps=10, flops=10**9, bytes_moved=10**6))
    return frame(*rows)


def test_render_gives_every_table_per_group_and_never_mixes_causal():
    text = render(_results())
    non_causal, causal = text.split("# float16, causal")
    for part in (non_causal, causal):
        for title in ("speedup over materialised", "attribution", "peak memory", "ablations of fused"):
            assert title in part
        assert "ablations of qk_softmax" not in part  # only bases whose ablations were measured
    speed = non_causal.split("## attribution")[0]
    assert re.search(r"^\s*float16\s+False\s+64\s+1000\s+1\s+8\s+8\s+fused\s+1\s+4\s+4\s*$", speed, re.M)
    assert _dominant(non_causal) == "softmax"  # no_softmax saves 0.3 ms, no_pv 0.1
    assert _dominant(render(_results(no_pv_ms=0.5)).split("# float16, causal")[0]) == "pv"  # now no_pv saves 0.5


def test_render_adds_the_causal_saving_when_both_groups_are_there():
    text = render(_results())
    section = text.split("what causal masking saves fused (float16; a difference, never a ratio)")[1]
    assert re.search(r"fused\s+1\s+0\.5\s+0\.5\s+the key tiles past the diagonal", section)


def _dominant(text: str) -> str:
    """The `dominant` cell of the fused ablation table's only data line (the column before the empty note)."""
    section = text.split("## ablations of fused")[1]
    header, line = [ln for ln in section.splitlines() if ln.strip()][1:3]
    return line.split()[header.split().index("dominant")]


def test_report_command_writes_tables_txt(tmp_path, capsys):
    _results().to_csv(tmp_path / "results.csv", index=False)
    assert cli.main(["report", str(tmp_path)]) == 0
    written = (tmp_path / "tables.txt").read_text()
    assert written.strip() == capsys.readouterr().out.strip()
    assert "## attribution" in written
    page = (tmp_path / "figures.html").read_text()
    assert page.count("Plotly.newPlot") == 6  # per group: speedup, memory, fused ablations


def test_report_on_a_directory_without_results_is_one_error(tmp_path, capsys):
    """A directory that exists but holds no sweep (a missing one is refused by the parser: tests/test_cli.py)."""
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"attnlab: error: report: {tmp_path}/results.csv does not exist (give a sweep's output directory)\n"
    assert not (tmp_path / "tables.txt").exists() and not (tmp_path / "figures.html").exists()
