#!/usr/bin/env bash
# A local Kafka-protocol broker on 127.0.0.1 for tests and the demo: noida-db (a single binary
# from the noida-db Python package, installed by infra/setup.sh) with transactions and
# read_committed. Production points at a real Kafka cluster through configuration only.
#
#   infra/kafka_broker.sh start [port]   in the background, data in $DBSP_VAR/kafka-data; waits
#                                        until the broker answers a metadata request; refuses
#                                        while one started here runs or the port is taken
#   infra/kafka_broker.sh status         running or not, and where
#   infra/kafka_broker.sh stop           stops what `start` started (SIGTERM; data is kept)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
VAR="${DBSP_VAR:-var/kafka}"
PORT="${2:-${DBSP_KAFKA_PORT:-9092}}"
PIDFILE="$VAR/kafka-broker.pid"
PORTFILE="$VAR/kafka-broker.port"
. infra/processes.sh
mkdir -p "$VAR"
BROKER="$("$VENV/bin/python" -c 'import importlib.resources as r; print(r.files("noida_db") / "noida-db")')"

ready() {
  "$VENV/bin/python" - "$1" <<'PY'
import sys
from confluent_kafka.admin import AdminClient
try:
    AdminClient({"bootstrap.servers": f"127.0.0.1:{sys.argv[1]}"}).list_topics(timeout=2)
except Exception:
    sys.exit(1)
PY
}

case "${1:-status}" in
  start)
    refuse_to_restart "the Kafka broker" "$PIDFILE" "$PORT"
    "$BROKER" start --data-dir "$VAR/kafka-data" --host 127.0.0.1 --only kafka \
      --kafka-port "$PORT" >"$VAR/kafka-broker.log" 2>&1 &
    echo $! >"$PIDFILE"
    echo "$PORT" >"$PORTFILE"
    for _ in $(seq 1 60); do
      if ready "$PORT" 2>/dev/null; then
        echo "Kafka broker: 127.0.0.1:$PORT (pid $(cat "$PIDFILE"), data $VAR/kafka-data)"
        exit 0
      fi
      if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        echo "the broker exited; see $VAR/kafka-broker.log" >&2
        exit 1
      fi
      sleep 0.5
    done
    echo "the broker did not answer on port $PORT; see $VAR/kafka-broker.log" >&2
    exit 1
    ;;
  status)
    if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      echo "running: 127.0.0.1:$(cat "$PORTFILE") (pid $(cat "$PIDFILE"))"
    else
      echo "not running"
      exit 3
    fi
    ;;
  stop)
    if [ -f "$PIDFILE" ]; then stop_started TERM "$(cat "$PIDFILE")" "$PIDFILE"; fi
    ;;
  *)
    echo "usage: $0 start|status|stop [port]" >&2
    exit 2
    ;;
esac
