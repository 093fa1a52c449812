#!/usr/bin/env bash
# A long-lived Spark Connect server on 127.0.0.1, from the pyspark package's own jars, so runs
# launched by Dagster (DBSP_SPARK_MODE=connect) do not start a JVM each.
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
. infra/processes.sh
SPARK_HOME="$("$VENV/bin/python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
export SPARK_HOME SPARK_LOCAL_IP=127.0.0.1
# Python tasks (exact float sums fold in mapInArrow) run the venv's interpreter
PYSPARK_PYTHON="$(cd "$(dirname "$VENV")" && pwd)/$(basename "$VENV")/bin/python"
export PYSPARK_PYTHON
mkdir -p "$VAR"

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
    server
    ;;
  start)
    refuse_to_restart "the Spark Connect server" "$PIDFILE" "$PORT"
    ( server ) >"$VAR/spark-connect.log" 2>&1 &
    echo $! >"$PIDFILE"
    for _ in $(seq 1 120); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
        echo "Spark Connect: sc://127.0.0.1:$PORT (pid $(cat "$PIDFILE"), log $VAR/spark-connect.log)"
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
    ;;
  *)
    echo "usage: $0 run|start|stop [port]" >&2
    exit 2
    ;;
esac
