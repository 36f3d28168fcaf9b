"""PERFORMANCE.md v32: the PV kernel in Gluon (attnlab.triton.pv_gluon) checked, then timed against the Triton PV
kernel in one process. GPU (sm90) only:

    python scripts/experiments/pv_gluon.py [--check-only | --skip-check] [--part k/n] [--tiles 64x128w4s3g,...]
                                           [--ns 512,1024,4096,16384] [--ds 128,64] [--causal 0,1]
(--ds picks the head dims of the check and of the timing.)

Check: for each candidate, O of the PV stage (launch._pv, the builds' own entry, so the dispatch is exercised) from a
real softmax P into a NaN-poisoned output, against P·V in fp64 from the same P (no_pv: Σ_n P[:, n]·n/N), next to the
Triton kernel's error on the same P: ragged N (8, 200, 1000, 3000), N = 1020 (not a multiple of 8: P's rows padded to
lines as the builds' are, so the Gluon kernel runs there too since v54; the line says which ran), GQA, V as a strided (B, N, H, D) view, causal, fp16 and bf16. A case fails when an
element is NaN or the error exceeds twice the Triton kernel's plus a quarter of the dtype's epsilon (of O's largest
element). --part k/n: this process's share of the check's cases (by (D, causal, dtype), so that n processes compile
disjoint kernels at once).
Timing: medians of CUDA-graph replays (gluon_fa3.timed) at FlashAttention's shapes (B·N = 16384, H·D = 2048), bf16:
the PV kernel alone on the qk_softmax kernel's P, the Triton table entry and each candidate; P's read at the run's
copy rate (half of P under a causal mask); then the qk_softmax build with each PV kernel, and over its floor.
"""
import argparse
import itertools
import math

import torch

from attnlab import model
from attnlab.bench import qk_softmax_floor_ms
from attnlab.triton import config, launch, pv_gluon
from attnlab.triton.resources import label, parse_tiles
from attnlab.validate import check as check_args
from gluon_fa3 import qk_parts, timed  # this script's directory is on sys.path when it runs

EPS = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def softmax_p(q, k, causal):
    """A real P: softmax(QKᵀ/√D) in fp32 with the causal mask, rounded to q's dtype (GQA: k repeated), in the builds'
    own buffer (launch.scores_buffer: rows on 128-byte lines, which TMA reads at any N), its padding vector past N 0
    as every writer of P leaves it (v56: the Triton PV kernel reads that vector as it lies; before session 33 this P
    left it as torch.empty gave it, and at N = 1020 the Triton baseline came out NaN)."""
    B, H, N, D = q.shape
    kk = k.repeat_interleave(H // k.shape[1], dim=1)
    s = (q.float() @ kk.float().transpose(-1, -2)) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    p = launch.scores_buffer(check_args(q, k, k))
    launch.padded_view(p, N)[..., N:].zero_()  # the columns the kernels run on to (none where N fills whole vectors)
    return p.copy_(torch.softmax(s, dim=-1))


def reference(p, v, no_pv):
    B, H, N, _ = p.shape
    if no_pv:
        n = torch.arange(N, device=p.device, dtype=torch.float64) / N
        return (p.double() * n).sum(-1, keepdim=True).expand(B, H, N, v.shape[-1])
    return p.double() @ v.repeat_interleave(H // v.shape[1], dim=1).double()


def triton_entry(D, causal, dtype):
    """The table's Triton PV tiles for the case (the baseline, whatever the table's Gluon entries say)."""
    return config.lookup("pv", "sm90", D, causal, dtype.itemsize, gluon=False)


def passes(err: float, triton_err: float, scale: float, dtype) -> bool:
    """The check's rule for one output: finite, and within twice the Triton kernel's error on the same P plus a
    quarter of the dtype's epsilon of O's largest element."""
    return math.isfinite(err) and err <= 2 * triton_err + EPS[dtype] * scale / 4


def check(cands, part=(0, 1), ds=(64, 128)) -> int:
    bad = 0
    cases = [(N, D, causal, dtype, hkv, strided, no_pv)
             for N, D, causal, dtype in itertools.product((8, 200, 1000, 1020, 3000), ds, (False, True),
                                                          (torch.bfloat16, torch.float16))
             for hkv, strided, no_pv in ((4, False, False), (2, True, False), (4, False, True))]
    print("check tiles N D causal dtype Hkv strided_v no_pv kernel err triton_err verdict", flush=True)
    for N, D, causal, dtype, hkv, strided, no_pv in cases:
        if sum(map(ord, repr((D, causal, str(dtype))))) % part[1] != part[0]:
            continue
        g = torch.Generator(device="cuda").manual_seed(N * 7 + D)
        q = torch.randn(2, 4, N, D, device="cuda", dtype=dtype, generator=g)
        k = torch.randn(2, hkv, N, D, device="cuda", dtype=dtype, generator=g)
        if strided:
            v = torch.randn(2, N, hkv, D, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
        else:
            v = torch.randn(2, hkv, N, D, device="cuda", dtype=dtype, generator=g)
        p = softmax_p(q, k, causal)
        ref = reference(p, v, no_pv)
        scale = ref.abs().max().item()
        ablation = "no_pv" if no_pv else None
        c = launch._prepare(q, k, v, causal, None, None, ablation)
        with config.forced("pv", triton_entry(D, causal, dtype)):
            base = launch._pv(c, p, ablation, None)
        torch.cuda.synchronize()
        triton_err = (base.double() - ref).abs().max().item()
        for t in cands:
            with config.forced("pv", t):
                ran = "gluon" if launch._pv_tiles(c.spec).gluon else "triton"
                out = torch.full_like(q, float("nan"))
                launch._pv(c, p, ablation, out)
            torch.cuda.synchronize()
            err = (out.double() - ref).abs().max().item()
            ok = passes(err, triton_err, scale, dtype)
            bad += not ok
            print(f"check {label(t)} {N} {D} {int(causal)} {str(dtype)[6:]} {hkv} {int(strided)} {int(no_pv)} {ran} "
                  f"{err:.3e} {triton_err:.3e} {'ok' if ok else 'BAD'}", flush=True)
    print(f"check: {bad} bad", flush=True)
    return bad


def bench(cands, ns, ds, causals):
    dev = torch.device("cuda")
    ceil = model.measure_ceilings(dev, torch.bfloat16)
    print(f"ceilings: {ceil['tflops']:.1f} TF/s, {ceil['tbps']:.3f} TB/s", flush=True)
    print("time D causal N what ms vs_triton", flush=True)
    for D, causal, N in itertools.product(ds, causals, ns):
        B, H = 16384 // N, 2048 // D
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        _, _, p, o, (p_kernel, _, pv) = qk_parts(q, k, v, causal)
        p_kernel()  # the qk_softmax kernel's P, which the PV kernels read
        read = B * H * N * N * 2 / (2 if causal else 1)
        print(f"time {D} {int(causal)} {N} P_read_at_copy_rate {read / ceil['tbps'] / 1e9:.4f}", flush=True)
        floor = qk_softmax_floor_ms(B, H, N, D, torch.bfloat16, causal, ceil)
        pv_ms, build_ms = {}, {}
        for t in [None] + cands:
            name = "triton_table" if t is None else label(t)
            with config.forced("pv", t or triton_entry(D, causal, torch.bfloat16)):
                pv_ms[name] = timed(pv)  # _pv looks its tiles up at each call: the forced ones
                build_ms[name] = timed(lambda: launch.qk_softmax(q, k, v, causal=causal))
            print(f"time {D} {int(causal)} {N} pv_{name} {pv_ms[name]:.4f} {pv_ms['triton_table'] / pv_ms[name]:.3f}",
                  flush=True)
            print(f"time {D} {int(causal)} {N} build_{name} {build_ms[name]:.4f} "
                  f"{build_ms['triton_table'] / build_ms[name]:.3f} over_floor {build_ms[name] / floor:.3f}",
                  flush=True)
        del q, k, v, p, o, p_kernel, pv  # the calls hold P too
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", default="64x128w4s3hg,64x128w4s2hg,64x128w4s2hgu")
    ap.add_argument("--ns", default="512,1024,4096,16384")
    ap.add_argument("--ds", default="128,64")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--part", default="0/1", help="k/n: this process's share of the check's cases (run n at once)")
    a = ap.parse_args()
    cands = [parse_tiles(x) for x in a.tiles.split(",")]
    if not all(t.gluon for t in cands):
        raise SystemExit("--tiles: Gluon candidates only (labels with g); the table's Triton entry runs beside them")
    ds = [int(x) for x in a.ds.split(",")]  # the check's head dims too (a D = 64-only candidate, v58)
    bad = 0 if a.skip_check else check(cands, tuple(int(x) for x in a.part.split("/")), ds)
    if not a.check_only:
        bench(cands, [int(x) for x in a.ns.split(",")], ds,
              [bool(int(x)) for x in a.causal.split(",")])
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
