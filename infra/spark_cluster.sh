#!/usr/bin/env bash
# A Spark standalone cluster on 127.0.0.1: a master and N workers as separate processes, from
# the pyspark package's own spark-class (no Spark download). A pipeline runs on it with
# DBSP_DEPLOYMENT=standalone DBSP_SPARK_MASTER=spark://127.0.0.1:<port>.
#
#   infra/spark_cluster.sh start [workers] [port]  master + workers; waits until all are ALIVE
#                                                  (refuses while any started here runs)
#   infra/spark_cluster.sh add-worker              one more worker (scale out)
#   infra/spark_cluster.sh stop-worker N           stop worker N (scale in)
#   infra/spark_cluster.sh kill-worker N           SIGKILL worker N (a crash, for tests)
#   infra/spark_cluster.sh roll                    replace every worker, one at a time (a rolling
#                                                  upgrade: start a new one, then stop an old one)
#   infra/spark_cluster.sh status                  the master's view: alive workers and cores
#   infra/spark_cluster.sh stop                    stops every process `start` started
#
# Each worker offers SPARK_WORKER_CORES (default 1) cores and SPARK_WORKER_MEMORY (default 2g).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
VAR="${DBSP_VAR:-var/spark-cluster}"
. infra/processes.sh
SPARK_HOME="$("$VENV/bin/python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
export SPARK_HOME SPARK_LOCAL_IP=127.0.0.1 SPARK_MASTER_HOST=127.0.0.1
mkdir -p "$VAR"
CORES="${SPARK_WORKER_CORES:-1}"
MEMORY="${SPARK_WORKER_MEMORY:-2g}"

master_url() { echo "spark://127.0.0.1:$(cat "$VAR/master.port")"; }
ui() { echo "http://127.0.0.1:$(cat "$VAR/master.ui-port")"; }
alive() {
  curl -fs "$(ui)/json/" | "$VENV/bin/python" -c \
    'import json, sys; print(sum(w["state"] == "ALIVE" for w in json.load(sys.stdin)["workers"]))'
}
free_port() { "$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

start_worker() {
  local n="$1"
  "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker --host 127.0.0.1 \
    --cores "$CORES" --memory "$MEMORY" --webui-port "$(free_port)" \
    --work-dir "$VAR/work-$n" "$(master_url)" >"$VAR/worker-$n.log" 2>&1 &
  echo $! >"$VAR/worker-$n.pid"
}

next_worker() {  # the number after the highest worker ever started (its log stays)
  echo $(( $(ls "$VAR"/worker-*.log 2>/dev/null | sed 's/.*worker-\([0-9]*\).log/\1/' \
             | sort -n | tail -1) + 1 ))
}

wait_alive() {
  local want="$1"
  for _ in $(seq 1 120); do
    if [ "$(alive 2>/dev/null || echo 0)" -ge "$want" ]; then return 0; fi
    sleep 0.5
  done
  echo "the cluster has not $want alive workers; see $VAR/*.log" >&2
  return 1
}

case "${1:-status}" in
  start)
    N="${2:-2}"
    for f in "$VAR"/worker-*.pid; do
      if [ -f "$f" ]; then refuse_to_restart "Spark $(basename "$f" .pid)" "$f"; fi
    done
    refuse_to_restart "the Spark master" "$VAR/master.pid" ${3:+"$3"}
    echo "${3:-$(free_port)}" >"$VAR/master.port"
    free_port >"$VAR/master.ui-port"
    "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master --host 127.0.0.1 \
      --port "$(cat "$VAR/master.port")" --webui-port "$(cat "$VAR/master.ui-port")" \
      >"$VAR/master.log" 2>&1 &
    echo $! >"$VAR/master.pid"
    for _ in $(seq 1 120); do curl -fs "$(ui)/json/" >/dev/null && break; sleep 0.5; done
    for n in $(seq 1 "$N"); do start_worker "$n"; done
    wait_alive "$N"
    echo "Spark master: $(master_url) ($N workers, UI $(ui))"
    ;;
  add-worker)
    N=$(next_worker)
    start_worker "$N"
    wait_alive "$(( $(alive) + 1 ))"
    echo "worker $N started"
    ;;
  stop-worker|kill-worker)
    N="$2"
    SIGNAL=TERM; [ "$1" = kill-worker ] && SIGNAL=KILL
    if [ -f "$VAR/worker-$N.pid" ]; then
      # the worker's executors are its child processes: they go first (after the worker's
      # death they would no longer be its children), then the worker
      pkill "-$SIGNAL" -P "$(cat "$VAR/worker-$N.pid")" 2>/dev/null || true
      kill "-$SIGNAL" "$(cat "$VAR/worker-$N.pid")" 2>/dev/null || true
      rm -f "$VAR/worker-$N.pid"
    fi
    ;;
  roll)
    for f in "$VAR"/worker-*.pid; do
      [ -f "$f" ] || continue
      OLD="$(basename "$f" .pid)"; OLD="${OLD#worker-}"
      N=$(next_worker)
      BEFORE="$(alive)"
      start_worker "$N"
      wait_alive "$(( BEFORE + 1 ))"
      pkill -TERM -P "$(cat "$f")" 2>/dev/null || true
      stop_started TERM "$(cat "$f")" "$f"
      echo "worker $OLD replaced by worker $N"
    done
    ;;
  status)
    if [ -f "$VAR/master.pid" ] && kill -0 "$(cat "$VAR/master.pid")" 2>/dev/null; then
      echo "master $(master_url): $(alive) alive workers"
    else
      echo "not running"
      exit 3
    fi
    ;;
  stop)
    for f in "$VAR"/worker-*.pid; do
      if [ -f "$f" ]; then
        pkill -TERM -P "$(cat "$f")" 2>/dev/null || true
        stop_started TERM "$(cat "$f")" "$f"
      fi
    done
    if [ -f "$VAR/master.pid" ]; then stop_started TERM "$(cat "$VAR/master.pid")" "$VAR/master.pid"; fi
    ;;
  *)
    echo "usage: $0 start [workers] [port]|add-worker|stop-worker N|kill-worker N|roll|status|stop" >&2
    exit 2
    ;;
esac
