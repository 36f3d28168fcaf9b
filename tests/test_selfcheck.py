"""The GPU self-check's verdict (a pure function) and its refusal on a machine without CUDA."""
import pytest
import torch

from attnlab import selfcheck


def test_verdict_applies_the_issue_bounds():
    # run 8's qk_softmax case: within 3 % of both timers, 0.9 % apart measured twice
    v = selfcheck.verdict(2.4230, 2.4446, 2.4910, 2.4830)
    assert v["ok"] and v["vs_events"] == pytest.approx(-0.0273, abs=1e-4) and v["repeat"] == pytest.approx(0.0089,
                                                                                                            abs=1e-4)
    # run 10's fused causal case: 3.5 % under do_bench fails, though the event timer and the repeat agree
    v = selfcheck.verdict(2.336, 2.317, 2.353, 2.421)
    assert not v["ok"] and v["vs_do_bench"] == pytest.approx(-0.0351, abs=1e-4)
    # run 7's sdpa_flash case: 8 % apart measured twice fails on its own
    assert not selfcheck.verdict(2.006, 1.845, 2.0, 2.0)["ok"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_2(capsys):
    assert selfcheck.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "attnlab selfcheck: error: needs a CUDA GPU"
