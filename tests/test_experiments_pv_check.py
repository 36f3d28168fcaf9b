"""The P that scripts/experiments/pv_gluon.py's check builds (softmax_p) keeps the contract of the builds' own P
(attnlab.triton.launch.scores_buffer, PERFORMANCE.md v56): rows on 128-byte lines, the padding past N written 0,
because the Triton PV kernel reads the first vector past N as it lies. Session 33's call 3 found the script's P left
that padding as torch.empty gave it: at N = 1020 the Triton baseline came out NaN and every case there read BAD."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "experiments"))

import pv_gluon  # noqa: E402
from attnlab.triton import config, launch  # noqa: E402


def _nan_empty(*shape, **kw):
    """torch.empty(B, H, N, row, ...) whose memory is NaN, not whatever the allocator had: a P built on it shows
    padding left unwritten."""
    return torch.full(shape, float("nan"), **kw)


def test_the_check_p_has_its_padding_zero_and_the_triton_baseline_reads_it_finite(monkeypatch):
    N, D = 1020, 64  # 1020 · 2 bytes is not a whole number of 16-byte vectors: the PV kernel reads past N
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, N, D, generator=g, dtype=torch.float16) for _ in range(3))
    with monkeypatch.context() as m:
        m.setattr(torch, "empty", _nan_empty)
        p = pv_gluon.softmax_p(q, k, causal=False)
    assert p.stride(2) == launch.line_row(N, p.element_size()) > N  # the builds' layout: rows on lines
    pad = launch.padded_view(p, N)[..., N:]  # the vector past N that the PV kernel reads
    assert pad.shape[-1] == 4 and (pad == 0).all()
    assert torch.allclose(p.float().sum(-1), torch.ones(1, 2, N), atol=2e-2)
    ref = pv_gluon.reference(p, v, no_pv=False)
    c = launch._prepare(q, k, v, False, None, None, None)
    with config.forced("pv", pv_gluon.triton_entry(D, False, torch.float16)):
        o = launch._pv(c, p, None, None)
    err = (o.double() - ref).abs().max().item()
    assert err < 1e-3, err
