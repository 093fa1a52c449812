"""A child process driving the crash workload on a Spark standalone cluster (every step as
Spark jobs on the cluster's executors).

    python -m tests.runtime.cluster_child ROOT MASTER ROUNDS [RESCALE_ROUND WORKERS]

Prints ``step <r>`` after each round and ``done`` at the end; with RESCALE_ROUND, rescales to
WORKERS workers before that round (the test adds or removes a Spark worker first). With
``DBSP_ANNOUNCE_STEP=<r>`` it prints ``tasks running in step <s>`` as soon as Spark reports
tasks running for the step of a round ``s >= r`` (the test then kills a Spark worker under it):
a step whose tasks all end between two polls of Spark's status is missed, and the next is
reported.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from dbsp_pipeline import Pipeline
from dbsp_pipeline.spark_session import cluster_session
from tests.runtime.workload import circuit, play_round, rounds


def announce_running_tasks(spark, playing: list[int], r: int) -> None:
    """Print ``tasks running in step <s>`` when Spark first reports an active task while the
    round ``s = playing[0]`` is played, from round ``r`` on (``playing[0]``: the round being
    played, -1 between rounds; a round's pushes use no Spark, so its tasks are its step's)."""
    tracker = spark.sparkContext.statusTracker()
    while True:
        current = playing[0]
        if current >= r:
            for stage in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage)
                if info is not None and info.numActiveTasks > 0 and playing[0] == current:
                    print(f"tasks running in step {current}", flush=True)
                    return
        time.sleep(0.002)


def main(root: str, master: str, n: int, rescale_round: int | None, workers: int | None) -> int:
    spark = cluster_session(master, "dbsp-cluster-test")
    announce = int(os.environ.get("DBSP_ANNOUNCE_STEP", "-1"))
    playing = [-1]
    if announce >= 0:
        threading.Thread(target=announce_running_tasks, args=(spark, playing, announce),
                         daemon=True).start()
    with Pipeline(circuit(), root, spark, checkpoint_every=2, driver_step_rows=0) as p:
        work = rounds(n)
        for r in range(p.next_step, n):
            if r == rescale_round:
                result = p.rescale(workers)
                print(f"rescaled {result.old.workers} {result.new.workers}", flush=True)
            playing[0] = r
            result = play_round(p, r, work[r])
            playing[0] = -1
            print(f"step {r}: {result.path_reason if result else 'replayed'}", flush=True)
    print("done", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[0], args[1], int(args[2]),
                  int(args[3]) if len(args) > 3 else None, int(args[4]) if len(args) > 4 else None))
