#!/usr/bin/env bash
# bash scripts/bundle.sh DIR: the device tool returns at most 8 files, at most 2 folders down; more than that under
# DIR goes back as one DIR/bundle.tar (tar xf bundle.tar here), so that no step's files are left behind. Used by
# scripts/h200.sh and scripts/experiments/ref_regs_call.sh.
dir=$1
n=$(find "$dir" -type f | wc -l) deep=$(find "$dir" -mindepth 4 -type f | wc -l)
if [ "$n" -gt 8 ] || [ "$deep" -gt 0 ]; then
  tmp=$(mktemp /tmp/bundle.XXXXXX.tar)
  tar cf "$tmp" -C "$dir" . && find "$dir" -mindepth 1 -delete && mv "$tmp" "$dir/bundle.tar"
  echo "bundle: $n files in $dir/bundle.tar"
fi
