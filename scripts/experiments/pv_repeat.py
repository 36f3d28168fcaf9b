"""PERFORMANCE.md v47: one case of pv_gluon.py's check, repeated, to tell a race from a wrong kernel. The no_pv
ablation of 128x64w4s3gcuy failed it twice at N = 3000, D = 128, causal, fp16 (errors 1.7e-3 and 1.2e-3 where the
Triton kernel's is 2.4e-4) while 128x64w4s3gcu, compiled to the same PTX, passed once. GPU (sm90) only:

    python scripts/experiments/pv_repeat.py [--tiles 128x64w4s3gcu,...] [--reps 30]
"""
import argparse

import torch

from attnlab.triton import config, launch
from attnlab.triton.resources import parse_tiles
from pv_gluon import passes, reference, softmax_p, triton_entry  # this script's directory is on sys.path when it runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", default="128x64w4s3gcu,128x64w4s3gcuy,128x64w4s4gc,128x64w4s4gcy")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--n", type=int, default=3000)
    a = ap.parse_args()
    N, D, dtype = a.n, 128, torch.float16
    g = torch.Generator(device="cuda").manual_seed(N * 7 + D)
    q = torch.randn(2, 4, N, D, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(2, 4, N, D, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(2, 4, N, D, device="cuda", dtype=dtype, generator=g)
    p = softmax_p(q, k, True)
    for no_pv in (True, False):
        ablation = "no_pv" if no_pv else None
        ref = reference(p, v, no_pv)
        scale = ref.abs().max().item()
        c = launch._prepare(q, k, v, True, None, None, ablation)
        with config.forced("pv", triton_entry(D, True, dtype)):
            base = launch._pv(c, p, ablation, None)
        torch.cuda.synchronize()
        triton_err = (base.double() - ref).abs().max().item()
        for lab in a.tiles.split(","):
            errs = []
            with config.forced("pv", parse_tiles(lab)):
                for _ in range(a.reps):
                    out = torch.full_like(q, float("nan"))
                    launch._pv(c, p, ablation, out)
                    torch.cuda.synchronize()
                    errs.append((out.double() - ref).abs().max().item())
            bad = sum(not passes(e, triton_err, scale, dtype) for e in errs)
            print(f"repeat {lab} N={N} no_pv={int(no_pv)} reps={a.reps} bad={bad} err_min={min(errs):.3e} "
                  f"err_max={max(errs):.3e} triton_err={triton_err:.3e}", flush=True)


if __name__ == "__main__":
    main()
