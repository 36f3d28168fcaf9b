"""Our Hopper kernels compiled for sm_90a offline, once a test session, in parallel.

A test declares the compiles it reads as the parameter of the `offline` fixture (tests/conftest.py):

    @pytest.mark.parametrize("offline", [compiles("fused", D=(64, 128), causal=(0, 1), masks=(0, 2),
                                                  tiles=("64x128w4s2hg",))], indirect=True)
    def test_it_fits(offline): ...   # offline: the rows, in the order `python -m attnlab.triton.resources` prints them

At the first such test the session gathers every compile its selected tests declare, drops the duplicates and hands
them to a pool of os.cpu_count() processes started with TRITON_INTERPRET=0 (the test process has our kernels loaded
for the interpreter; a kernel is a real JIT function only in a process that never had the interpreter on). Each
child runs attnlab.triton.resources.compile_info, the function the command runs for each row, and each test waits
for its own rows only. This module imports nothing heavy at the top: a child imports it before it turns the
interpreter off.

compile_info reads the PTX Triton makes and runs `ptxas -v` on it itself; Triton's own last stage, the cubin, runs
ptxas once more (about half of a compile's time) for a binary nothing here loads. The children drop that stage
through Triton's pipeline hook (knobs.runtime.add_stages_inspection_hook), and keep their Triton cache apart from
the one real launches read (its entries then hold no binary).
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass


@dataclass(frozen=True)
class Compile:
    """One row of `python -m attnlab.triton.resources`: one kernel configuration compiled for sm_90a."""
    kernel: str
    D: int
    causal: bool
    tiles: str  # a tile label, as `--tiles` takes it
    mask_kind: int = 0
    n: int = 4096
    flags: tuple = ()  # (("NO_PV", True),): other constexprs, as `--flags NO_PV=1`

    def __str__(self):
        flags = ",".join(f"{k}={int(v)}" for k, v in self.flags)
        return (f"{self.kernel} D={self.D} {'causal' if self.causal else 'non-causal'} {self.tiles} "
                f"mask {self.mask_kind} N={self.n}{' ' + flags if flags else ''}")


class Compiles(tuple):
    """The compiles one test reads, in the order the command would print their rows."""

    def __add__(self, other):
        return Compiles(tuple(self) + tuple(other))


def compiles(kernels, D, causal, tiles, masks=(0,), flags=None, n=4096) -> Compiles:
    """The rows `python -m attnlab.triton.resources --kernels K --head-dims D --causal C --masks M --tiles T
    [--flags F] --n N` prints, in its order: kernel, head dim, causal, mask kind (pv takes none), tiles."""
    one = lambda x: (x,) if isinstance(x, (str, int, bool)) else tuple(x)  # noqa: E731
    flag_items = tuple(sorted((flags or {}).items()))
    return Compiles(Compile(k, d, bool(c), t, m if k != "pv" else 0, n, flag_items)
                    for k, d, c in itertools.product(one(kernels), one(D), one(causal))
                    for m in (one(masks) if k != "pv" else (0,)) for t in one(tiles))


def _child_start(path: list[str], cache: str) -> None:
    """In a fresh child, before any kernel module is imported: real JIT kernels, this checkout's attnlab, a Triton
    cache of its own and no cubin stage."""
    import sys

    os.environ["TRITON_INTERPRET"] = "0"
    os.environ["TRITON_CACHE_DIR"] = cache
    sys.path[:0] = [p for p in path if p not in sys.path]
    import triton

    triton.knobs.runtime.add_stages_inspection_hook = _no_cubin


def _no_cubin(backend, stages, options, language, capability):
    """Triton's pipeline up to the PTX, which compile_info assembles with `ptxas -v` itself: an empty binary."""
    stages["cubin"] = lambda src, metadata: b""


def cache_dir() -> str:
    """The children's Triton cache: beside the one this process uses (TRITON_CACHE_DIR, or Triton's default), never
    in it, since its entries hold no binary."""
    base = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    return os.path.join(os.path.dirname(os.path.abspath(base)), os.path.basename(base) + "-offline-ptx")


def compile_row(c: Compile) -> dict:
    """The row the command prints for `c` (resources.main: compile_info's report with the flags beside it)."""
    from attnlab.triton import resources

    flags = dict(c.flags)
    return {**resources.compile_info(c.kernel, c.D, c.causal, resources.parse_tiles(c.tiles), c.mask_kind, n=c.n,
                                     **flags), **flags}


class Pool:
    """Compiles handed out to os.cpu_count() child processes; `rows(compiles)` waits for those rows only."""

    def __init__(self, path: list[str], workers: int | None = None):
        self.path, self.workers = path, workers or os.cpu_count() or 1
        self.futures: dict[Compile, Future] = {}
        self.executor = None

    def submit(self, todo) -> None:
        """Start compiling `todo` (in this order, each compile once)."""
        todo = [c for c in dict.fromkeys(todo) if c not in self.futures]
        if not todo:
            return
        if self.executor is None:
            self.executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=_child_start, initargs=(self.path, cache_dir()))
        for c in todo:
            self.futures[c] = self.executor.submit(compile_row, c)

    def rows(self, wanted) -> list[dict]:
        self.submit(wanted)
        out = []
        for c in wanted:
            try:
                out.append(self.futures[c].result())
            except Exception as e:
                raise AssertionError(f"the offline compile of {c} failed: {type(e).__name__}: {e}") from e
        return out

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
