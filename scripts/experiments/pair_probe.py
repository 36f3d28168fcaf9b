"""PERFORMANCE.md v37 (session 20): what a two-kernel qk_softmax build can reach at each cell of issue 5's bench,
against cuBLAS doing the least such a build must do. GPU only:

    python scripts/experiments/pair_probe.py [--ns 512,...,16384] [--ds 128,64] [--causal 0,1]
                                             [--pv-tiles 64x64w4s3,128x64w8s3,...]

Every qk_softmax build writes P from a kernel that computes at least one QKᵀ, and reads it back in a kernel that
computes PV. cuBLAS's pair with nothing else (S = QKᵀ written in the dtype by torch.matmul, then O = S V read back)
does that least in a library's kernels: where even it lies above 1.25× the issue's floor, that cell is not for a
two-kernel build to reach by a cheaper softmax (a reference, not a proof: another kernel could beat cuBLAS's; v37
found it above 1.25 in no non-causal cell). Beside it, per cell (FlashAttention's shapes, B·N = 16384,
H·D = 2048, bf16): the build, its P kernel alone (the build's own tiles), the P kernel under no_softmax (one pass,
S written: the build's pass 2 without exponentials), its PV kernel alone (gluon_fa3.qk_parts gives the three),
P's write alone (`zero_`), each over the issue's floor
(attnlab.bench.qk_softmax_floor_ms at this run's ceilings). --pv-tiles: PV kernel candidates timed on the same P
(the table's is `pv`), for the short-N question: is the PV kernel's excess there its tiles or the shape's?

Medians of CUDA-graph replays (gluon_fa3.timed). Under a causal mask cuBLAS computes and reads the whole of S, the
build only the lower half: its pair is then not a bound, only a reference.
"""
import argparse
import itertools
import time

import torch

from attnlab import model
from attnlab.bench import qk_softmax_floor_ms
from attnlab.triton import config, launch
from attnlab.triton.resources import label, parse_tiles
from gluon_fa3 import qk_parts, timed  # this script's directory is on sys.path when it runs


def cell(D, causal, N, pv_tiles, ceil):
    B, H = 16384 // N, 2048 // D
    dt = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(N + D)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt, generator=g) for _ in range(3))
    floor = qk_softmax_floor_ms(B, H, N, D, dt, causal, ceil)
    _, chosen, P, o, (p_kernel, p_no_softmax, pv) = qk_parts(q, k, v, causal)
    kt = k.transpose(-1, -2)
    res = {
        "build": timed(lambda: launch.qk_softmax(q, k, v, causal=causal)),
        "p_kernel": timed(p_kernel),
        "p_no_softmax": timed(p_no_softmax),
    }
    p_kernel()  # a real P for the PV timings
    res["pv"] = timed(pv)
    for lab in pv_tiles:
        t = parse_tiles(lab)
        try:
            with config.forced("pv", t):
                res[f"pv {lab}"] = timed(pv)  # _pv looks its tiles up at each call: the forced ones
        except Exception as e:  # noqa: BLE001
            print(f"{D} {int(causal)} {N} pv {lab}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    res["zero_P"] = timed(lambda: P.zero_())
    res["cublas_qk"] = timed(lambda: torch.matmul(q, kt, out=P))
    res["cublas_pv"] = timed(lambda: torch.matmul(P, v, out=o))
    res["cublas_pair"] = timed(lambda: (torch.matmul(q, kt, out=P), torch.matmul(P, v, out=o)))
    print(f"case D={D} causal={int(causal)} N={N} B={B} H={H} floor={floor:.4f} tiles={label(chosen)}", flush=True)
    for what, ms in res.items():
        print(f"{D} {int(causal)} {N} {what} {ms:.4f} {ms / floor:.3f}", flush=True)
    del P, q, k, v, o, p_kernel, p_no_softmax, pv  # the calls hold P too
    torch.cuda.empty_cache()
    return floor, res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--ds", default="128,64")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--pv-tiles", default="")
    args = ap.parse_args()
    t0 = time.time()
    ceil = model.measure_ceilings(torch.device("cuda"), torch.bfloat16)
    print(f"ceilings {ceil}", flush=True)
    print("D causal N what ms over_floor", flush=True)
    rows = []
    for D, causal, N in itertools.product([int(d) for d in args.ds.split(",")],
                                          [bool(int(x)) for x in args.causal.split(",")],
                                          [int(n) for n in args.ns.split(",")]):
        try:
            floor, res = cell(D, causal, N, [x for x in args.pv_tiles.split(",") if x], ceil)
            rows.append((D, causal, N, floor, res))
        except Exception as e:  # noqa: BLE001  (a failed cell never loses the rows already printed)
            print(f"{D} {int(causal)} {N}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    print("summary D causal N | build pair(cublas) p_kernel p_no_softmax pv zero_P | over floor", flush=True)
    for D, causal, N, floor, r in rows:
        print(f"summary {D} {int(causal)} {N} | " + " ".join(
            f"{r[w] / floor:.3f}" for w in ("build", "cublas_pair", "p_kernel", "p_no_softmax", "pv", "zero_P")),
            flush=True)
    print(f"wall {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
