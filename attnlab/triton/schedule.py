"""The persistent fused kernel's work list: which program does which work item, and in which order (PERFORMANCE.md
v19).

A persistent grid has one program an SM, and each program takes its items from this list. Items are listed as the
one-item-a-program grid launches them (a head's row blocks in turn, heaviest first under a causal mask), and each
goes to the program with the least work so far, counted in key tiles plus a fixed cost an item. That is what the
hardware's block scheduler does for the one-item grid, decided here on the host. Plain round robin (program pid
taking items pid, pid + grid, …) left causal grids waiting for the programs that drew only heavy row blocks: 0.56 to
0.99× the one-item kernel (v18). Without a causal mask every item costs the same and the list is that round robin.
"""
from __future__ import annotations

import functools
import heapq

import torch

ITEM_COST = 1  # an item's fixed cost (Q load, O store, pipeline fill), in key tiles: a guess, not measured


def work_list(n_blocks: int, heads: int, rows: int, block_n: int, N: int, causal: bool, heavy_first: bool,
              programs: int) -> tuple[list[int], list[int]]:
    """(order, starts): program p does items order[starts[p]:starts[p + 1]], in that order. Item i is row block
    i % n_blocks (reversed when heavy_first) of batch·head i // n_blocks; `rows` rows a block."""
    loads = [(0, p) for p in range(programs)]  # (work so far, program): the least loaded first, then the lowest p
    lists: list[list[int]] = [[] for _ in range(programs)]
    for item in range(n_blocks * heads):
        blk = item % n_blocks
        if heavy_first:
            blk = n_blocks - 1 - blk
        keys = min(N, (blk + 1) * rows) if causal else N
        load, p = heapq.heappop(loads)
        lists[p].append(item)
        heapq.heappush(loads, (load + -(-keys // block_n) + ITEM_COST, p))
    starts = [0]
    for items in lists:
        starts.append(starts[-1] + len(items))
    return [i for items in lists for i in items], starts


@functools.lru_cache(maxsize=256)
def device_work_list(n_blocks: int, heads: int, rows: int, block_n: int, N: int, causal: bool, heavy_first: bool,
                     programs: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """work_list as int32 tensors on the device, made once per shape (the first call of a shape makes them, so a
    CUDA graph captured after it allocates nothing)."""
    order, starts = work_list(n_blocks, heads, rows, block_n, N, causal, heavy_first, programs)
    return (torch.tensor(order, dtype=torch.int32, device=device),
            torch.tensor(starts, dtype=torch.int32, device=device))
