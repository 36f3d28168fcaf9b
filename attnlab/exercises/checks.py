"""The checks of notebooks/exercises.ipynb: each takes the student's answer, runs it on inputs of its own, compares it
with the lab's own yardstick and returns a Verdict (attnlab.exercises.verdict) in seconds on a CPU.

    bytes           moved_and_held(build, B, H, N, D, dtype, causal)  against attnlab.model's bytes_moved, hold_bytes
    online_softmax  online_softmax(q, tiles, scale)                   against the fp64 oracle (attnlab.reference), on
                                                                      random inputs and on inputs whose row maximum
                                                                      sits in the last key tile
    kernel          attend_block, a @triton.jit piece                 inside attnlab.exercises.frame's kernel, in
                                                                      Triton's interpreter, against the oracle, causal
                                                                      and not, at N not a multiple of the block
    causal          key_blocks(m, N, BLOCK_M, BLOCK_N) and            against the blocks where the oracle's causal
                    causal_flops_saved(B, H, N, D, BLOCK_M, BLOCK_N)  mask leaves a live score
    ablation        no_softmax(q, k, v)                               against its oracle (ablation='no_softmax'), then
                                                                      compiled and timed beside its base, the times
                                                                      through attnlab.report.ablation_table's flag
    lies            {row: lie} for attnlab.exercises.planted.table()  against what the lab's guards find there

A student's function that raises gets a failing Verdict naming the error, never a traceback: papermill fails a whole
notebook on one error output. `Checks(solutions=True)` checks attnlab.exercises.solutions in place of the answers
handed in (the tests render the notebook both ways).
"""
from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import pandas as pd
import torch

from attnlab import model, reference
from attnlab.exercises import frame, planted
from attnlab.exercises.verdict import Verdict, fmt, sequence_difference, tensor_difference

# -- 1. bytes ------------------------------------------------------------------------------------------------------

# (build, B, H, N, D, dtype, causal): each build non-causal and causal, another dtype, and a row longer than the
# softmax kernel reads in one pass (attnlab.model.SOFTMAX_ROW_MAX)
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


def _units(diff: int, nn: int, o: int) -> str:
    """A byte difference in the sizes it is likely made of: N×N tensors (S or P), or Q-sized ones (Q, K, V, O)."""
    if diff and diff % (nn // 2) == 0:
        return f"{diff / nn:g} × one N×N tensor (S or P, {fmt(nn)} B)"
    if diff and diff % o == 0:
        return f"{diff // o} × one Q-sized tensor ({fmt(o)} B)"
    return "neither a multiple of half an N×N tensor nor of a Q-sized one"


# -- 2. the online softmax -----------------------------------------------------------------------------------------

SOFTMAX_SHAPE = dict(N=100, D=16, rows=(16, 32), block_n=32)  # one block of 16 rows; four key tiles, the last of 4


def key_tiles(k: torch.Tensor, v: torch.Tensor, block_n: int):
    """(k_tile, v_tile) pairs of up to block_n keys, in order: how a kernel streams K and V past a block of rows."""
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
    from attnlab.lies import timed_row

    case = SimpleNamespace(**ABLATION_SHAPE, Hkv=ABLATION_SHAPE["H"], dtype="float32", causal=False)
    rows = [timed_row("materialised", base_ms, case), timed_row("materialised-no_softmax", ablated_ms, case),
            timed_row("materialised-no_pv", base_ms, case), timed_row("materialised-zero_mask", base_ms, case)]
    return str(report.ablation_table(pd.DataFrame(rows), base="materialised")["note"].iloc[0])


# -- the checks ----------------------------------------------------------------------------------------------------


def _attempt(exercise: str, fn, *args):
    """(fn(*args), None), or (None, a failing Verdict naming what fn raised)."""
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 - the student's error is the answer to show, not to raise
        return None, Verdict(exercise, False, [f"your code raised {type(e).__name__}: {str(e).strip()[:400]}"])


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
        for build, B, H, N, D, dtype, causal in BYTES_CASES:
            got, failed = _attempt(ex, fn, build, B, H, N, D, dtype, causal)
            if failed:
                return failed
            case = SimpleNamespace(build=build, B=B, H=H, Hkv=H, N=N, D=D, dtype=dtype, causal=causal)
            expected = (model.bytes_moved(case), model.hold_bytes(case))
            where = f"{build}, B={B} H={H} N={N} D={D} {dtype} {'causal' if causal else 'non-causal'}"
            if not (isinstance(got, tuple) and len(got) == 2):
                return Verdict(ex, False, note + [f"{where}: yours returned {got!r}, expected a pair (moved, held)"])
            sz = model.sizes(case)
            for what, y, e in zip(("bytes moved", "bytes held"), got, expected):
                if y != e:
                    return Verdict(ex, False, note + [
                        f"first difference: {where}, {what}: yours {fmt(y)}, expected {fmt(e)} (attnlab.model)",
                        f"expected − yours = {fmt(e - y)} B = {_units(e - y, sz['Pb'], sz['qb'])}"])
        return Verdict(ex, True, note + [f"all {len(BYTES_CASES)} cases match attnlab.model.bytes_moved and "
                                         "hold_bytes"])

    def online_softmax(self, online_softmax) -> Verdict:
        ex = "2. the online softmax over key tiles"
        fn, note = self._pick(online_softmax, "online_softmax")
        s = SOFTMAX_SHAPE
        (r0, r1), scale = s["rows"], s["D"] ** -0.5
        for kind, label in (("random", "random inputs"),
                            ("last_tile", "inputs whose row maximum sits in the last key tile (scores near 1000)")):
            q, k, v = softmax_inputs(kind)
            expected = reference.attend(q[None, None], k[None, None], v[None, None], scale=scale)[0, 0, r0:r1]
            tiles = key_tiles(k.double(), v.double(), s["block_n"])
            got, failed = _attempt(ex, fn, q[r0:r1].double(), tiles, scale)
            if failed:
                return failed
            diff = tensor_difference(got, expected, rtol=1e-9, atol=1e-12)
            if diff:
                where = (f"on {label}: query rows {r0}–{r1 - 1} (q {r1 - r0}×{s['D']}), {s['N']} keys in tiles of "
                         f"{s['block_n']} (the last holding {s['N'] % s['block_n']}); O[i, d] is query row {r0} + i")
                return Verdict(ex, False, note + [where, diff])
        return Verdict(ex, True, note + ["O matches the fp64 oracle on random inputs and with every row's maximum in "
                                         "the last key tile"])

    def kernel(self, attend_block) -> Verdict:
        ex = "3. the fused kernel's inner loop, in Triton"
        fn, note = self._pick(attend_block, "attend_block")
        if not frame.is_interpreted(fn):
            return Verdict(ex, False, note + [
                f"attend_block is a {type(fn).__name__}, not a function Triton's interpreter runs: decorate it with "
                "@triton.jit after attnlab.exercises.setup() has run (it switches the interpreter on)"])
        s = KERNEL_SHAPE
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(s["B"], s["H"], s["N"], s["D"], generator=g) for _ in range(3))
        for causal in (False, True):
            got, failed = _attempt(ex, lambda: frame.run_piece(fn, q, k, v, causal=causal, block_m=s["block_m"],
                                                               block_n=s["block_n"]))
            if failed:
                return failed
            diff = tensor_difference(got, reference.attend(q, k, v, causal=causal), rtol=1e-4, atol=1e-5)
            if diff:
                return Verdict(ex, False, note + [
                    f"{'causal' if causal else 'non-causal'}, B={s['B']} H={s['H']} N={s['N']} D={s['D']}, "
                    f"BLOCK_M={s['block_m']} BLOCK_N={s['block_n']} (the last key tile holds "
                    f"{s['N'] % s['block_n']} keys), O[b, h, row, d]: query block = row // {s['block_m']}", diff])
        return Verdict(ex, True, note + ["O matches the fp64 oracle, causal and not, with a ragged last tile, run in "
                                         "Triton's interpreter"])

    def causal(self, key_blocks, causal_flops_saved) -> Verdict:
        ex = "4. causal skipping"
        blocks_fn, note = self._pick(key_blocks, "key_blocks")
        flops_fn, _ = self._pick(causal_flops_saved, "causal_flops_saved")
        for N, bm, bn in CAUSAL_TILINGS:
            for m, expected in live_blocks(N, bm, bn).items():
                got, failed = _attempt(ex, blocks_fn, m, N, bm, bn)
                if failed:
                    return failed
                diff = sequence_difference(got, expected)
                if diff:
                    rows = f"rows {m * bm}–{min((m + 1) * bm, N) - 1}"
                    return Verdict(ex, False, note + [
                        f"key_blocks: N={N} BLOCK_M={bm} BLOCK_N={bn}, query block {m} ({rows}): {diff}"])
        c = CAUSAL_FLOPS_CASE
        live = live_blocks(c["N"], c["BLOCK_M"], c["BLOCK_N"])
        tiles = len(live) * -(-c["N"] // c["BLOCK_N"])
        skipped = tiles - sum(len(b) for b in live.values())
        expected = c["B"] * c["H"] * skipped * 4 * c["BLOCK_M"] * c["BLOCK_N"] * c["D"]
        got, failed = _attempt(ex, flops_fn, *c.values())
        if failed:
            return failed
        full = SimpleNamespace(**c, causal=False)
        ideal = model.flops(full) - model.flops(SimpleNamespace(**c, causal=True))
        where = ", ".join(f"{k}={v}" for k, v in c.items())
        if got != expected:
            return Verdict(ex, False, note + [
                f"causal_flops_saved({where}): yours {fmt(got)}, expected {fmt(expected)}: {skipped} of {tiles} "
                f"tiles skipped per head, each 4·BLOCK_M·BLOCK_N·D FLOPs (the model's ideal half would be "
                f"{fmt(ideal)})"])
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
            lines.append("what it returns is not the ablated program's O (attnlab.reference.attend(..., "
                         f"ablation='no_softmax')): {diff}")
        times, failed = _attempt(ex, compiled_times, fn)
        if failed:
            return Verdict(ex, False, lines + failed.lines)
        base_ms, abl_ms = times
        said = ablation_note(base_ms, abl_ms)
        timed = (f"compiled and timed as the harness times a build (output consumed): materialised {base_ms:.3g} "
                 f"ms, yours {abl_ms:.3g} ms ({abl_ms / base_ms:.0%})")
        if DEAD in said:
            lines += [timed, f"attnlab.report.ablation_table flags it: \u201c{said}\u201d",
                      "expected: no such flag (an ablation removes one stage, not the whole program)"]
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
        found = planted.found()
        shown = planted.table()
        for r in shown.index:
            y, e = answer.get(int(r)), found.get(int(r), (None, ""))[0]
            if y != e:
                what = f"row {r} ({shown.loc[r, 'build']}, {'causal' if shown.loc[r, 'causal'] else 'non-causal'})"
                return Verdict(ex, False, note + [
                    f"first difference at {what}: yours {y!r}, expected {e!r}" + ("" if e else " (an honest row)")])
        extra = sorted(set(answer) - set(int(r) for r in shown.index))
        if extra:
            return Verdict(ex, False, note + [f"row {extra[0]}: the table has rows 0–{len(shown) - 1} only"])
        return Verdict(ex, True, note + [f"row {r}: {lie}; the lab's guard says: {said}"
                                         for r, (lie, said) in sorted(found.items())])
