"""Shared test helpers. Triton kernels run in Triton's interpreter: the Makefile sets TRITON_INTERPRET=1, and
attnlab.triton sets it when no GPU is present, before any kernel is defined."""
import json
import os
import subprocess
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from attnlab.triton import config, plan  # noqa: E402
from tests.offline import Pool  # noqa: E402
from tests.browser import SHOTS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout: the attnlab under test


def rand_qkv(B=1, H=2, Hkv=None, N=64, D=64, dtype=torch.float32, seed=0, device="cpu"):
    """Fresh random normal q, k, v (never zeros: zeros hide unwritten outputs and wrong indexing)."""
    g = torch.Generator().manual_seed(seed)
    Hkv = Hkv or H
    q = torch.randn(B, H, N, D, generator=g).to(dtype=dtype, device=device)
    k = torch.randn(B, Hkv, N, D, generator=g).to(dtype=dtype, device=device)
    v = torch.randn(B, Hkv, N, D, generator=g).to(dtype=dtype, device=device)
    return q, k, v


def committed(pattern: str) -> list[str]:
    """The paths git holds that match `pattern` (git's pathspec, relative to this checkout): what a fresh clone has,
    never a file a local run left beside them."""
    return subprocess.run(["git", "ls-files", pattern], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.split()


def out_of_memory_once(monkeypatch, module, name: str) -> list:
    """module.name raises torch.OutOfMemoryError on its first call (as a CUDA allocation too large for what other
    processes left free) and works after it; the list returned gains an entry a call."""
    real, calls = getattr(module, name), []

    def first_does_not_fit(*args, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 MiB")
        return real(*args, **kw)

    monkeypatch.setattr(module, name, first_does_not_fit)
    return calls


def offline_compile(*args: str, timeout: int = 600) -> list[dict]:
    """The rows of `python -m attnlab.triton.resources --json ARGS`, run as a user's command runs: in a child process
    that restarts itself with TRITON_INTERPRET=0 (this one has our kernels loaded for the interpreter). Tests of the
    kernels' resources read their rows from the `offline` fixture instead (one compile per configuration a session,
    in parallel); this is for the command itself."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "attnlab.triton.resources", "--json", *args], capture_output=True,
                         text=True, timeout=timeout, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def pytest_collection_modifyitems(items):
    """Tests that compile for sm_90a with ptxas (they declare offline compiles) are `system` tests: `make test-system`
    runs them, beside the browser and Slurm tests, which carry the mark themselves."""
    for item in items:
        function = getattr(item, "function", None)
        if _declared(item) or (function is not None and "offline_compile" in function.__code__.co_names):
            item.add_marker(pytest.mark.system)


def _declared(item):
    """The compiles a collected test declares: the parameter of its `offline` fixture (tests/offline.py)."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("offline", ()) if callspec else ()


@pytest.fixture(scope="session", autouse=True)
def _compile_pool(request, tmp_path_factory):
    """The session's offline compiles (tests/offline.py), started before its first test: every compile the selected
    tests declare, in test order, shared among pytest-xdist's workers through their common temporary folder."""
    base = tmp_path_factory.getbasetemp()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "offline-compiles"
    shared.mkdir(exist_ok=True)
    pool = Pool([ROOT], shared, (os.cpu_count() or 1) // workers)
    pool.start(c for item in request.session.items for c in _declared(item))
    yield pool
    pool.close()


@pytest.fixture
def offline(request, _compile_pool):
    """The rows of the compiles the test declares as this fixture's parameter (tests/offline.compiles), each row what
    `python -m attnlab.triton.resources --json` prints for it."""
    return _compile_pool.rows(request.param)


class KernelStandIn:
    """In place of a @triton.jit or @gluon.jit kernel for tests that pretend to be on a GPU: `kernel[grid](*args,
    **kw)` runs nothing and hands the grid and the arguments by name (positional ones named by `names`, the kernel's
    arg_names) to `record`, when given: which launch a call reached, with which flags and grid."""

    def __init__(self, record=None, names=()):
        self.record, self.names = record, names

    def __getitem__(self, grid):
        return lambda *args, **kw: self.record(grid, {**dict(zip(self.names, args)), **kw}) if self.record else None


def poisoned_out(q):
    """An output buffer full of NaN: any element a kernel fails to write stays NaN and fails the check."""
    return torch.full_like(q, float("nan"))


@pytest.fixture
def fresh_plans():
    """Plans (attnlab.triton.plan) made before the test, or under a constant it patches, are dropped before and after
    it: a plan is kept per call key, which holds no such constant."""
    plan.forget()
    yield
    plan.forget()


@pytest.fixture(params=["single", "paired"])
def small_tiles(request):
    """Tiles of 32×16 so short sequences cross many blocks (ragged tails, diagonal tiles, multi-tile loops); every
    test that asks for them runs twice, the second time with the fused kernel's paired loop (two 32-row blocks per
    program sharing each K/V tile, Tiles.paired; BLOCK_M = 2·BLOCK_N as in the H200's table, so a block's diagonal,
    and A's all-masked tiles, span two key tiles), so that loop meets every case the single one does."""
    fused = config.Tiles(32, 16, paired=request.param == "paired")
    small = ((k, fused if k == "fused" else config.Tiles(32, 16)) for k in ("fused", "qk_softmax", "scores", "pv"))
    with plan.overriding(plan.Overrides(forced=tuple(small))):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing browser test's report lists its screenshots (tests/browser.Shots, kept in the stash of the test or
    of its module): the steps before the failure, and the page when it failed."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        paths = [str(p) for node in item.listchain() for shots in node.stash.get(SHOTS, []) for p in shots.paths]
        if paths:
            report.sections.append(("screenshots", "\n".join(paths)))


def pytest_terminal_summary(terminalreporter):
    """Why the browser tests were skipped, printed under -q too (pytest names skip reasons only with -rs)."""
    reasons = {r.longrepr[2] for r in terminalreporter.stats.get("skipped", [])
               if r.nodeid.startswith("tests/test_browser.py") and isinstance(r.longrepr, tuple)}
    for reason in sorted(reasons):
        terminalreporter.write_line(reason, yellow=True)
