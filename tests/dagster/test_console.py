"""The operator's console for real: ``dagster dev`` (webserver + daemon) started by
``infra/dagster.sh`` on 127.0.0.1 over a fresh instance and pipeline root. Input dropped in the
inbox makes the sensor launch a step run, the view assets update, GraphQL lists the jobs,
sensors, schedules and assets, and headless Chromium renders the asset graph and a run page.
A second test runs the steps on a long-lived Spark Connect server (``infra/spark_connect.sh``),
which serves only clients holding the token it was started with.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from infra.console import REPO, Console, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def render(url: str, out: str) -> str:
    """The DOM Chromium renders for ``url``, after a screenshot of it to ``out``."""
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--hide-scrollbars", "--virtual-time-budget=20000", "--window-size=1600,1000"]
    chromium([*base, f"--screenshot={out}", url])
    assert os.path.getsize(out) > 10_000
    return chromium([*base, "--dump-dom", url])


def chromium(command: list[str], attempts: int = 2) -> str:
    """Run headless Chromium; its stdout. A run that never returns is killed after 120 s and
    run again (headless Chromium with a virtual time budget hung once in a CI run, with the
    console serving: the browser's hang, not the page's)."""
    for _ in range(attempts - 1):
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
        except subprocess.TimeoutExpired:
            pass
    return subprocess.run(command, capture_output=True, text=True, timeout=120).stdout


#: tries each token (one a line on stdin, "" for none) as a Connect client; prints one line each
CONNECT_CLIENT = """
import sys
from dbsp_pipeline.spark_session import connect_session
for token in sys.stdin.read().split("\\n"):
    try:
        print(connect_session(sys.argv[1], token or None).range(5).count())
    except Exception as e:
        print(type(e).__name__, " ".join(str(e).split()))
"""


def connect_clients(url: str, tokens: list[str]) -> list[str]:
    """What a Spark Connect client of ``url`` gets with each of ``tokens`` (in a process of its
    own: a Connect client switches its process's PySpark to Spark Connect)."""
    out = subprocess.run([sys.executable, "-c", CONNECT_CLIENT, url], input="\n".join(tokens),
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    answers = out.stdout.splitlines()
    assert len(answers) == len(tokens), out.stdout + out.stderr
    return answers


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
    # Every step on Spark (driver_step_rows=0), and Spark is the Connect server.
    with Console(str(tmp_path), spark_mode="connect", driver_step_rows=0) as console:
        console.drop_batch()
        mat = console.wait_for_view_update("revenue_by_region", 1)
        assert mat["metadata"]["rows"] > 0
        runs = wait_for(lambda: (lambda rs: all(r["endTime"] for r in rs) and rs)(
            console.runs("shop_step")), 120, "the step run to finish")
        assert [r["status"] for r in runs] == ["SUCCESS"]
        log = open(os.path.join(str(tmp_path), "spark-connect.log")).read()
        assert "ExecutePlan" in log or "SparkConnect" in log
        memory = console.stack_rss_mib()

        # The runs above held the token (DBSP_SPARK_CONNECT_TOKEN); a client without it, or
        # with another, is refused.
        token_file = os.path.join(str(tmp_path), "spark-connect.token")
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        token = console.connect_token()
        assert len(token) >= 32 and token not in log
        answers = connect_clients(console.env["DBSP_SPARK_CONNECT_URL"],
                                  ["", "not-" + token, token])
        assert "UNAUTHENTICATED" in answers[0] and "No authentication token" in answers[0]
        assert "UNAUTHENTICATED" in answers[1] and "Invalid authentication token" in answers[1]
        assert answers[2] == "5"
    print(json.dumps({"figure": "console_rss_mib", "spark": "connect",
                      **{k: round(v) for k, v in memory.items()}}))
