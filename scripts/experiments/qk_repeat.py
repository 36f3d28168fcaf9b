"""Session 12: how much the qk_softmax build's time moves between repeats in one process, against how much it moved
between benchmark runs (D = 128 non-causal N = 4096: 2.05 ms in session 11's bench, 2.22 in session 12's, the kernel's
PTX identical). GPU only:

    python scripts/experiments/qk_repeat.py [--reps 4] [--ns 4096,8192]

Each round times every case once with the benchmark's own timer (attnlab.bench.time_case: do_bench's median over
CUDA-graph replays), the table's tiles and, for D = 64 causal, the two-consumer kernel the table had before session
12 beside the one-consumer one it has now, so that drift over the rounds shows as drift and not as a difference
between kernels. bf16, FlashAttention's shapes (B·N = 16384, H·D = 2048). Prints
`rep D causal N tiles ms floor_ratio`.

`--pools K` (written in session 12, not yet run) asks where a round's difference comes from: each case captured in K
CUDA graphs at once, each with its own memory pool (so P lies in K places), then each graph timed in turn, --reps
rounds. A spread between graphs that repeats round after round is placement; one that moves with the round is
drift. Prints `pool D causal N graph round ms`.
"""
import argparse

import torch

from attnlab import bench, model
from attnlab.measure import make_inputs, spin_up
from attnlab.triton import config
from attnlab.triton.resources import label, parse_tiles


def inputs(N: int, D: int):
    """q, k, v of the benchmark's case at N and D (B·N = 16384, H·D = 2048), bf16."""
    return make_inputs(bench._case("qk_softmax", bench.TOKENS // N, bench.WIDTH // D, N, D, torch.bfloat16, False))


def pools(dev, k: int, reps: int, ns):
    """The table's qk_softmax build at D = 128 non-causal (the widest spread), captured in k graphs at once and timed
    graph by graph for `reps` rounds."""
    import triton.testing

    from attnlab import builds
    from attnlab.measure import graphed

    b = builds.get("qk_softmax")
    for N in ns:
        q, k_, v = inputs(N, 128)
        graphs: list = []
        runs = [graphed(lambda: b.attend(q, k_, v), dev, graphs)[0] for _ in range(k)]
        for rnd in range(reps):
            for i, run in enumerate(runs):
                ms = triton.testing.do_bench(run, warmup=100, rep=100, return_mode="median")
                print(f"pool 128 0 {N} {i} {rnd} {ms:.4f}", flush=True)
        del runs, graphs
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--ns", default="4096,8192")
    ap.add_argument("--pools", type=int, default=0, help="K graphs of one case instead (see the module's text)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    spin_up(dev, 1.0)
    if args.pools:
        return pools(dev, args.pools, args.reps, [int(n) for n in args.ns.split(",")])
    ceil = model.measure_ceilings(dev, torch.bfloat16)
    print(f"ceilings {ceil}", flush=True)
    cases = []
    for N in (int(n) for n in args.ns.split(",")):
        for D, causal in ((128, False), (128, True), (64, False), (64, True)):
            table = config.tiles("qk_softmax", dev, D, causal, torch.bfloat16, N=N)
            cands = [table] + ([parse_tiles("64x128w4s3hg")] if (D, causal) == (64, True) else [])
            cases += [(D, causal, N, t) for t in cands]
    made = {}
    for rep in range(args.reps):
        for D, causal, N, t in cases:
            if (D, N) not in made:
                made[(D, N)] = inputs(N, D)
            q, k, v = made[(D, N)]
            with config.forced("qk_softmax", t):
                timed = bench.time_case("qk_softmax", q, k, v, causal)
            floor = bench.qk_softmax_floor_ms(q.shape[0], q.shape[1], N, D, torch.bfloat16, causal, ceil)
            print(f"rep {rep} {D} {int(causal)} {N} {label(t)} {timed['ms']:.4f} {timed['ms'] / floor:.3f} "
                  f"{timed['status']}", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
