"""The walkthrough's first cell: figures that survive an HTML export, wide tables, and which environment runs the
kernel."""
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
