"""The pipeline on a real multi-process Spark standalone cluster (``infra/spark_cluster.sh``:
a master and workers as separate processes on 127.0.0.1), every step as Spark jobs on the
workers' executors:

* a Spark worker (and its executor) is killed with SIGKILL in the middle of the steps, and
  while a known step's tasks are running (at W=2, one task per owner): the tasks are retried
  on the worker left, the step completes, and the output is exactly the no-kill output (each
  step once);
* scale out and in: a Spark worker is added and the pipeline rescaled to 2 workers, the Spark
  workers are replaced one at a time (a rolling upgrade of the cluster), then one is stopped
  and the pipeline rescaled to 1; the output is exactly the never-rescaled output.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from infra.console import REPO, free_port
from tests.runtime.workload import consumer_view, open_pipeline, play_round, rounds

ROUNDS = 4


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("reference"))
    with open_pipeline(root, spark) as p:
        for r, pushes in enumerate(rounds(ROUNDS)):
            play_round(p, r, pushes)
    return consumer_view(spark, root)


class Cluster:
    def __init__(self, var: str) -> None:
        self.var = var
        self.env = {**os.environ, "DBSP_VAR": var, "SPARK_WORKER_MEMORY": "1g",
                    "VENV": os.path.dirname(os.path.dirname(sys.executable))}
        self.port = free_port()

    def run(self, *args: str) -> None:
        subprocess.run(["bash", "infra/spark_cluster.sh", *args], cwd=REPO, env=self.env,
                       check=True, timeout=300, stdout=subprocess.DEVNULL)

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def child(self, root: str, rounds: int = ROUNDS, *args: str,
              announce_step: int | None = None) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": REPO, "SPARK_LOCAL_IP": "127.0.0.1",
               "DBSP_DRIVER_MEMORY": "1g", "DBSP_EXECUTOR_MEMORY": "768m"}
        if announce_step is not None:
            env["DBSP_ANNOUNCE_STEP"] = str(announce_step)
        return subprocess.Popen([sys.executable, "-m", "tests.runtime.cluster_child", root,
                                 self.master, str(rounds), *args], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(str(tmp_path / "cluster"))
    yield c
    c.run("stop")


def finish(child: subprocess.Popen) -> str:
    out, err = child.communicate(timeout=600)
    assert child.returncode == 0, err[-3000:]
    return out


def test_a_killed_spark_worker_does_not_change_the_output(cluster, tmp_path, spark, reference):
    cluster.run("start", "2", str(cluster.port))
    root = str(tmp_path / "pipeline")
    open_pipeline(root, spark).close()
    child = cluster.child(root)
    assert child.stdout.readline().startswith("step 0")
    cluster.run("kill-worker", "1")  # mid-run: the next steps' tasks lose their executor
    out = finish(child)
    assert "done" in out
    assert consumer_view(spark, root) == reference


def test_a_spark_worker_killed_while_a_step_runs_its_tasks(cluster, tmp_path, spark, reference):
    """At W=2, every step runs its stateful operators as one task per owner (the change
    exchanged by owner, each task reading its owner's files): one of the two Spark workers is
    killed while step 2's tasks run (or step 3's, when step 2's end between two polls of Spark's
    status), and the tasks it ran are retried on the other."""
    cluster.run("start", "2", str(cluster.port))
    root = str(tmp_path / "pipeline")
    with open_pipeline(root, spark) as p:
        p.rescale(2)
    child = cluster.child(root, announce_step=2)
    lines = []
    while not lines or not lines[-1].startswith("tasks running in step "):
        line = child.stdout.readline()
        assert line, f"the child ended early: {lines} {child.stderr.read()[-3000:]}"
        lines.append(line)
    killed_in = int(lines[-1].split()[-1])  # step 2's, or step 3's if step 2's ran unseen
    assert lines[-2].startswith(f"step {killed_in - 1}")  # it has started and not finished
    cluster.run("kill-worker", "1")  # under the running step: its tasks lose an executor
    out = finish(child)
    assert f"step {killed_in}" in out and "done" in out  # it completed (its tasks retried)
    steps = [line for line in lines + out.splitlines() if line.startswith("step ")]
    assert len(steps) == ROUNDS and all("per owner (W=2)" in line for line in steps), steps
    assert consumer_view(spark, root) == reference


def test_adding_and_removing_spark_workers_with_rescale(cluster, tmp_path, spark, reference):
    cluster.run("start", "1", str(cluster.port))
    root = str(tmp_path / "pipeline")
    open_pipeline(root, spark).close()
    cluster.run("add-worker")
    out = finish(cluster.child(root, 2, "1", "2"))  # scale out before round 1, run to 2
    assert "rescaled 1 2" in out
    cluster.run("roll")  # a rolling upgrade of the Spark workers: 1 -> 3, 2 -> 4
    cluster.run("stop-worker", "4")
    out = finish(cluster.child(root, ROUNDS, "2", "1"))  # scale in before round 2
    assert "rescaled 2 1" in out
    with open_pipeline(root, spark) as p:
        assert p.layout.workers == 1 and p.layout.version == 2
    assert consumer_view(spark, root) == reference
