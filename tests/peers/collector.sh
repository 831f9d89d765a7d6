#!/usr/bin/env bash
# Runs the rotel OpenTelemetry collector (rotel-agent from the `rotel` wheel) in the
# foreground, printing every received span and metric (detailed debug log) and
# discarding them (blackhole exporter).
#
#   tests/peers/collector.sh [--grpc 127.0.0.1:4317] [--http 127.0.0.1:4318] [extra rotel-agent args...]
#
# Everything (log lines and the span/metric dump) goes to stdout; a bind failure
# goes to stderr with exit status 1. exec keeps the PID, so SIGTERM reaches
# rotel-agent directly (it exits 0).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${PEERS_VENV:-$root/.venv-peers}"

grpc="127.0.0.1:4317"
http="127.0.0.1:4318"
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --grpc) grpc="$2"; shift 2 ;;
        --http) http="$2"; shift 2 ;;
        *) extra+=("$1"); shift ;;
    esac
done

agent="$(ls "$venv"/lib/python3*/site-packages/rotel/rotel-agent 2>/dev/null | head -n1 || true)"
if [[ -z "$agent" || ! -x "$agent" ]]; then
    echo "collector.sh: rotel-agent not found under $venv; run tests/peers/install.sh" >&2
    exit 1
fi

# No ANSI colours in rotel's own log lines (the span/metric dump never has any).
export NO_COLOR="${NO_COLOR:-1}"

exec "$agent" start \
    --otlp-grpc-endpoint "$grpc" \
    --otlp-http-endpoint "$http" \
    --exporter blackhole \
    --debug-log traces --debug-log metrics --debug-log logs \
    --debug-log-verbosity detailed \
    "${extra[@]}"
