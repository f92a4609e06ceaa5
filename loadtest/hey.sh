#!/usr/bin/env bash
# hey checks for kokoro-fleet: a quick smoke and a saturation run, printing hey's status-code
# distribution. hey times each request to its last byte and folds fast 503s into its latency
# figures, and it cannot see time to first audio: use it for "does it answer, with which codes,
# how many per second", and `python -m loadtest` for TTFA, underrun and percentiles.
#
#   loadtest/hey.sh smoke     [URL]   # 20 requests, 2 at a time, every text set
#   loadtest/hey.sh saturate  [URL]   # 30 s at 64 concurrent (HEY_CONCURRENCY, HEY_DURATION)
#
# URL defaults to http://127.0.0.1:8880. Bodies: loadtest/bodies/<set>.json (pick with
# HEY_TEXTS=short|paragraphs|long, default: short for saturate, all for smoke).
# KOKORO_API_KEY, when set, is sent as a bearer token.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mode="${1:-smoke}"
base="${2:-${URL:-http://127.0.0.1:8880}}"
endpoint="${base%/}/v1/audio/speech"
timeout_s="${HEY_TIMEOUT:-120}"

if ! command -v hey >/dev/null 2>&1; then
  echo "hey.sh: hey is not installed (apt-get install hey, or go install github.com/rakyll/hey@latest)" >&2
  exit 2
fi

auth=()
if [[ -n "${KOKORO_API_KEY:-}" ]]; then
  auth=(-H "Authorization: Bearer ${KOKORO_API_KEY}")
fi

# run_hey NAME BODY_FILE HEY_ARGS...: run hey, keep its report, print the status codes
run_hey() {
  local name="$1" body="$2"
  shift 2
  local report
  report="$(mktemp)"
  echo "== ${name}: hey $* (body ${body#"${here}"/})"
  if ! hey "$@" -t "${timeout_s}" -m POST -T application/json -D "${body}" ${auth[@]+"${auth[@]}"} \
      "${endpoint}" >"${report}" 2>&1; then
    cat "${report}"
    rm -f "${report}"
    return 1
  fi
  # requests/s and the latency summary (time to the last byte, 503s included: see above)
  grep -E '^\s+(Total|Slowest|Fastest|Average|Requests/sec):' "${report}" || true
  echo "status codes:"
  # the block after "Status code distribution:" up to the next blank line; errors, if any, after it
  sed -n '/Status code distribution:/,/^$/p' "${report}" | tail -n +2 | sed '/^$/d'
  sed -n '/Error distribution:/,$p' "${report}"
  rm -f "${report}"
}

case "${mode}" in
  smoke)
    sets="${HEY_TEXTS:-short paragraphs long}"
    for set in ${sets}; do
      run_hey "smoke ${set}" "${here}/bodies/${set}.json" -n "${HEY_REQUESTS:-20}" -c "${HEY_CONCURRENCY:-2}"
    done
    ;;
  saturate)
    set="${HEY_TEXTS:-short}"
    run_hey "saturate ${set}" "${here}/bodies/${set}.json" -z "${HEY_DURATION:-30s}" -c "${HEY_CONCURRENCY:-64}"
    ;;
  *)
    echo "usage: $0 smoke|saturate [URL]" >&2
    exit 2
    ;;
esac
