"""PERFORMANCE.md v12: the qk_softmax build's Gluon kernel (attnlab.triton.qk_softmax_gluon) checked, then timed
against the Triton kernel in the same process (Triton candidates, labels without `g`, are checked and timed alike).
GPU (sm90) only:

    python scripts/experiments/qk_gluon.py [--check-only | --skip-check] [--ablations] [--ns 1024,4096,16384]
                                           [--tiles 64x128w4s3hg,...] [--part k/n] [--warm]

Accuracy first, twice:
  * P itself, written by the kernel into a NaN-poisoned (B, H, N, N) buffer (an element it never writes shows),
    against softmax(scale·QKᵀ + mask) computed in fp32 (the scores themselves under no_softmax);
  * O through the build's entry point (attnlab.triton.launch.qk_softmax, so the dispatch is exercised) against the
    fp64 oracle (attnlab.accuracy.judge), into a NaN-poisoned output.
Shapes: ragged N (8, 24, 136, 1000, 3000), N = 100 (not a multiple of 8), GQA, a (B, N, H, D) view, boolean masks
hiding whole rows (at N = 1024 their rows are 16-byte aligned, so TMA brings them: v30), additive masks varying over
the batch or over the heads, the no_softmax ablation, causal, and what a pass 1 against a fixed reference
(Tiles.fixed_reference) gets wrong for the Triton kernel to re-write: a first key tile hidden, finite scores far
below the rest in the first tile, scores 144 times as large. P is checked straight from the Gluon kernel at
every N (into a buffer laid out as the build's, launch.scores_buffer, whose rows TMA stores at N % 8 ≠ 0 too: v54),
its padding to the end of each row's last 16-byte vector included, which must hold 0 (v56: launch.padded_view);
through the build, N below qk_softmax_gluon.MIN_N runs the Triton kernel (each line says which ran).
Then medians of CUDA-graph replays (gluon_fa3.timed) at FlashAttention's shapes (B·N = 16384, H·D = 2048), bf16:
the whole build (P kernel + PV kernel, `build`: each candidate at every N, below MIN_N too) with the table's Triton
tiles and with each candidate, the PV kernel alone, and the build over the issue's floor
(attnlab.bench.qk_softmax_floor_ms at this run's measured ceilings).
"""
import argparse
import itertools
import math
import time

import torch

from attnlab import accuracy, model
from attnlab.bench import qk_softmax_floor_ms
from attnlab.triton import config, launch, qk_softmax_gluon
from attnlab.triton.resources import label, parse_tiles
from gluon_fa3 import candidate, case_inputs, timed  # this script's directory is on sys.path when it runs


def reference_p(q, k, causal, mask, scale, no_softmax):
    B, H, N, D = q.shape
    kk = k.repeat_interleave(H // k.shape[1], dim=1).float()
    s = q.float() @ kk.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    if no_softmax:
        return s.masked_fill(s == float("-inf"), 0.0)
    p = torch.softmax(s, dim=-1)
    return torch.nan_to_num(p, nan=0.0)  # rows the mask hides entirely: P = 0


def mine(key, part):
    """Whether this process takes the case group `key` under --part k/n (groups spread by a stable hash, so that n
    processes compile disjoint sets of kernels at once)."""
    k, n = part
    return sum(map(ord, repr(key))) % n == k


def check(tiles, part=(0, 1), ns=None, variant_ids=None):
    """The check at every shape and variant below, or (ns) only the shapes with these N, each variant (variant_ids:
    its indices in `variants`) at them in bf16."""
    bad = 0
    shapes = [(1, 2, 2, 8, 64), (2, 3, 3, 24, 64), (1, 4, 2, 136, 128), (1, 2, 2, 100, 128), (1, 8, 2, 1000, 64),
              (1, 4, 4, 3000, 128), (2, 16, 16, 1024, 128), (2, 4, 2, 256, 128), (1, 2, 2, 4096, 64),
              (4, 16, 8, 520, 64),  # 520: more items than SMs, an odd number of key tiles an item, GQA
              (8, 16, 8, 512, 64), (4, 16, 16, 512, 128),  # more items than SMs where a one-pass program
              # alternates two row buffers (qk_softmax_row.row_buffers)
              (1, 4, 2, 1001, 64), (1, 2, 2, 2999, 128)]  # N % 8 ≠ 0 through the build's Gluon kernels (v54)
    variants = [dict(), dict(ablation="no_softmax"), dict(mask="bool"), dict(mask="add"), dict(mask="add_heads"),
                dict(layout="bnhd"), dict(mask="bool_first"), dict(mask="first_low"), dict(scale=12.0)]
    if ns is not None:
        shapes = [x for x in shapes if x[3] in ns]
    if variant_ids is not None:
        variants = [variants[i] for i in variant_ids]
    variant_ns = (24, 100, 136, 520, 1000, 1024) if ns is None else ns
    for (B, H, Hkv, N, D), causal, dtype, var, t in itertools.product(
            shapes, (False, True), (torch.bfloat16, torch.float16), variants, tiles):
        # N = 1024: a boolean mask TMA can read (16-byte rows), so v30's 1-byte mask ring runs
        if var and (N not in variant_ns or dtype != torch.bfloat16) and not (N == 512 and var.get("ablation")):
            continue  # each variant is its own compile
        if not mine((D, causal, dtype, tuple(var.items())), part):
            continue
        q, k, v, mask = case_inputs(B, H, Hkv, N, D, dtype, var)
        ablation = var.get("ablation")
        no_softmax = ablation == "no_softmax"
        scale = 1 / math.sqrt(D)
        line = ""
        try:
            ok = True
            # P itself, straight from the kernel (Gluon's: below MIN_N too)
            c = launch._prepare(q, k, v, causal, mask, None, ablation)
            p = launch.scores_buffer(c.spec).fill_(float("nan"))
            # one-pass tiles (Tiles.one_pass) run as the build runs them: the two-pass kernel for masked calls and
            # rows too long to keep (qk_softmax_gluon.as_run)
            run = qk_softmax_gluon.as_run(t, c.mask if c.mask_kind else None, D, dtype.itemsize, N) if (
                t.one_pass) else t
            launch.write_p(c, p, run, no_softmax)
            line += "" if run == t else f"ran={label(run)} "
            torch.cuda.synchronize()
            ref = reference_p(q, k, causal, mask, scale, no_softmax)
            # 1 % of each element plus a floor: bf16 rounds to 0.4 %, and P's entries are ~1/N
            excess = (p.float() - ref).abs() - (1e-2 * ref.abs() + (1e-2 if no_softmax else 1e-5))
            worst = excess.nan_to_num(nan=float("inf")).max().item()
            nan_p = p.isnan().sum().item()
            # where rows end inside a 16-byte vector the PV kernel reads the vector's padding as it lies: it must be 0
            pad_p = (launch.padded_view(p, N)[..., N:] != 0).sum().item()
            ok = nan_p == 0 and worst <= 0 and pad_p == 0
            line += f"P worst_excess={worst:.3g} nan={nan_p} pad_nonzero={pad_p} "
            o = torch.full((B, H, N, D), float("nan"), device="cuda", dtype=dtype)
            with config.forced("qk_softmax", t):
                launch.qk_softmax(q, k, v, causal=causal, attn_mask=mask, ablation=ablation, out=o)
                spec = launch.check(q, k, v, causal=causal, attn_mask=mask)
                ran = "gluon" if launch._qk_softmax_tiles(spec).gluon else "triton"
            torch.cuda.synchronize()
            verdict = accuracy.judge(o, q, k, v, causal=causal, attn_mask=mask, ablation=ablation)
            ok = ok and verdict.ok and not o.isnan().any().item()
            line += f"O err={verdict.err:.3g} limit={verdict.limit:.3g} nan={o.isnan().sum().item()} ran={ran}"
        except Exception as e:  # noqa: BLE001
            ok, line = False, f"{type(e).__name__}: {str(e)[:300]}"
        bad += not ok
        if not ok or N in (100, 1000, 1001, 2999, 3000):
            print(f"check {'ok ' if ok else 'BAD'} B={B} H={H} Hkv={Hkv} N={N} D={D} causal={causal} {dtype} {var} "
                  f"{t} {line}", flush=True)
    print(f"check: {bad} bad", flush=True)
    return bad


def build(q, k, v, causal, t, ablation=None):
    """The qk_softmax build with tiles t (launch.qk_softmax_with), at any N: unlike the build's entry point, which
    sends N below qk_softmax_gluon.MIN_N to the Triton kernel, a Gluon candidate runs there too, so that the bound
    itself can be measured."""
    return launch.qk_softmax_with(launch._prepare(q, k, v, causal, None, None, ablation), t, ablation)


def bench(ns, ds, causals, labels, ablations=False, part=(0, 1), warm=False):
    """Under `warm`, each case runs once, untimed: n such processes at once (--part) fill Triton's on-disk cache, so
    the timing process that follows compiles nothing."""
    if not warm:
        ceil = model.measure_ceilings(torch.device("cuda"), torch.bfloat16)
        print(f"ceilings {ceil}", flush=True)
        print("D causal N what ms over_floor vs_triton", flush=True)
    for i, (D, causal, N) in enumerate(itertools.product(ds, causals, ns)):
        if i % part[1] != part[0]:
            continue
        B, H = 16384 // N, 2048 // D
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        if warm:
            for name in labels:
                t = config.tiles("qk_softmax", q.device, D, causal, q.dtype, N=N) if name == "current" else candidate(
                    name, causal)
                for ablation in (None, "no_softmax") if ablations else (None,):
                    try:
                        build(q, k, v, causal, t, ablation)
                    except Exception as e:  # noqa: BLE001
                        print(f"warm {D} {causal} {N} {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            torch.cuda.synchronize()
            continue
        floor = qk_softmax_floor_ms(B, H, N, D, torch.bfloat16, causal, ceil)
        c = launch._prepare(q, k, v, causal, None, None, None)
        P = torch.zeros(B, H, N, N, device="cuda", dtype=torch.bfloat16)
        res = {"pv": timed(lambda p=P: launch._pv(c, p, None, None))}
        del P
        table = config.tiles("qk_softmax", q.device, D, causal, q.dtype, gluon=False)
        for name in ["table"] + labels:  # `current`: the build's own P kernel tiles at this N (TABLE or SHORT)
            t = table if name == "table" else config.tiles("qk_softmax", q.device, D, causal, q.dtype, N=N) if (
                name == "current") else candidate(name, causal)
            try:
                o = build(q, k, v, causal, t)
                # the fp64 oracle on one batch and four heads: (1, 4, N, N) doubles, 8 GiB at N = 16384
                verdict = accuracy.judge(o[:1, :4], q[:1, :4], k[:1, :4], v[:1, :4], causal=causal)
                key = f"{name}{'' if verdict.ok else ' FAILS'}"
                res[key] = timed(lambda: build(q, k, v, causal, t))
                if ablations:  # P = S: pass 2 only, no exponentials (PERFORMANCE.md v12: are they hidden?)
                    res[f"{name} no_softmax"] = timed(lambda: build(q, k, v, causal, t, "no_softmax"))
            except Exception as e:  # noqa: BLE001
                print(f"{D} {causal} {N} {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        for what, ms in res.items():
            p_kernel = "" if what == "pv" else f" p_kernel={ms - res['pv']:.4f}"
            print(f"{D} {int(causal)} {N} {what} {ms:.4f} {ms / floor:.3f} {res.get('table', ms) / ms:.3f}{p_kernel}",
                  flush=True)
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="1024,4096,16384")
    ap.add_argument("--ds", default="128,64")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--tiles", default="64x128w4s3hg,64x128w4s2hg")
    ap.add_argument("--check-tiles", default="64x128w4s3hg")
    ap.add_argument("--check-ns", help="check only the shapes with these N (e.g. 1001,2999), every variant there")
    ap.add_argument("--check-variants", help="indices of the check's variants to run (0: none, 1: no_softmax, ...)")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--skip-check", action="store_true", help="time only (the kernels already checked)")
    ap.add_argument("--ablations", action="store_true", help="also time each candidate's no_softmax P kernel")
    ap.add_argument("--part", default="0/1", help="k/n: this process's share of the cases (run n at once)")
    ap.add_argument("--warm", action="store_true", help="compile the timed cases only (see bench)")
    args = ap.parse_args()
    part = tuple(int(x) for x in args.part.split("/"))
    t0 = time.time()
    ints = lambda x: None if x is None else [int(v) for v in x.split(",")]  # noqa: E731
    bad = 0 if args.skip_check else check([parse_tiles(x) for x in args.check_tiles.split(",")], part,
                                          ints(args.check_ns), ints(args.check_variants))
    print(f"check wall {time.time() - t0:.0f} s", flush=True)
    if bad or args.check_only:
        return
    bench([int(n) for n in args.ns.split(",")], [int(d) for d in args.ds.split(",")],
          [bool(int(c)) for c in args.causal.split(",")], args.tiles.split(","), args.ablations, part, args.warm)
    print(f"wall {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
