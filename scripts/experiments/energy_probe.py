"""Session 19 (PERFORMANCE.md v35): the energy of one call of each build and of each part, on a card that runs every
heavy kernel at its power cap. GPU only, bf16, non-causal, FlashAttention's shapes at N = 4096 (D = 128 and 64).

(Session 19's second form: the copy runs as an elementwise kernel, since a graph's memcpy of 1 GiB ran at 2.71 TB/s
against do_bench's 4.24; the summary measures the ceilings and prints the floor's terms beside the energy.)

Each phase captures `--calls` calls of one thing in a CUDA graph, replays it for `--warm` seconds (the clock settles
at the cap), then for `--seconds` more while NVML's energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since the
driver loaded) is read at both ends and attnlab.load samples the clock and the power. Per phase it prints ms a call,
mJ a call, mean W, median MHz and the clock-event reasons; the idle phase (nothing launched) gives the card's power
with no work, which the summary subtracts (`dyn` = mJ − idle W × ms) before it compares a build with its parts:

    qk_softmax build   = its P kernel + its PV kernel
    P kernel           = 2 × QKᵀ's FLOPs at mm's J/FLOP + P's bytes written at zero's J/byte (+ the rest: exps...)
    unavoidable        = 3 × QKᵀ at mm's J/FLOP + P written at zero's J/byte + P read (PV kernel − one QKᵀ)
    at the cap         = that energy over the build's own dynamic draw (its W − idle W), against 1.25 × the floor

    python scripts/experiments/energy_probe.py [--seconds 1.5] [--warm 0.5] [--ds 128,64] [--builds ...]
"""
import argparse
import ctypes
import json
import math
import time

import torch

from attnlab import builds, model
from attnlab.bench import qk_softmax_floor_ms
from attnlab.load import LoadLog, nvml_handle
from attnlab.measure import Case, make_inputs
from gluon_fa3 import qk_parts  # this script's directory is on sys.path when it runs


class Energy:
    """NVML's energy counter of the current GPU (mJ) and its enforced power limit (W)."""

    def __init__(self):
        self.lib, self.h = nvml_handle(torch.cuda.current_device())
        if self.lib is None:
            raise RuntimeError(self.h)

    def mj(self) -> int:
        e = ctypes.c_ulonglong()
        rc = self.lib.nvmlDeviceGetTotalEnergyConsumption(self.h, ctypes.byref(e))
        if rc != 0:
            raise RuntimeError(f"nvmlDeviceGetTotalEnergyConsumption rc={rc}")
        return e.value

    def limit_w(self) -> float:
        mw = ctypes.c_uint()
        return mw.value / 1000 if self.lib.nvmlDeviceGetEnforcedPowerLimit(self.h, ctypes.byref(mw)) == 0 else math.nan


def phase(name, fn, energy, log, a, extra=None):
    """Replay `fn` (a.calls of it in one graph) for a.warm s, then a.seconds s with the energy counter read at both
    ends; `fn=None` is the idle phase. Returns the phase's row."""
    g = None
    if fn is not None:
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(a.calls):
                fn()
        torch.cuda.synchronize()

    def spin(seconds):
        t_end, n = time.time() + seconds, 0
        while time.time() < t_end:
            if g is None:
                time.sleep(0.01)
                continue
            g.replay()
            n += a.calls
            if n % (4 * a.calls) == 0:
                torch.cuda.synchronize()  # keep the queue short, so the window's end is the work's end
        torch.cuda.synchronize()
        return n

    spin(a.warm)
    e0, t0 = energy.mj(), time.time()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    n = spin(a.seconds)
    end.record()
    torch.cuda.synchronize()
    e1, t1 = energy.mj(), time.time()
    w = log.window(t0, t1)
    row = dict(phase=name, calls=n, wall_s=t1 - t0, mj_total=e1 - e0, watts=(e1 - e0) / (t1 - t0) / 1000,
               mhz=w["sm_clock_mhz"], reasons=w["clock_reasons"], **(extra or {}))
    if n:
        row.update(ms=start.elapsed_time(end) / n, mj=(e1 - e0) / n)
    del g
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--warm", type=float, default=0.5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--ds", default="128,64")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--builds", default="qk_softmax,fused,sdpa_cudnn", help="the builds replayed whole (qk_softmax "
                    "first: the summary reads it; materialised adds the S boundary)")
    a = ap.parse_args()
    energy = Energy()
    rows = []
    print(json.dumps(dict(power_limit_w=energy.limit_w())), flush=True)
    with LoadLog("cuda") as log:
        rows.append(phase("idle", None, energy, log, a))
        # the floor's ceilings' work: measure_ceilings' 8192³ bf16 product, and 1 GiB copied by an elementwise kernel
        # (its copy_, captured in a graph, took a slower path: 2.71 TB/s in call 1)
        m = 8192
        x, y = (torch.randn(m, m, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        rows.append(phase("mm", lambda: torch.mm(x, y), energy, log, a, dict(flops=2 * m ** 3)))
        del x, y
        src = torch.randn(1 << 28, device="cuda")
        dst = torch.empty_like(src)
        rows.append(phase("copy", lambda: torch.mul(src, 1.0, out=dst), energy, log, a,
                          dict(bytes=2 * src.numel() * 4)))
        rows.append(phase("zero", lambda: dst.zero_(), energy, log, a, dict(bytes=dst.numel() * 4)))
        del src, dst
        for D in (int(d) for d in a.ds.split(",")):
            N = a.n
            B, H = 16384 // N, 2048 // D
            q, k, v = make_inputs(Case("qk_softmax", B, H, H, N, D, "bfloat16", False, "cuda"))
            shape = dict(D=D, N=N, B=B, H=H, qk_flops=2 * B * H * N * N * D, p_bytes=B * H * N * N * 2)
            _, _, P, o, (p_kernel, p_no_softmax, pv) = qk_parts(q, k, v, False)
            for name in a.builds.split(","):
                b = builds.get(name)
                rows.append(phase(name, lambda b=b: b.attend(q, k, v, causal=False), energy, log, a, shape))
            rows.append(phase("p_kernel", p_kernel, energy, log, a, shape))
            rows.append(phase("p_kernel-no_softmax", p_no_softmax, energy, log, a, shape))
            rows.append(phase("pv_kernel", pv, energy, log, a, shape))
            del P, o, q, k, v, p_kernel, p_no_softmax, pv  # the calls hold P too
            torch.cuda.empty_cache()
        rows.append(phase("idle", None, energy, log, a))
    ceil = model.measure_ceilings("cuda", torch.bfloat16)
    print(json.dumps(dict(ceilings={k: ceil[k] for k in ("tflops", "tbps", "copy_mhz", "matmul_mhz")})), flush=True)
    summarise(rows, ceil)


def dynamic_mj(row: dict, idle_w: float) -> float:
    """A phase's mJ a call above the card's idle draw: mJ − idle W × ms (W × ms = mJ)."""
    return row["mj"] - idle_w * row["ms"]


def summarise(rows, ceil):
    """The comparisons of the module's docstring, in mJ of dynamic energy (above idle) a call."""
    idle_w = min(r["watts"] for r in rows if r["phase"] == "idle")
    one = {r["phase"]: r for r in rows if "D" not in r and r["phase"] != "idle"}

    def dyn(r):
        return dynamic_mj(r, idle_w)

    j_flop = dyn(one["mm"]) / one["mm"]["flops"]
    j_copy = dyn(one["copy"]) / one["copy"]["bytes"]
    j_write = dyn(one["zero"]) / one["zero"]["bytes"]
    print(f"idle {idle_w:.0f} W; mm {j_flop * 1e12 / 1e3:.3f} pJ/FLOP dyn ({one['mm']['watts']:.0f} W, "
          f"{one['mm']['mhz']:.0f} MHz); copy {j_copy * 1e12 / 1e3:.1f} pJ/B ({one['copy']['watts']:.0f} W); "
          f"zero {j_write * 1e12 / 1e3:.1f} pJ/B ({one['zero']['watts']:.0f} W)")
    for D in sorted({r["D"] for r in rows if "D" in r}):
        by = {r["phase"]: r for r in rows if r.get("D") == D}
        qk, pk, pv = by["qk_softmax"], by["p_kernel"], by["pv_kernel"]
        f, b = qk["qk_flops"], qk["p_bytes"]
        print(f"D={D}: " + "; ".join(f"{n} {r['ms']:.3f} ms {r['mj']:.0f} mJ ({r['watts']:.0f} W, {r['mhz']:.0f} MHz)"
                                      for n, r in by.items()))
        unavoidable = 3 * f * j_flop + b * j_write + (dyn(pv) - f * j_flop)
        draw = qk["watts"] - idle_w  # the build's own dynamic draw at the cap, W = mJ/ms
        floor = qk_softmax_floor_ms(qk["B"], qk["H"], qk["N"], D, torch.bfloat16, False, ceil)
        print(f"  dyn mJ: build {dyn(qk):.0f} = P {dyn(pk):.0f} + PV {dyn(pv):.0f} ({dyn(pk) + dyn(pv):.0f}); "
              f"P kernel's parts 2·QKᵀ {2 * f * j_flop:.0f} + write {b * j_write:.0f} = "
              f"{2 * f * j_flop + b * j_write:.0f}; no_softmax {dyn(by['p_kernel-no_softmax']):.0f}")
        print(f"  floor {floor:.3f} ms, build {qk['ms'] / floor:.3f}x; unavoidable {unavoidable:.0f} mJ at "
              f"{draw:.0f} W = {unavoidable / draw:.3f} ms ({unavoidable / draw / floor:.3f}x the floor); "
              f"1.25x the floor allows {1.25 * floor * draw:.0f} mJ")


if __name__ == "__main__":
    main()
