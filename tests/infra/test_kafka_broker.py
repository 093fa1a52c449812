"""``infra/kafka_broker.sh`` for real: a second ``start`` is refused while the first broker runs
(it would overwrite the pid file and orphan that broker), a taken port is refused, and a pid
file left by a broker that is gone does not block the next start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from confluent_kafka.admin import AdminClient

from infra.console import REPO, free_port, wait_for


def broker_script(var: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DBSP_VAR": var, "VENV": os.path.dirname(os.path.dirname(sys.executable))}
    return subprocess.run(["bash", "infra/kafka_broker.sh", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def stop(pid: int) -> None:
    if not gone(pid):
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: gone(pid), 30, f"broker pid {pid} to exit")


def test_a_second_start_is_refused_and_a_stale_pid_file_is_replaced(tmp_path):
    var, other_var = str(tmp_path / "kafka"), str(tmp_path / "other")
    pidfile = os.path.join(var, "kafka-broker.pid")
    port = free_port()
    first = broker_script(var, "start", str(port))
    assert first.returncode == 0, first.stderr
    with open(pidfile) as fh:
        pid = int(fh.read())
    try:
        again = broker_script(var, "start", str(port))
        assert again.returncode == 1
        assert f"cannot start the Kafka broker: it is already running (pid {pid}" in again.stderr
        elsewhere = broker_script(other_var, "start", str(port))  # another var, the same port
        assert elsewhere.returncode == 1
        assert f"port {port} on 127.0.0.1 is already in use" in elsewhere.stderr
        with open(pidfile) as fh:
            assert int(fh.read()) == pid
        assert not gone(pid)
        AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10)
    finally:
        stop(pid)

    # The pid file still names the stopped broker: stale, so the next start replaces it.
    restarted = broker_script(var, "start", str(port))
    assert restarted.returncode == 0, restarted.stderr
    with open(pidfile) as fh:
        new_pid = int(fh.read())
    try:
        assert new_pid != pid and not gone(new_pid)
    finally:
        stop(new_pid)
