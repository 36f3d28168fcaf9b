"""PERFORMANCE.md v16: how much of the qk_softmax Gluon P kernel's time its exponentials take. A diagnostic, not a
build: the exponentials of pass 1, of pass 2 or of both are replaced by one FMA each (P is then wrong), and the P
kernel alone is timed at FlashAttention's shapes, bf16. GPU (sm90) only; one process a variant, started together so
that they compile at once, timing one after another under a file lock:

    for f in none pass1 pass2 both ref1 ref1-fake; do
        python scripts/experiments/qk_exp_probe.py --d 128 --fake $f & done; wait

Session 11 added `ref1` (PERFORMANCE.md "Next"): pass 1 without its running max. The row's reference is the first
key tile's max, and every later tile's exponentials use it as it stands, so they no longer wait for that tile's
max and the rescale. For random inputs that is exact (the later scores stay far from overflowing against it), and
the probe prints P's largest difference from an fp32 softmax. It is no build: scores that outgrow the first
tile's max by 128 (log2 units) would overflow. `ref1-fake` also replaces pass 1's exponentials by FMAs: the bound
on what a pass 1 of matmuls alone could give.

Prints `probe D causal N fake ms p_diff`, p_diff: P's largest difference from an fp32 softmax on two heads (only
`none` and `ref1` write a true P).
"""
import argparse
import fcntl
import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from attnlab.triton import config, fused_gluon, launch, qk_softmax_gluon
from gluon_fa3 import timed  # this script's directory is on sys.path when it runs


@gluon.jit
def _fake_exp2(x):
    return x * 0.0009765625 + 1.0  # one FFMA where MUFU.EX2 was


@gluon.jit
def _softmax_fake(s, m_i, l_i, qk_scale, MASKED: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """fused_gluon._softmax without its exponentials (the unmasked, unablated path the timing takes)."""
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    p = _fake_exp2(s * qk_scale - m_new[:, None])
    alpha = _fake_exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def _probabilities_fake(s, bias, qk_scale, SCALED: gl.constexpr, NO_SOFTMAX: gl.constexpr):
    """qk_softmax_gluon._probabilities without its exponential."""
    if SCALED:
        p = _fake_exp2(s - bias[:, None])
    else:
        p = _fake_exp2(s * qk_scale - bias[:, None])
    return p


@gluon.jit
def _ref_exp2(x):
    return gl.exp2(x)  # ref1-fake puts _fake_exp2 under this name


@gluon.jit
def _tile_ref(s, m_i, l_i, j, rows, hi, mask_rows, mask_tile, offs_m, cols, N, smn, qk_scale, mask_scale,
              BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, MASK_KIND: gl.constexpr, NO_SOFTMAX: gl.constexpr,
              MASK_TMA: gl.constexpr):
    """fused_gluon._tile for pass 1 with a fixed reference: the first tile's row max, then no max at all (the
    unmasked, non-causal path the timing takes)."""
    offs_n = j * BLOCK_N + cols
    if j == 0:
        m_i = gl.max(s, axis=1) * qk_scale
    p = _ref_exp2(s * qk_scale - m_i[:, None])
    l_i = l_i + gl.sum(p, axis=1)
    return p, m_i, l_i, m_i, offs_n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--causal", type=int, default=0)
    ap.add_argument("--fake", choices=("none", "pass1", "pass2", "both", "ref1", "ref1-fake"), default="none")
    ap.add_argument("--lock", default="/tmp/qk_exp_probe.lock")
    a = ap.parse_args()
    if a.fake in ("pass1", "both"):
        fused_gluon._softmax = _softmax_fake  # resolved by name when _tile compiles
    if a.fake in ("pass2", "both"):
        qk_softmax_gluon._probabilities = _probabilities_fake
    if a.fake.startswith("ref1"):
        if a.causal:
            raise SystemExit("qk_exp_probe.py: --fake ref1 takes the unmasked non-causal path only (--causal 0)")
        qk_softmax_gluon._tile = _tile_ref  # pass 1's tile, resolved by name when the kernel compiles
        if a.fake == "ref1-fake":
            globals()["_ref_exp2"] = _fake_exp2
    N, D, causal = a.n, a.d, bool(a.causal)
    B, H = 16384 // N, 2048 // D
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    p = torch.empty(B, H, N, N, device="cuda", dtype=torch.bfloat16)
    tiles = config.tiles("qk_softmax", q.device, D, causal, q.dtype)
    c = launch._prepare(q, k, k, causal, None, None, None)

    def run():
        qk_softmax_gluon.launch(c.q, c.k, p, c.mask, c.mask_strides, c.mask_kind, N=N, H=H, group=1,
                                qk_scale=config.LOG2E / math.sqrt(D), mask_scale=config.LOG2E, causal=causal,
                                tiles=tiles)

    run()  # compile, in parallel with the other variants
    torch.cuda.synchronize()
    # P of the first two heads against an fp32 softmax (a variant is patched in before its one compile, so the real
    # kernel's own difference comes from the `none` process)
    ref = torch.softmax(q[:1, :2].float() @ k[:1, :2].float().transpose(-1, -2) / math.sqrt(D), dim=-1)
    p_diff = f" p_diff={(p[:1, :2].float() - ref).abs().max().item():.3g}"
    with open(a.lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # time alone
        ms = timed(run)
    print(f"probe D={D} causal={int(causal)} N={N} fake={a.fake} ms={ms:.4f}{p_diff} tiles={tiles}", flush=True)


if __name__ == "__main__":
    main()
