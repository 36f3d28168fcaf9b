"""Shared test helpers. Triton kernels run in Triton's interpreter: the Makefile sets TRITON_INTERPRET=1, and
attnlab.triton sets it when no GPU is present, before any kernel is defined."""
import json
import os
import subprocess
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from attnlab.triton import config  # noqa: E402


def rand_qkv(B=1, H=2, Hkv=None, N=64, D=64, dtype=torch.float32, seed=0, device="cpu"):
    """Fresh random normal q, k, v (never zeros: zeros hide unwritten outputs and wrong indexing)."""
    g = torch.Generator().manual_seed(seed)
    Hkv = Hkv or H
    q = torch.randn(B, H, N, D, generator=g).to(dtype=dtype, device=device)
    k = torch.randn(B, Hkv, N, D, generator=g).to(dtype=dtype, device=device)
    v = torch.randn(B, Hkv, N, D, generator=g).to(dtype=dtype, device=device)
    return q, k, v


def offline_compile(*args: str, timeout: int = 600) -> list[dict]:
    """The rows of `python -m attnlab.triton.resources --json ARGS`: our kernels compiled for sm_90a in a child process
    (this one has them loaded for the interpreter; the child restarts itself with TRITON_INTERPRET=0), as a user's
    command runs it."""
    out = subprocess.run([sys.executable, "-m", "attnlab.triton.resources", "--json", *args], capture_output=True,
                         text=True, timeout=timeout, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


class KernelStandIn:
    """In place of a @triton.jit or @gluon.jit kernel for tests that pretend to be on a GPU: `kernel[grid](*args,
    **kw)` runs nothing and hands the grid and the arguments by name (positional ones named by `names`, the kernel's
    arg_names) to `record`, when given: which launch a call reached, with which flags and grid."""

    def __init__(self, record=None, names=()):
        self.record, self.names = record, names

    def __getitem__(self, grid):
        return lambda *args, **kw: self.record(grid, {**dict(zip(self.names, args)), **kw}) if self.record else None


def poisoned_out(q):
    """An output buffer full of NaN: any element a kernel fails to write stays NaN and fails the check."""
    return torch.full_like(q, float("nan"))


@pytest.fixture(params=["single", "paired"])
def small_tiles(monkeypatch, request):
    """Tiles of 32×16 so short sequences cross many blocks (ragged tails, diagonal tiles, multi-tile loops); every
    test that asks for them runs twice, the second time with the fused kernel's paired loop (two 32-row blocks per
    program sharing each K/V tile, Tiles.paired; BLOCK_M = 2·BLOCK_N as in the H200's table, so a block's diagonal,
    and A's all-masked tiles, span two key tiles), so that loop meets every case the single one does."""
    small = {key: config.Tiles(32, 16) for key in config.TABLE}
    if request.param == "paired":
        small = {key: (config.Tiles(32, 16, paired=True) if key[0] == "fused" else t) for key, t in small.items()}
    monkeypatch.setattr(config, "TABLE", small)
    yield
