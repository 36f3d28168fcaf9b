#!/usr/bin/env bash
# One device call that re-checks and re-measures what the open issues still need on the H200 (about 9 minutes).
#   device run:  bash scripts/h200.sh            (results under $OUT, or ./h200-out without the device tool)
# Steps, each under its own timeout so a slow one cannot take the others' results with it:
#   0. a probe: one graph-timed case each of fused, flex and sdpa_cudnn (the sweep is skipped if it fails)
#   1. attnlab sweep params/h200.yaml, timed (issue 3: the whole grid in ≤ 5 minutes; issue 4: attribution)
#   2. python -m attnlab.selfcheck (issue 3: harness vs an independent event timer within 3 %, twice within 2 %)
#   3. attnlab check at N = 512 (+ GQA, D = 80 and 256, fp32) for our builds and their ablations
set -u
out=${OUT:-h200-out}
mkdir -p "$out/sweep"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv
timeout 60 python3 - <<'PY' || { echo "probe failed: sweep skipped"; exit 1; }
import torch
from attnlab import measure, model
ceil = model.measure_ceilings(torch.device("cuda"), torch.bfloat16)
for b in ("fused", "flex", "sdpa_cudnn", "materialised"):
    r = measure.measure(measure.Case(b, 16, 16, 16, 1024, 128, "bfloat16", False, "cuda"), ceilings=ceil)
    print(b, r["status"][:80], r["timer"], f"ms={r['ms']:.4f} host_ms={r['host_ms']:.4f} consume_ms={r['consume_ms']:.4f}",
          r["timing_note"][:200], f"err={r['err']:.2e}")
    assert r["status"] == "ok"
PY
start=$(date +%s)
timeout 330 python3 -m attnlab.cli sweep --params params/h200.yaml --out "$out/sweep" --quiet > "$out/sweep.log" 2>&1
echo "sweep rc=$? wall=$(( $(date +%s) - start )) s"; tail -2 "$out/sweep.log"
timeout 120 python3 -m attnlab.selfcheck --out "$out/selfcheck.csv" > "$out/selfcheck.log" 2>&1
echo "selfcheck rc=$?"; tail -10 "$out/selfcheck.log"
timeout 110 python3 -m attnlab.cli check --ns 512 \
  --builds materialised,qk_softmax,fused,fused-no_softmax,fused-no_pv,fused-zero_mask,qk_softmax-no_pv,materialised-no_pv \
  --out "$out/gate.csv" > "$out/gate.log" 2>&1
echo "gate rc=$?"; tail -12 "$out/gate.log"
