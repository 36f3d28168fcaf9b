"""The opt-in autotune sweep that chooses the sm90 rungs of attnlab.triton.plan's rules (`attnlab bench --autotune`).

For each kernel (fused, qk_softmax, pv), head dim D ∈ {64, 128} and causal or not, every candidate tile configuration
is timed at several N in FlashAttention's convention (B·N = 16384, H·D = 2048) with the benchmark's own timer
(attnlab.measure.time_case: do_bench's median over CUDA-graph replays). A candidate's score is the geometric mean over N
of its time over the best candidate's time at that N (1.0: best everywhere); the lowest score over the N at or above
plan.SHORT_N wins, so one configuration serves them all (a rule reads D, causal and dtype); the rules' choice
stays unless a candidate beats its score by more than TIE (noise) and is no slower than it, beyond TIE, at the
sweep's longest N. At the sweep's smallest N a different configuration gets a short-N entry only
where it beats that winner by more than SHORT_GAIN at each of them, up to a bound of its own (the case that needs
one: the persistent fused kernel under a causal mask at small N, where one consumer a program wins). A candidate
that fails at any N (out of shared memory, a compile error, a wrong answer) is out. When the winner is a Gluon
configuration, which compiles for D = 64 and 128 exactly, the best Triton one also gets an entry for the rest of D's
bucket (e.g. D = 65…127), as the rules have. Results: printed, and with --out written as autotune.csv (every candidate
at every N) and tiles.json (the winners, loadable with `--tiles` by bench and gate).
"""
from __future__ import annotations

import itertools
import math
import os

import torch

from attnlab.triton.config import Tiles
from attnlab.triton.resources import label

TUNE_NS = [512, 2048, 8192]  # the benchmark's range, evenly on a log scale


def candidates(kernel: str) -> list[Tiles]:
    """The explicit candidate lists, one family of candidates for each option of the kernels (docs/hopper.md says
    what each option does, docs/performance.md what each measured)."""
    base = [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 2)]
    narrow = [Tiles(128, 64, 4, 3), Tiles(128, 64, 8, 3), Tiles(64, 64, 4, 3), Tiles(128, 128, 8, 3),
              Tiles(64, 32, 4, 2), Tiles(128, 32, 4, 3)]
    if kernel == "pv":  # and its Gluon kernel: one item a program or persistent, 64- or 128-row
        # consumers, two consumers a program or one (two programs an SM), as many stages as fit at D = 128
        gluon = [(64, 128, 3, False), (64, 64, 6, False), (128, 64, 4, False), (64, 128, 2, True)]
        # and Oᵀ = Vᵀ Pᵀ, persistent (the table's entries at D = 64 non-causal, and at D = 128 and, heavy rows
        # first, under a causal mask)
        return narrow + [Tiles(m, n, 4, s, heavy_first=h, gluon=True, persistent=c, one_consumer=u)
                         for m, n, s, u in gluon for h in (False, True) for c in (False, True)] + [
            Tiles(128, 64, 4, 4, heavy_first=h, gluon=True, persistent=True, o_transposed=True) for h in (False, True)]
    if kernel == "qk_softmax":  # its Gluon kernel, 2 or 3 stages of the K ring, two consumers a program or one
        # (two programs an SM; at D = 128 only 2 stages leave room for the second), one item a program or
        # persistent; and one pass with the row on chip (short N only, see pick; 4 stages of 64×128 fit a
        # 1024-key row at D = 64 only, 4 of 64×64 at D = 128 too)
        two_pass = [Tiles(64, 128, 4, s, heavy_first=h, gluon=True, persistent=c, one_consumer=u)
                    for s in (2, 3) for h in (False, True) for c in (False, True) for u in (False, True)]
        # pass 1 against a fixed reference with Q in registers (the table's entries at D = 64 non-causal and
        # D = 128 causal), two consumers, 3 stages
        two_pass += [Tiles(64, 128, 4, 3, heavy_first=h, gluon=True, q_registers=True, persistent=c,
                           fixed_reference=True) for h in (False, True) for c in (False, True)]
        return narrow + two_pass + [Tiles(64, n, 4, s, heavy_first=h, gluon=True, one_pass=True)
                                    for n, s in ((128, 2), (128, 4), (64, 4)) for h in (False, True)]
    if kernel != "fused":
        raise ValueError(f"autotune: kernel must be one of fused, qk_softmax, pv; got {kernel!r}")
    wide = [Tiles(*b) for b in base]
    wide += [Tiles(128, 32, 4, 3), Tiles(64, 32, 4, 2), Tiles(128, 128, 4, 3)]
    wide += [Tiles(*b, heavy_first=True) for b in base[:4]]  # launch order: heaviest blocks first
    # paired rows: two row blocks per program sharing K/V, one's softmax overlapping the other's PV
    wide += [Tiles(128, 64, 8, 3, paired=True),
             Tiles(64, 64, 4, 3, paired=True), Tiles(128, 64, 8, 3, heavy_first=True, paired=True)]
    # the warp-specialised Gluon kernel, its mask by TMA (it changes nothing without a mask, and the zero_mask
    # ablation should run the kernel the build does), one item a program, persistent, persistent with O by TMA.
    # 16-bit only: launch.fused refuses it for fp32 with one error, recorded as a failed candidate.
    gluon = [dict(BLOCK_M=64, BLOCK_N=128, num_stages=s) for s in (2, 3)] + [dict(BLOCK_M=64, BLOCK_N=64,
                                                                                  num_stages=3)]
    wide += [Tiles(**g, heavy_first=h, gluon=True, mask_tma=True, persistent=c, o_tma=o)
             for g in gluon for h in (False, True) for c, o in ((False, False), (True, False), (True, True))]
    # one consumer a program, two programs an SM: 64×64 tiles, 2 stages, the size at which two fit with a mask;
    # one program an item, or persistent with O by TMA (under a causal mask with heavy_first, in pair order)
    wide += [Tiles(64, 64, 4, 2, heavy_first=h, gluon=True, mask_tma=True, persistent=c, o_tma=c, one_consumer=True)
             for h in (False, True) for c in (False, True)]
    # causal, one consumer, persistent in pair order, wider or deeper at D = 64 (compiled offline: no spills,
    # 64–112 KiB, so two fit an SM with any mask). At D = 128 they need more than half an SM.
    wide += [Tiles(64, n, 4, s, heavy_first=True, gluon=True, mask_tma=True, persistent=True, o_tma=True,
                   one_consumer=True) for n, s in ((128, 2), (64, 3))]
    return wide


TIE = 0.01  # scores closer than this are noise (repeat runs of one candidate differ by about as much)
SHORT_GAIN = 0.05  # a short-N entry must beat the long-sequence entry there by more than this (N = 512 noise: ±3 %)


def _scores(r):
    """Each candidate's geometric mean over N of its time over the best candidate's there, best first; a candidate
    that failed at any N of `r` (ms = inf) scores inf and is left out."""
    rel = r["ms"] / r.groupby("N")["ms"].transform("min")
    score = r.assign(rel=rel).groupby("tiles", sort=False)["rel"].apply(
        lambda x: math.exp(sum(map(math.log, x)) / len(x)))
    return score[score < math.inf].sort_values(kind="stable")


def pick(results, family: str, itemsize: int, incumbent=None) -> list[dict]:
    """The entries (tiles.json's, plan.read_overrides') a results frame (columns kernel, D, causal, N, tiles: a
    Tiles, ms: inf when it failed) chooses: one per (kernel, D, causal), plus the best Triton one under a Gluon winner (see the module's text),
    scored over the N at or above plan.SHORT_N; then a short-N entry (`short`: True, `below`: its bound)
    where another candidate beats that winner by more than SHORT_GAIN at the smallest N (_short_entry).
    `incumbent(kernel, D, causal, gluon, N)`: the rules' choice now (gluon=False: its Triton one; N: at that N, so
    a short one below its bound); it stays unless a candidate's score beats its own by more than TIE, so a re-run
    does not churn the rules on noise, or the candidate is slower than it by more than TIE at the longest N (_best).
    Each entry carries its score and its ms at every N."""
    from attnlab.triton.plan import SHORT_N

    def entry(kernel, D, causal, t, score, ms_by_n, short=False):
        return dict(kernel=kernel, family=family, D=f"={D}" if t.gluon else int(D), causal=bool(causal),
                    itemsize=itemsize, tiles=t.as_dict(), score=float(score[t]),
                    ms={int(n): float(ms) for n, ms in ms_by_n[t].items()}, **({"short": True} if short else {}))

    entries = []
    for (kernel, D, causal), r in results.groupby(["kernel", "D", "causal"], sort=True):
        ms_by_n = r.groupby("tiles", sort=False).apply(lambda g: dict(zip(g["N"].astype(int), g["ms"])))
        out = set(r.loc[r["ms"] == math.inf, "tiles"])  # failed at some N: out at every N
        r = r[~r["tiles"].isin(out)]
        # a one-pass candidate (Tiles.one_pass) runs its own kernel only where the row fits on chip (N ≤ ROW_MAX) and
        # the two-pass kernel beyond: it competes for the short-N entry alone
        long_rows = r[(r["N"] >= SHORT_N) & ~r["tiles"].map(lambda t: t.one_pass)]
        finite = _scores(long_rows if len(long_rows) else r)
        if finite.empty:
            continue
        now = (lambda gluon, n=None: incumbent(kernel, int(D), bool(causal), gluon, n)) if incumbent else (
            lambda gluon, n=None: None)
        longest = {t: ms_by_n[t][max(ms_by_n[t])] for t in finite.index}
        # a sweep without Gluon candidates speaks to the key's Triton entry only: that is its incumbent
        winners = [_best(finite, now(any(t.gluon for t in finite.index)), longest)]
        triton_ones = finite[[not t.gluon for t in finite.index]]
        if winners[0].gluon and len(triton_ones):
            winners.append(_best(triton_ones, now(False), longest))
        entries += [entry(kernel, D, causal, t, finite, ms_by_n) for t in winners]
        short = _short_entry(r[r["N"] < max(r["N"])], winners[0], ms_by_n, now)
        if short:
            fast, score, below = short
            entries.append(entry(kernel, D, causal, fast, score, ms_by_n, short=True) | {"below": below})
    return entries


def _best(score, keep, longest=None):
    """The best-scored candidate, or `keep` (the incumbent) when it scores within TIE of it, or when the best is
    slower than it by more than TIE at the sweep's longest N (`longest`: each candidate's ms there). The long entry
    is what long sequences run: a candidate that wins the score at short N only belongs in a short-N entry (the
    qk_softmax kernel with one consumer a program, 9 % faster at D = 128 causal N = 1024 and 4 % slower at 8192, wins
    the score)."""
    top = score.index[0]
    if keep not in score.index:
        return top
    if score[keep] <= score[top] * (1 + TIE):
        return keep
    return keep if longest is not None and longest[top] > longest[keep] * (1 + TIE) else top


def _short_entry(rows, winner, ms_by_n, now):
    """The short-N entry below a key's winner, or None: over the longest run of the frame's smallest N (never its
    largest: `rows` leaves it out) at each of which the best candidate there (scored over the run, the incumbent
    kept within TIE) beats the winner by more than SHORT_GAIN. Returns (candidate, its scores over the run, below),
    below = the geometric middle of the run's last N and the next N tuned (for a one-pass candidate at most
    qk_softmax_row.ROW_MAX + 1: past it the entry would run the two-pass kernel, which the run did not time there)."""
    ns = sorted(set(int(n) for n in rows["N"]))
    found = None
    for i, n in enumerate(ns):
        score = _scores(rows[rows["N"] <= n])
        if score.empty:
            break
        fast = _best(score, now(True, ns[0]))
        if not all(ms_by_n[winner][m] > ms_by_n[fast][m] * (1 + SHORT_GAIN) for m in ns[:i + 1]):
            break
        found = (fast, score, n)
    if found is None:
        return None
    fast, score, n = found
    after = min(int(m) for m in ms_by_n[winner] if m > n)
    below = round(math.sqrt(n * after))
    if fast.one_pass:
        from attnlab.triton.hopper.qk_softmax_row import ROW_MAX

        below = min(below, ROW_MAX + 1)
    return fast, score, below


def rotated(cands: list, case: int) -> list:
    """The candidates in the order case number `case` times them: the list turned by one place a case, so that no
    candidate is always timed first or last. The card's clock drifts under its power cap while a case's candidates
    run back to back; in a fixed order the last ones (the Gluon candidates, listed after the Triton ones) always ran
    at the end of that drift (the same Gluon PV kernel came out 1–3 % ahead of the Triton one at D = 128 causal,
    N ≥ 8192, in one sweep and 4–5 % behind it, timed last, in the next)."""
    k = case % len(cands) if cands else 0
    return cands[k:] + cands[:k]


def run(kernels: list[str], dtype: torch.dtype, ns: list[int], out: str | None = None,
        only: list[Tiles] | None = None) -> list[dict]:
    """Time the candidates (or `only` these) of each kernel on the GPU; returns pick()'s entries. A failure is a
    row with ms = inf and its reason, never the end of the sweep; autotune.csv is rewritten after every case."""
    import json

    import pandas as pd

    from attnlab.measure import TOKENS, WIDTH, bench_case, make_inputs, oracle_check, spin_up, time_case
    from attnlab.triton import config, plan

    # the build each kernel is timed in: pv in the qk_softmax build it serves, not under qk_softmax-no_softmax, whose
    # P kernel is cheaper (a sweep timed that way disagreed with a build-level comparison at D = 64 and under a
    # causal mask)
    timed_in = {"fused": "fused", "qk_softmax": "qk_softmax", "pv": "qk_softmax"}
    rows = []
    dev = torch.device("cuda")
    spin_up(dev, 1.0)
    for kernel in kernels:
        build = timed_in[kernel]
        cands = only if only is not None else candidates(kernel)
        for case, (D, causal, N) in enumerate(itertools.product((64, 128), (False, True), ns)):
            q, k, v = make_inputs(bench_case(build, TOKENS // N, WIDTH // D, N, D, dtype, causal))
            first = len(rows)
            for t in rotated(cands, case):
                if t.heavy_first and not causal:  # every block does the same work: the order cannot matter
                    continue
                with plan.forced(kernel, t):
                    timed = time_case(build, q, k, v, causal)
                ok = timed["status"] == "ok"
                if ok and not oracle_check(build, timed["o"], q, k, v, causal).ok:
                    ok, timed["status"] = False, "inaccurate"
                del timed["o"]
                rows.append(dict(kernel=kernel, D=D, causal=causal, N=N, tiles=t, label=label(t),
                                 ms=timed["ms"] if ok else math.inf, status=timed["status"]))
            del q, k, v
            torch.cuda.empty_cache()
            done = pd.DataFrame(rows[first:])
            fastest = done.sort_values("ms").head(3)
            print(f"  {kernel} D={D} causal={causal} N={N}: " + "; ".join(
                f"{r.label} {r.ms:.4f}" for r in fastest.itertuples()), flush=True)
            if out:
                pd.DataFrame(rows).drop(columns="tiles").to_csv(os.path.join(out, "autotune.csv"), index=False)
    fam = config.family(dev)
    entries = pick(pd.DataFrame(rows), fam, dtype.itemsize,
                   lambda kernel, D, causal, gluon, n: plan.lookup(kernel, fam, D, causal, dtype.itemsize, gluon, n))
    for e in entries:
        which = f"Gluon, D = {e['D'][1:]} exactly" if isinstance(e["D"], str) else f"D's bucket {e['D']}"
        if e.get("short"):
            which += f", N < {e['below']}"
        print(f"  {e['kernel']} ({which}) causal={e['causal']}: {label(Tiles(**e['tiles']))} score "
              f"{e['score']:.3f} ms " + " ".join(f"N={n}:{ms:.4f}" for n, ms in e["ms"].items()), flush=True)
    if out:
        with open(os.path.join(out, "tiles.json"), "w") as f:
            json.dump([{k: v for k, v in e.items() if k not in ("score", "ms")} for e in entries], f, indent=1)
    return entries
