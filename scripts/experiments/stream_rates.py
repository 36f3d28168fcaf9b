"""PERFORMANCE.md v45: how fast a kernel can only write, or only read, a P-sized tensor on this GPU, beside the copy
rate the qk_softmax floor uses (1 GiB copy_, bytes read plus written) and beside the PV kernel's read of P.

The floor prices P's write and P's read at the copy rate. If a pure read stream runs well above it, the PV kernel has
room the floor does not show (it reads P and little else); if a pure write stream runs well above P's TMA store path
(v16: 3.8-4.0 TB/s), pass 2's stores do. Every buffer holds random or varied data, not zeros. GPU only:

    python scripts/experiments/stream_rates.py [--sizes 64x4096,128x4096]
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


def ms_of(fn):
    """Median ms by do_bench after a long warm-up (the clock ramps from idle); buffers are GBs, far past L2."""
    return triton.testing.do_bench(fn, warmup=200, rep=300, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64x4096,128x4096", help="DxN pairs: P of FlashAttention's B, H at that D, N")
    args = ap.parse_args()
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
        q = torch.empty(n, device="cuda", dtype=torch.bfloat16)
        rows["copy_P"] = (ms_of(lambda: q.copy_(p.view(-1))), 2 * gb)
        del q
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
            c = launch._prepare(v, v, v, causal, None, None, None)
            o = torch.empty_like(v)
            read = gb / 2 if causal else gb
            rows[f"pv_kernel{'_causal' if causal else ''}"] = (ms_of(lambda: launch._pv(c, p, None, o)), read)
        for what, (t, moved) in rows.items():
            print(f"{tag} {what} ms={t:.4f} GB_moved={moved:.2f} TB/s={moved / t:.3f}", flush=True)
        del p, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
