"""Our harness's library rows against the independent H200 probe in ../shared/reference (same shapes, bf16).

    python scripts/compare_reference.py RESULTS_CSV [REFERENCE_CSV] [--out FILE]

Prints, per library build, the ratio of our median (net of the consumption step) to the probe's do_bench median and
the largest difference in peak allocation (MiB). flex is listed row by row: the probe's compiled rows from its
ninth shape on are torch._dynamo's recompile-limit fallback to eager (GUIDE.md), which our harness refuses.
"""
import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from attnlab.report import groups  # noqa: E402

NAMES = {"eager_materialised": "torch_eager", "sdpa_math": "sdpa_math", "sdpa_efficient": "sdpa_efficient",
         "sdpa_flash": "sdpa_flash", "sdpa_cudnn": "sdpa_cudnn", "sdpa_default": "sdpa_default",
         "flex_compiled": "flex"}


def compare(results: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    ref = reference.assign(build=reference.variant.map(NAMES), ref_ms=pd.to_numeric(reference.ms, errors="coerce"),
                           ref_peak_mib=pd.to_numeric(reference.peak_extra_mib, errors="coerce"))
    ref = ref.dropna(subset=["build", "ref_ms"])[["build", "head_dim", "causal", "seq", "ref_ms", "ref_peak_mib"]]
    ours = results[results.status == "ok"]
    ours = ours.assign(our_ms=[groups.less_consumption(m, c) for m, c in zip(ours.ms, ours.consume_ms)])
    m = ref.merge(ours, left_on=["build", "head_dim", "causal", "seq"], right_on=["build", "D", "causal", "N"])
    m["ratio"] = m.our_ms / m.ref_ms
    m["peak_diff_mib"] = m.peak_bytes / 2**20 - m.ref_peak_mib
    return m[["build", "D", "causal", "N", "ref_ms", "our_ms", "ratio", "ref_peak_mib", "peak_diff_mib"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("reference", nargs="?", default=str(Path(__file__).resolve().parents[2] / "shared" / "reference"
                                                        / "h200-library-backends-2026-11-29.csv"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    m = compare(pd.read_csv(args.results), pd.read_csv(args.reference))
    if args.out:
        m.to_csv(args.out, index=False)
    lib = m[m.build != "flex"]
    print(lib.groupby("build").agg(rows=("ratio", "size"), ratio_min=("ratio", "min"), ratio_median=("ratio", "median"),
                                   ratio_max=("ratio", "max"), peak_diff_mib_max=("peak_diff_mib",
                                                                                   lambda s: s.abs().max())).round(3))
    print(m[m.build == "flex"].round(4).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
