#!/usr/bin/env bash
# A/B of the overload scenario (sim engine, 8 workers, 4x capacity): main before issue 49 (A, b5f89ff) against main after it (B)
# alternated ABBAAB in one run on one machine. Usage: ab.sh MAIN_CHECKOUT BRANCH_CHECKOUT
set -u
A=${1:-/work/wt/before}; B=${2:-/work/main}
OUT=$(cd "$(dirname "$0")" && pwd)
PY=/work/main/.venv/bin/python
ARGS=(overload --workers 8 --factor 4 --duration 20 --capacity-seconds 10 --quiet)
{ lscpu | grep "Model name"; nproc; } > "$OUT/machine.txt"
i=0
for side in A B B A A B; do
  i=$((i + 1))
  dir=$([ "$side" = A ] && echo "$A" || echo "$B")
  echo "run $i side $side ($dir) load before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/runs.log"
  (cd "$dir" && PYTHONPATH="$dir" "$PY" -m loadtest.scenarios "${ARGS[@]}" --out "$OUT/run$i-$side.json" \
     --log-dir "$(mktemp -d)") > "$OUT/run$i-$side.txt" 2>&1
  echo "run $i side $side rc $? load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/runs.log"
done
"$PY" "$OUT/summarize.py" "$OUT" | tee "$OUT/summary.txt"
