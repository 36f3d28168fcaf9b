"""PERFORMANCE.md v8, step 2: the paired-rows loop inside the lab's `fused` kernel (masks, causal split, GQA and
ablations kept) against the single-block loop, per (D, causal, N), with and without heavy-first. GPU only:

    python scripts/experiments/paired_in_fused.py [--ns 1024,4096,16384]

Each candidate is checked against the fp64 oracle (attnlab.bench.oracle_check) before it is timed; timing is
triton.testing.do_bench's median (L2 flushed between repetitions), bf16, FlashAttention's shapes.
"""
import argparse
import itertools

import torch
import triton.testing

from attnlab import bench, builds
from attnlab.measure import Case, make_inputs
from attnlab.triton import config

CANDS = {64: ["128x64w8s3", "128x64w8s3p", "64x64w4s3p", "128x128w8s3p"],
         128: ["128x64w8s3", "128x64w8s3p", "128x64w8s3pt"]}


def main():
    from attnlab.triton.resources import parse_tiles

    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="1024,4096,16384")
    ap.add_argument("--ds", default="128,64")
    ap.add_argument("--causal", default="0,1", help="0, 1 or 0,1")
    ap.add_argument("--tiles", default=None, help="candidate labels (attnlab.triton.resources.parse_tiles), e.g. "
                                                  "128x64w8s3h,128x64w8s3hp; default: CANDS")
    ap.add_argument("--ablations", action="store_true", help="also time fused-no_pv and fused-no_softmax")
    args = ap.parse_args()
    print("D causal N tiles ms TF/s err/limit vs_first", flush=True)
    for D, causal, N in itertools.product((int(d) for d in args.ds.split(",")), (bool(int(c)) for c in args.causal.split(",")),
                                     (int(n) for n in args.ns.split(","))):
        case = Case("fused", 16384 // N, 2048 // D, 2048 // D, N, D, "bfloat16", causal, "cuda")
        q, k, v = make_inputs(case)
        flops = 4 * case.B * case.H * N * N * D / (2 if causal else 1)
        labels = CANDS[D] + ([t.replace("s3", "s3h") for t in CANDS[D][:2]] if causal else [])
        if args.tiles:
            labels = args.tiles.split(",")
        first = None
        for label in labels:
            t = parse_tiles(label)
            with config.forced("fused", t):
                try:
                    o = builds.get("fused").attend(q, k, v, causal=causal)
                    verdict = bench.oracle_check("fused", o, q, k, v, causal)
                    ms = triton.testing.do_bench(lambda: builds.get("fused").attend(q, k, v, causal=causal),
                                                 warmup=100, rep=200, return_mode="median")
                    first = first or ms
                    extra = ""
                    if args.ablations:
                        for abl in ("fused-no_pv", "fused-no_softmax"):
                            b = builds.get(abl)
                            b.attend(q, k, v, causal=causal)
                            a_ms = triton.testing.do_bench(lambda: b.attend(q, k, v, causal=causal), warmup=100,
                                                           rep=200, return_mode="median")
                            extra += f" {abl}={a_ms:.4f}"
                    print(f"{D} {causal} {N} {label} {ms:.4f} {flops / ms / 1e9:.0f} "
                          f"{verdict.err / verdict.limit:.2f}{'' if verdict.ok else ' FAILS'} {first / ms:.3f}{extra}",
                          flush=True)
                except Exception as e:  # noqa: BLE001 - out of shared memory etc.
                    print(f"{D} {causal} {N} {label} FAILED {type(e).__name__}: {str(e)[:150]}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
