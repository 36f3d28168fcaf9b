"""PERFORMANCE.md v53: the split-row P kernel (attnlab.triton.qk_softmax_split, Tiles.split_row) checked, then timed
against the build's own tiles in the same process. GPU (sm90) only:

    python scripts/experiments/split_probe.py [--tiles 64x128w4s2gk] [--check-only | --skip-check]
                                              [--ns 2048,4096,8192,16384] [--ds 64,128]

The check: P straight from the kernel into a NaN-poisoned buffer against softmax in fp32 (qk_gluon.reference_p, its
tolerance), S under no_softmax, and O through the build with the tiles forced (the fp64 oracle), at shapes that
give groups of 1 to 17 programs (N = 8 … 8200, ragged last key tiles and row blocks, GQA, a last rank holding fewer
tiles than the others), bf16 and fp16; each launch's group counters say whether a wait gave up (timed_out). A causal
or masked call through the build runs the two-pass kernel (as_run), which the line reports.
The timing: medians of CUDA-graph replays (gluon_fa3.timed) at FlashAttention's shapes (B·N = 16384, H·D = 2048),
bf16, non-causal: the build with the table's tiles (`current`) and with each candidate, the P kernel alone (build −
PV), the no_softmax ablation's P kernel, and the build over the issue's floor.
"""
import argparse
import math

import torch

from attnlab import accuracy, model
from attnlab.bench import qk_softmax_floor_ms
from attnlab.triton import config, launch, qk_softmax_split
from attnlab.triton.resources import label, parse_tiles
from gluon_fa3 import case_inputs, timed  # this script's directory is on sys.path when it runs
from qk_gluon import build, reference_p

SHAPES = [(1, 2, 2, 8, 64), (2, 3, 3, 24, 64), (1, 4, 2, 136, 128), (1, 8, 2, 1000, 64), (1, 4, 4, 3000, 128),
          (4, 16, 8, 520, 64), (2, 16, 16, 1024, 128), (1, 4, 4, 4096, 64), (1, 2, 2, 8200, 128),
          (1, 2, 1, 8200, 64)]


def check(t, part=(0, 1)):
    bad = 0
    for (B, H, Hkv, N, D) in SHAPES[part[0]::part[1]]:
        for dtype in (torch.bfloat16, torch.float16):
            for no_softmax in (False, True):
                q, k, v, _ = case_inputs(B, H, Hkv, N, D, dtype, {})
                scale = 1 / math.sqrt(D)
                c = launch._prepare(q, k, v, False, None, None, "no_softmax" if no_softmax else None)
                p = launch.scores_buffer(c.spec).fill_(float("nan"))
                log_scale = 1.0 if no_softmax else 1 / math.log(2)
                count = qk_softmax_split.launch(c.q, c.k, p, N=N, H=H, group=H // Hkv, qk_scale=scale * log_scale,
                                                causal=False, tiles=t, no_softmax=no_softmax)
                torch.cuda.synchronize()
                G, seg, groups = qk_softmax_split.plan(t, N, D, q.element_size(), torch.cuda.get_device_properties(
                    0).multi_processor_count)
                ref = reference_p(q, k, False, None, scale, no_softmax)
                excess = (p.float() - ref).abs() - (1e-2 * ref.abs() + (1e-2 if no_softmax else 1e-5))
                worst = excess.nan_to_num(nan=float("inf")).max().item()
                nan_p = p.isnan().sum().item()
                gave_up = qk_softmax_split.timed_out(count)
                ok = nan_p == 0 and worst <= 0 and not gave_up
                line = f"G={G} seg={seg} groups={groups} P worst_excess={worst:.3g} nan={nan_p} timed_out={gave_up}"
                for causal in (False, True):
                    o = torch.full((B, H, N, D), float("nan"), device="cuda", dtype=dtype)
                    ablation = "no_softmax" if no_softmax else None
                    with config.forced("qk_softmax", t):
                        launch.qk_softmax(q, k, v, causal=causal, ablation=ablation, out=o)
                        ran = label(launch._qk_softmax_tiles(launch.check(q, k, v, causal=causal)))
                    torch.cuda.synchronize()
                    verdict = accuracy.judge(o, q, k, v, causal=causal, ablation=ablation)
                    ok = ok and verdict.ok and not o.isnan().any().item()
                    line += f" | causal={int(causal)} O err={verdict.err:.3g} limit={verdict.limit:.3g} ran={ran}"
                bad += not ok
                print(f"check {'ok ' if ok else 'BAD'} B={B} H={H} Hkv={Hkv} N={N} D={D} {dtype} "
                      f"no_softmax={int(no_softmax)} {label(t)} {line}", flush=True)
                del p, ref, excess
                torch.cuda.empty_cache()
    print(f"check: {bad} bad", flush=True)
    return bad


def bench(ns, ds, labels, warm=False, part=(0, 1)):
    """Under `warm`, each case runs once, untimed (this process's share, --part): processes at once fill Triton's
    on-disk cache, so the timing process after them compiles nothing."""
    if not warm:
        ceil = model.measure_ceilings(torch.device("cuda"), torch.bfloat16)
        print(f"ceilings {ceil}", flush=True)
        print("D N what ms over_floor vs_current p_kernel", flush=True)
    for i, (D, N) in enumerate((D, N) for D in ds for N in ns):
        if i % part[1] != part[0]:
            continue
        B, H = 16384 // N, 2048 // D
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        if warm:
            for name in ["current"] + labels:
                t = config.tiles("qk_softmax", q.device, D, False, q.dtype, N=N) if name == "current" else (
                    parse_tiles(name))
                for ablation in (None, "no_softmax"):
                    build(q, k, v, False, t, ablation)
            torch.cuda.synchronize()
            continue
        floor = qk_softmax_floor_ms(B, H, N, D, torch.bfloat16, False, ceil)
        c = launch._prepare(q, k, v, False, None, None, None)
        P = torch.zeros(B, H, N, N, device="cuda", dtype=torch.bfloat16)
        pv = timed(lambda p=P: launch._pv(c, p, None, None))
        del P
        res = {}
        for name in ["current"] + labels:
            t = config.tiles("qk_softmax", q.device, D, False, q.dtype, N=N) if name == "current" else (
                parse_tiles(name))
            try:
                o = build(q, k, v, False, t)
                verdict = accuracy.judge(o[:1, :4], q[:1, :4], k[:1, :4], v[:1, :4], causal=False)
                key = f"{name}{'' if verdict.ok else ' FAILS'}"
                res[key] = timed(lambda: build(q, k, v, False, t))
                res[f"{key} no_softmax"] = timed(lambda: build(q, k, v, False, t, "no_softmax"))
            except Exception as e:  # noqa: BLE001
                print(f"{D} {N} {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
        print(f"{D} {N} pv {pv:.4f}", flush=True)
        for what, ms in res.items():
            print(f"{D} {N} {what} {ms:.4f} {ms / floor:.3f} {res.get('current', ms) / ms:.3f} "
                  f"{ms - pv:.4f}", flush=True)
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", default="64x128w4s2gk")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--ns", default="2048,4096,8192,16384")
    ap.add_argument("--ds", default="64,128")
    ap.add_argument("--part", default="0/1", help="k/n: this process's share of the check's shapes or the warm cases")
    ap.add_argument("--warm", action="store_true", help="run the timed cases once each, untimed (see bench)")
    a = ap.parse_args()
    labels = a.tiles.split(",")
    part = tuple(int(x) for x in a.part.split("/"))
    if not a.skip_check:
        for name in labels:
            check(parse_tiles(name), part)
    if not a.check_only:
        bench([int(n) for n in a.ns.split(",")], [int(d) for d in a.ds.split(",")], labels, a.warm, part)


if __name__ == "__main__":
    main()
