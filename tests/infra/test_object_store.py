"""``infra/object_store.sh`` for real: SeaweedFS listens on 127.0.0.1 only, its credentials are
made at start and readable only by their owner, a second ``start`` is refused while the first
store runs, and ``stop now`` ends exactly the process ``start`` started."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from infra.console import REPO, free_port


def store_script(var: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DBSP_VAR": var, "VENV": os.path.dirname(os.path.dirname(sys.executable))}
    return subprocess.run(["bash", "infra/object_store.sh", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def listening_addresses(pid: int) -> set[str]:
    """The IPv4/IPv6 addresses the sockets of ``pid`` listen on (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    out.add(fields[1].rsplit(":", 1)[0])
    return out


def test_the_store_is_local_private_single_and_stopped_by_pid(tmp_path) -> None:
    var = str(tmp_path / "s3")
    port = free_port()
    first = store_script(var, "start", str(port))
    assert first.returncode == 0, first.stderr
    with open(os.path.join(var, "object-store.pid")) as fh:
        pid = int(fh.read())
    with open(os.path.join(var, "object-store.sockets")) as fh:
        ports = [line.strip().rsplit("-", 1)[1][:-5] for line in fh]
    assert len(ports) == 4
    try:
        assert listening_addresses(pid) == {"0100007F"}  # 127.0.0.1, nothing else
        env_file = os.path.join(var, "object-store.env")
        assert stat.S_IMODE(os.stat(env_file).st_mode) == 0o600
        with open(env_file) as fh:
            settings = dict(line.strip().split("=", 1) for line in fh)
        assert settings["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{port}"
        assert len(settings["AWS_SECRET_ACCESS_KEY"]) == 40
        again = store_script(var, "start", str(port))
        assert again.returncode == 1
        assert f"cannot start the object store: it is already running (pid {pid}" in again.stderr
    finally:
        stopped = store_script(var, "stop", "now")
    assert stopped.returncode == 0, stopped.stderr
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    assert store_script(var, "status").returncode == 3
    assert not [n for n in os.listdir("/tmp") if n.startswith("seaweedfs-") and
                any(n.endswith(f"-{p}.sock") for p in ports)]
