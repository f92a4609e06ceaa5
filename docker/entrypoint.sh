#!/usr/bin/env bash
# kokoro-fleet's one entrypoint, the same in a container, on Modal and on a bare host:
#
#   docker/entrypoint.sh [extra `kokoro-fleet serve` flags, e.g. --workers 8 --limit-concurrency 40]
#
# 1. checks that the weights are ready, and stops at once with a message saying how to provide
#    them when they are not (an image must never fetch or convert weights at request time);
# 2. runs `kokoro-fleet serve` with the host, port, workers and limits from the environment (the
#    server starts its embedded redis-server itself unless REDIS_URL names an external one, and on
#    a GPU the CUDA MPS daemon as KOKORO_MPS allows, choosing its replicas from whether it runs:
#    api/gpu_sharing.py, the same on Modal and on a bare host);
# 3. on SIGTERM or SIGINT forwards SIGTERM to the server, which drains: requests in flight finish,
#    new ones get 503, for at most KOKORO_DRAIN_SECONDS; the script then exits with the server's
#    status (0 after a clean drain). A server still running a few seconds past the grace period is
#    killed, so a stuck drain cannot hold a container past its orchestrator's own deadline.
#
# Every variable is a setting documented by `kokoro-fleet settings` (api/settings.py).
set -Eeuo pipefail

log() { printf 'entrypoint: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 2
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The CLI: the one on PATH (images, an activated venv), else the checkout's .venv (`make install`).
if command -v kokoro-fleet >/dev/null 2>&1; then
    fleet=$(command -v kokoro-fleet)
elif [[ -x "$here/../.venv/bin/kokoro-fleet" ]]; then
    fleet="$here/../.venv/bin/kokoro-fleet"
else
    die "kokoro-fleet is not installed: run \`make install\` in the checkout, or \`pip install .\`"
fi

drain_seconds=${KOKORO_DRAIN_SECONDS:-30}
[[ $drain_seconds =~ ^[0-9]+([.][0-9]+)?$ ]] || die "KOKORO_DRAIN_SECONDS=$drain_seconds: expected a number of seconds"
# How long past the grace period the server may take to close its sockets and children.
kill_margin_seconds=5

# --- 1. weights -----------------------------------------------------------------------------------
python=$(dirname "$fleet")/python
[[ -x $python ]] || python=$(command -v python3)

# Reads `kokoro-fleet weights --json` (which only looks, never fetches or converts) and says
# whether the source in use is complete; never prepares anything itself.
weights_ready() {
    "$python" -c '
import json, sys
d = json.load(sys.stdin)
source = d.get("source")
if source == "offline":
    ok = d.get("ready") is True
elif source == "tiny":
    ok = True
else:
    ok = (d.get("config.json", "missing") != "missing" and d.get("kokoro-v1_0.pth", "missing") != "missing"
          and d.get("voice_count", 0) > 0)
print(source, d.get("cache") or d.get("path") or "")
sys.exit(0 if ok else 1)
'
}

check_weights() {
    local report summary errors
    errors=$(mktemp)
    if report=$("$fleet" weights --json 2>"$errors") && summary=$(weights_ready <<<"$report"); then
        rm -f "$errors"
        log "weights ready: $summary"
        return 0
    fi
    log "the model weights are not ready (KOKORO_WEIGHTS=${KOKORO_WEIGHTS:-offline}):"
    cat "$errors" - <<<"$report" | sed 's/^/    /' >&2
    rm -f "$errors"
    die "provide the weights before starting the server:
    in an image: build it with them, \`docker build --build-arg WEIGHTS=official|offline ...\` (docker/Dockerfile);
    official files on disk: mount hexgrad/Kokoro-82M's config.json, kokoro-v1_0.pth and voices/ and set
        KOKORO_WEIGHTS=official KOKORO_WEIGHTS_DIR=/that/dir (\`kokoro-fleet weights --download-official DIR\` fetches them);
    on a bare host: run \`kokoro-fleet weights --prepare\` (or \`make weights\`) once."
}

# --- 2. the server ------------------------------------------------------------------------------
serve_args() {
    # Flags from the environment first; the caller's flags come after them and win.
    args=()
    [[ -n ${KOKORO_HOST:-} ]] && args+=(--host "$KOKORO_HOST")
    [[ -n ${KOKORO_PORT:-} ]] && args+=(--port "$KOKORO_PORT")
    [[ -n ${KOKORO_WORKERS:-} && ${KOKORO_WORKERS} != 0 ]] && args+=(--workers "$KOKORO_WORKERS")
    return 0
}

server_pid=
watchdog_pid=
pending_signal=

# SIGTERM/SIGINT: forward SIGTERM once, then give the server the grace period plus a margin.
# shellcheck disable=SC2317  # called from a trap
on_signal() {
    local signal=$1
    if [[ -z $server_pid ]]; then
        # Between starting the server and learning its pid: act on the signal once the pid is known.
        pending_signal=$signal
        return 0
    fi
    if [[ -n $watchdog_pid ]]; then
        return 0 # already draining
    fi
    log "$signal: draining for up to ${drain_seconds}s (in-flight requests finish, new ones get 503)"
    kill -TERM "$server_pid" 2>/dev/null || true
    (
        # The sleep runs as this watchdog's own child so that cleanup can stop both at once.
        sleep "$drain_seconds" "$kill_margin_seconds" &
        sleeper=$!
        trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
        wait "$sleeper"
        log "the server did not stop within the grace period: killing it"
        # The server leads its own process group (setsid below): take its workers with it.
        kill -KILL -- "-$server_pid" 2>/dev/null || true
    ) &
    watchdog_pid=$!
}

# shellcheck disable=SC2317  # called from a trap
cleanup() {
    if [[ -n $watchdog_pid ]]; then
        kill "$watchdog_pid" 2>/dev/null || true
    fi
}

main() {
    check_weights
    if [[ -z ${REDIS_URL:-} ]] && ! command -v redis-server >/dev/null 2>&1; then
        die "REDIS_URL is empty and redis-server is not installed: install it (apt-get install redis-server) or set REDIS_URL"
    fi
    trap cleanup EXIT
    serve_args

    trap 'on_signal SIGTERM' TERM
    trap 'on_signal SIGINT' INT
    log "starting: kokoro-fleet serve ${args[*]} $*"
    # setsid: the server and its Uvicorn workers form their own process group, so the watchdog
    # can end all of them, and a terminal's Ctrl-C reaches them only through the trap above.
    setsid "$fleet" serve "${args[@]}" "$@" &
    server_pid=$!
    [[ -z $pending_signal ]] || on_signal "$pending_signal"

    local status=0
    # `wait` returns early when a trapped signal arrives; wait again until the server has exited.
    while :; do
        status=0
        wait "$server_pid" || status=$?
        kill -0 "$server_pid" 2>/dev/null || break
    done
    if [[ -n $watchdog_pid ]]; then
        # Uvicorn finishes its graceful shutdown and then re-raises the SIGTERM it caught, so 143
        # (128 + 15) is a clean drain too; 137 means the watchdog had to kill it.
        if ((status == 143)); then
            status=0
        fi
        log "server stopped after draining (status $status)"
    else
        log "server exited on its own (status $status)"
    fi
    exit "$status"
}

main "$@"
