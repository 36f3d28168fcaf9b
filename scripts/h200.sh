#!/usr/bin/env bash
# One device call that re-checks and re-measures what the open issues still need on the H200 (about 9 minutes).
#   device run:  bash scripts/h200.sh            (results under $OUT, or ./h200-out without the device tool)
# Steps, each under its own timeout so a slow one cannot take the others' results with it:
#   1. attnlab sweep params/h200.yaml, timed (issue 3: the whole grid in ≤ 5 minutes; issue 4: causal attribution)
#   2. python -m attnlab.selfcheck (issue 3: harness vs an independent event timer within 3 %, twice within 2 %)
#   3. attnlab check on the shapes the last gate did not reach (D = 80 and 256, fp32) and flex
set -u
out=${OUT:-h200-out}
mkdir -p "$out/sweep"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
start=$(date +%s)
timeout 330 python3 -m attnlab.cli sweep --params params/h200.yaml --out "$out/sweep" --quiet > "$out/sweep.log" 2>&1
echo "sweep rc=$? wall=$(( $(date +%s) - start )) s"; tail -2 "$out/sweep.log"
timeout 120 python3 -m attnlab.selfcheck --out "$out/selfcheck.csv" > "$out/selfcheck.log" 2>&1
echo "selfcheck rc=$?"; tail -7 "$out/selfcheck.log"
timeout 90 python3 -m attnlab.cli check --ns 512 --builds materialised,qk_softmax,fused,fused-zero_mask,flex \
  --out "$out/gate.csv" > "$out/gate.log" 2>&1
echo "gate rc=$?"; tail -8 "$out/gate.log"
