"""Kernel benchmark: our builds against FlashAttention-2 (sdpa_flash), cuDNN (sdpa_cudnn) and compiled FlexAttention.

    attnlab bench [--quick] [--repeats K] [--out DIR]   FlashAttention's convention: B·N = 16384, H·D = 2048
    attnlab bench --autotune [--out DIR]                re-run the sweep that chose attnlab.triton.plan's tiles
    attnlab bench --read DIR                            print a finished bench's tables again from its bench.csv

Each case: the first call timed alone (compile), then triton.testing.do_bench's median (device events, L2 flushed
between repetitions) over replays of a CUDA graph of the call (the sweep's timer; the row's `timer` says when a call
could not be captured and was timed eagerly; with --repeats K, K graphs captured afresh, their medians' median and
range in ms, ms_min, ms_max). TF/s count 4·B·H·N²·D FLOPs, halved for causal. Our builds are checked
against the fp64 oracle at every benchmarked shape (FlashAttention's accuracy rule, on a slice of B·H when the
oracle would be too large). Each row also carries its build's peak allocation (a pass of its own after timing, as
the sweep measures it) and, for compiled FlexAttention, whether anything compiled while it was timed. `qk_softmax`
is also set against its floor: P written once and read once at the run's measured copy bandwidth, plus QKᵀ at the
run's measured matmul rate. It prints the ratios of every shape, then `summary`: the targets' table at FlashAttention's
shapes, its targets counted, the untuned shapes apart.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

from attnlab import cost
from attnlab.ceilings import measure_ceilings
from attnlab.telemetry import LoadLog
from attnlab.measure import TOKENS, WIDTH, bench_case, make_inputs, oracle_check, spin_up, time_case

BUILDS = ("fused", "qk_softmax", "materialised", "sdpa_flash", "sdpa_cudnn", "flex")
LIBRARY = ("sdpa_flash", "sdpa_cudnn", "flex")


HEAD_NS = (1024, 4096)  # the sequence lengths of the head-count axis


def shapes(dtypes, ns, quick=False, heads=(), odd_ns=()):
    """(B, H, N, D, dtype, causal) in FlashAttention's convention, plus shapes nobody tunes for: B = 1, H = 64,
    N = 8192, D = 128 and N = 3000 (unless quick); N that are not powers of two (`odd_ns`, at FlashAttention's
    B·N and H·D); and a head-count axis (`heads`: B = 1, H = each, at HEAD_NS), where a call is a few hundred µs
    of GPU work or less and a small grid leaves SMs idle."""
    out = [(TOKENS // n, WIDTH // d, n, d, dt, c)
           for dt, d, c, n in itertools.product(dtypes, (64, 128), (False, True), ns)]
    if not quick:
        out += [(1, 64, 8192, 128, dt, c) for dt in dtypes for c in (False, True)]
        out += [(TOKENS // 3000, WIDTH // d, 3000, d, dt, c) for dt in dtypes for d in (64, 128) for c in (False, True)]
    out += [(max(1, TOKENS // n), WIDTH // d, n, d, dt, c)
            for dt, d, c, n in itertools.product(dtypes, (64, 128), (False, True), odd_ns) if n != 3000 or quick]
    out += [(1, h, n, d, dt, c) for dt, d, c, h, n in itertools.product(dtypes, (64, 128), (False, True), heads,
                                                                         HEAD_NS)]
    return out


def qk_softmax_floor_ms(B, H, N, D, dtype, causal, ceil, Hkv=None):
    """P written once and read once at the copy bandwidth, plus one QKᵀ at the matmul rate (the issue's floor).

    The bytes are the model's P round trip (attnlab.cost.boundary_bytes): the read is the lower half when causal."""
    return qk_softmax_floor_parts(B, H, N, D, dtype, causal, ceil, Hkv)["floor_ms"]


def qk_softmax_floor_parts(B, H, N, D, dtype, causal, ceil, Hkv=None) -> dict:
    """The floor (floor_ms), its two terms (floor_p_ms: P's round trip at the copy rate; floor_qk_ms: one QKᵀ at the
    matmul rate) and, beside them, qkvo_ms: Q, K, V read and O written once at the copy rate, which the floor leaves
    out."""
    from attnlab import cost as bd

    name = str(dtype).removeprefix("torch.")
    p_ms = bd.ms_at(bd.boundary_bytes("P round trip", B, H, N, name, causal), ceil["tbps"])
    qk_ms = bd.ms_at(bd.qk_pass_flops(B, H, N, D, causal), ceil["tflops"])
    return dict(floor_ms=p_ms + qk_ms, floor_p_ms=p_ms, floor_qk_ms=qk_ms,
                qkvo_ms=bd.ms_at(bd.qkvo_bytes(B, H, Hkv or H, N, D, name), ceil["tbps"]))


def recorded_label(tiles_json, kernel: str) -> str:
    """The tile label (attnlab.triton.resources.label, e.g. 64x128w4s2hgmco) of `kernel`'s tiles in a row's recorded
    tiles; '' where the row records none, or tiles of fields this version no longer has."""
    from attnlab.schema import recorded_tiles
    from attnlab.triton.config import Tiles
    from attnlab.triton.resources import label

    try:
        recorded = recorded_tiles(tiles_json)[kernel]
        # a row of older code may record a flag Tiles no longer has: off, it changes nothing; on, the label is unknown
        gone = {k: v for k, v in recorded.items() if k not in Tiles.__dataclass_fields__}
        if any(gone.values()):
            return ""
        return label(Tiles(**{k: v for k, v in recorded.items() if k not in gone}))
    except (TypeError, ValueError, KeyError):
        return ""


def run(args) -> "pandas.DataFrame":  # noqa: F821
    import pandas as pd

    dtypes = [getattr(torch, d) for d in args.dtypes]
    ns, names = args.ns, args.builds
    ceilings = {}
    if "qk_softmax" in names:  # its floor is stated against this run's measured ceilings
        ceilings = {dt: measure_ceilings(torch.device("cuda"), dt) for dt in dtypes}
        print("ceilings:", {str(k): v for k, v in ceilings.items()}, flush=True)
    rows = []
    spin_up(torch.device("cuda"), 1.0)
    with LoadLog("cuda") as load:  # each row's clock, power and clock-event reasons while it was timed
        for B, H, N, D, dtype, causal in shapes(dtypes, ns, args.quick, args.heads or (), args.odd_ns or ()):
            bench_shape(B, H, N, D, dtype, causal, names, ceilings.get(dtype), args, load, rows)
            if args.out:
                pd.DataFrame(rows).to_csv(os.path.join(args.out, "bench.csv"), index=False)
    return pd.DataFrame(rows)


def shape_label(dtype, D, causal, N, B, H, Hkv) -> str:
    """One shape as the bench's progress lines and summary name it; Hkv only where it differs from H (GQA)."""
    return f"{dtype} D={D} causal={causal} N={N} B={B} H={H}" + (f" Hkv={Hkv}" if Hkv != H else "")


def bench_shape(B, H, N, D, dtype, causal, names, ceil, args, load, rows: list) -> None:
    """Every build of `names` at one shape, each row appended to `rows` as it is measured (ceil: the dtype's
    ceilings, for qk_softmax's floor)."""
    from attnlab.builds import OURS
    from attnlab.triton import launch
    from attnlab.validate import check

    Hkv = H // args.group
    shape = bench_case("fused", B, H, N, D, dtype, causal, Hkv=Hkv)
    q, k, v = make_inputs(shape)  # the harness's inputs: random normal, seeded by the shape
    spec = check(q, k, v, causal=causal)
    flops = cost.flops(shape)
    for name in names:
        timed = time_case(name, q, k, v, causal, args.repeats, load)
        o, ms = timed.pop("o"), timed["ms"]
        row = dict(build=name, B=B, H=H, Hkv=Hkv, N=N, D=D, dtype=str(dtype).removeprefix("torch."), causal=causal,
                   repeats=args.repeats, **timed, tflops=flops / ms / 1e9 if ms == ms else float("nan"))
        if name in OURS:
            row["tiles"] = json.dumps(launch.tile_config(name, spec))
            if o is not None:
                verdict = oracle_check(name, o, q, k, v, causal)
                row.update(err=verdict.err, err_limit=verdict.limit, accurate=verdict.ok)
        if name == "qk_softmax":
            row.update(qk_softmax_floor_parts(B, H, N, D, dtype, causal, ceil, Hkv))
        rows.append(row)
        del o
    del q, k, v
    torch.cuda.empty_cache()
    print(f"  {shape_label(dtype, D, causal, N, B, H, Hkv)}: " + ", ".join(
        f"{r['build']} {r['tflops']:.0f}" for r in rows[-len(names):]), flush=True)


def ratios(df):
    """Each of our builds over each library row, per shape: time ratio library_ms / ours_ms (> 1: ours is faster);
    which kernel (Gluon or Triton) wrote fused's O and qk_softmax's P; qk_softmax over its floor; each build's median
    SM clock while it was timed, where the rows have it."""
    import pandas as pd

    from attnlab.builds import OURS
    from attnlab.schema import kernel_label

    key = ["dtype", "D", "causal", "N", "B", "H"] + (["Hkv"] if "Hkv" in df else [])  # benches before --group: none
    ms = df.pivot_table(index=key, columns="build", values="ms")
    tf = df.pivot_table(index=key, columns="build", values="tflops")
    out = pd.DataFrame(index=ms.index)
    if "tiles" in df:  # the Gluon kernel (sm90, 16-bit, some D and N) or the Triton one, from the row's tiles,
        # and its tile label (the rules' tiles can change with N: attnlab.triton.plan): fused's kernel, qk_softmax's P
        # kernel and the PV kernel it shares with materialised
        for ours, kernel in (("fused", "fused"), ("qk_softmax", "qk_softmax"), ("qk_softmax", "pv")):
            rows = df[df.build == ours].set_index(key)
            if len(rows):
                out[f"{kernel}_kernel"] = [kernel_label(rows.tiles.get(i), kernel) if i in rows.index else ""
                                           for i in out.index]
                out[f"{kernel}_tiles"] = [recorded_label(rows.tiles.get(i), kernel) if i in rows.index else ""
                                          for i in out.index]
    for name in BUILDS:  # the bench's order: ours fused first, then the libraries
        if name in tf:
            out[f"{name}_TFs"] = tf[name]
    if "sm_clock_mhz" in df:  # the clock each build ran at (attnlab.telemetry): under a power cap, builds differ in it
        mhz = df.pivot_table(index=key, columns="build", values="sm_clock_mhz")
        for name in BUILDS:
            if name in mhz:
                out[f"{name}_MHz"] = mhz[name]
    for ours in (b for b in BUILDS if b in OURS):
        for lib in LIBRARY:
            if ours in ms and lib in ms:
                out[f"{ours}_vs_{lib}"] = ms[lib] / ms[ours]
    if "eager_ms" in df and df["eager_ms"].notna().any():  # the same ratio as a user calling from Python meets it
        eager = df.pivot_table(index=key, columns="build", values="eager_ms")
        for ours in (b for b in BUILDS if b in OURS and b in eager):
            for lib in (b for b in LIBRARY if b in eager):
                out[f"{ours}_vs_{lib}_eager"] = eager[lib] / eager[ours]
    qks = df[df.build == "qk_softmax"].set_index(key)
    if "floor_ms" in qks:
        out["qk_softmax_over_floor"] = qks["ms"] / qks["floor_ms"]
        if "repeats" in qks and (qks["repeats"] > 1).any():  # the range over the graphs (--repeats)
            out["qk_softmax_over_floor_min"] = qks["ms_min"] / qks["floor_ms"]
            out["qk_softmax_over_floor_max"] = qks["ms_max"] / qks["floor_ms"]
        if "qkvo_ms" in qks:  # the least qk / floor any qk_softmax could reach at the copy rate
            out["qk_softmax_bytes_over_floor"] = (qks["floor_p_ms"] + qks["qkvo_ms"]) / qks["floor_ms"]
    return out


# the benchmark's view of a ratios table: (column, heading) in the order printed, then its targets
SUMMARY = (("fused_TFs", "fused TF/s"), ("fused_vs_sdpa_flash", "fused / flash"),
           ("fused_vs_sdpa_cudnn", "fused / cuDNN"), ("fused_vs_flex", "fused / flex"),
           ("qk_softmax_vs_sdpa_flash", "qk / flash"), ("qk_softmax_vs_sdpa_cudnn", "qk / cuDNN"),
           ("materialised_vs_sdpa_flash", "mat / flash"), ("materialised_vs_sdpa_cudnn", "mat / cuDNN"),
           ("qk_softmax_over_floor", "qk / floor"), ("qk_softmax_bytes_over_floor", "bytes / floor"),
           ("fused_MHz", "fused MHz"), ("qk_softmax_MHz", "qk MHz"),
           ("sdpa_cudnn_MHz", "cuDNN MHz"))


def summary(r) -> str:
    """The ratios table (`ratios`) as the targets read it: at FlashAttention's shapes one line per (dtype, D, causal)
    with each column of SUMMARY across N; the targets (fused ≥ FA2, fused ≥ 0.9× cuDNN, qk_softmax ≤ 1.25× its
    floor) counted there; the shapes nobody tunes for apart."""
    flat = r.reset_index()
    fa = flat[(flat.B * flat.N == TOKENS) & (flat.H * flat.D == WIDTH)]
    cols = [(c, head) for c, head in SUMMARY if c in flat]
    ns = sorted(fa.N.unique())
    lines = [f"FlashAttention's shapes (B·N = {TOKENS}, H·D = {WIDTH}), N = {', '.join(map(str, ns))}; ratios are "
             "library time / ours (> 1: ours faster), qk / floor is ours / floor, bytes / floor the least any "
             "qk_softmax could reach: P's round trip and Q, K, V, O at the copy rate, QKᵀ wholly hidden under them",
             "| dtype | D | causal | " + " | ".join(head for _, head in cols) + " |",
             "|---" * (3 + len(cols)) + "|"]
    for (dtype, D, causal), g in fa.groupby(["dtype", "D", "causal"]):
        g = g.set_index("N").reindex(ns)
        cells = [" ".join("—" if v != v else f"{v:.0f}" if c.endswith(("_TFs", "_MHz")) else f"{v:.2f}" for v in g[c])
                 for c, _ in cols]
        lines.append(f"| {dtype} | {D} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")

    def count(what, values, ok, largest=False):
        values = values.dropna()
        if len(values):
            extreme = f"largest {values.max():.3f}" if largest else f"smallest {values.min():.3f}"
            lines.append(f"{what}: {int(ok(values).sum())} of {len(values)} ({extreme})")

    if "fused_vs_sdpa_flash" in fa:
        count("fused ≥ 1.0× sdpa_flash at N ≥ 1024", fa[fa.N >= 1024].fused_vs_sdpa_flash, lambda v: v >= 1.0)
    if "fused_vs_sdpa_cudnn" in fa:
        count("fused ≥ 0.9× sdpa_cudnn", fa.fused_vs_sdpa_cudnn, lambda v: v >= 0.9)
    if "qk_softmax_over_floor" in fa:
        count("qk_softmax ≤ 1.25× its floor", fa.qk_softmax_over_floor, lambda v: v <= 1.25)
        if "qk_softmax_over_floor_min" in fa:  # --repeats: the same count at each case's fastest graph
            count("  at each case's fastest graph", fa.qk_softmax_over_floor_min, lambda v: v <= 1.25)
        if "qk_softmax_bytes_over_floor" in fa:  # where 1.25 cannot be met: P's round trip and Q, K, V, O alone
            count("  cells whose bytes alone (P round trip + Q, K, V, O at the copy rate) are ≤ 1.25× the floor",
                  fa.qk_softmax_bytes_over_floor, lambda v: v <= 1.25, largest=True)
    other = flat.drop(fa.index)
    if len(other):
        lines.append("Shapes nobody tunes for:")
        for _, row in other.iterrows():
            where = shape_label(row["dtype"], row.D, row.causal, row.N, row.B, row.H, row.get("Hkv", row.H))
            lines.append(f"  {where}: " + ", ".join(
                f"{head} {row[c]:.0f}" if c.endswith(("_TFs", "_MHz")) else f"{head} {row[c]:.2f}" for c, head in cols))
    return "\n".join(lines)


LINE_MIN_N = 2048  # below it other tiles write P (the one-pass kernel to N = 1024: attnlab.triton.plan) and read it


def floor_lines(df) -> str:
    """qk_softmax against its floor as a line (attnlab.report.lines, x = floor_ms) through its rows at
    FlashAttention's shapes from N = LINE_MIN_N: `slope` is the build over its floor in the limit of long rows,
    `fixed` the milliseconds that do not grow with N, beside the time Q, K, V and O's bytes take at the run's copy
    rate (the floor leaves them out; '—' for rows written before they were recorded). '' where no group has three
    such rows."""
    from attnlab.report import lines

    if "floor_ms" not in df or "status" not in df:
        return ""
    t = lines.fit(df, ["qk_softmax"], "floor_ms", min_n=LINE_MIN_N)
    if not len(t):
        return ""
    qk = df[(df.build == "qk_softmax") & (df.B * df.N == TOKENS) & (df.H * df.D == WIDTH)]
    out = [f"qk_softmax as a line through its N ≥ {LINE_MIN_N} rows, ms = fixed + slope × floor (at these shapes the "
           "floor grows as N, Q, K, V and O's bytes do not): slope is qk / floor at long N, fixed what does not grow",
           "| dtype | D | causal | slope | fixed ms | Q, K, V, O at copy rate, ms | worst residual % | rows |",
           "|---|---|---|---|---|---|---|---|"]
    for r in t.itertuples():
        g = qk[(qk.dtype == r.dtype) & (qk.D == r.D) & (qk.causal == r.causal)]
        qkvo = g["qkvo_ms"].median() if "qkvo_ms" in g else float("nan")
        out.append(f"| {r.dtype} | {r.D} | {'yes' if r.causal else 'no'} | {r.slope:.3f} | {r.fixed_ms:.4f} | "
                   f"{'—' if qkvo != qkvo else f'{qkvo:.4f}'} | {r.max_resid_pct:.1f} | {r.points} |")
    return "\n".join(out)


def report(df) -> str:
    """What a finished bench prints from its rows: the ratios of every shape, the targets' summary, qk_softmax's line
    against its floor."""
    import pandas as pd

    r = ratios(df)
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_rows", 500):
        text = [r.to_string(float_format=lambda x: f"{x:.2f}"), summary(r)]
    text.append(floor_lines(df))
    return "\n".join(t for t in text if t)


def main(argv: list[str] | None = None) -> int:
    from attnlab import args as cli
    from attnlab import builds
    from attnlab.triton.resources import parse_tiles

    def tile_labels(text):
        try:
            return [parse_tiles(x) for x in text.split(",")]
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    def bench_dir(text):
        path = os.path.join(text, "bench.csv") if os.path.isdir(text) else text
        if not os.path.isfile(path):
            raise argparse.ArgumentTypeError(f"must name a bench.csv or a directory holding one, got {text!r}")
        return path

    ap = cli.Parser(prog="attnlab bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="bfloat16,float16", type=cli.choices(("bfloat16", "float16", "float32"),
                                                                              "dtypes"))
    ap.add_argument("--ns", default="512,1024,2048,4096,8192,16384", type=cli.ints(1))
    ap.add_argument("--builds", default=",".join(BUILDS), type=cli.choices(builds.names(), "builds"))
    ap.add_argument("--quick", action="store_true", help="skip the untuned extra shapes")
    ap.add_argument("--heads", default=None, type=cli.ints(1),
                    help="a head-count axis: B = 1 and H = each of these, at N = 1024 and 4096 (e.g. 16,64)")
    ap.add_argument("--odd-ns", default=None, type=cli.ints(1),
                    help="sequence lengths that are not powers of two, at FlashAttention's B·N and H·D (e.g. "
                         "1536,6000)")
    ap.add_argument("--group", type=cli.positive_int, default=1,
                    help="query heads per key/value head (grouped-query attention): every shape's H must be a "
                         "multiple of it")
    ap.add_argument("--repeats", type=cli.positive_int, default=1,
                    help="time each case in this many CUDA graphs, each captured afresh; ms is their median, "
                         "ms_min/ms_max their range")
    ap.add_argument("--autotune", action="store_true", help="time tile candidates instead of benchmarking "
                                                            "(attnlab.autotune)")
    ap.add_argument("--kernels", default="fused,qk_softmax,pv", type=cli.choices(("fused", "qk_softmax", "pv"),
                                                                                  "kernels"),
                    help="with --autotune: which kernels to tune")
    ap.add_argument("--tune-ns", default=None, type=cli.ints(1),
                    help="with --autotune: the N each candidate is timed at (default 512,2048,8192)")
    ap.add_argument("--candidates", default=None, type=tile_labels,
                    help="with --autotune: only these tile labels (e.g. 64x128w4s2hgmc,128x64w8s3), instead of each "
                         "kernel's list")
    ap.add_argument("--tiles", default=None, type=cli.existing_file,
                    help="tile overrides: a tiles.json written by --autotune --out")
    ap.add_argument("--out", default=None, type=cli.out_dir,
                    help="directory for bench.csv and ratios.csv (tiles.json with --autotune)")
    ap.add_argument("--read", default=None, metavar="BENCH", type=bench_dir,
                    help="print what a finished bench printed, from its bench.csv (the file or its directory); no GPU")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # --help (0) and usage errors (2), as a return code
        return int(e.code or 0)
    if args.read:
        import pandas as pd

        print(report(pd.read_csv(args.read)))
        return 0
    if not args.autotune:  # before any work: grouped-query attention needs whole groups of query heads
        odd = sorted({H for _, H, *_ in shapes(args.dtypes, args.ns, args.quick, args.heads or (), args.odd_ns or ())
                      if H % args.group})
        if odd:
            print(f"attnlab bench: error: argument --group: every shape's H must be a multiple of {args.group}; "
                  f"H = {', '.join(map(str, odd))} is not", file=sys.stderr)
            return 2
    from attnlab.triton import plan

    try:
        overrides = plan.read_overrides(args.tiles) if args.tiles else plan.NONE
    except ValueError as e:
        print(f"attnlab bench: error: argument --tiles: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("attnlab bench: error: needs a CUDA GPU (timing the interpreter measures Python)", file=sys.stderr)
        return 2
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    if args.autotune:
        from attnlab import autotune

        autotune.run(args.kernels, getattr(torch, args.dtypes[0]), args.tune_ns or autotune.TUNE_NS, args.out,
                     args.candidates)
        return 0
    with plan.overriding(overrides):
        df = run(args)
    r = ratios(df)
    print(report(df))
    bad = df[(df.get("accurate") == False)]  # noqa: E712 - NaN for library rows
    if len(bad):
        print("ACCURACY FAILURES:\n" + bad.to_string())
    if args.out:
        r.to_csv(os.path.join(args.out, "ratios.csv"))
    return 1 if len(bad) else 0


if __name__ == "__main__":
    sys.exit(main())
