"""A stand-in for the GPU under notebooks/attention_lab.ipynb: attnlab.measure.measure writes, for each case, a row
as a CUDA device would (device cuda:0, DEVICE_NAME, graph-replayed times) whose numbers are chosen here, and
attnlab.ceilings.measure_ceilings returns CEILINGS. Everything else (the gate on the CPU, the sweep's loop, its
resumption, the report, the page) is the real code.

Times: fused takes FUSED_MS at N = 64, growing as N² (half when causal); materialised is SPEEDUP[causal][N] times
fused; qk_softmax sits QK_SHARE of the way from fused to materialised; each ablation is ABLATED[ablation] times its
base; a library build is LIBRARY[build] times the build it resembles; every peak allocation is PEAK_OVER_HOLD
times what the build holds. A build's first call in the process takes COLD_FIRST_S[build] (COLD_FIRST_S["other"]
for the rest), each later one COLD_LATER_S. So fused over materialised is 2.17 → 3.41 →
3.46 non-causal (rises, then flattens) and 3.08 → 4.19 → 5.37 causal (still rising), and fused first beats
materialised by 3× at N = 128 non-causal and at N = 64 causal.

STOP_AFTER (environment: ATTNLAB_STANDIN_STOP_AFTER) interrupts the sweep, as a user's Ctrl-C would, after that many
rows of this process, to render a run in two parts.
"""
from __future__ import annotations

import json
import os

from tests.gpu_run import every_build

DEVICE_NAME = "STAND-IN GPU 7Q"
CEILINGS = {"tbps": 3.21, "tflops": 654.0, "timer": "stand-in", "matmul_n": 8192}
FUSED_MS = 0.0217
SPEEDUP = {False: {64: 2.17, 128: 3.41, 256: 3.46}, True: {64: 3.08, 128: 4.19, 256: 5.37}}
QK_SHARE = 0.43
ABLATED = {"no_softmax": 0.71, "no_pv": 1.03, "zero_mask": 1.13}
LIBRARY = {"torch_eager": ("materialised", 1.27), "sdpa_default": ("fused", 0.91)}
HOST_MS = 0.0123
COLD_FIRST_S = {"materialised": 0.91, "qk_softmax": 0.63, "fused": 0.37, "other": 0.21}  # compiling, once a build
COLD_LATER_S = 0.0042  # a later shape: the kernel loads
PEAK_OVER_HOLD = 1.17  # every build's measured peak allocation, against what its name says it holds
ONE_PASS_UP_TO = 64  # qk_softmax's rows say one pass (one_pass: true) up to this N, two above it


def times(N: int, causal: bool) -> dict:
    """ms per build at (N, causal); the same at every D."""
    fused = FUSED_MS * (N / 64) ** 2 * (0.5 if causal else 1.0)
    mat = fused * SPEEDUP[causal][N]
    return every_build({"fused": fused, "materialised": mat, "qk_softmax": fused + QK_SHARE * (mat - fused)},
                       ABLATED, LIBRARY)


def tiles(base: str, N: int) -> str:
    """The tiles JSON a GPU row carries: the kernels a build launches, warp-specialised (gluon) as on Hopper."""
    def one(**kw):
        return {"BLOCK_M": 64, "BLOCK_N": 128, "gluon": True, "one_pass": False, **kw}

    kernels = {"materialised": {"scores": one(), "pv": one()},
               "qk_softmax": {"qk_softmax": one(one_pass=N <= ONE_PASS_UP_TO), "pv": one()},
               "fused": {"fused": one()}}.get(base)
    return json.dumps(kernels, sort_keys=True) if kernels else ""


def install() -> None:
    from attnlab import ceilings, measure, sweep

    stop_after = int(os.environ.get("ATTNLAB_STANDIN_STOP_AFTER", "0"))
    measured = [0]
    seen = set()  # the builds called once already in this process

    def stand_in_ceilings(device, dtype):
        return {**CEILINGS, "dtype": dtype}

    def stand_in_measure(case, *, ceilings, run_id="", **_):
        if stop_after and measured[0] >= stop_after:
            raise KeyboardInterrupt(f"stand-in: stopped after {stop_after} rows")
        measured[0] += 1
        row = measure.base_row(case, ceilings=ceilings, run_id=run_id)
        ms = times(case.N, case.causal)[case.build]
        cold = COLD_LATER_S if case.build in seen else COLD_FIRST_S.get(case.build, COLD_FIRST_S["other"])
        seen.add(case.build)
        row.update(device="cuda:0", device_name=DEVICE_NAME, status="ok", cold_s=cold, ms=ms, ms_p20=ms * 0.99,
                   ms_p80=ms * 1.01, reps=50, timer="do_bench+graph", host_ms=HOST_MS, eager_ms=ms + HOST_MS,
                   timing_note="", peak_bytes=float(row["hold_bytes"]) * PEAK_OVER_HOLD, peak_note="", alloc_flag="", err=1e-3,
                   err_limit=1e-2, err_note="", checksum=1.0, consume_ms=0.0, tiles=tiles(row["base"], case.N),
                   compile_note="")
        return measure.rates(row)

    ceilings.measure_ceilings = stand_in_ceilings
    sweep.measure_ceilings = stand_in_ceilings
    measure.measure = stand_in_measure
