"""A/B: the fused kernel of ab5adfe (session 2) against today's, same tiles (128×64 w8 s3), same process, alternating
three times per shape, so card drift hits both alike. GPU only:   python scripts/experiments/ab_fused.py

Why: sweep run 12 timed fused at D = 64 2.8–3.4 % slower than run 11 (same tiles at D = 64 non-causal) while the
library rows agreed (median 1.000); the kernel source had changed in between (refactor into helpers, K/V pointers
moved by a scalar offset, 276 loop instructions against 285 at D = 64). This A/B found that form 0.6–6.1 % slower
(ab_fused.log); the single-block loop then went back to per-row pointers, and the same A/B read 0.99–1.03×
(ab_fused2.log).
"""
import importlib.util
import itertools
from pathlib import Path

import torch
import triton
import triton.testing

from attnlab.measure import Case, make_inputs
from attnlab.triton import config, launch

spec = importlib.util.spec_from_file_location("fused_old", Path(__file__).with_name("fused_ab5adfe.py"))
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)

def run_old(q, k, v, causal):
    c = launch._prepare(q, k, v, causal, None, None, None)
    s = c.spec
    o = torch.empty_like(q)
    t = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    old.fused_kernel[(triton.cdiv(s.N, 128), s.B * s.H)](
        c.q, c.k, c.v, o, c.mask, c.k, c.v, *c.q.stride()[:3], *c.k.stride()[:3], *c.v.stride()[:3], *o.stride()[:3],
        *c.mask_strides, s.N, s.H, s.group, s.scale * config.LOG2E, config.LOG2E, 1.0 / s.N,
        MASK_KIND=0, NO_SOFTMAX=False, NO_PV=False, TMA=False, HEAVY_FIRST=False, **c.flags, **t)
    return o

def main():
    print("D causal N old_ms new_ms new/old", flush=True)
    for D, causal, N in itertools.product((64, 128), (False, True), (1024, 4096, 16384)):
        q, k, v = make_inputs(Case("fused", 16384 // N, 2048 // D, 2048 // D, N, D, "bfloat16", causal, "cuda"))
        with config.forced("fused", config.Tiles(128, 64, 8, 3)):
            torch.testing.assert_close(run_old(q, k, v, causal), launch.fused(q, k, v, causal=causal))
            t = {"old": [], "new": []}
            for _ in range(3):
                t["old"].append(triton.testing.do_bench(lambda: run_old(q, k, v, causal), warmup=50, rep=150,
                                                        return_mode="median"))
                t["new"].append(triton.testing.do_bench(lambda: launch.fused(q, k, v, causal=causal), warmup=50,
                                                        rep=150, return_mode="median"))
        o, n = min(t["old"]), min(t["new"])
        print(f"{D} {causal} {N} {o:.4f} {n:.4f} {n / o:.3f}  (old {t['old']}, new {t['new']})".replace(", ", ","),
              flush=True)


if __name__ == "__main__":
    main()
