"""Why fusion is faster, boundary by boundary: the time each removed memory round trip saves, next to the time its
bytes take at the run's measured copy bandwidth.

materialised → qk_softmax removes the S round trip and fused then removes the P round trip (attnlab.builds), so the
difference between two adjacent builds is what one boundary costs, measured; its bytes over the bandwidth ceiling
are what it would cost if moving bytes were all it did (the formulas: attnlab.cost). Read the ratio with
`qk_removed_ms` beside it: where qk_softmax ran two passes (its row's tiles: `one_pass` false), the S step also adds a
QKᵀ pass (qk_softmax recomputes the scores), which shrinks its Δ, and the P step removes that pass again, which grows
its Δ; where it ran one pass (`one_pass` true: on Hopper a row of N ≤ 1024 keys held on chip, each score computed
once) neither step changes the QKᵀ work and qk_removed_ms is 0; where its row records no `one_pass`, the passes are
unknown, qk_removed_ms is NaN and the note says so. `measured_over_with_qk` sets Δ against bytes and pass together.
Beyond that, a ratio above 1 says the round trip costs more than its bytes at full bandwidth (extra launches, traffic below peak); below 1, some of it overlapped with
compute or was served from cache. Where the two builds ran kernels written differently (on Hopper the qk_softmax and
fused builds take warp-specialised Gluon kernels at some head dims, materialised never does), the note says so: Δ then
also holds the better-pipelined implementation.
"""
from __future__ import annotations

import math

import pandas as pd

from attnlab import cost as bd
from attnlab import schema
from attnlab.report import groups

COLUMNS = {
    **groups.STEP_COLUMNS,
    "from_ms": "from_build's median ms", "to_ms": "to_build's median ms",
    "delta_ms": "from_ms − to_ms: the time removing the boundary saved, measured",
    "bytes": "bytes the boundary moves (written + read), predicted",
    "ceiling_tbps": "the run's measured copy bandwidth (read + written), TB/s",
    "predicted_ms": "bytes at ceiling_tbps",
    "measured_over_predicted": "delta_ms / predicted_ms",
    "qk_passes": "QKᵀ passes qk_softmax ran (its row's tiles: 1 with the row held on chip, 2 otherwise; NaN where "
                 "the row records neither)",
    "qk_removed_ms": "the QKᵀ pass the step removes at the run's matmul ceiling (negative: the step adds it; 0 where "
                     "qk_softmax ran one pass)",
    "predicted_with_qk_ms": "predicted_ms + qk_removed_ms: the bytes and the QKᵀ pass together",
    "measured_over_with_qk": "delta_ms / predicted_with_qk_ms",
    "noise_ms": "the smallest Δ read as real (attnlab.report.groups.noise_ms)",
    "note": "why a number is NaN; when Δ is within the noise",
}


def attribution(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (shape, boundary) of one (dtype, causal) group: measured Δ vs the boundary's bytes at bandwidth.

    Only 'ok' rows count; a missing or failed build makes its numbers NaN and the note says which and why.
    """
    dtype, causal = groups.one_group(results, ("ms", "ceiling_tbps", "ceiling_tflops"))
    found = groups.cases(results)
    rows = []
    for shape in groups.shapes(results):
        B, H, _, N, D = shape
        passes, why_passes = qk_passes(found, shape)
        for boundary, (src, dst) in bd.BOUNDARIES.items():
            from_ms, why_from = groups.value(found, src, shape)
            to_ms, why_to = groups.value(found, dst, shape)
            tbps, why_bw = groups.shared(found, (src, dst), shape, "ceiling_tbps")
            tflops, why_mm = groups.shared(found, (src, dst), shape, "ceiling_tflops")
            moved = bd.boundary_bytes(boundary, B, H, N, dtype, causal)
            delta = from_ms - to_ms
            predicted = bd.ms_at(moved, tbps)
            qk = (bd.QK_PASSES_REMOVED[boundary] * (passes - 1)
                  * bd.ms_at(bd.qk_pass_flops(B, H, N, D, causal), tflops))
            noise = groups.noise_ms(found, (src, dst), shape, from_ms)
            within = f"Δ {delta:.3g} ms is within the noise ({noise:.3g} ms)" if abs(delta) <= noise else ""
            # the S step's added QKᵀ pass can outweigh its bytes (fp32 scores, large D)
            outweighs = ("measured_over_with_qk unknown: the QKᵀ pass this step adds outweighs the bytes it removes"
                         if predicted + qk <= 0 else "")
            rows.append({
                **groups.leading(dtype, causal, shape),
                "boundary": boundary, "from_build": src, "to_build": dst,
                "from_ms": from_ms, "to_ms": to_ms, "delta_ms": delta,
                "bytes": moved, "ceiling_tbps": tbps, "predicted_ms": predicted,
                "measured_over_predicted": delta / predicted if predicted > 0 else math.nan,
                "qk_passes": passes, "qk_removed_ms": qk, "predicted_with_qk_ms": predicted + qk,
                "measured_over_with_qk": delta / (predicted + qk) if predicted + qk > 0 else math.nan,
                "noise_ms": noise,
                "note": groups.notes(why_from, why_to, why_bw, why_mm, why_passes, within, outweighs,
                                     groups.same_code(found, (src, dst), shape),
                                     groups.same_implementation(found, (src, dst), shape),
                                     groups.same_clock(found, (src, dst), shape)),
            })
    return pd.DataFrame(rows, columns=[*groups.LEADING, *COLUMNS])


def qk_passes(found: dict, shape: tuple) -> tuple[float, str]:
    """The QKᵀ passes qk_softmax's P kernel ran at `shape`, from its row's recorded tiles: 1 where the `qk_softmax`
    kernel's say one_pass (the row held on chip, attnlab.triton.hopper.qk_softmax_row), 2 where they say not (the
    row's max and sum first, then P). NaN where the row records no one_pass (a table written without tiles), with a
    note: the passes are not guessed; NaN with no note where the row is missing (the Δ's note says so)."""
    row = found.get(("qk_softmax", shape))
    if row is None:
        return math.nan, ""
    kernel = schema.recorded_tiles(row.get("tiles")).get("qk_softmax", {})
    if "one_pass" not in kernel:
        return math.nan, (f"qk_softmax's row at {groups.where(shape)} records no one_pass in its tiles: whether it "
                          "computed QKᵀ once or twice is unknown, so qk_removed_ms is NaN")
    return (1 if kernel["one_pass"] else 2), ""
