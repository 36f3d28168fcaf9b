"""Session 12: how much the qk_softmax build's time moves between repeats in one process, against how much it moved
between benchmark runs (D = 128 non-causal N = 4096: 2.05 ms in session 11's bench, 2.22 in session 12's, the kernel's
PTX identical). GPU only:

    python scripts/experiments/qk_repeat.py [--reps 4] [--ns 4096,8192]

Each round times every case once with the benchmark's own timer (attnlab.bench.time_case: do_bench's median over
CUDA-graph replays), the table's tiles and, for D = 64 causal, the two-consumer kernel the table had before session
12 beside the one-consumer one it has now, so that drift over the rounds shows as drift and not as a difference
between kernels. bf16, FlashAttention's shapes (B·N = 16384, H·D = 2048). Prints `rep D causal N tiles ms floor_ratio`.
"""
import argparse

import torch

from attnlab import bench, model
from attnlab.measure import make_inputs, spin_up
from attnlab.triton import config
from attnlab.triton.resources import label, parse_tiles


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--ns", default="4096,8192")
    args = ap.parse_args()
    dev = torch.device("cuda")
    spin_up(dev, 1.0)
    ceil = model.measure_ceilings(dev, torch.bfloat16)
    print(f"ceilings {ceil}", flush=True)
    cases = []
    for N in (int(n) for n in args.ns.split(",")):
        for D, causal in ((128, False), (128, True), (64, False), (64, True)):
            table = config.tiles("qk_softmax", dev, D, causal, torch.bfloat16, N=N)
            cands = [table] + ([parse_tiles("64x128w4s3hg")] if (D, causal) == (64, True) else [])
            cases += [(D, causal, N, t) for t in cands]
    inputs = {}
    for rep in range(args.reps):
        for D, causal, N, t in cases:
            if (D, N) not in inputs:
                inputs[(D, N)] = make_inputs(bench._case("qk_softmax", bench.TOKENS // N, bench.WIDTH // D, N, D,
                                                         torch.bfloat16, causal))
            q, k, v = inputs[(D, N)]
            with config.forced("qk_softmax", t):
                timed = bench.time_case("qk_softmax", q, k, v, causal)
            floor = bench.qk_softmax_floor_ms(q.shape[0], q.shape[1], N, D, torch.bfloat16, causal, ceil)
            print(f"rep {rep} {D} {int(causal)} {N} {label(t)} {timed['ms']:.4f} {timed['ms'] / floor:.3f} "
                  f"{timed['status']}", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
