"""Issue 5's table from a sweep: our builds against FlashAttention-2, cuDNN and FlexAttention, per shape.

    python scripts/fused_vs_libraries.py RESULTS_CSV [--out FILE]

Per (dtype, causal, D, N): which fused kernel ran (gluon or triton, from the row's tiles), fused TF/s, time ratios library / ours (> 1: ours is faster) for sdpa_flash, sdpa_cudnn and
flex, all net of the consumption step (attnlab.report.speedup), and qk_softmax over its floor (P written once and read
once at the row's measured copy bandwidth, plus one QKᵀ at its measured matmul rate: attnlab.bench.qk_softmax_floor_ms).
"""
import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from attnlab import report  # noqa: E402
from attnlab.report import groups  # noqa: E402
from attnlab.sweep import read_results  # noqa: E402
from attnlab.triton.config import kernel_label  # noqa: E402

LIBRARIES = ("sdpa_flash", "sdpa_cudnn", "flex")
KEY = list(groups.LEADING)  # Hkv included: grouped-query rows are shapes of their own


def table(results: pd.DataFrame) -> pd.DataFrame:
    from attnlab.bench import qk_softmax_floor_ms

    out = []
    for (dtype, causal), g in results.groupby(["dtype", "causal"]):
        present = set(g.build)
        t = None
        if "fused" not in present:
            continue
        for lib in (b for b in LIBRARIES if b in present):
            s = report.speedup(g, baseline=lib, builds=["fused"]).set_index(KEY)
            t = s[["ms"]].rename(columns={"ms": "fused_ms"}) if t is None else t
            t[f"vs_{lib}"] = s[f"x_vs_{lib}"]
        if t is None:  # no library row in this group: fused's own time only
            t = report.speedup(g, baseline="fused", builds=["fused"]).set_index(KEY)[["ms"]].rename(
                columns={"ms": "fused_ms"})
        f = g[(g.build == "fused") & (g.status == "ok")].set_index(KEY)
        t["fused_TFs"] = f.flops / t.fused_ms / 1e9
        t["fused_kernel"] = [kernel_label(f.tiles.get(i)) if "tiles" in f and i in f.index else "" for i in t.index]
        q = g[(g.build == "qk_softmax") & (g.status == "ok")]
        over = {tuple(r[k] for k in KEY): groups.less_consumption(r.ms, r.consume_ms) / qk_softmax_floor_ms(
            r.B, r.H, r.N, r.D, r["dtype"], r.causal, {"tbps": r.ceiling_tbps, "tflops": r.ceiling_tflops})
            for _, r in q.iterrows()}
        t["qk_softmax_over_floor"] = [over.get(i, float("nan")) for i in t.index]
        out.append(t.reset_index())
    table = pd.concat(out, ignore_index=True)
    return table[[*KEY, "fused_kernel", "fused_ms", "fused_TFs", *[f"vs_{b}" for b in LIBRARIES if f"vs_{b}" in table],
                  "qk_softmax_over_floor"]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--out", default=None, help="write the table as CSV here too")
    args = ap.parse_args(argv)
    t = table(read_results(args.results))
    print(t.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if args.out:
        t.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
