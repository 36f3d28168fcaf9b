"""PERFORMANCE.md v16: the rate at which TMA stores of (BLOCK_M, BLOCK_N) tiles fill a (B, H, N, N) bf16 P, P's
whole store path with nothing else in the kernel (a zeroed shared-memory tile stored over and over, two 64-row
blocks a program as the qk_softmax kernel writes them), against torch's fill of the same tensor. GPU (sm90) only:

    python scripts/experiments/tma_store_rate.py
"""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from attnlab.triton.fused_gluon import descriptor
from gluon_fa3 import timed  # this script's directory is on sys.path when it runs


@gluon.jit
def _fill(p_desc, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BUFS: gl.constexpr):
    bh = gl.program_id(1)
    H = p_desc.shape[1]
    rows = gl.program_id(0) * 2 * BLOCK_M
    buf = gl.allocate_shared_memory(p_desc.dtype, [BUFS, 1, 1, BLOCK_M, BLOCK_N], p_desc.layout)
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    for i in gl.static_range(BUFS):
        buf.index(i).reshape([BLOCK_M, BLOCK_N]).store(gl.zeros([BLOCK_M, BLOCK_N], p_desc.dtype, layout))
    fence_async_shared()
    for j in range(gl.cdiv(N, BLOCK_N)):
        for w in gl.static_range(2):
            tma.store_wait(pendings=BUFS - 1)
            tma.async_copy_shared_to_global(p_desc, [bh // H, bh % H, rows + w * BLOCK_M, j * BLOCK_N],
                                            buf.index((2 * j + w) % BUFS))
    tma.store_wait(pendings=0)


def main():
    for D, N in ((128, 4096), (64, 4096), (128, 1024)):
        B, H = 16384 // N, 2048 // D
        p = torch.empty(B, H, N, N, device="cuda", dtype=torch.bfloat16)
        gb = p.numel() * 2 / 1e9
        t_fill = timed(lambda: p.zero_())
        for bm, bn, bufs in ((64, 128, 2), (64, 128, 4), (128, 128, 2), (64, 256, 2)):
            d = descriptor(p, bm, bn)
            ms = timed(lambda: _fill[(triton.cdiv(N, 2 * bm), B * H)](d, N, BLOCK_M=bm, BLOCK_N=bn, BUFS=bufs,
                                                                        num_warps=4))
            assert p.abs().max().item() == 0
            print(f"store D={D} N={N} GB={gb:.2f} box={bm}x{bn} bufs={bufs} ms={ms:.4f} TB/s={gb / ms:.2f} "
                  f"torch_fill_ms={t_fill:.4f} torch_TB/s={gb / t_fill:.2f}", flush=True)


if __name__ == "__main__":
    main()
