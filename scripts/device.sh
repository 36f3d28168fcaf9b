#!/usr/bin/env bash
# The lab's named steps on a GPU machine, run in the order STEPS gives, each under its own timeout:
#
#   STEPS="gate bench" bash scripts/device.sh      (default STEPS=run; results under $OUT, else ./device-out)
#
# Steps:
#   run        attnlab run: the walkthrough rendered with the params named for this GPU (RUN_ARGS: more arguments, e.g.
#              --params FILE): the gate, the sweep, every section, the notebook and its HTML (run/)
#   gate       attnlab check on its whole grid (bf16 and fp16, GQA, D = 80 and 256, fp32) in gate.default_jobs()
#              processes (gate.csv), then at N = 1001 and 2999 for the builds that write or read P (gate_ragged.csv)
#   bench      attnlab bench --dtypes bfloat16,float16 (bench/bench.csv, bench/ratios.csv; BENCH_ARGS: more arguments)
#   selfcheck  python -m attnlab.selfcheck: the harness against an independent timer (selfcheck.csv)
#   autotune   attnlab bench --autotune (autotune/autotune.csv, autotune/tiles.json; AUTOTUNE_ARGS: more arguments)
#   model      a whole transformers model's forward per build (MODEL_PARAMS, default params/model/h200.yaml): the sweep
#              (python -m attnlab.model_sweep), then notebooks/model_forward.ipynb rendered over its rows
#              (python -m attnlab.model_lab), all in model/; needs transformers, which the GPU image has
#   train      training: every build with a backward timed forward, backward and both (TRAIN_PARAMS, default the
#              file params/training/ names for this GPU): the sweep (python -m attnlab.train_sweep), then
#              notebooks/training.ipynb rendered over its rows (attnlab train), all in train/
#   pages      every walkthrough of record measured on this card (outputs/*/*/ whose provenance.json names this GPU)
#              rendered again from its own rows, with today's notebook and package: its results.csv, gate.csv,
#              provenance.json and params.yaml copied to pages/<folder>/, then `attnlab run --params` its
#              params.yaml there (nothing left to measure, so only the page, the profiler section and the traces
#              are made again); one log a folder, page_<folder>.log
#
# ATTNLAB_COMMIT: the commit the caller sent (the copy's own .git names the last one landed), written into every
# provenance.json. Each step's output goes to $OUT/<step>.log; <STEP>_TIMEOUT overrides its timeout in seconds (RUN_TIMEOUT=540). A
# step that fails or times out stops the ones after it, and the script exits with its status. Wheels in .whl/ (the
# machine has no network: ../shared/gpu/wheels.sh fetches them) are installed into /tmp/site first; plotly among
# them lets `run` write its figures. The device tool brings back at most 8 files, at most 2 folders down under $OUT:
# when there are more, they go back packed in $OUT/bundle.tgz (tar xzf it), compressed: a file over 16 MiB would not
# come back, and two rendered pages (plotly inline in each HTML) are about 23 MiB as they lie, 7 MiB compressed.
set -u
cd "$(dirname "$0")/.." || exit 1
STEP_NAMES="run gate bench selfcheck autotune model train pages"
P_BUILDS=materialised,qk_softmax,qk_softmax-no_pv,materialised-no_pv,qk_softmax-zero_mask,qk_softmax-no_softmax

steps=${STEPS:-run}
for s in $steps; do
  case " $STEP_NAMES " in
    *" $s "*) ;;
    *) echo "device.sh: unknown step '$s' in STEPS; the steps are: $STEP_NAMES" >&2; exit 2 ;;
  esac
done
out=${OUT:-device-out}
mkdir -p "$out" || exit 1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "device.sh: installing the wheels in .whl/ failed" >&2; exit 1; }
  # papermill and nbconvert's executables, and nbconvert's HTML templates (share/jupyter), come with the wheels
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH JUPYTER_PATH=/tmp/site/share/jupyter
fi
# this checkout's attnlab first, the caller's path (and the wheels) after it; output as it is printed
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if command -v nvidia-smi > /dev/null; then  # the card and its state, for the record of the call
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
fi

step() {  # step NAME SECONDS COMMAND...: COMMAND under a timeout, its output in $out/NAME.log, then its tail
  local name=$1 limit=$2 start=$SECONDS rc
  shift 2
  timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc, $(( SECONDS - start )) s$( [ "$rc" = 124 ] && echo ", timed out at $limit s")"
  grep -av Warning "$out/$name.log" | tail -n 20
  return "$rc"
}
run() {
  # shellcheck disable=SC2086  # RUN_ARGS: words, e.g. "--params params/h200.yaml --timeout 300"
  step run "${RUN_TIMEOUT:-590}" python3 -m attnlab.cli run ${RUN_ARGS:-} --out "$out/run"
}
gate() {
  local jobs
  jobs=$(python3 -c 'from attnlab.gate import default_jobs; print(default_jobs())') || return
  step gate "${GATE_TIMEOUT:-300}" python3 -m attnlab.cli check --jobs "$jobs" --out "$out/gate.csv" || return
  step gate_ragged "${GATE_TIMEOUT:-300}" python3 -m attnlab.cli check --ns 1001,2999 --dtypes bfloat16,float16 \
    --builds "$P_BUILDS" --jobs "$jobs" --out "$out/gate_ragged.csv"
}
bench() {
  # shellcheck disable=SC2086  # BENCH_ARGS: words, e.g. "--repeats 3 --dtypes bfloat16"
  step bench "${BENCH_TIMEOUT:-560}" python3 -m attnlab.cli bench --dtypes bfloat16,float16 ${BENCH_ARGS:-} \
    --out "$out/bench"
}
selfcheck() {
  step selfcheck "${SELFCHECK_TIMEOUT:-120}" python3 -m attnlab.selfcheck --out "$out/selfcheck.csv"
}
autotune() {
  # shellcheck disable=SC2086  # AUTOTUNE_ARGS: words, e.g. "--kernels fused --candidates 128x64w8s3h,64x128w4s2hg"
  step autotune "${AUTOTUNE_TIMEOUT:-540}" python3 -m attnlab.cli bench --autotune ${AUTOTUNE_ARGS:-} \
    --out "$out/autotune"
}
model() {
  local params=${MODEL_PARAMS:-params/model/h200.yaml}
  step model "${MODEL_TIMEOUT:-470}" python3 -m attnlab.model_sweep --params "$params" --out "$out/model" || return
  step model_notebook "${MODEL_NOTEBOOK_TIMEOUT:-110}" python3 -m attnlab.model_lab --params "$params" \
    --out "$out/model"
}
train() {
  local params=${TRAIN_PARAMS:-}
  if [ -z "$params" ]; then  # the file attnlab train picks on this machine (params/training/<gpu>.yaml)
    params=$(python3 -c 'from attnlab import cli; print(cli.params_here(cli.PARAMS / "training")[0])') || return
  fi
  step train "${TRAIN_TIMEOUT:-540}" python3 -m attnlab.train_sweep --params "$params" --out "$out/train" || return
  step train_notebook "${TRAIN_NOTEBOOK_TIMEOUT:-120}" python3 -m attnlab.cli train --params "$params" \
    --out "$out/train"
}
pages() {
  local card src name dst rc=0
  card=$(python3 -c 'import torch; print(torch.cuda.get_device_name())') || return
  for src in outputs/*/*/; do
    src=${src%/}
    [ -f "$src/attention_lab.ipynb" ] && [ -f "$src/params.yaml" ] && [ -f "$src/results.csv" ] || continue
    [ "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["device"]["name"])' \
          "$src/provenance.json")" = "$card" ] || continue
    name=$(basename "$src")
    dst=$out/pages/$name
    mkdir -p "$dst" || return
    for f in results.csv gate.csv gate_ragged.csv provenance.json params.yaml; do
      [ -f "$src/$f" ] && cp "$src/$f" "$dst/"
    done
    step "page_$name" "${PAGES_TIMEOUT:-150}" python3 -m attnlab.cli run --params "$dst/params.yaml" --out "$dst" \
      || rc=$?
  done
  return "$rc"
}
bundle() {  # more than 8 files under $out, or any deeper than 2 folders: all of them in one $out/bundle.tgz
  local n deep tmp
  n=$(find "$out" -type f | wc -l)
  deep=$(find "$out" -mindepth 4 -type f | wc -l)
  if [ "$n" -gt 8 ] || [ "$deep" -gt 0 ]; then
    tmp=$(mktemp /tmp/device-bundle.XXXXXX.tgz)
    tar czf "$tmp" -C "$out" . && find "$out" -mindepth 1 -delete && mv "$tmp" "$out/bundle.tgz"
    echo "device.sh: $n files packed into $out/bundle.tgz"
  fi
}

rc=0
for s in $steps; do
  $s || { rc=$?; echo "device.sh: step $s failed (rc=$rc); the steps after it are skipped"; break; }
done
[ -n "${OUT:-}" ] && bundle  # only under the device tool, which sets OUT
exit "$rc"
