"""Launchers for our three builds: check the inputs, allocate the outputs, launch. One function per build.

Every launcher has the build signature `(q, k, v, *, causal=False, attn_mask=None, scale=None) -> o` plus the
keywords `ablation` (None, "no_softmax" or "no_pv"; "zero_mask" is a mask the caller passes, not a kernel flag) and
`out` (write O there instead of a fresh tensor).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton

from attnlab.triton import dispatch
from attnlab.triton import fused as _fused
from attnlab.triton import materialised as _mat
from attnlab.triton import pv as _pv_mod
from attnlab.triton import qk_softmax as _qks
from attnlab.triton.config import (GLUON_ONLY, LOG2E, Tiles, head_dim_bucket, interpreting, tiles,
                                   unsupported_reason)
from attnlab.model import SOFTMAX_ROW_MAX
from attnlab.triton.layout import row_stride, rows_16b, rows_pad, scores_buffer, vector_end
from attnlab.validate import Spec, check, mask_4d

KERNEL_ABLATIONS = (None, "no_softmax", "no_pv")
MAX_GRID_YZ = 65535  # CUDA's limit on a grid's second and third axes, where our kernels put B·H


class Unsupported(RuntimeError):
    """This build cannot run this case here (device, dtype, shape); the message says why. Never a fallback."""


@dataclass(frozen=True)
class _Call:
    """The checked arguments of one call, in the form every kernel takes them."""

    spec: Spec
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor  # (B, H, N, N) view, or q as a never-read placeholder when there is no mask
    mask_strides: tuple
    mask_kind: int  # 0 none, 1 boolean (True = attend), 2 additive
    flags: dict  # the constexprs every kernel shares


def _prepare(q, k, v, causal, attn_mask, scale, ablation) -> _Call:
    spec = check(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale)
    if ablation not in KERNEL_ABLATIONS:
        raise ValueError(f"ablation must be one of {KERNEL_ABLATIONS}, got {ablation!r}")
    why = unsupported_reason(spec.device)
    if why:
        raise Unsupported(why)
    if spec.B * spec.H > MAX_GRID_YZ:
        raise Unsupported(f"B·H = {spec.B * spec.H} exceeds {MAX_GRID_YZ}, the CUDA grid-axis limit our kernels put "
                          "batch × heads on; split the batch")
    # Kernels index the last dim with unit stride; other strides are passed through.
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if attn_mask is None:
        mask, strides, kind = q, (0, 0, 0, 0), 0
    else:
        mask = mask_4d(attn_mask, spec)
        if mask.dtype == torch.bool:
            mask, kind = mask.view(torch.uint8), 1
        else:
            kind = 2
        strides = mask.stride()
    flags = dict(D=spec.D, BLOCK_D=head_dim_bucket(spec.D), CAUSAL=causal,
                 IEEE=spec.dtype == torch.float32, UPCAST=interpreting())
    return _Call(spec, q, k, v, mask, strides, kind, flags)


def _grid_m(spec: Spec, block_m: int):
    return (triton.cdiv(spec.N, block_m), spec.B * spec.H)


def _lookup(kernel: str, spec: Spec, gluon: bool = True) -> Tiles:
    """The table's tiles for this case (config.tiles: by D, causal, dtype, and N and B·H where a short-N entry
    exists)."""
    return tiles(kernel, spec.device, spec.D, spec.causal, spec.dtype, gluon, N=spec.N, heads=spec.B * spec.H)


def _tiles(kernel: str, spec: Spec) -> dict:
    """A Triton kernel's tiles as launch arguments (the scores kernel's: the others choose theirs in _pv_tiles,
    _qk_softmax_tiles and fused)."""
    return _triton_args(_lookup(kernel, spec))


def _triton_args(t) -> dict:
    """Tiles as a Triton kernel's launch arguments, less the fields only the fused and Gluon kernels read."""
    t = t.as_dict()
    for fused_only in ("heavy_first", "paired", *GLUON_ONLY):
        t.pop(fused_only)
    return t


def _out(spec: Spec, out) -> torch.Tensor:
    """O, freshly allocated or the caller's (tests pass a NaN-poisoned `out` to prove every element is written)."""
    shape = (spec.B, spec.H, spec.N, spec.D)
    if out is None:
        return torch.empty(shape, dtype=spec.dtype, device=spec.device)
    if tuple(out.shape) != shape or out.dtype != spec.dtype or out.device != spec.device:
        raise ValueError(f"out must be a {spec.dtype} tensor of shape {shape} on {spec.device}, "
                         f"got {out.dtype} {tuple(out.shape)} on {out.device}")
    return out


def _pv(c: _Call, p: torch.Tensor, ablation, out) -> torch.Tensor:
    """O = P V (or, under no_pv, O = Σ_n P[:, n]·n/N broadcast over D) from P in device memory: the Gluon kernel
    where _pv_tiles picks it, else the Triton one."""
    s = c.spec
    o = _out(s, out)
    spn = row_stride(p, s, "P")
    chosen = _pv_tiles(s)
    if chosen.gluon:
        from attnlab.triton.hopper import pv as pv_gluon

        pv_gluon.launch(p, c.v, o, N=s.N, H=s.H, group=s.group, inv_n=1.0 / s.N, causal=s.causal, tiles=chosen,
                        no_pv=ablation == "no_pv")
        return o
    t = _triton_args(chosen)
    dispatch.run(_pv_mod.pv_kernel, _grid_m(s, t["BLOCK_M"]),
                 p, c.v, o, *c.v.stride()[:3], *o.stride()[:3], s.N, s.H, s.group, 1.0 / s.N, spn,
                 NO_PV=ablation == "no_pv", STAGES=t["num_stages"], ROWS_16B=rows_16b(s.N, p.dtype),
                 ROWS_PAD=rows_pad(s.N, p), **c.flags, **t)
    return o


def _pv_tiles(s: Spec) -> Tiles:
    """The PV kernel's tiles for this case: the key's entry, a Gluon one (attnlab.triton.hopper.pv; the table has them
    for fp16/bf16 at D = 64 and 128 only, forced tiles that ask for another dtype or D are an error, as for fused) at
    any N, since scores_buffer starts P's rows on lines where TMA can read them. No ablation enters: the build and
    its no_pv ablation run the same kernel, and the row records it (tile_config)."""
    chosen = _lookup("pv", s)
    if chosen.gluon:
        from attnlab.triton.hopper import common as hopper

        hopper.check_case(chosen, s.dtype, s.D, "PV")
    return chosen


def materialised(q, k, v, *, causal=False, attn_mask=None, scale=None, ablation=None, out=None) -> torch.Tensor:
    """S = scale·QKᵀ (+mask) → memory; P = softmax(S) → memory; O = P V."""
    c = _prepare(q, k, v, causal, attn_mask, scale, ablation)
    s = c.spec
    S = scores_buffer(s)
    t = _tiles("scores", s)
    grid = (triton.cdiv(s.N, t["BLOCK_M"]), triton.cdiv(s.N, t["BLOCK_N"]), s.B * s.H)
    dispatch.run(_mat.scores_kernel, grid, c.q, c.k, S, c.mask, *c.q.stride()[:3], *c.k.stride()[:3], *c.mask_strides,
                 s.N, s.H, s.group, s.scale, S.stride(2), MASK_KIND=c.mask_kind,
                 ROWS_16B=rows_16b(s.N, s.dtype), ROWS_PAD=rows_pad(s.N, S), **c.flags, **t)
    P = scores_buffer(s)
    # to the end of the row's last 16-byte vector: under ROWS_PAD a short row's block must reach its padding's end to
    # write P's 0s there (N = 1 in fp16: a block of 1 leaves columns 1–7 unwritten, and the PV kernel reads them)
    block = triton.next_power_of_2(min(vector_end(s.N, s.dtype.itemsize), SOFTMAX_ROW_MAX))
    rows = max(1, 4096 // block) if not interpreting() else max(1, 16384 // block)
    n_rows = s.B * s.H * s.N
    dispatch.run(_mat.softmax_kernel, (triton.cdiv(n_rows, rows),),
                 S, P, n_rows, s.N, S.stride(2), P.stride(2), ROWS=rows, BLOCK=block, ONE_PASS=s.N <= block,
                 NO_SOFTMAX=ablation == "no_softmax", ROWS_16B=rows_16b(s.N, s.dtype), ROWS_PAD=rows_pad(s.N, S, P),
                 num_warps=min(16, max(4, block // 1024)))
    del S  # S is dead once P exists; freeing it here keeps the peak at S + P, as a user's code would
    return _pv(c, P, ablation, out)


def qk_softmax(q, k, v, *, causal=False, attn_mask=None, scale=None, ablation=None, out=None) -> torch.Tensor:
    """P = softmax(scale·QKᵀ + mask) in one kernel (S stays on chip) → memory; O = P V."""
    c = _prepare(q, k, v, causal, attn_mask, scale, ablation)
    return qk_softmax_with(c, _qk_softmax_tiles(c.spec, mask=c.mask if c.mask_kind else None), ablation, out)


def qk_softmax_with(c: _Call, chosen: Tiles, ablation: str | None = None, out=None) -> torch.Tensor:
    """The qk_softmax build on a prepared call with `chosen` tiles for its P kernel (write_p), then the PV kernel.
    The build passes _qk_softmax_tiles' choice; a caller may pass a candidate at any N."""
    s = c.spec
    P = scores_buffer(s)
    write_p(c, P, chosen, no_softmax=ablation == "no_softmax")
    return _pv(c, P, ablation, out)


def write_p(c: _Call, P: torch.Tensor, chosen: Tiles, no_softmax: bool = False) -> None:
    """The qk_softmax build's first kernel with `chosen` tiles: P = softmax(scale·QKᵀ + mask) into the (B, H, N, N)
    P (S itself under the no_softmax ablation). The Gluon kernel for a Gluon entry, at any N (the build sends only
    the N it takes, _qk_softmax_tiles; its own check sends others), else the Triton kernel. P: the build's
    scores_buffer, or any layout row_stride takes. Under
    Tiles.fixed_reference the Gluon kernel flags the rows its pass 1 leaves wrong, and the Triton kernel then
    re-writes their blocks with REPAIR_TILES (a second launch, which returns at once where nothing is flagged)."""
    s = c.spec
    spn = row_stride(P, s, "P")
    log_scale = 1.0 if no_softmax else LOG2E  # softmax in exp2 units; the copy ablation writes S itself
    if chosen.gluon:  # the warp-specialised kernel (sm90, 16-bit), for the build and its ablations and masks alike
        from attnlab.triton.hopper import qk_softmax as qk_softmax_gluon

        flags = None
        if chosen.fixed_reference and not no_softmax:
            flags = torch.empty(s.B * s.H * s.N, dtype=torch.int8, device=s.device)
        qk_softmax_gluon.launch(c.q, c.k, P, c.mask, c.mask_strides, c.mask_kind, N=s.N, H=s.H, group=s.group,
                                qk_scale=s.scale * log_scale, mask_scale=log_scale, causal=s.causal, tiles=chosen,
                                no_softmax=no_softmax, flags=flags)
        if flags is not None:
            _triton_p(c, P, spn, REPAIR_TILES, log_scale, no_softmax, flags)
        return
    _triton_p(c, P, spn, chosen, log_scale, no_softmax)


# The re-write after a pass 1 against a fixed reference (Tiles.fixed_reference): all but the flagged blocks return at
# once, so what counts is how many programs an SM holds at a time; one stage keeps its shared memory small.
REPAIR_TILES = Tiles(64, 64, 4, 1)
REPAIR_SPAN = 4096  # the rows whose flags one program of the re-write reads at once (qk_softmax_kernel's REPAIR)


def _triton_p(c: _Call, P: torch.Tensor, spn: int, chosen: Tiles, log_scale: float, no_softmax: bool,
              flags=None) -> None:
    """The Triton P kernel with `chosen` tiles: every block of P (rows spn apart, write_p's row_stride), or (flags)
    only those with a flagged row."""
    s = c.spec
    t = _triton_args(chosen)
    repair, grid = {}, _grid_m(s, t["BLOCK_M"])
    if flags is not None:  # a program checks REPAIR_SPAN rows' flags (qk_softmax_kernel's REPAIR)
        if REPAIR_SPAN % t["BLOCK_M"]:
            raise ValueError(f"tiles {chosen}: a re-write's BLOCK_M must divide REPAIR_SPAN = {REPAIR_SPAN}")
        repair, grid = dict(FLAGS=flags, REPAIR=True, REPAIR_SPAN=REPAIR_SPAN), _grid_m(s, REPAIR_SPAN)
    dispatch.run(_qks.qk_softmax_kernel, grid,
                 c.q, c.k, P, c.mask, *c.q.stride()[:3], *c.k.stride()[:3], *c.mask_strides,
                 s.N, s.H, s.group, s.scale * log_scale, log_scale, spn,
                 MASK_KIND=c.mask_kind, NO_SOFTMAX=no_softmax, ONE_TILE=s.N <= t["BLOCK_N"], ROWS_PAD=rows_pad(s.N, P),
                 **repair, **c.flags, **t)


def _qk_softmax_tiles(s: Spec, ablation: str | None = None, mask: torch.Tensor | None = None):
    """The qk_softmax kernel's tiles for this case. A Gluon entry takes fp16/bf16 at D = 64 or 128 (forced tiles
    that ask for anything else are an error, as for fused); below qk_softmax_gluon.MIN_N, where the Triton kernel
    is faster (qk_softmax_gluon.takes: any N above it), the key's Triton entry runs instead, for the build
    and its ablations alike, and the row records it. Under a mask (the call's own `mask` view, or for the row's
    record the one its spec or the zero_mask ablation implies: additive in q's dtype, or boolean, broadcast over B
    and H) qk_softmax_gluon.as_run says how it comes in: by TMA with fewer stages where the entry's do not leave
    room, or by the consumers' loads, one item a program."""
    chosen = _lookup("qk_softmax", s)
    if not chosen.gluon:
        return chosen
    from attnlab.triton.hopper import common as hopper
    from attnlab.triton.hopper import qk_softmax as qk_softmax_gluon

    hopper.check_case(chosen, s.dtype, s.D, "qk_softmax")
    if not qk_softmax_gluon.takes(s.N):
        return _lookup("qk_softmax", s, gluon=False)
    # the row says which ran, and the ablation report notes a zero_mask that ran other tiles than its base
    if mask is None and (s.mask_kind != "none" or ablation == "zero_mask"):
        mask = _meta_mask(s, torch.uint8 if s.mask_kind == "bool" else s.dtype)
    return qk_softmax_gluon.as_run(chosen, mask, s.D, s.dtype.itemsize, s.N)


def fused(q, k, v, *, causal=False, attn_mask=None, scale=None, ablation=None, out=None) -> torch.Tensor:
    """O = softmax(scale·QKᵀ + mask) V in one kernel; S and P never leave the chip."""
    c = _prepare(q, k, v, causal, attn_mask, scale, ablation)
    s = c.spec
    o = _out(s, out)
    no_softmax = ablation == "no_softmax"
    log_scale = 1.0 if no_softmax else LOG2E
    chosen = _lookup("fused", s)
    if chosen.gluon:  # the warp-specialised kernel (sm90, 16-bit), for the build and all its ablations and masks
        from attnlab.triton.hopper import common as hopper
        from attnlab.triton.hopper import fused as fused_gluon

        hopper.check_case(chosen, s.dtype, s.D)
        fused_gluon.launch(c.q, c.k, c.v, o, c.mask, c.mask_strides, c.mask_kind, N=s.N, H=s.H, group=s.group,
                           qk_scale=s.scale * log_scale, mask_scale=log_scale, inv_n=1.0 / s.N, causal=causal,
                           tiles=chosen, no_softmax=no_softmax, no_pv=ablation == "no_pv")
        return o
    t = chosen.as_dict()
    if t["BLOCK_M"] % t["BLOCK_N"]:  # the causal split is in whole key tiles
        raise ValueError(f"fused tiles need BLOCK_M % BLOCK_N == 0, got {t['BLOCK_M']}x{t['BLOCK_N']}")
    heavy_first, paired = t.pop("heavy_first"), t.pop("paired")
    for gluon_only in GLUON_ONLY:
        t.pop(gluon_only)
    dispatch.run(_fused.fused_kernel, _grid_m(s, t["BLOCK_M"] * (2 if paired else 1)),
                 c.q, c.k, c.v, o, c.mask, *c.q.stride()[:3], *c.k.stride()[:3], *c.v.stride()[:3], *o.stride()[:3],
                 *c.mask_strides, s.N, s.H, s.group, s.scale * log_scale, log_scale, 1.0 / s.N,
                 MASK_KIND=c.mask_kind, NO_SOFTMAX=no_softmax, NO_PV=ablation == "no_pv",
                 HEAVY_FIRST=heavy_first, PAIRED=paired, **c.flags, **t)
    return o


def tile_config(build: str, spec: Spec, ablation: str | None = None) -> dict:
    """The tiles each kernel of a build (or of its ablation) uses for this case: recorded in every result row."""
    kernels = {"materialised": ("scores", "pv"), "qk_softmax": ("qk_softmax", "pv"), "fused": ("fused",)}[build]
    chosen = {"qk_softmax": lambda s: _qk_softmax_tiles(s, ablation), "fused": lambda s: _fused_tiles_run(s, ablation),
              "pv": _pv_tiles}
    return {kn: (chosen[kn](spec) if kn in chosen else _lookup(kn, spec)).as_dict() for kn in kernels}


def _fused_tiles_run(s: Spec, ablation: str | None) -> Tiles:
    """fused's tiles as its launch runs them: Tiles.o_tma only where the Gluon kernel has room for O's own tiles
    (attnlab.triton.hopper.fused.o_by_tma), which the zero_mask ablation's 2-byte (N, N) mask by TMA takes away at
    D = 128; the row then says so, and the ablation report notes that it ran other tiles than fused."""
    t = _lookup("fused", s)
    if not t.o_tma:
        return t
    from attnlab.triton.hopper import fused as fused_gluon

    mask, kind = None, 0
    if ablation == "zero_mask":  # the additive mask it brings: builds._zero_mask's, broadcast over B and H
        mask, kind = _meta_mask(s, s.dtype), 2
    return replace(t, o_tma=fused_gluon.paths(t, mask, kind, s.D, s.dtype.itemsize)[1])


def _meta_mask(s: Spec, dtype: torch.dtype) -> torch.Tensor:
    """For a row's record: the (N, N) mask the lab passes (builds._zero_mask's), broadcast to (B, H, N, N), with no
    storage (its strides and dtype are what decide how a kernel reads it)."""
    return torch.empty(s.N, s.N, dtype=dtype, device="meta").expand(s.B, s.H, s.N, s.N)
