"""Measures the two kernel changes that PERFORMANCE.md left pending (GPU only, ~1 minute):

  v6  heavy-first launch order for causal `fused`: table tiles with and without `heavy_first`
  v7  the pipelined no_pv stand-in: causal and non-causal `*-no_pv` against their bases

    python scripts/experiments/pending_v6_v7.py
Timing: triton.testing.do_bench median (L2 flushed between repetitions), bf16, FlashAttention's shapes.
"""
import dataclasses
import itertools

import torch
import triton.testing

from attnlab import builds
from attnlab.measure import Case, make_inputs
from attnlab.triton import config


def bench(name, q, k, v, causal):
    b = builds.get(name)
    b.attend(q, k, v, causal=causal)
    return triton.testing.do_bench(lambda: b.attend(q, k, v, causal=causal), warmup=100, rep=200, return_mode="median")


def inputs(N, D, causal):
    return make_inputs(Case("fused", 16384 // N, 2048 // D, 2048 // D, N, D, "bfloat16", causal, "cuda"))


def main():
    dev = torch.device("cuda")
    print("v6: D N fused_ms heavy_first_ms ratio", flush=True)
    for D, N in itertools.product((64, 128), (1024, 4096, 16384)):
        q, k, v = inputs(N, D, True)
        t = config.tiles("fused", dev, D, True, torch.bfloat16)
        with config.forced("fused", dataclasses.replace(t, heavy_first=False)):  # the table has it on since v6
            base = bench("fused", q, k, v, True)
        with config.forced("fused", dataclasses.replace(t, heavy_first=True)):
            hf = bench("fused", q, k, v, True)
        print(f"v6 {D} {N} {base:.4f} {hf:.4f} {base / hf:.3f}", flush=True)
    print("v7: D causal build base_ms no_pv_ms saving_ms", flush=True)
    for D, causal in itertools.product((64, 128), (False, True)):
        q, k, v = inputs(4096, D, causal)
        for name in ("fused", "qk_softmax", "materialised"):
            base = bench(name, q, k, v, causal)
            nopv = bench(f"{name}-no_pv", q, k, v, causal)
            print(f"v7 {D} {causal} {name} {base:.4f} {nopv:.4f} {base - nopv:+.4f}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
