#!/usr/bin/env bash
# The README's test command (the one `.ci/run` runs) beside CPU-burning processes, two per
# core, so that anyone can check that the suite passes on a busy machine. Bounded in time;
# the burners are killed on any exit. Usage:
#   tests/under_load.sh                      # the README's test command
#   tests/under_load.sh pytest -q tests/x.py # any other command, beside the same burners
# STOKER_BURNERS (default: 2 per core) and STOKER_LOAD_TIMEOUT (seconds, default 3600).
set -euo pipefail
cd "$(dirname "$0")/.."
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
burners=${STOKER_BURNERS:-$((2 * cores))}
limit=${STOKER_LOAD_TIMEOUT:-3600}
if [ "$#" -gt 0 ]; then
    cmd=$(printf '%q ' "$@")
else
    cmd=$(awk '/^```bash$/{n++; next} /^```$/{next} n==2{print; exit}' README.md)
fi

pids=()  # the burners, then the command's timeout (it passes a TERM on to the command)
stop() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for _ in $(seq "$burners"); do
    # A plain busy loop in a shell of its own: nothing it could leave behind.
    bash -c 'while :; do :; done' &
    pids+=("$!")
done
echo "+ $cmd   (beside $burners CPU burners on $cores cores, at most ${limit}s)"
start=$(date +%s)
status=0
# In the background, so that a signal to this script runs its trap at once (bash runs
# traps only between commands, and `wait` is one it interrupts).
timeout --kill-after=30 "$limit" bash -c "$cmd" &
pids+=("$!")
wait "$!" || status=$?
echo "under load: exit status $status after $(($(date +%s) - start))s"
exit "$status"
