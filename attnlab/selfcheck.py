"""Does the harness measure what it says? Its GPU checks, in one command.

    python -m attnlab.selfcheck [--out FILE]

For a few cases of at least 1 ms on the GPU: measure() twice in one process (the spread between the two medians, and
each one's p80/p20), and two timings of the same call measure() times (attention plus the consumption step) by other
means: torch.cuda.Event pairs around single *eager* calls, the L2 flushed by writing 512 MiB before each, the median
of 50 (independent of do_bench and of the CUDA graph measure() replays); and triton.testing.do_bench on the eager
call. Before each case the build is compiled and then run for SETTLE_S on its own (a card at its
power cap settles to the clock this load gets: the first measure of a case just compiled can be 11 % faster than
its second), and nvidia-smi's clocks, power, temperature and clock-event reasons are read before and after it,
so a time that moved can be read against the card.

The event pairs time the GPU only if the whole call is queued before the GPU reaches the first event, so each timed
call follows a few untimed calls of its own (lead_calls: enough to cover several host issue times) that keep the GPU
busy while Python issues it, then the flush. Without that the pairs count the 0.08–0.33 ms the host spends issuing
a call: the harness reads 4–17 % below them (and within 1.5 % of do_bench but in one case). With an idle sleep
kernel holding the stream instead, the harness reads 4–12 % *above* them for the kernels at the card's power cap
(the clock recovers while the GPU idles), within 0.2 % for those that are not. For the same reason nothing waits for
the GPU between repetitions (syncing each one, the GPU's short idle while Python queues the next leaves the harness
5.6 % above the pairs in the power-capped causal case); the events are read once all have run (then within 2.7 % in
every case). A repetition whose first event had already fired when the call was queued is left out and counted.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys

import torch

CASES = [  # (build, B, H, N, D, causal): each takes ≥ 1 ms on a Hopper GPU, long beside any timer's own cost
    ("fused", 2, 32, 8192, 64, False),
    ("fused", 1, 16, 16384, 128, True),
    ("qk_softmax", 4, 16, 4096, 128, False),
    ("materialised", 8, 32, 2048, 64, False),
    ("sdpa_flash", 4, 32, 4096, 64, False),
]
SMALL = [  # (build, B, H, N, D, causal) where issuing a call from Python takes about as long as its kernels
    ("fused", 32, 16, 512, 128, False), ("materialised", 32, 32, 512, 64, False), ("sdpa_flash", 32, 32, 512, 64, False)]

AGREE = 0.03  # |harness − other timer| / other timer, for cases of 1 ms or more
REPEAT = 0.02  # |second − first| / first, the same case measured twice in one run
SETTLE_S = 1.0  # the case's own eager calls before it is measured, after its compile
LEAD_ISSUES = 4  # the untimed calls before each event-timed one cover this many times the call's host issue time


def verdict(harness_ms: float, again_ms: float, events_ms: float, do_bench_ms: float) -> dict:
    """The relative differences the self-check bounds, and whether all of them are within AGREE and REPEAT."""
    out = dict(vs_events=harness_ms / events_ms - 1, vs_do_bench=harness_ms / do_bench_ms - 1,
               repeat=again_ms / harness_ms - 1)
    out["ok"] = abs(out["vs_events"]) <= AGREE and abs(out["vs_do_bench"]) <= AGREE and abs(out["repeat"]) <= REPEAT
    # (a NaN, an event timer with too few covered repetitions, fails: no comparison with it holds)
    return out


CAPPED = "software power cap"  # attnlab.telemetry.REASONS[0x4]: the card lowers its clock to stay under its power limit


def failure_note(row: dict) -> str:
    """Why a failed case failed, as far as the card says. A repeat outside REPEAT at the power cap: the card then
    moves its clock to hold its power, and two measurements of the same call see different clocks (materialised,
    never at the cap, repeats within 0.04 %; the four cases at it within 0.4–2.9 %);
    mhz_1 and mhz_2 are the measurements' medians of LoadLog's 50 ms clock samples, a coarse view of it."""
    if row["ok"]:
        return ""
    notes = []
    if abs(row["repeat"]) > REPEAT and CAPPED in str(row.get("reasons", "")):
        notes.append(f"repeat {row['repeat']:+.1%} at the {CAPPED} (the two measurements' sampled SM clocks, "
                     f"medians of 50 ms samples, {row.get('mhz_1', float('nan')):.0f} and "
                     f"{row.get('mhz_2', float('nan')):.0f} MHz)")
    for key, name in (("vs_events", "event pairs"), ("vs_do_bench", "do_bench")):
        if not abs(row[key]) <= AGREE:
            notes.append(f"{row[key]:+.1%} against the {name}")
    return "; ".join(notes)


def summary(df) -> str:
    """The verdict line: passed, failed, and how many failures were a repeat at the power cap."""
    bad = df[~df.ok]
    capped = int(bad.note.str.contains(CAPPED, regex=False).sum()) if len(bad) else 0
    tail = (f" ({capped} of them a repeat at the {CAPPED}: the card's clock moved between two measurements of the "
            "same case; see note)") if capped else ""
    return f"selfcheck: {len(df) - len(bad)} passed, {len(bad)} failed{tail}"


def _eager_step(case):
    """The call measure() times, issued eagerly: attention on the case's inputs, then the consumption step."""
    from attnlab import builds, measure

    q, k, v = measure.make_inputs(case)
    b = builds.get(case.build)
    acc = torch.zeros((), dtype=torch.float32, device=case.device)
    return lambda: acc.add_(b.attend(q, k, v, causal=case.causal).sum(dtype=torch.float32))


def lead_calls(host_ms: float, call_ms: float) -> int:
    """Untimed calls to queue before each event-timed call: at least 2, and enough GPU time to cover LEAD_ISSUES
    host issue times (a call the host issues faster than the GPU runs it falls further behind with each one)."""
    if not (host_ms >= 0 and call_ms > 0):  # NaN too
        raise ValueError(f"host_ms must be >= 0 and call_ms > 0 (times in ms), got {host_ms!r} and {call_ms!r}")
    return max(2, math.ceil(LEAD_ISSUES * host_ms / call_ms))


def covered_median(times: list[float], covered: list[bool]) -> tuple[float, int]:
    """(median of the repetitions whose call was queued before the GPU reached its first event, how many were not);
    NaN when fewer than half were: then the pairs measured the host as much as the GPU."""
    kept = [t for t, c in zip(times, covered) if c]
    missed = len(times) - len(kept)
    return (statistics.median(kept) if len(kept) * 2 >= len(times) and kept else float("nan")), missed


def _event_median_ms(step, lead: int, reps: int = 50, cuda=torch.cuda) -> tuple[float, int]:
    """covered_median of `step` between two CUDA events, each call after `lead` untimed calls of its own (the GPU
    busy, at this load's clock, while the host issues the timed one) and an L2-flushing 512 MiB write."""
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(5):
        step()
    pairs, covered = [], []
    for _ in range(reps):  # no sync in the loop: an idle GPU between repetitions would run cooler and faster
        for _ in range(lead):
            step()
        flush.zero_()
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        covered.append(not start.query())  # still pending: the GPU was busy with the lead until all was queued
        pairs.append((start, end))
    pairs[-1][1].synchronize()
    return covered_median([start.elapsed_time(end) for start, end in pairs], covered)


def main(argv=None) -> int:
    from attnlab import args as cli

    ap = cli.Parser(prog="python -m attnlab.selfcheck", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, type=cli.out_file, help="write the rows as CSV here")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # --help (0) and usage errors (2), as a return code
        return int(e.code or 0)
    if not torch.cuda.is_available():
        print("attnlab selfcheck: error: needs a CUDA GPU", file=sys.stderr)
        return 2
    import pandas as pd
    import triton.testing

    from attnlab import measure
    from attnlab.ceilings import measure_ceilings
    from attnlab.telemetry import LoadLog

    ceilings = measure_ceilings(torch.device("cuda"), torch.bfloat16)
    rows = []
    with LoadLog("cuda") as load:  # each measurement's SM clock and clock-event reasons, as the sweep's rows have
        for name, B, H, N, D, causal in CASES:
            case = measure.Case(name, B, H, H, N, D, "bfloat16", causal, "cuda")
            step = _eager_step(case)
            step()  # compiles; the GPU idles meanwhile
            measure.spin_up(torch.device("cuda"), SETTLE_S, work=step, per_sync=4)  # at this load's clock
            before = _state()
            first, second = (measure.measure(case, ceilings=ceilings, load=load) for _ in range(2))
            ref, missed = _event_median_ms(step, lead_calls(first["host_ms"], first["ms"]))
            bench = statistics.median(triton.testing.do_bench(step, warmup=25, rep=100, return_mode="all"))
            row = dict(build=name, B=B, H=H, N=N, D=D, causal=causal, harness_ms=first["ms"], again_ms=second["ms"],
                       events_ms=ref, do_bench_ms=bench, spread_1=first["ms_p80"] / first["ms_p20"],
                       spread_2=second["ms_p80"] / second["ms_p20"], host_ms=first["host_ms"],
                       events_uncovered=missed, mhz_1=first.get("sm_clock_mhz"), mhz_2=second.get("sm_clock_mhz"),
                       reasons=" + ".join(sorted({r for m in (first, second) for r in
                                                  str(m.get("clock_reasons") or "").split(" + ") if r})))
            row.update(verdict(first["ms"], second["ms"], ref, bench))
            row.update(timer=first["timer"], card_before=before, card_after=_state())
            row["note"] = failure_note(row)
            rows.append(row)
            print(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
            del step
    df = pd.DataFrame(rows)
    if args.out:
        df.to_csv(args.out, index=False)
    print(summary(df))
    for name, B, H, N, D, causal in SMALL:
        case = measure.Case(name, B, H, H, N, D, "bfloat16", causal, "cuda")
        row = measure.measure(case, ceilings=ceilings)
        eager = statistics.median(triton.testing.do_bench(_eager_step(case), return_mode="all"))
        print(f"small: {name} B={B} H={H} N={N} D={D}: harness ({row['timer']}) {row['ms']:.4f} ms, eager do_bench "
              f"{eager:.4f} ms, host issue {row['host_ms']:.4f} ms")
    return 1 if not df.ok.all() else 0


def _state() -> str:
    """SM/memory MHz, W, °C and clock-event reasons now, as one string."""
    from attnlab import provenance

    s = provenance.gpu_state("cuda")
    return " ".join(str(s.get(f)) for f in provenance.STATE_FIELDS) + (f" ({s['note']})" if s["note"] else "")


if __name__ == "__main__":
    sys.exit(main())
