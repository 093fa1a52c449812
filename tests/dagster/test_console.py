"""The operator's console for real: ``dagster dev`` (webserver + daemon) started by
``infra/dagster.sh`` on 127.0.0.1 over a fresh instance and pipeline root. Input dropped in the
inbox makes the sensor launch a step run, the view assets update, GraphQL lists the jobs,
sensors, schedules and assets, and headless Chromium renders the asset graph and a run page.
Prints the sensor-to-view latency and the memory of the running stack."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Console:
    """A running ``dagster dev`` and a GraphQL client for it."""

    def __init__(self, var: str, port: int) -> None:
        self.var, self.port = var, port
        self.env = {**os.environ, "DBSP_VAR": var, "DAGSTER_HOME": os.path.join(var, "home"),
                    "DBSP_ROOT": os.path.join(var, "shop"), "VENV": os.path.dirname(
                        os.path.dirname(sys.executable))}
        self.inbox = os.path.join(var, "inbox")

    def script(self, *args: str) -> None:
        subprocess.run(["bash", "infra/dagster.sh", *args], cwd=REPO, env=self.env, check=True,
                       timeout=180)

    def graphql(self, query: str) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/graphql",
                                     data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = json.load(resp)
        assert "errors" not in body, body
        return body["data"]

    def step_runs(self) -> list[dict]:
        data = self.graphql('{ runsOrError(filter: {pipelineName: "shop_step"}) { ... on Runs '
                            '{ results { runId status startTime endTime tags { key value } } } } }')
        return data["runsOrError"]["results"]

    def materializations(self, view: str) -> list[dict]:
        data = self.graphql(
            '{ assetOrError(assetKey: {path: ["shop", "%s"]}) { ... on Asset { '
            'assetMaterializations(limit: 10) { runId timestamp metadataEntries { label '
            '... on IntMetadataEntry { intValue } ... on FloatMetadataEntry { floatValue } } '
            '} } } }' % view)
        return data["assetOrError"]["assetMaterializations"]

    def stack_rss_mib(self) -> float:
        pgid = int(open(os.path.join(self.var, "dagster.pid")).read())
        total = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.getpgid(int(pid)) != pgid:
                    continue
                with open(f"/proc/{pid}/status") as fh:
                    total += next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))
            except (OSError, StopIteration):
                continue
        return total / 1024


def drop_batch(console: Console) -> float:
    subprocess.run([sys.executable, "infra/demo_data.py", "--inbox", console.inbox,
                    "--batches", "1", "--batch", "100"], cwd=REPO, check=True,
                   env={**console.env, "PYTHONPATH": REPO}, capture_output=True)
    return time.time()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def render(url: str, out: str | None = None) -> str:
    """The DOM Chromium renders for ``url`` (and a screenshot to ``out``)."""
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--hide-scrollbars", "--virtual-time-budget=20000", "--window-size=1600,1000"]
    if out:
        subprocess.run([*base, f"--screenshot={out}", url], capture_output=True, timeout=120)
        assert os.path.getsize(out) > 10_000
    return subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True,
                          timeout=120).stdout


@pytest.fixture
def console(tmp_path):
    c = Console(str(tmp_path), free_port())
    c.script("start", str(c.port))
    try:
        yield c
    finally:
        c.script("stop")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is installed by infra/setup.sh")
def test_the_console_runs_steps_from_sensors_and_shows_the_assets(console, tmp_path):
    repo = console.graphql(
        "{ repositoriesOrError { ... on RepositoryConnection { nodes { jobs { name } "
        "sensors { name sensorState { status } } schedules { name } "
        "assetNodes { assetKey { path } } } } } }")["repositoriesOrError"]["nodes"][0]
    assert {j["name"] for j in repo["jobs"]} >= {
        "shop_step", "shop_checkpoint", "shop_recover", "shop_restore"}
    assert {s["name"]: s["sensorState"]["status"] for s in repo["sensors"]} == {
        "shop_input_arrival": "RUNNING", "shop_recover_on_failure": "RUNNING"}
    assert [s["name"] for s in repo["schedules"]] == ["shop_checkpoint_schedule"]
    assert {"/".join(a["assetKey"]["path"]) for a in repo["assetNodes"]} == {
        "shop/revenue_by_region", "shop/regions", "shop/idle_customers",
        "shop/inputs/orders", "shop/inputs/customers"}

    latencies = []
    for batch in range(2):
        dropped = drop_batch(console)
        mats = wait_for(lambda: len(console.materializations("revenue_by_region")) > batch and
                        console.materializations("revenue_by_region"), 300,
                        f"the view to update after batch {batch}")
        latencies.append(int(mats[0]["timestamp"]) / 1000 - dropped)
        meta = {m["label"]: m.get("intValue", m.get("floatValue")) for m in mats[0]["metadataEntries"]}
        assert meta["rows"] > 0 and meta["steps_executed"] >= 1

    runs = wait_for(lambda: [r for r in console.step_runs() if r["endTime"]] == console.step_runs()
                    and console.step_runs(), 120, "the step runs to finish")
    assert len(runs) == 2 and all(r["status"] == "SUCCESS" for r in runs)
    assert all({"key": "dagster/sensor_name", "value": "shop_input_arrival"} in r["tags"]
               for r in runs)
    assert sorted(os.listdir(os.path.join(console.inbox, "orders", "done"))) == [
        "batch-000000.jsonl", "batch-000001.jsonl"]

    base = f"http://127.0.0.1:{console.port}"
    graph = render(f"{base}/asset-groups/shop", str(tmp_path / "asset-graph.png"))
    for name in ["revenue_by_region", "regions", "idle_customers", "orders", "customers"]:
        assert name in graph, f"the asset graph does not show {name}"
    run_page = render(f"{base}/runs/{runs[0]['runId']}", str(tmp_path / "run.png"))
    assert "shop_step" in run_page and "positive_multiplicities" in run_page

    print(json.dumps({"figure": "sensor_to_view_seconds", "spark": "local",
                      "first": round(latencies[0], 2), "second": round(latencies[1], 2)}))
    print(json.dumps({"figure": "console_stack_rss_mib", "value": round(console.stack_rss_mib())}))
    print(f"screenshots: {tmp_path / 'asset-graph.png'} {tmp_path / 'run.png'}")
