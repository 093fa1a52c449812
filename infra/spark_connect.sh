#!/usr/bin/env bash
# A long-lived Spark Connect server on 127.0.0.1, from the pyspark package's own jars, so runs
# launched by Dagster (DBSP_DEPLOYMENT=connect) do not start a JVM each.
#
# Only clients holding its token are served: every run/start makes a fresh random token, writes it
# to $DBSP_VAR/spark-connect.token (mode 0600) and hands it to the server in its environment
# (SPARK_CONNECT_AUTHENTICATE_TOKEN, i.e. spark.connect.authenticate.token; never on a command
# line). Clients send it as a bearer token: DBSP_SPARK_CONNECT_TOKEN for the Dagster resource.
#
#   infra/spark_connect.sh start [port]   in the background; waits until it accepts connections
#                                         (refuses while one started here runs or the port is
#                                         taken)
#   infra/spark_connect.sh stop           stops what `start` started (by its pid)
#   infra/spark_connect.sh run   [port]   in the foreground
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
VAR="${DBSP_VAR:-var/spark-connect}"
PORT="${2:-${SPARK_CONNECT_PORT:-15002}}"
PIDFILE="$VAR/spark-connect.pid"
TOKENFILE="$VAR/spark-connect.token"
. infra/processes.sh
SPARK_HOME="$("$VENV/bin/python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
export SPARK_HOME SPARK_LOCAL_IP=127.0.0.1
# Python tasks (exact float sums fold in mapInArrow) run the venv's interpreter
PYSPARK_PYTHON="$(cd "$(dirname "$VENV")" && pwd)/$(basename "$VENV")/bin/python"
export PYSPARK_PYTHON
mkdir -p "$VAR"

new_token() {  # a fresh token in TOKENFILE (0600, created so), exported for the server only
  rm -f "$TOKENFILE"
  (umask 077 && "$VENV/bin/python" -c 'import secrets; print(secrets.token_urlsafe(32))' \
    >"$TOKENFILE")
  SPARK_CONNECT_AUTHENTICATE_TOKEN="$(cat "$TOKENFILE")"
  export SPARK_CONNECT_AUTHENTICATE_TOKEN
}

server() {
  # spark-submit of the server class in the pyspark package (its jars hold spark-connect).
  exec "$SPARK_HOME/bin/spark-submit" \
    --class org.apache.spark.sql.connect.service.SparkConnectServer \
    --name "dbsp Spark Connect server" \
    --master "${SPARK_CONNECT_MASTER:-local[2]}" \
    --driver-memory "${DBSP_DRIVER_MEMORY:-4g}" \
    --conf spark.connect.grpc.binding.address=127.0.0.1 \
    --conf spark.connect.grpc.binding.port="$PORT" \
    --conf spark.driver.host=127.0.0.1 \
    --conf spark.driver.bindAddress=127.0.0.1 \
    --conf spark.ui.enabled=false \
    --conf spark.sql.shuffle.partitions=4 \
    --conf spark.default.parallelism=4 \
    --conf spark.sql.session.timeZone=UTC \
    --conf spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS \
    --conf spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs=false \
    --conf spark.hadoop.fs.file.impl=org.apache.hadoop.fs.RawLocalFileSystem \
    --conf spark.hadoop.fs.file.impl.disable.cache=true \
    spark-internal
}

case "${1:-run}" in
  run)
    new_token
    echo "Spark Connect: sc://localhost:$PORT (token in $TOKENFILE)"
    server
    ;;
  start)
    refuse_to_restart "the Spark Connect server" "$PIDFILE" "$PORT"
    new_token
    ( server ) >"$VAR/spark-connect.log" 2>&1 &
    echo $! >"$PIDFILE"
    for _ in $(seq 1 120); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
        echo "Spark Connect: sc://localhost:$PORT (pid $(cat "$PIDFILE"), token in $TOKENFILE," \
          "log $VAR/spark-connect.log)"
        exit 0
      fi
      if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        echo "the Spark Connect server exited; see $VAR/spark-connect.log" >&2
        exit 1
      fi
      sleep 1
    done
    echo "the Spark Connect server did not listen on port $PORT; see $VAR/spark-connect.log" >&2
    exit 1
    ;;
  stop)
    if [ -f "$PIDFILE" ]; then stop_started TERM "$(cat "$PIDFILE")" "$PIDFILE"; fi
    rm -f "$TOKENFILE"
    ;;
  *)
    echo "usage: $0 run|start|stop [port]" >&2
    exit 2
    ;;
esac
