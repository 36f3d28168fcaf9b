#!/usr/bin/env bash
# PERFORMANCE.md v41: one device call for the pass-1-ahead P kernel (attnlab.triton.qk_softmax_ahead). From the
# repository root:  bash scripts/experiments/qk_ahead_call.sh   (results under $OUT, else ./h200-out)
#   1. a smoke test (one small case, P against torch's softmax) under a short timeout: a kernel that deadlocks stops
#      the call here;
#   2. qk_gluon.py's check of the default variant in eight processes, beside warm-up compiles of every timed variant;
#   3. the timing, one process a (variant, D): the build with the table's tiles (`current`) and with the candidates.
# AHEAD_NS (default 2048,4096,16384) and AHEAD_VARIANTS (default below: name:settings, settings comma-separated) set
# what is timed.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
out=${OUT:-./h200-out}
mkdir -p "$out"
cd scripts/experiments
ns=${AHEAD_NS:-2048,4096,16384}
variants=${AHEAD_VARIANTS:-"B: A:IN_FLIGHT=1"}
start=$(date +%s)
timeout 150 python3 - > "$out/smoke.log" 2>&1 <<'EOF'
import math, torch
from attnlab.triton import launch
from attnlab.triton.resources import parse_tiles
for D, label in ((64, "64x128w4s2gcj"), (128, "64x128w4s2gcj")):
    for N in (1024, 1000):
        q, k, v = (torch.randn(2, 4, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        c = launch._prepare(q, k, v, False, None, None, None)
        p = torch.full((2, 4, N, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        launch.write_p(c, p, parse_tiles(label))
        torch.cuda.synchronize()
        ref = torch.softmax(q.float() @ k.float().transpose(-1, -2) / math.sqrt(D), -1)
        print(f"smoke D={D} N={N} {label} max_err={(p.float() - ref).abs().max().item():.3g} "
              f"nan={p.isnan().sum().item()}", flush=True)
EOF
echo "smoke rc=$? wall=$(( $(date +%s) - start )) s"; cat "$out/smoke.log" | grep -a "smoke\|Error" | head
grep -q "smoke D=128 N=1000" "$out/smoke.log" || exit 1
for k in 0 1 2 3 4 5 6 7; do
  timeout 300 python3 qk_ahead.py -- --check-only --check-tiles 64x128w4s2gcj,64x64w4s3gcj --part $k/8 > "$out/check$k.log" 2>&1 &
done
for v in $variants; do
  settings=$(echo "${v#*:}" | tr ',' ' ')
  for D in 64 128; do
    tiles=current,64x128w4s2gcj,64x64w4s3gcj; [ $D = 64 ] && tiles=current,64x128w4s3gcj,64x64w4s3gcj
    timeout 300 python3 qk_ahead.py $settings -- --skip-check --warm --ns $ns --ds $D --causal 0 --tiles $tiles \
      > /dev/null 2>&1 &
  done
done
wait
cat "$out"/check?.log > "$out/check.log" && rm "$out"/check?.log
echo "check+warm wall=$(( $(date +%s) - start )) s"; grep -a "^check" "$out/check.log" | grep -av "^check ok" | cut -c1-300
for v in $variants; do
  name=${v%%:*}; settings=$(echo "${v#*:}" | tr ',' ' ')
  for D in 64 128; do
    tiles=current,64x128w4s2gcj,64x64w4s3gcj; [ $D = 64 ] && tiles=current,64x128w4s3gcj,64x64w4s3gcj
    timeout 120 python3 qk_ahead.py $settings -- --skip-check --ns $ns --ds $D --causal 0 --tiles $tiles \
      > "$out/bench_${name}_$D.log" 2>&1
    echo "bench $name D=$D rc=$? wall=$(( $(date +%s) - start )) s"
    grep -a "^variant\|^$D " "$out/bench_${name}_$D.log" | grep -v " pv " | cut -c1-120
  done
done
