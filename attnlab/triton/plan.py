"""Which kernel a call runs, and how: one plain function per kernel, each returning a frozen plan of its own type.

    plan_scores      materialised's S kernel          ScoresPlan
    plan_softmax     materialised's softmax kernel    SoftmaxPlan
    plan_qk_softmax  qk_softmax's P kernel            QkSoftmaxPlan (Triton), QkSoftmaxGluonPlan (two passes, Hopper),
                                                      QkSoftmaxRowPlan (one pass with the row on chip, Hopper)
    plan_pv          the PV kernel of both            PvPlan (Triton), PvGluonPlan (Hopper)
    plan_fused       the fused build's kernel         FusedPlan (Triton), FusedGluonPlan (Hopper)
    plan_ds          the backward's dS kernel         BackwardPlan (materialised's and qk_softmax's backward,
    plan_transposed  the backward's dV and dK kernel  BackwardPlan  attnlab.triton.backward)
    plan_fused_train the fused kernel keeping lse     FusedPlan (Triton, every device: the training forward)
    plan_fused_dkdv  the fused backward's dK, dV      FusedBackwardPlan (attnlab.triton.fused_backward; its tiles:
    plan_fused_dq    the fused backward's dQ          FusedBackwardPlan  fused_backward_tiles)
    plan_fused_delta the fused backward's Δ           FusedBackwardPlan

A plan holds the kernel's block sizes and its own flags (nothing another kernel reads), its tile label, its grid, its
constexpr arguments and launch options, and for a Hopper kernel its descriptors' boxes and shared-memory layouts:
everything that depends on the call's shape, dtype, mask layout and device but on no pointer. Each is built once per
key and kept (functools.lru_cache), so that a call looks its plan up, allocates its output and launches. A result row
records each kernel's `plan.tiles` (attnlab.triton.launch.tile_config), whose label is `plan.label`.

Which tiles: the rules are an if-ladder per kernel (fused_tiles, qk_softmax_tiles, pv_tiles, scores_tiles): the
interpreter; an sm90 GPU in 16 bits at D = 64 or 128 exactly, where the Gluon kernels compile (their TMA boxes are D
wide), with short sequences and grids of one wave or less apart; the Triton kernel's tiles by D's power-of-two
bucket; small tiles that fit any sm80+ part elsewhere. docs/hopper.md gives the measurements that chose each rung; a
rung changes only with a line in docs/performance.md saying what the change measured. The autotune sweep
(attnlab.autotune) tries candidates, and `attnlab bench --tiles` runs a sweep's picks, through an explicit Overrides
value in force inside `overriding(...)`, which each plan's key carries.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import json
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import NamedTuple

import torch
import triton

from attnlab.cost import SOFTMAX_ROW_MAX
from attnlab.triton import config
from attnlab.triton.config import HEAD_DIMS, LOG2E, TILE_FIELDS, Tiles, head_dim_bucket, one_wave
from attnlab.triton.layout import MaskLayout, ragged_rows, rows_16b, vector_end

SHORT_N = 1024  # the autotune sweep chooses a key's long-sequence tiles over N from here on (attnlab.autotune)


# ---- the rules: which tiles, an if-ladder per kernel -------------------------------------------------------------
# `gluon`: whether the Gluon kernels may run (the caller's wish and a Triton they were checked on). N = None: the
# tiles for long sequences. heads (B·H) and sms (the GPU's SMs): the work a grid holds, where a rule reads it.
# The bounds the rules read, by D (and causal): each sits at the geometric middle between the largest N where the
# short-N choice is faster and the next N measured (docs/hopper.md holds the measurements):
FUSED_ONE_CONSUMER_BELOW = {128: 724, 64: 1448}  # fused, Gluon, causal: one consumer a program below these N
QK_SOFTMAX_PERSISTENT_BELOW = 724  # qk_softmax's Gluon P kernel, D = 64 causal: persistent below this N
PV_GLUON_FROM = {(128, False): 724, (64, False): 2048, (128, True): 4096, (64, True): 8192}  # the Gluon PV kernel's N

def fused_tiles(family: str, D: int, causal: bool, itemsize: int, N: int | None = None, heads: int | None = None,
                sms: int | None = None, gluon: bool = True) -> Tiles:
    """The fused kernel's tiles."""
    if family == "interpreter":  # one numpy op per block op: few big blocks run fastest
        return Tiles(128, 128)
    if family == "sm90" and itemsize == 2:
        if gluon and D in HEAD_DIMS:
            # warp specialised, persistent, O stored by TMA from tiles of its own, the mask by TMA with K; causal
            # items in heavy/light pairs
            tiles = Tiles(64, 128, 4, 2, heavy_first=causal, gluon=True, mask_tma=True, persistent=True, o_tma=True)
            if causal and N is not None:
                # short causal N, or a grid of one wave or less: one consumer a program, two programs an SM, so
                # that one's start and end run under the other's work
                short = replace(tiles, BLOCK_N=64 if D == 128 else 128, one_consumer=True)
                if N < FUSED_ONE_CONSUMER_BELOW[D] or (heads and sms and one_wave(tiles, N, heads, sms)):
                    return short
            return tiles
        bucket = head_dim_bucket(D)
        if bucket == 64:
            return Tiles(128, 64, 8, 3)
        if bucket == 128:  # causal: heaviest blocks first; else two row blocks share each K/V tile
            return Tiles(64, 64, 4, 3, heavy_first=True) if causal else Tiles(128, 64, 8, 3, paired=True)
    return Tiles(64, 32, 4, 2)  # fits any sm80+ part's shared memory, in fp32 and at D = 256 too


def qk_softmax_tiles(family: str, D: int, causal: bool, itemsize: int, N: int | None = None,
                     gluon: bool = True) -> Tiles:
    """The tiles of qk_softmax's P kernel (Gluon ones before plan_qk_softmax's mask and N rules: qk_softmax_as_run)."""
    if family == "interpreter":
        return Tiles(128, 128)
    if family == "sm90" and itemsize == 2:
        if gluon and D in HEAD_DIMS:
            from attnlab.triton.hopper.qk_softmax_row import ROW_MAX

            # short N: one pass with the row on chip, up to ROW_MAX keys (a row of 1024 keys leaves no room for 4
            # stages at D = 128); D = 64 causal: persistent with one consumer a program instead
            row_fits = N is not None and N <= ROW_MAX
            if not causal:
                if row_fits:
                    return Tiles(64, 128, 4, 4 if D == 64 else 2, gluon=True, one_pass=True)
                if D == 64:  # persistent; pass 1 against a fixed reference with Q in registers
                    return Tiles(64, 128, 4, 3, gluon=True, q_registers=True, persistent=True, fixed_reference=True)
                return Tiles(64, 128, 4, 3, gluon=True)
            if D == 64:  # one consumer a program, two programs an SM
                return Tiles(64, 128, 4, 3, heavy_first=True, gluon=True, one_consumer=True,
                             persistent=N is not None and N < QK_SOFTMAX_PERSISTENT_BELOW)
            if row_fits:
                return Tiles(64, 128, 4, 2, gluon=True, one_pass=True)
            return Tiles(64, 128, 4, 3, heavy_first=True, gluon=True, q_registers=True, fixed_reference=True)
        if causal:
            return Tiles(64, 64, 4, 3)
        bucket = head_dim_bucket(D)
        if bucket == 64:
            return Tiles(128, 64, 8, 3)
        if bucket == 128:
            return Tiles(128, 64, 4, 3)
    return Tiles(64, 32, 4, 2)


def pv_tiles(family: str, D: int, causal: bool, itemsize: int, N: int | None = None, gluon: bool = True) -> Tiles:
    """The PV kernel's tiles."""
    if family == "interpreter":
        return Tiles(128, 128)
    if itemsize != 2:
        return Tiles(64, 32, 4, 2)
    if family != "sm90":
        return Tiles(128, 64, 4, 3)
    # the Gluon kernel, as Oᵀ = Vᵀ Pᵀ, persistent, from the N at which it beats the Triton kernel
    if gluon and D in HEAD_DIMS and (N is None or N >= PV_GLUON_FROM[D, causal]):
        return Tiles(128, 64, 4, 4, heavy_first=causal, gluon=True, persistent=True, o_transposed=True)
    if causal and head_dim_bucket(D) == 64:
        return Tiles(64, 64, 4, 3)
    return Tiles(128, 64, 8, 3)


def backward_tiles(family: str, D: int, itemsize: int) -> Tiles:
    """The tiles of the materialised and qk_softmax backward's own kernels (attnlab.triton.backward), set by hand
    from ptxas's report for sm_90a (attnlab.triton.resources' way), not tuned: at 64 × 64 with 4 warps the dS kernel
    spilled in 16 bits (255 registers a thread; 8 warps: 186 and no spill, the dK/dV kernel 79 at D = 64 and 159 at
    D = 128); in float32, or past D = 128, 32 × 32 with 4 warps spills neither (float32 at 64 × 64 spilled both)."""
    if family == "interpreter":
        return Tiles(64, 64)
    if itemsize == 2 and D <= 128:
        return Tiles(64, 64, 8, 2)
    return Tiles(32, 32, 4, 2)


def scores_tiles(family: str, itemsize: int) -> Tiles:
    """materialised's S kernel's tiles (set by hand: the autotune does not tune it)."""
    if family == "interpreter":
        return Tiles(128, 128)
    return Tiles(128, 128, 8, 3) if itemsize == 2 else Tiles(64, 64, 4, 2)


# ---- overrides: tiles the rules give way to ------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a plan's key holds it, hashed at every call
class Overrides:
    """Tiles that replace the rules' choice. `forced`: (kernel, tiles) pairs, those tiles for that kernel at every N
    and D (the autotune sweep's candidate; tests' small tiles). `entries`: an autotune result file's picks,
    ((kernel, family, D, causal, itemsize), tiles, below): D is "=64" or "=128" (that D exactly) or a head-dim bucket;
    below an N for a short-sequence entry, else None. A key of a kernel the file tunes takes the file's tiles: its
    short entry below its bound (fused: or wherever its long entry gives one wave), else its long one. Gluon tiles
    count only where the Gluon kernels may run."""

    forced: tuple = ()
    entries: tuple = ()

    def tiles(self, kernel: str, family: str, D: int, causal: bool, itemsize: int, N: int | None,
              heads: int | None, sms: int | None, gluon: bool) -> Tiles | None:
        for k, t in self.forced:
            if k == kernel and (gluon or not t.gluon):
                return t
        key = (kernel, family, causal, itemsize)
        found = {}
        for (k, fam, d, c, size), t, below in self.entries:
            if (k, fam, c, size) == key and d in (f"={D}", head_dim_bucket(D)) and (gluon or not t.gluon):
                found.setdefault(below is not None, (t, below))
        long, short = found.get(False), found.get(True)
        if short and N is not None and (N < short[1] or (
                kernel == "fused" and long and heads and sms and one_wave(long[0], N, heads, sms))):
            return short[0]
        return long[0] if long else None


NONE = Overrides()
_overrides: contextvars.ContextVar = contextvars.ContextVar("attnlab_overrides", default=NONE)


@contextlib.contextmanager
def overriding(overrides: Overrides):
    """Plans made inside the block take `overrides`' tiles where they have some (for the autotune's candidates and
    `--tiles` runs); outside it, the rules'."""
    token = _overrides.set(overrides)
    try:
        yield overrides
    finally:
        _overrides.reset(token)


def forcing(kernel: str, tiles: Tiles) -> Overrides:
    """Overrides that run `tiles` for `kernel` at every N (the autotune sweep's way to try a candidate)."""
    return Overrides(forced=((kernel, tiles),))


def forced(kernel: str, tiles: Tiles):
    """overriding(forcing(kernel, tiles)): `tiles` for `kernel` everywhere inside the block, at every N."""
    return overriding(forcing(kernel, tiles))


def read_overrides(path: str) -> Overrides:
    """The picks of an autotune result file (JSON list written by `attnlab bench --autotune --out`) as Overrides, for
    a run that tests them before they are written into the rules by hand. An entry with `"short": true` serves below
    its `"below"` (else SHORT_N). ValueError naming the file otherwise."""
    try:
        with open(path) as f:
            entries = json.load(f)
        picks = tuple(((e["kernel"], e["family"], e["D"], e["causal"], e["itemsize"]), Tiles(**e["tiles"]),
                       e.get("below", SHORT_N) if e.get("short") else None) for e in entries)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path} is not a tiles.json written by attnlab bench --autotune "
                         f"({type(e).__name__}: {e})") from None
    return Overrides(entries=picks)


def lookup(kernel: str, family: str, D: int, causal: bool, itemsize: int, gluon: bool = True, N: int | None = None,
           heads: int | None = None, sms: int | None = None, overrides: Overrides | None = None) -> Tiles:
    """The tiles `kernel` gets on a GPU of this family (and SM count) for this D, causal setting and dtype size: the
    overrides' (those in force without `overrides`), else the rules'. Gluon tiles only with gluon and under a Triton
    they were checked on (config.gluon_verified). N = None: the tiles for long sequences."""
    gluon = gluon and config.gluon_verified()
    overrides = _overrides.get() if overrides is None else overrides
    if overrides is not NONE:
        t = overrides.tiles(kernel, family, D, causal, itemsize, N, heads, sms, gluon)
        if t is not None:
            return t
    if kernel == "fused":
        return fused_tiles(family, D, causal, itemsize, N, heads, sms, gluon)
    if kernel == "qk_softmax":
        return qk_softmax_tiles(family, D, causal, itemsize, N, gluon)
    if kernel == "pv":
        return pv_tiles(family, D, causal, itemsize, N, gluon)
    if kernel == "scores":
        return scores_tiles(family, itemsize)
    if kernel in ("ds", "transposed"):
        return backward_tiles(family, D, itemsize)
    raise ValueError(f"kernel must be one of fused, qk_softmax, pv, scores, ds, transposed; got {kernel!r}")


# ---- the plans -----------------------------------------------------------------------------------------------------

def forget() -> None:
    """Drop every plan made so far (for a test that changes a constant the rules or the plans read)."""
    for made in (_scores, _softmax, _qk_softmax, _pv, _fused, _backward, _fused_train, _fused_backward):
        made.cache_clear()


class Target(NamedTuple):  # a tuple: a plan's key holds it, hashed at every call
    """What of the device and the process a plan depends on: the GPU family ("interpreter" for Triton's CPU
    interpreter), its SM count (None there), whether the Gluon kernels may run (config.gluon_verified), whether the
    kernels run in the interpreter (their bf16 dots go through fp32 there: tiles.dot's UPCAST)."""

    family: str
    sms: int | None
    gluon: bool
    interpreting: bool


def target(device: torch.device) -> Target:
    return Target(config.family(device), config.sm_count(device), config.gluon_verified(), config.interpreting())


def _frozen(**kw) -> MappingProxyType:
    return MappingProxyType(kw)


class _Plan:
    """What every plan has: the Tiles a result row records (this kernel's fields; the others' flags off)."""

    @property
    def tiles(self) -> Tiles:
        return Tiles(**{name: getattr(self, name) for name in TILE_FIELDS if hasattr(self, name)})

    @property
    def label(self) -> str:
        return self.tiles.label


def _shared(D: int, dtype: torch.dtype, causal: bool, t: Target) -> dict:
    """The constexprs every Triton kernel of ours takes: D and its power-of-two bucket, causal, IEEE fp32 dots for
    fp32, bf16 dots through fp32 in the interpreter (attnlab.triton.tiles.dot)."""
    return dict(D=D, BLOCK_D=head_dim_bucket(D), CAUSAL=causal, IEEE=dtype == torch.float32, UPCAST=t.interpreting)


def _grid_m(N: int, heads: int, block_m: int) -> tuple:
    return (triton.cdiv(N, block_m), heads)


@dataclass(frozen=True)
class TiledPlan(_Plan):
    """A Triton kernel's plan that is its tiles, grid, constexprs and launch options, nothing more."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    grid: tuple
    constexprs: MappingProxyType = field(repr=False)
    options: MappingProxyType = field(repr=False)


@dataclass(frozen=True)
class ScoresPlan(TiledPlan):
    """materialised's S = scale·QKᵀ (+ mask) kernel (attnlab.triton.materialised.scores_kernel)."""


def plan_scores(heads: int, N: int, D: int, dtype: torch.dtype, causal: bool, mask: MaskLayout | None,
                device: torch.device) -> ScoresPlan:
    return _scores(heads, N, D, dtype, causal, mask.kind if mask else 0, target(device), _overrides.get())


@functools.lru_cache(maxsize=4096)
def _scores(heads, N, D, dtype, causal, mask_kind, t: Target, overrides) -> ScoresPlan:
    tiles = lookup("scores", t.family, D, causal, dtype.itemsize, t.gluon, N, heads, t.sms, overrides)
    # S is a scores_buffer (layout.scores_buffer), whose rows have room for the padding rows_pad asks for
    return ScoresPlan(tiles.BLOCK_M, tiles.BLOCK_N, tiles.num_warps, tiles.num_stages,
                      grid=(triton.cdiv(N, tiles.BLOCK_M), triton.cdiv(N, tiles.BLOCK_N), heads),
                      constexprs=_frozen(MASK_KIND=mask_kind, ROWS_16B=rows_16b(N, dtype),
                                         ROWS_PAD=ragged_rows(N, dtype.itemsize), **_shared(D, dtype, causal, t),
                                         BLOCK_M=tiles.BLOCK_M, BLOCK_N=tiles.BLOCK_N),
                      options=_frozen(num_warps=tiles.num_warps, num_stages=tiles.num_stages))


@dataclass(frozen=True)
class SoftmaxPlan:
    """materialised's P = softmax(S) kernel (attnlab.triton.materialised.softmax_kernel): ROWS rows a program, each
    read in blocks of BLOCK columns (one block: ONE_PASS)."""

    ROWS: int
    BLOCK: int
    num_warps: int
    grid: tuple
    constexprs: MappingProxyType = field(repr=False)
    options: MappingProxyType = field(repr=False)

    @property
    def label(self) -> str:
        return f"{self.ROWS}x{self.BLOCK}w{self.num_warps}"


def plan_softmax(heads: int, N: int, dtype: torch.dtype, ablation: str | None = None) -> SoftmaxPlan:
    return _softmax(heads, N, dtype, ablation == "no_softmax", config.interpreting())


@functools.lru_cache(maxsize=4096)
def _softmax(heads, N, dtype, no_softmax: bool, interpreting: bool) -> SoftmaxPlan:
    # to the end of the row's last 16-byte vector: under ROWS_PAD a short row's block must reach its padding's end to
    # write P's 0s there (N = 1 in fp16: a block of 1 leaves columns 1–7 unwritten, and the PV kernel reads them)
    block = triton.next_power_of_2(min(vector_end(N, dtype.itemsize), SOFTMAX_ROW_MAX))
    rows = max(1, (16384 if interpreting else 4096) // block)
    warps = min(16, max(4, block // 1024))
    return SoftmaxPlan(rows, block, warps, grid=(triton.cdiv(heads * N, rows),),
                       constexprs=_frozen(ROWS=rows, BLOCK=block, ONE_PASS=N <= block, NO_SOFTMAX=no_softmax,
                                          ROWS_16B=rows_16b(N, dtype), ROWS_PAD=ragged_rows(N, dtype.itemsize)),
                       options=_frozen(num_warps=warps))


# qk_softmax's P kernel ----------------------------------------------------------------------------------------------

# The re-write after a pass 1 against a fixed reference (Tiles.fixed_reference): all but the flagged blocks return at
# once, so what counts is how many programs an SM holds at a time; one stage keeps its shared memory small.
REPAIR_TILES = Tiles(64, 64, 4, 1)
REPAIR_SPAN = 4096  # the rows whose flags one program of the re-write reads at once (qk_softmax_kernel's REPAIR)


@dataclass(frozen=True)
class QkSoftmaxPlan(_Plan):
    """The Triton P kernel (attnlab.triton.qk_softmax.qk_softmax_kernel). `repair`: the re-write of the rows a Gluon
    pass 1 flagged (REPAIR, a program for REPAIR_SPAN rows), whose launch passes FLAGS."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    log_scale: float  # scores in exp2 units (LOG2E), or 1 where the no_softmax ablation writes S itself
    grid: tuple
    constexprs: MappingProxyType = field(repr=False)
    options: MappingProxyType = field(repr=False)
    gluon = False


@dataclass(frozen=True)
class QkSoftmaxGluonPlan(_Plan):
    """The two-pass Gluon P kernel (attnlab.triton.hopper.qk_softmax). `repair`: with a pass 1 against a fixed
    reference, the Triton kernel's re-write of the rows it flags (a B·H·N int8 `flags` tensor a call makes)."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    heavy_first: bool
    mask_tma: bool
    q_registers: bool
    persistent: bool
    one_consumer: bool
    fixed_reference: bool
    log_scale: float
    total: int  # work items: cdiv(N, rows a program) · B·H
    grid: tuple
    boxes: tuple = field(repr=False)  # (q, k, p) descriptors' (block, layout)
    mask_rows: int  # rows of a mask box brought by TMA (constexprs' MASK_TMA)
    repair: QkSoftmaxPlan | None
    constexprs: MappingProxyType = field(repr=False)
    options: MappingProxyType = field(repr=False)
    gluon = True
    one_pass = False


@dataclass(frozen=True)
class QkSoftmaxRowPlan(_Plan):
    """The one-pass Gluon P kernel, the row on chip (attnlab.triton.hopper.qk_softmax_row)."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    heavy_first: bool
    log_scale: float
    total: int
    grid: tuple
    boxes: tuple = field(repr=False)  # (q, k, p) descriptors' (block, layout)
    constexprs: MappingProxyType = field(repr=False)
    options: MappingProxyType = field(repr=False)
    gluon = True
    one_pass = True
    repair = None


def plan_qk_softmax(heads: int, N: int, D: int, dtype: torch.dtype, causal: bool, mask: MaskLayout | None,
                    device: torch.device, ablation: str | None = None, tiles: Tiles | None = None,
                    rows_pad: bool | None = None, repair: bool = False):
    """qk_softmax's P kernel for this call. The rules' tiles: a Gluon P kernel where it takes the call's N
    (attnlab.triton.hopper.qk_softmax.takes; else the Triton kernel's tiles for the key), run as qk_softmax_as_run
    says for the call's mask and N; or `tiles`, run as given at any N (a caller's candidate: Gluon tiles that ask for
    a D or dtype the Gluon kernels do not compile are an error). rows_pad: whether P's rows have room for their
    padding (layout.rows_pad); scores_buffer's always have. repair: the Triton kernel's re-write of the rows a pass 1
    against a fixed reference flagged, with `tiles` (REPAIR_TILES by default)."""
    return _qk_softmax(heads, N, D, dtype, causal, mask, ablation == "no_softmax", tiles,
                       ragged_rows(N, dtype.itemsize) if rows_pad is None else rows_pad, repair, target(device),
                       _overrides.get())


@functools.lru_cache(maxsize=4096)
def _qk_softmax(heads, N, D, dtype, causal, mask, no_softmax, tiles, rows_pad, repair, t: Target, overrides):
    if repair:
        return _triton_p(heads, N, D, dtype, causal, mask, no_softmax, tiles or REPAIR_TILES, rows_pad,
                         1.0 if no_softmax else LOG2E, t, repair=True)
    if tiles is None:
        tiles = lookup("qk_softmax", t.family, D, causal, dtype.itemsize, t.gluon, N, heads, t.sms, overrides)
        if tiles.gluon:
            from attnlab.triton.hopper import qk_softmax as qk_softmax_gluon

            _check_gluon(tiles, dtype, D, "qk_softmax")
            if not qk_softmax_gluon.takes(N):
                tiles = lookup("qk_softmax", t.family, D, causal, dtype.itemsize, False, N, heads, t.sms, overrides)
            else:
                tiles = qk_softmax_as_run(tiles, mask, D, dtype.itemsize, N)
    log_scale = 1.0 if no_softmax else LOG2E
    if not tiles.gluon:
        return _triton_p(heads, N, D, dtype, causal, mask, no_softmax, tiles, rows_pad, log_scale, t)
    from attnlab.triton.hopper import common
    from attnlab.triton.hopper import qk_softmax as qk_softmax_gluon
    from attnlab.triton.hopper import qk_softmax_row

    BM, BN = tiles.BLOCK_M, tiles.BLOCK_N
    shape, p_shape = (1, 1, N, D), (1, 1, N, N)
    boxes = (common.box(shape, dtype, BM), common.box(shape, dtype, BN), common.box(p_shape, dtype, BM, BN))
    if tiles.one_pass:  # one pass, the row on chip (qk_softmax_as_run sends masked calls and longer rows to two)
        if mask is not None:
            raise ValueError(f"tiles {tiles}: the one-pass P kernel takes no mask (plan.qk_softmax_as_run gives the "
                             f"tiles a masked call runs with)")
        if not qk_softmax_row.fits(tiles, N, D, dtype.itemsize):
            raise ValueError(f"tiles {tiles}: the one-pass P kernel keeps a row of N ≤ {qk_softmax_row.ROW_MAX} keys "
                             f"in shared memory with an even number of stages; N = {N} needs "
                             f"{qk_softmax_row.smem_bytes(tiles, N, D, dtype.itemsize)} bytes of the "
                             f"{common.smem_limit(tiles)} a program has")
        total = triton.cdiv(N, BM) * heads
        return QkSoftmaxRowPlan(BM, BN, tiles.num_warps, tiles.num_stages, tiles.heavy_first, log_scale, total,
                                grid=(min(total, t.sms or total),), boxes=boxes,
                                constexprs=_frozen(**qk_softmax_row.constexprs(
                                    tiles, D=D, N=N, itemsize=dtype.itemsize, causal=causal, no_softmax=no_softmax)),
                                options=_frozen(num_warps=4))
    rows, maxnreg = common.partitions(tiles)
    total = triton.cdiv(N, rows * BM) * heads
    ref1 = tiles.fixed_reference and not no_softmax
    repair = None
    if ref1:  # a program checks REPAIR_SPAN rows' flags (qk_softmax_kernel's REPAIR)
        repair = _triton_p(heads, N, D, dtype, causal, mask, no_softmax, REPAIR_TILES, rows_pad, log_scale, t,
                           repair=True)
    return QkSoftmaxGluonPlan(
        BM, BN, tiles.num_warps, tiles.num_stages, tiles.heavy_first, tiles.mask_tma, tiles.q_registers,
        tiles.persistent, tiles.one_consumer, tiles.fixed_reference, log_scale, total,
        grid=(_persistent_grid(total, tiles, t) if tiles.persistent else total,), boxes=boxes,
        mask_rows=common.mask_rows(tiles), repair=repair,
        constexprs=_frozen(**qk_softmax_gluon.constexprs(tiles, D=D, causal=causal, mask=mask,
                                                         no_softmax=no_softmax)),
        options=_frozen(num_warps=4, maxnreg=maxnreg))


def _triton_p(heads, N, D, dtype, causal, mask, no_softmax, tiles, rows_pad, log_scale, t: Target,
              repair=False) -> QkSoftmaxPlan:
    """The Triton P kernel with these tiles: every block of P, or (repair) only those with a flagged row."""
    extra, grid = {}, _grid_m(N, heads, tiles.BLOCK_M)
    if repair:
        if REPAIR_SPAN % tiles.BLOCK_M:
            raise ValueError(f"tiles {tiles}: a re-write's BLOCK_M must divide REPAIR_SPAN = {REPAIR_SPAN}")
        extra, grid = dict(REPAIR=True, REPAIR_SPAN=REPAIR_SPAN), _grid_m(N, heads, REPAIR_SPAN)
    return QkSoftmaxPlan(tiles.BLOCK_M, tiles.BLOCK_N, tiles.num_warps, tiles.num_stages, log_scale, grid,
                         constexprs=_frozen(MASK_KIND=mask.kind if mask else 0, NO_SOFTMAX=no_softmax,
                                            ONE_TILE=N <= tiles.BLOCK_N, ROWS_PAD=rows_pad, **extra,
                                            **_shared(D, dtype, causal, t), BLOCK_M=tiles.BLOCK_M,
                                            BLOCK_N=tiles.BLOCK_N),
                         options=_frozen(num_warps=tiles.num_warps, num_stages=tiles.num_stages))


def qk_softmax_as_run(tiles: Tiles, mask: MaskLayout | None, D: int, itemsize: int, N: int | None = None) -> Tiles:
    """The Gluon P kernel's tiles as a call at sequence length N runs them, given its mask's layout (None: no mask):
    attnlab.triton.hopper.qk_softmax.as_run."""
    from attnlab.triton.hopper import qk_softmax as qk_softmax_gluon

    return qk_softmax_gluon.as_run(tiles, mask, D, itemsize, N)


def _check_gluon(tiles: Tiles, dtype: torch.dtype, D: int, kernel: str = "") -> None:
    from attnlab.triton.hopper import common

    common.check_case(tiles, dtype, D, kernel)


def _persistent_grid(total: int, tiles: Tiles, t: Target) -> int:
    """A persistent Gluon kernel's programs: as many as the SMs hold at once, or the work items where fewer (all of
    them where the device has no SM count: each program then takes one item)."""
    return min(total, t.sms * config.programs_per_sm(tiles)) if t.sms else total


# PV -----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PvPlan(_Plan):
    """The Triton PV kernel (attnlab.triton.pv.pv_kernel), on a scores_buffer's P."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    grid: tuple
    constexprs: MappingProxyType = field(repr=False)
    options: MappingProxyType = field(repr=False)
    gluon = False


@dataclass(frozen=True)
class PvGluonPlan(_Plan):
    """The Gluon PV kernel (attnlab.triton.hopper.pv)."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    heavy_first: bool
    persistent: bool
    one_consumer: bool
    o_transposed: bool
    total: int
    grid: tuple
    boxes: tuple = field(repr=False)  # (p, v) descriptors' (block, layout)
    constexprs: MappingProxyType = field(repr=False)
    options: MappingProxyType = field(repr=False)
    gluon = True


def plan_pv(heads: int, N: int, D: int, dtype: torch.dtype, causal: bool, device: torch.device,
            ablation: str | None = None, tiles: Tiles | None = None):
    """The PV kernel for this call, on a scores_buffer's P: the rules' tiles (a Gluon kernel at any N from the one its
    rule names, since scores_buffer starts P's rows on lines where TMA can read them), or `tiles` (a caller's
    candidate). No ablation but no_pv enters: the build and its other ablations run the same kernel."""
    return _pv(heads, N, D, dtype, causal, ablation == "no_pv", tiles, target(device), _overrides.get())


@functools.lru_cache(maxsize=4096)
def _pv(heads, N, D, dtype, causal, no_pv, tiles, t: Target, overrides):
    if tiles is None:
        tiles = lookup("pv", t.family, D, causal, dtype.itemsize, t.gluon, N, heads, t.sms, overrides)
    if not tiles.gluon:
        return PvPlan(tiles.BLOCK_M, tiles.BLOCK_N, tiles.num_warps, tiles.num_stages,
                      grid=_grid_m(N, heads, tiles.BLOCK_M),
                      constexprs=_frozen(NO_PV=no_pv, STAGES=tiles.num_stages, ROWS_16B=rows_16b(N, dtype),
                                         ROWS_PAD=ragged_rows(N, dtype.itemsize), **_shared(D, dtype, causal, t),
                                         BLOCK_M=tiles.BLOCK_M, BLOCK_N=tiles.BLOCK_N),
                      options=_frozen(num_warps=tiles.num_warps, num_stages=tiles.num_stages))
    from attnlab.triton.hopper import common
    from attnlab.triton.hopper import pv as pv_gluon

    _check_gluon(tiles, dtype, D, "PV")
    rows, maxnreg = common.partitions(tiles)
    total = triton.cdiv(N, rows * tiles.BLOCK_M) * heads
    return PvGluonPlan(tiles.BLOCK_M, tiles.BLOCK_N, tiles.num_warps, tiles.num_stages, tiles.heavy_first,
                       tiles.persistent, tiles.one_consumer, tiles.o_transposed, total,
                       grid=(_persistent_grid(total, tiles, t) if tiles.persistent else total,),
                       boxes=(common.box((1, 1, N, N), dtype, tiles.BLOCK_M, tiles.BLOCK_N),
                              common.box((1, 1, N, D), dtype, tiles.BLOCK_N)),
                       constexprs=_frozen(**pv_gluon.constexprs(tiles, D=D, causal=causal, no_pv=no_pv)),
                       options=_frozen(num_warps=4, maxnreg=maxnreg))


# the backward's own kernels (materialised and qk_softmax) ---------------------------------------------------------

@dataclass(frozen=True)
class BackwardPlan(TiledPlan):
    """One of attnlab.triton.backward's kernels: ds_kernel (a program a block of BLOCK_M query rows, grid over
    B·H) or transposed_kernel (a program a block of BLOCK_N key rows, grid over B·Hkv)."""


def plan_ds(heads: int, N: int, D: int, dtype: torch.dtype, causal: bool, device: torch.device,
            dp_on_chip: bool) -> BackwardPlan:
    """The dS kernel: dP read from memory (materialised) or computed on chip (qk_softmax, dp_on_chip). dS is a
    scores_buffer, whose rows have room for the padding rows_pad asks for."""
    return _backward("ds", heads, N, D, dtype, causal, dp_on_chip, target(device), _overrides.get())


def plan_transposed(kv_heads: int, N: int, D: int, dtype: torch.dtype, causal: bool,
                    device: torch.device) -> BackwardPlan:
    """dV = Pᵀ dO and dK = dSᵀ Q, a program a block of keys of one k/v head (B·Hkv of them)."""
    return _backward("transposed", kv_heads, N, D, dtype, causal, False, target(device), _overrides.get())


@functools.lru_cache(maxsize=4096)
def _backward(kernel, heads, N, D, dtype, causal, dp_on_chip, t: Target, overrides) -> BackwardPlan:
    tiles = lookup(kernel, t.family, D, causal, dtype.itemsize, False, N, heads, t.sms, overrides)
    extra = dict(DP_ON_CHIP=dp_on_chip, ROWS_PAD=ragged_rows(N, dtype.itemsize)) if kernel == "ds" else {}
    rows = tiles.BLOCK_M if kernel == "ds" else tiles.BLOCK_N  # the rows a program owns
    return BackwardPlan(tiles.BLOCK_M, tiles.BLOCK_N, tiles.num_warps, tiles.num_stages, grid=_grid_m(N, heads, rows),
                        constexprs=_frozen(**extra, **_shared(D, dtype, causal, t), BLOCK_M=tiles.BLOCK_M,
                                           BLOCK_N=tiles.BLOCK_N),
                        options=_frozen(num_warps=tiles.num_warps, num_stages=tiles.num_stages))


# fused --------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FusedPlan(_Plan):
    """The Triton fused kernel (attnlab.triton.fused.fused_kernel)."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    heavy_first: bool
    paired: bool
    log_scale: float
    grid: tuple
    constexprs: MappingProxyType = field(repr=False)
    options: MappingProxyType = field(repr=False)
    gluon = False


@dataclass(frozen=True)
class FusedGluonPlan(_Plan):
    """The Gluon fused kernel (attnlab.triton.hopper.fused). o_tma: whether it stores O by TMA, as it runs (its tiles
    ask for it and the shared memory has room beside the mask ring: hopper.fused.o_by_tma)."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    heavy_first: bool
    mask_tma: bool
    persistent: bool
    o_tma: bool
    one_consumer: bool
    log_scale: float
    total: int
    grid: tuple
    boxes: tuple = field(repr=False)  # (q, k and v, o) descriptors' (block, layout)
    mask_rows: int  # rows of a mask box brought by TMA (constexprs' MASK_TMA)
    constexprs: MappingProxyType = field(repr=False)
    options: MappingProxyType = field(repr=False)
    gluon = True


def plan_fused(heads: int, N: int, D: int, dtype: torch.dtype, causal: bool, mask: MaskLayout | None,
               device: torch.device, ablation: str | None = None, tiles: Tiles | None = None):
    """The fused kernel for this call: the rules' tiles (or the overrides'), for the build and all its ablations and
    masks alike, or `tiles` (a caller's candidate). Gluon tiles that ask for a D or dtype the kernel does not compile
    are an error."""
    return _fused(heads, N, D, dtype, causal, mask, ablation, tiles, target(device), _overrides.get())


@functools.lru_cache(maxsize=4096)
def _fused(heads, N, D, dtype, causal, mask, ablation, tiles, t: Target, overrides):
    if tiles is None:
        tiles = lookup("fused", t.family, D, causal, dtype.itemsize, t.gluon, N, heads, t.sms, overrides)
    no_softmax, no_pv = ablation == "no_softmax", ablation == "no_pv"
    log_scale = 1.0 if no_softmax else LOG2E
    if not tiles.gluon:
        if tiles.BLOCK_M % tiles.BLOCK_N:  # the causal split is in whole key tiles
            raise ValueError(f"fused tiles need BLOCK_M % BLOCK_N == 0, got {tiles.BLOCK_M}x{tiles.BLOCK_N}")
        return FusedPlan(tiles.BLOCK_M, tiles.BLOCK_N, tiles.num_warps, tiles.num_stages, tiles.heavy_first,
                         tiles.paired, log_scale,
                         grid=_grid_m(N, heads, tiles.BLOCK_M * (2 if tiles.paired else 1)),
                         constexprs=_frozen(MASK_KIND=mask.kind if mask else 0, NO_SOFTMAX=no_softmax, NO_PV=no_pv,
                                            HEAVY_FIRST=tiles.heavy_first, PAIRED=tiles.paired,
                                            **_shared(D, dtype, causal, t), BLOCK_M=tiles.BLOCK_M,
                                            BLOCK_N=tiles.BLOCK_N),
                         options=_frozen(num_warps=tiles.num_warps, num_stages=tiles.num_stages))
    from attnlab.triton.hopper import common
    from attnlab.triton.hopper import fused as fused_gluon

    _check_gluon(tiles, dtype, D)
    rows, maxnreg = common.partitions(tiles)
    o_tma = fused_gluon.o_tma(tiles, mask, D, dtype.itemsize)
    total = triton.cdiv(N, rows * tiles.BLOCK_M) * heads
    shape = (1, 1, N, D)
    return FusedGluonPlan(
        tiles.BLOCK_M, tiles.BLOCK_N, tiles.num_warps, tiles.num_stages, tiles.heavy_first, tiles.mask_tma,
        tiles.persistent, o_tma, tiles.one_consumer, log_scale, total,
        grid=(_persistent_grid(total, tiles, t) if tiles.persistent else total,),
        boxes=(common.box(shape, dtype, tiles.BLOCK_M), common.box(shape, dtype, tiles.BLOCK_N),
               common.box(shape, dtype, tiles.BLOCK_M)),
        mask_rows=common.mask_rows(tiles),
        constexprs=_frozen(**fused_gluon.constexprs(tiles, D=D, causal=causal, mask=mask, o_tma=o_tma,
                                                    no_softmax=no_softmax, no_pv=no_pv)),
        options=_frozen(num_warps=4, maxnreg=maxnreg))


# the fused build's training kernels ---------------------------------------------------------------------------------

def plan_fused_train(heads: int, N: int, D: int, dtype: torch.dtype, causal: bool, mask: MaskLayout | None,
                     device: torch.device) -> FusedPlan:
    """The fused kernel for a training forward, which keeps each row's logsumexp (its STORE_LSE; the launch,
    attnlab.triton.fused_train): the Triton kernel on every device, with the tiles the rules (or the overrides) give it
    where the Gluon kernel, which keeps none, is ruled out."""
    t = target(device)
    tiles = lookup("fused", t.family, D, causal, dtype.itemsize, False, N, heads, t.sms)
    return _fused_train(heads, N, D, dtype, causal, mask, tiles, t)


@functools.lru_cache(maxsize=4096)
def _fused_train(heads, N, D, dtype, causal, mask, tiles, t: Target) -> FusedPlan:
    inference = _fused(heads, N, D, dtype, causal, mask, None, tiles, t, NONE)  # given tiles, no overrides read
    return replace(inference, constexprs=_frozen(**inference.constexprs, STORE_LSE=True))


def fused_backward_tiles(kernel: str, family: str, D: int, itemsize: int) -> Tiles:
    """The tiles of one of the fused backward's kernels (attnlab.triton.fused_backward): a `dkdv` program owns BLOCK_N
    keys and steps through BLOCK_M query rows at a time (BLOCK_N a multiple of BLOCK_M), a `dq` program owns BLOCK_M
    rows and steps through BLOCK_N keys (BLOCK_M a multiple of BLOCK_N); the overrides do not reach them.
    - The interpreter: blocks of 32, so that the tests' short sequences cross several blocks (diagonal, steady and
      ragged tiles).
    - 16 bits, D ≤ 64: 64 × 64, 4 warps, for both.
    - 16 bits, D = 128: dK/dV 128 keys a program stepping 64 rows, 8 warps (two warpgroups, each with 64 rows of the
      two fp32 accumulators); dQ 128 rows stepping 64 keys, 8 warps, 3 stages: the fastest of the candidates
      docs/performance.md ("Training") sets side by side.
    - fp32's dots (IEEE, on the FMA units) spill least at 32 × 32 up to D = 64 and 16 × 16 past it, with 8 warps;
      16 bits past D = 128, 32 × 32 with 8 warps.
    sm90's compile report (python -m attnlab.triton.resources --kernels fused_dkdv,fused_dq) shows what each asks of
    an SM."""
    if kernel not in ("dkdv", "dq"):
        raise ValueError(f"kernel must be 'dkdv' or 'dq', got {kernel!r}")
    bucket = head_dim_bucket(D)
    if family == "interpreter":
        return Tiles(32, 32)
    if itemsize == 4:
        return Tiles(32, 32, 8, 2) if bucket <= 64 else Tiles(16, 16, 8, 2)
    if bucket <= 64:
        return Tiles(64, 64, 4, 2)
    if bucket == 128:
        return Tiles(64, 128, 8, 2) if kernel == "dkdv" else Tiles(128, 64, 8, 3)
    return Tiles(32, 32, 8, 2)


@dataclass(frozen=True)
class FusedBackwardPlan(TiledPlan):
    """One of the fused backward's kernels (attnlab.triton.fused_backward): dkdv_kernel, a program a block of BLOCK_N
    keys of one k/v head (grid over B·Hkv); dq_kernel, a program a block of BLOCK_M query rows (grid over B·H); or
    delta_kernel, with dq's grid and rows."""


def plan_fused_dkdv(kv_heads: int, N: int, D: int, dtype: torch.dtype, causal: bool, mask: MaskLayout | None,
                    device: torch.device) -> FusedBackwardPlan:
    """dK and dV, a program a block of keys of one k/v head (B·Hkv of them)."""
    return _fused_backward("dkdv", kv_heads, N, D, dtype, causal, mask.kind if mask else 0, target(device))


def plan_fused_dq(heads: int, N: int, D: int, dtype: torch.dtype, causal: bool, mask: MaskLayout | None,
                  device: torch.device) -> FusedBackwardPlan:
    """dQ, a program a block of query rows of one head (B·H of them)."""
    return _fused_backward("dq", heads, N, D, dtype, causal, mask.kind if mask else 0, target(device))


def plan_fused_delta(heads: int, N: int, D: int, dtype: torch.dtype, device: torch.device) -> FusedBackwardPlan:
    """Δ = rowsum(dO ∘ O), a program a block of dq's BLOCK_M query rows of one head."""
    return _fused_backward("delta", heads, N, D, dtype, False, 0, target(device))


@functools.lru_cache(maxsize=4096)
def _fused_backward(kernel, heads, N, D, dtype, causal, mask_kind, t: Target) -> FusedBackwardPlan:
    tiles = fused_backward_tiles("dq" if kernel == "delta" else kernel, t.family, D, dtype.itemsize)
    if kernel == "delta":
        return FusedBackwardPlan(tiles.BLOCK_M, tiles.BLOCK_N, tiles.num_warps, tiles.num_stages,
                                 grid=_grid_m(N, heads, tiles.BLOCK_M),
                                 constexprs=_frozen(D=D, BLOCK_D=head_dim_bucket(D), BLOCK_M=tiles.BLOCK_M),
                                 options=_frozen(num_warps=tiles.num_warps))
    owned, step = (tiles.BLOCK_N, tiles.BLOCK_M) if kernel == "dkdv" else (tiles.BLOCK_M, tiles.BLOCK_N)
    if owned % step:  # the causal diagonal is whole blocks of the loop
        raise ValueError(f"{kernel} tiles need the block a program owns to be a whole number of the blocks it steps "
                         f"through (dkdv: BLOCK_N % BLOCK_M == 0, dq: BLOCK_M % BLOCK_N == 0), got {tiles.label}")
    return FusedBackwardPlan(tiles.BLOCK_M, tiles.BLOCK_N, tiles.num_warps, tiles.num_stages,
                             grid=_grid_m(N, heads, owned),
                             constexprs=_frozen(MASK_KIND=mask_kind, **_shared(D, dtype, causal, t),
                                                BLOCK_M=tiles.BLOCK_M, BLOCK_N=tiles.BLOCK_N),
                             options=_frozen(num_warps=tiles.num_warps, num_stages=tiles.num_stages))
