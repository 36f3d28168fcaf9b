"""Read `scripts/h200.sh ncu_source`'s per-instruction stall samples (ncu_sass.csv.gz): for one kernel of the report,
the stall reasons of the whole kernel, then of the instructions run once a tile, and per opcode there. Those are
picked by their execution count: the highest count that at least --min-instructions instructions share (the
consumers' loop bodies, about 2200 instructions in the qk_softmax P kernel; the loader's loop is a few dozen).

    python scripts/experiments/ncu_stalls.py outputs/h200/2026-12-01-s19-call1/ncu_sass.csv.gz \
        qk_softmax_gluon_kernel [--occurrence 1] [--executions 245760]

--occurrence picks the kernel's k-th profile in the report (0 first); --executions gives the loop's count by hand.
"""
import argparse
import collections
import csv
import gzip


def read(path, kernel, occurrence):
    """The rows (dicts by the CSV's header) of the `occurrence`-th profile of `kernel` in the report."""
    rows, header, seen, mine = [], None, -1, False
    with gzip.open(path, "rt") as f:
        for r in csv.reader(f):
            if r and r[0] == "Kernel Name":
                seen += r[1] == kernel
                mine, header = r[1] == kernel and seen == occurrence, None
            elif r and r[0] == "Address":
                header = r
            elif mine and header and r:
                rows.append(dict(zip(header, r)))
    if not rows:
        raise SystemExit(f"no profile {occurrence} of {kernel} in {path}")
    return rows, [h for h in header if h.startswith("stall_") and "Not Issued" not in h]


def opcode(source: str) -> str:
    words = source.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def shares(counter: collections.Counter, top: int) -> str:
    total = sum(counter.values()) or 1
    return ", ".join(f"{k.removeprefix('stall_')} {v / total:.2f}" for k, v in counter.most_common(top))


def loop_count(counts: collections.Counter, min_instructions: int) -> str:
    """The highest execution count that at least `min_instructions` instructions share."""
    common = [c for c, n in counts.items() if n >= min_instructions]
    if not common:
        raise SystemExit(f"no execution count is shared by {min_instructions} instructions: pass --executions")
    return max(common, key=int)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("kernel")
    ap.add_argument("--occurrence", type=int, default=0)
    ap.add_argument("--executions", default=None)
    ap.add_argument("--min-instructions", type=int, default=500)
    a = ap.parse_args()
    rows, stalls = read(a.report, a.kernel, a.occurrence)
    samples = lambda r: int(r["Warp Stall Sampling (All Samples)"] or 0)  # noqa: E731
    total = sum(map(samples, rows))
    every = collections.Counter()
    for r in rows:
        for s in stalls:
            every[s] += int(r[s] or 0)
    print(f"{a.kernel} #{a.occurrence}: {len(rows)} instructions, {total} samples; {shares(every, 6)}")
    counts = collections.Counter(r["Instructions Executed"] for r in rows if r["Instructions Executed"] != "0")
    loop = a.executions or loop_count(counts, a.min_instructions)
    body = [r for r in rows if r["Instructions Executed"] == loop]
    inside = sum(map(samples, body))
    print(f"executed {loop} times: {len(body)} instructions, {inside} samples ({inside / total:.2f} of all)")
    by_op, n_op = collections.defaultdict(collections.Counter), collections.Counter()
    for r in body:
        op = opcode(r["Source"])
        n_op[op] += 1
        for s in stalls:
            by_op[op][s] += int(r[s] or 0)
    for op in sorted(by_op, key=lambda o: -sum(by_op[o].values()))[:12]:
        got = sum(by_op[op].values())
        print(f"  {op:10s} {n_op[op]:4d} instructions {got / inside:.3f} of the loop's samples: {shares(by_op[op], 3)}")


if __name__ == "__main__":
    main()
