"""The ideas the walkthrough's numbers rest on, each explained with a picture or a worked example and drawn from the
lesson rows and the ceilings their run measured: where the bytes live (memory_hierarchy), how fused never writes S
(tile_loop, online_softmax), and how the timer reads the GPU (graph_replay, timing_spread). The plateau's
dependence on D is sections.head_dim_note.

Each section reads one shape, teaching_row's: the lesson rows' largest N at their smallest head dim, non-causal
where measured, in their first dtype. The on-chip sizes of a card are NVIDIA's figures for its compute capability
(ON_CHIP), said so on the page; every other number is this run's.
"""
from __future__ import annotations

import html
import json
import math
import re

import pandas as pd

from attnlab import measure, cost
from attnlab.lab.source import Lessons, needs_lessons, readable_bytes
from attnlab.report import diagrams
from attnlab.triton import config

# Shared memory per SM (KiB) by compute capability: the CUDA C++ Programming Guide's "maximum amount of shared memory
# per SM" (technical specifications per compute capability). Every capability from 5.0 on holds 64 K 32-bit
# registers an SM.
ON_CHIP_SHARED_KIB = {"7.0": 96, "7.5": 64, "8.0": 164, "8.6": 100, "8.7": 164, "8.9": 100, "9.0": 228, "10.0": 228,
                      "12.0": 100}
REGISTER_BYTES_PER_SM = 64 * 1024 * 4
FP32 = 4  # bytes of a score and of an accumulator element, which the kernels keep in fp32 on chip
# The worked example of online_softmax: one query row's scores arriving in two tiles of three keys, and each key's
# value (a head dim of 1, so the accumulator is one number).
EXAMPLE_SCORES = ((1.0, 3.0, 0.5), (4.0, 2.0, 2.5))
EXAMPLE_VALUES = ((1.0, -2.0, 0.5), (3.0, 0.0, -1.0))


def _html(*parts: str):
    from IPython.display import HTML

    return HTML("".join(parts))


def _p(text: str) -> str:
    """A paragraph of plain text, its `code` spans set as code."""
    return "<p>" + re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text)) + "</p>"


def ceilings_of(les: Lessons, dtype: str | None = None) -> dict:
    """The copy bandwidth (tbps) and matmul rate (tflops) the lesson rows' run measured for `dtype` (default: their
    first): its provenance's, else the median of the rows' own ceiling columns; NaN where neither has one."""
    dtype = dtype or les.dtypes[0]
    c = les.provenance.get("ceilings", {}).get(dtype, {})
    rows = les.results[les.results["dtype"].astype(str) == dtype]
    out = {}
    for key, column in (("tbps", "ceiling_tbps"), ("tflops", "ceiling_tflops")):
        v = c.get(key)
        if not v and column in rows:
            v = pd.to_numeric(rows[column], errors="coerce").median()
        out[key] = float(v) if v else math.nan
    return out


def teaching_row(les: Lessons, build: str = "fused") -> pd.Series | None:
    """The ok row of `build` the explanations read: the first dtype, non-causal where measured, the smallest D, the
    largest N that D reaches. None when the build has no ok row."""
    rows = les.results[(les.results["build"] == build) & (les.results["status"] == "ok")]
    rows = rows[rows["dtype"].astype(str) == les.dtypes[0]]
    if rows.empty:
        return None
    if (~rows["causal"].astype(bool)).any():
        rows = rows[~rows["causal"].astype(bool)]
    rows = rows[rows["D"] == rows["D"].min()]
    return rows.loc[rows["N"].idxmax()]


def row_at(les: Lessons, build: str, like: pd.Series) -> pd.Series | None:
    """`build`'s ok row at the shape of `like` (dtype, causal, B, H, Hkv, N, D), or None."""
    r = les.results
    hit = r[(r["build"] == build) & (r["status"] == "ok") & (r["dtype"].astype(str) == str(like["dtype"]))
            & (r["causal"].astype(bool) == bool(like["causal"]))
            & (r[["B", "H", "Hkv", "N", "D"]] == like[["B", "H", "Hkv", "N", "D"]].astype(int).values).all(axis=1)]
    return hit.iloc[0] if len(hit) else None


def case_of(row: pd.Series, build: str | None = None, Hkv: int | None = None) -> measure.Case:
    return measure.Case(build or str(row["build"]), int(row["B"]), int(row["H"]), int(Hkv or row["Hkv"]),
                        int(row["N"]), int(row["D"]), str(row["dtype"]), bool(row["causal"]), "cuda")


def shape_words(row: pd.Series) -> str:
    return (f"N = {int(row['N'])}, D = {int(row['D'])} (B = {int(row['B'])}, H = {int(row['H'])}, {row['dtype']}, "
            f"{'causal' if bool(row['causal']) else 'non-causal'})")


def recorded_tiles(row: pd.Series, kernel: str) -> config.Tiles | None:
    """The tiles `kernel` ran with, as the row records them (its `tiles` JSON), or None where it records none."""
    try:
        t = json.loads(row.get("tiles") or "{}").get(kernel)
    except (TypeError, ValueError):
        return None
    if not t:
        return None
    known = config.Tiles.__dataclass_fields__
    return config.Tiles(**{k: v for k, v in t.items() if k in known})


def on_chip(prov: dict) -> dict:
    """What the lesson rows' card holds on chip, as far as its provenance says: SMs, shared memory per SM and
    registers per SM (ON_CHIP_SHARED_KIB for its compute capability), device memory; None where unknown."""
    dev = prov.get("device", {})
    cap = str(dev.get("capability") or "")
    shared = ON_CHIP_SHARED_KIB.get(cap)
    return {"sms": dev.get("multiprocessors"), "capability": cap or None,
            "shared": shared * 1024 if shared else None, "registers": REGISTER_BYTES_PER_SM if shared else None,
            "hbm": dev.get("total_memory")}


def tile_bytes(t: config.Tiles, D: int, itemsize: int) -> dict:
    """One work item's data on chip, by the tile sizes: its Q block and num_stages K/V tile pairs (shared memory),
    its fp32 score tile and accumulator (registers)."""
    rows = config.item_rows(t)
    return {"rows": rows, "q": rows * D * itemsize, "kv_pair": 2 * t.BLOCK_N * D * itemsize,
            "kv_stages": t.num_stages * 2 * t.BLOCK_N * D * itemsize, "scores": rows * t.BLOCK_N * FP32,
            "acc": rows * D * FP32}


# -- the memory hierarchy ------------------------------------------------------------------------------------------

@needs_lessons()
def memory_hierarchy(les: Lessons):
    """HBM and the SMs' on-chip memory, drawn with the copy bandwidth this run measured, and the sizes at the
    teaching shape: S against all the SMs' shared memory, fused's tiles against one SM's."""
    row = teaching_row(les)
    if row is None:
        return _html(_p("These rows hold no ok fused row to draw the memory hierarchy at."))
    c, chip = ceilings_of(les), on_chip(les.provenance)
    E = cost.itemsize(str(row["dtype"]))
    B, H, N, D = (int(row[k]) for k in ("B", "H", "N", "D"))
    s = cost.nn_bytes(B, H, N, str(row["dtype"]))
    sp = sum(cost.boundary_bytes(k, B, H, N, str(row["dtype"]), bool(row["causal"])) for k in cost.BOUNDARIES)
    fused_moves = cost.bytes_moved(case_of(row))
    sizes = [(f"S at N = {N}: {readable_bytes(s)}", s, "hbm")]
    text = [f"At {shape_words(row)}, S alone is {readable_bytes(s)}."]
    if chip["sms"] and chip["shared"]:
        all_shared = chip["sms"] * chip["shared"]
        chip_lines = [f"{chip['sms']} SMs, each {readable_bytes(chip['shared'])} shared memory + "
                      f"{readable_bytes(chip['registers'])} registers",
                      f"all SMs' shared memory: {readable_bytes(all_shared)}"]
        sizes += [(f"all {chip['sms']} SMs' shared memory: {readable_bytes(all_shared)}", all_shared, "chip"),
                  (f"one SM's shared memory: {readable_bytes(chip['shared'])}", chip["shared"], "chip")]
        text[0] = (f"At {shape_words(row)}, S alone is {readable_bytes(s)}: {s / all_shared:,.0f}× the shared memory "
                   f"of all {chip['sms']} SMs together ({readable_bytes(all_shared)}; NVIDIA's "
                   f"{readable_bytes(chip['shared'])} an SM for compute capability {chip['capability']}).")
    else:
        chip_lines = ["SM count and on-chip sizes: not recorded for this card"]
    mat = row_at(les, "materialised", row)
    text.append(f"So materialised writes S and P to device memory and reads them back: {readable_bytes(sp)} at the "
                f"measured {c['tbps']:.3g} TB/s is {cost.ms_at(sp, c['tbps']):.3g} ms"
                + (f", of its measured {float(mat['ms']):.3g} ms." if mat is not None else "."))
    t = recorded_tiles(row, "fused")
    if t is not None:
        b = tile_bytes(t, D, E)
        on = b["q"] + b["kv_stages"]
        sizes += [(f"fused's Q block + {t.num_stages} K/V tile pairs: {readable_bytes(on)}", on, "tile")]
        text.append(f"Fused keeps one {b['rows']} × {D} Q block and {t.num_stages} K/V tile pairs of {t.BLOCK_N} keys "
                    f"on chip ({readable_bytes(on)} of shared memory; its {b['rows']} × {t.BLOCK_N} fp32 scores and "
                    f"accumulator, {readable_bytes(b['scores'] + b['acc'])}, in registers) and moves only Q, K, V and "
                    f"O: {readable_bytes(fused_moves)}, {cost.ms_at(fused_moves, c['tbps']):.3g} ms at that "
                    f"bandwidth, of its measured {float(row['ms']):.3g} ms.")
    else:
        text.append(f"Fused moves only Q, K, V and O: {readable_bytes(fused_moves)}, "
                    f"{cost.ms_at(fused_moves, c['tbps']):.3g} ms at that bandwidth, of its measured "
                    f"{float(row['ms']):.3g} ms (its row records no tiles to size what it keeps on chip).")
    hbm = [f"{readable_bytes(chip['hbm'])} on this card" if chip["hbm"] else "size not recorded",
           f"S and P at N = {N}: {readable_bytes(2 * s)}"]
    picture = diagrams.memory_svg(chip_lines, hbm, f"{c['tbps']:.3g} TB/s copy bandwidth, measured", sizes)
    return _html(picture, _p(" ".join(text)))


# -- the fused kernel's tile loop and the online softmax ----------------------------------------------------------

@needs_lessons()
def tile_loop(les: Lessons):
    """The fused kernel's loop at the teaching shape, drawn with the tiles its row records: the Q block, the K/V
    tiles streaming past, the running max and sum."""
    row = teaching_row(les)
    if row is None:
        return _html(_p("These rows hold no ok fused row to draw the tile loop at."))
    B, H, N, D = (int(row[k]) for k in ("B", "H", "N", "D"))
    causal = bool(row["causal"])
    t = recorded_tiles(row, "fused")
    if t is None:
        picture = diagrams.tile_loop_svg("BLOCK_M", "BLOCK_N", D, "N / BLOCK_N", causal)
        return _html(picture, _p(f"Fused's row at {shape_words(row)} records no tiles, so the picture names them: "
                                 "BLOCK_M query rows a block, BLOCK_N keys a K/V tile."))
    rows = config.item_rows(t)
    tiles = -(-N // t.BLOCK_N)
    items = B * H * -(-N // rows)
    per = (f"{t.BLOCK_M} rows for each of its {rows // t.BLOCK_M} consumer warpgroups" if t.gluon and
           rows != t.BLOCK_M else f"BLOCK_M = {t.BLOCK_M}")
    sms = on_chip(les.provenance)["sms"]
    turns = f" The kernel is persistent: {sms} programs, one an SM, take the items in turn." if t.persistent and sms else ""
    text = (f"At {shape_words(row)}, fused's row records its tiles: {rows} query rows a work item ({per}) and K/V "
            f"tiles of BLOCK_N = {t.BLOCK_N} keys. Each of the B·H·⌈N / {rows}⌉ = {items:,} work items streams "
            f"{tiles} K/V tile pairs past its Q block.{turns} A row's {N} scores exist only one tile of {t.BLOCK_N} at "
            f"a time, in registers: of S's {readable_bytes(cost.nn_bytes(B, H, N, str(row['dtype'])))}, none "
            "reaches device memory.")
    return _html(diagrams.tile_loop_svg(rows, t.BLOCK_N, D, tiles, causal), _p(text))


def online_steps(scores=EXAMPLE_SCORES, values=EXAMPLE_VALUES) -> list[dict]:
    """The online softmax over one query row whose scores arrive tile by tile: after each tile, the running max m,
    the factor e^(m_old − m) that rescales what was summed before, the running sum l and the accumulator acc
    (Σ e^(s − m)·v); then o = acc / l."""
    m, l, acc = -math.inf, 0.0, 0.0
    out = []
    for s_tile, v_tile in zip(scores, values):
        m_new = max(m, *s_tile)
        rescale = math.exp(m - m_new) if math.isfinite(m) else math.nan  # nothing summed yet: no rescale
        keep = 0.0 if math.isnan(rescale) else rescale
        e = [math.exp(s - m_new) for s in s_tile]
        l = l * keep + sum(e)
        acc = acc * keep + sum(x * v for x, v in zip(e, v_tile))
        m = m_new
        out.append({"scores": tuple(s_tile), "m": m, "rescale": rescale, "l": l, "acc": acc, "o": acc / l})
    return out


def softmax_at_once(scores=EXAMPLE_SCORES, values=EXAMPLE_VALUES) -> dict:
    """The same row the ordinary way, every score held at once: its max, Σ e^(s − max), and o = Σ softmax(s)·v."""
    s = [x for tile in scores for x in tile]
    v = [x for tile in values for x in tile]
    top = max(s)
    total = sum(math.exp(x - top) for x in s)
    return {"m": top, "l": total, "o": sum(math.exp(x - top) / total * y for x, y in zip(s, v))}


def online_softmax(scores=EXAMPLE_SCORES, values=EXAMPLE_VALUES):
    """The online softmax's worked example, every number computed here: the running max and sum after each tile,
    the rescale, and the result set beside the softmax of the whole row (the notebook holds the four lines of the
    update)."""
    from IPython.display import Markdown

    steps, whole = online_steps(scores, values), softmax_at_once(scores, values)
    fmt = lambda xs: ", ".join(f"{x:g}" for x in xs)  # noqa: E731
    rescale = lambda x: "—" if math.isnan(x) else f"{x:.4f}"  # noqa: E731
    table = "\n".join(f"| {i + 1} | {fmt(st['scores'])} | {fmt(values[i])} | {st['m']:g} | {rescale(st['rescale'])} "
                      f"| {st['l']:.4f} | {st['acc']:.4f} |" for i, st in enumerate(steps))
    last = steps[-1]
    diff = abs(last["o"] - whole["o"])
    n = sum(len(t) for t in scores)
    return Markdown(
        f"One query row of {n} scores in {len(scores)} tiles (a head dim of 1, so `acc` is one number):\n\n"
        "| tile | scores s | values v | m | rescale exp(m_old − m) | l | acc |\n|---|---|---|---|---|---|---|\n"
        f"{table}\n\n"
        f"o = acc / l = {last['acc']:.4f} / {last['l']:.4f} = {last['o']:.4f}. The whole row at once: max "
        f"{whole['m']:g}, Σ exp(s − max) = {whole['l']:.4f}, o = Σ softmax(s)·v = {whole['o']:.4f}: the same, to "
        f"{diff:.1e}.")


# -- how the timer reads the GPU ----------------------------------------------------------------------------------

@needs_lessons()
def graph_replay(les: Lessons, build: str = "fused"):
    """CUDA-graph replay against eager launches in the rows' numbers for `build`, beside the notebook's paragraph on
    the two: where its eager calls part most from the replay (`eager_ms` / `ms`; `host_ms` / `ms` where no eager
    time was recorded), and the largest N of the same (causal, D) for contrast."""
    from IPython.display import Markdown

    r = les.results
    r = r[(r["build"] == build) & (r["status"] == "ok") & (r["dtype"].astype(str) == les.dtypes[0])].copy()
    col = "eager_ms" if "eager_ms" in r and r["eager_ms"].notna().any() else "host_ms"
    r = r.dropna(subset=["ms", col])
    if r.empty:
        return Markdown(f"These rows record no {col} for {build}.")
    r["apart"] = r[col] / r["ms"]
    worst = r.loc[r["apart"].idxmax()]
    same = r[(r["causal"] == worst["causal"]) & (r["D"] == worst["D"])]
    big = same.loc[same["N"].idxmax()]

    def at(x):
        eager = (f", {x['eager_ms']:.3g} ms eager ({x['eager_ms'] / x['ms']:.2f}× the replay)" if col == "eager_ms"
                 else " (no eager time recorded)")
        return f"{x['ms']:.3g} ms replayed from a graph{eager}, the host {x['host_ms']:.3g} ms to issue one call"

    waits = (": the host takes longer to issue a call than the GPU takes to run it, so an eager caller's GPU waits "
             "on Python" if worst["host_ms"] > worst["ms"] else "")
    text = (f"{build} at N = {int(worst['N'])} (D = {int(worst['D'])}, {'causal' if worst['causal'] else 'non-causal'},"
            f" where eager and replay part most): {at(worst)}{waits}.")
    if int(big["N"]) != int(worst["N"]):
        text += f" At N = {int(big['N'])}: {at(big)}."
    return Markdown(text)


@needs_lessons()
def timing_spread(les: Lessons):
    """The percentiles' numbers beside the notebook's paragraph on the L2 flush and p20/p80: the teaching row's
    repetitions (p20, median, p80) and the spread (p80 − p20) / median over every ok row of our three builds."""
    from IPython.display import Markdown

    row = teaching_row(les)
    ours = les.results[les.results["build"].isin(("materialised", "qk_softmax", "fused"))
                       & (les.results["status"] == "ok")].dropna(subset=["ms_p20", "ms_p80", "ms"])
    if row is None or ours.empty:
        return Markdown("These rows record no percentiles to read.")
    spread = (ours["ms_p80"] - ours["ms_p20"]) / ours["ms"]
    wide = ours.loc[spread.idxmax()]
    return Markdown(
        f"Fused at {shape_words(row)}: {int(row['reps'])} repetitions, p20 {row['ms_p20']:.4g} ms, median "
        f"{row['ms']:.4g} ms, p80 {row['ms_p80']:.4g} ms: a spread (p80 − p20) / median of "
        f"{(row['ms_p80'] - row['ms_p20']) / row['ms']:.1%}. Over our three builds' {len(ours)} rows the spread is a "
        f"median {spread.median():.1%}, at most {spread.max():.1%} ({wide['build']} at N = {int(wide['N'])}, D = "
        f"{int(wide['D'])}).")
