"""PERFORMANCE.md v41: the energy of the table's P kernel and of the pass-1-ahead P kernel (attnlab.triton.
qk_softmax_ahead) at the same shape, to read why they tie. GPU only, bf16, non-causal, FlashAttention's shapes:

    python scripts/experiments/ahead_energy.py [--n 4096] [--seconds 1.5]

Each P kernel is replayed in a CUDA graph for --warm, then --seconds with NVML's energy counter read at both ends
(energy_probe.phase); an idle phase first. Prints energy_probe's json rows, then ms, dynamic mJ (above idle), W and MHz.
"""
import argparse

import torch

from attnlab.load import LoadLog
from attnlab.measure import Case, make_inputs
from attnlab.triton import config, launch
from attnlab.triton.resources import parse_tiles
from energy_probe import Energy, phase  # this script's directory is on sys.path when it runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--warm", type=float, default=0.5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--n", type=int, default=4096)
    a = ap.parse_args()
    energy = Energy()
    rows = []
    with LoadLog("cuda") as log:
        idle = phase("idle", None, energy, log, a)
        for D, ahead in ((64, "64x128w4s3gcj"), (128, "64x128w4s2gcj")):
            N = a.n
            B, H = 16384 // N, 2048 // D
            q, k, v = make_inputs(Case("qk_softmax", B, H, H, N, D, "bfloat16", False, "cuda"))
            c = launch._prepare(q, k, v, False, None, None, None)
            P = torch.empty(B, H, N, N, device="cuda", dtype=torch.bfloat16)
            table = config.tiles("qk_softmax", q.device, D, False, q.dtype, N=N)
            for name, t in (("table", table), ("ahead", parse_tiles(ahead)), ("table again", table)):
                rows.append(phase(f"D={D} {name}", lambda t=t: launch.write_p(c, P, t), energy, log, a))
            del P
            torch.cuda.empty_cache()
    idle_w = idle["watts"]
    for r in rows:
        print(f"{r['phase']}: {r['ms']:.4f} ms, {r['mj'] - idle_w * r['ms']:.0f} dyn mJ, {r['watts']:.0f} W, "
              f"{r['mhz']:.0f} MHz, {r['reasons']}", flush=True)


if __name__ == "__main__":
    main()
