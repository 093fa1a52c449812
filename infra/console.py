"""A client for a running operator's console: starts and stops ``dagster dev`` (and, for the
``connect`` mode, a Spark Connect server) through the ``infra/*.sh`` scripts, over its own
folder (instance, pipeline root, inbox), and asks it things over GraphQL. Used by the console
test and the latency benchmark."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, every: float = 0.5):
    """The first truthy value of ``predicate()``, polled until ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


class Console:
    """``dagster dev`` over ``var`` (instance in ``var/home``, pipeline at ``var/shop``, inbox
    ``var/inbox``) on ``port``, serving the shop demo's code location in the deployment named
    ``spark_mode``; ``connect`` also starts a Spark Connect server. With ``driver_step_rows``
    (0: every step on Spark) it serves a code location of its own, written to
    ``var/location``: the shop demo's, with that deployment option."""

    def __init__(self, var: str, port: int | None = None, spark_mode: str = "local",
                 env: dict[str, str] | None = None, driver_step_rows: int | None = None) -> None:
        self.var, self.port, self.spark_mode = var, port or free_port(), spark_mode
        self.connect_port = free_port()
        self.env = {**os.environ, "DBSP_VAR": var, "DAGSTER_HOME": os.path.join(var, "home"),
                    "DBSP_DEPLOYMENT": spark_mode,
                    "DBSP_SPARK_CONNECT_URL": f"sc://127.0.0.1:{self.connect_port}",
                    "VENV": os.path.dirname(os.path.dirname(sys.executable)), **(env or {})}
        self.inbox = os.path.join(var, "inbox")
        if driver_step_rows is not None:
            self.env["DBSP_WORKSPACE"] = self._write_location(driver_step_rows)

    def _write_location(self, driver_step_rows: int) -> str:
        """A code location serving the shop demo with ``driver_step_rows``; its workspace."""
        folder = os.path.join(self.var, "location")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "location.py"), "w") as fh:
            fh.write("import dataclasses\n"
                     "from definitions import shop_definitions\n"
                     "from resources.deployments import shop_deployment\n"
                     f"deployment = shop_deployment({self.spark_mode!r}, {self.var!r})\n"
                     "defs = shop_definitions(dataclasses.replace(\n"
                     f"    deployment, driver_step_rows={driver_step_rows}))\n")
        workspace = os.path.join(folder, "workspace.yaml")
        with open(workspace, "w") as fh:
            fh.write(f"load_from:\n  - python_file:\n      relative_path: location.py\n"
                     f"      location_name: dbsp_pipeline\n      working_directory: {REPO}\n")
        return workspace

    # -- processes -------------------------------------------------------------------------
    def start(self) -> None:
        if self.spark_mode == "connect":
            self._script("spark_connect.sh", "start", str(self.connect_port))
            self.env["DBSP_SPARK_CONNECT_TOKEN"] = self.connect_token()
        self._script("dagster.sh", "start", str(self.port))

    def stop(self) -> None:
        try:
            self._script("dagster.sh", "stop")
        finally:
            if self.spark_mode == "connect":
                self._script("spark_connect.sh", "stop")

    def __enter__(self) -> Console:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def connect_token(self) -> str:
        """The running Spark Connect server's token (``infra/spark_connect.sh`` writes it)."""
        with open(os.path.join(self.var, "spark-connect.token")) as fh:
            return fh.read().strip()

    def _script(self, name: str, *args: str) -> None:
        subprocess.run(["bash", os.path.join("infra", name), *args], cwd=REPO, env=self.env,
                       check=True, timeout=300, stdout=subprocess.DEVNULL)

    def stack_rss_mib(self) -> dict[str, float]:
        """Resident memory of the running processes: the dagster dev group (webserver, daemon,
        code servers, run processes) and the Spark Connect server."""
        out = {"dagster": _group_rss(os.path.join(self.var, "dagster.pid"))}
        if self.spark_mode == "connect":
            out["spark_connect"] = _tree_rss(os.path.join(self.var, "spark-connect.pid"))
        return out

    # -- data and questions ----------------------------------------------------------------
    def drop_batch(self, orders: int = 100) -> float:
        """One batch of the shop's demo feed into the inbox; returns when it landed."""
        subprocess.run([sys.executable, "infra/demo_data.py", "--inbox", self.inbox,
                        "--batches", "1", "--batch", str(orders)], cwd=REPO, check=True,
                       env={**self.env, "PYTHONPATH": REPO}, capture_output=True)
        return time.time()

    def graphql(self, query: str) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/graphql",
                                     data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = json.load(resp)
        if "errors" in body:
            raise RuntimeError(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def repository(self) -> dict:
        return self.graphql(
            "{ repositoriesOrError { ... on RepositoryConnection { nodes { jobs { name } "
            "sensors { name sensorState { status } } schedules { name } "
            "assetNodes { assetKey { path } } } } } }")["repositoriesOrError"]["nodes"][0]

    def runs(self, job: str) -> list[dict]:
        data = self.graphql('{ runsOrError(filter: {pipelineName: "' + job + '"}) { ... on Runs '
                            '{ results { runId status startTime endTime tags { key value } } } } }')
        return data["runsOrError"]["results"]

    def materializations(self, view: str) -> list[dict]:
        """The view's materializations, newest first, with their metadata as a dict."""
        data = self.graphql(
            '{ assetOrError(assetKey: {path: ["shop", "' + view + '"]}) { ... on Asset { '
            'assetMaterializations(limit: 50) { runId timestamp metadataEntries { label '
            '... on IntMetadataEntry { intValue } ... on FloatMetadataEntry { floatValue } } '
            '} } } }')
        mats = data["assetOrError"]["assetMaterializations"]
        for m in mats:
            m["metadata"] = {e["label"]: e.get("intValue", e.get("floatValue"))
                             for e in m.pop("metadataEntries")}
        return mats

    def wait_for_view_update(self, view: str, count: int, timeout: float = 300) -> dict:
        """The newest materialization once the view has ``count`` of them."""
        return wait_for(lambda: (lambda m: len(m) >= count and m[0])(self.materializations(view)),
                        timeout, f"materialization {count} of {view}")


def _group_rss(pidfile: str) -> float:
    pgid = int(open(pidfile).read())
    return sum(_rss(int(p)) for p in _pids() if _pgid(int(p)) == pgid)


def _tree_rss(pidfile: str) -> float:
    root = int(open(pidfile).read())
    parents = {}
    for p in _pids():
        try:
            with open(f"/proc/{p}/stat") as fh:
                parents[int(p)] = int(fh.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    tree, grew = {root}, True
    while grew:
        new = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= new
        grew = bool(new)
    return sum(_rss(p) for p in tree)


def _pids() -> list[str]:
    return [p for p in os.listdir("/proc") if p.isdigit()]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _rss(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))
        return kib / 1024
    except (OSError, StopIteration):
        return 0.0
