#!/usr/bin/env bash
# The fresh-machine check: clone a repository (this one by default) into an empty directory and run there exactly
# the commands of the README's "Two commands" block, `make run` and then `make test`, read from the README itself,
# so the check follows whatever the README tells a newcomer. Nothing of this machine's set-up leaks in: the clone
# has no .venv, and the variables that point Python elsewhere are unset. Fails if the README lacks either command,
# if either fails, or if `make run` leaves no rendered walkthrough.
#
#   bash scripts/fresh_machine.sh [REPO] [--then COMMAND]...
#       REPO: a path or URL git can clone (default: this repository's HEAD); each --then COMMAND runs in the clone
#       after the README's commands have passed (CI: --then "make test-system")
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
then=()
while [ $# -gt 0 ]; do
  case $1 in
    --then) [ $# -ge 2 ] || { echo "fresh_machine.sh: --then needs a command"; exit 2; }; then+=("$2"); shift 2 ;;
    *) src=$1; shift ;;
  esac
done
work=$(mktemp -d "${TMPDIR:-/tmp}/attnlab-fresh.XXXXXX")
git clone -q "$src" "$work/repo"
cd "$work/repo"
echo "fresh-machine check: $(git log -1 --format='%h %s' | cut -c1-100) in $work/repo"

# The commands: the first ```bash block after the heading "## Two commands", each line up to its comment.
mapfile -t commands < <(awk '/^## Two commands/ {h = 1} h && /^```bash/ {b = 1; next} b && /^```/ {exit}
                             b {sub(/[[:space:]]*#.*/, ""); if ($0 != "") print}' README.md)
for want in "make run" "make test"; do
  printf '%s\n' "${commands[@]}" | grep -qx "$want" || { echo "README's Two commands block lacks '$want'"; exit 1; }
done

unset PYTHONPATH PYTHONHOME VIRTUAL_ENV CONDA_PREFIX TRITON_INTERPRET
run() {
  echo "== $*"
  local start=$SECONDS
  "$@"
  echo "== $*: $((SECONDS - start)) s"
}
renders() { find outputs -name attention_lab.html 2>/dev/null | sort || true; }
before=$(renders)
run make run
html=$(comm -13 <(echo "$before") <(renders) | head -1)
[ -n "$html" ] || { echo "make run left no rendered walkthrough under outputs/"; exit 1; }
echo "make run rendered $html"
run make test
for command in "${then[@]}"; do
  # shellcheck disable=SC2086  # a command of words, e.g. "make test-system"
  run $command
done
echo "fresh-machine check passed"
