"""One colour per build on every figure of every notebook, and how a build's trace is drawn: our three builds in
strong colours and thick lines, the library builds in muted colours and thin lines, so a reader finds ours at a
glance and the same build never changes colour between figures. Every figure module takes its colours from here.

    BUILD_COLOURS            build name → colour (an ablation, 'fused-no_pv', takes its base build's)
    colour(build)            that map, with a muted grey for a build it does not name
    style(build, dash=None)  plotly line and marker settings for a build's trace: width, colour, dash
    QUANTITY_COLOURS         colours of what is not a build: the stages an ablation removes, the parts of an
                             attribution, the series of the model lab, runs side by side; never one of a build's
    series_colour(i)         the i-th colour of a sequence of non-build series (runs, model shares)
    limit_visible(fig, most) at most `most` traces drawn per panel: the rest behind their legend entry
                             (visible='legendonly'), library builds first
"""
from __future__ import annotations

OURS = ("materialised", "qk_softmax", "fused")
MOST_VISIBLE = 8  # traces drawn at once in one panel; more and no line can be followed

# Okabe–Ito's colour-blind-safe hues for ours; muted tints, none of them blue-on-blue with ours, for the libraries.
BUILD_COLOURS = {
    "materialised": "#D55E00",  # vermillion
    "qk_softmax": "#009E73",  # bluish green
    "fused": "#0072B2",  # blue
    "torch_eager": "#B08070",  # muted brown: the materialised form written in torch
    "sdpa_default": "#8C8C8C",  # grey
    "sdpa_flash": "#D4B65A",  # muted mustard
    "sdpa_efficient": "#B39DDB",  # muted lavender
    "sdpa_cudnn": "#9CC283",  # muted sage
    "sdpa_math": "#E8A5C3",  # muted pink
    "flex": "#7FC4C4",  # muted teal
    "compiled": "#C9B79C",  # muted sand
    "copy_v": "#A0A0A0",  # the model lab's attention that computes nothing
    "transformers_sdpa": "#4D4D4D",  # charcoal: a transformers model's own SDPA attention, the model labs' reference
    "transformers_eager": "#7A5C4F",  # dark muted brown: a transformers model's own eager attention
}
OTHER = "#B5B5B5"  # a build this map does not name
OURS_WIDTH, LIBRARY_WIDTH = 3.5, 1.5
OURS_MARKER, LIBRARY_MARKER = 8, 5

# Colours of what is not a build, none of them a build's colour.
QUANTITY_COLOURS = {
    "measured": "#332288",  # indigo: what was measured
    "predicted": "#DDAA33",  # sand: the byte model's prediction
    "predicted_with_qk": "#AA4499",  # purple: the prediction with the QKᵀ pass the step changes
    "softmax": "#882255",  # wine: removing the softmax
    "pv": "#44AA99",  # teal: dropping the PV
    "mask": "#999933",  # olive: applying a mask
    "roof": "#000000",  # the measured ceilings
    "ceiling": "#777777",  # a bound drawn for reference
}
SERIES = ("#332288", "#DDAA33", "#AA4499", "#44AA99", "#882255", "#999933", "#117733", "#CC6677")


def base_of(build: str) -> str:
    """An ablation's base build ('fused-no_pv' → 'fused'); any other name as it is."""
    head, sep, _ = build.partition("-")
    return head if sep and head in OURS else build


def is_ours(build: str) -> bool:
    return base_of(build) in OURS


def ours_first(builds) -> list[str]:
    """The builds in drawing order: ours in OURS's order, then the others as they first appear."""
    present = list(dict.fromkeys(builds))
    return [b for b in OURS if b in present] + [b for b in present if not is_ours(b)]


def colour(build: str) -> str:
    return BUILD_COLOURS.get(base_of(build), OTHER)


def style(build: str, dash: str | None = None) -> dict:
    """A build's trace settings for go.Scatter: line=… and marker=…, ours thick and libraries thin."""
    ours = is_ours(build)
    line = dict(color=colour(build), width=OURS_WIDTH if ours else LIBRARY_WIDTH)
    if dash:
        line["dash"] = dash
    return dict(line=line, marker=dict(color=colour(build), size=OURS_MARKER if ours else LIBRARY_MARKER),
                meta={"build": build})


def series_colour(i: int) -> str:
    return SERIES[i % len(SERIES)]


def _panel(trace) -> tuple[str, str]:
    return (getattr(trace, "xaxis", None) or "x", getattr(trace, "yaxis", None) or "y")


def _drawn(trace) -> bool:
    return trace.visible in (None, True)


def _library(trace) -> bool:
    meta = trace.meta if isinstance(trace.meta, dict) else {}
    return "build" in meta and not is_ours(meta["build"])


def limit_visible(fig, most: int = MOST_VISIBLE):
    """At most `most` traces drawn in each panel of `fig`: past that, every library build's trace in the panel goes
    behind its legend entry (a click draws it; a panel never shows some libraries and not others), then, if still
    too many, the panel's last traces. Returns `fig`."""
    panels: dict[tuple[str, str], list] = {}
    for t in fig.data:
        if _drawn(t):
            panels.setdefault(_panel(t), []).append(t)
    for traces in panels.values():
        if len(traces) <= most:
            continue
        libraries = [t for t in traces if _library(t)]
        rest = [t for t in traces if not _library(t)]
        hide = libraries + (rest[most:] if len(rest) > most else [])
        for t in hide:
            t.visible = "legendonly"
    for t in fig.data:  # a hidden trace keeps a legend entry to click: its own, or its legend group's
        if t.visible == "legendonly" and not any(o.showlegend is not False for o in fig.data
                                                 if t.legendgroup and o.legendgroup == t.legendgroup):
            t.showlegend = True
    return fig
