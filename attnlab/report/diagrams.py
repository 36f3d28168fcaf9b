"""Pictures of the ideas the lab's numbers rest on, as inline SVG strings that draw offline in a notebook, its HTML
export and JupyterLab: pure functions from numbers and labels to markup, no I/O.

    memory_svg(chip, hbm, link, sizes)        device memory (HBM) below, the SMs' on-chip memory above, the copy
                                              link between them, and a log-scale bar per size to set beside them
    tile_loop_svg(rows, block_n, D, tiles)    the fused kernel's loop: one Q block on chip, K and V tiles streaming
                                              past it, the running max m, sum l and accumulator it keeps

Every picture carries a <title> and role="img" with the same words, for a screen reader; colours come from
PALETTE, one per kind of memory, never per build.
"""
from __future__ import annotations

import html
import math

PALETTE = {"hbm": "#d9e4f0", "hbm_edge": "#4a6f96", "chip": "#f3e6c8", "chip_edge": "#9a7a2e", "tile": "#c9e3c3",
           "tile_edge": "#3f7d3a", "state": "#f6d5d5", "state_edge": "#a34a4a", "ink": "#222222", "muted": "#666666"}
FONT = "font-family:sans-serif"


def _t(x: float, y: float, text: str, size: int = 12, anchor: str = "start", weight: str = "normal",
       fill: str | None = None) -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" '
            f'fill="{fill or PALETTE["ink"]}" style="{FONT}">{html.escape(text)}</text>')


def _box(x: float, y: float, w: float, h: float, fill: str, edge: str, rx: int = 4) -> str:
    return (f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{rx}" fill="{fill}" '
            f'stroke="{edge}" stroke-width="1.5"/>')


def _arrow(x1: float, y1: float, x2: float, y2: float, colour: str) -> str:
    return (f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}" stroke-width="2" '
            'marker-end="url(#head)"/>')


def svg(width: int, height: int, title: str, body: list[str]) -> str:
    """An <svg> of `body`, titled for a screen reader, scaling down to its container's width."""
    head = ('<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
            f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{PALETTE["ink"]}"/></marker></defs>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
            f'style="max-width:100%;height:auto" role="img" aria-label="{html.escape(title)}">'
            f'<title>{html.escape(title)}</title>{head}{"".join(body)}</svg>')


def log_bars(x: float, y: float, width: float, sizes: list[tuple[str, float, str]], unit_floor: float) -> list[str]:
    """One horizontal bar per (label, size, kind), its length log10(size / unit_floor) of the largest's: sizes a
    million times apart stay readable. `kind` picks the colour (a PALETTE key without its _edge)."""
    top = max(math.log10(max(s, unit_floor) / unit_floor) for _, s, _ in sizes) or 1.0
    out = []
    for i, (label, size, kind) in enumerate(sizes):
        w = max(2.0, width * math.log10(max(size, unit_floor) / unit_floor) / top)
        yy = y + i * 26
        out += [_box(x, yy, w, 16, PALETTE[kind], PALETTE[f"{kind}_edge"], rx=2), _t(x + w + 6, yy + 13, label, 11)]
    return out


def memory_svg(chip: list[str], hbm: list[str], link: str, sizes: list[tuple[str, float, str]]) -> str:
    """The memory hierarchy: `chip` (lines naming the SMs and their on-chip memory) in a box above `hbm` (lines
    naming device memory), `link` written on the arrows between them, and `sizes` as log-scale bars on the right
    (log_bars; 1 KiB the bars' floor)."""
    body = [_t(20, 22, "on chip (per SM: shared memory + registers)", 13, weight="bold")]
    body.append(_box(20, 32, 330, 100, PALETTE["chip"], PALETTE["chip_edge"]))
    for i in range(4):  # a row of SMs, the last standing for the rest
        body.append(_box(32 + i * 78, 44, 66, 36, "#ffffff", PALETTE["chip_edge"], rx=3))
        body.append(_t(65 + i * 78, 67, "SM" if i < 3 else "…", 11, "middle"))
    body += [_t(32, 100 + 16 * i, line, 11) for i, line in enumerate(chip[:2])]
    body += [_arrow(140, 140, 140, 186, PALETTE["ink"]), _arrow(230, 186, 230, 140, PALETTE["ink"]),
             _t(250, 168, link, 11)]
    body.append(_box(20, 192, 330, 70, PALETTE["hbm"], PALETTE["hbm_edge"]))
    body.append(_t(32, 214, "device memory (HBM)", 13, weight="bold"))
    body += [_t(32, 234 + 16 * i, line, 11) for i, line in enumerate(hbm[:2])]
    body.append(_t(380, 22, "sizes (log scale)", 13, weight="bold"))
    body += log_bars(380, 36, 230, sizes, 1024)
    height = max(280, 50 + 26 * len(sizes))
    return svg(760, height, "The memory hierarchy: " + "; ".join([*chip, link, *hbm]), body)


def tile_loop_svg(rows: int | str, block_n: int | str, D: int, tiles: int | str, causal: bool) -> str:
    """The fused kernel's loop for one work item: a Q block of `rows` × D on chip, the `tiles` K and V tiles of
    `block_n` keys each streaming past it (a few drawn, the rest elided), and the state it keeps: the running max m,
    sum l and accumulator, rescaled as each tile arrives; O written once at the end. Sizes given as names (str)
    are written as they are."""
    body = [_t(20, 20, "one work item of the fused kernel", 13, weight="bold")]
    body += [_box(20, 110, 88, 90, PALETTE["tile"], PALETTE["tile_edge"]), _t(64, 150, "Q block", 12, "middle"),
             _t(64, 166, f"{rows} × {D}", 10, "middle"), _t(64, 218, "read once", 11, "middle", fill=PALETTE["muted"])]
    body.append(_arrow(110, 155, 128, 155, PALETTE["ink"]))
    last = f"{tiles}" if isinstance(tiles, int) else "last"
    drawn = min(tiles, 4) if isinstance(tiles, int) else 4
    width = max(88 * drawn - 16, 340 if isinstance(rows, int) else 380)  # the state box fits its four lines
    step = (width + 16) / drawn
    for i in range(drawn):
        x = 130 + i * step
        body += [_box(x, 34, 72, 40, PALETTE["hbm"], PALETTE["hbm_edge"]),
                 _t(x + 36, 52, f"K tile {i + 1}" if i < drawn - 1 or tiles == drawn else f"K tile {last}", 11,
                    "middle"),
                 _t(x + 36, 67, f"{block_n} × {D}", 9, "middle", fill=PALETTE["muted"]),
                 _box(x, 230, 72, 40, PALETTE["hbm"], PALETTE["hbm_edge"]),
                 _t(x + 36, 248, f"V tile {i + 1}" if i < drawn - 1 or tiles == drawn else f"V tile {last}", 11,
                    "middle"),
                 _t(x + 36, 263, f"{block_n} × {D}", 9, "middle", fill=PALETTE["muted"])]
        if i == drawn - 2 and (not isinstance(tiles, int) or tiles > drawn):
            body.append(_t(x + (step + 72) / 2, 58, "…", 14, "middle"))
    body += [_box(130, 110, width, 90, PALETTE["state"], PALETTE["state_edge"]),
             _t(140, 130, f"S tile = Q Kⱼᵀ: {rows} × {block_n} scores, in registers, never written", 11),
             _t(140, 150, "m ← max(m, rowmax S)        (running max)", 11),
             _t(140, 168, "l ← l·e^(m_old − m) + Σ e^(S − m)   (running sum)", 11),
             _t(140, 186, "acc ← acc·e^(m_old − m) + e^(S − m) Vⱼ", 11)]
    right = 130 + width
    under = 130 + (drawn - 1) * step + 36  # below and above the last tile drawn
    body += [_arrow(under, 78, under, 108, PALETTE["ink"]), _arrow(under, 228, under, 202, PALETTE["ink"]),
             _arrow(right + 6, 155, right + 40, 155, PALETTE["ink"]),
             _box(right + 44, 125, 96, 60, PALETTE["tile"], PALETTE["tile_edge"]),
             _t(right + 92, 150, "O = acc / l", 12, "middle"), _t(right + 92, 168, "written once", 11, "middle",
                                                                   fill=PALETTE["muted"]),
             _t(130, 296, f"{tiles} K/V tile pairs stream past each Q block"
                + (" (under the causal mask, only those up to the diagonal)" if causal else ""), 11,
                fill=PALETTE["muted"])]
    title = (f"The fused kernel's tile loop: a {rows} × {D} Q block stays on chip while {tiles} K and V tiles of "
             f"{block_n} keys stream past it; per row it keeps a running max m and sum l, rescales its accumulator "
             "as each tile arrives, and writes O once")
    return svg(max(right + 160, 560), 310, title, body)
