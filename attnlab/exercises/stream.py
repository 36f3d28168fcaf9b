"""The key/value tiles exercise 2's check hands a student's online softmax: one at a time, as a fused kernel streams
them past a block of query rows, with what a streaming kernel may do made into rules a Python function is held to.

    once        the tiles can be iterated once: a second pass (one for the max, another for the sum) is refused
    one tile    when tile i is asked for, no tile before i − 2 is still held (a double-buffered kernel holds the tile
                it computes on and the one it loads): a list of the tiles, or of views into them, keeps them
    no row      the tensors the function makes and still holds never add up to more than a quarter of the block's
                whole score row (M × N scores in float64): the running max, sum and accumulator and a tile's scores
                fit many times over; every tile's scores kept in a list, or K and V concatenated, do not
    in torch    numbers taken out of torch (Tensor.numpy, tolist, item, float, storages) are refused: the rules follow
                torch tensors, and numbers moved elsewhere would leave them blind
    every tile  every tile is read: every key counts

How it watches: each tile is a fresh copy (no view of it leads back to the whole K or V), and its stream keeps only
weak references to what it handed out, so a tile still alive when the next is asked for is one the function holds.
While the function runs, a TorchFunctionMode (torch.overrides) sees every torch call it makes and keeps a weak
reference to each tensor the call returns; the bytes of the storages behind those still alive, less the tiles' and
the query block's own, are what the function holds. A rule broken raises StreamingRuleBroken inside the function (a
function that catches it is still refused: the stream remembers) and `broken` says which rule and why.

A determined cheat can hide numbers from any check run in the same Python process (in lists of Python floats taken
one by one, or by reading the caller's frame); the rules catch the non-streaming answers people write: both passes
over the tiles, the tiles collected in a list, every tile's scores kept, K and V concatenated.
"""
from __future__ import annotations

import math
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

# Tensor methods that take numbers out of torch, where the rules cannot follow them.
LEAVES_TORCH = frozenset({"numpy", "__array__", "tolist", "item", "__float__", "untyped_storage", "storage",
                          "data_ptr"})


class StreamingRuleBroken(Exception):
    """Raised inside the student's function when it breaks a rule of the stream (TileStream.broken says which)."""


@dataclass(frozen=True)
class Broken:
    rule: str  # 'once', 'one tile', 'no row', 'in torch' or 'every tile'
    message: str


def size(n: float) -> str:
    """Bytes as a person reads them: '31.2 KiB'."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024 or unit == "MiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


class TileStream:
    """(k_tile, v_tile) pairs of up to block_n keys of k and v (N, D), in order, for the query block q (M, D), each
    tile handed out once; `watching()` holds the function run inside it to the module's rules."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_n: int):
        self._q, self._k, self._v, self.block_n = q, k, v, block_n
        M, N = q.shape[0], k.shape[0]
        self.tiles = math.ceil(N / block_n)
        self.row_bytes = M * N * torch.finfo(torch.float64).bits // 8  # the block's whole score row, float64
        self.budget_bytes = self.row_bytes // 4
        self.read = 0  # tiles handed out
        self.peak_bytes = 0  # the most the function held at once
        self.broken: Broken | None = None
        self._passes = 0
        self._handed: list[tuple[weakref.ref, weakref.ref]] = []
        self._made: list[weakref.ref] = []  # every tensor a torch call of the function returned
        self._quiet = False  # the stream's own torch calls are not the function's

    # the tiles
    def __iter__(self):
        self._passes += 1
        if self._passes > 1:
            self._break("once", "your function asked for the tiles a second time: a kernel streams each K/V tile "
                                "past once. A second pass (the max first, then the sum) is what rescaling the "
                                "running sum and accumulator when the max changes avoids")
        return _Reader(self)

    def _next(self):
        i = self.read
        if i >= self.tiles:
            raise StopIteration
        kept = [j for j, refs in enumerate(self._handed[:max(0, i - 2)]) if any(r() is not None for r in refs)]
        if kept:
            self._break("one tile", f"when your function asked for key tile {i}, it still held tile {kept[0]}: a "
                                    "kernel holds one K/V tile on chip, two while it loads the next. Keep the "
                                    "running max, sum and accumulator from tile to tile, not the tiles (a list of "
                                    "the tiles, or of views into them, holds them)")
        self._quiet = True
        try:
            start = i * self.block_n
            tile = (self._k[start:start + self.block_n].clone(), self._v[start:start + self.block_n].clone())
            self._handed.append((weakref.ref(tile[0]), weakref.ref(tile[1])))
        finally:
            self._quiet = False
        self.read += 1
        return tile

    # the rules
    def _break(self, rule: str, message: str) -> None:
        if self.broken is None:
            self.broken = Broken(rule, message)
        raise StreamingRuleBroken(self.broken.message)

    def held_bytes(self) -> int:
        """The bytes of the storages behind the tensors the function made that are still alive, the tiles' and the
        query block's own left out (a view of a tile or of q is not a copy)."""
        theirs = {self._q.untyped_storage().data_ptr()}
        for refs in self._handed:
            theirs |= {t.untyped_storage().data_ptr() for t in (r() for r in refs) if t is not None}
        live, alive = {}, []
        for r in self._made:
            t = r()
            if t is None:
                continue
            alive.append(r)
            storage = t.untyped_storage()
            if storage.data_ptr() not in theirs:
                live[storage.data_ptr()] = storage.nbytes()
        self._made = alive
        return sum(live.values())

    def _track(self, out) -> None:
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self._made.append(weakref.ref(t))
        self._quiet = True
        try:
            held = self.held_bytes()
        finally:
            self._quiet = False
        self.peak_bytes = max(self.peak_bytes, held)
        if held > self.budget_bytes:
            M, N = self._q.shape[0], self._k.shape[0]
            self._break("no row", f"your function held {size(held)} of tensors at once, more than a quarter of "
                                  f"this block's whole score row ({M} × {N} float64 scores, {size(self.row_bytes)}): "
                                  "a streaming kernel holds its running max, sum and accumulator and one tile's "
                                  "scores, never the row (every tile's scores kept, or K and V concatenated, are "
                                  "the row again)")

    def finished(self) -> None:
        """After the function returned: every tile read (a rule broken before stays the one reported)."""
        if self.broken is None and self.read < self.tiles:
            self.broken = Broken("every tile", f"your function read {self.read} of the {self.tiles} key tiles: "
                                               "every key counts, so O needs them all")

    @contextmanager
    def watching(self):
        """The function run in this block is held to the rules (module docstring)."""
        with _Watch(self):
            yield self


class _Reader:
    """The one pass over a TileStream: an iterator of its own, so `iter()` of it is itself."""

    def __init__(self, stream: TileStream):
        self._stream = stream

    def __iter__(self):
        return self

    def __next__(self):
        return self._stream._next()


class _Watch(TorchFunctionMode):
    """Every torch call made while active: refused if it takes numbers out of torch, else its outputs tracked."""

    def __init__(self, stream: TileStream):
        super().__init__()
        self.stream = stream

    def __torch_function__(self, func, types, args=(), kwargs=None):
        s = self.stream
        if s._quiet:
            return func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in LEAVES_TORCH:
            s._break("in torch", f"your function took numbers out of torch (Tensor.{name}): the check follows the "
                                 "tensors your function holds to see that it streams, and cannot follow them "
                                 "there. Keep the loop in torch tensors")
        out = func(*args, **(kwargs or {}))
        s._track(out)
        return out
