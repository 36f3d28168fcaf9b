"""PERFORMANCE.md v46: does P's row stride set the P kernel's write rate? The qk_softmax P kernel (the table's tiles)
writing into the contiguous (B, H, N, N) P against a view of a buffer whose rows are `pad` elements longer (the same
N² elements written, rows no longer a power of two bytes apart), and TMA stores of P's 64 × 128 boxes alone in both
layouts (tma_store_rate's kernel). With --pv also the table's PV kernel reading each layout. Session 28 ran it at
N = 3000, whose 6000-byte rows are not 128-byte aligned (call 1, before v51: then the Triton PV kernel took
contiguous rows only, so the causal cells, which run it, timed the contiguous P alone). GPU (sm90) only:

    python scripts/experiments/p_pad.py [--ns 4096,16384] [--pads 64,136] [--pv]
"""
import argparse

import torch
import triton

import tma_store_rate  # this script's directory is on sys.path when it runs
from attnlab.triton import launch
from attnlab.triton.fused_gluon import descriptor
from stream_rates import ms_of as _ms_of


def ms_of(fn):
    return _ms_of(fn, warmup=100, rep=200)  # the warm-up and repetitions call 4 ran with


def padded(B, H, N, pad, dtype):
    return torch.empty(B, H, N, N + pad, device="cuda", dtype=dtype)[..., :N]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="4096,16384")
    ap.add_argument("--ds", default="64,128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--pads", default="64,136")
    ap.add_argument("--pv", action="store_true", help="also time the PV kernel reading each layout")
    args = ap.parse_args()
    pads = [0] + [int(p) for p in args.pads.split(",")]
    for D in (int(d) for d in args.ds.split(",")):
        for N in (int(n) for n in args.ns.split(",")):
            B, H = 16384 // N, 2048 // D
            gb = B * H * N * N * 2 / 1e9
            for pad in pads:
                p = padded(B, H, N, pad, torch.bfloat16)
                d = descriptor(p, 64, 128)
                t = ms_of(lambda: tma_store_rate._fill[(triton.cdiv(N, 128), B * H)](d, N, BLOCK_M=64, BLOCK_N=128,
                                                                                     BUFS=2, num_warps=4))
                print(f"D={D} N={N} pad={pad} tma_P_boxes ms={t:.4f} TB/s={gb / t:.3f}", flush=True)
                del p
            for causal in (bool(int(c)) for c in args.causal.split(",")):
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
                c = launch._prepare(q, k, k, causal, None, None, None)
                chosen = launch._qk_softmax_tiles(c.spec)
                ps = {pad: padded(B, H, N, pad, torch.bfloat16) for pad in pads}
                launch.write_p(c, ps[0], chosen)
                for pad in pads[1:]:  # the same P in either layout
                    launch.write_p(c, ps[pad], chosen)
                    assert torch.equal(ps[pad], ps[0]), (D, N, causal, pad)
                for rnd in range(2):
                    order = pads if rnd == 0 else pads[::-1]
                    for pad in order:
                        t = ms_of(lambda: launch.write_p(c, ps[pad], chosen))
                        print(f"D={D} N={N} causal={int(causal)} round={rnd} pad={pad} p_kernel ms={t:.4f} "
                              f"TB/s={gb / t:.3f} tiles={chosen}", flush=True)
                if args.pv:
                    pv_tiles = launch._pv_tiles(c.spec)
                    o0 = launch._pv(c, ps[0], None, None)
                    for pad in pads:
                        assert torch.equal(launch._pv(c, ps[pad], None, None), o0), (D, N, causal, pad)
                        t = ms_of(lambda: launch._pv(c, ps[pad], None, None))
                        print(f"D={D} N={N} causal={int(causal)} pad={pad} pv_kernel ms={t:.4f} "
                              f"TB/s={gb / t:.3f} tiles={pv_tiles}", flush=True)
                del ps, q, k, c
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
