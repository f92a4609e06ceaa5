#!/usr/bin/env bash
# A/B of the overload scenario (sim engine, 8 workers, 4x capacity): main (A) against the owner
# branch (B), alternated ABBAAB (or SIDES; WORKERS, 8 by default) in one run on one machine.
# Usage: ab.sh A_CHECKOUT B_CHECKOUT [OUT_DIR]
set -u
A=${1:-/work/main}; B=${2:-/work/wt/owner}
OUT=${3:-$(cd "$(dirname "$0")" && pwd)}
PY=/work/main/.venv/bin/python
ARGS=(overload --workers ${WORKERS:-8} --factor 4 --duration 20 --capacity-seconds 10 --quiet)
{ lscpu | grep "Model name"; nproc; } > "$OUT/machine.txt"
i=${START:-0}  # the first run's number minus one (to add runs to an earlier set)
for side in ${SIDES:-A B B A A B}; do
  i=$((i + 1))
  dir=$([ "$side" = A ] && echo "$A" || echo "$B")
  echo "run $i side $side ($dir) load before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/runs.log"
  (cd "$dir" && PYTHONPATH="$dir" "$PY" -m loadtest.scenarios "${ARGS[@]}" --out "$OUT/run$i-$side.json" \
     --log-dir "$(mktemp -d)") > "$OUT/run$i-$side.txt" 2>&1
  echo "run $i side $side rc $? load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/runs.log"
done
"$PY" "$(dirname "$0")/summarize.py" "$OUT" | tee "$OUT/summary.txt"
