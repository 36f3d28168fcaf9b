"""The checks of notebooks/exercises.ipynb: each takes the student's answer, runs it on inputs of its own, compares it
with the lab's own yardstick and returns a Verdict (attnlab.exercises.verdict) in seconds on a CPU.

    bytes           moved_and_held(build, B, H, N, D, dtype, causal)  against attnlab.cost's bytes_moved, hold_bytes
    online_softmax  online_softmax(q, tiles, scale)                   against the fp64 oracle (attnlab.reference), on
                                                                      random inputs and on inputs whose row maximum
                                                                      sits in the last key tile; the tiles come one
                                                                      at a time from attnlab.exercises.stream, which
                                                                      refuses an answer that does not stream
    kernel          attend_block, a @triton.jit piece                 inside attnlab.exercises.frame's kernel, in
                                                                      Triton's interpreter, against the oracle, causal
                                                                      and not, at N not a multiple of the block
    causal          key_blocks(m, N, BLOCK_M, BLOCK_N) and            against the blocks where the oracle's causal
                    causal_flops_saved(B, H, N, D, BLOCK_M, BLOCK_N)  mask leaves a live score
    ablation        no_softmax(q, k, v)                               against its oracle (ablation='no_softmax'), then
                                                                      compiled and timed beside its base, the times
                                                                      through attnlab.report.ablation_table's flag
    lies            {row: lie} for attnlab.exercises.planted.table()  against what the lab's guards find there

A failing Verdict says where the answer first goes wrong and gives a hint at why (for exercises 2 and 3, the slip it
matches, attnlab.exercises.mistakes), never the value the check expected: finding that is the exercise. A student's
function that raises gets a failing Verdict naming the error, never a traceback: papermill fails a whole notebook on
one error output. `Checks(solutions=True)` checks attnlab.exercises.solutions in place of the answers handed in
(the tests render the notebook both ways); that is the only place a check imports them.
"""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from types import SimpleNamespace

import pandas as pd
import torch

from attnlab import cost, reference
from attnlab.exercises import frame, mistakes, planted
from attnlab.exercises.stream import TileStream
from attnlab.exercises.verdict import Verdict, fmt, relative_error, tensor_difference

# -- 1. bytes ------------------------------------------------------------------------------------------------------

# (build, B, H, N, D, dtype, causal): each build non-causal and causal, another dtype, and a row longer than the
# softmax kernel reads in one pass (attnlab.cost.SOFTMAX_ROW_MAX)
BYTES_CASES = [
    ("materialised", 1, 16, 4096, 64, "bfloat16", False),
    ("qk_softmax", 1, 16, 4096, 64, "bfloat16", False),
    ("fused", 1, 16, 4096, 64, "bfloat16", False),
    ("materialised", 1, 16, 4096, 64, "bfloat16", True),
    ("qk_softmax", 1, 16, 4096, 64, "bfloat16", True),
    ("fused", 1, 16, 4096, 64, "bfloat16", True),
    ("materialised", 4, 8, 1024, 128, "float32", False),
    ("materialised", 1, 4, 32768, 64, "float16", False),
]


def bytes_hint(diff: int, nn: int, o: int, element: int, what: str) -> str:
    """What a byte count `diff` too few (diff > 0) or too many is likely made of: whole N×N tensors (S or P),
    Q-sized ones (Q, K, V, O), or a part of an element. The count itself is left to the student."""
    way = "too few" if diff > 0 else "too many"
    if diff % element:
        return f"yours counts {way} bytes {what}, by a part of an element: each element of this dtype is {element} B"
    if diff % (nn // 2) == 0:
        return (f"yours counts {way} bytes {what}, by whole N×N tensors (S or P): count each write and each read of "
                "S and P")
    if diff % o == 0:
        return (f"yours counts {way} bytes {what}, by whole Q-sized tensors: count the reads of Q, K and V and the "
                "write of O")
    return (f"yours counts {way} bytes {what}, by neither whole N×N tensors (S or P) nor whole Q-sized ones (Q, K, "
            "V, O): check each tensor's shape and element size")


def bytes_case_hint(i: int) -> str:
    """What BYTES_CASES[i] asks that the cases before it do not (the check stops at the first case that fails)."""
    build, _, _, N, _, dtype, causal = BYTES_CASES[i]
    if N > cost.SOFTMAX_ROW_MAX:
        return (f"the earlier cases match; this is the first with N past {cost.SOFTMAX_ROW_MAX}: what does the "
                "softmax do with a row that long?")
    if dtype != BYTES_CASES[0][5]:
        return f"the earlier cases match; this is the first in {dtype}: how many bytes is one element?"
    if causal:
        return ("the non-causal case of this build matches: a causal mask changes what is read, never what is "
                "written")
    return {"materialised": "materialised writes S and P, and reads each back",
            "qk_softmax": "qk_softmax writes P, and the PV kernel reads it back",
            "fused": "fused keeps S and P on chip"}[build]


# -- 2. the online softmax -----------------------------------------------------------------------------------------

# One block of 16 rows against 2000 keys in 63 tiles of 32, the last of 16: a whole score row (16 × 2000 float64,
# 250 KiB) is many tiles' worth, so attnlab.exercises.stream's limit (a quarter of it) sits far above what a
# streaming answer holds (its running state and a tile's scores, under 20 KiB) and far below the row.
SOFTMAX_SHAPE = dict(N=2000, D=16, rows=(16, 32), block_n=32)


def key_tiles(k: torch.Tensor, v: torch.Tensor, block_n: int):
    """(k_tile, v_tile) pairs of up to block_n keys, in order: how a kernel streams K and V past a block of rows (for
    a student's own inputs; the check hands out its tiles through attnlab.exercises.stream.TileStream)."""
    for start in range(0, k.shape[0], block_n):
        yield k[start:start + block_n], v[start:start + block_n]


def softmax_inputs(kind: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (N, D) float32 for the oracle (the student gets them in float64: the same values, exactly). kind
    'random': standard normal. kind 'last_tile': the checked rows' largest scores, near 1000, sit in the last key
    tile, where a running max that is not carried over overflows exp even in float64."""
    N, D, (r0, r1), bn = (SOFTMAX_SHAPE[x] for x in ("N", "D", "rows", "block_n"))
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(N, D, generator=g) for _ in range(3))
    if kind == "last_tile":
        u = torch.randn(D, generator=g)
        q[r0:r1] = u + 0.1 * q[r0:r1]  # the checked rows close to u
        last = (N - 1) // bn * bn
        k[last:] = 1000 / (u @ u * D ** -0.5) * u + 0.1 * k[last:]  # their scores there ≈ 1000
    elif kind != "random":
        raise ValueError(f"kind must be 'random' or 'last_tile', got {kind!r}")
    return q, k, v


# -- 3. the kernel piece -------------------------------------------------------------------------------------------

KERNEL_SHAPE = dict(B=1, H=2, N=40, D=16, block_m=16, block_n=16)  # N = 2.5 blocks: a ragged last tile and block


# -- 4. causal skipping --------------------------------------------------------------------------------------------

CAUSAL_TILINGS = [(64, 16, 16), (100, 32, 16), (100, 16, 32)]  # (N, BLOCK_M, BLOCK_N)
CAUSAL_FLOPS_CASE = dict(B=2, H=4, N=128, D=16, BLOCK_M=32, BLOCK_N=16)


def live_blocks(N: int, block_m: int, block_n: int) -> dict[int, list[int]]:
    """{query block: key blocks holding a score the oracle's causal mask leaves live} (attnlab.reference.scores)."""
    x = torch.randn(1, 1, N, 4, generator=torch.Generator().manual_seed(0))
    live = torch.isfinite(reference.scores(x, x, causal=True))[0, 0]  # (N, N)
    return {m: [n for n in range(-(-N // block_n))
                if live[m * block_m:(m + 1) * block_m, n * block_n:(n + 1) * block_n].any()]
            for m in range(-(-N // block_m))}


# -- 5. a legal ablation -------------------------------------------------------------------------------------------

ABLATION_SHAPE = dict(B=1, H=8, N=512, D=64)  # milliseconds a call on one CPU thread, far above a call's overhead
DEAD = "check that its output is consumed"  # what ablation_table's note says of an ablation that lost its work


def interleaved_ms(fns: list, reps: int = 15) -> list[float]:
    """Median ms of each zero-argument fn, the calls taken in turn (A, B, A, B, …) so a busy spell on a shared CPU
    slows both alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(reps):
        for t, fn in zip(times, fns):
            t0 = time.perf_counter()
            fn()
            t.append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


def base_program(q, k, v):
    """The materialised program the ablation modifies: S, softmax, PV, in plain torch."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(s, dim=-1) @ v


def compiled_times(ablated) -> tuple[float, float]:
    """(base ms, ablation ms): each compiled with torch.compile and timed as attnlab.measure times a build, its
    output consumed by `acc += o.sum(dtype=float32)`. The aot_eager backend traces each to one graph and drops what
    no output needs, as every compiler does, without inductor's seconds of code generation."""
    import torch._dynamo

    from attnlab.lies import quiet_stderr

    g = torch.Generator().manual_seed(0)
    B, H, N, D = (ABLATION_SHAPE[x] for x in "BHND")
    q, k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(3))
    torch._dynamo.reset()
    base, abl = torch.compile(base_program, backend="aot_eager"), torch.compile(ablated, backend="aot_eager")
    acc = torch.zeros((), dtype=torch.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared CPU a thread pool waiting for a busy core slows calls tenfold and more
    try:
        with quiet_stderr():
            return tuple(interleaved_ms([lambda: acc.add_(base(q, k, v).sum(dtype=torch.float32)),
                                         lambda: acc.add_(abl(q, k, v).sum(dtype=torch.float32))]))
    finally:
        torch.set_num_threads(threads)


def ablation_note(base_ms: float, ablated_ms: float) -> str:
    """What attnlab.report.ablation_table notes of a materialised no_softmax ablation timed `ablated_ms` beside its
    base's `base_ms` (the other ablations given the base's time, so only this one can be flagged)."""
    from attnlab import report

    rows = [timed_row("materialised", base_ms), timed_row("materialised-no_softmax", ablated_ms),
            timed_row("materialised-no_pv", base_ms), timed_row("materialised-zero_mask", base_ms)]
    return str(report.ablation_table(pd.DataFrame(rows), base="materialised")["note"].iloc[0])


def timed_row(build: str, ms: float) -> dict:
    """A results row (attnlab.measure.blank_row) of `build` at ABLATION_SHAPE in float32, timed `ms`."""
    from attnlab.measure import blank_row

    base, _, ablation = build.partition("-")
    row = blank_row()
    row.update(build=build, base=base, ablation=ablation, family="ablation" if ablation else "ours",
               **ABLATION_SHAPE, Hkv=ABLATION_SHAPE["H"], dtype="float32", causal=False, status="ok", ms=ms,
               ms_p20=ms, ms_p80=ms, case_id=f"{build}|{ABLATION_SHAPE['N']}")
    return row


# -- the checks ----------------------------------------------------------------------------------------------------


def _attempt(exercise: str, fn, *args):
    """(fn(*args), None), or (None, a failing Verdict naming what fn raised)."""
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 - the student's error is the answer to show, not to raise
        return None, Verdict(exercise, False, [f"your code raised {type(e).__name__}: {str(e).strip()[:400]}"])


@contextlib.contextmanager
def one_thread():
    """torch on one thread for the block: the online softmax's tile products are a few hundred elements each, and on
    a shared CPU a thread pool waiting for a busy core makes each take tens of milliseconds instead of microseconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def close_hint(rel: float, rtol: float, what: str) -> str:
    """The hint for an answer near the oracle but outside the check's tolerance."""
    return (f"close: yours is off by about {rel:.0e} of the output's size, and the check allows {rtol:g} relative. "
            f"{what}")


def softmax_hint(got, slips: dict, expected: torch.Tensor, kind: str, rtol: float) -> str:
    """What is most likely wrong with an online softmax whose O differs from the oracle's."""
    slip = mistakes.matching(got, slips)
    if slip:
        return mistakes.HINTS[slip]
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.shape):
        return "return O for the block's rows: one row of D numbers for each query row"
    rel = relative_error(got, expected)
    if math.isinf(rel):
        if kind == "last_tile":
            return ("yours is not finite (inf or NaN) where the largest scores, near 1000, come in the last tile: "
                    "exp overflowed, so the max subtracted there has not seen them. Subtract the running max of "
                    "every tile so far, updated before exp")
        return ("yours is not finite (inf or NaN): look at the first tile, where the old max is −∞ and exp(m_old − "
                "m_new) must be 0, and at the final division by the running sum")
    if rel < 1e-4:
        return close_hint(rel, rtol, "Keep every step in float64 (q and the tiles arrive in float64; one float32 "
                                     "step loses about 1e-7)")
    return ("none of the usual slips (a running sum or accumulator not rescaled, O not divided by the sum, the "
            "scale left out) gives yours: try yours against torch.softmax(scale * q @ k.T, dim=-1) @ v on small "
            "inputs of your own (exercises.key_tiles makes the tiles)")


def kernel_hint(got, slips: dict, expected: torch.Tensor, rtol: float) -> str:
    """What is most likely wrong with an attend_block whose O differs from the oracle's."""
    slip = mistakes.matching(got, slips, rtol=1e-4, atol=1e-5)
    if slip:
        return mistakes.HINTS[slip]
    rel = relative_error(got, expected)
    if math.isinf(rel):
        bad = (~torch.isfinite(got)).nonzero()[0].tolist()
        return (f"yours is not finite (inf or NaN), first at O{bad}: a row whose every score so far is −∞ gives "
                "exp(−∞ − (−∞)), and a row whose l_i is 0 is divided by zero when the frame stores acc / l_i")
    if rel < 1e-2:
        return close_hint(rel, rtol, "Look for a factor applied once too often or too rarely (alpha, qk_scale, "
                                     "log2 e)")
    return ("none of the usual slips (the keys past N counted, the causal mask left out) gives yours: print the "
            "scores of one tile for a small case, and compare them with scale · q kᵀ")


def key_blocks_hint(yours, N: int, bm: int, bn: int, m: int, live: list[int]) -> str | None:
    """None when `yours` lists the live key blocks of query block m in order, else the first thing wrong with it,
    said as a reason (which block holds no live score, or which holds one yours leaves out), never the list."""
    try:
        yours = list(yours)
    except TypeError:
        return f"yours is a {type(yours).__name__}, expected a list of key block indices"
    if yours == live:
        return None
    last = min((m + 1) * bm, N) - 1
    blocks = -(-N // bn)
    for j in yours:
        if not isinstance(j, int) or isinstance(j, bool):
            return f"yours holds {j!r}: a key block's index is a whole number"
        keys = f"key block {j} (keys {j * bn}–{(j + 1) * bn - 1})"
        if j >= blocks or j < 0:
            return f"yours visits {keys}, which is not in 0–{blocks - 1}: N = {N} keys make {blocks} blocks"
        if j not in live:
            return (f"yours visits {keys}, whose every key comes after every row of this block (the last is row "
                    f"{last}): all its scores are masked")
    if len(set(yours)) < len(yours):
        return "yours visits a key block more than once"
    if yours != sorted(yours):
        return "yours is not in order: a kernel visits the key blocks from the first on"
    j = next(j for j in live if j not in yours)
    return (f"yours leaves out key block {j} (keys {j * bn}–{min((j + 1) * bn, N) - 1}), but row {last} of this "
            "block sees its first key")


def flops_hint(got, c: dict, ideal: int) -> str:
    """What a causal_flops_saved answer that is not the skipped tiles' FLOPs most likely counts."""
    per_tile = 4 * c["BLOCK_M"] * c["BLOCK_N"] * c["D"]
    heads = c["B"] * c["H"]
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return f"yours is a {type(got).__name__}, expected a number of FLOPs"
    if got == ideal:
        return ("yours is the model's ideal half of the FLOPs (4·B·H·N²·D / 2), but a kernel computes every tile it "
                "visits whole, the diagonal ones too: count the tiles it skips (those key_blocks leaves out)")
    if got % (per_tile * heads) == 0:
        return (f"yours is {int(got // (per_tile * heads))} skipped tiles a head, each 4·BLOCK_M·BLOCK_N·D FLOPs: "
                "count again the (query block, key block) pairs key_blocks leaves out, over every query block")
    if got % per_tile == 0:
        return "yours is a whole number of tiles' FLOPs, but not of tiles on every one of the B·H heads"
    return ("yours is not a whole number of tiles' FLOPs: each skipped tile costs 4·BLOCK_M·BLOCK_N·D (its QKᵀ and "
            "its PV), on each of B·H heads")


LIE_HINTS = {
    "allocation": "compare its peak with what its build must hold at this shape (your exercise 1): a build that "
                  "peaks at what it must hold is honest, however small",
    "mixed_ratio": "read its baseline_row, and compare the two rows' causal",
    "timer": "compare its timer with the other rows'",
}


class Checks:
    """One method per exercise; each returns a Verdict. solutions=True checks the reference solutions in place of
    the answers handed in."""

    def __init__(self, solutions: bool = False):
        self.solutions = bool(solutions)

    def _pick(self, answer, name: str):
        if not self.solutions:
            return answer, []
        from attnlab.exercises import solutions

        return getattr(solutions, name), [f"(solutions=True: attnlab.exercises.solutions.{name} checked in place of "
                                          "yours)"]

    def bytes(self, moved_and_held) -> Verdict:
        ex = "1. bytes each build moves and holds"
        fn, note = self._pick(moved_and_held, "moved_and_held")
        for i, (build, B, H, N, D, dtype, causal) in enumerate(BYTES_CASES):
            got, failed = _attempt(ex, fn, build, B, H, N, D, dtype, causal)
            if failed:
                return failed
            case = SimpleNamespace(build=build, B=B, H=H, Hkv=H, N=N, D=D, dtype=dtype, causal=causal)
            expected = (cost.bytes_moved(case), cost.hold_bytes(case))
            where = f"{build}, B={B} H={H} N={N} D={D} {dtype} {'causal' if causal else 'non-causal'}"
            if not (isinstance(got, tuple) and len(got) == 2):
                return Verdict(ex, False, note + [f"{where}: yours returned {got!r}, expected a pair (moved, held)"])
            sz = cost.sizes(case)
            for what, y, e in zip(("moved", "held"), got, expected):
                if not isinstance(y, int) or isinstance(y, bool):
                    return Verdict(ex, False, note + [f"{where}, bytes {what}: yours is {y!r}, expected a whole "
                                                      "number of bytes"])
                if y != e:
                    return Verdict(ex, False, note + [
                        f"first difference: {where}, bytes {what}: yours {fmt(y)}",
                        f"hint: {bytes_hint(e - y, sz['Pb'], sz['qb'], sz['E'], what)}; {bytes_case_hint(i)}"])
        return Verdict(ex, True, note + [f"all {len(BYTES_CASES)} cases match attnlab.cost.bytes_moved and "
                                         "hold_bytes"])

    def online_softmax(self, online_softmax) -> Verdict:
        with one_thread():
            return self._online_softmax(online_softmax)

    def _online_softmax(self, online_softmax) -> Verdict:
        ex = "2. the online softmax over key tiles"
        fn, note = self._pick(online_softmax, "online_softmax")
        s = SOFTMAX_SHAPE
        (r0, r1), scale, rtol = s["rows"], s["D"] ** -0.5, 1e-9
        held = []
        for kind, label in (("random", "random inputs"),
                            ("last_tile", "inputs whose row maximum sits in the last key tile (scores near 1000)")):
            q, k, v = softmax_inputs(kind)
            expected = reference.attend(q[None, None], k[None, None], v[None, None], scale=scale)[0, 0, r0:r1]
            rows = q[r0:r1].double()
            stream = TileStream(rows, k.double(), v.double(), s["block_n"])
            with stream.watching():
                got, failed = _attempt(ex, fn, rows, stream, scale)
            stream.finished()
            where = (f"on {label}: query rows {r0}–{r1 - 1} (q {r1 - r0}×{s['D']}), {s['N']} keys in {stream.tiles} "
                     f"tiles of {s['block_n']} (the last holding {s['N'] % s['block_n']}); O[i, d] is query row "
                     f"{r0} + i")
            if stream.broken:
                return Verdict(ex, False, note + [where, f"not streamed (rule '{stream.broken.rule}', "
                                                         "attnlab.exercises.stream): " + stream.broken.message])
            if failed:
                return failed
            diff = tensor_difference(got, expected, rtol=rtol, atol=1e-12)
            if diff:
                slips = mistakes.online_softmax(rows, k, v, scale, s["block_n"])
                return Verdict(ex, False, note + [where, diff, "hint: " + softmax_hint(got, slips, expected, kind,
                                                                                       rtol)])
            held.append(stream.peak_bytes)
        return Verdict(ex, True, note + [
            "O matches the fp64 oracle on random inputs and with every row's maximum in the last key tile",
            f"streamed: each key tile read once, one at a time, at most {max(held):,} B held at once (a quarter of "
            f"the block's score row is {stream.budget_bytes:,} B)"])

    def kernel(self, attend_block) -> Verdict:
        ex = "3. the fused kernel's inner loop, in Triton"
        fn, note = self._pick(attend_block, "attend_block")
        if not frame.is_interpreted(fn):
            return Verdict(ex, False, note + [
                f"attend_block is a {type(fn).__name__}, not a function Triton's interpreter runs: decorate it with "
                "@triton.jit after attnlab.exercises.setup() has run (it switches the interpreter on)"])
        s = KERNEL_SHAPE
        rtol = 1e-4
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(s["B"], s["H"], s["N"], s["D"], generator=g) for _ in range(3))
        for causal in (False, True):
            got, failed = _attempt(ex, lambda: frame.run_piece(fn, q, k, v, causal=causal, block_m=s["block_m"],
                                                               block_n=s["block_n"]))
            if failed:
                return failed
            expected = reference.attend(q, k, v, causal=causal)
            diff = tensor_difference(got, expected, rtol=rtol, atol=1e-5)
            if diff:
                slips = mistakes.kernel(q, k, v, causal, s["block_n"])
                return Verdict(ex, False, note + [
                    f"{'causal' if causal else 'non-causal'}, B={s['B']} H={s['H']} N={s['N']} D={s['D']}, "
                    f"BLOCK_M={s['block_m']} BLOCK_N={s['block_n']} (the last key tile holds "
                    f"{s['N'] % s['block_n']} keys), O[b, h, row, d]: query block = row // {s['block_m']}", diff,
                    "hint: " + kernel_hint(got, slips, expected, rtol)])
        return Verdict(ex, True, note + ["O matches the fp64 oracle, causal and not, with a ragged last tile, run in "
                                         "Triton's interpreter"])

    def causal(self, key_blocks, causal_flops_saved) -> Verdict:
        ex = "4. causal skipping"
        blocks_fn, note = self._pick(key_blocks, "key_blocks")
        flops_fn, _ = self._pick(causal_flops_saved, "causal_flops_saved")
        for N, bm, bn in CAUSAL_TILINGS:
            for m, live in live_blocks(N, bm, bn).items():
                got, failed = _attempt(ex, blocks_fn, m, N, bm, bn)
                if failed:
                    return failed
                wrong = key_blocks_hint(got, N, bm, bn, m, live)
                if wrong:
                    rows = f"rows {m * bm}–{min((m + 1) * bm, N) - 1}"
                    return Verdict(ex, False, note + [
                        f"key_blocks: N={N} BLOCK_M={bm} BLOCK_N={bn}, query block {m} ({rows}): yours {got!r}",
                        f"hint: {wrong}"])
        c = CAUSAL_FLOPS_CASE
        live = live_blocks(c["N"], c["BLOCK_M"], c["BLOCK_N"])
        tiles = len(live) * -(-c["N"] // c["BLOCK_N"])
        skipped = tiles - sum(len(b) for b in live.values())
        expected = c["B"] * c["H"] * skipped * 4 * c["BLOCK_M"] * c["BLOCK_N"] * c["D"]
        got, failed = _attempt(ex, flops_fn, *c.values())
        if failed:
            return failed
        full = SimpleNamespace(**c, causal=False)
        ideal = cost.flops(full) - cost.flops(SimpleNamespace(**c, causal=True))
        where = ", ".join(f"{k}={v}" for k, v in c.items())
        if got != expected:
            return Verdict(ex, False, note + [f"causal_flops_saved({where}): yours {fmt(got)}",
                                              "hint: " + flops_hint(got, c, ideal)])
        return Verdict(ex, True, note + [
            f"key blocks match the oracle's causal mask at {len(CAUSAL_TILINGS)} tilings; at {where} the skipped "
            f"tiles save {fmt(expected)} FLOPs, {skipped / tiles:.0%} of the non-causal tiles' work, against the "
            f"model's ideal 50 % ({fmt(ideal)}): the diagonal tiles are computed whole"])

    def ablation(self, no_softmax) -> Verdict:
        ex = "5. a legal ablation"
        fn, note = self._pick(no_softmax, "no_softmax")
        g = torch.Generator().manual_seed(1)
        B, H, N, D = (ABLATION_SHAPE[x] for x in "BHND")
        q, k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(3))
        got, failed = _attempt(ex, fn, q, k, v)
        if failed:
            return failed
        lines = list(note)
        diff = tensor_difference(got, reference.attend(q, k, v, ablation="no_softmax"), rtol=1e-4, atol=1e-3)
        if diff:
            lines += ["what it returns is not the ablated program's O (attnlab.reference.attend(..., "
                      f"ablation='no_softmax')): {diff}",
                      "hint: the ablated program is the materialised one with P = S in place of P = softmax(S), "
                      "returning O = P V, shape (B, H, N, D)"]
        times, failed = _attempt(ex, compiled_times, fn)
        if failed:
            return Verdict(ex, False, lines + failed.lines)
        base_ms, abl_ms = times
        said = ablation_note(base_ms, abl_ms)
        timed = (f"compiled and timed as the harness times a build (output consumed): materialised {base_ms:.3g} "
                 f"ms, yours {abl_ms:.3g} ms ({abl_ms / base_ms:.0%})")
        if DEAD in said:
            lines += [timed, f"attnlab.report.ablation_table flags it: \u201c{said}\u201d",
                      "hint: an ablation removes one stage, not the whole program: what the timer consumes must "
                      "depend on all the work that is left"]
        else:
            lines += [timed, "attnlab.report.ablation_table raises no dead-work flag"]
        return Verdict(ex, not diff and DEAD not in said, lines)

    def lies(self, lying_rows) -> Verdict:
        ex = "6. find the lie"
        answer, note = self._pick(lying_rows, "LYING_ROWS")
        if not isinstance(answer, dict):
            return Verdict(ex, False, note + [f"yours is a {type(answer).__name__}, expected a dict {{row: lie}} "
                                              f"with lies among {sorted(planted.LIES)}"])
        odd = {r: x for r, x in answer.items() if x not in planted.LIES}
        if odd:
            r, x = next(iter(odd.items()))
            return Verdict(ex, False, note + [f"row {r}: yours {x!r}, expected one of {sorted(planted.LIES)}"])
        shown = planted.table()
        extra = sorted(set(answer) - set(int(r) for r in shown.index))
        if extra:
            return Verdict(ex, False, note + [f"row {extra[0]}: the table has rows 0–{len(shown) - 1} only"])
        found = planted.found()
        for r in shown.index:
            y, e = answer.get(int(r)), found.get(int(r), (None, ""))[0]
            if y is not None and y != e:
                what = f"row {r} ({shown.loc[r, 'build']}, {'causal' if shown.loc[r, 'causal'] else 'non-causal'})"
                return Verdict(ex, False, note + [
                    f"{what}: yours says {y!r}, but the lab's {y} guard finds nothing wrong there",
                    f"hint: {LIE_HINTS[y]}"])
        missed = [lie for r, (lie, _) in sorted(found.items()) if answer.get(r) is None]
        if missed:
            return Verdict(ex, False, note + [
                f"yours names {len(found) - len(missed)} of the table's {len(found)} lying rows; a row yours leaves "
                f"out tells a {missed[0]} lie", f"hint: {LIE_HINTS[missed[0]]}"])
        return Verdict(ex, True, note + [f"row {r}: {lie}; the lab's guard says: {said}"
                                         for r, (lie, said) in sorted(found.items())])
