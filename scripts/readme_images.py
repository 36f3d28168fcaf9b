"""The README's two pictures, drawn from a run folder with the walkthrough's own figure and table functions:

    python scripts/readme_images.py outputs/h200/2026-12-06-render     ->  docs/img/speedup.png, docs/img/memory.png

The speedup curve is attnlab.report.curves.speedup_curves (section 5 of the walkthrough) for our three builds and
the SDPA backends; the memory table is attnlab.lab.memory's peak allocations (section 6) at the non-causal shapes.
PNG export goes through plotly's kaleido, which drives a Chromium (Debian's `chromium`, as the browser tests use).
"""
from __future__ import annotations

import sys
from pathlib import Path

import plotly.graph_objects as go

from attnlab import lab, sweep
from attnlab.report.curves import speedup_curves

OUT = Path(__file__).resolve().parent.parent / "docs" / "img"
SHOWN = ["materialised", "qk_softmax", "fused", "sdpa_flash", "sdpa_cudnn", "torch_eager"]


def main(folder: str) -> int:
    results = sweep.read_results(folder)
    dtype = str(results["dtype"].iloc[0])
    OUT.mkdir(parents=True, exist_ok=True)
    fig = speedup_curves(results, dtype, builds=SHOWN)
    fig.write_image(OUT / "speedup.png", width=1200, height=1100, scale=1)
    les = lab.Lessons(results=results, folder=Path(folder), device_name="", own=True, provenance={})
    wide = lab.memory(les, dtype, causal=False)[0].reset_index()
    wide = wide[["D", "N", "S or P (predicted)", *[b for b in SHOWN if b in wide.columns]]]
    table = go.Figure(go.Table(header=dict(values=list(wide.columns), align="left"),
                               cells=dict(values=[wide[c].astype(str) for c in wide.columns], align="left")))
    table.update_layout(title=f"Peak allocation per call, {dtype}, non-causal (B·N = 16384, H·D = 2048): "
                              f"{Path(folder).as_posix()}", margin=dict(l=10, r=10, t=50, b=10))
    table.write_image(OUT / "memory.png", width=1200, height=70 + 21 * (len(wide) + 1), scale=1)
    print(f"wrote {OUT / 'speedup.png'} and {OUT / 'memory.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "outputs/h200/2026-12-06-render"))
