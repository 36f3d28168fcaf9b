"""The shape explorer behind notebooks/explore_shapes.ipynb: controls for one attention shape and the builds to run,
a figure that updates in place, and only what can honestly be shown on the machine at hand.

On a GPU (live)    each build is called as a user calls it: eagerly, back to back (attnlab.measure.Eager, CUDA
                   events around the window; the per-call time includes Python's cost to launch it), its peak
                   allocation measured in a pass of its own, its output checked against the fp64 oracle (on a slice
                   where the reference would not fit). A build whose inputs plus the tensors it must hold
                   (attnlab.cost.hold_bytes) exceed the device's free memory is not called: the page says so.
Without a GPU      nothing is timed: Triton's interpreter measures Python, not kernels. The page shows, each labelled:
(teach)            the model's FLOPs, bytes moved and bytes held, for the chosen shape and every N (attnlab.cost);
                   the committed GPU run's measurements nearest to the shape (attnlab.runs.reference_run: the
                   newest run on a CUDA device whose results hold our three builds); and a correctness check of each
                   build at a small version of the shape (B = 1, N at most 64, at most four query heads) in Triton's
                   interpreter against the fp64 oracle, attnlab.reference.

Each change measures only what is new: results are kept in a cache keyed by attnlab.measure.Case (the build and the
shape), so returning to a shape, or adding a build, reuses what was measured. A shape attnlab.validate refuses, a
build that raises attnlab.builds.Unsupported and a case too large for the device each get one line in the page,
never a traceback. The figure is a plotly FigureWidget (an anywidget since plotly 6) whose traces are replaced on
every change; an exported page has no Python behind it, so `static_view` draws a plain figure with a slider instead.

    ex = Explorer()          # live on a GPU, teach mode without one
    ex.widget                # the controls, a progress bar, the figure, the messages and the table
    static_view()            # the committed run (or the model) under a slider, for HTML exports
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from functools import partial

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from attnlab import builds, compare, cost, runs, validate
from attnlab.accuracy import judge
from attnlab.builds import Unsupported
from attnlab.report import palette
from attnlab.report.units import byte_axis, byte_label
from attnlab.measure import Case, Eager, case_plan, make_inputs, pipeline, release

N_OPTIONS = tuple(2 ** i for i in range(6, 18))  # 64 … 131072
D_OPTIONS = (16, 32, 64, 128, 256)
DTYPES = ("bfloat16", "float16", "float32")
DEFAULT = dict(N=2048, D=64, B=4, H=16, Hkv=16, causal=False, dtype="bfloat16",
               builds=("materialised", "qk_softmax", "fused", "sdpa_default"))
CHECK_N = 64  # the correctness check's longest sequence in Triton's interpreter (slow: seconds a build past this)
CHECK_GROUP = 4  # the most query heads per key/value head the check keeps
LIVE_REF_BUDGET = 256 << 20  # fp64 scores the live check's reference may hold before it runs on a slice
PANELS = {  # the figure's three panels: (title, y-axis title, whether the axis counts bytes) in each mode
    "live": (("time per call, eager back to back", "time per call (ms, CUDA events)", False),
             ("peak allocation; must hold (dotted, model)", "memory (bytes)", True),
             ("achieved rate: model FLOPs / time", "achieved rate (TFLOP/s)", False)),
    "teach": (("bytes each build moves (model)", "moved per call (bytes, model)", True),
              ("bytes each build holds at once (model)", "held at once (bytes, model)", True),
              ("committed GPU run (not this machine)", "time per call (ms, CUDA-graph replay)", False)),
}
# Where each panel sits: two side by side, the third under them at their joint width. Three in a row need 1100 px; a
# notebook cell at 1280 px with JupyterLab's file browser open is about 850. No width is set: plotly's FigureWidget
# sizes itself before it is in the page and so draws at plotly's default 700 px (it does not follow its cell), which
# fits; the legend goes under the panels.
PANEL_CELLS = ((1, 1), (1, 2), (2, 1))
X_TITLE = "sequence length N (tokens)"


# -- shapes and cases ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """One attention shape, as the controls set it: q (B, H, N, D), k and v (B, Hkv, N, D)."""

    B: int
    H: int
    Hkv: int
    N: int
    D: int
    dtype: str
    causal: bool

    def case(self, build: str, device: str) -> Case:
        return Case(build, self.B, self.H, self.Hkv, self.N, self.D, self.dtype, self.causal, device)

    @property
    def where(self) -> str:
        return (f"B={self.B} H={self.H}" + (f" Hkv={self.Hkv}" if self.Hkv != self.H else "")
                + f" N={self.N} D={self.D} {self.dtype} {'causal' if self.causal else 'non-causal'}")


def where(case: Case) -> str:
    return Shape(case.B, case.H, case.Hkv, case.N, case.D, case.dtype, case.causal).where


def problem(shape: Shape) -> str:
    """'' or attnlab.validate's message for the shape (checked on meta tensors: nothing is allocated)."""
    for name in ("B", "H", "Hkv", "N", "D"):
        value = getattr(shape, name)
        if not isinstance(value, int) or value < 1:
            return f"{name} must be a whole number >= 1, got {value!r}"
    if shape.dtype not in DTYPES:
        return f"dtype must be one of {', '.join(DTYPES)}, got {shape.dtype!r}"

    def meta(heads):
        return torch.empty(shape.B, heads, shape.N, shape.D, dtype=getattr(torch, shape.dtype), device="meta")
    try:
        validate.check(meta(shape.H), meta(shape.Hkv), meta(shape.Hkv), causal=bool(shape.causal))
    except ValueError as e:
        return str(e)
    return ""


def need_bytes(case: Case) -> int:
    """What calling the build at the case takes at once: q, k and v, plus what it must hold (attnlab.cost)."""
    s = cost.sizes(case)
    return s["qb"] + s["kvb"] + cost.hold_bytes(case)


def size(n: float) -> str:
    """Bytes as a person reads them: '1.50 GiB'."""
    if not isinstance(n, (int, float)) or not math.isfinite(n):
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return ""


def too_big(case: Case, free: int, where_free: str) -> str:
    """'' or why the case is not run: its inputs and holds exceed `free` bytes."""
    need = need_bytes(case)
    if need <= free:
        return ""
    return (f"{case.build} is not run at {where(case)}: it needs {size(need)} at once (q, k, v and the "
            f"{builds.get(case.build).holds!r} it must hold, attnlab.cost), more than the {size(free)} free on "
            f"{where_free}")


def small_case(shape: Shape, build: str) -> Case:
    """The shape cut down for the interpreter: B = 1, N ≤ CHECK_N, at most CHECK_GROUP query heads per k/v head and
    one k/v head under grouped-query attention (two heads without it); D, dtype and causal as chosen."""
    group = shape.H // shape.Hkv
    g = min(group, CHECK_GROUP)
    hkv = 1 if group > 1 else min(shape.Hkv, 2)
    return Case(build, 1, g * hkv, hkv, min(shape.N, CHECK_N), shape.D, shape.dtype, shape.causal, "cpu")


# -- one case: measured live, or checked in the interpreter -------------------------------------------------------

def measure_live(case: Case, *, reps_ms: float = 100.0) -> dict:
    """One build at one shape on a GPU: attnlab.measure's pipeline with its Eager timer, one window: cold call,
    error against the fp64 oracle (on a slice where the reference would not fit), eager per-call time, peak
    allocation. Raises what the build raises (Unsupported, ValueError, out of memory)."""
    got = pipeline(lambda: case_plan(case, ref_budget_bytes=LIVE_REF_BUDGET), torch.device(case.device),
                   Eager(reps_ms=reps_ms), base=builds.get(case.build).base)
    if got.error is not None:
        raise got.error
    f = got.fields
    message = "; ".join(n for n in (f.get("compile_note", ""), f["err_note"]) if n)
    return dict(status="ok", message=message, ms=f["ms"], reps=f["reps"], timer=f["timer"], cold_s=f["cold_s"],
                peak_bytes=f["peak_bytes"], err=f["err"], err_limit=f["err_limit"], passed=f["err"] <= f["err_limit"])


def check_small(case: Case) -> dict:
    """One build at a small case on the CPU (our kernels in Triton's interpreter): its error against the fp64 oracle
    under FlashAttention's rule (attnlab.accuracy). No time: the interpreter's would measure Python."""
    b = builds.get(case.build)
    q, k, v = make_inputs(case)
    o = b.attend(q, k, v, causal=case.causal)
    verdict = judge(o, q, k, v, causal=case.causal, ablation=b.ablation)
    return dict(status="ok", message="", err=verdict.err, err_limit=verdict.limit, passed=verdict.ok)


def free_memory(device: str) -> int:
    """Bytes free on the CUDA device now (the driver's count, beyond what torch's allocator caches)."""
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return int(free) + int(torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


# -- the committed run --------------------------------------------------------------------------------------------

def _far(values: pd.Series, target: float) -> pd.Series:
    """|log2(values / target)|: how many doublings each value is from the target."""
    return (values.astype(float) / target).map(lambda x: abs(math.log2(x)))


def _distance(rows: pd.DataFrame, shape: Shape) -> pd.DataFrame:
    """The rows with their distance to `shape`: dtype, then head dim, then N, then B·H, then the group."""
    return rows.assign(_dtype=(rows["dtype"] != shape.dtype).astype(int), _D=_far(rows["D"], shape.D),
                       _N=_far(rows["N"], shape.N), _BH=_far(rows["B"] * rows["H"], shape.B * shape.H),
                       _g=_far(rows["H"] // rows["Hkv"], shape.H // shape.Hkv))


def _differs(row, shape: Shape) -> str:
    named = dict(B=shape.B, H=shape.H, Hkv=shape.Hkv, N=shape.N, D=shape.D, dtype=shape.dtype)
    out = [f"{k} {row[k]} (yours {v})" for k, v in named.items() if row[k] != v]
    return ", ".join(out) if out else "your shape"


def nearest(results: pd.DataFrame, shape: Shape, names) -> pd.DataFrame:
    """For each build in `names`, the committed ok row nearest to `shape` of the same causal setting (dtype first,
    then head dim, N, B·H and group, each by ratio), with what differs from the shape."""
    cols = ["build", "B", "H", "Hkv", "N", "D", "dtype", "causal", "ms", "peak_bytes", "timer", "differs"]
    ok = results[(results["status"] == "ok") & results["build"].isin(list(names))
                 & (results["causal"] == bool(shape.causal))]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    ranked = _distance(ok, shape).sort_values(["_dtype", "_D", "_N", "_BH", "_g"], kind="stable")
    picked = ranked.groupby("build", sort=False).head(1)
    picked = picked.assign(differs=[_differs(r, shape) for _, r in picked.iterrows()])
    order = {n: i for i, n in enumerate(names)}
    return picked.sort_values("build", key=lambda s: s.map(order))[cols].reset_index(drop=True)


def committed_curve(results: pd.DataFrame, shape: Shape, build: str) -> pd.DataFrame:
    """The committed ok rows of `build` along N nearest to `shape` (same causal, nearest dtype and head dim, then
    the nearest B·H at each N), sorted by N."""
    ok = results[(results["status"] == "ok") & (results["build"] == build) & (results["causal"] == bool(shape.causal))]
    if ok.empty:
        return ok
    ranked = _distance(ok, shape).sort_values(["_dtype", "_D"], kind="stable")
    best = ranked.iloc[0]
    same = ranked[(ranked["dtype"] == best["dtype"]) & (ranked["D"] == best["D"])]
    return same.sort_values(["N", "_BH", "_g"], kind="stable").groupby("N").head(1).sort_values("N")


# -- the explorer -------------------------------------------------------------------------------------------------

def controls(**values) -> dict:
    """The explorer's controls, each with a description and a tooltip saying what it sets."""
    v = {**DEFAULT, **values}
    wide = dict(style={"description_width": "initial"}, layout=widgets.Layout(width="auto"))
    return {
        # a slider's track has no width of its own: under width 'auto' in a column that shrinks to its content it
        # collapses to nothing and only the handle shows, so the slider gets the row's width (up to 40em)
        "N": widgets.SelectionSlider(options=sorted({*N_OPTIONS, int(v["N"])}), value=int(v["N"]),
                                     description="N (sequence length)", continuous_update=False,
                                     tooltip="tokens per sequence: S and P grow as N², Q, K, V and O as N",
                                     style={"description_width": "initial"},
                                     layout=widgets.Layout(width="100%", max_width="40em")),
        "D": widgets.Dropdown(options=sorted({*D_OPTIONS, int(v["D"])}), value=int(v["D"]),
                              description="D (head dim)", tooltip="features per head", **wide),
        "B": widgets.BoundedIntText(value=int(v["B"]), min=1, max=65536, description="B (batch)",
                                    tooltip="sequences per call", **wide),
        "H": widgets.BoundedIntText(value=int(v["H"]), min=1, max=1024, description="H (query heads)",
                                    tooltip="query heads", **wide),
        "Hkv": widgets.BoundedIntText(value=int(v["Hkv"]), min=1, max=1024, description="Hkv (key/value heads)",
                                      tooltip="key/value heads; fewer than H is grouped-query attention "
                                              "(H must be a multiple of Hkv)", **wide),
        "causal": widgets.Checkbox(value=bool(v["causal"]), description="causal",
                                   tooltip="each query attends to itself and earlier keys only", **wide),
        "dtype": widgets.Dropdown(options=DTYPES, value=v["dtype"], description="dtype",
                                  tooltip="the inputs' and outputs' element type", **wide),
        "builds": widgets.SelectMultiple(options=builds.names(), value=tuple(v["builds"]), rows=8,
                                         description="builds", tooltip="ours, their ablations and the library "
                                                                       "rows (ctrl-click for several)", **wide),
    }


class Explorer:
    """Controls, a progress bar, a FigureWidget, messages and a table, wired so that every change of a control
    measures what is new and redraws (module docstring).

    device       'cuda…' measures live; anything else teaches (the default: cuda when present).
    measure      case -> result dict (status, message, numbers); default measure_live on a GPU, check_small without.
    free_bytes   () -> bytes free on the device (live only; default: the driver's count).
    reference    a committed run folder for the teach view, None for none, 'auto' for runs.reference_run().
    check        teach mode: run the interpreter's correctness check (False leaves the model and the committed run).
    **values     the controls' starting values (DEFAULT)."""

    def __init__(self, device=None, *, measure=None, free_bytes=None, reference="auto", check: bool = True,
                 reps_ms: float = 100.0, **values):
        self.device = str(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.live = torch.device(self.device).type == "cuda"
        self.mode = "live" if self.live else "teach"
        self._measure = measure or (partial(measure_live, reps_ms=reps_ms) if self.live else check_small)
        self._free = free_bytes or (partial(free_memory, self.device) if self.live else None)
        self.check = check
        folder = runs.reference_run() if reference == "auto" else reference
        self.reference = compare.read_run(folder) if folder is not None else None
        self.cache: dict[Case, dict] = {}
        self.measured: list[Case] = []  # every case measured, in order (nothing twice)
        self.controls = controls(**values)
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="measuring",
                                            layout=widgets.Layout(visibility="hidden"))
        self.status = widgets.HTML()
        self.banner = widgets.HTML(self._banner())
        self.messages = widgets.HTML()
        self.table = widgets.HTML()
        self.figure = go.FigureWidget(make_subplots(rows=2, cols=2, specs=[[{}, {}], [{"colspan": 2}, None]],
                                                    horizontal_spacing=0.12, vertical_spacing=0.16,
                                                    subplot_titles=[t for t, _, _ in PANELS[self.mode]]))
        self.figure.update_layout(template="plotly_white", height=820, legend_title_text="build",
                                  legend=dict(orientation="h", x=0, y=-0.1, yanchor="top"),
                                  margin=dict(l=70, r=20, t=100, b=40))
        for (_, y_title, _), (row, col) in zip(PANELS[self.mode], PANEL_CELLS):
            self.figure.update_xaxes(type="log", title_text=X_TITLE, row=row, col=col)
            self.figure.update_yaxes(type="log", title_text=y_title, row=row, col=col)
        c = self.controls
        knobs = widgets.VBox([c["N"], widgets.HBox([widgets.VBox([c["D"], c["dtype"], c["causal"]]),
                                                    widgets.VBox([c["B"], c["H"], c["Hkv"]]), c["builds"]],
                                                   layout=widgets.Layout(flex_flow="row wrap"))])
        self.widget = widgets.VBox([self.banner, knobs, widgets.HBox([self.progress, self.status]), self.figure,
                                    self.messages, self.table])  # what a notebook cell shows
        for w in self.controls.values():
            w.observe(self.update, names="value")
        self.update()

    # what the controls say
    def shape(self) -> Shape:
        c = self.controls
        return Shape(int(c["B"].value), int(c["H"].value), int(c["Hkv"].value), int(c["N"].value),
                     int(c["D"].value), str(c["dtype"].value), bool(c["causal"].value))

    def selected(self) -> list[str]:
        return list(self.controls["builds"].value)

    def case_of(self, shape: Shape, build: str) -> Case:
        """The case measured for `build` at `shape`: the shape itself live, its small version in the interpreter."""
        return shape.case(build, self.device) if self.live else small_case(shape, build)

    # one change
    def update(self, change=None) -> None:
        """Measure what the controls now ask for that is not yet in the cache, then redraw."""
        shape = self.shape()
        why = problem(shape)
        if why:
            self.messages.value = _html_list([f"this shape is refused before anything runs: {why}"])
            self.status.value = "nothing measured: fix the shape"
            self.figure.update_layout(title_text=f"no figure for {shape.where}: the shape is refused (why: below)")
            with self.figure.batch_update():  # an empty trace a panel keeps its axes (plotly hides a bare subplot)
                self.figure.data = ()
                self.figure.add_traces([go.Scatter(x=[], y=[], showlegend=False, hoverinfo="skip")] * 3,
                                       rows=[r for r, _ in PANEL_CELLS], cols=[c for _, c in PANEL_CELLS])
            self.table.value = ""
            return
        todo = []
        if self.live or self.check:
            todo = list(dict.fromkeys(c for c in (self.case_of(shape, b) for b in self.selected())
                                      if c not in self.cache))
        kept = len(self.selected()) - len(todo) if (self.live or self.check) else 0
        self.progress.max, self.progress.value = max(1, len(todo)), 0
        self.progress.layout.visibility = "visible" if todo else "hidden"
        for i, case in enumerate(todo, start=1):
            self.status.value = html.escape(f"measuring {case.build} at {where(case)} ({i} of {len(todo)})…")
            self.cache[case] = self._run(case)
            self.measured.append(case)
            self.progress.value = i
        self.progress.layout.visibility = "hidden"
        self.status.value = html.escape(f"{len(todo)} case(s) measured now, {kept} kept from before")
        self._draw(shape)

    def _run(self, case: Case) -> dict:
        """The measure function's result, or a refusal with one line saying why (never a traceback)."""
        if self.live and self._free is not None:
            why = too_big(case, self._free(), self.device)
            if why:
                return dict(status="too big", message=why)
        try:
            return self._measure(case)
        except Unsupported as e:
            out = dict(status="unsupported", message=f"{case.build} is unsupported at {where(case)}: {e}")
        except ValueError as e:
            out = dict(status="invalid", message=f"{case.build} refused {where(case)}: {e}")
        except torch.OutOfMemoryError as e:
            out = dict(status="oom", message=f"{case.build} ran out of memory at {where(case)}: "
                                             f"{str(e).splitlines()[0]}")
        except Exception as e:
            out = dict(status="error", message=f"{case.build} failed at {where(case)}: {type(e).__name__}: {e}")
        release(torch.device(case.device))  # a failure's traceback holds its frames' tensors in reference cycles
        return out

    # drawing
    def _banner(self) -> str:
        if self.live:
            from attnlab.provenance import device_name

            try:
                name = f"{device_name(self.device)} ({self.device})"
            except (RuntimeError, AssertionError):  # a device torch cannot name (no driver): say which one was asked
                name = self.device
            return (f"<b>Live on {html.escape(name)}</b>: each build is called eagerly, back "
                    "to back, as you would call it from Python (CUDA events; the time per call includes Python's "
                    "cost to launch it). Peak allocation in a pass of its own; error against the fp64 oracle.")
        ref = (f"the committed run <code>{html.escape(self.reference.label)}</code> on "
               f"{html.escape(self.reference.card)}" if self.reference else "no committed GPU run (none found)")
        return ("<b>No GPU here: nothing is timed.</b> Triton's interpreter runs our kernels in Python on the CPU, "
                "so its times would measure Python, not kernels, and are never shown. You see instead, each "
                "labelled: the model's bytes and FLOPs for any shape (<code>attnlab.cost</code>); the nearest "
                f"measurements from {ref}; and a correctness check of each build at a small version of your shape "
                "in the interpreter, against the fp64 oracle.")

    def _draw(self, shape: Shape) -> None:
        traces = self._live_traces(shape) if self.live else self._teach_traces(shape)
        with self.figure.batch_update():
            self.figure.data = ()
            self.figure.add_traces(traces)
            for i, (_, _, in_bytes) in enumerate(PANELS[self.mode], start=1):  # ticks for the values now shown
                axis = "" if i == 1 else str(i)
                self.figure.layout[f"xaxis{axis}"].update(n_axis([x for t in traces if t.xaxis == f"x{axis}"
                                                                  for x in t.x]))
                if in_bytes:  # KiB … TiB at powers of two
                    self.figure.layout[f"yaxis{axis}"].update(byte_axis([y for t in traces if t.yaxis == f"y{axis}"
                                                                         for y in t.y]))
            self.figure.layout.title.text = (  # two lines: one would run past a narrow cell
                f"{shape.where}:<br>" + ("measured live, eager" if self.live else
                                         "model and committed run; no time measured on this machine"))
        self.messages.value = _html_list(self.notes(shape))
        self.table.value = self.table_frame(shape).to_html(index=False, na_rep="", escape=True)

    def _points(self, shape: Shape, build: str) -> list[tuple[int, dict]]:
        """(N, result) of every ok live measurement of `build` at `shape` but for N, by N."""
        out = []
        for case, r in self.cache.items():
            if (case.build == build and r.get("status") == "ok" and
                    (case.B, case.H, case.Hkv, case.D, case.dtype, case.causal, case.device)
                    == (shape.B, shape.H, shape.Hkv, shape.D, shape.dtype, shape.causal, self.device)):
                out.append((case.N, r))
        return sorted(out, key=lambda x: x[0])

    def _live_traces(self, shape: Shape) -> list:
        traces = []
        for i, build in enumerate(self.selected()):
            pts = self._points(shape, build)
            if not pts:
                continue
            ns = [n for n, _ in pts]
            marks = [12 if n == shape.N else 6 for n in ns]
            traces.append(_line(ns, [r["ms"] for _, r in pts], build, build, 1, marks, legend=True))
            traces.append(_line(ns, [r["peak_bytes"] for _, r in pts], build, build, 2, marks, in_bytes=True))
            cases = [Case(build, shape.B, shape.H, shape.Hkv, n, shape.D, shape.dtype, shape.causal) for n in ns]
            traces.append(_line(ns, [cost.hold_bytes(c) for c in cases], f"{build} must hold (model)", build, 2,
                                marks, dotted=True, in_bytes=True))
            traces.append(_line(ns, [cost.flops(c) / (r["ms"] * 1e9) for c, (_, r) in zip(cases, pts)], build,
                                build, 3, marks))
        return traces

    def _teach_traces(self, shape: Shape) -> list:
        traces = []
        ns = sorted({*N_OPTIONS, shape.N})
        marks = [12 if n == shape.N else 5 for n in ns]
        for build in self.selected():
            cases = [Case(build, shape.B, shape.H, shape.Hkv, n, shape.D, shape.dtype, shape.causal) for n in ns]
            traces.append(_line(ns, [cost.bytes_moved(c) for c in cases], f"{build} (model)", build, 1, marks,
                                legend=True, in_bytes=True))
            traces.append(_line(ns, [cost.hold_bytes(c) for c in cases], f"{build} (model)", build, 2, marks,
                                in_bytes=True))
            if self.reference is not None:
                curve = committed_curve(self.reference.results, shape, build)
                if not curve.empty:
                    hover = [f"B={r.B} H={r.H} Hkv={r.Hkv} N={r.N} D={r.D} {r.dtype}" for r in curve.itertuples()]
                    traces.append(go.Scatter(x=list(curve["N"]), y=list(curve["ms"]), mode="lines+markers",
                                             name=f"{build} ({self.reference.card}, committed)",
                                             legendgroup=build, showlegend=False, hovertext=hover,
                                             line=line_style(build), xaxis="x3", yaxis="y3"))
        if self.reference is not None and self.reference.total_memory:
            memory = self.reference.total_memory
            traces.append(go.Scatter(x=[ns[0], ns[-1]], y=[memory] * 2, mode="lines",
                                     name=f"{self.reference.card} memory (committed run's provenance)",
                                     customdata=[byte_label(memory)] * 2, hovertemplate="%{customdata}",
                                     line=dict(color="grey", dash="dot"), xaxis="x2", yaxis="y2"))
        return traces

    def notes(self, shape: Shape) -> list[str]:
        """The page's messages for the shape: refusals, and in teach mode what each panel and check is."""
        out = [r["message"] for r in (self.cache.get(self.case_of(shape, b)) for b in self.selected())
               if r is not None and r.get("status") != "ok" and r.get("message")]
        if self.live:
            return out
        if self.check and self.selected():
            c = small_case(shape, self.selected()[0])
            out.append(f"correctness is checked at {where(c)} in Triton's interpreter on this CPU (the check's "
                       "time measures Python, so it is not shown)")
        if self.reference is None:
            out.append("no committed GPU run found under outputs/: the third panel is empty")
        else:
            card, memory = self.reference.card, self.reference.total_memory
            out.append(f"third panel: the committed run {self.reference.label} on {card}, at the run's own shapes "
                       "nearest to yours (hover for each point's shape), timed as CUDA-graph replays")
            for b in self.selected():
                need = need_bytes(shape.case(b, "cpu"))
                if memory and need > memory:
                    out.append(f"{b} would need {size(need)} at once at {shape.where} (q, k, v and what it must "
                               f"hold, attnlab.cost): more than the {size(memory)} of the {card}; it could not "
                               "run there")
        return out

    def table_frame(self, shape: Shape | None = None) -> pd.DataFrame:
        """The numbers at the current shape, one row per selected build, each column saying where it comes from."""
        shape = shape or self.shape()
        rows = []
        near = (nearest(self.reference.results, shape, self.selected()).set_index("build")
                if self.reference is not None and not self.live else pd.DataFrame())
        for build in self.selected():
            case = shape.case(build, self.device)
            r = self.cache.get(self.case_of(shape, build), {})
            row = {"build": build, "GFLOP (model)": cost.flops(case) / 1e9,
                   "bytes moved (model)": size(cost.bytes_moved(case)),
                   "must hold (model)": size(cost.hold_bytes(case)),
                   "FLOP per byte (model)": round(cost.flops(case) / cost.bytes_moved(case), 1)}
            if self.live:
                ok = r.get("status") == "ok"
                row.update({"ms per call (eager)": r.get("ms") if ok else None,
                            "calls timed": r.get("reps") if ok else None,
                            "TFLOP/s": cost.flops(case) / (r["ms"] * 1e9) if ok else None,
                            "peak allocation": size(r["peak_bytes"]) if ok else None})
            else:
                if build in near.index:
                    n = near.loc[build]
                    row.update({f"{self.reference.card} ms (committed)": n["ms"],
                                f"{self.reference.card} peak (committed)": size(n["peak_bytes"]),
                                "committed at": n["differs"]})
            if r:
                ok = r.get("status") == "ok"
                label = "error vs fp64 (live)" if self.live else "error vs fp64 (interpreter, small shape)"
                row.update({label: r.get("err") if ok else None, "limit": r.get("err_limit") if ok else None,
                            "passes": ("yes" if r.get("passed") else "NO") if ok else r.get("status")})
            rows.append(row)
        return pd.DataFrame(rows)


def _line(x, y, name, build, panel: int, marks, legend=False, dotted=False, in_bytes=False) -> go.Scatter:
    """One build's line on one panel, in the build's colour and weight (line_style), dotted for the model's must
    hold; a byte count's hover reads in KiB … TiB (attnlab.report.units), not SI."""
    axis = "" if panel == 1 else str(panel)
    line = {**line_style(build), **({"dash": "dot"} if dotted else {})}
    hover = dict(customdata=[byte_label(v) for v in y], hovertemplate="N=%{x}: %{customdata}") if in_bytes else {}
    return go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=name, legendgroup=name.split(" ")[0],
                      showlegend=legend, marker=dict(size=list(marks)), line=line, xaxis=f"x{axis}",
                      yaxis=f"y{axis}", **hover)


def n_axis(ns, most: int = 6) -> dict:
    """Keyword arguments of update_xaxes for a log axis of N: the powers of two from the smallest N to the largest,
    every second, fourth … so that at most `most` remain, written out ('1024', not plotly's '1k')."""
    ns = [n for n in ns if isinstance(n, (int, float)) and n > 0]
    if not ns:
        return {}
    lo, hi = math.ceil(math.log2(min(ns))), math.floor(math.log2(max(ns)))
    step = next(s for s in (1, 2, 4, 8, 16, 32) if (hi - lo) // s + 1 <= most or s == 32)
    ticks = [2 ** e for e in range(lo, hi + 1, step)] or [min(ns)]
    return dict(tickmode="array", tickvals=ticks, ticktext=[str(t) for t in ticks])


def _html_list(items) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>" if items else ""


# One colour per build, the same whatever else is selected and on every figure of the lab (attnlab.report.palette);
# an ablation takes its base's colour, dashed. Ours are drawn heavier than the library rows, so a library line lying
# on one of ours leaves it in view.
def colour(build: str) -> str:
    return palette.colour(build)


def line_style(build: str) -> dict:
    b = builds.get(build)
    return dict(color=colour(build), dash="dash" if b.ablation else "solid",
                width=palette.LIBRARY_WIDTH if b.family == "library" else palette.OURS_WIDTH)


# -- the static view ----------------------------------------------------------------------------------------------

def static_view(reference="auto", names=None) -> go.Figure:
    """A plain plotly figure that still moves in an exported page: a slider over (dtype, D, causal).

    With a committed run (default: runs.reference_run()): its time per call (left) and peak allocation beside
    what each build must hold (right, model dotted) against N, per build in `names` (default: ours and the SDPA
    default). Without one: the model's bytes moved and held for the explorer's default B and H."""
    folder = runs.reference_run() if reference == "auto" else reference
    run = compare.read_run(folder) if folder is not None else None
    names = list(names or (*builds.OURS, "sdpa_default"))
    if run is not None:
        ok = run.results[(run.results["status"] == "ok") & run.results["build"].isin(names)]
        keys = sorted({(str(r.dtype), int(r.D), bool(r.causal)) for r in ok.itertuples()})
        left = "time per call (ms, CUDA-graph replay)"
        right = "memory (bytes)"
        title = f"committed run {run.label} on {run.card}:<br>move the slider to change dtype, head dim and causal"
    else:
        keys = [(DEFAULT["dtype"], d, c) for d in D_OPTIONS for c in (False, True)]
        left, right = "moved per call (bytes, model)", "held at once (bytes, model)"
        title = (f"the model (attnlab.cost) at B={DEFAULT['B']} H={DEFAULT['H']}: no committed GPU run found;<br>"
                 "move the slider to change head dim and causal")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=["time" if run else "bytes moved",
                                        "peak (solid), must hold (dotted)" if run else "memory"])
    in_bytes = (2,) if run is not None else (1, 2)  # the panels whose axis counts bytes
    owner = []  # the slider step each trace belongs to
    for step, (dtype, D, causal) in enumerate(keys):
        for build in names:
            if run is not None:
                rows = ok[(ok["build"] == build) & (ok["dtype"] == dtype) & (ok["D"] == D)
                          & (ok["causal"] == causal)].sort_values("N")
                if rows.empty:
                    continue
                hold = [cost.hold_bytes(Case(build, r.B, r.H, r.Hkv, r.N, r.D, r.dtype, r.causal))
                        for r in rows.itertuples()]
                series = ((1, rows["ms"], "solid", True, build), (2, rows["peak_bytes"], "solid", False, build),
                          (2, hold, "dot", False, f"{build} must hold (model)"))
                ns = rows["N"]
            else:
                ns = list(N_OPTIONS)
                cases = [Case(build, DEFAULT["B"], DEFAULT["H"], DEFAULT["H"], n, D, dtype, causal) for n in ns]
                series = ((1, [cost.bytes_moved(c) for c in cases], "solid", True, build),
                          (2, [cost.hold_bytes(c) for c in cases], "solid", False, build))
            for col, y, dash, legend, name in series:
                hover = (dict(customdata=[byte_label(v) for v in y], hovertemplate="N=%{x}: %{customdata}")
                         if col in in_bytes else {})
                fig.add_trace(go.Scatter(x=list(ns), y=list(y), mode="lines+markers", name=name, legendgroup=build,
                                         showlegend=legend, visible=step == 0,
                                         line={**line_style(build), **({"dash": dash} if dash != "solid" else {})},
                                         **hover), row=1, col=col)
                owner.append(step)
    labels = [f"{dtype} D={D} {'causal' if causal else 'non-causal'}" for dtype, D, causal in keys]
    fig.update_layout(
        title=title, template="plotly_white", height=480, legend_title_text="build",
        sliders=[dict(active=0, currentvalue=dict(prefix="shown: "), pad=dict(t=60), steps=[
            dict(label=label, method="update", args=[{"visible": [o == s for o in owner]},
                                                     {"title.text": f"{title} ({label})"}])
            for s, label in enumerate(labels)])])
    fig.update_xaxes(type="log", title_text=X_TITLE)
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text=left, row=1, col=1)
    fig.update_yaxes(title_text=right, row=1, col=2)
    for col in (1, 2):  # N as numbers, not "2k"; bytes in KiB … TiB, not plotly's SI "1T", over every step's values
        axis = "" if col == 1 else str(col)
        fig.update_xaxes(n_axis([x for t in fig.data if t.xaxis == f"x{axis}" for x in t.x]), row=1, col=col)
        if col in in_bytes:
            fig.update_yaxes(byte_axis([y for t in fig.data if t.yaxis == f"y{axis}" for y in t.y]), row=1, col=col)
    return fig
