"""PERFORMANCE.md v37 (session 20, call 3): the names of the kernels cuBLAS runs for the qk_softmax build's two
products at issue 5's shapes (B·N = 16384, H·D = 2048, bf16): S = QKᵀ written, then O = S V. A name such as
`nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNN` gives the tile, K step, stages and cluster shape. GPU only:

    python scripts/experiments/cublas_kernels.py
"""
import torch
from torch.profiler import ProfilerActivity, profile


def main():
    for D, N in ((128, 4096), (128, 16384), (64, 4096)):
        B, H = 16384 // N, 2048 // D
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        P = torch.empty(B, H, N, N, device="cuda", dtype=torch.bfloat16)
        o = torch.empty_like(q)
        kt = k.transpose(-1, -2)
        for _ in range(3):  # cuBLAS's heuristics settle before the profiled calls
            torch.matmul(q, kt, out=P)
            torch.matmul(P, v, out=o)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                torch.matmul(q, kt, out=P)
                torch.matmul(P, v, out=o)
            torch.cuda.synchronize()
        print(f"D={D} N={N}")
        for e in prof.key_averages():
            if "CUDA" in str(e.device_type):
                print(f"  {e.key[:200]}  n={e.count} avg_us={e.device_time:.1f}")
        del P, q, k, v, o
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
