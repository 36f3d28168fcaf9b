"""What the browser tests (tests/test_browser.py) drive: a throwaway JupyterLab server, Debian's Chromium through
Playwright, screenshots kept for a failure, and the few page actions the tests repeat.

    reason = missing()              '' where Chromium and Playwright are here, else why the tests cannot run
    with Lab(root, home) as lab:    `jupyter lab` on 127.0.0.1: a free port, a random token, its own config,
        lab.url("lab/tree/x.ipynb")     data, settings and workspaces under `home`; this venv's kernel; always stopped
    shots = Shots(folder, node)     screenshots, numbered, listed in a failed test's report (tests/conftest.py);
                                    `with shots.kept(page):` adds the page as it was when the block failed
    open_notebook, run_all, save    the notebook opened alone, Run → Run All Cells, File → Save (ctrl+s)
    cells(page), errors(page)       the shown notebook's code cells and error outputs, read from its model

Playwright's own browser download cannot work on this project's machines: the tests launch the Chromium at
ATTNLAB_CHROMIUM (default /usr/bin/chromium, Debian's package).
"""
from __future__ import annotations

import atexit
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent  # this checkout: the attnlab the server's kernels import
CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")
MUST_RUN = os.environ.get("ATTNLAB_BROWSER_TESTS") == "run"  # CI: a missing browser fails instead of skipping

# JupyterLab's settings for a test: no news or update check (each a network request and a toast over the page),
# no autosave (the tests save once, when they mean to).
SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook in the tab shown
SHOTS = pytest.StashKey[list]()  # the Shots of a test or module, for tests/conftest.py

# The code cells of the notebook shown, from its model (an error output renders as stderr text in the page, so the
# page alone cannot tell a traceback from a warning): each cell's execution count and, per output, its type, its
# stream's name and text, or its error's name and value.
CELLS_JS = """() => {
    const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
    const out = [];
    for (let i = 0; i < cells.length; i++) {
        const cell = cells.get(i);
        if (cell.type !== 'code') continue;
        const outputs = [];
        for (let j = 0; j < cell.outputs.length; j++) {
            const o = cell.outputs.get(j).toJSON();
            outputs.push({type: o.output_type, name: o.name || '',
                          text: [].concat(o.text || []).join('').slice(0, 3000),
                          ename: o.ename || '', evalue: o.evalue || ''});
        }
        out.push({count: cell.executionCount, outputs: outputs});
    }
    return out;
}"""
# A plotly figure as the page holds it (the element's own `data` and `layout`, what plotly drew from): its title and,
# per trace, its name, visibility, x, y and marker sizes (typed arrays made lists).
FIGURE_JS = """el => {
    const list = v => v == null ? null : (typeof v === 'object' && 'length' in v ? Array.from(v) : [v]);
    return {title: (el.layout && el.layout.title && el.layout.title.text) || '',
            data: (el.data || []).map(t => ({name: t.name, visible: t.visible === undefined ? true : t.visible,
                                             x: list(t.x), y: list(t.y),
                                             size: t.marker ? list(t.marker.size) : null}))};
}"""
# How a plotly figure drew: its svg, its trace groups, and the trace groups holding a path or point with a shape.
DRAWN_JS = """el => ({svg: el.querySelectorAll('svg.main-svg').length,
                     traces: el.querySelectorAll('g.trace').length,
                     inked: [...el.querySelectorAll('g.trace')].filter(g => [...g.querySelectorAll('path')]
                         .some(p => (p.getAttribute('d') || '').length > 2)).length})"""


def missing() -> str:
    """'' when the browser tests can run here, else the reason they cannot."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as e:
        return f"the playwright package is not installed ({e}); pip install 'playwright>=1.45'"
    if not os.access(CHROMIUM, os.X_OK):
        return (f"no Chromium at {CHROMIUM} (apt-get install chromium, or set ATTNLAB_CHROMIUM to a Chromium "
                "binary); Playwright's own browser download does not work on this project's machines")
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """`python -m jupyter lab` serving `root` on 127.0.0.1, everything it keeps between runs (config, data, runtime,
    settings, workspaces) under `home`, so nothing of the user's is read or written; the kernel is this venv's
    python3 (no user-level kernelspec can shadow it: the user's data dir is `home`'s). Its output goes to
    home/server.log. Stopped on exit from the `with` block, also when a test fails: its whole process group,
    kernels included."""

    def __init__(self, root: Path, home: Path, env: dict | None = None, timeout: float = 90):
        self.root, self.home, self.timeout = Path(root), Path(home), timeout
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.extra = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.log = self.home / "server.log"

    def url(self, path: str = "") -> str:
        sep = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}/{path}{sep}token={self.token}"

    def _env(self) -> dict:
        dirs = {name: self.home / name for name in ("config", "data", "runtime", "settings", "workspaces")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        for name, values in SETTINGS.items():
            path = dirs["settings"] / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PYTEST_XDIST"))}
        env.update(JUPYTER_CONFIG_DIR=str(dirs["config"]), JUPYTER_DATA_DIR=str(dirs["data"]),
                   JUPYTER_RUNTIME_DIR=str(dirs["runtime"]), JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]),
                   JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]), JUPYTER_PREFER_ENV_PATH="1",
                   TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(p for p in (str(ROOT),
                                                                              os.environ.get("PYTHONPATH")) if p))
        env.update(self.extra)
        return env

    def start(self) -> "Lab":
        self.home.mkdir(parents=True, exist_ok=True)
        env = self._env()
        cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={self.root}", f"--LabApp.user_settings_dir={env['JUPYTERLAB_SETTINGS_DIR']}",
               f"--LabApp.workspaces_dir={env['JUPYTERLAB_WORKSPACES_DIR']}",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly",
               "--ServerApp.terminals_enabled=False",
               "--LabApp.expose_app_in_browser=True"]  # window.jupyterapp: the open notebook's model (CELLS_JS)
        if os.geteuid() == 0:  # containers run as root, which jupyter refuses without this
            cmd.append("--allow-root")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        atexit.register(self.stop)  # a test process that ends without its fixtures' teardown still stops it
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=5) as r:
                    if r.status == 200 and "started" in json.load(r):
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer /api/status within {self.timeout:.0f} s: {self.tail()}")

    def kernels_idle(self) -> bool:
        try:
            with urllib.request.urlopen(self.url("api/kernels"), timeout=10) as r:
                kernels = json.load(r)
        except (urllib.error.URLError, ConnectionError, TimeoutError):  # a kernel mid-start can make the list 500
            return False
        return bool(kernels) and all(k["execution_state"] == "idle" for k in kernels)

    def end_sessions(self) -> None:
        """Shut down every session (and its kernel) of the server: the next notebook opened starts a kernel of its
        own, with no widgets or comms left by an earlier test's page."""
        with urllib.request.urlopen(self.url("api/sessions"), timeout=10) as r:
            sessions = json.load(r)
        for s in sessions:
            req = urllib.request.Request(self.url(f"api/sessions/{s['id']}"), method="DELETE")
            urllib.request.urlopen(req, timeout=30).close()

    def wait_idle(self, timeout: float) -> None:
        """Until every kernel of the server is started and idle (its REST API's execution_state)."""
        deadline = time.monotonic() + timeout
        while not self.kernels_idle():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the kernels were not idle within {timeout:.0f} s")
            time.sleep(0.5)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"

    def stop(self) -> None:
        """SIGTERM to the server's process group (the server and its kernels), SIGKILL what is left after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # kernels left in the group after the server itself exited
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __enter__(self) -> "Lab":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Shots:
    """Screenshots of a test's steps in `folder`, numbered in the order taken. Kept in the stash of `node` (the test,
    or the module for a module-scoped fixture), where tests/conftest.py finds them to list in a failure's report."""

    def __init__(self, folder: Path, node=None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.paths: list[Path] = []
        if node is not None:
            node.stash.setdefault(SHOTS, []).append(self)

    def take(self, page_or_element, name: str) -> Path:
        """The page's viewport, or one element (a figure) of it."""
        path = self.folder / f"{len(self.paths) + 1:02d}-{name}.png"
        page_or_element.screenshot(path=str(path))
        self.paths.append(path)
        return path

    @contextmanager
    def kept(self, page):
        """A screenshot named 'failure' when the block raises (what the page showed when it went wrong)."""
        try:
            yield self
        except BaseException:
            try:
                self.take(page, "failure")
            except Exception:  # a closed page or browser has nothing left to show
                pass
            raise


# -- page actions -------------------------------------------------------------------------------------------------

def open_notebook(page, lab: Lab, name: str, timeout_ms: int = 60_000) -> None:
    """The notebook open in JupyterLab, alone (a reset workspace), its cells drawn and a kernel of its own (no earlier
    page's session) started and idle."""
    lab.end_sessions()
    page.goto(lab.url(f"lab/tree/{name}?reset"))
    page.wait_for_selector(f"{PANEL} .jp-CodeCell .jp-InputArea-prompt", timeout=timeout_ms)
    page.wait_for_function("() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                           " return !!(w && w.content && w.content.model); }", timeout=timeout_ms)
    lab.wait_idle(timeout_ms / 1000)


def run_all(page, lab: Lab, timeout_ms: int) -> None:
    """Run → Run All Cells from the menu bar, then wait until every code cell shows its execution count (or one
    shows an error, where Run All stops) and the kernel is idle."""
    page.click(f"{PANEL} .jp-Cell >> nth=0")
    page.locator("#jp-MainMenu").get_by_text("Run", exact=True).click()
    page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
    page.wait_for_function(
        f"""panel => {{
            const prompts = [...document.querySelectorAll(`${{panel}} .jp-CodeCell .jp-InputArea-prompt`)];
            const running = prompts.some(p => p.textContent.includes('*'));
            const cells = ({CELLS_JS})();
            const failed = cells.some(c => c.outputs.some(o => o.type === 'error'));  // Run All stops there
            return !running && cells.length > 0 && (cells.every(c => c.count !== null) || failed);
        }}""", arg=PANEL, timeout=timeout_ms, polling=500)
    lab.wait_idle(timeout_ms / 1000)


def cells(page) -> list[dict]:
    """The shown notebook's code cells as its model holds them (CELLS_JS)."""
    return page.evaluate(CELLS_JS)


def errors(page) -> list[str]:
    """Each error output of the shown notebook, as 'name: value'."""
    return [f"{o['ename']}: {o['evalue']}" for c in cells(page) for o in c["outputs"] if o["type"] == "error"]


def save(page, path: Path, timeout: float = 60) -> None:
    """File → Save (ctrl+s), then wait until the file on disk holds every code cell's execution count."""
    import nbformat

    before = path.stat().st_mtime_ns
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.stat().st_mtime_ns != before:
            try:
                nb = nbformat.read(str(path), as_version=4)
                if all(c.execution_count for c in nb.cells if c.cell_type == "code"):
                    return
            except (ValueError, OSError):  # caught mid-write
                pass
        time.sleep(0.5)
    raise TimeoutError(f"{path.name} was not saved with its outputs within {timeout:.0f} s")
