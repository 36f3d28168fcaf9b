"""A results table with three lies planted in it, and the lab's guards that find them.

The rows are made up in the shape of the lab's results (attnlab.schema), at one H200-like case (B = 1, H = 16,
N = 4096, D = 64, bfloat16), each with the row its speedup was divided by. Three of them lie, one each of:

    mixed_ratio  the ratio's two rows differ in causal: the causal row skips half the work, so the number describes
                 the mask, not the fusion. Guard: attnlab.report.speedup refuses a frame holding both causal values.
    timer        the row was timed by CUDA-graph replay among rows timed eagerly (do_bench): the replay hides the
                 host's cost to issue the call, which every eager row carries. Guard: times compare only when one
                 timer took them; a row whose timer differs from the table's is out of place.
    allocation   a build whose name says it holds S and P peaked at O's size: torch.compile rewrote the
                 materialised form into a fused kernel, so it is no longer the baseline it claims to be. Guard:
                 attnlab.measure.alloc_flag against attnlab.cost.hold_bytes.

The honest rows include some that look odd and are not (fused holding only O, an SDPA row faster than fused, the
math backend slower than materialised), so reading the table takes the model, not suspicion.
"""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pandas as pd

from attnlab import measure, cost, report

LIES = {
    "mixed_ratio": "its ratio divides by a row of the other causal value (the mask's work, not the fusion)",
    "timer": "timed by another timer than the rows it stands beside (graph replay among eager calls)",
    "allocation": "its peak allocation is below what its name must hold (not the program its name says)",
}
SHAPE = dict(B=1, H=16, Hkv=16, N=4096, D=64, dtype="bfloat16")
MB = 1e6
_O = SHAPE["B"] * SHAPE["H"] * SHAPE["N"] * SHAPE["D"] * 2  # O's bytes, bf16
_NN = SHAPE["B"] * SHAPE["H"] * SHAPE["N"] ** 2 * 2  # one (B, H, N, N) tensor's bytes, bf16

# row: (build, how it ran, causal, timer, ms, peak bytes, the row its speedup divides)
ROWS = [
    ("materialised", "our three Triton kernels", False, "do_bench", 0.62, 2 * _NN + _O // 2, 0),
    ("qk_softmax", "our two Triton kernels", False, "do_bench", 0.41, _NN + _O, 0),
    ("fused", "our one Triton kernel", False, "do_bench", 0.19, _O, 0),
    ("materialised", "our three Triton kernels", True, "do_bench", 0.50, 2 * _NN + _O // 2, 3),
    ("fused", "our one Triton kernel", True, "do_bench", 0.11, _O, 0),
    ("sdpa_cudnn", "SDPA, cuDNN backend forced", False, "do_bench+graph", 0.12, _O, 0),
    ("torch_eager", "torch.compile of the plain torch code", False, "do_bench", 0.21, _O, 0),
    ("sdpa_flash", "SDPA, flash backend forced", False, "do_bench", 0.16, _O + _O // 8, 0),
    ("sdpa_math", "SDPA, math backend forced", False, "do_bench", 0.95, 4 * _NN, 0),
    ("qk_softmax", "our two Triton kernels", True, "do_bench", 0.27, _NN + _O, 3),
]


def results() -> pd.DataFrame:
    """The planted rows as a results table (attnlab.schema's columns), plus `baseline_row`, indexed 0…9."""
    rows = []
    for build, how, causal, timer, ms, peak, base in ROWS:
        row = measure.blank_row()
        row.update(**SHAPE, build=build, base=build, ablation="", causal=causal, status="ok", timer=timer, ms=ms,
                   ms_p20=ms, ms_p80=ms, peak_bytes=float(peak), compile_note=how if "compile" in how else "",
                   family="ours" if build in ("materialised", "qk_softmax", "fused") else "library",
                   hold_bytes=cost.hold_bytes(SimpleNamespace(build=build, causal=causal, **SHAPE)))
        row["baseline_row"] = base
        rows.append(row)
    return pd.DataFrame(rows)


def table() -> pd.DataFrame:
    """What the student reads: per row its build, how it ran, causal, timer, ms, peak MB, and its speedup over the
    row named in baseline_row (that row's ms / this row's ms)."""
    r = results()
    return pd.DataFrame({
        "build": r["build"], "how it ran": [how for _, how, *_ in ROWS], "causal": r["causal"], "timer": r["timer"],
        "ms": r["ms"], "peak_MB": (r["peak_bytes"] / MB).round(1), "baseline_row": r["baseline_row"],
        "speedup": (r["ms"][r["baseline_row"]].to_numpy() / r["ms"]).round(2),
    }).rename_axis("row")


def _mixed(r: pd.DataFrame, i: int) -> str:
    """report.speedup's refusal of the row and its baseline together, or ''."""
    j = int(r.loc[i, "baseline_row"])
    if j == i:
        return ""
    try:
        report.speedup(r.loc[[j, i]], baseline=r.loc[j, "build"], builds=[r.loc[i, "build"]])
    except ValueError as e:
        return str(e)
    return ""


def _timer(r: pd.DataFrame, i: int) -> str:
    usual, _ = Counter(r["timer"]).most_common(1)[0]
    t = r.loc[i, "timer"]
    return f"timed by {t!r}, the other rows by {usual!r}" if t != usual else ""


def _allocation(r: pd.DataFrame, i: int) -> str:
    row = r.loc[i]
    case = SimpleNamespace(build=row["build"], causal=bool(row["causal"]), **SHAPE)
    return measure.alloc_flag(row["peak_bytes"], cost.hold_bytes(case), cost.holds(row["build"]))


GUARDS = {"mixed_ratio": _mixed, "timer": _timer, "allocation": _allocation}


def found() -> dict[int, tuple[str, str]]:
    """{row: (lie, what the guard says)} for every row a guard flags: the answer the exercise checks against."""
    r = results()
    out = {}
    for i in r.index:
        for lie, guard in GUARDS.items():
            said = guard(r, int(i))
            if said:
                out[int(i)] = (lie, said)
                break
    return out
