"""Synthetic result rows (the schema's every column) and the grouping rules every report table relies on."""
import math

import pandas as pd
import pytest

from attnlab import report, schema
from attnlab.report import ablation as ablation_mod
from attnlab.report import groups


def row(build, ms=1.0, **kw):
    """One ok result row of `build` with every schema column; B=1 H=8 N=1000 D=64 float16 non-causal by default."""
    base, _, ablation = build.partition("-")
    r = {c: math.nan for c in schema.COLUMNS}
    r.update(run_id="r1", build=build, base=base, ablation=ablation,
             family="ablation" if ablation else ("ours" if base in ablation_mod.OURS else "library"),
             B=1, H=8, Hkv=8, N=1000, D=64, dtype="float16", causal=False,
             mask="zero" if ablation == "zero_mask" else "none", device="cuda:0", status="ok",
             ms=ms, ms_p20=ms, ms_p80=ms, peak_note="", ceiling_tbps=0.02, ceiling_tflops=10.0)
    r.update(kw)
    r["case_id"] = "|".join(str(r[c]) for c in ("build", "B", "H", "Hkv", "N", "D", "dtype", "causal", "mask"))
    return r


def frame(*rows):
    return pd.DataFrame(list(rows), columns=list(schema.COLUMNS))


def test_row_has_exactly_the_schema_columns():
    assert list(frame(row("fused")).columns) == list(schema.COLUMNS)


def test_split_gives_one_frame_per_dtype_and_causal():
    df = frame(*(row("fused", dtype=dt, causal=c) for dt in ("float16", "bfloat16") for c in (False, True)),
               row("materialised", dtype="float16", causal=True))
    parts = report.split(df)
    assert list(parts) == [("bfloat16", False), ("bfloat16", True), ("float16", False), ("float16", True)]
    assert list(parts[("float16", True)]["build"]) == ["fused", "materialised"]
    assert all(groups.one_group(g) == key for key, g in parts.items())


TABLES = {
    "speedup": report.speedup,
    "attribution": report.attribution,
    "ablation_table": report.ablation_table,
    "memory_table": report.memory_table,
}


@pytest.mark.parametrize("table", TABLES.values(), ids=TABLES.keys())
def test_every_table_refuses_mixed_causal(table):
    df = frame(row("materialised"), row("fused", causal=True))
    with pytest.raises(ValueError, match=r"causal \[False, True\]"):
        table(df)


@pytest.mark.parametrize("table", TABLES.values(), ids=TABLES.keys())
def test_every_table_refuses_two_dtypes(table):
    df = frame(row("materialised", dtype="bfloat16"), row("fused", dtype="float16"))
    with pytest.raises(ValueError, match=r"dtype \['bfloat16', 'float16'\]"):
        table(df)


def test_a_causal_column_of_strings_is_refused():
    # 'False' is a true value: read as a string it would file a non-causal row as causal.
    df = frame(row("fused", causal="False"))
    with pytest.raises(ValueError, match="causal must hold booleans, got 'False'"):
        report.split(df)


def test_two_rows_for_one_case_are_refused_not_averaged():
    df = frame(row("fused", ms=1.0, run_id="a"), row("fused", ms=2.0, run_id="b"))
    with pytest.raises(ValueError, match=r"two rows for fused at B=1 H=8 N=1000 D=64 \(run_id \['a', 'b'\]\)"):
        report.attribution(df)


def test_empty_results_are_refused():
    with pytest.raises(ValueError, match="no rows"):
        report.attribution(frame())


def test_missing_column_is_named():
    with pytest.raises(ValueError, match=r"lack column\(s\) \['ceiling_tbps'\]"):
        report.attribution(frame(row("fused")).drop(columns=["ceiling_tbps"]))


def test_shapes_sort_by_head_dim_then_length_and_notes_name_grouped_heads():
    df = frame(row("fused", N=4096, D=64), row("fused", N=1024, D=128), row("fused", N=1024, D=64, Hkv=2))
    assert groups.shapes(df) == [(1, 8, 2, 1024, 64), (1, 8, 8, 4096, 64), (1, 8, 8, 1024, 128)]
    assert groups.where((1, 8, 2, 1024, 64)) == "B=1 H=8 Hkv=2 N=1024 D=64"


def test_the_report_imports_neither_torch_nor_triton_nor_a_plotting_library():
    import subprocess
    import sys

    code = ("import sys, attnlab.report; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'triton', 'plotly', 'matplotlib'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
