"""Where a first call's seconds go when Triton's disk cache already holds the kernel (session 17: after
`python -m attnlab.warm`, the sweep's first calls of some builds still took 2–9 s).

    python scripts/experiments/cold_probe.py BUILD N D CAUSAL [--profile]

One case of FlashAttention's shapes (B·N = 16384, H·D = 2048, bf16): the first call timed (synced), the Triton cache
directory's entries counted before and after (new entries = something compiled), and with --profile the call under
cProfile, its 25 most expensive functions by cumulative time. Run it twice in a row: the second process finds the
first one's compiled kernels on disk."""
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch
import triton

from attnlab import builds, measure


def entries() -> int:
    d = Path(triton.knobs.cache.dir)  # Triton's cache directory, as attnlab.triton fixes it at import
    return len(list(d.iterdir())) if d.exists() else 0


def main() -> None:
    build, N, D, causal = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] in ("1", "True", "true")
    case = measure.Case(build, 16384 // N, 2048 // D, 2048 // D, N, D, "bfloat16", causal, "cuda")
    q, k, v = measure.make_inputs(case)
    torch.cuda.synchronize()
    before = entries()
    prof = cProfile.Profile() if "--profile" in sys.argv else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    builds.get(build).attend(q, k, v, causal=causal)
    torch.cuda.synchronize()
    if prof:
        prof.disable()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    builds.get(build).attend(q, k, v, causal=causal)
    torch.cuda.synchronize()
    second = time.perf_counter() - t0
    print(f"cold_probe {build} N={N} D={D} causal={causal}: first {first:.3f} s, second {second:.4f} s, "
          f"cache entries {before} -> {entries()}")
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
