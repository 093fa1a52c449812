#!/usr/bin/env bash
# The operator's console: Dagster's webserver and daemon (`dagster dev`) on 127.0.0.1, over the
# instance in $DAGSTER_HOME (default var/dagster/home, configured by infra/dagster.yaml) and the
# code location of $DBSP_WORKSPACE (default workspace.yaml: the shop demo, its pipeline under
# $DBSP_VAR, in the deployment $DBSP_DEPLOYMENT names; see definitions.py).
#
#   infra/dagster.sh run   [port]   in the foreground (Ctrl-C stops it)   = make ui
#   infra/dagster.sh start [port]   in the background; waits until the webserver answers
#                                   (refuses while one started here runs or the port is taken)
#   infra/dagster.sh stop           stops what `start` started (by its process group)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
VAR="${DBSP_VAR:-var/dagster}"
PORT="${2:-${DAGSTER_PORT:-3000}}"
mkdir -p "$VAR"
VAR="$(cd "$VAR" && pwd)"  # absolute, whether DBSP_VAR was given relative or absolute
export DBSP_VAR="$VAR"     # the shop demo's pipeline and inbox live here too
export DAGSTER_HOME="${DAGSTER_HOME:-$VAR/home}"
WORKSPACE="${DBSP_WORKSPACE:-workspace.yaml}"
export SPARK_LOCAL_IP=127.0.0.1
PIDFILE="$VAR/dagster.pid"
. infra/processes.sh
instance() {  # the instance folder and its configuration, for run and start
  mkdir -p "$DAGSTER_HOME"
  cp infra/dagster.yaml "$DAGSTER_HOME/dagster.yaml"
}

case "${1:-run}" in
  run)
    instance
    echo "Dagster UI: http://127.0.0.1:$PORT (instance $DAGSTER_HOME)"
    exec "$VENV/bin/dagster" dev -w "$WORKSPACE" -h 127.0.0.1 -p "$PORT"
    ;;
  start)
    refuse_to_restart "dagster dev" "$PIDFILE" "$PORT"
    instance
    # In its own session (so `stop` can reach every process it starts), with SIGINT at its
    # default: a background job of a script starts with SIGINT ignored, and dagster dev shuts
    # down cleanly only on SIGINT.
    "$VENV/bin/python" -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.setsid()
os.execv(sys.argv[1], sys.argv[1:])' "$VENV/bin/dagster" dev -w "$WORKSPACE" -h 127.0.0.1 \
      -p "$PORT" >"$VAR/dagster.log" 2>&1 &
    echo $! >"$PIDFILE"
    for _ in $(seq 1 120); do
      if curl -fs "http://127.0.0.1:$PORT/server_info" >/dev/null; then
        echo "Dagster UI: http://127.0.0.1:$PORT (pid $(cat "$PIDFILE"), log $VAR/dagster.log)"
        exit 0
      fi
      sleep 1
    done
    echo "dagster dev did not answer on port $PORT; see $VAR/dagster.log" >&2
    exit 1
    ;;
  stop)
    # dagster dev shuts its webserver, daemon and code servers down on SIGINT; whatever is
    # left of its process group after 30 s is killed.
    if [ -f "$PIDFILE" ]; then stop_started INT "-$(cat "$PIDFILE")" "$PIDFILE"; fi
    ;;
  *)
    echo "usage: $0 run|start|stop [port]" >&2
    exit 2
    ;;
esac
