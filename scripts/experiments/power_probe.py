"""Session 15: does the GPU hold its clock while a build runs back to back? GPU only, bf16, D = 128, N = 4096
(FlashAttention's shape), non-causal. Each build is captured in a CUDA graph of 10 calls and replayed for about
`--seconds`, while attnlab.load.LoadLog samples the SM clock, the power draw and the active clock-event reasons every
50 ms through NVML (bitmask: 0x1 idle, 0x4 software power cap, 0x8 hardware slowdown, 0x20 software thermal, 0x40
hardware thermal, 0x80 hardware power brake). Prints, per build, the ms a call over its phase and the samples' median
clock, median power and the reasons seen. (Session 15's call 8 ran an earlier form that read the same through
nvidia-smi.)

    python scripts/experiments/power_probe.py [--seconds 4]
"""
import argparse
import statistics
import time

import torch

from attnlab import builds
from attnlab.load import LoadLog
from attnlab.measure import make_inputs, Case


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    a = ap.parse_args()
    q, k, v = make_inputs(Case("fused", 4, 16, 16, 4096, 128, "bfloat16", False, "cuda"))
    phases = []
    with LoadLog("cuda") as log:
        for name in ("qk_softmax", "fused", "sdpa_cudnn", "qk_softmax"):
            b = builds.get(name)
            b.attend(q, k, v, causal=False)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(10):
                    b.attend(q, k, v, causal=False)
            torch.cuda.synchronize()
            time.sleep(1.0)  # idle between phases
            t0, calls = time.time(), 0
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            while time.time() - t0 < a.seconds:
                g.replay()
                calls += 10
                if calls % 100 == 0:
                    torch.cuda.synchronize()
            end.record()
            torch.cuda.synchronize()
            phases.append((name, t0, time.time(), start.elapsed_time(end) / calls))
            del g
    if log.note:
        raise SystemExit(f"power_probe.py: {log.note}")
    for name, t0, t1, ms in phases:
        s = [x for x in log.samples if t0 + 0.5 <= x[0] <= t1]  # the first half second is the ramp
        print(f"power {name}: {ms:.4f} ms a call, {len(s)} samples, clock median "
              f"{statistics.median(x[1] for x in s) if s else float('nan')} MHz (min {min((x[1] for x in s), default=0)}),"
              f" power median {statistics.median(x[2] for x in s) if s else float('nan'):.0f} W, reasons "
              f"{sorted({hex(x[3]) for x in s})}", flush=True)


if __name__ == "__main__":
    main()
