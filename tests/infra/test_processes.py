"""``infra/processes.sh``'s ``refuse_to_restart``, and every start script that uses it: ``start``
refuses while the process its pid file names is alive, or while its port is taken; a pid file
whose process is gone is removed. (The Kafka broker's own test starts real brokers twice;
here a process of the test's own stands in for a running server, so no JVM or Dagster starts.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from infra.console import REPO, free_port


def run(command: list[str], var: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DBSP_VAR": var, "VENV": os.path.dirname(os.path.dirname(sys.executable))}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def refuse(var: str, pidfile: str, *ports: int) -> subprocess.CompletedProcess:
    script = '. infra/processes.sh; refuse_to_restart "the server" "$@"; echo go on'
    return run(["bash", "-c", script, "refuse", pidfile, *map(str, ports)], var)


@pytest.fixture
def live_pid():
    """The pid of a live process (stands in for a server a script started)."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_live_pid_file_is_refused(tmp_path, live_pid):
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(f"{live_pid}\n")
    out = refuse(str(tmp_path), str(pidfile), free_port())
    assert out.returncode == 1 and "go on" not in out.stdout
    assert (f"cannot start the server: it is already running (pid {live_pid}, recorded in "
            f"{pidfile})") in out.stderr
    assert pidfile.read_text() == f"{live_pid}\n"


def test_a_stale_pid_file_is_removed(tmp_path, dead_pid):
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(f"{dead_pid}\n")
    out = refuse(str(tmp_path), str(pidfile), free_port())
    assert out.returncode == 0 and "go on" in out.stdout
    assert not pidfile.exists()


def test_a_taken_port_is_refused(tmp_path, taken_port):
    out = refuse(str(tmp_path), str(tmp_path / "server.pid"), taken_port)
    assert out.returncode == 1
    assert (f"cannot start the server: port {taken_port} on 127.0.0.1 is already in use"
            in out.stderr)


def start(script: str, arg: str, var: str) -> subprocess.CompletedProcess:
    """``infra/<script> start <arg>``; should it start anything after all, that is stopped."""
    out = run(["bash", f"infra/{script}", "start", arg], var)
    if out.returncode == 0:
        run(["bash", f"infra/{script}", "stop"], var)
    return out


@pytest.mark.parametrize("script, pidfile, what", [
    ("spark_connect.sh", "spark-connect.pid", "the Spark Connect server"),
    ("dagster.sh", "dagster.pid", "dagster dev"),
    ("spark_cluster.sh", "master.pid", "the Spark master"),
    ("spark_cluster.sh", "worker-2.pid", "Spark worker-2"),
])
def test_start_scripts_refuse_to_orphan_what_they_started(tmp_path, live_pid, script, pidfile,
                                                          what):
    (tmp_path / pidfile).write_text(f"{live_pid}\n")
    out = start(script, "1" if "cluster" in script else str(free_port()), str(tmp_path))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"cannot start {what}: it is already running (pid {live_pid}" in out.stderr
    assert (tmp_path / pidfile).read_text() == f"{live_pid}\n"


@pytest.mark.parametrize("script", ["spark_connect.sh", "dagster.sh", "kafka_broker.sh"])
def test_start_scripts_refuse_a_taken_port(tmp_path, taken_port, script):
    out = start(script, str(taken_port), str(tmp_path))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"port {taken_port} on 127.0.0.1 is already in use" in out.stderr
