"""scripts/compare_reference.py: our rows set against the shared H200 probe, on synthetic frames."""
import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from tests.test_report_groups import frame, row

spec = importlib.util.spec_from_file_location("compare_reference",
                                              Path(__file__).resolve().parent.parent / "scripts" / "compare_reference.py")
compare_reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_reference)


def test_ratio_is_net_of_the_consumption_step_and_peaks_are_compared_in_mib():
    ours = frame(row("sdpa_flash", 1.1, consume_ms=0.1, peak_bytes=64 * 2**20, D=64, N=512),
                 row("torch_eager", 3.0, status="oom: 1 bytes wanted", D=64, N=512))
    ref = pd.DataFrame({"variant": ["sdpa_flash", "eager_materialised", "compiled_materialised"],
                        "head_dim": [64, 64, 64], "causal": [False] * 3, "seq": [512] * 3,
                        "ms": ["0.8", "2.0", "0.5"], "peak_extra_mib": ["60.0", "skip-mem", "1.0"]})
    m = compare_reference.compare(ours, ref)
    assert list(m.build) == ["sdpa_flash"]  # not-ok rows and variants we do not build are left out
    assert m.ratio.iloc[0] == pytest.approx(1.25) and m.peak_diff_mib.iloc[0] == pytest.approx(4.0)
