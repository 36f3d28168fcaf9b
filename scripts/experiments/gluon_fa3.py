"""PERFORMANCE.md v9: the Gluon kernel (attnlab.triton.fused_gluon) against the fp64 oracle, then timed against our
Triton fused kernel and the SDPA backends in the same process. GPU (sm90) only:

    python scripts/experiments/gluon_fa3.py [--check-only] [--ns 1024,4096,16384] [--tiles 128x128w8s2,...]

Accuracy first, on fresh random inputs at awkward shapes (N = 1, 17, 100, 129, 1000, 3000; GQA; fp16 and bf16; a
NaN-poisoned output so an unwritten element shows); then medians of CUDA-graph replays (triton.testing.do_bench_cudagraph) at
FlashAttention's shapes (B·N = 16384, H·D = 2048), bf16.
"""
import argparse
import itertools
import time

import torch
import triton.testing

from attnlab import bench, builds
from attnlab.triton import fused_gluon
from attnlab.triton.config import LOG2E
from attnlab.triton.resources import parse_tiles


def run_gluon(q, k, v, causal, t, out=None):
    """`t` is a Tiles (the v9 kernel) or ("ws" | "ws-nopp", Tiles) for the v10 warp-specialised kernel."""
    B, H, N, D = q.shape
    o = torch.empty_like(q) if out is None else out
    kw = dict(N=N, H=H, group=H // k.shape[1], qk_scale=D ** -0.5 * LOG2E, causal=causal)
    if isinstance(t, tuple):
        fused_gluon.launch_ws(q, k, v, o, tiles=t[1], pingpong=t[0] == "ws", **kw)
    else:
        fused_gluon.launch(q, k, v, o, tiles=t, **kw)
    return o


def parse(label, causal=True):
    """'128x128w8s2h' → Tiles (v9 kernel); 'ws:64x128w4s2h' or 'ws-nopp:…' → the v10 kernel ('h' dropped when not
    causal)."""
    kind, _, tl = label.rpartition(":")
    t = parse_tiles(tl if causal else tl.replace("h", ""))
    return (kind, t) if kind else t


def check(tiles):
    bad = 0
    cases = [(1, 2, 2, 1, 64), (2, 3, 3, 17, 64), (1, 4, 2, 100, 128), (2, 2, 2, 129, 128), (1, 8, 2, 1000, 64),
             (1, 4, 4, 3000, 128), (2, 16, 16, 1024, 128), (1, 16, 4, 2048, 64), (1, 2, 1, 4096, 128)]
    for (B, H, Hkv, N, D), causal, dtype, t in itertools.product(cases, (False, True), (torch.bfloat16, torch.float16),
                                                                 tiles):
        g = torch.Generator(device="cuda").manual_seed(N * 7 + D)
        q = torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=g)
        k = torch.randn(B, Hkv, N, D, device="cuda", dtype=dtype, generator=g)
        v = torch.randn(B, Hkv, N, D, device="cuda", dtype=dtype, generator=g)
        o = torch.full_like(q, float("nan"))
        try:
            run_gluon(q, k, v, causal, t, out=o)
            torch.cuda.synchronize()
            verdict = bench.oracle_check("fused", o, q, k, v, causal)
            ok = verdict.ok and not o.isnan().any().item()
            line = f"err={verdict.err:.3g} limit={verdict.limit:.3g} nan={o.isnan().sum().item()}"
        except Exception as e:  # noqa: BLE001
            ok, line = False, f"{type(e).__name__}: {str(e)[:300]}"
        bad += not ok
        if not ok or (N in (129, 3000) and D == 128 and causal):
            print(f"check {'ok ' if ok else 'BAD'} B={B} H={H} Hkv={Hkv} N={N} D={D} causal={causal} {dtype} "
                  f"{t} {line}", flush=True)
    print(f"check: {bad} bad", flush=True)
    return bad


def timed(fn):
    """Median ms of CUDA-graph replays (host launch cost out of the picture; L2 not flushed), after a spin-up."""
    for _ in range(20):
        fn()
    return triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median")


def bench_all(ns, ds, tiles_by_d, causals):
    print("D causal N what ms TF/s vs_triton vs_cudnn", flush=True)
    for D, causal, N in itertools.product(ds, causals, ns):
        B, H = 16384 // N, 2048 // D
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        flops = 4 * B * H * N * N * D / (2 if causal else 1)
        res = {}
        for name in ("fused", "sdpa_cudnn", "sdpa_flash"):
            b = builds.get(name)
            b.attend(q, k, v, causal=causal)
            res[name] = timed(lambda: b.attend(q, k, v, causal=causal))
        for label in tiles_by_d[D]:
            t = parse(label, causal)
            try:
                o = run_gluon(q, k, v, causal, t)
                verdict = bench.oracle_check("fused", o, q, k, v, causal)
                ms = timed(lambda: run_gluon(q, k, v, causal, t))
                res[f"gluon {label}{'' if verdict.ok else ' FAILS'}"] = ms
            except Exception as e:  # noqa: BLE001
                print(f"{D} {causal} {N} gluon {label}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        for what, ms in res.items():
            print(f"{D} {int(causal)} {N} {what} {ms:.4f} {flops / ms / 1e9:.0f} {res['fused'] / ms:.3f} "
                  f"{res['sdpa_cudnn'] / ms:.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="1024,4096,16384")
    ap.add_argument("--ds", default="128,64")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--tiles128", default="128x128w8s2h,128x64w8s3h,128x128w8s3h,128x64w8s4h")
    ap.add_argument("--tiles64", default="128x128w8s2h,128x64w8s3h,128x64w8s4h")
    ap.add_argument("--check-tiles", default="128x128w8s2,128x64w8s3h")
    ap.add_argument("--check-only", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    bad = check([parse(x) for x in args.check_tiles.split(",")])
    print(f"check wall {time.time() - t0:.0f} s", flush=True)
    if bad or args.check_only:
        return
    bench_all([int(n) for n in args.ns.split(",")], [int(d) for d in args.ds.split(",")],
              {128: args.tiles128.split(","), 64: args.tiles64.split(",")},
              [bool(int(c)) for c in args.causal.split(",")])
    print(f"wall {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
