"""PERFORMANCE.md v45: how fast a kernel can only write, or only read, a P-sized tensor on this GPU, beside the copy
rate the qk_softmax floor uses (1 GiB copy_, bytes read plus written) and beside the PV kernel's read of P.

The floor prices P's write and P's read at the copy rate. If a pure read stream runs well above it, the PV kernel has
room the floor does not show (it reads P and little else); if a pure write stream runs well above P's TMA store path
(v16: 3.8-4.0 TB/s), pass 2's stores do. Every buffer holds random or varied data, not zeros. GPU only:

    python scripts/experiments/stream_rates.py [--sizes 64x4096,128x4096] [--patterns]

--patterns (v46): the same bytes read or written in (BM, BN) tiles the way the PV kernel reads P and the P kernel
writes it (a program owns BM rows of a head and walks its key tiles), by plain loads and stores and by TMA stores,
beside the contiguous streams: does the access pattern, rather than the instruction, set the rate?
"""
import argparse

import torch
import triton
import triton.language as tl
import triton.testing

from attnlab.triton import launch

GB = 1e9


@triton.jit
def _write(out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, (offs & 1023).to(out.dtype.element_ty), mask=offs < n)


@triton.jit
def _read(x, part, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n, other=0.0)
    tl.store(part + pid, tl.sum(v.to(tl.float32), axis=0))


@triton.jit
def _read_tiles(x, part, N, BM: tl.constexpr, BN: tl.constexpr, STAGES: tl.constexpr):
    """A program's BM rows of one head, key tile by key tile, summed (the PV kernel's walk over P, without V)."""
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    base = x + bh * N * N + rows.to(tl.int64)[:, None] * N
    acc = tl.zeros([BM, BN], tl.float32)
    for n0 in tl.range(0, N, BN, num_stages=STAGES):
        acc += tl.load(base + n0 + tl.arange(0, BN)[None, :]).to(tl.float32)
    tl.store(part + bh * tl.num_programs(0) + tl.program_id(0), tl.sum(tl.sum(acc, axis=1), axis=0))


@triton.jit
def _write_tiles(out, N, BM: tl.constexpr, BN: tl.constexpr):
    """The same walk, storing varied values (the P kernel's pass 2 order, without its arithmetic)."""
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    base = out + bh * N * N + rows.to(tl.int64)[:, None] * N
    val = (rows[:, None] + tl.arange(0, BN)[None, :]).to(out.dtype.element_ty)
    for n0 in range(0, N, BN):
        tl.store(base + n0 + tl.arange(0, BN)[None, :], val)


def patterns(D, N):
    """v46: rates of the P-kernel and PV-kernel walks by tile shape, beside the contiguous streams."""
    import tma_store_rate  # this script's directory is on sys.path when it runs
    from attnlab.triton.fused_gluon import descriptor

    B, H = 16384 // N, 2048 // D
    p = torch.randn(B, H, N, N, device="cuda", dtype=torch.bfloat16)
    gb = p.numel() * 2 / GB
    tag = f"D={D} N={N} P_GB={gb:.2f}"
    for bm, bn in ((128, 64), (128, 128), (64, 256), (128, 256), (32, 512), (16, 1024)):
        part = torch.empty(B * H * (N // bm), device="cuda", dtype=torch.float32)
        for stages in (1, 3):
            t = ms_of(lambda: _read_tiles[(N // bm, B * H)](p, part, N, BM=bm, BN=bn, STAGES=stages, num_warps=8))
            print(f"{tag} read_tiles {bm}x{bn} stages={stages} ms={t:.4f} TB/s={gb / t:.3f}", flush=True)
    scratch = torch.empty_like(p)
    for bm, bn in ((64, 128), (128, 128), (64, 256), (16, 1024)):
        t = ms_of(lambda: _write_tiles[(N // bm, B * H)](scratch, N, BM=bm, BN=bn, num_warps=8))
        print(f"{tag} write_tiles {bm}x{bn} ms={t:.4f} TB/s={gb / t:.3f}", flush=True)
    # TMA stores: P's own (B, H, N, N) boxes as the P kernel stores them, against P viewed as one contiguous
    # (rows of 256) tensor whose 64 × 256 boxes are 32 KiB runs
    flat = scratch.view(1, 1, -1, 256)
    for what, t4, bm, bn, n_cols in (("tma_P_boxes", scratch, 64, 128, N), ("tma_contiguous", flat, 64, 256, 256)):
        rows_total = t4.shape[2]
        d = descriptor(t4, bm, bn)
        grid = (triton.cdiv(rows_total, 2 * bm), t4.shape[0] * t4.shape[1])
        t = ms_of(lambda: tma_store_rate._fill[grid](d, n_cols, BLOCK_M=bm, BLOCK_N=bn, BUFS=2, num_warps=4))
        print(f"{tag} {what} box={bm}x{bn} ms={t:.4f} TB/s={gb / t:.3f}", flush=True)
    del p, scratch
    torch.cuda.empty_cache()


def ms_of(fn, warmup=200, rep=300):
    """Median ms by do_bench after a long warm-up (the clock ramps from idle); buffers are GBs, far past L2."""
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64x4096,128x4096", help="DxN pairs: P of FlashAttention's B, H at that D, N")
    ap.add_argument("--patterns", action="store_true", help="v46: the tile walks instead of the streams")
    args = ap.parse_args()
    if args.patterns:
        for pair in args.sizes.split(","):
            patterns(*(int(x) for x in pair.split("x")))
        return
    src = torch.randn(2**28, device="cuda")  # the ceiling's copy: 1 GiB fp32
    dst = torch.empty_like(src)
    ms = ms_of(lambda: dst.copy_(src))
    print(f"copy_1GiB ms={ms:.4f} TB/s={2 * src.numel() * 4 / GB / ms:.3f} (read + written)", flush=True)
    del src, dst
    for pair in args.sizes.split(","):
        D, N = (int(x) for x in pair.split("x"))
        B, H = 16384 // N, 2048 // D
        p = torch.randn(B, H, N, N, device="cuda", dtype=torch.bfloat16)
        n = p.numel()
        gb = n * 2 / GB
        tag = f"D={D} N={N} P_GB={gb:.2f}"
        rows = {}
        copy = torch.empty(n, device="cuda", dtype=torch.bfloat16)
        rows["copy_P"] = (ms_of(lambda: copy.copy_(p.view(-1))), 2 * gb)
        del copy
        scratch = torch.empty_like(p)
        rows["fill_P"] = (ms_of(lambda: scratch.fill_(0.5)), gb)
        for block in (2048, 8192):
            rows[f"write_b{block}"] = (ms_of(lambda: _write[(triton.cdiv(n, block),)](scratch, n, BLOCK=block,
                                                                                    num_warps=8)), gb)
        del scratch
        for block in (4096, 16384):
            part = torch.empty(triton.cdiv(n, block), device="cuda", dtype=torch.float32)
            rows[f"read_b{block}"] = (ms_of(lambda: _read[(triton.cdiv(n, block),)](p, part, n, BLOCK=block,
                                                                                  num_warps=8)), gb)
            ref = p.view(-1)[:block].float().sum().item()
            assert abs(part[0].item() - ref) <= 1e-3 * max(1.0, abs(ref)) + 1e-2, (part[0].item(), ref)
        rows["torch_sum_P"] = (ms_of(lambda: p.sum(dtype=torch.float32)), gb)
        v = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
        for causal in (False, True):
            c = launch._prepare(v, v, v, causal, None, None, None)  # a random P: the timing, not the values
            o = torch.empty_like(v)
            read = gb / 2 if causal else gb
            rows[f"pv_kernel{'_causal' if causal else ''}"] = (ms_of(lambda: launch._pv(c, p, None, o)), read)
        for what, (t, moved) in rows.items():
            print(f"{tag} {what} ms={t:.4f} GB_moved={moved:.2f} TB/s={moved / t:.3f}", flush=True)
        del p, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
