"""A small made-up GPU run written the way a sweep writes one (results.csv through attnlab.sweep.append_row,
provenance.json), for the tests of attnlab.lab, attnlab.lies and the rendered walkthrough: the numbers are chosen, so
the answers computed from them are known.

fused takes FUSED_MS at N = 512 and grows as N² (half when causal); materialised is SPEEDUP[causal][N] times fused, so
fused first beats materialised by 3x at N = 1024 in both causal values, flattens non-causal (3.2 -> 3.3) and keeps
rising causal (3.6 -> 4.5). fused-no_pv is 2 % slower than fused (a negative saving: overlap), fused-no_softmax 20 %
faster (softmax dominates).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from attnlab import cost, sweep
from attnlab.measure import Case
from tests.test_report_groups import row

NS = (512, 1024, 2048)
DS = (64, 128)
FUSED_MS = 0.1
SPEEDUP = {False: {512: 2.5, 1024: 3.2, 2048: 3.3}, True: {512: 2.8, 1024: 3.6, 2048: 4.5}}
ABLATED = {"no_softmax": 0.8, "no_pv": 1.02, "zero_mask": 1.1}  # × the base's time
LIBRARY = {"torch_eager": ("materialised", 1.2), "sdpa_default": ("fused", 0.9), "sdpa_flash": ("fused", 0.95)}
TBPS, TFLOPS = 4.0, 700.0
DEVICE_NAME = "NVIDIA TEST GPU"


def every_build(ours: dict, ablated: dict, library: dict) -> dict:
    """ms of every build from our three's (`ours`): each ablation `ablated[ablation]` times its base, each library
    build `library[name] = (like, factor)` times the build it resembles."""
    ms = dict(ours)
    for base in ("materialised", "qk_softmax", "fused"):
        for ablation, factor in ablated.items():
            ms[f"{base}-{ablation}"] = ms[base] * factor
    for name, (like, factor) in library.items():
        ms[name] = ms[like] * factor
    return ms


def times(N: int, causal: bool) -> dict:
    fused = FUSED_MS * (N / 512) ** 2 * (0.5 if causal else 1.0)
    mat = fused * SPEEDUP[causal][N]
    return every_build({"fused": fused, "materialised": mat,
                        "qk_softmax": fused * (1 + (SPEEDUP[causal][N] - 1) / 2)}, ABLATED, LIBRARY)


def write_gpu_run(folder: Path, started: str = "2026-01-02T00:00:00+00:00", builds=None, dtype="bfloat16") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for causal in (False, True):
        for D in DS:
            for N in NS:
                B, H = 16384 // N, 2048 // D
                for build, ms in times(N, causal).items():
                    if builds is not None and build not in builds:
                        continue
                    case = Case(build, B, H, H, N, D, dtype, causal, "cuda:0")
                    flops, moved = cost.flops(case), cost.bytes_moved(case)
                    r = row(build, ms=ms, B=B, H=H, Hkv=H, N=N, D=D, dtype=dtype, causal=causal, run_id=folder.name,
                            device_name=DEVICE_NAME, ms_p20=ms * 0.99, ms_p80=ms * 1.01, reps=10, cold_s=0.5,
                            timer="do_bench+graph", host_ms=0.15, consume_ms=0.0, peak_bytes=float(
                                cost.hold_bytes(case)), hold_bytes=cost.hold_bytes(case), flops=flops,
                            bytes_moved=moved, tflops=flops / (ms * 1e9), tbps=moved / (ms * 1e9),
                            pct_flops=math.nan, pct_bw=math.nan, ceiling_tflops=TFLOPS, ceiling_tbps=TBPS,
                            err=1e-3, err_limit=1e-2, err_note="", checksum=1.0, tiles="", alloc_flag="",
                            compile_note="", timing_note="", code="c0de", started=started, clock_reasons="",
                            sm_clock_mhz=math.nan, power_w=math.nan, mask="zero" if "zero_mask" in build else "none",
                            status="ok")
                    r["case_id"] = case.case_id
                    sweep.append_row(folder / sweep.RESULTS, {k: r[k] for k in sweep.COLUMNS})
    prov = {"device": {"device": "cuda:0", "name": DEVICE_NAME, "capability": "9.0", "total_memory": 80 << 30},
            "software": {"torch": "2.11", "triton": "3.6.0", "python": "3.12", "cuda": "13.0"},
            "git": {"commit": "0123456789abcdef", "dirty": False}, "code": "c0de", "run_id": folder.name,
            "results": sweep.RESULTS, "started": started, "ended": started,
            "ceilings": {dtype: {"tbps": TBPS, "tflops": TFLOPS, "dtype": dtype, "timer": "do_bench",
                                 "matmul_n": 8192}},
            "params": {"dtype": dtype}}
    (folder / sweep.PROVENANCE).write_text(json.dumps(prov))
    return folder


def write_cpu_run(folder: Path, started: str) -> Path:
    """A run's folder measured on a CPU (never a reference for speed), newer than any GPU run of the tests."""
    folder.mkdir(parents=True, exist_ok=True)
    r = row("fused", device="cpu")
    sweep.append_row(folder / sweep.RESULTS, {k: r.get(k, "") for k in sweep.COLUMNS})
    (folder / sweep.PROVENANCE).write_text(json.dumps({"device": {"device": "cpu", "name": "a CPU"},
                                                       "results": sweep.RESULTS, "started": started}))
    return folder
