"""What our kernels ask of a Hopper SM, found without a GPU: compile for sm_90a and read ptxas's report.

    python -m attnlab.triton.resources [--kernels fused,qk_softmax,pv] [--head-dims 64,128] [--tiles 128x64w8s3,...]

Kernels: fused, qk_softmax, pv, scores (the forward's), fused_dkdv and fused_dq (the fused backward's).

Triton compiles for any target on any machine (its wheel carries ptxas), so shared memory, registers, stack and
spills of a tile configuration can be read before device time is spent on it: a candidate over the SM's 227 KiB of
shared memory per block fails to launch (fused 128×128 w8 s3 at D = 128 with a mask tile did, on the H200), and one
that spills registers is slow. The compile is specialised the way Triton's JIT specialises a real call at the
benchmark's shapes (`_int_args`: pointers and strides that are multiples of 16 marked so, ints equal to 1 — GROUP,
the unit stride of a broadcast mask — made constants), without which it would report a different kernel.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import replace

import torch
import triton
from triton.backends.compiler import GPUTarget

from attnlab import environment
from attnlab.triton import config
from attnlab.triton.hopper.common import smem_limit

FLOATS = ("qk_scale", "mask_scale", "inv_n", "scale")
POINTERS = re.compile(r"^(Q|K|V|O|M|P|S|DO|DQ|DK|DV)$")
FP32_POINTERS = ("LSE", "DELTA")  # the fused backward's row statistics
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}  # compile_info's dtype names
# pointers a launch passes only under a flag, else None: the repair's row flags (qk_softmax, REPAIR), each row's
# logsumexp (fused, STORE_LSE: the training forward)
OPTIONAL_POINTERS = {"FLAGS": ("REPAIR", "*i8"), "LSE": ("STORE_LSE", "*fp32")}


def _kernel(name: str):
    from attnlab.triton import fused, fused_backward, materialised, pv, qk_softmax

    return {"fused": fused.fused_kernel, "qk_softmax": qk_softmax.qk_softmax_kernel, "pv": pv.pv_kernel,
            "scores": materialised.scores_kernel, "fused_dkdv": fused_backward.dkdv_kernel,
            "fused_dq": fused_backward.dq_kernel}[name]


def compile_info(kernel: str, D: int, causal: bool, tiles: config.Tiles, mask_kind: int = 0,
                 dtype: str = "bf16", n: int = 4096, **flags) -> dict:
    """Shared memory, registers, stack and spill bytes of one kernel configuration compiled for sm_90a. `flags`
    set other constexprs (e.g. NO_PV=True for the ablation)."""
    if kernel in ("fused", "qk_softmax", "pv") and tiles.gluon:
        return _gluon_info(kernel, D, causal, tiles, mask_kind, dtype, n, **flags)
    # the launcher's rules: the compile is the one a call makes (on scores_buffer's rows, which have room to pad)
    from attnlab.triton.layout import line_row, ragged_rows, rows_16b
    from attnlab.triton.plan import REPAIR_SPAN

    fn = _kernel(kernel)
    if not isinstance(fn, triton.runtime.jit.JITFunction):
        raise RuntimeError("our kernels were loaded for Triton's interpreter: compile them in a process started with "
                           "TRITON_INTERPRET=0 (python -m attnlab.triton.resources does that itself)")
    constexpr_names = [fn.arg_names[i] for i in fn.constexprs]
    values = dict(D=D, BLOCK_D=config.head_dim_bucket(D), BLOCK_M=tiles.BLOCK_M, BLOCK_N=tiles.BLOCK_N,
                  CAUSAL=causal, MASK_KIND=mask_kind, NO_SOFTMAX=False, NO_PV=False, IEEE=dtype == "fp32",
                  UPCAST=False, HEAVY_FIRST=tiles.heavy_first, PAIRED=tiles.paired,
                  STAGES=tiles.num_stages, ONE_TILE=n <= tiles.BLOCK_N, REPAIR=False, REPAIR_SPAN=REPAIR_SPAN,
                  STORE_LSE=False,
                  ROWS_16B=rows_16b(n, DTYPES[dtype]), ROWS_PAD=ragged_rows(n, DTYPES[dtype].itemsize))
    values.update(flags)
    constexprs = {n: values[n] for n in constexpr_names}
    ints = _int_args(D, mask_kind, N=n)
    ints["spn"] = ints["ssn"] = line_row(n, DTYPES[dtype].itemsize)  # S's and P's rows (layout.scores_buffer)
    sig, div16 = {}, []
    for a in fn.arg_names:
        if a in constexprs:
            sig[a] = "constexpr"
        elif a in OPTIONAL_POINTERS and OPTIONAL_POINTERS[a][0] in constexpr_names:
            flag, pointer = OPTIONAL_POINTERS[a]
            if values.get(flag):
                sig[a] = pointer
            else:
                sig[a], constexprs[a] = "constexpr", None
        elif POINTERS.match(a):
            sig[a] = "*u8" if (a == "M" and mask_kind == 1) else f"*{dtype}"
            div16.append(a)  # the caching allocator aligns every tensor to far more than 16 bytes
        elif a in FP32_POINTERS:
            sig[a] = "*fp32"
            div16.append(a)
        elif a in FLOATS:
            sig[a] = "fp32"
        elif _becomes_constant(fn, a, ints[a]):
            sig[a], constexprs[a] = "constexpr", 1
        else:
            sig[a] = "i32"
            if ints[a] % 16 == 0:
                div16.append(a)
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in div16}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": tiles.num_warps, "num_stages": tiles.num_stages})
    return _report(k, kernel, D, causal, mask_kind, tiles)


def _becomes_constant(fn, name: str, value: int) -> bool:
    """Triton's JIT turns an int argument equal to 1 into a constant, unless the kernel lists it in
    do_not_specialize (the Gluon kernel's N)."""
    return value == 1 and not next(p for p in fn.params if p.name == name).do_not_specialize


def _report(k, kernel, D, causal, mask_kind, tiles) -> dict:
    """Run ptxas -v on a compiled kernel's PTX for sm_90a and read its report."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(k.asm["ptx"])
        r = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", path, "-o", os.devnull],
                           capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ptxas failed: {r.stderr.strip()[:300]}")
    return dict(kernel=kernel, D=D, causal=causal, mask_kind=mask_kind, tiles=label(tiles),
                smem_kib=k.metadata.shared / 1024, fits=k.metadata.shared <= smem_limit(tiles), **read_ptxas(r.stderr),
                unfenced_releases=unfenced_releases(k.asm["ptx"]))


GENERIC_READ = re.compile(r"^(@!?%p\d+\s+)?(ldmatrix|ld\.shared\.v)")


def unfenced_releases(ptx: str) -> int:
    """How many mbarrier arrivals (the producer's expect_tx ones aside) follow generic-proxy reads of shared memory
    (ldmatrix, vector ld.shared) with no fence.proxy.async between, in the PTX's order: a consumer releasing a slot
    that the loader's next TMA write (the async proxy) may overwrite before those reads are ordered with it. Without
    the fence the Gluon PV kernel's no_pv form came out wrong in 7-14 of 30-40 runs on the H200. Reads of memory no
    TMA writes count too, so a non-zero count is a place to look, not a proof of a race."""
    count, pending = 0, False
    for line in ptx.splitlines():
        t = line.strip()
        if GENERIC_READ.match(t):
            pending = True
        elif "fence.proxy.async" in t:
            pending = False
        elif "mbarrier.arrive" in t and "expect_tx" not in t:
            count += pending
            pending = False
    return count


def _gluon_info(kernel: str, D: int, causal: bool, tiles: config.Tiles, mask_kind: int, dtype: str, n: int,
                **flags) -> dict:
    """compile_info for a Gluon kernel (fused, qk_softmax or pv): its descriptors typed as the launcher makes them for
    contiguous (B, H, N, D) tensors at sequence length n, the mask's int strides specialised as _int_args does."""
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from attnlab.triton.hopper import common, qk_softmax_row
    from attnlab.triton.hopper import fused as fused_gluon
    from attnlab.triton.hopper import pv as pv_gluon
    from attnlab.triton.hopper import qk_softmax as qk_softmax_gluon
    from attnlab.triton.layout import mask_layout

    tdtype = DTYPES[dtype]
    ints = _int_args(D, mask_kind, N=n)
    x = torch.empty(1, ints["H"], ints["N"], D, dtype=tdtype)  # strides only: the descriptor type ignores sizes of B
    sig, constexprs = {}, {}
    m = None  # with a mask: an (N, N) one broadcast over batch and heads, as the zero_mask ablation passes
    if mask_kind:
        m = torch.empty(ints["N"], ints["N"], dtype=torch.uint8 if mask_kind == 1 else tdtype).expand(
            1, ints["H"], ints["N"], ints["N"])
    layout = mask_layout(m, mask_kind)
    if kernel != "pv":
        sig["M"] = "*u8" if mask_kind == 1 else f"*{dtype}"
    flags = dict(flags)
    no_softmax, no_pv = bool(flags.pop("NO_SOFTMAX", False)), bool(flags.pop("NO_PV", False))
    # each kernel's constexprs come from its own module's `constexprs`, the function its plan calls
    if kernel == "pv":
        fn = pv_gluon.pv_gluon_kernel
        p = torch.empty(1, ints["H"], ints["N"], ints["N"], dtype=tdtype)
        sig["p_desc"] = mangle_type(common.descriptor(p, tiles.BLOCK_M, tiles.BLOCK_N))
        sig["v_desc"] = mangle_type(common.descriptor(x, tiles.BLOCK_N))
        sig["o_ptr"] = f"*{dtype}"
        values = pv_gluon.constexprs(tiles, D=D, causal=causal, no_pv=no_pv)
        floats = ("inv_n",)
    elif kernel == "qk_softmax" and tiles.one_pass:  # one pass, the row on chip: compiled for rows of min(n, ROW_MAX)
        fn = qk_softmax_row.qk_softmax_row_kernel
        sig["q_desc"] = mangle_type(common.descriptor(x, tiles.BLOCK_M))
        sig["k_desc"] = mangle_type(common.descriptor(x, tiles.BLOCK_N))
        p = torch.empty(1, ints["H"], ints["N"], ints["N"], dtype=tdtype)
        sig["p_desc"] = mangle_type(common.descriptor(p, tiles.BLOCK_M, tiles.BLOCK_N))
        sig["M"] = f"*{dtype}"  # the launcher passes P: items carry a mask pointer the kernel never reads
        values = qk_softmax_row.constexprs(tiles, D=D, N=min(n, qk_softmax_row.ROW_MAX), itemsize=tdtype.itemsize,
                                           causal=causal, no_softmax=no_softmax)
        floats = ("qk_scale",)
    elif kernel == "qk_softmax":
        fn = qk_softmax_gluon.qk_softmax_gluon_kernel
        sig["q_desc"] = mangle_type(common.descriptor(x, tiles.BLOCK_M))
        sig["k_desc"] = mangle_type(common.descriptor(x, tiles.BLOCK_N))
        p = torch.empty(1, ints["H"], ints["N"], ints["N"], dtype=tdtype)
        sig["p_desc"] = mangle_type(common.descriptor(p, tiles.BLOCK_M, tiles.BLOCK_N))
        values = qk_softmax_gluon.constexprs(tiles, D=D, causal=causal, mask=layout, no_softmax=no_softmax)
        sig["mask_desc"] = mangle_type(common.mask_descriptor(m, common.mask_rows(tiles), tiles.BLOCK_N)[0]) if (
            values["MASK_TMA"]) else sig["q_desc"]  # with Tiles.mask_tma the mask comes by TMA
        sig["flags"] = "*i8" if values["REF1"] else f"*{dtype}"  # else the placeholder the launcher passes: P
        floats = ("qk_scale", "mask_scale")
    else:
        fn = fused_gluon.fused_gluon_kernel
        for a, rows in (("q_desc", tiles.BLOCK_M), ("k_desc", tiles.BLOCK_N), ("v_desc", tiles.BLOCK_N),
                        ("o_desc", tiles.BLOCK_M)):
            sig[a] = mangle_type(common.descriptor(x, rows))
        sig["o_ptr"] = f"*{dtype}"
        run_as = replace(tiles, mask_tma=bool(flags.pop("MASK_TMA", tiles.mask_tma)))
        values = fused_gluon.constexprs(run_as, D=D, causal=causal, mask=layout,
                                        o_tma=fused_gluon.o_tma(run_as, layout, D, tdtype.itemsize),
                                        no_softmax=no_softmax, no_pv=no_pv)
        sig["mask_desc"] = mangle_type(common.mask_descriptor(m, common.mask_rows(run_as), run_as.BLOCK_N)[0]) if (
            values["MASK_TMA"]) else sig["q_desc"]  # else the placeholder the launcher passes
        floats = ("qk_scale", "mask_scale", "inv_n")
    ints_named = ("sob", "soh", "son", "N", "H", "GROUP") if kernel == "pv" else ("N", "H", "GROUP") if (
        fn is qk_softmax_row.qk_softmax_row_kernel) else (
        ("smb", "smh", "smm", "smn", "N", "H", "GROUP") + (("sob", "soh", "son") if kernel == "fused" else ()))
    sig["total"] = "i32"
    for a in ints_named:
        if _becomes_constant(fn, a, ints[a]):
            sig[a], constexprs[a] = "constexpr", 1
        else:
            sig[a] = "i32"
    for a in floats:
        sig[a] = "fp32"
    values.update(flags, num_warps=4)
    for a, val in values.items():
        sig[a], constexprs[a] = "constexpr", val
    src = GluonASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs={})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4, "maxnreg": common.partitions(tiles)[1]})
    return _report(k, kernel, D, causal, mask_kind, tiles)


def read_ptxas(report: str) -> dict:
    """Registers, stack and spills from `ptxas -v`, and whether ptxas serialised the wgmma instructions (its C7515
    or C7514 advisory: every matmul then waits for itself before anything else runs. C7515 cost the causal paired
    kernel 7–14 % on the H200; C7514 — a register of an in-flight matmul read, e.g. copied on a loop's back edge —
    held the first qk_softmax Gluon kernel to the Triton kernel's speed)."""
    def grab(pattern):
        m = re.search(pattern, report)
        return int(m.group(1)) if m else 0

    return dict(registers=grab(r"Used (\d+) registers"), stack_bytes=grab(r"(\d+) bytes (?:cumulative )?stack"),
                spill_stores=grab(r"(\d+) bytes spill stores"), spill_loads=grab(r"(\d+) bytes spill loads"),
                wgmma_serialised=bool(re.search(r"\(C751[45]\)", report)))


def _int_args(D: int, mask_kind: int, N: int = 4096, width: int = 2048) -> dict:
    """The int arguments a launch passes at the benchmark's shape (H·D = width, N = 4096; the batch count appears
    in none of them): the strides of contiguous (B, H, N, D) q, k, v, o and of an (N, N) mask broadcast to
    (B, H, N, N), whose values decide how Triton specialises the compile (1 → constant, multiple of 16 → aligned)."""
    H = width // D
    out = dict(N=N, H=H, HKV=H, GROUP=1)
    for t in ("q", "k", "v", "o", "do", "dq", "dk", "dv"):
        out.update({f"s{t}b": H * N * D, f"s{t}h": N * D, f"s{t}n": D})
    out.update(dict(zip(("smb", "smh", "smm", "smn"), (0, 0, N, 1) if mask_kind else (0, 0, 0, 0))))
    return out


LABEL_FLAGS = config.LABEL_FLAGS


def label(t: config.Tiles) -> str:
    return t.label


def parse_tiles(text: str) -> config.Tiles:
    """'128x64w8s3' with LABEL_FLAGS' letters appended in their order (e.g. 'h' for heavy-first, 'g' for the Gluon
    kernel) → Tiles; ValueError naming the expected form otherwise."""
    m = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)" + "".join(f"({letter}?)" for letter, _, _ in LABEL_FLAGS),
                     text.strip())
    if not m:
        raise ValueError("--tiles entries look like 128x64w8s3 (BLOCK_M x BLOCK_N, warps, stages; then "
                         + ", ".join(f"{letter} for {what}" for letter, _, what in LABEL_FLAGS) + f"), got {text!r}")
    return config.Tiles(int(m[1]), int(m[2]), int(m[3]), int(m[4]),
                        **{field: bool(m[5 + i]) for i, (_, field, _) in enumerate(LABEL_FLAGS)})


def _rules_tiles(kernel: str, D: int, causal: bool, n: int, flags: dict) -> config.Tiles:
    """The tiles the rules (attnlab.triton.plan) give `kernel` on an sm90 GPU (H100, H200) in bf16: for the fused
    kernel under STORE_LSE, the training forward's (the Triton kernel's: plan.plan_fused_train)."""
    from attnlab.triton import plan

    if kernel.startswith("fused_"):
        return plan.fused_backward_tiles(kernel.removeprefix("fused_"), "sm90", D, 2)
    return plan.lookup(kernel, "sm90", D, causal, 2, gluon=not flags.get("STORE_LSE"), N=n)


def main(argv=None) -> int:
    from attnlab import args as cli

    ap = cli.Parser(prog="python -m attnlab.triton.resources", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", default="fused,qk_softmax,pv")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--tiles", default=None, help="comma-separated, e.g. 128x64w8s3,128x128w8s3 (default: the "
                                                  "rules' sm90 tiles for each case, attnlab.triton.plan)")
    ap.add_argument("--causal", default="0,1", help="0, 1 or 0,1")
    ap.add_argument("--masks", default="0,2", help="mask kinds: 0 none, 1 boolean, 2 additive (pv has none)")
    ap.add_argument("--flags", default=None, help="other constexprs, e.g. NO_PV=1 (the ablation)")
    ap.add_argument("--n", type=cli.positive_int, default=4096, help="sequence length the compile is specialised for (and, without "
                    "--tiles, the rules' tiles for it)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # --help (0) and usage errors (2), as a return code
        return int(e.code or 0)
    try:
        cands = [parse_tiles(t) for t in args.tiles.split(",")] if args.tiles else None
    except ValueError as e:
        print(f"attnlab resources: error: {e}", file=sys.stderr)
        return 2
    try:
        flags = {k: bool(int(v)) for k, v in (f.split("=") for f in args.flags.split(","))} if args.flags else {}
    except ValueError:
        print(f"attnlab resources: error: --flags looks like NO_PV=1,NO_SOFTMAX=0, got {args.flags!r}",
              file=sys.stderr)
        return 2
    if not isinstance(_kernel("fused"), triton.runtime.jit.JITFunction):  # loaded for the interpreter: restart
        if environment.setting("ATTNLAB_RESOURCES_CHILD"):
            print("attnlab resources: error: kernels still load for the interpreter with TRITON_INTERPRET=0",
                  file=sys.stderr)
            return 1
        env = environment.child(TRITON_INTERPRET="0", ATTNLAB_RESOURCES_CHILD="1")
        return subprocess.run([sys.executable, "-m", "attnlab.triton.resources", *argv], env=env).returncode
    rows = []
    for kernel in args.kernels.split(","):
        for D in (int(d) for d in args.head_dims.split(",")):
            for causal in (bool(int(c)) for c in args.causal.split(",")):
                for mask_kind in ((int(m) for m in args.masks.split(",")) if kernel != "pv" else (0,)):
                    for t in cands or [_rules_tiles(kernel, D, causal, args.n, flags)]:
                        rows.append({**compile_info(kernel, D, causal, t, mask_kind, n=args.n, **flags), **flags})
    if args.json:
        print(json.dumps(rows))
        return 0
    import pandas as pd

    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.0f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
