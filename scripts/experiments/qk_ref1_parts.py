"""PERFORMANCE.md v31: where the time of a pass 1 against a fixed reference (Tiles.fixed_reference) goes. GPU (sm90)
only, bf16, FlashAttention's shapes, non-causal, one process:

    python scripts/experiments/qk_ref1_parts.py [--ns 4096] [--ds 128,64]

For each case, medians of CUDA-graph replays (gluon_fa3.timed) of: the table's Gluon P kernel alone (`g`), the same
with the fixed reference and its flags but no re-write (`gf`), the re-write alone over all-zero flags with the
Triton table entry's tiles (`repair_table`) and with launch.REPAIR_TILES (`repair_small`), and the whole of
launch.write_p with the fixed reference (`write_p_f`). Also how many rows random inputs flag (should be 0).
"""
import argparse
import math
from dataclasses import replace

import torch

from attnlab.triton import config, launch, qk_softmax_gluon
from gluon_fa3 import timed  # this script's directory is on sys.path when it runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="4096")
    ap.add_argument("--ds", default="128,64")
    a = ap.parse_args()
    print("parts D N what ms", flush=True)
    for D in map(int, a.ds.split(",")):
        for N in map(int, a.ns.split(",")):
            B, H = 16384 // N, 2048 // D
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            c = launch._prepare(q, k, v, False, None, None, None)
            p = torch.empty(B, H, N, N, device="cuda", dtype=torch.bfloat16)
            flags = torch.zeros(B * H * N, device="cuda", dtype=torch.int8)
            t_g = config.tiles("qk_softmax", q.device, D, False, q.dtype)
            t_f = replace(t_g, fixed_reference=True)
            kw = dict(N=N, H=H, group=1, qk_scale=config.LOG2E / math.sqrt(D), mask_scale=config.LOG2E, causal=False)

            def gluon(t, fl=None):
                return lambda: qk_softmax_gluon.launch(c.q, c.k, p, c.mask, c.mask_strides, 0, tiles=t, flags=fl, **kw)

            zero = torch.zeros_like(flags)
            spn = launch.row_stride(p, c.spec, "P")
            parts = dict(
                g=gluon(t_g), gf=gluon(t_f, flags),
                repair_table=lambda: launch._triton_p(c, p, spn, launch._lookup("qk_softmax", c.spec, gluon=False),
                                                      config.LOG2E, False, zero),
                repair_small=lambda: launch._triton_p(c, p, spn, launch.REPAIR_TILES, config.LOG2E, False, zero),
                write_p_f=lambda: launch.write_p(c, p, t_f))
            for what, fn in parts.items():
                print(f"parts {D} {N} {what} {timed(fn):.4f}", flush=True)
            gluon(t_f, flags)()
            torch.cuda.synchronize()
            print(f"parts {D} {N} flagged_rows {int(flags.sum().item())}", flush=True)


if __name__ == "__main__":
    main()
