"""Where our kernels can run, and with which tiles: explicit tables, chosen by the opt-in autotune sweep.

TABLE is keyed by (kernel, GPU family, head-dim bucket, causal, dtype); SHORT, keyed alike, holds the few entries that
replace TABLE's for short sequences, each below an N of its own. `tiles()` returns the entry used, and every result
row records it (see attnlab.triton.launch.tile_config). `attnlab bench --autotune` re-runs the sweep that chose these
entries (attnlab.autotune); change an entry only with a line in PERFORMANCE.md saying what it measured.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

LOG2E = 1.4426950408889634  # exp(x) = exp2(x · log2 e): exp2 is the cheaper instruction


@dataclass(frozen=True)
class Tiles:
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int = 4
    num_stages: int = 2
    tma: bool = False  # fused kernel only: K and V through Hopper's tensor-memory accelerator (sm90+, GPU only)
    # fused and the Gluon qk_softmax kernel: launch the query blocks last-first. Under a causal mask the last block
    # does the most work; started last (the default order), it runs alone at the end of the grid (PERFORMANCE.md v6:
    # up to 8 % at N = 16384).
    heavy_first: bool = False
    # fused kernel only: each program owns two blocks of BLOCK_M rows that share every K/V tile, so one block's
    # softmax overlaps the other's PV matmul (PERFORMANCE.md v8). The grid then has cdiv(N, 2·BLOCK_M) programs.
    paired: bool = False
    # fused and qk_softmax: the warp-specialised Gluon kernel (attnlab.triton.fused_gluon, .qk_softmax_gluon; sm90,
    # 16-bit; they compile for D = 64 or 128 exactly; the table uses fused's at 128, qk_softmax's at both). BLOCK_M is
    # then the rows of each of its two consumer warpgroups, a program covers 2·BLOCK_M, and
    # num_warps is 4 (one warpgroup a partition). PERFORMANCE.md v10.
    gluon: bool = False
    # Gluon kernel only: the loader warp brings each mask tile by TMA with K, instead of each consumer loading it in
    # its loop (PERFORMANCE.md v11; masks TMA cannot read keep the loads).
    mask_tma: bool = False
    # Gluon qk_softmax kernel only: Q as the register operand of QKᵀ, loaded from shared memory once a pass, so each
    # matmul reads only its K tile there (PERFORMANCE.md v17: −0.9 to +1.1 % on the H200 alone; with fixed_reference
    # the table's D = 64 non-causal and D = 128 causal entries set it, v42; label suffix `r`).
    q_registers: bool = False
    # Gluon kernels: one program an SM (two with one_consumer), each taking the work items (2·BLOCK_M rows of a
    # head) in turn, so that the next item's Q, K and V load while this one finishes (PERFORMANCE.md v18 fused, v28
    # qk_softmax; label suffix `c`).
    persistent: bool = False
    # Gluon fused kernel, persistent only: O goes out by TMA from two shared-memory tiles of its own, its store
    # draining under the next item, instead of plain stores from registers; where the shared memory has no room
    # (a 2-byte mask by TMA at D = 128) the plain stores stay (PERFORMANCE.md v22; label suffix `o`).
    o_tma: bool = False
    # Gluon kernels: one consumer warpgroup a program (BLOCK_M rows) instead of two, so that two programs share an SM
    # and one's start and end run under the other's work (PERFORMANCE.md v23; label suffix `u`). In the qk_softmax
    # kernel it pays the same way, under a causal mask at short N (v27; not where it was aimed, non-causal long N).
    one_consumer: bool = False
    # Gluon qk_softmax kernel only: pass 1 sums each row's exponentials against a fixed reference, the max of its
    # first key tile, instead of a running max (no max, no rescale in the loop, so a tile's exponentials need not
    # wait for its max). A row whose sum then overflows (a later score 2^128 above the reference), is 0 (a first
    # tile the mask hides, the rest too small to register, or a row hidden entirely) or NaN is flagged, and the
    # Triton kernel re-writes the flagged rows' blocks after it (PERFORMANCE.md v31; label suffix `f`).
    fixed_reference: bool = False
    # Gluon qk_softmax kernel only: one pass, the row on chip. At N ≤ 1024 (attnlab.triton.qk_softmax_row.fits) a
    # program keeps its BLOCK_M rows' exponentials for all N keys in shared memory, so each score is computed once; the
    # two consumers split the key tiles and swap their rows' (max, sum) before P is written. Persistent by
    # construction, two consumers; masked calls and rows that do not fit run the two-pass kernel, persistent, with
    # the same tiles otherwise (qk_softmax_gluon.as_run; PERFORMANCE.md v40; label suffix `a`). The autotune lets
    # such tiles compete for SHORT entries only, below ROW_MAX + 1 (attnlab.autotune.pick).
    one_pass: bool = False
    # Gluon PV kernel only: Oᵀ = Vᵀ Pᵀ, so that at D = 64 each wgmma is 64 × BLOCK_M (BLOCK_M up to 256) instead of
    # BLOCK_M × 64, and Oᵀ goes out through shared memory (PERFORMANCE.md v47; label suffix `y`).
    o_transposed: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


# the fields only the Gluon kernels read
GLUON_ONLY = ("gluon", "mask_tma", "q_registers", "persistent", "o_tma", "one_consumer", "fixed_reference",
              "one_pass", "o_transposed")


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def unsupported_reason(device: torch.device) -> str | None:
    """Why our Triton kernels cannot run on this device, or None when they can."""
    try:
        import triton  # noqa: F401
    except ImportError as e:  # pragma: no cover - triton is a dependency
        return f"triton is not importable ({e})"
    if device.type == "cuda":
        if interpreting():
            return "TRITON_INTERPRET=1 runs kernels on CPU tensors; unset it to use the GPU"
        major, _ = torch.cuda.get_device_capability(device)
        if major < 8:
            return f"our kernels need compute capability >= 8.0, this GPU has {major}.x"
        return None
    if device.type == "cpu":
        return None if interpreting() else "no GPU, and Triton's interpreter is off (set TRITON_INTERPRET=1)"
    return f"device type {device.type!r} is not supported by our Triton kernels"


def family(device: torch.device) -> str:
    if device.type != "cuda" or interpreting():
        return "interpreter"
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}"


# (kernel, family, head-dim bucket, causal, dtype-size) -> Tiles. "any" matches every value of that key.
# The interpreter runs one numpy op per block op, so big blocks and few programs are fastest there.
# sm90 entries: chosen on an H200 by `attnlab bench --autotune` (PERFORMANCE.md has the runs). The run folders this
# module names (outputs/h200/<run>, -sNN-callN) are in git history: `git show a0ec020:outputs/h200/<run>/...`.
TABLE: dict[tuple, Tiles] = {
    ("fused", "interpreter", "any", "any", "any"): Tiles(128, 128),
    ("qk_softmax", "interpreter", "any", "any", "any"): Tiles(128, 128),
    ("scores", "interpreter", "any", "any", "any"): Tiles(128, 128),
    ("pv", "interpreter", "any", "any", "any"): Tiles(128, 128),
    # H200, bf16, N = 4096, B·N = 16384, H·D = 2048, autotune runs of 2026-11-29 (PERFORMANCE.md, v2–v3); session 8
    # re-ran the fused sweep over N = 512, 2048, 8192 (attnlab.autotune): it chose every fused entry below again but the
    # causal Triton ones.
    # fused D = 128: 128×128 w8 s3 was 2 % faster without a mask but needs 288 KiB of shared memory once a mask tile
    # is pipelined too (the zero_mask ablation failed to compile); one configuration for masked and unmasked calls
    # keeps the mask ablation a comparison of the same kernel. TMA (tma=True) measured within 2 % either way: off.
    # Causal: heavy-first launch order (v6: 1–8 % at N = 16384, within noise at N ≤ 4096). D = 128 non-causal: paired
    # rows, one block's softmax overlapping the other's PV (v8). Paired causal and paired D = 64 measured slower.
    # D = 128 exactly ("=128"; D = 65…127 take the bucket's entries below): the warp-specialised Gluon kernel
    # (v10: 1.13–1.18× the Triton kernel, 0.88–1.01× cuDNN). At D = 64 it measured 0.86–0.97× the Triton kernel.
    # Masks the loader can bring by TMA come with K (v11: the zero_mask ablation's cost at N = 4096 1.21 → 0.25 ms).
    # Non-causal, D = 64 and 128: the persistent Gluon kernel (v18: one program an SM; D = 128 0.87 → 0.90× cuDNN at
    # N = 512, within 1 % from N = 2048; D = 64 1.03× the Triton kernel from N = 512 to 4096).
    # The persistent entries store O by TMA from tiles of their own (v22; session 9's autotune, `outputs/h200/
    # 2026-11-29-s9-call3`: at D = 128 N = 512 0.1617 → 0.1431 ms; scores 1.001 against 1.031 (D = 64) and 1.056
    # (D = 128) without).
    # Causal, D = 64 and 128 exactly: persistent too since v24, its items in heavy/light pairs (round robin had lost
    # to one item a program); session 10's autotune (`outputs/h200/2026-11-29-s10-call5`, scored at N = 2048 and
    # 8192): best at both (D = 128 0.2739 / 0.9308 ms against one item a program's 0.3073 / 0.9721; D = 64 0.3803 /
    # 1.2787 against the Triton kernel's 0.4065 / 1.4304). At short N, SHORT's entries serve.
    # Causal, Triton kernel (the rest of the buckets): 64×64 w4 s3 heavy-first at D = 65…127 (session 8's autotune,
    # `outputs/h200/2026-11-29-s8-call2`: 1.134 against 128×64 w8 s3's 1.215 over N = 512, 2048, 8192); at D ≤ 64
    # 128×64 w8 s3 (session 10's, at N = 2048 and 8192: 1.051 against 64×64 w4 s3's 1.094; 8 % slower at 512).
    ("fused", "sm90", "=128", False, 2): Tiles(64, 128, 4, 2, gluon=True, mask_tma=True, persistent=True, o_tma=True),
    ("fused", "sm90", "=128", True, 2): Tiles(64, 128, 4, 2, heavy_first=True, gluon=True, mask_tma=True,
                                              persistent=True, o_tma=True),
    ("fused", "sm90", "=64", False, 2): Tiles(64, 128, 4, 2, gluon=True, mask_tma=True, persistent=True, o_tma=True),
    ("fused", "sm90", "=64", True, 2): Tiles(64, 128, 4, 2, heavy_first=True, gluon=True, mask_tma=True,
                                             persistent=True, o_tma=True),
    ("fused", "sm90", 64, False, 2): Tiles(128, 64, 8, 3),
    ("fused", "sm90", 64, True, 2): Tiles(128, 64, 8, 3),
    ("fused", "sm90", 128, False, 2): Tiles(128, 64, 8, 3, paired=True),
    ("fused", "sm90", 128, True, 2): Tiles(64, 64, 4, 3, heavy_first=True),
    ("fused", "sm90", 256, "any", 2): Tiles(64, 32, 4, 2),
    # qk_softmax at D = 64 and 128 exactly, any N (v54; N % 8 == 0 before): the warp-specialised Gluon kernel with P
    # stored by TMA (v12: 1.05–1.41× the Triton kernel's build time at N = 1024…16384, except D = 64 causal
    # N = 1024, 0.985×; 3 stages 4–13 % faster than 2). Other D and N keep the Triton entries below.
    # D = 64 causal: one consumer a program, two programs an SM (v27; session 12's autotune, `outputs/h200/
    # 2026-11-30-s12-call3`: the build at N = 1024 / 2048 / 8192 0.5994 / 1.0724 / 3.9198 ms against two consumers'
    # 0.7076 / 1.1329 / 3.9047).
    # D = 64 non-causal: persistent since session 22's autotune (`outputs/h200/2026-12-01-s22-call2`, N = 512, 1024,
    # 2048, 8192): 0.8717 / 1.6280 / 6.2386 ms at N = 1024 / 2048 / 8192 against one item a program's
    # 0.8941 / 1.6626 / 6.3937.
    # D = 64 non-causal and D = 128 causal: pass 1 against a fixed reference (v31) with Q as the register operand
    # (v17) since session 24 (v42, `-s24-call1`/`-call2`, three rounds against the entry before, P kernel at
    # N = 2048 / 4096 / 8192 / 16384, medians: D = 64 non-causal −1.6 / −2.2 / −1.3 / −0.7 %; D = 128 causal, two
    # rounds, −1.4 to −2.9 % at every N). At D = 128 non-causal f alone tied at 2048 (+0.3 %), so that entry stays.
    # The build with the bench's timer, both tables in one process (session 25, `-s25-call3`): −1.4 to −2.8 % at
    # D = 64 non-causal; a tie at D = 128 causal (−0.4 to +0.1 %).
    ("qk_softmax", "sm90", "=64", False, 2): Tiles(64, 128, 4, 3, gluon=True, q_registers=True, persistent=True,
                                                   fixed_reference=True),
    ("qk_softmax", "sm90", "=64", True, 2): Tiles(64, 128, 4, 3, heavy_first=True, gluon=True, one_consumer=True),
    ("qk_softmax", "sm90", "=128", False, 2): Tiles(64, 128, 4, 3, gluon=True),
    ("qk_softmax", "sm90", "=128", True, 2): Tiles(64, 128, 4, 3, heavy_first=True, gluon=True, q_registers=True,
                                                   fixed_reference=True),
    ("qk_softmax", "sm90", 64, False, 2): Tiles(128, 64, 8, 3),
    ("qk_softmax", "sm90", 128, False, 2): Tiles(128, 64, 4, 3),
    ("qk_softmax", "sm90", "any", True, 2): Tiles(64, 64, 4, 3),
    # pv at D = 128 exactly, non-causal: the persistent Gluon kernel (v32b). Session 16's autotune of pv (`outputs/
    # h200/2026-12-01-s16-call8`, the PV kernel under qk_softmax-no_softmax, N = 512 … 16384, bf16), scored with the
    # Triton entries below as incumbents: 128×64 s4 scores 1.012 against 128×64 w8 s3's 1.022 (5.107 against 5.198
    # ms at N = 16384); at D = 64 and under a causal mask the Gluon candidates came within TIE of the Triton entries
    # (or behind), which stay. SHORT keeps the Triton kernel below N = 724.
    # Since v52 (session 28) as Oᵀ = Vᵀ Pᵀ (v47), at D = 128 non-causal and, heavy rows first, under a causal mask at
    # D = 64 and 128: the PV kernel alone and the qk_softmax build both below the entry before (the one above, or
    # the Triton entry under a causal mask) in their medians over three rounds at every N from the entry's bound up
    # (`-s28-call1` … `-call5`; N = 1024 … 16384 non-causal, 2048 … 16384 causal). The build:
    # non-causal −4.1 / −3.8 / −1.5 / −0.8 / −0.0 % at N = 1024 / 2048 / 4096 / 8192 / 16384; D = 128 causal
    # −0.7 / −2.1 / −2.6 % from 4096; D = 64 causal −1.5 / −2.1 % from 8192 (a tie at 4096, its PV kernel 3.8 %
    # slower). SHORT keeps the Triton kernel below those bounds under a causal mask.
    ("pv", "sm90", "=128", False, 2): Tiles(128, 64, 4, 4, gluon=True, persistent=True, o_transposed=True),
    ("pv", "sm90", "=128", True, 2): Tiles(128, 64, 4, 4, heavy_first=True, gluon=True, persistent=True,
                                           o_transposed=True),
    ("pv", "sm90", "=64", True, 2): Tiles(128, 64, 4, 4, heavy_first=True, gluon=True, persistent=True,
                                          o_transposed=True),
    # pv at D = 64 exactly, non-causal: the persistent Gluon kernel as Oᵀ = Vᵀ Pᵀ (v47, v48), which beat the Triton
    # entry below in the qk_softmax build's median over three rounds at every N timed (`-s26-call5`, `-s26-call6`,
    # `-s27-call1`, N = 2048 … 16384: medians −0.6, −0.6, −1.7, −2.1 %; the bench's timer, `-s27-call4`, −1.0 to
    # −1.3 %); SHORT keeps the Triton kernel below 2048 (a tie at 512 and 1024, `-s27-call2`).
    ("pv", "sm90", "=64", False, 2): Tiles(128, 64, 4, 4, gluon=True, persistent=True, o_transposed=True),
    # pv at D = 64 causal: 64×64 w4 s3, 1–2 % faster than 128×64 w8 at every N of session 8's sweep (call 4: score
    # 1.002 against 1.014); elsewhere 128×64 w8 s3 within the sweep's noise of the best.
    ("pv", "sm90", 64, True, 2): Tiles(64, 64, 4, 3),
    ("pv", "sm90", "any", "any", 2): Tiles(128, 64, 8, 3),
    ("scores", "any", "any", "any", 2): Tiles(128, 128, 8, 3),
    ("pv", "any", "any", "any", 2): Tiles(128, 64, 4, 3),
    # Fallback for other GPUs, fp32 and D = 256: small tiles that fit any sm80+ part's shared memory.
    ("fused", "any", "any", "any", "any"): Tiles(64, 32, 4, 2),
    ("qk_softmax", "any", "any", "any", "any"): Tiles(64, 32, 4, 2),
    ("scores", "any", "any", "any", "any"): Tiles(64, 64, 4, 2),
    ("pv", "any", "any", "any", "any"): Tiles(64, 32, 4, 2),
}


# Short sequences: where the autotune sweep found a configuration that beats the key's TABLE entry by more than its
# SHORT_GAIN at each of the sweep's smallest N (attnlab.autotune), an entry here, keyed as TABLE is, replaces it below
# an N of its own: (tiles, below). `below` is the geometric middle of the last N it won at and the next N of the sweep.
# TABLE's entries are chosen at N ≥ SHORT_N (the sweep's N from 1024 on); an autotune file's short entry without a
# bound of its own (written before bounds were) serves below SHORT_N.
# Session 11's autotune (`outputs/h200/2026-11-30-s11-call2`, fused, N = 512, 1024, 2048, 8192, bf16): one consumer a
# program, two programs an SM (v23), persistent in pair order (v24) wins at the small N. D = 128: 64×64 s2 at 512
# (0.1102 against the TABLE entry's 0.1359 ms) and ties at 1024 (0.1755 / 0.1758), so below 724; D = 64: 64×128 s2 at
# 512 (0.1476 / 0.2001) and 1024 (0.2248 / 0.2455), 1 % at 2048 (0.3806 / 0.3847), so below 1448.
# Session 12's (`-s12-call3`, qk_softmax, N = 1024, 2048, 8192): at D = 128 causal one consumer a program wins at 1024
# (0.3896 against 0.4279 ms), 1 % at 2048 and loses 3 % at 8192, so below 1448.
# Session 13's (`-s13-call3`, qk_softmax, N = 512, 1024, 2048, 8192, with the persistent kernel of v28 and the Gluon
# kernel from N = 512): persistent wins at the short N. D = 64 non-causal two consumers persistent at 512 (0.4856
# against 0.5378 ms), 3.6 % at 1024, so below 724; D = 64 causal one consumer persistent at 512 (0.3484 against
# 0.3763), below 724; D = 128 causal one consumer persistent, 2 stages, at 512 (0.2355 against 0.3012) and 1024
# (0.3874 against 0.4247), below 1448. A masked call runs these persistent only with its mask by TMA
# (qk_softmax_gluon.as_run, v30; launch._qk_softmax_tiles).
# Session 16's autotune of pv (`-s16-call8`): under the Gluon PV entry (D = 128 non-causal) the Triton kernel below
# 724 (0.2448 ms at N = 512 against 0.2613). Under v48's (D = 64 non-causal) the Triton kernel below 2048, the
# shortest N its three rounds timed. Under v52's causal entries the Triton entries below the N they start at (4096 at
# D = 128, 8192 at D = 64).
# Session 22's (`-s22-call2`, qk_softmax, N = 512, 1024, 2048, 8192, with v40's one-pass kernel among the candidates,
# which compete for short entries only: attnlab.autotune.pick): one pass with the row on chip wins at 512 and 1024
# everywhere but D = 64 causal, so below 1025 (qk_softmax_row.ROW_MAX + 1; past it the entry would run the two-pass
# kernel). D = 64 non-causal 64×128 s4 (0.4252 / 0.8186 ms against the table entry's 0.4848 / 0.8717); D = 128
# non-causal 64×128 s2 (0.2873 / 0.5232 against 0.3287 / 0.5698; 4 stages do not fit a 1024-key row at D = 128);
# D = 128 causal 64×128 s2 in launch order (0.2255 / 0.3575 against 0.2990 / 0.4227), which replaced session 13's one
# consumer below 1448. A masked call runs the two-pass kernel (qk_softmax_gluon.as_run), and its row says so.
SHORT_N = 1024
SHORT: dict[tuple, tuple[Tiles, int]] = {
    ("pv", "sm90", 128, False, 2): (Tiles(128, 64, 8, 3), 724),
    ("pv", "sm90", 64, False, 2): (Tiles(128, 64, 8, 3), 2048),
    ("pv", "sm90", 128, True, 2): (Tiles(128, 64, 8, 3), 4096),
    ("pv", "sm90", 64, True, 2): (Tiles(64, 64, 4, 3), 8192),
    ("fused", "sm90", "=128", True, 2): (Tiles(64, 64, 4, 2, heavy_first=True, gluon=True, mask_tma=True,
                                               persistent=True, o_tma=True, one_consumer=True), 724),
    ("fused", "sm90", "=64", True, 2): (Tiles(64, 128, 4, 2, heavy_first=True, gluon=True, mask_tma=True,
                                              persistent=True, o_tma=True, one_consumer=True), 1448),
    ("qk_softmax", "sm90", "=64", False, 2): (Tiles(64, 128, 4, 4, gluon=True, one_pass=True), 1025),
    ("qk_softmax", "sm90", "=128", False, 2): (Tiles(64, 128, 4, 2, gluon=True, one_pass=True), 1025),
    ("qk_softmax", "sm90", "=64", True, 2): (Tiles(64, 128, 4, 3, heavy_first=True, gluon=True, persistent=True,
                                                 one_consumer=True), 724),
    ("qk_softmax", "sm90", "=128", True, 2): (Tiles(64, 128, 4, 2, gluon=True, one_pass=True), 1025),
}


def head_dim_bucket(D: int) -> int:
    """The padded head dim a kernel is compiled for: a power of two, at least 16 (tl.dot's smallest K)."""
    return max(16, 1 << (D - 1).bit_length())


def tiles(kernel: str, device: torch.device, D: int, causal: bool, dtype: torch.dtype, gluon: bool = True,
          N: int | None = None) -> Tiles:
    return lookup(kernel, family(device), D, causal, dtype.itemsize, gluon, N)


def lookup(kernel: str, fam: str, D: int, causal: bool, itemsize: int, gluon: bool = True,
           N: int | None = None) -> Tiles:
    """The first entry matching (kernel, GPU family, D's bucket, causal, dtype size): in SHORT when N is below the
    entry's bound, then in TABLE. 'any' matches all, and a head-dim entry "=128" matches D = 128 only (the Gluon
    kernel's TMA boxes are exactly D wide: no padding). Gluon entries count only under a Triton the kernel was checked
    on (gluon_verified), and not at all with gluon=False. N = None: the TABLE entry (what serves every N without a
    SHORT entry)."""
    key = (kernel, fam, head_dim_bucket(D), causal, itemsize)
    short = [(entry, t) for entry, (t, below) in SHORT.items() if N is not None and N < below]
    for table in (short, TABLE.items()):
        for entry, t in table:
            if t.gluon and not (gluon and gluon_verified()):
                continue
            if all(e == "any" or e == k or (i == 2 and e == f"={D}") for i, (e, k) in enumerate(zip(entry, key))):
                return t
    raise LookupError(f"no tile configuration for {key}")  # unreachable: the table ends in catch-alls


GLUON_TRITON = ("3.6.",)  # Triton releases the Gluon kernel was checked on (Gluon is experimental: its API moves)


def gluon_verified() -> bool:
    """Whether this Triton is one the Gluon kernel was checked on; with any other, its table entries are skipped and
    the Triton kernel runs (rows record which: `"gluon"` in their tiles)."""
    import triton

    return triton.__version__.startswith(GLUON_TRITON)


def recorded_tiles(tiles_json) -> dict:
    """A result row's recorded tiles (the JSON of attnlab.triton.launch.tile_config) as {kernel: tiles dict}; {} where
    the row records none (a library build, an older run)."""
    import json

    try:
        recorded = json.loads(tiles_json)
    except (TypeError, ValueError):
        return {}
    return {k: t for k, t in recorded.items() if isinstance(t, dict)} if isinstance(recorded, dict) else {}


def kernel_label(tiles_json, kernel: str | None = "fused") -> str:
    """'gluon' or 'triton': which kernel of that name ran (fused, or qk_softmax's P kernel), from a result row's
    recorded tiles (recorded_tiles); with kernel=None, 'gluon' when any of the row's kernels is a Gluon one. '' when
    the row records no such tiles."""
    recorded = recorded_tiles(tiles_json)
    picked = list(recorded.values()) if kernel is None else [recorded[kernel]] if kernel in recorded else []
    if not picked:
        return ""
    return "gluon" if any(t.get("gluon") for t in picked) else "triton"


@contextmanager
def forced(kernel: str, t: Tiles):
    """Use `t` for `kernel` everywhere inside the block, at every N (the autotune sweep's way to try a candidate)."""
    global TABLE, SHORT
    saved, saved_short = TABLE, SHORT
    key = (kernel, "any", "any", "any", "any")
    # The forced entry goes first and replaces the catch-all of the same key (a dict merge would keep the old value).
    TABLE = {key: t, **{k: v for k, v in saved.items() if k != key}}
    SHORT = {k: v for k, v in saved_short.items() if k[0] != kernel}
    try:
        yield
    finally:
        TABLE, SHORT = saved, saved_short


def load_overrides(path: str) -> None:
    """Put the entries of an autotune result file (JSON list written by `attnlab bench --autotune --out`) in front
    of the tables, for a benchmark run that tests them before they are written into TABLE and SHORT by hand. An
    entry with `"short": true` goes to SHORT (below its `"below"`, else SHORT_N), and SHORT's entries for the
    kernels the file tunes (same family and dtype size) go: where the file has no short entry, the sweep found none
    worth one."""
    import json

    global TABLE, SHORT
    with open(path) as f:
        entries = json.load(f)

    def key(e):
        return e["kernel"], e["family"], e["D"], e["causal"], e["itemsize"]

    front = {key(e): Tiles(**e["tiles"]) for e in entries if not e.get("short")}
    short = {key(e): (Tiles(**e["tiles"]), e.get("below", SHORT_N)) for e in entries if e.get("short")}
    tuned = {(e["kernel"], e["family"], e["itemsize"]) for e in entries}
    TABLE = {**front, **{k: v for k, v in TABLE.items() if k not in front}}
    SHORT = {**short, **{k: v for k, v in SHORT.items() if (k[0], k[1], k[4]) not in tuned}}
