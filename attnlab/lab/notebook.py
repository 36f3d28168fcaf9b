"""The walkthrough's first cell: figures that survive an HTML export, wide tables, and which environment runs the
kernel; and the progress its long cells draw (progress_bar): a live line in a notebook that ends as one summary line,
so a rendered page never keeps a bar frozen part way."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import torch

RENDERER = "plotly_mimetype+notebook_offline"


def offline_renderer():
    """plotly's 'notebook' renderer (plotly.js inline, once per kernel) without the MathJax script it adds from a CDN
    to every figure: the walkthrough's figures use no LaTeX, and an exported page must fetch nothing."""
    import re

    from plotly.io._base_renderers import NotebookRenderer

    class OfflineNotebookRenderer(NotebookRenderer):
        def to_mimebundle(self, fig_dict):
            bundle = super().to_mimebundle(fig_dict)
            bundle["text/html"] = re.sub(r'<script[^>]*\bsrc="https?://[^"]*mathjax[^"]*"[^>]*>\s*</script>', "",
                                         bundle["text/html"])
            return bundle

    return OfflineNotebookRenderer()


def setup() -> dict:
    """Figures that survive an HTML export (RENDERER: JupyterLab's own plotly view, and HTML with plotly.js inline
    once), wide tables, and what runs this kernel: its python, and where attnlab comes from (a user-level
    kernelspec can point at another environment)."""
    import plotly.io as pio

    pio.renderers["notebook_offline"] = offline_renderer()
    pio.renderers.default = RENDERER
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)
    pd.set_option("display.max_colwidth", 250)  # notes say why a number is what it is: keep them whole
    missing = [m for m in ("papermill", "ipywidgets", "plotly") if _absent(m)]
    info = {"python": sys.executable, "prefix": sys.prefix, "attnlab": str(Path(__file__).resolve().parent.parent),
            "torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if missing:
        info["warning"] = (f"this kernel's environment lacks {', '.join(missing)}: it is not the one `make install` "
                           "built; pick that environment's kernel")
    return info


def _absent(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


class _Line:
    """The file a progress bar writes to in a notebook: its latest text shown in one display, replaced in place
    (a display id), so the saved notebook keeps only the last."""

    encoding = "utf-8"  # tqdm draws its bar in block characters where the file says it takes them

    def __init__(self):
        self.handle = None

    def show(self, text: str) -> None:
        from IPython.display import Pretty, display

        if self.handle is None:
            self.handle = display(Pretty(text), display_id=True)
        else:
            self.handle.update(Pretty(text))

    def write(self, s: str) -> int:
        text = s.replace("\r", "").strip()
        if text:
            self.show(text)
        return len(s)

    def flush(self) -> None:
        pass


def progress_bar(label: str):
    """A tqdm class for a long cell: in an IPython kernel, tqdm's text bar drawn into one display that is replaced as
    it moves and, when the bar closes, by one line ('<label>: 12 of 12 shapes in 40 s'); a widget bar (tqdm.auto's)
    would freeze at its last state in a static export. Outside a kernel, tqdm.auto's bar."""
    from tqdm.auto import tqdm as auto

    try:
        from IPython import get_ipython
    except ImportError:
        return auto
    if get_ipython() is None or not hasattr(get_ipython(), "kernel"):
        return auto
    from tqdm.std import tqdm

    class Line(tqdm):
        def __init__(self, *args, **kw):
            self._line = _Line()
            super().__init__(*args, **{**kw, "file": self._line, "dynamic_ncols": False, "ncols": 100,
                                        "mininterval": 1.0})

        def close(self):
            if self.disable or getattr(self, "_summarised", False):
                return super().close()
            self._summarised = True
            super().close()
            seconds = self.format_dict["elapsed"]
            unit = self.unit + ("s" if self.total != 1 and not self.unit.endswith("s") else "")
            self._line.show(f"{label}: {self.n} of {self.total} {unit} in {seconds:.0f} s")

    return Line
