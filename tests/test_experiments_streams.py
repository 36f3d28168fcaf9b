"""The probe kernels of scripts/experiments/stream_rates.py (PERFORMANCE.md v45, v46), under Triton's interpreter: each
stream and tile walk reads or writes every element of the tensor it is timed on, so the rates the performance log
quotes are rates of the whole P (their GPU runs: outputs/h200/2026-12-02-s26-call1, -call3)."""
import sys
from pathlib import Path

import pytest
import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "experiments"))

import stream_rates  # noqa: E402


def test_the_read_stream_sums_every_element_once():
    x = torch.randn(5000)  # not a multiple of the block: the last program's tail is masked
    part = torch.empty(triton.cdiv(x.numel(), 2048))
    stream_rates._read[(part.numel(),)](x, part, x.numel(), BLOCK=2048)
    assert torch.allclose(part, torch.nn.functional.pad(x, (0, part.numel() * 2048 - x.numel())).view(-1, 2048).sum(1),
                          atol=1e-3)


def test_the_write_stream_writes_every_element_and_no_further():
    out = torch.full((5000 + 16,), float("nan"))
    stream_rates._write[(triton.cdiv(5000, 2048),)](out, 5000, BLOCK=2048)
    assert not out[:5000].isnan().any() and out[5000:].isnan().all()
    assert out[:5000].unique().numel() > 1  # varied values, not one constant


@pytest.mark.parametrize("bm,bn,stages", [(32, 64, 1), (16, 128, 3)])
def test_the_tile_walks_cover_every_element_of_p(bm, bn, stages):
    B, H, N = 2, 3, 256
    p = torch.randn(B, H, N, N)
    part = torch.empty(B * H * (N // bm))
    stream_rates._read_tiles[(N // bm, B * H)](p, part, N, BM=bm, BN=bn, STAGES=stages)
    want = p.view(B * H, N // bm, bm * N).sum(-1).view(-1)
    assert torch.allclose(part, want, rtol=1e-4, atol=1e-2)
    out = torch.full_like(p, float("nan"))
    stream_rates._write_tiles[(N // bm, B * H)](out, N, BM=bm, BN=bn)
    assert not out.isnan().any()
