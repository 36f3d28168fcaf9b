"""What the lab's seed documents ask to see that the other sections do not show: grouped-query attention against
multi-head attention at the same H (gqa), each build's first call beside its warm time (warm_cold), and the
sequence lengths the gate checked that are not whole tiles (ragged). Each says what these rows hold and, where
they cannot show it, the command that measures it.
"""
from __future__ import annotations

import html
import math
import re
from pathlib import Path

import pandas as pd

from attnlab import cost
from attnlab.lab.explain import case_of, ceilings_of, recorded_tiles, shape_words, teaching_row
from attnlab.lab.page import fold
from attnlab.lab.run import OURS, Run
from attnlab.lab.source import Lessons, needs_lessons, readable_bytes, relative_path
from attnlab.report import correctness as cr
from attnlab.runs import outputs_root

GQA_GROUP = 4  # query heads per K/V head in the prediction: Llama-style models' ratio, and the committed benches'
PAIR_KEY = ["build", "dtype", "D", "causal", "N", "B", "H"]
COMPILE_S = 0.1  # a median first call past this many seconds at a build's later shapes: it compiles once per shape
BENCH = "bench.csv"


def _html(*parts: str):
    from IPython.display import HTML

    return HTML("".join(parts))


def _p(text: str) -> str:
    """A paragraph of plain text, its `code` spans set as code."""
    return "<p>" + re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text)) + "</p>"


def _details(summary: str, table: pd.DataFrame) -> str:
    return (f"<details><summary>{html.escape(summary)}</summary>"
            f"{table.to_html(index=False, border=0, float_format=lambda x: f'{x:.4g}')}</details>")


# -- grouped-query attention --------------------------------------------------------------------------------------

def gqa_pairs(rows: pd.DataFrame) -> pd.DataFrame:
    """Each ok row with Hkv < H beside the ok row of the same build and shape with Hkv = H: their times (ms_gqa,
    ms_mha), their ratio (gqa_over_mha) and the bytes the byte model says each moves (bytes_gqa, bytes_mha)."""
    ok = rows[rows["status"] == "ok"].copy()
    ok["causal"] = ok["causal"].astype(bool)
    ok["dtype"] = ok["dtype"].astype(str)
    g, m = ok[ok["Hkv"] < ok["H"]], ok[ok["Hkv"] == ok["H"]]
    both = g[PAIR_KEY + ["Hkv", "ms"]].merge(m[PAIR_KEY + ["ms"]], on=PAIR_KEY, suffixes=("_gqa", "_mha"))
    if both.empty:
        return both.assign(gqa_over_mha=pd.Series(dtype=float), bytes_gqa=pd.Series(dtype=float),
                           bytes_mha=pd.Series(dtype=float))
    both["gqa_over_mha"] = both["ms_gqa"] / both["ms_mha"]
    both["bytes_gqa"] = [cost.bytes_moved(case_of(r)) for _, r in both.iterrows()]
    both["bytes_mha"] = [cost.bytes_moved(case_of(r, Hkv=int(r["H"]))) for _, r in both.iterrows()]
    return both


def bench_pairs(root=None) -> tuple[pd.DataFrame, Path | None, Path | None]:
    """The committed benches (bench.csv under `root`, default outputs_root()) that pair grouped-query rows with the
    same shapes' multi-head rows, from one file or from two in the same card's folder: the pair with the most shapes
    in common, as (gqa_pairs, the GQA bench's folder, the MHA bench's folder); empty and None where none pair."""
    root = Path(root) if root is not None else outputs_root()
    benches = {}
    for path in sorted(root.rglob(BENCH)) if root.is_dir() else ():
        try:
            t = pd.read_csv(path)
        except (OSError, ValueError):
            continue
        if {"Hkv", "H", "ms", "status", *PAIR_KEY} <= set(t.columns):
            benches[path] = t
    best = (gqa_pairs(pd.DataFrame(columns=PAIR_KEY + ["Hkv", "ms", "status"])), None, None)
    for path, t in benches.items():
        if not (t["Hkv"] < t["H"]).any():
            continue
        for other, u in benches.items():
            if other.parent.parent != path.parent.parent or not (u["Hkv"] == u["H"]).any():
                continue
            both = gqa_pairs(t if other == path else pd.concat([t, u], ignore_index=True))
            if len(both) > len(best[0]):
                best = (both, path.parent, other.parent)
    return best


def gqa_prediction(les: Lessons, group: int = GQA_GROUP) -> str:
    """What the byte model predicts grouped-query attention saves fused at the teaching shape: K and V's bytes and
    fused's, at the measured copy bandwidth, against fused's measured time and its FLOPs at the measured matmul
    rate."""
    row = teaching_row(les)
    if row is None:
        return "These rows hold no ok fused row to predict from."
    H = int(row["H"])
    group = next((g for g in (group, 2) if H % g == 0 and H // g >= 1 and g > 1), None)
    if group is None:
        return f"At H = {H} there is no group of query heads to share a K/V head."
    c = ceilings_of(les)
    mha, gqa = case_of(row, "fused", Hkv=H), case_of(row, "fused", Hkv=H // group)
    kv = {k: cost.sizes(x)["kvb"] for k, x in (("mha", mha), ("gqa", gqa))}
    moved = {k: cost.bytes_moved(x) for k, x in (("mha", mha), ("gqa", gqa))}
    saved_ms = cost.ms_at(moved["mha"] - moved["gqa"], c["tbps"])
    return (f"At {shape_words(row)}, G = {group} (Hkv = {H // group}) shrinks K and V from {readable_bytes(kv['mha'])} "
            f"to {readable_bytes(kv['gqa'])}, and what fused moves from {readable_bytes(moved['mha'])} to "
            f"{readable_bytes(moved['gqa'])} ({moved['gqa'] / moved['mha']:.1%}): at the measured {c['tbps']:.3g} TB/s "
            f"that saves {saved_ms:.3g} ms, {saved_ms / float(row['ms']):.1%} of fused's measured "
            f"{float(row['ms']):.3g} ms. Its FLOPs do not change (every query head still scores every key: "
            f"{cost.ms_at(cost.flops(mha), c['tflops']):.3g} ms at the measured {c['tflops']:.3g} TFLOP/s), nor "
            "do materialised's S and P. Predicted: fused's time barely moves; what shrinks is the K and V a "
            f"decoder caches, {group}×.")


def _measured(pairs: pd.DataFrame, where: str) -> str:
    """Fused's time with GQA over without, and its bytes, in `where`'s pairs (every build's, where fused has none)."""
    parts = []
    ours = pairs[pairs["build"] == "fused"]
    for build, g in (ours if len(ours) else pairs).groupby("build", sort=False):
        b = g["bytes_gqa"] / g["bytes_mha"]
        bytes_words = (f"{b.iloc[0]:.1%}" if b.round(3).nunique() == 1 else f"{b.min():.1%} to {b.max():.1%}")
        parts.append(f"{build} over {len(g)} shapes: its time with GQA over without, median "
                     f"{g['gqa_over_mha'].median():.3f} ({g['gqa_over_mha'].min():.3f} to "
                     f"{g['gqa_over_mha'].max():.3f}), while its bytes fell to {bytes_words}")
    return f"Measured in {where}: " + "; ".join(parts) + "."


def _by_head(pairs: pd.DataFrame) -> pd.DataFrame:
    """gqa_over_mha's median per build (rows) and (D, causal) (columns), over the other shape keys."""
    t = pairs.assign(shape=[f"D = {d}, {'causal' if c else 'non-causal'}" for d, c in zip(pairs["D"], pairs["causal"])])
    return t.pivot_table(index="build", columns="shape", values="gqa_over_mha", aggfunc="median").reset_index()


@needs_lessons()
def gqa(les: Lessons, root=None):
    """Seed 004's grouped-query attention: the byte model's prediction at the teaching shape, then the measurement
    against multi-head attention at the same H: from the lesson rows where they hold both, else from a committed
    pair of benches (bench_pairs), with the command that measures it on this card."""
    parts = [_p(gqa_prediction(les))]
    mine = gqa_pairs(les.results)
    how = "Measure it on this card with the bench command above."
    if len(mine):
        parts.append(_p(_measured(mine, les.label)))
        parts.append(_details("GQA over MHA: each build's median time ratio per head dim and mask", _by_head(mine)))
        return _html(*parts)
    alone = ("every row has Hkv = H" if (les.results["Hkv"] == les.results["H"]).all() else
             "their grouped-query rows have no multi-head rows at the same shapes")
    parts.append(_p(f"The lesson rows cannot show it: {alone}."))
    pairs, gqa_folder, mha_folder = bench_pairs(root)
    if len(pairs):
        where = (f"the committed benches {relative_path(gqa_folder)} (Hkv < H) and {relative_path(mha_folder)} "
                 "(Hkv = H), on their own card")
        parts.append(_p(_measured(pairs, where)))
        parts.append(_details("GQA over MHA: each build's median time ratio per head dim and mask", _by_head(pairs)))
    parts.append(_p(how))
    return _html(*parts)


# -- warm against cold --------------------------------------------------------------------------------------------

def warm_cold_table(les: Lessons) -> tuple[pd.DataFrame, pd.Series | None]:
    """At the first shape the sweep measured (the rows' first ok row of their first dtype): each base build's first
    call (cold_s, in ms), its warm median, their ratio, and the median of its first calls at its other shapes. Also
    that first row, or None."""
    r = les.results[(les.results["status"] == "ok") & (les.results["dtype"].astype(str) == les.dtypes[0])]
    r = r[~r["build"].str.contains("-")].dropna(subset=["cold_s", "ms"])
    if r.empty:
        return pd.DataFrame(), None
    first = r.iloc[0]
    at = r[(r[["N", "D", "B", "H", "Hkv"]] == first[["N", "D", "B", "H", "Hkv"]].values).all(axis=1)
           & (r["causal"] == first["causal"])]
    rows = []
    for _, x in at.iterrows():
        later = r[(r["build"] == x["build"]) & (r.index != x.name)]["cold_s"]
        rows.append({"build": x["build"], "first call (ms)": x["cold_s"] * 1e3, "warm median (ms)": x["ms"],
                     "first / warm": x["cold_s"] * 1e3 / x["ms"],
                     "first call at its other shapes, median (ms)": later.median() * 1e3 if len(later) else math.nan})
    return pd.DataFrame(rows), first


@needs_lessons(many=True)
def warm_cold(les: Lessons) -> list:
    """Seed 003's warm against cold: a paragraph and warm_cold_table folded beneath it, every number from the
    rows."""
    from IPython.display import Markdown

    t, first = warm_cold_table(les)
    if first is None:
        return [Markdown("These rows record no first-call times (`cold_s`).")]
    hi, lo = t.loc[t["first / warm"].idxmax()], t.loc[t["first / warm"].idxmin()]
    ours = t[t["build"].isin(OURS)]
    later = "first call at its other shapes, median (ms)"
    per_shape = t[t[later] > COMPILE_S * 1e3]
    times = lambda x: f"{x:,.0f}×" if x >= 10 else f"{x:.2g}×"  # noqa: E731
    text = (f"At the first shape the sweep measured, {shape_words(first)}, a build's first call took "
            f"{times(lo['first / warm'])} ({lo['build']}) to {times(hi['first / warm'])} ({hi['build']}: "
            f"{hi['first call (ms)']:.4g} ms against {hi['warm median (ms)']:.3g} ms) its warm median.")
    if len(ours) and (ours[later] <= COMPILE_S * 1e3).all():
        text += (f" At their other shapes our builds' first calls took a median {ours[later].median():.3g} ms: "
                 "their kernels are compiled once, not per shape.")
    if len(per_shape):
        lo, hi = per_shape[later].min() / 1e3, per_shape[later].max() / 1e3
        text += (f" At their other shapes the first calls of {', '.join(per_shape['build'])} still took a median "
                 + (f"{lo:.3g} s" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g} to {hi:.3g} s")
                 + f": more than {COMPILE_S:g} s, as if compiled at every shape.")
    return [Markdown(text), fold(t.set_index("build").map(lambda x: float(f"{x:.3g}")),
                                 "Each build's first call beside its warm median, and its first calls at later shapes")]


# -- ragged N in the gate -----------------------------------------------------------------------------------------

def _tiles_at(run: Run, shape: pd.Series) -> set[tuple[int, int]]:
    """(BLOCK_M, BLOCK_N) of every kernel of our builds at a gate shape: as the launcher picks them for the gate's
    case (attnlab.triton.launch.tile_config) where the run's device is this machine's, the tiles the gate ran; else
    as the run's rows of the same N, D, dtype and causal value record them (empty where they record none)."""
    import torch

    if run.device == "cpu" or (run.device.startswith("cuda") and torch.cuda.is_available()):
        from attnlab.triton import launch
        from attnlab.validate import Spec

        spec = Spec(int(shape["B"]), int(shape["H"]), int(shape["Hkv"]), int(shape["N"]), int(shape["D"]),
                    getattr(torch, str(shape["dtype"])), torch.device(run.device), bool(shape["causal"]),
                    1 / math.sqrt(int(shape["D"])), "none")
        return {(k["BLOCK_M"], k["BLOCK_N"]) for b in OURS for k in launch.tile_config(b, spec).values()}
    r = run.results
    if r.empty or "tiles" not in r:
        return set()
    same = r[r["build"].isin(OURS) & (r["N"] == shape["N"]) & (r["D"] == shape["D"])
             & (r["dtype"].astype(str) == str(shape["dtype"])) & (r["causal"].astype(bool) == bool(shape["causal"]))]
    found = set()
    for _, row in same.iterrows():
        for kernel in ("scores", "pv", "qk_softmax", "fused"):
            t = recorded_tiles(row, kernel)
            if t is not None:
                found.add((t.BLOCK_M, t.BLOCK_N))
    return found


def ragged_table(run: Run) -> pd.DataFrame:
    """Per sequence length the gate checked: the tiles our kernels ran there, whether N is a whole number of each
    (ragged: not), and how our builds and their ablations fared there (passed, checked, worst err / limit)."""
    t = cr.correctness_table(run.gate)
    t = t[t["build"].str.split("-").str[0].isin(OURS)]
    rows = []
    for N, g in t.groupby("N"):
        tiles = set().union(*(_tiles_at(run, s) for _, s in g.drop_duplicates(["D", "dtype", "causal"]).iterrows()))
        if not tiles:
            continue  # neither this machine's launcher nor the run's rows say which tiles ran
        rows.append({"N": int(N), "tiles": ", ".join(f"{m} × {n}" for m, n in sorted(tiles)),
                     "largest block": max(max(m, n) for m, n in tiles),
                     "ragged": any(N % m or N % n for m, n in tiles), "passed": int((g["verdict"] == "pass").sum()),
                     "checked": len(g), "worst err / limit": g["err_over_limit"].max()})
    return pd.DataFrame(rows)


def ragged(run: Run):
    """The gate's sequence lengths against our kernels' tiles: those that leave a part-empty last tile, where a
    missing mask would show, and how they fared; where none did, the command that checks them."""
    from IPython.display import Markdown

    from attnlab import gate as gate_mod

    if run.gate.empty:
        return Markdown("The gate has not run: run it first (`lab.gate(run)`).")
    t = ragged_table(run)
    if t.empty:
        return Markdown("Neither the gate's rows nor the run's record which tiles our kernels ran, so these rows say "
                        "nothing about ragged N.")
    ns = ", ".join(str(n) for n in t["N"])
    odd = t[t["ragged"]]
    if len(odd):
        fared = "; ".join(f"N = {r['N']} (tiles {r['tiles']}): {r['passed']} of {r['checked']} checks passed, worst "
                          f"err / limit {r['worst err / limit']:.2f}" for _, r in odd.iterrows())
        return Markdown(f"The gate checked N = {ns}. Ragged here: {fared}.")
    import torch

    big = int(t["largest block"].max())
    other = {d: sorted({c.N for c in gate_mod.grid(torch.device(d)) if c.N % big}) for d in ("cuda", "cpu")}
    return Markdown(f"The gate checked N = {ns}: each a whole number of every tile our kernels ran there (blocks "
                    f"up to {big}), so no tile ran part-empty. `attnlab check` tests ragged N: its grid holds N = "
                    f"{', '.join(map(str, other['cuda']))} on a GPU and N = {', '.join(map(str, other['cpu']))} on "
                    f"a CPU, none a multiple of {big}; `attnlab check --ns 1001,2999` names others.")
