"""Which kernel and tiles each call gets: the golden table (tests/plan_golden.csv) against the choice today's code
makes.

The table holds, for every shape of the gate's grids (attnlab.gate.grid), of the params files' grids and of the
issue-61 shapes, and for both sides of every bound docs/hopper.md records (short causal N, one wave or less, room
for a mask ring, Hopper 16-bit D ∈ {64, 128}), the tile label (attnlab.triton.resources.label) that a row records for
each kernel: `scores` (materialised's S kernel), `qk_softmax` (its P kernel), `pv`, `fused`. It was written by the
tile table of commit 8609324 (config.TABLE, config.SHORT, launch.tile_config) before the plan replaced them, so that
the same kernels launch with the same tiles, and the speed stays what the records say. Capability "cpu" is Triton's
interpreter; "8.0" an sm80 GPU of 108 SMs; "9.0" an sm90 one of 132 (H100 SXM, H200). The mask is the (N, N) one
the lab passes, broadcast over batch and heads: boolean, or additive in q's dtype, the zero_mask ablation's (the row
of an additive mask is the zero_mask ablation's)."""
import csv
import os

import pytest
import torch

from attnlab.triton import config, launch
from attnlab.triton.resources import label
from attnlab.validate import Spec

GOLDEN = os.path.join(os.path.dirname(__file__), "plan_golden.csv")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEVICES = {"cpu": ("interpreter", None), "8.0": ("sm80", 108), "9.0": ("sm90", 132)}
KERNELS = ("scores", "qk_softmax", "pv", "fused")


def golden() -> list[dict]:
    with open(GOLDEN) as f:
        return list(csv.DictReader(f))


def spec(row: dict, mask: str | None = None) -> Spec:
    device = torch.device("cpu" if row["capability"] == "cpu" else "cuda")
    return Spec(1, int(row["heads"]), int(row["heads"]), int(row["N"]), int(row["D"]), DTYPES[row["dtype"]], device,
                row["causal"] == "1", 1.0, row["mask"] if mask is None else mask)


@pytest.fixture
def on_device(monkeypatch):
    """Pretend to be on the row's device: its family and SM count, as config reads them."""
    def set_device(capability):
        family, sms = DEVICES[capability]
        monkeypatch.setattr(config, "family", lambda device: family)
        monkeypatch.setattr(config, "sm_count", lambda device: sms)
    return set_device


def test_the_golden_table_covers_every_bound_and_kernel():
    rows = golden()
    assert len(rows) > 2000
    labels = {k: {r[k] for r in rows} for k in KERNELS}
    # every kind of kernel the rules choose appears: Triton, Gluon two-pass and one-pass, persistent, one consumer,
    # mask by TMA, the fixed reference, Oᵀ, paired rows
    assert {"64x128w4s4ga", "64x128w4s3grcf", "64x128w4s3hgu", "64x128w4s3gmc", "128x64w8s3"} <= labels["qk_softmax"]
    assert {"128x64w4s4gcy", "128x64w4s4hgcy", "64x64w4s3", "128x64w8s3"} <= labels["pv"]
    assert {"64x128w4s2gmco", "64x64w4s2hgmcou", "64x128w4s2hgmcou", "128x64w8s3p", "64x64w4s3h"} <= labels["fused"]


def test_every_row_of_the_golden_table_gets_its_tiles(on_device):
    wrong = []
    for row in golden():
        on_device(row["capability"])
        ablation = "zero_mask" if row["mask"] == "additive" else None
        s = spec(row, "none" if ablation else None)
        got = {}
        for build in ("materialised", "qk_softmax", "fused"):
            got.update({k: label(config.Tiles(**t)) for k, t in launch.tile_config(build, s, ablation).items()})
        want = {k: row[k] for k in KERNELS}
        if got != want:
            wrong.append((row, got))
    assert not wrong, f"{len(wrong)} rows differ, first: {wrong[:3]}"
