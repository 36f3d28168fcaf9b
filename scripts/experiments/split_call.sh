#!/usr/bin/env bash
# PERFORMANCE.md v53, one device call: the split-row P kernel's check (4 processes) beside the bench's warm-up
# (4 processes), then the timing (scripts/experiments/split_probe.py). SPLIT_TILES: labels to time (the first is
# checked); SPLIT_ARGS: more arguments for the timing (e.g. --ns 4096 --ds 128).
cd "$(dirname "$0")" && export PYTHONPATH="$PWD/../.."
out=${OUT:-./split-out}; mkdir -p "$out"
tiles=${SPLIT_TILES:-64x128w4s2gk,64x128w4s4gk}
start=$(date +%s)
for k in 0 1 2 3; do
  timeout 330 python3 split_probe.py --check-only --tiles "${tiles%%,*}" --part $k/4 > "$out/check$k.log" 2>&1 &
  timeout 330 python3 split_probe.py --skip-check --warm --tiles "$tiles" ${SPLIT_ARGS:-} --part $k/4 \
    > "$out/warm$k.log" 2>&1 &
done
wait
cat "$out"/check?.log > "$out/check.log" && rm "$out"/check?.log
cat "$out"/warm?.log > "$out/warm.log" && rm "$out"/warm?.log
echo "check and warm wall=$(( $(date +%s) - start )) s"
grep -a "^check" "$out/check.log" | grep -av "^check ok" | cut -c1-400
grep -av Warning "$out/warm.log" | grep -a . | tail -5 | cut -c1-300
timeout "${SPLIT_BENCH_TIMEOUT:-240}" python3 split_probe.py --skip-check --tiles "$tiles" ${SPLIT_ARGS:-} > "$out/bench.log" 2>&1
echo "bench rc=$? wall=$(( $(date +%s) - start )) s"
grep -av Warning "$out/bench.log" | cut -c1-200
