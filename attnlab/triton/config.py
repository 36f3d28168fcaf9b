"""Where our kernels can run, and what a kernel's tiles are: the GPU's family and SM count, the Tiles a result row
records, their label, and the arithmetic of work items and waves that the rules of attnlab.triton.plan read.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields

import torch

from attnlab import environment

LOG2E = 1.4426950408889634  # exp(x) = exp2(x · log2 e): exp2 is the cheaper instruction


@dataclass(frozen=True)
class Tiles:
    """A kernel's tiles and flags as a result row records them (attnlab.triton.launch.tile_config), every kernel's
    fields in one record; each plan (attnlab.triton.plan) holds its own kernel's. What chose each value:
    docs/hopper.md."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int = 4
    num_stages: int = 2
    # fused, and the Gluon qk_softmax and PV kernels: launch the query blocks last-first (persistent Gluon kernels:
    # in heavy/light pairs). Under a causal mask the last block does the most work; started last (the default
    # order), it runs alone at the end of the grid.
    heavy_first: bool = False
    # fused kernel only: each program owns two blocks of BLOCK_M rows that share every K/V tile, so one block's
    # softmax overlaps the other's PV matmul. The grid then has cdiv(N, 2·BLOCK_M) programs.
    paired: bool = False
    # fused, qk_softmax and pv: the warp-specialised Gluon kernel (attnlab.triton.hopper.fused, .qk_softmax, .pv;
    # sm90, 16-bit; they compile for D = 64 or 128 exactly). BLOCK_M is then the rows of each of its two consumer
    # warpgroups, a program covers 2·BLOCK_M, and num_warps is 4 (one warpgroup a partition).
    gluon: bool = False
    # Gluon kernel only: the loader warp brings each mask tile by TMA with K, instead of each consumer loading it in
    # its loop (masks TMA cannot read keep the loads).
    mask_tma: bool = False
    # Gluon qk_softmax kernel only: Q as the register operand of QKᵀ, loaded from shared memory once a pass, so each
    # matmul reads only its K tile there (label suffix `r`).
    q_registers: bool = False
    # Gluon kernels: one program an SM (two with one_consumer), each taking the work items (2·BLOCK_M rows of a
    # head) in turn, so that the next item's Q, K and V load while this one finishes (label suffix `c`).
    persistent: bool = False
    # Gluon fused kernel, persistent only: O goes out by TMA from two shared-memory tiles of its own, its store
    # draining under the next item, instead of plain stores from registers; where the shared memory has no room
    # (a 2-byte mask by TMA at D = 128) the plain stores stay (label suffix `o`).
    o_tma: bool = False
    # Gluon kernels: one consumer warpgroup a program (BLOCK_M rows) instead of two, so that two programs share an SM
    # and one's start and end run under the other's work (label suffix `u`).
    one_consumer: bool = False
    # Gluon qk_softmax kernel only: pass 1 sums each row's exponentials against a fixed reference, the max of its
    # first key tile, instead of a running max (no max, no rescale in the loop, so a tile's exponentials need not
    # wait for its max). A row whose sum then overflows (a later score 2^128 above the reference), is 0 (a first
    # tile the mask hides, the rest too small to register, or a row hidden entirely) or NaN is flagged, and the
    # Triton kernel re-writes the flagged rows' blocks after it (label suffix `f`).
    fixed_reference: bool = False
    # Gluon qk_softmax kernel only: one pass, the row on chip. At N ≤ 1024 (attnlab.triton.hopper.qk_softmax_row.fits)
    # a program keeps its BLOCK_M rows' exponentials for all N keys in shared memory, so each score is computed once;
    # the two consumers split the key tiles and swap their rows' (max, sum) before P is written. Persistent by
    # construction, two consumers; masked calls and rows that do not fit run the two-pass kernel, persistent, with
    # the same tiles otherwise (hopper.qk_softmax.as_run; label suffix `a`). The autotune lets such tiles compete for
    # short-N entries only, below ROW_MAX + 1 (attnlab.autotune.pick).
    one_pass: bool = False
    # Gluon PV kernel only: Oᵀ = Vᵀ Pᵀ, so that at D = 64 each wgmma is 64 × BLOCK_M (BLOCK_M up to 256) instead of
    # BLOCK_M × 64, and Oᵀ goes out through shared memory (label suffix `y`).
    o_transposed: bool = False

    def as_dict(self) -> dict:
        """A fresh dict of the fields (dataclasses.asdict deep-copies each value)."""
        return {name: getattr(self, name) for name in TILE_FIELDS}

    @property
    def label(self) -> str:
        """'128x64w8s3' (BLOCK_M x BLOCK_N, warps, stages) with LABEL_FLAGS' letters of the flags set, in order."""
        return f"{self.BLOCK_M}x{self.BLOCK_N}w{self.num_warps}s{self.num_stages}" + "".join(
            letter for letter, field, _ in LABEL_FLAGS if getattr(self, field))


TILE_FIELDS = tuple(f.name for f in fields(Tiles))

# A tile label's suffix letters, in the order they are written: "128x64w8s3hp" is heavy-first and paired.
LABEL_FLAGS = (("h", "heavy_first", "heavy-first"), ("p", "paired", "paired rows"),
               ("g", "gluon", "the Gluon kernel"), ("m", "mask_tma", "its mask by TMA"),
               ("r", "q_registers", "Q in registers"), ("c", "persistent", "one program an SM"),
               ("o", "o_tma", "O by TMA from its own tiles"),
               ("u", "one_consumer", "one consumer a program"),
               ("f", "fixed_reference", "pass 1 against a fixed reference"),
               ("a", "one_pass", "one pass, the row on chip"),
               ("y", "o_transposed", "Oᵀ = Vᵀ Pᵀ"))

HEAD_DIMS = (64, 128)  # D the Gluon kernels compile for: wgmma tiles and TMA boxes exactly D wide, no padding

# the fields only the Gluon kernels read
GLUON_ONLY = ("gluon", "mask_tma", "q_registers", "persistent", "o_tma", "one_consumer", "fixed_reference",
              "one_pass", "o_transposed")


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return environment.interpreting()


def unsupported_reason(device: torch.device) -> str | None:
    """Why our Triton kernels cannot run on this device, or None when they can."""
    try:
        import triton  # noqa: F401
    except ImportError as e:  # pragma: no cover - triton is a dependency
        return f"triton is not importable ({e})"
    if device.type == "cuda":
        if interpreting():
            return "TRITON_INTERPRET=1 runs kernels on CPU tensors; unset it to use the GPU"
        major, _ = _capability(device)
        if major < 8:
            return f"our kernels need compute capability >= 8.0, this GPU has {major}.x"
        return None
    if device.type == "cpu":
        return None if interpreting() else "no GPU, and Triton's interpreter is off (set TRITON_INTERPRET=1)"
    return f"device type {device.type!r} is not supported by our Triton kernels"


def family(device: torch.device) -> str:
    if device.type != "cuda" or interpreting():
        return "interpreter"
    major, minor = _capability(device)
    return f"sm{major}{minor}"


def _capability(device: torch.device) -> tuple[int, int]:
    return _capability_at(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _capability_at(index: int) -> tuple[int, int]:
    """A GPU's compute capability (asked once: each launch's tile lookup needs it)."""
    return torch.cuda.get_device_capability(index)


def programs_per_sm(t: Tiles) -> int:
    """Programs that share an SM (its registers, its shared memory): two with one consumer, else one."""
    return 2 if t.one_consumer else 1


def item_rows(t: Tiles) -> int:
    """The query rows one work item (a program's turn) of a kernel launched with these tiles covers: a Gluon
    program's consumers (attnlab.triton.hopper.common.partitions) × BLOCK_M, a Triton program's BLOCK_M (two blocks
    when paired)."""
    if t.gluon:
        return t.BLOCK_M * (1 if t.one_consumer else 2)
    return t.BLOCK_M * (2 if t.paired else 1)


def one_wave(t: Tiles, N: int, heads: int, sms: int) -> bool:
    """Whether `t` gives at most one wave of work items: B·H · cdiv(N, item_rows) ≤ the programs `sms` SMs hold."""
    return heads * -(-N // item_rows(t)) <= sms * programs_per_sm(t)


def head_dim_bucket(D: int) -> int:
    """The padded head dim a kernel is compiled for: a power of two, at least 16 (tl.dot's smallest K)."""
    return max(16, 1 << (D - 1).bit_length())


def sm_count(device: torch.device) -> int | None:
    """Streaming multiprocessors of a CUDA device, None for a CPU (or the interpreter)."""
    if device.type != "cuda" or interpreting():
        return None
    return _sms_at(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sms_at(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


GLUON_TRITON = ("3.6.",)  # Triton releases the Gluon kernel was checked on (Gluon is experimental: its API moves)


def gluon_verified() -> bool:
    """Whether this Triton is one the Gluon kernels were checked on; with any other the plans' rules
    (attnlab.triton.plan) choose the Triton kernels (rows record which: `"gluon"` in their tiles)."""
    import triton

    return triton.__version__.startswith(GLUON_TRITON)
