"""PERFORMANCE.md v41, Next 12: the energy of one call of the qk_softmax P kernel with the table's tiles and with
candidate tiles, at the same shape. On a card held at its power cap a kernel's time is its energy over the cap, so a
candidate pays only if it spends less energy a call. GPU only, bf16, non-causal, FlashAttention's shapes:

    python scripts/experiments/p_energy.py [--tiles 64x128w4s3gcf,64x128w4s3grc] [--ds 64,128] [--n 4096]

For each D: the table's tiles, each candidate, then the table's again (a control), each replayed in a CUDA graph for
--warm, then --seconds with NVML's energy counter read at both ends (energy_probe.phase); an idle phase first gives
the draw subtracted (dyn mJ = mJ − idle W × ms). Prints energy_probe's json rows, then a line per phase.
"""
import argparse

import torch

from attnlab.load import LoadLog
from attnlab.measure import Case, make_inputs
from attnlab.triton import config, launch
from attnlab.triton.resources import parse_tiles
from energy_probe import Energy, dynamic_mj, phase  # this script's directory is on sys.path when it runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", default="64x128w4s3gcf,64x128w4s3grc")
    ap.add_argument("--ds", default="64,128")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--warm", type=float, default=0.5)
    ap.add_argument("--calls", type=int, default=10)
    a = ap.parse_args()
    energy = Energy()
    rows = []
    with LoadLog("cuda") as log:
        idle = phase("idle", None, energy, log, a)
        for D in (int(d) for d in a.ds.split(",")):
            N = a.n
            B, H = 16384 // N, 2048 // D
            q, k, v = make_inputs(Case("qk_softmax", B, H, H, N, D, "bfloat16", False, "cuda"))
            c = launch._prepare(q, k, v, False, None, None, None)
            P = torch.empty(B, H, N, N, device="cuda", dtype=torch.bfloat16)
            table = config.tiles("qk_softmax", q.device, D, False, q.dtype, N=N)
            runs = [("table", table)] + [(x, parse_tiles(x)) for x in a.tiles.split(",")] + [("table again", table)]
            for name, t in runs:
                try:
                    rows.append(phase(f"D={D} {name}", lambda t=t: launch.write_p(c, P, t), energy, log, a))
                except Exception as e:  # noqa: BLE001 - one candidate that cannot run loses no other row
                    print(f"D={D} {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            del P
            torch.cuda.empty_cache()
    for r in rows:
        print(line(r, idle["watts"]), flush=True)


def line(row: dict, idle_w: float) -> str:
    """One phase's summary: ms a call, the energy a call above the idle draw (energy_probe.dynamic_mj), mean W,
    median MHz and the clock-event reasons."""
    return (f"{row['phase']}: {row['ms']:.4f} ms, {dynamic_mj(row, idle_w):.0f} dyn mJ, {row['watts']:.0f} W, "
            f"{row['mhz']:.0f} MHz, {row['reasons']}")


if __name__ == "__main__":
    main()
