"""Prototype (PERFORMANCE.md v8): does a program that owns two row sub-blocks, sharing each K/V tile, let Triton 3.6
overlap one sub-block's softmax with the other's PV matmul on Hopper?

Compiled for sm_90a (offline, no GPU), the paired loop issues PV(A) asynchronously and runs softmax(B) before waiting
for it; the single-block loop waits for every wgmma before the next softmax. This script times both shapes of loop
(non-causal, no mask, N a multiple of the tiles) against the lab's own `fused` and cuDNN, after checking each
against SDPA's output. GPU only:   python scripts/experiments/paired_rows.py [--ns 1024,4096,16384]
"""
import argparse
import itertools

import torch
import triton
import triton.language as tl
import triton.testing

LOG2E = 1.4426950408889634


@triton.jit
def _softmax_step(s, m_i, l_i, acc, qk_scale):
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    return p, m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None]


@triton.jit
def single_kernel(Q, K, V, O, N, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    base = bh * N * D
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :])
    kp = K + base + offs_n[:, None] * D + offs_d[None, :]
    vp = V + base + offs_n[:, None] * D + offs_d[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, N, BLOCK_N):
        k = tl.load(kp + start_n * D)
        s = tl.dot(q, tl.trans(k))
        p, m_i, l_i, acc = _softmax_step(s, m_i, l_i, acc, qk_scale)
        v = tl.load(vp + start_n * D)
        acc = tl.dot(p.to(v.dtype), v, acc)
    tl.store(O + base + offs_m[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty))


@triton.jit
def paired_kernel(Q, K, V, O, N, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    # rows [2·BLOCK_M·pid, +BLOCK_M) are sub-block A, the next BLOCK_M rows sub-block B; both read each K/V tile once
    bh = tl.program_id(1).to(tl.int64)
    offs_a = tl.program_id(0) * 2 * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_b = offs_a + BLOCK_M
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    base = bh * N * D
    qa = tl.load(Q + base + offs_a[:, None] * D + offs_d[None, :])
    qb = tl.load(Q + base + offs_b[:, None] * D + offs_d[None, :])
    kp = K + base + offs_n[:, None] * D + offs_d[None, :]
    vp = V + base + offs_n[:, None] * D + offs_d[None, :]
    ma = tl.full([BLOCK_M], float("-inf"), tl.float32)
    mb = ma
    la = tl.zeros([BLOCK_M], tl.float32)
    lb = la
    acca = tl.zeros([BLOCK_M, D], tl.float32)
    accb = acca
    for start_n in range(0, N, BLOCK_N):
        k = tl.load(kp + start_n * D)
        sa = tl.dot(qa, tl.trans(k))
        sb = tl.dot(qb, tl.trans(k))
        v = tl.load(vp + start_n * D)
        pa, ma, la, acca = _softmax_step(sa, ma, la, acca, qk_scale)
        acca = tl.dot(pa.to(v.dtype), v, acca)  # async: its result is next needed in the next iteration
        pb, mb, lb, accb = _softmax_step(sb, mb, lb, accb, qk_scale)  # runs while PV(A) is on the tensor cores
        accb = tl.dot(pb.to(v.dtype), v, accb)
    tl.store(O + base + offs_a[:, None] * D + offs_d[None, :], (acca / la[:, None]).to(O.dtype.element_ty))
    tl.store(O + base + offs_b[:, None] * D + offs_d[None, :], (accb / lb[:, None]).to(O.dtype.element_ty))


def attend(kind, q, k, v, bm, bn, w, s):
    B, H, N, D = q.shape
    o = torch.empty_like(q)
    rows = bm * (2 if kind == "paired" else 1)
    assert N % rows == 0 and N % bn == 0
    kern = paired_kernel if kind == "paired" else single_kernel
    kern[(N // rows, B * H)](q, k, v, o, N, D ** -0.5 * LOG2E, BLOCK_M=bm, BLOCK_N=bn, D=D, num_warps=w, num_stages=s)
    return o


def main():
    from attnlab import builds

    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="1024,4096,16384")
    args = ap.parse_args()
    cands = {64: [("single", 128, 64, 8, 3), ("paired", 64, 64, 4, 3), ("paired", 64, 64, 4, 2),
                  ("paired", 128, 64, 8, 3), ("paired", 128, 64, 8, 2), ("paired", 64, 128, 4, 2)],
             128: [("single", 128, 64, 8, 3), ("paired", 64, 64, 4, 3), ("paired", 64, 64, 4, 2),
                   ("paired", 128, 64, 8, 3), ("paired", 128, 64, 8, 2), ("paired", 64, 32, 4, 3)]}
    print("D N kind BMxBN w s ms TF/s err vs_fused vs_cudnn", flush=True)
    for D, N in itertools.product((64, 128), (int(n) for n in args.ns.split(","))):
        B, H = 16384 // N, 2048 // D
        g = torch.Generator(device="cuda").manual_seed(N + D)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
        flops = 4 * B * H * N * N * D
        lib = {}
        for name in ("fused", "sdpa_cudnn"):
            b = builds.get(name)
            lib[name] = triton.testing.do_bench(lambda: b.attend(q, k, v, causal=False), warmup=100, rep=200,
                                                return_mode="median")
            print(f"{D} {N} {name} - - - {lib[name]:.4f} {flops / lib[name] / 1e9:.0f}", flush=True)
        for kind, bm, bn, w, s in cands[D]:
            try:
                o = attend(kind, q, k, v, bm, bn, w, s)
                err = ((o.float() - ref).norm() / ref.norm()).item()
                ms = triton.testing.do_bench(lambda: attend(kind, q, k, v, bm, bn, w, s), warmup=100, rep=200,
                                             return_mode="median")
                print(f"{D} {N} {kind} {bm}x{bn} {w} {s} {ms:.4f} {flops / ms / 1e9:.0f} {err:.1e} "
                      f"{lib['fused'] / ms:.3f} {lib['sdpa_cudnn'] / ms:.3f}", flush=True)
            except Exception as e:  # noqa: BLE001 - out of shared memory etc.
                print(f"{D} {N} {kind} {bm}x{bn} {w} {s} FAILED {type(e).__name__}: {str(e)[:120]}", flush=True)
        del q, k, v, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
