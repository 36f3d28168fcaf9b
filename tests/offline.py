"""Our Hopper kernels compiled for sm_90a offline, once a test session, in parallel.

A test declares the compiles it reads as the parameter of the `offline` fixture (tests/conftest.py):

    @pytest.mark.parametrize("offline", [compiles("fused", D=(64, 128), causal=(0, 1), masks=(0, 2),
                                                  tiles=("64x128w4s2hg",))], indirect=True)
    def test_it_fits(offline): ...   # offline: the rows, in the order `python -m attnlab.triton.resources` prints them

When the session starts it gathers every compile its selected tests declare, drops the duplicates and shares them out,
in test order, among processes started with TRITON_INTERPRET=0 (the test process has our kernels loaded for the
interpreter; a kernel is a real JIT function only in a process that never had the interpreter on): os.cpu_count() of
them, or under pytest-xdist os.cpu_count() / workers for each worker, each compile taken by one worker (Pool). Each child runs attnlab.triton.resources.compile_info, the function the command runs for each row, while
the tests run; each test waits for its own rows only. This module imports nothing heavy at the top: a child imports it before it turns the
interpreter off.

compile_info reads the PTX Triton makes and runs `ptxas -v` on it itself; Triton's own last stage, the cubin, runs
ptxas once more (about half of a compile's time) for a binary nothing here loads. The children drop that stage
through Triton's pipeline hook (knobs.runtime.add_stages_inspection_hook), and keep their Triton cache apart from
the one real launches read (its entries then hold no binary).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, as_completed, wait
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
    """Compiles shared out among the test processes of a session (one, or pytest-xdist's workers) through `shared`, a
    folder they all see: each process takes the next compile nobody has taken (creating `<key>.taken`, which only
    one can), runs it in one of its `workers` child processes and writes `<key>.json` (or `<key>.err`). `start`
    begins on the session's whole list in test order; `rows(compiles)` waits for those rows only, wherever they are
    compiled. A process whose tests are done goes on taking compiles until none is left."""

    def __init__(self, path: list[str], shared, workers: int):
        self.path, self.shared, self.workers = path, shared, max(1, workers)
        self.todo: list[Compile] = []
        self.feeder = None

    def _file(self, c: Compile, suffix: str):
        return self.shared / (hashlib.sha1(repr(c).encode()).hexdigest()[:20] + suffix)

    def _take(self, c: Compile) -> bool:
        try:
            os.close(os.open(self._file(c, ".taken"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            return False

    def _write(self, c: Compile, future: Future) -> None:
        try:
            text, suffix = json.dumps(future.result()), ".json"
        except Exception as e:  # the compile's own error, for the test that reads it
            text, suffix = f"{type(e).__name__}: {e}", ".err"
        tmp = self._file(c, f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self._file(c, suffix))

    def _feed(self) -> None:
        executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_child_start, initargs=(self.path, cache_dir()))
        running: dict[Future, Compile] = {}
        try:
            todo = iter(self.todo)
            for c in todo:
                if not self._take(c):
                    continue
                while len(running) >= self.workers:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for f in done:
                        self._write(running.pop(f), f)
                running[executor.submit(compile_row, c)] = c
            for f in as_completed(list(running)):
                self._write(running.pop(f), f)
        finally:
            executor.shutdown(wait=True)

    def start(self, todo) -> None:
        self.todo = list(dict.fromkeys(todo))
        if self.todo:
            self.feeder = threading.Thread(target=self._feed, name="offline-compiles", daemon=True)
            self.feeder.start()

    def rows(self, wanted) -> list[dict]:
        out = []
        for c in wanted:
            while not (self._file(c, ".json").exists() or self._file(c, ".err").exists()):
                if (self.feeder is None or not self.feeder.is_alive()) and self._take(c):  # none left to take it
                    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_child_start, initargs=(self.path, cache_dir())) as one:
                        self._write(c, one.submit(compile_row, c))
                time.sleep(0.1)
            if self._file(c, ".err").exists():
                raise AssertionError(f"the offline compile of {c} failed: {self._file(c, '.err').read_text()}")
            out.append(json.loads(self._file(c, ".json").read_text()))
        return out

    def close(self) -> None:
        """At the end of this process's tests: go on taking compiles until none is left (another process's tests may
        be waiting for them, and this one's cores are free now)."""
        if self.feeder is not None:
            self.feeder.join()
