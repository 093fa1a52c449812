"""The operator's console for real: ``dagster dev`` (webserver + daemon) started by
``infra/dagster.sh`` on 127.0.0.1 over a fresh instance and pipeline root. Input dropped in the
inbox makes the sensor launch a step run, the view assets update, GraphQL lists the jobs,
sensors, schedules and assets, and headless Chromium renders the asset graph and a run page.
A second test runs the steps on a long-lived Spark Connect server (``infra/spark_connect.sh``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from infra.console import Console, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def render(url: str, out: str) -> str:
    """The DOM Chromium renders for ``url``, after a screenshot of it to ``out``."""
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--hide-scrollbars", "--virtual-time-budget=20000", "--window-size=1600,1000"]
    subprocess.run([*base, f"--screenshot={out}", url], capture_output=True, timeout=120)
    assert os.path.getsize(out) > 10_000
    return subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True,
                          timeout=120).stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is installed by infra/setup.sh")
def test_the_console_runs_steps_from_sensors_and_shows_the_assets(tmp_path):
    with Console(str(tmp_path)) as console:
        repo = console.repository()
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
            dropped = console.drop_batch()
            mat = console.wait_for_view_update("revenue_by_region", batch + 1)
            latencies.append(int(mat["timestamp"]) / 1000 - dropped)
            assert mat["metadata"]["rows"] > 0 and mat["metadata"]["steps_executed"] >= 1

        runs = wait_for(lambda: (lambda rs: all(r["endTime"] for r in rs) and rs)(
            console.runs("shop_step")), 120, "the step runs to finish")
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
        memory = console.stack_rss_mib()

    print(json.dumps({"figure": "sensor_to_view_seconds", "spark": "local",
                      "first": round(latencies[0], 2), "second": round(latencies[1], 2)}))
    print(json.dumps({"figure": "console_rss_mib", **{k: round(v) for k, v in memory.items()}}))
    print(f"screenshots: {tmp_path / 'asset-graph.png'} {tmp_path / 'run.png'}")


def test_steps_run_on_a_long_lived_spark_connect_server(tmp_path):
    # Every step on Spark (DBSP_DRIVER_STEP_ROWS=0), and Spark is the Connect server.
    with Console(str(tmp_path), spark_mode="connect",
                 env={"DBSP_DRIVER_STEP_ROWS": "0"}) as console:
        console.drop_batch()
        mat = console.wait_for_view_update("revenue_by_region", 1)
        assert mat["metadata"]["rows"] > 0
        runs = wait_for(lambda: (lambda rs: all(r["endTime"] for r in rs) and rs)(
            console.runs("shop_step")), 120, "the step run to finish")
        assert [r["status"] for r in runs] == ["SUCCESS"]
        log = open(os.path.join(str(tmp_path), "spark-connect.log")).read()
        assert "ExecutePlan" in log or "SparkConnect" in log
        memory = console.stack_rss_mib()
    print(json.dumps({"figure": "console_rss_mib", "spark": "connect",
                      **{k: round(v) for k, v in memory.items()}}))
