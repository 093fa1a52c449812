# Shell helpers for the infra/*.sh scripts (sourced, not run).

# stop_started SIGNAL TARGET PIDFILE: send SIGNAL to the pid in PIDFILE, wait up to 30 s for
# TARGET (the pid, or "-pgid" for its whole process group) to be gone, then SIGKILL what is
# left, and remove PIDFILE. Only ever touches what the script itself started.
stop_started() {
  local signal="$1" target="$2" pidfile="$3"
  [ -f "$pidfile" ] || return 0
  kill "-$signal" "$(cat "$pidfile")" 2>/dev/null || true
  for _ in $(seq 1 30); do
    kill -0 -- "$target" 2>/dev/null || break
    sleep 1
  done
  kill -KILL -- "$target" 2>/dev/null || true
  rm -f "$pidfile"
}

# refuse_to_restart WHAT PIDFILE [PORT...]: before a `start`, exit 1 with a message naming WHAT
# when PIDFILE names a live process (starting again would overwrite PIDFILE and orphan it) or
# when one of the PORTs on 127.0.0.1 already accepts connections (something else holds it). A
# PIDFILE whose process is gone (a crash, a reboot) is stale: it is removed and start goes on.
refuse_to_restart() {
  local what="$1" pidfile="$2" pid port
  shift 2
  if [ -f "$pidfile" ]; then
    pid="$(cat "$pidfile")"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      echo "cannot start $what: it is already running (pid $pid, recorded in $pidfile);" \
        "stop it first" >&2
      exit 1
    fi
    rm -f "$pidfile"
  fi
  for port in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "cannot start $what: port $port on 127.0.0.1 is already in use" >&2
      exit 1
    fi
  done
}
