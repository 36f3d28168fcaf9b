"""scripts/host_cost.py without a GPU: its shapes (the issue's nine and B·H = 16 at N = 1024), its table and the
target lines it computes from the rows; the timing itself runs on the device."""
import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "host_cost.py"


def script():
    spec = importlib.util.spec_from_file_location("host_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["host_cost"] = module  # its dataclass looks its module up while it is made
    spec.loader.exec_module(module)
    return module


def rows(hc, fused_host: float, qk_over: float) -> list[dict]:
    out = []
    for s in hc.SHAPES:
        for b, host in (("sdpa", 20.0), ("fused", fused_host), ("qk_softmax", 20.0 * qk_over),
                        ("materialised", 30.0)):
            out.append(dict(group=s.group, shape=str(s), build=b, host_us=host, wall_us=2 * host))
    return out


def test_the_shapes_are_the_issues():
    hc = script()
    base = [s for s in hc.SHAPES if s.group == "B·H = 16"]
    assert {(s.B * s.H, s.N, s.D, s.causal) for s in base} == {(16, 1024, d, c) for d in (64, 128) for c in (0, 1)}
    issue = [s for s in hc.SHAPES if s.group == "issue 61"]
    assert len(issue) == 9 and all(s.H % s.Hkv == 0 for s in issue)


def test_the_target_lines_follow_the_rows():
    hc = script()
    met = hc.targets(rows(hc, fused_host=40.0, qk_over=2.0))
    assert [line.endswith(": met") for line in met] == [True, True, True]
    missed = hc.targets(rows(hc, fused_host=60.0, qk_over=3.0))
    assert [line.endswith(": not met") for line in missed] == [True, True, False]
    assert "60.0 µs" in missed[0] and "3.00×" in missed[1]


def test_the_table_has_a_line_a_shape_with_ours_over_sdpa():
    hc = script()
    text = hc.table(rows(hc, fused_host=40.0, qk_over=2.0)).splitlines()
    assert len(text) == 2 + len(hc.SHAPES)
    assert text[2].split()[-3:] == ["2.00", "2.00", "1.50"]  # fused, qk_softmax, materialised over SDPA's wall
