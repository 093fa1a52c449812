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
