"""The walkthrough rendered in batch: papermill runs notebooks/attention_lab.ipynb with a params file into a run folder,
then nbconvert writes it as HTML that draws with no network. What `attnlab run` and `make run` do.

    python -m attnlab.render --params params/cpu.yaml [--out DIR] [--timeout S]

Into a new outputs/<gpu-or-cpu>/<time>/ (a name never reused: a run never overwrites another), or --out DIR (a
folder holding rows resumes; `{device}` in it becomes the device's folder name, e.g. nvidia-h200 or cpu, found where
the render runs, as a cluster's job needs): the executed notebook, its HTML, and what the notebook's cells write there (results.csv,
provenance.json, gate.csv, params.yaml, profiler traces), plus tables.txt (attnlab.report.text).

A failing cell or a cell past --timeout: a non-zero exit (1 for an error, 124 for a timeout), the partial notebook
and its HTML kept (every row the sweep finished is already in results.csv, written row by row), and a message
naming the cell. papermill marks an error in the notebook itself; a timeout it does not, so a banner is added here.

    render_gpus(params, gpus)   one render per GPU, in parallel, each in its own process pinned by CUDA_VISIBLE_DEVICES
                                and its own folder; then notebooks/compare_gpus.ipynb over them, where it exists
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

import yaml

from attnlab import environment, provenance, sweep
from attnlab.args import Parser, existing_file, out_dir, positive_float

NOTEBOOKS = provenance.REPO / "notebooks"
WALKTHROUGH = NOTEBOOKS / "attention_lab.ipynb"
COMPARE = NOTEBOOKS / "compare_gpus.ipynb"
KERNEL = "python3"  # the committed notebooks' kernelspec, named explicitly (a user-level spec can shadow another)
# How every render runs papermill: that kernel, in the repository's root, without papermill's own progress bar (the
# cells draw theirs). The kernel logs errors only: its one warning is that its sockets on 127.0.0.1 are not
# encrypted, which says nothing about the run and reads to a user like a failure.
PAPERMILL = dict(kernel_name=KERNEL, cwd=str(provenance.REPO), progress_bar=False,
                 extra_arguments=["--IPKernelApp.log_level=ERROR"])
FAILED, TIMED_OUT = 1, 124
DEVICE = "{device}"  # in a run folder's path: the device's folder name (sweep.device_tag), known where the render runs

# nbconvert's lab template with every script it would fetch left out: require.js, MathJax, the widget renderer and
# mermaid come from CDNs. Plotly's figures need none of them: the renderer 'plotly_mimetype+notebook' puts plotly.js
# inline in the notebook, once (attnlab.lab.setup).
OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


@dataclass
class Rendered:
    code: int
    out: Path
    notebook: Path
    html: Path | None
    message: str


def page_title(nb, fallback: str) -> str:
    """The page title of a notebook: its metadata's `title`, else its first markdown heading (a `#` line outside a
    fenced code block), else `fallback`."""
    if nb.metadata.get("title"):
        return str(nb.metadata["title"])
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        fenced = False
        for line in cell.source.splitlines():
            if line.lstrip().startswith(("```", "~~~")):
                fenced = not fenced
            elif not fenced and line.startswith("#") and line.lstrip("#").startswith(" ") and line.strip("# "):
                return line.strip("# ")
    return fallback


def export_html(notebook: Path, html_path: Path | None = None) -> Path:
    """The notebook as one HTML file that fetches nothing (OFFLINE_TEMPLATE), titled by `page_title` (nbconvert's own
    default is the word 'Notebook': a browser tab, a bookmark and a screen reader would name every report alike)."""
    import nbformat
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", extra_loaders=[DictLoader({"offline.html.j2": OFFLINE_TEMPLATE})],
                            template_file="offline.html.j2")
    nb = nbformat.read(str(notebook), as_version=4)
    nb.metadata["title"] = page_title(nb, Path(notebook).stem)
    body, _ = exporter.from_notebook_node(nb)
    html_path = html_path or notebook.with_suffix(".html")
    html_path.write_text(body, encoding="utf-8")
    return html_path


def _cell_name(nb, index: int) -> str:
    """A cell as a reader finds it in the executed notebook: its In [n], the section heading above it, its first
    line."""
    cell = nb.cells[index]
    first = next((line for line in cell.source.splitlines() if line.strip()), "")
    heading = next((line.lstrip("# ").strip() for c in reversed(nb.cells[:index]) if c.cell_type == "markdown"
                    for line in c.source.splitlines() if line.startswith("#")), "")
    where = f"In [{cell.execution_count}]" if cell.get("execution_count") else f"cell {index}"
    return where + (f" of section {heading!r}" if heading else "") + f": {first.strip()[:80]!r}"


def _failed_cell(nb) -> int:
    """The first cell holding an error output (papermill's own banner cell holds none)."""
    return next((i for i, c in enumerate(nb.cells) if any(o.get("output_type") == "error"
                                                          for o in c.get("outputs", []))), 0)


def _timed_out_cell(nb) -> int:
    """The cell that was running when the timeout came: the last one papermill started."""
    started = [i for i, c in enumerate(nb.cells) if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    return started[-1] if started else 0


def _banner(nb_path: Path, text: str) -> None:
    import nbformat

    nb = nbformat.read(str(nb_path), as_version=4)
    cell = nbformat.v4.new_markdown_cell(f'<span style="color:red; font-size:2em">{text}</span>')
    cell.metadata["tags"] = ["attnlab-timeout"]
    nb.cells.insert(0, cell)
    nbformat.write(nb, str(nb_path))


def run_notebook(notebook: Path, nb_out: Path, parameters: dict, *, timeout: float | None = None,
                 execute=None) -> tuple[int, str]:
    """papermill runs `notebook` with `parameters` into `nb_out`: (0, "") or (FAILED or TIMED_OUT, which cell stopped
    and why). papermill marks a failing cell in the notebook it writes; a timeout or a dead kernel it does not, so
    a banner at the top of the partial notebook says so. `execute` is papermill.execute_notebook unless a test passes
    its own."""
    import nbformat
    import papermill
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    execute = execute or papermill.execute_notebook
    try:
        execute(str(notebook), str(nb_out), parameters=parameters, execution_timeout=timeout, **PAPERMILL)
    except papermill.PapermillExecutionError as e:
        nb = nbformat.read(str(nb_out), as_version=4)
        return FAILED, f"{_cell_name(nb, _failed_cell(nb))} failed: {e.ename}: {str(e.evalue).splitlines()[0][:300]}"
    except (CellTimeoutError, TimeoutError, DeadKernelError) as e:
        code = TIMED_OUT if not isinstance(e, DeadKernelError) else FAILED
        which = "a cell"
        if nb_out.exists():
            nb = nbformat.read(str(nb_out), as_version=4)
            which = _cell_name(nb, _timed_out_cell(nb))
        what = f"timed out after {timeout} s" if code == TIMED_OUT else "lost its kernel"
        message = f"{which} {what}; the cells after it did not run"
        if nb_out.exists():
            _banner(nb_out, f"Execution stopped: {message}.")
        return code, message
    return 0, ""


def render(params_path, out=None, *, notebook: Path = WALKTHROUGH, timeout: float | None = None,
           execute=None) -> Rendered:
    """Execute `notebook` with the params file's keys (and out_dir) into a run folder, and export it to HTML. The
    folder is `out` with DEVICE in it replaced by the device's folder name, or a new outputs/<device>/<time>/.

    Bad params raise attnlab.sweep.ParamsError before anything is written. `execute` is papermill.execute_notebook
    unless a test passes its own."""
    sweep.load_params(params_path)  # every key checked before a folder exists
    raw = yaml.safe_load(Path(params_path).read_text())
    if out is None:
        from attnlab import lab

        out = lab.new_folder(sweep.resolve_device(sweep.validate(dict(raw))))
    elif DEVICE in str(out):
        out = str(out).replace(DEVICE, sweep.device_tag(sweep.resolve_device(sweep.validate(dict(raw)))))
    out = Path(out).resolve()
    sweep.check_out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    nb_out = out / Path(notebook).name
    t0 = time.perf_counter()
    code, message = run_notebook(notebook, nb_out, {**raw, "out_dir": str(out)}, timeout=timeout, execute=execute)
    seconds = time.perf_counter() - t0
    html = export_html(nb_out) if nb_out.exists() else None
    results = out / sweep.RESULTS
    rows = len(sweep.read_results(results)) if results.exists() else 0
    if rows:
        _tables(out)
    where = _short(out)
    if code:
        message = (f"{Path(notebook).name} stopped: {message}. Kept in {where}: the partial notebook"
                   + (", its HTML" if html else "") + f" and {rows} finished row(s) in {sweep.RESULTS}")
    else:
        message = (f"{Path(notebook).name} rendered with {params_path} into {where} in {seconds:.0f} s: "
                   f"{nb_out.name}, {html.name if html else 'no HTML'}, {sweep.RESULTS} ({rows} rows), "
                   f"{sweep.PROVENANCE}")
    return Rendered(code, out, nb_out, html, message)


INTERPRETED = ("# These rows were measured on a CPU, our Triton kernels in Triton's interpreter: every time below "
               "measures Python, not kernels,\n# and no ratio of them is a speedup. The correctness (err) and the "
               "byte model (hold_bytes, bytes_moved) are real.\n\n")


def _tables(out: Path) -> None:
    """tables.txt beside the results (attnlab.report.text), headed by a warning where the rows are a CPU's."""
    from attnlab.report.text import render as tables

    results = sweep.read_results(out / sweep.RESULTS)
    head = INTERPRETED if results["device"].astype(str).str.startswith("cpu").any() else ""
    try:
        text = tables(results)
    except ValueError as e:  # a partial run may lack a table's builds; the notebook is the record
        text = f"no tables: {e}\n"
    (out / "tables.txt").write_text(head + text)


def _short(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _gpu_tag(index: int) -> str:
    import torch

    if torch.cuda.is_available() and index < torch.cuda.device_count():
        return sweep.device_tag(f"cuda:{index}")
    return "gpu"


def render_gpus(params_path, gpus: list[int], *, runner=None, timeout: float | None = None,
                compare: Path = COMPARE, root: Path | None = None) -> tuple[int, list[Path], list[str]]:
    """One `python -m attnlab.render` per GPU, all at once, each seeing only its GPU (CUDA_VISIBLE_DEVICES) and
    writing its own folder outputs/<gpu>/<time>-gpu<i>/; then `compare` rendered over the folders, where it exists.
    Returns (exit code, the folders, one line per process). `runner(cmd, env)` starts a process (subprocess.Popen
    unless a test passes its own) and returns an object with wait()."""
    sweep.load_params(params_path)
    if not gpus or len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
        raise sweep.ParamsError(None, ",".join(map(str, gpus)), "--gpus must list distinct GPU indices >= 0")
    runner = runner or (lambda cmd, env: subprocess.Popen(cmd, env=env))
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = root or provenance.REPO / "outputs"
    folders = [base / _gpu_tag(g) / f"{stamp}-gpu{g}" for g in gpus]
    children = []
    for g, folder in zip(gpus, folders):
        cmd = [sys.executable, "-m", "attnlab.render", "--params", str(params_path), "--out", str(folder)]
        if timeout:
            cmd += ["--timeout", str(timeout)]
        children.append(runner(cmd, environment.child(CUDA_VISIBLE_DEVICES=str(g))))
    codes = [child.wait() for child in children]
    lines = [f"GPU {g}: {'rendered' if c == 0 else f'exit {c}'} into {_short(f)}" for g, c, f in
             zip(gpus, codes, folders)]
    code = next((c for c in codes if c), 0)
    done = [f for f, c in zip(folders, codes) if c == 0]
    if Path(compare).exists() and done:
        result = render_compare(done, compare, base / "compare" / stamp, timeout=timeout)
        lines.append(result.message)
        code = code or result.code
    elif done:
        lines.append(f"{Path(compare).name} not found: no comparison rendered")
    return code, folders, lines


def render_compare(folders: list[Path], notebook: Path, out: Path, *, timeout: float | None = None,
                   execute=None) -> Rendered:
    """`notebook` (compare_gpus) executed over `folders` into `out`, with its HTML. The folders go to whichever of its
    parameters names them (runs, folders or run_dirs); a notebook with none of these reads every run itself."""
    import papermill

    names = {p["name"] for p in papermill.inspect_notebook(str(notebook)).values()}
    key = next((k for k in ("runs", "folders", "run_dirs") if k in names), None)
    out.mkdir(parents=True, exist_ok=True)
    nb_out = out / Path(notebook).name
    code, message = run_notebook(notebook, nb_out, {key: [str(f) for f in folders]} if key else {}, timeout=timeout,
                                 execute=execute)
    if code:
        return Rendered(code, out, nb_out, None, f"{notebook.name} stopped: {message}")
    return Rendered(0, out, nb_out, export_html(nb_out), f"{notebook.name} rendered over {len(folders)} run(s) into "
                                                         f"{_short(out)}")


def render_run(notebook: Path, params_path, p: dict, out=None, *, rows: Callable[[Path], int],
               timeout: float | None = None, execute=None) -> Rendered:
    """`notebook` executed by papermill with the params file's keys (`p`: them validated, before anything is written)
    into a run folder, `out` or a new outputs/<device>/<time>/, and its HTML: what a notebook with a sweep of its own
    inside (the model's, training's) renders as. `rows(out)` counts the rows the message names. A failing or
    timed-out cell gives a non-zero code and keeps the partial notebook and every row measured."""
    raw = sweep.read_yaml(params_path)
    if out is None:
        from attnlab import lab

        out = lab.new_folder(sweep.resolve_device(p))
    out = Path(out)
    sweep.check_out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    nb_out = out / notebook.name
    code, message = run_notebook(notebook, nb_out, {**raw, "out_dir": str(out)}, timeout=timeout, execute=execute)
    html = export_html(nb_out) if nb_out.exists() else None
    count = rows(out)
    where = _short(out)
    if code:
        message = f"{notebook.name} stopped: {message}. Kept in {where}: the partial notebook and {count} row(s)"
    else:
        message = f"{notebook.name} rendered with {params_path} into {where}: {count} rows, notebook and HTML"
    return Rendered(code, out, nb_out, html, message)


def command(prog: str, description: str, render_call: Callable) -> Callable:
    """The main(argv) of `python -m <prog>`: --params FILE, --out DIR, --timeout S, then
    finish(render_call(params, out, timeout=...))."""
    def main(argv=None) -> int:
        ap = Parser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
        ap.add_argument("--params", required=True, type=existing_file, metavar="FILE", help="params YAML")
        ap.add_argument("--out", type=out_dir, metavar="DIR", help="run folder (default: a new "
                                                                   "outputs/<device>/<time>/)")
        ap.add_argument("--timeout", type=positive_float, metavar="S", help="seconds a cell may run (default: none)")
        args = ap.parse_args(argv)
        return finish(lambda: render_call(args.params, args.out, timeout=args.timeout))
    return main


def finish(render_call) -> int:
    """A render run from a command line: a bad params file in one line and exit 2, else the render's message and
    its exit code (0, FAILED or TIMED_OUT)."""
    try:
        result = render_call()
    except sweep.ParamsError as e:
        print(f"attnlab: error: {e}", file=sys.stderr)
        return 2
    print(f"attnlab: {result.message}", file=sys.stderr if result.code else sys.stdout)
    return result.code


def main(argv=None) -> int:
    ap = Parser(prog="python -m attnlab.render", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", required=True, type=existing_file, metavar="FILE",
                    help="params YAML (its keys fill the parameters cell)")
    ap.add_argument("--out", type=out_dir, metavar="DIR",
                    help="the run folder; {device} in it becomes the device's folder name (default: a new "
                         "outputs/<gpu-or-cpu>/<time>/)")
    ap.add_argument("--timeout", type=positive_float, default=None, metavar="S",
                    help="seconds a cell may run (default: none)")
    ap.add_argument("--notebook", type=existing_file, default=str(WALKTHROUGH), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    return finish(lambda: render(args.params, args.out, notebook=Path(args.notebook), timeout=args.timeout))


if __name__ == "__main__":
    sys.exit(main())
