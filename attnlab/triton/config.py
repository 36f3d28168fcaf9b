"""Where our kernels can run, and with which tiles: explicit tables, chosen by the opt-in autotune sweep.

TABLE is keyed by (kernel, GPU family, head-dim bucket, causal, dtype); SHORT, keyed alike, holds the few entries that
replace TABLE's for short sequences, each below an N of its own. `tiles()` returns the entry used, and every result
row records it (see attnlab.triton.launch.tile_config). `attnlab bench --autotune` re-runs the sweep that chose these
entries (attnlab.autotune); docs/hopper.md gives the measurements that chose each one. An entry changes only with a
line in docs/performance.md saying what the change measured.
"""
from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch

LOG2E = 1.4426950408889634  # exp(x) = exp2(x · log2 e): exp2 is the cheaper instruction


@dataclass(frozen=True)
class Tiles:
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int = 4
    num_stages: int = 2
    # fused, and the Gluon qk_softmax and PV kernels: launch the query blocks last-first (persistent Gluon kernels:
    # in heavy/light pairs). Under a causal mask the last block does the most work; started last (the default
    # order), it runs alone at the end of the grid (up to 8 % at N = 16384).
    heavy_first: bool = False
    # fused kernel only: each program owns two blocks of BLOCK_M rows that share every K/V tile, so one block's
    # softmax overlaps the other's PV matmul. The grid then has cdiv(N, 2·BLOCK_M) programs.
    paired: bool = False
    # fused, qk_softmax and pv: the warp-specialised Gluon kernel (attnlab.triton.hopper.fused, .qk_softmax, .pv;
    # sm90, 16-bit; they compile for D = 64 or 128 exactly). BLOCK_M is then the rows of each of its two consumer
    # warpgroups, a program covers 2·BLOCK_M, and num_warps is 4 (one warpgroup a partition).
    gluon: bool = False
    # Gluon kernel only: the loader warp brings each mask tile by TMA with K, instead of each consumer loading it in
    # its loop (the zero_mask ablation's cost at D = 128, N = 4096: 1.21 → 0.25 ms; masks TMA cannot read keep the
    # loads).
    mask_tma: bool = False
    # Gluon qk_softmax kernel only: Q as the register operand of QKᵀ, loaded from shared memory once a pass, so each
    # matmul reads only its K tile there (alone −0.9 to +1.1 % on the H200; with fixed_reference the table's D = 64
    # non-causal and D = 128 causal entries set it; label suffix `r`).
    q_registers: bool = False
    # Gluon kernels: one program an SM (two with one_consumer), each taking the work items (2·BLOCK_M rows of a
    # head) in turn, so that the next item's Q, K and V load while this one finishes (label suffix `c`).
    persistent: bool = False
    # Gluon fused kernel, persistent only: O goes out by TMA from two shared-memory tiles of its own, its store
    # draining under the next item, instead of plain stores from registers; where the shared memory has no room
    # (a 2-byte mask by TMA at D = 128) the plain stores stay (label suffix `o`).
    o_tma: bool = False
    # Gluon kernels: one consumer warpgroup a program (BLOCK_M rows) instead of two, so that two programs share an SM
    # and one's start and end run under the other's work (label suffix `u`). In the qk_softmax kernel it pays the
    # same way, under a causal mask at short N (not at non-causal long N, where it was aimed).
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
    # SHORT entries only, below ROW_MAX + 1 (attnlab.autotune.pick).
    one_pass: bool = False
    # Gluon PV kernel only: Oᵀ = Vᵀ Pᵀ, so that at D = 64 each wgmma is 64 × BLOCK_M (BLOCK_M up to 256) instead of
    # BLOCK_M × 64, and Oᵀ goes out through shared memory (label suffix `y`).
    o_transposed: bool = False

    def as_dict(self) -> dict:
        """A fresh dict of the fields (dataclasses.asdict deep-copies each value: half of a launch's own host time)."""
        return {name: getattr(self, name) for name in _TILE_FIELDS}


_TILE_FIELDS = tuple(f.name for f in fields(Tiles))

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


# (kernel, family, head-dim bucket, causal, dtype-size) -> Tiles. "any" matches every value of that key.
# The interpreter runs one numpy op per block op, so big blocks and few programs are fastest there.
# sm90 entries: chosen on an H200 by `attnlab bench --autotune` (the measurements that chose each entry:
# docs/hopper.md). "=64" and "=128" match D = 64 or 128 exactly, where the Gluon kernels compile (their TMA boxes are
# D wide); the power-of-two buckets cover every other D, and D = 64 or 128 where a Gluon entry does not run.
TABLE: dict[tuple, Tiles] = {
    ("fused", "interpreter", "any", "any", "any"): Tiles(128, 128),
    ("qk_softmax", "interpreter", "any", "any", "any"): Tiles(128, 128),
    ("scores", "interpreter", "any", "any", "any"): Tiles(128, 128),
    ("pv", "interpreter", "any", "any", "any"): Tiles(128, 128),
    # fused, Gluon: warp specialised (1.13–1.18× the Triton kernel at D = 128; at D = 64 ahead only once persistent,
    # 1.02–1.03×), persistent so the next item's loads run under this one's end, O stored by TMA from tiles of its
    # own, masks by TMA with K; causal items in heavy/light pairs, so every program carries the same load. Short
    # causal N: SHORT.
    # fused, Triton: D = 33…64 128×64 w8 s3. D = 65…127 pairs row blocks, one block's softmax over the other's PV
    # (1.10–1.15×; slower under a causal mask and at D = 64, which keep one block). 128×128 w8 s3 is 2 % faster
    # unmasked but needs 288 KiB of shared memory with a mask tile pipelined too; one configuration for masked and
    # unmasked calls keeps the zero_mask ablation a comparison of the same kernel. Causal D = 65…127: 64×64 w4 s3,
    # heaviest blocks first (up to 8 % at N = 16384). D = 129…256: small tiles that fit, set by hand.
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
    # qk_softmax, Gluon, any N from hopper.qk_softmax.MIN_N: P stored by TMA (the build 1.05–1.41× the Triton
    # kernel's at N = 1024…16384; 3 stages 4–13 % faster than 2). D = 64 causal: one consumer a program, two programs
    # an SM. D = 64 non-causal: persistent. D = 64 non-causal and D = 128 causal: pass 1 against a fixed reference
    # with Q as the register operand (the P kernel 0.7–2.9 % faster; the build 1.4–2.8 % at D = 64, a tie at D = 128
    # causal). D = 128 non-causal: the plain two-pass kernel (the fixed reference alone ties there).
    ("qk_softmax", "sm90", "=64", False, 2): Tiles(64, 128, 4, 3, gluon=True, q_registers=True, persistent=True,
                                                   fixed_reference=True),
    ("qk_softmax", "sm90", "=64", True, 2): Tiles(64, 128, 4, 3, heavy_first=True, gluon=True, one_consumer=True),
    ("qk_softmax", "sm90", "=128", False, 2): Tiles(64, 128, 4, 3, gluon=True),
    ("qk_softmax", "sm90", "=128", True, 2): Tiles(64, 128, 4, 3, heavy_first=True, gluon=True, q_registers=True,
                                                   fixed_reference=True),
    # qk_softmax, Triton: the fastest of the sweep at each bucket.
    ("qk_softmax", "sm90", 64, False, 2): Tiles(128, 64, 8, 3),
    ("qk_softmax", "sm90", 128, False, 2): Tiles(128, 64, 4, 3),
    ("qk_softmax", "sm90", "any", True, 2): Tiles(64, 64, 4, 3),
    # pv, Gluon: persistent, as Oᵀ = Vᵀ Pᵀ (D is the wgmma's M, so each k-step reads V and P once), heaviest rows
    # first under a causal mask. Where it serves, the qk_softmax build's median over three rounds is up to 4.1 %
    # below the entry it replaced, and never above; at D = 64 causal N = 4096 it ties, so SHORT's bound there is 8192.
    ("pv", "sm90", "=128", False, 2): Tiles(128, 64, 4, 4, gluon=True, persistent=True, o_transposed=True),
    ("pv", "sm90", "=128", True, 2): Tiles(128, 64, 4, 4, heavy_first=True, gluon=True, persistent=True,
                                           o_transposed=True),
    ("pv", "sm90", "=64", True, 2): Tiles(128, 64, 4, 4, heavy_first=True, gluon=True, persistent=True,
                                          o_transposed=True),
    ("pv", "sm90", "=64", False, 2): Tiles(128, 64, 4, 4, gluon=True, persistent=True, o_transposed=True),
    # pv, Triton: 64×64 w4 s3 at D = 33…64 causal (1–2 % faster than 128×64 w8); elsewhere 128×64 w8 s3, within the
    # sweep's noise of the best.
    ("pv", "sm90", 64, True, 2): Tiles(64, 64, 4, 3),
    ("pv", "sm90", "any", "any", 2): Tiles(128, 64, 8, 3),
    # materialised's S kernel in 16-bit on any GPU (the autotune does not tune it), and PV in 16-bit on other GPUs:
    # set by hand.
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
# bound of its own (written before bounds were) serves below SHORT_N. The measurements that chose each entry:
# docs/hopper.md.
SHORT_N = 1024
SHORT: dict[tuple, tuple[Tiles, int]] = {
    # pv: the Triton kernel below the N from which TABLE's Gluon entry wins (at D = 128 non-causal N = 512 it takes
    # 0.2448 ms against the Gluon kernel's 0.2613).
    ("pv", "sm90", 128, False, 2): (Tiles(128, 64, 8, 3), 724),
    ("pv", "sm90", 64, False, 2): (Tiles(128, 64, 8, 3), 2048),
    ("pv", "sm90", 128, True, 2): (Tiles(128, 64, 8, 3), 4096),
    ("pv", "sm90", 64, True, 2): (Tiles(64, 64, 4, 3), 8192),
    # fused, causal: one consumer a program, two programs an SM, so one's start and end run under the other's work
    # (N = 512: 0.1102 against TABLE's 0.1359 ms at D = 128; 0.1476 against 0.2001 at D = 64, 1 % ahead at 2048).
    ("fused", "sm90", "=128", True, 2): (Tiles(64, 64, 4, 2, heavy_first=True, gluon=True, mask_tma=True,
                                               persistent=True, o_tma=True, one_consumer=True), 724),
    ("fused", "sm90", "=64", True, 2): (Tiles(64, 128, 4, 2, heavy_first=True, gluon=True, mask_tma=True,
                                              persistent=True, o_tma=True, one_consumer=True), 1448),
    # qk_softmax: one pass with the row on chip, each score computed once (6–25 % less time at N = 512 and 1024), up
    # to qk_softmax_row.ROW_MAX + 1 (past it the entry would run the two-pass kernel); 4 stages do not fit a 1024-key
    # row at D = 128. A masked call runs the two-pass kernel, persistent only where its mask comes by TMA
    # (hopper.qk_softmax.as_run), and its row says so. D = 64 causal, where one pass does not win: persistent, one
    # consumer a program (0.3484 against 0.3763 ms at N = 512).
    ("qk_softmax", "sm90", "=64", False, 2): (Tiles(64, 128, 4, 4, gluon=True, one_pass=True), 1025),
    ("qk_softmax", "sm90", "=128", False, 2): (Tiles(64, 128, 4, 2, gluon=True, one_pass=True), 1025),
    ("qk_softmax", "sm90", "=64", True, 2): (Tiles(64, 128, 4, 3, heavy_first=True, gluon=True, persistent=True,
                                                 one_consumer=True), 724),
    ("qk_softmax", "sm90", "=128", True, 2): (Tiles(64, 128, 4, 2, gluon=True, one_pass=True), 1025),
}


# Small grids: where a kernel's TABLE entry would give the GPU at most one wave of work items (B·H · cdiv(N, rows an
# item) no more than the programs its SMs hold at once), some SMs idle from the start and the rest wait on the slowest
# item. For the kernels named here the key's SHORT entry then serves at any N: fused's one consumer a program makes
# items of half the rows, twice as many, two programs an SM (B = 1, H = 16, N = 1024, D = 128 causal on an H100 under
# graph replay: 0.0220 ms against TABLE's 0.0274 and cuDNN's 0.0240; docs/performance.md).
ONE_WAVE = ("fused",)


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


def tiles(kernel: str, device: torch.device, D: int, causal: bool, dtype: torch.dtype, gluon: bool = True,
          N: int | None = None, heads: int | None = None) -> Tiles:
    """lookup's entry for a call on `device`; heads (B·H) with N lets a small grid take its SHORT entry (ONE_WAVE)."""
    return lookup(kernel, family(device), D, causal, dtype.itemsize, gluon, N, heads, sm_count(device))


def sm_count(device: torch.device) -> int | None:
    """Streaming multiprocessors of a CUDA device, None for a CPU (or the interpreter)."""
    if device.type != "cuda" or interpreting():
        return None
    return _sms_at(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sms_at(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def lookup(kernel: str, fam: str, D: int, causal: bool, itemsize: int, gluon: bool = True,
           N: int | None = None, heads: int | None = None, sms: int | None = None) -> Tiles:
    """The first entry matching (kernel, GPU family, D's bucket, causal, dtype size): in SHORT when N is below the
    entry's bound, then in TABLE. 'any' matches all, and a head-dim entry "=128" matches D = 128 only (the Gluon
    kernel's TMA boxes are exactly D wide: no padding). Gluon entries count only under a Triton the kernel was checked
    on (gluon_verified), and not at all with gluon=False. N = None: the TABLE entry (what serves every N without a
    SHORT entry). Given N, heads (B·H) and sms (the GPU's SMs), a kernel in ONE_WAVE whose TABLE entry would give one
    wave of work items or less takes the key's SHORT entry at any N."""
    memo = (kernel, fam, D, causal, itemsize, gluon, N, heads, sms, id(TABLE), id(SHORT), gluon_verified())
    found = _looked_up.get(memo)
    if found is None or found[0] is not TABLE or found[1] is not SHORT:
        if len(_looked_up) >= LOOKUPS_KEPT:
            _looked_up.clear()
        t = _scan(kernel, fam, D, causal, itemsize, gluon, N)
        if kernel in ONE_WAVE and None not in (N, heads, sms):
            from_table = t is _scan(kernel, fam, D, causal, itemsize, gluon, None)
            if from_table and one_wave(t, N, heads, sms):
                t = _scan(kernel, fam, D, causal, itemsize, gluon, 0)  # the key's SHORT entry, if it has one
        found = _looked_up[memo] = (TABLE, SHORT, t)
    return found[2]


# lookup's answers, by its arguments and the tables it read: forced() and load_overrides() bind new tables, which a
# remembered answer must have been read from (each holds its tables, so their ids cannot be reused while it is kept).
# A scan of the tables was a fifth of a launch's own host time.
_looked_up: dict = {}
LOOKUPS_KEPT = 4096


def _scan(kernel: str, fam: str, D: int, causal: bool, itemsize: int, gluon: bool, N: int | None) -> Tiles:
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

    def key(e):
        return e["kernel"], e["family"], e["D"], e["causal"], e["itemsize"]

    try:
        with open(path) as f:
            entries = json.load(f)
        front = {key(e): Tiles(**e["tiles"]) for e in entries if not e.get("short")}
        short = {key(e): (Tiles(**e["tiles"]), e.get("below", SHORT_N)) for e in entries if e.get("short")}
        tuned = {(e["kernel"], e["family"], e["itemsize"]) for e in entries}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path} is not a tiles.json written by attnlab bench --autotune "
                         f"({type(e).__name__}: {e})") from None
    TABLE = {**front, **{k: v for k, v in TABLE.items() if k not in front}}
    SHORT = {**short, **{k: v for k, v in SHORT.items() if (k[0], k[1], k[4]) not in tuned}}
