"""Cases for Nsight Compute (PERFORMANCE.md v19): each runs once to compile, then once between
cudaProfilerStart/Stop, so that `ncu --profile-from-start off` profiles exactly one call of each build.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \
        python3 scripts/experiments/ncu_cases.py [0,2]   (scripts/h200.sh's ncu_profile and ncu_source steps;
                                                          the optional argument picks cases by index)

Cases (bf16, FlashAttention's shapes B·N = 16384, H·D = 2048):
  qk_softmax D = 128 and 64, N = 4096, non-causal — its P kernel (Gluon) and PV kernel (Triton): where the 1.3–1.5×
      over the floor goes;
  fused and sdpa_cudnn, D = 128, N = 512 causal and N = 4096 non-causal — the small-N gap against the steady state;
  fused at D = 128 N = 512 causal with the persistent kernel's tiles forced (64x128w4s2hgmc: PERFORMANCE.md v18–v20,
      slower than one item a program under a causal mask for a reason not yet measured) — case 6; the same with O
      stored by TMA (64x128w4s2hgmco, v22: still behind at N = 512) — case 7; one consumer a program, two programs an
      SM (64x64w4s2hgmu, v23) — case 8.
"""
import contextlib
import sys

import torch

from attnlab import builds
from attnlab.measure import Case, make_inputs
from attnlab.triton import config
from attnlab.triton.resources import parse_tiles

CASES = [("qk_softmax", 128, 4096, False, None), ("qk_softmax", 64, 4096, False, None),
         ("fused", 128, 512, True, None), ("sdpa_cudnn", 128, 512, True, None),
         ("fused", 128, 4096, False, None), ("sdpa_cudnn", 128, 4096, False, None),
         ("fused", 128, 512, True, "64x128w4s2hgmc"), ("fused", 128, 512, True, "64x128w4s2hgmco"),
         ("fused", 128, 512, True, "64x64w4s2hgmu"),
         ("qk_softmax-zero_mask", 128, 4096, False, None), ("fused-zero_mask", 128, 4096, False, None)]
# (build, D, N, causal, fused tiles forced or None: the table). Cases 9 and 10 (PERFORMANCE.md v30): the zero_mask
# ablations at D = 128 N = 4096, its mask by TMA in both kernels, 2.1× qk_softmax's time and 1.24× fused's.


def main() -> int:
    picked = [CASES[int(i)] for i in sys.argv[1].split(",")] if len(sys.argv) > 1 else CASES
    for name, D, N, causal, label in picked:
        q, k, v = make_inputs(Case(name, 16384 // N, 2048 // D, 2048 // D, N, D, "bfloat16", causal, "cuda"))
        b = builds.get(name)
        with config.forced("fused", parse_tiles(label)) if label else contextlib.nullcontext():
            b.attend(q, k, v, causal=causal)  # compile
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            b.attend(q, k, v, causal=causal)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        print(f"case {name} D={D} N={N} causal={causal} tiles={label or 'table'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
