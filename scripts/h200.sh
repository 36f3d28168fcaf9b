#!/usr/bin/env bash
# One device call that re-checks and re-measures what the open issues need on the H200 (about 10 minutes in all; the
# gate compiles our kernels afresh for nearly every case, 10–20 s a shape: run `STEPS="gate gate32"` as a second call
# when the first must leave room).
#   device run:  bash scripts/h200.sh                      (results under $OUT, or ./h200-out without the device tool)
#                STEPS="sweep gate32 bench16" bash scripts/h200.sh      (a subset, in that order)
# Steps, each under its own timeout so a slow one cannot take the others' results with it:
#   probe     one graph-timed case each of fused, flex, sdpa_cudnn, materialised (later steps skipped if it fails)
#   warm      python -m attnlab.warm: our builds once on each of the sweep's shapes in four processes, so that the
#             sweep after it compiles nothing (`attnlab run` does it on a GPU; session 17: 66-88 s)
#   labrun    attnlab run (what `make run` runs after its install step: gate, warm, sweep, report), timed end to end
#   sweep     attnlab sweep params/h200.yaml, timed (issue 3: the whole grid in ≤ 5 minutes; issue 4: attribution)
#   selfcheck python -m attnlab.selfcheck (issue 3: harness vs an independent event timer within 3 %, twice within 2 %)
#   gate      attnlab check at N = 512 (+ GQA, D = 80 and 256) for our builds and their ablations, bf16 and fp16
#   gate32    the same gate's fp32 shapes (the IEEE dot path)
#   bench16   attnlab bench --quick in fp16 for our fused and qk_softmax against sdpa_flash and sdpa_cudnn
#   bench     attnlab bench in bf16 and fp16 with the two untuned shapes: issue 5's benchmark, all six builds
#             (fused, qk_softmax, materialised, sdpa_flash, sdpa_cudnn, flex; BENCH_TIMEOUT, default 500 s)
#   ncu_profile  Nsight Compute's sections for scripts/experiments/ncu_cases.py's cases (qk_softmax's two kernels,
#             fused and cuDNN at small and large N) into ncu.csv (NCU_PROFILE_CASES, e.g. 1: those cases only)
#   stages    profiler stage times of materialised and qk_softmax (attnlab.kernels), and fused's refusal, at
#             N = 1024 (the one-pass P kernel) and 4096, D = 64 and 128, causal and not, bf16
#   gluoncheck  the Gluon kernel's own accuracy check (scripts/experiments/gluon_fa3.py --check-only: masks that hide
#             rows, N = 1 with a mask, both ablations, strided inputs, GQA, ragged N), beyond the gate's shapes
#             (FUSED_TILES: tile labels, default the table's Gluon kernels: 64x128w4s2hgmco, and config.SHORT's
#             64x64w4s2hgmcou (D = 128) and 64x128w4s2hgmcou (D = 64) at short causal N; the first two took 227 s in
#             session 10's call 4, the third 88 s in session 11's call 3)
#   ncu_source  Nsight Compute's stall samples per SASS instruction for NCU_CASES (default 0,2 of ncu_cases.py)
#   autotune  attnlab bench --autotune $TUNE_ARGS (TUNE_TIMEOUT, default 540 s)
#   fa3bench  fused's Gluon kernel against the table, cuDNN and FA2 (gluon_fa3.py --skip-check $FA3_ARGS)
#   maskab    v11: the check with the mask by TMA (Tiles.mask_tma), then the mask's cost with and without it
#   qkcheck   the qk_softmax Gluon kernel's own check (scripts/experiments/qk_gluon.py --check-only) in eight processes
#             at once (QK_CHECK_TILES, else QK_TILES: tile labels, default the table's 64x128w4s3hg; QK_CHECK_ARGS
#             e.g. "--check-ns 1001,2999 --check-variants 0,1"; QK_CHECK_TIMEOUT, default 280 s)
#   qkbench   its timing against the Triton kernel at N = 1024 and 4096 (QK_TILES; QK_NS other N, QK_ARGS e.g.
#             "--ds 128 --causal 0"), compiled first in four processes
#   qkrepeat  the qk_softmax build timed in rounds in one process (scripts/experiments/qk_repeat.py; QKREP_ARGS)
#   power     each build replayed back to back for POWER_SECONDS (default 4) while the clock is sampled
#             (scripts/experiments/power_probe.py: median clock, power and clock-event reasons per build; session 15)
#   pvcheck   the Gluon PV kernel's own check (scripts/experiments/pv_gluon.py --check-only) in eight processes at once
#             (PV_TILES: tile labels, default 64x128w4s3hg,64x128w4s2hg,64x128w4s2hgu; PV_CHECK_ARGS e.g. "--ds 64":
#             the head dims checked)
#   pvbench   the PV kernel alone and the qk_softmax build with each PV candidate against the Triton PV kernel
#             (PV_TILES; PV_ARGS e.g. "--ns 4096 --ds 128")
#   pvgate    the gate (as `gate`) for the builds that read P, with the first of PV_TILES as every 16-bit D = 64 and
#             128 PV entry (an autotune-style tiles file, attnlab.triton.config.load_overrides)
#   pvab      the table's Gluon PV entry against the Triton one in one call: qk_softmax and materialised, bf16,
#             --repeats 3, at PVAB_NS (default 1024,4096,16384), as the table has it, with the Triton PV entry forced by
#             an override file, then as the table has it again (the keys without a Gluon entry are the run's control);
#             PVAB_RUNS picks the runs, in order, from table, triton, table2 and interim (session 16's interim PV
#             entries: scripts/experiments/pv_s16_interim.json, the Gluon PV kernel at every key from N = 5793)
#             and pre52 (the PV entries v52 replaced: scripts/experiments/pv_pre_v52.json)
#   qkprobe   the P kernel alone at N = 4096 non-causal, D = 128 and 64, as it is and with pass 1 changed
#             (scripts/experiments/qk_exp_probe.py: none, pass1 = exponentials as FMAs, ref1 = no running max,
#             ref1-fake = both; session 12's call 1)
#   energy    each build and each part replayed with NVML's energy counter read around it: mJ a call, W, MHz
#             (scripts/experiments/energy_probe.py; ENERGY_ARGS; session 19, PERFORMANCE.md v35)
#   penergy   the qk_softmax P kernel's energy a call with the table's tiles and with candidates (scripts/experiments/
#             p_energy.py; PENERGY_ARGS, e.g. "--ds 64 --tiles 64x128w4s3grcf"; session 23, PERFORMANCE.md Next 12)
#   qkab      v42's table entries against the ones they replaced, in one call: qk_softmax, --repeats 3, as the table
#             has it, with scripts/experiments/qk_pre_v42.json in front (session 23's qk_softmax tiles), then as the
#             table has it again; QKAB_RUNS (default "table pre table2"), QKAB_NS (default 2048,4096,8192,16384),
#             QKAB_DTYPES (default bfloat16,float16); PERFORMANCE.md Next 13
#   raggedgate  the gate (as `gate`) at N = 1001 and 2999 (N % 8 ≠ 0; with the grid's GQA shapes, N = 1001 and 2999
#             among them) for the builds that write or read P and their ablations (v54: the Gluon P and PV kernels
#             there since P's rows start on lines)
#   raggedab  the qk_softmax and materialised builds at RAGGED_NS (default 2999,3000,3001), bf16 and fp16, --repeats 2,
#             as the table has it, then with every 16-bit D = 64 and 128 qk_softmax and PV entry forced to the key's
#             Triton one (what ran at N % 8 ≠ 0 before v54), then as the table has it again
#   waves     the grid's last wave (scripts/experiments/waves.py; WAVES_ARGS): each kernel of qk_softmax and fused at
#             the bench's heads and at 33/32 of them, a whole number of rounds on 132 SMs (PERFORMANCE.md v57)
#   klines    each of qk_softmax's kernels at every bench N and (D, causal), bf16, and a line fixed + slope·N per
#             kernel: which one holds the build's fixed part (scripts/experiments/kernel_lines.py; KLINES_ARGS)
#   pair      the qk_softmax build, its parts and cuBLAS's QKᵀ-then-PV pair over the issue's floor at every cell of the
#             bench (scripts/experiments/pair_probe.py; PAIR_ARGS; session 20, PERFORMANCE.md v37)
set -u
out=${OUT:-h200-out}
mkdir -p "$out"
# the caller's PYTHONPATH kept after ours: wheels installed for the report (plotly) into a --target dir (session 18's
# labrun lost its report to this line's old form, which replaced it)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OURS=materialised,qk_softmax,fused,fused-no_softmax,fused-no_pv,fused-zero_mask,qk_softmax-no_pv,materialised-no_pv,qk_softmax-zero_mask,qk_softmax-no_softmax
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv

probe() {
  timeout 60 python3 - <<'PY'
import torch
from attnlab import measure, model
ceil = model.measure_ceilings(torch.device("cuda"), torch.bfloat16)
for b in ("fused", "flex", "sdpa_cudnn", "materialised"):
    r = measure.measure(measure.Case(b, 16, 16, 16, 1024, 128, "bfloat16", False, "cuda"), ceilings=ceil)
    print(b, r["status"][:80], r["timer"], f"ms={r['ms']:.4f} host_ms={r['host_ms']:.4f} consume_ms={r['consume_ms']:.4f}",
          r["timing_note"][:200], f"err={r['err']:.2e}")
    assert r["status"] == "ok"
PY
}
warm() {
  local start=$(date +%s)
  timeout ${WARM_TIMEOUT:-300} python3 -m attnlab.warm --params params/h200.yaml --jobs 4 > "$out/warm.log" 2>&1
  echo "warm rc=$? wall=$(( $(date +%s) - start )) s"; grep -a "^warm\|failed" "$out/warm.log" | head -12
}
labrun() {
  # `attnlab run` as `make run` runs it (the device has no network for make's pip step): the gate in cli.gate_jobs()
  # processes (8 on the H200 machine's 16 cores), the warm step, the sweep of params/h200.yaml, its report; timed end
  # to end (on a fresh machine: Next 3, Next 21)
  local start=$(date +%s)
  timeout ${RUN_TIMEOUT:-590} python3 -m attnlab.cli run --out "$out/run" > "$out/run.log" 2>&1
  echo "labrun rc=$? wall=$(( $(date +%s) - start )) s"; grep -a "^attnlab\|^gate:" "$out/run.log" | tail -8
}
sweep() {
  local start=$(date +%s)
  timeout ${SWEEP_TIMEOUT:-330} python3 -m attnlab.cli sweep --params params/h200.yaml --out "$out/sweep" --quiet > "$out/sweep.log" 2>&1
  echo "sweep rc=$? wall=$(( $(date +%s) - start )) s"; tail -2 "$out/sweep.log"
}
selfcheck() {
  timeout 120 python3 -m attnlab.selfcheck --out "$out/selfcheck.csv" > "$out/selfcheck.log" 2>&1
  echo "selfcheck rc=$?"; tail -10 "$out/selfcheck.log"
}
gate() {
  # --jobs shares its shapes among processes so that several compile at once: 47 s in four (session 7, call 1),
  # against 135–179 s in one (session 6, calls 1 and 3); as many as `attnlab run`'s gate takes (cli.gate_jobs: one a
  # pair of cores, 4 to 8), whole (dtype, D, causal) families to each (gate.deal)
  timeout 300 python3 -m attnlab.cli check --ns 512 --dtypes bfloat16,float16 --builds $OURS \
    --jobs "$(python3 -c 'from attnlab.cli import gate_jobs; print(gate_jobs())')" \
    --out "$out/gate.csv" > "$out/gate.log" 2>&1
  echo "gate rc=$?"; tail -12 "$out/gate.log"
}
gate32() {
  timeout 60 python3 -m attnlab.cli check --ns 512 --dtypes float32 --builds $OURS --jobs 2 \
    --out "$out/gate32.csv" > "$out/gate32.log" 2>&1
  echo "gate32 rc=$?"; tail -12 "$out/gate32.log"
}
bench16() {
  timeout 150 python3 -m attnlab.cli bench --quick --dtypes float16 --builds fused,qk_softmax,sdpa_flash,sdpa_cudnn \
    --out "$out/bench16" > "$out/bench16.log" 2>&1
  echo "bench16 rc=$?"; tail -30 "$out/bench16.log"
}
autotune() {
  # attnlab bench --autotune (attnlab.autotune): TUNE_ARGS e.g. "--kernels fused --candidates 128x64w8s3h,..."
  timeout ${TUNE_TIMEOUT:-540} python3 -m attnlab.cli bench --autotune --dtypes bfloat16 --out "$out/autotune" \
    ${TUNE_ARGS:-} > "$out/autotune.log" 2>&1
  echo "autotune rc=$?"; grep -av Warning "$out/autotune.log" | tail -60
}
bench() {
  # all six builds of issue 5 (attnlab bench's default --builds); bench.csv is rewritten after every shape, so a
  # timeout keeps the rows measured
  # BENCH_ARGS: more arguments, e.g. "--repeats 3 --dtypes bfloat16" (three graphs a case: about 3× the time, so one
  # dtype a call)
  timeout ${BENCH_TIMEOUT:-500} python3 -m attnlab.cli bench --dtypes bfloat16,float16 ${BENCH_ARGS:-} \
    --out "$out/bench" > "$out/bench.log" 2>&1
  echo "bench rc=$?"; grep -v Warning "$out/bench.log" | grep -v "^  " | tail -75
}
gluoncheck() {
  timeout 330 python3 scripts/experiments/gluon_fa3.py --check-only \
    --check-tiles "${FUSED_TILES:-64x128w4s2hgmco,64x64w4s2hgmcou,64x128w4s2hgmcou}" \
    > "$out/gluoncheck.log" 2>&1
  echo "gluoncheck rc=$?"; grep -a "^check" "$out/gluoncheck.log" | grep -a "BAD\|bad\|wall" | cut -c1-300
}
fa3bench() {
  timeout 300 python3 scripts/experiments/gluon_fa3.py --skip-check ${FA3_ARGS:-} > "$out/fa3bench.log" 2>&1
  echo "fa3bench rc=$?"; grep -av Warning "$out/fa3bench.log" | tail -60
}
maskab() {
  timeout 420 python3 scripts/experiments/gluon_fa3.py --check-tiles 64x128w4s2hgm --mask-ab > "$out/maskab.log" 2>&1
  echo "maskab rc=$?"; grep -a -v "^check ok" "$out/maskab.log" | grep -av Warning | tail -20
}
qkcheck() {
  local start=$(date +%s) k
  for k in 0 1 2 3 4 5 6 7; do
    timeout ${QK_CHECK_TIMEOUT:-280} python3 scripts/experiments/qk_gluon.py --check-only ${QK_CHECK_ARGS:-} \
      --check-tiles "${QK_CHECK_TILES:-${QK_TILES:-64x128w4s3hg}}" \
      --part $k/8 > "$out/qkcheck$k.log" 2>&1 &
  done
  wait
  cat "$out"/qkcheck?.log > "$out/qkcheck.log" && rm "$out"/qkcheck?.log  # few files: a call brings back only so many
  echo "qkcheck wall=$(( $(date +%s) - start )) s"
  grep -a "^check" "$out/qkcheck.log" | grep -av "^check ok" | cut -c1-300
}
qkbench() {
  local k args="--skip-check --ns ${QK_NS:-1024,4096} ${QK_ARGS:-} --tiles ${QK_TILES:-64x128w4s3hg}"
  for k in 0 1 2 3; do
    timeout 280 python3 scripts/experiments/qk_gluon.py $args --warm --part $k/4 > /dev/null 2>&1 &
  done
  wait
  timeout 200 python3 scripts/experiments/qk_gluon.py $args > "$out/qkbench.log" 2>&1
  echo "qkbench rc=$?"; grep -av Warning "$out/qkbench.log" | tail -40
}
ncu_bin() {  # Nsight Compute: on the PATH, else where the CUDA image installs it (empty if neither)
  command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true
}
ncu_profile() {
  # Nsight Compute on one call of each case in scripts/experiments/ncu_cases.py (clocks left alone: METHOD.md)
  local ncu=$(ncu_bin)
  timeout 400 "${ncu:-ncu}" --profile-from-start off --clock-control none --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section LaunchStats --csv --page details \
    python3 scripts/experiments/ncu_cases.py ${NCU_PROFILE_CASES:-} > "$out/ncu.csv" 2> "$out/ncu.err"
  echo "ncu rc=$?"; grep -a "^case\|==ERR\|==WARN" "$out/ncu.csv" "$out/ncu.err" | head -20; wc -l "$out/ncu.csv"
}
ncu_source() {
  # where the warps wait: per-kernel stall reasons (raw page) and stall samples per SASS instruction (source page)
  # for NCU_CASES of ncu_cases.py (default 0,2: the qk_softmax P kernel at D = 128 N = 4096, fused at D = 128
  # N = 512 causal, then their PV kernel and nothing else)
  local ncu=$(ncu_bin)
  timeout 240 "${ncu:-ncu}" --profile-from-start off --clock-control none --section WarpStateStats \
    --section SourceCounters -f -o "$out/src" python3 scripts/experiments/ncu_cases.py ${NCU_CASES:-0,2} \
    > "$out/ncu_source.log" 2>&1
  echo "ncu_source rc=$?"; grep -a "^case\|==ERR" "$out/ncu_source.log" | head
  "${ncu:-ncu}" -i "$out/src.ncu-rep" --page raw --csv > "$out/ncu_raw.csv" 2>&1; echo "raw rc=$?"
  "${ncu:-ncu}" -i "$out/src.ncu-rep" --page source --print-source sass --csv > "$out/ncu_sass.csv" 2>&1
  echo "sass rc=$?"; wc -c "$out"/ncu_*.csv "$out/src.ncu-rep"; gzip -f "$out/ncu_sass.csv"; rm -f "$out/src.ncu-rep"
}
power() {
  (cd scripts/experiments && timeout 150 python3 power_probe.py --seconds ${POWER_SECONDS:-4}) > "$out/power.log" 2>&1
  echo "power rc=$?"; grep -a "^power" "$out/power.log"
}
energy() {
  (cd scripts/experiments && timeout ${ENERGY_TIMEOUT:-240} python3 energy_probe.py ${ENERGY_ARGS:-}) \
    > "$out/energy.log" 2>&1
  echo "energy rc=$?"; grep -av '^{' "$out/energy.log" | tail -20
}
penergy() {
  (cd scripts/experiments && timeout ${PENERGY_TIMEOUT:-240} python3 p_energy.py ${PENERGY_ARGS:-}) \
    > "$out/p_energy.log" 2>&1
  echo "penergy rc=$?"; grep -av '^{' "$out/p_energy.log" | tail -20
}
pair() {
  (cd scripts/experiments && timeout ${PAIR_TIMEOUT:-540} python3 pair_probe.py ${PAIR_ARGS:-}) > "$out/pair.log" 2>&1
  echo "pair rc=$?"; grep -a "^summary\|^ceilings\|Error\|^wall" "$out/pair.log"
}
qkprobe() {
  local d f
  for d in 128 64; do
    for f in none pass1 ref1 ref1-fake; do  # compiled at once, timed one after another (the script's file lock)
      timeout 280 python3 scripts/experiments/qk_exp_probe.py --d $d --fake $f >> "$out/qkprobe.log" 2>&1 &
    done
    wait
  done
  echo "qkprobe"; grep -a "^probe\|Error" "$out/qkprobe.log"
}
qkrepeat() {
  timeout 300 python3 scripts/experiments/qk_repeat.py ${QKREP_ARGS:-} > "$out/qkrepeat.log" 2>&1
  echo "qkrepeat rc=$?"; grep -av Warning "$out/qkrepeat.log" | tail -70
}
pvcheck() {
  local start=$(date +%s) k
  for k in 0 1 2 3 4 5 6 7; do
    timeout 240 python3 scripts/experiments/pv_gluon.py --check-only --tiles "${PV_TILES:-64x128w4s3hg,64x128w4s2hg,64x128w4s2hgu}" \
      --part $k/8 ${PV_CHECK_ARGS:-} > "$out/pvcheck$k.log" 2>&1 &
  done
  wait
  cat "$out"/pvcheck?.log > "$out/pvcheck.log" && rm "$out"/pvcheck?.log
  echo "pvcheck wall=$(( $(date +%s) - start )) s"
  grep -a "^check:\|BAD\|Error" "$out/pvcheck.log" | cut -c1-300 | head -40
}
pvbench() {
  timeout ${PVBENCH_TIMEOUT:-280} python3 scripts/experiments/pv_gluon.py --skip-check \
    --tiles "${PV_TILES:-64x128w4s3hg,64x128w4s2hg,64x128w4s2hgu}" ${PV_ARGS:-} > "$out/pvbench.log" 2>&1
  echo "pvbench rc=$?"; grep -a "^time\|^ceil\|Error" "$out/pvbench.log" | tail -150
}
pv_override() {
  # an autotune-style tiles file (attnlab.triton.config.load_overrides) on stdout: every 16-bit D = 64 and 128 entry
  # of the kernels $2 (default pv; e.g. qk_softmax,pv) set to the tiles of label $1, or with $1 = triton to each
  # key's Triton table entry
  python3 - "$1" "${2:-pv}" <<'PY'
import json, sys
from attnlab.triton import config
from attnlab.triton.resources import parse_tiles

def tiles(kernel, d, c):
    if sys.argv[1] == "triton":
        return config.lookup(kernel, "sm90", d, c, 2, gluon=False)
    return parse_tiles(sys.argv[1])

print(json.dumps([dict(kernel=kn, family="sm90", D=f"={d}", causal=c, itemsize=2, tiles=tiles(kn, d, c).as_dict())
                  for kn in sys.argv[2].split(",") for d in (64, 128) for c in (False, True)]))
PY
}
pvgate() {
  local labels=${PV_TILES:-64x128w4s3hg}
  pv_override "${labels%%,*}" > "$out/pv_tiles.json"
  timeout 300 python3 -m attnlab.cli check --ns 512,1000 --dtypes bfloat16,float16 --tiles "$out/pv_tiles.json" \
    --builds materialised,qk_softmax,qk_softmax-no_pv,materialised-no_pv --jobs 4 --out "$out/pvgate.csv" \
    > "$out/pvgate.log" 2>&1
  echo "pvgate rc=$?"; tail -12 "$out/pvgate.log"
}
ab_run() {
  # one run of an A/B step: attnlab bench $4 with the tiles file $5 in front of the table (none where empty), into
  # $out/$1_$2, under a timeout of $3 s; prints the summary's per-dtype ratio rows and its ≤ 1.25 count
  timeout $3 python3 -m attnlab.cli bench $4 ${5:+--tiles $5} --out "$out/$1_$2" > "$out/$1_$2.log" 2>&1
  echo "$1 $2 rc=$?"; grep -a "^| bfloat16\|^| float16\|≤ 1.25" "$out/$1_$2.log"
}
pvab() {
  pv_override triton > "$out/pv_triton.json"
  local run tiles args="--quick --builds qk_softmax,materialised --dtypes bfloat16 --repeats 3 --ns ${PVAB_NS:-1024,4096,16384}"
  for run in ${PVAB_RUNS:-table triton table2}; do
    case $run in triton) tiles=$out/pv_triton.json;; interim) tiles=scripts/experiments/pv_s16_interim.json;;
                 pre52) tiles=scripts/experiments/pv_pre_v52.json;; *) tiles="";; esac
    ab_run pvab $run 180 "$args" "$tiles"
  done
}
raggedgate() {
  timeout ${RAGGED_GATE_TIMEOUT:-420} python3 -m attnlab.cli check --ns 1001,2999 --dtypes bfloat16,float16 --jobs 8 \
    --builds materialised,qk_softmax,qk_softmax-no_pv,materialised-no_pv,qk_softmax-zero_mask,qk_softmax-no_softmax \
    --out "$out/raggedgate.csv" > "$out/raggedgate.log" 2>&1
  echo "raggedgate rc=$?"; tail -10 "$out/raggedgate.log"
}
raggedab() {
  pv_override triton qk_softmax,pv > "$out/pre_v54.json"
  local run tiles args="--quick --builds qk_softmax,materialised --dtypes bfloat16,float16 --repeats 2"
  for run in ${RAGGED_RUNS:-table pre table2}; do
    tiles=""; [ "$run" = pre ] && tiles=$out/pre_v54.json
    ab_run raggedab $run ${RAGGED_AB_TIMEOUT:-200} "$args --ns ${RAGGED_NS:-2999,3000,3001}" "$tiles"
    grep -a "N=[0-9]* B=" "$out/raggedab_$run.log"  # its N are all "shapes nobody tunes for" lines
  done
  return 0  # each run's rc is printed above; the greps' find nothing is no failure
}
qkab() {
  local run tiles args="--quick --builds qk_softmax --dtypes ${QKAB_DTYPES:-bfloat16,float16} --repeats 3"
  for run in ${QKAB_RUNS:-table pre table2}; do
    tiles=""; [ "$run" = pre ] && tiles=scripts/experiments/qk_pre_v42.json
    ab_run qkab $run 240 "$args --ns ${QKAB_NS:-2048,4096,8192,16384}" "$tiles"
  done
}
stages() {
  timeout ${STAGES_TIMEOUT:-240} python3 - > "$out/stages.log" 2>&1 <<'PY'
import torch
from attnlab import kernels, measure
for N, D, causal in ((n, d, c) for n in (1024, 4096) for d in (64, 128) for c in (False, True)):
    q, k, v = measure.make_inputs(measure.Case("fused", 16384 // N, 2048 // D, 2048 // D, N, D, "bfloat16", causal, "cuda"))
    for build in ("materialised", "qk_softmax", "fused"):
        ms = kernels.kernel_times(build, q, k, v, causal=causal)
        try:
            print(f"N={N} D={D} causal={causal} {build}"); print(kernels.stage_table(ms, build).round(4).to_string(index=False))
        except ValueError as e:  # StagesNotSeparable (fused) or a kernel the table does not know
            print(f"N={N} D={D} causal={causal} {build}: {sum(ms.values()):.4f} ms in {sorted(ms)}; {e}")
PY
  echo "stages rc=$?"; tail -60 "$out/stages.log"
}
waves() {
  timeout ${WAVES_TIMEOUT:-300} python3 scripts/experiments/waves.py --out "$out/waves.csv" ${WAVES_ARGS:-} \
    > "$out/waves.log" 2>&1
  echo "waves rc=$?"; grep -v Warning "$out/waves.log" | tail -40
}
klines() {
  timeout ${KLINES_TIMEOUT:-300} python3 scripts/experiments/kernel_lines.py --out "$out/kernel_lines.csv" \
    ${KLINES_ARGS:-} > "$out/kernel_lines.log" 2>&1
  echo "klines rc=$?"; grep -v Warning "$out/kernel_lines.log" | tail -30
}
bundle() {
  bash scripts/bundle.sh "$out"  # more than the device tool's 8 files back as one bundle.tar
}
for step in ${STEPS:-probe sweep selfcheck gate gate32}; do
  $step || { echo "$step failed: later steps skipped"; bundle; exit 1; }
done
bundle
