#!/usr/bin/env bash
# PERFORMANCE.md v42 (Next 12): one device call for the qk_softmax P kernel with pass 1 against a fixed reference and
# Q in registers together (Tiles.fixed_reference + Tiles.q_registers, labels ...rf / ...ruf), at all four
# (D, causal) combinations. From the repository root:  bash scripts/experiments/ref_regs_call.sh  (results under
# $OUT, else ./h200-out)
#   1. qk_gluon.py's check of the candidates in eight processes, beside warm-up compiles of every timed case;
#   2. REF_ROUNDS (default 3) rounds of the timing, one process a (D, causal) group, the candidates' order reversed
#      in every other round so that drift within a round does not read as a difference between kernels.
# REF_GROUPS replaces the groups below ("D causal tiles;..."); REF_NS (default 2048,4096,8192,16384) sets the N timed; REF_ROUNDS_FROM (default 1) the first round; REF_ONLY a
# (D, causal) group to time alone, as "64 1"; REF_WARM=0 leaves out the warm-up compiles (a check alone on the CPU
# cores); REF_CHECK_TILES the labels checked (default the three below), REF_CHECK_TIMEOUT each part's limit (330 s);
# REF_DEADLINE (default 540) the seconds after which no further timing process starts; REF_PARTS (default 8) the
# check's processes. Each check part keeps its own log (check0.log ...), so a part that runs out of time shows as the
# one without `check:`; more than eight files come back as bundle.tar.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
out=${OUT:-./h200-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # the rest runs in scripts/experiments
cd scripts/experiments
ns=${REF_NS:-2048,4096,8192,16384}
rounds=${REF_ROUNDS:-3}
first=${REF_ROUNDS_FROM:-1}
deadline=${REF_DEADLINE:-540}
# group: D causal tiles (the table's first as `current`)
groups=("64 0 current,64x128w4s3grcf" "128 0 current,64x128w4s3grf,64x128w4s3gf" "128 1 current,64x128w4s3hgrf"
        "64 1 current,64x128w4s3hgruf")
[ -n "${REF_GROUPS:-}" ] && IFS=';' read -ra groups <<< "$REF_GROUPS"  # e.g. "64 0 current,64x128w4s3grcf;128 1 ..."
start=$(date +%s)
parts=${REF_PARTS:-8}
for k in $(seq 0 $((parts - 1))); do
  timeout ${REF_CHECK_TIMEOUT:-330} python3 qk_gluon.py --check-only \
    --check-tiles ${REF_CHECK_TILES:-64x128w4s3grcf,64x128w4s3hgrf,64x128w4s3hgruf} \
    --part $k/$parts > "$out/check$k.log" 2>&1 &
done
[ "${REF_WARM:-1}" = 0 ] || for g in "${groups[@]}"; do
  set -- $g
  timeout 330 python3 qk_gluon.py --skip-check --warm --ns $ns --ds $1 --causal $2 --tiles $3 > /dev/null 2>&1 &
done
wait
echo "check+warm wall=$(( $(date +%s) - start )) s"
for k in $(seq 0 $((parts - 1))); do
  echo "part $k: $(grep -a '^check: ' "$out/check$k.log" || echo 'no summary (timed out?)')"
  grep -a "^check" "$out/check$k.log" | grep -av "^check ok\|^check: \|^check wall" | cut -c1-300
done
for r in $(seq $first $rounds); do
  for g in "${groups[@]}"; do
    set -- $g
    [ -n "${REF_ONLY:-}" ] && [ "${REF_ONLY:-}" != "$1 $2" ] && [ $r = $first ] && continue
    [ $(( $(date +%s) - start )) -gt $deadline ] && { echo "round $r D=$1 causal=$2: past the deadline"; continue; }
    tiles=$3
    [ $((r % 2)) = 0 ] && tiles=$(echo "$3" | tr ',' '\n' | tac | paste -sd,)
    timeout 150 python3 qk_gluon.py --skip-check --ns $ns --ds $1 --causal $2 --tiles $tiles \
      > "$out/time_r${r}_D$1_c$2.log" 2>&1
    echo "round $r D=$1 causal=$2 rc=$? wall=$(( $(date +%s) - start )) s"
  done
done
grep -ah "^[0-9]* [01] [0-9]* " "$out"/time_r*.log | grep -v " pv \| table " | sort -k1,1n -k2,2n -k3,3n -k4,4 | cut -c1-110
bash ../bundle.sh "$out"  # more than the device tool's 8 files back as one bundle.tar
