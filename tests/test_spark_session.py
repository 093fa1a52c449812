"""``run_tasks``: one Spark task per index, results in index order (a plain RDD job on a
classic session; through Spark Connect, which has no RDDs, a ``mapInArrow`` job: exercised by
``tests/dagster/test_console.py``'s Connect run, whose owner stages run through it)."""

from __future__ import annotations

import os

from dbsp_pipeline.spark_session import run_tasks


def test_each_index_is_a_task_and_the_results_come_in_index_order(spark) -> None:
    results = run_tasks(spark, 5, lambda i: f"{i}:{os.getpid()}")
    assert [r.split(":")[0] for r in results] == ["0", "1", "2", "3", "4"]
    assert all(int(r.split(":")[1]) != os.getpid() for r in results)  # in Python workers
    assert run_tasks(spark, 0, lambda i: "never") == []


def test_python_workers_talk_over_unix_domain_sockets(spark) -> None:
    """The session the engine creates has the JVM reach its Python workers (and the driver its
    job results) over Unix domain sockets: over TCP on loopback each Python job waited about
    40 ms more here. A worker started that way is told so in its environment."""
    from dbsp_pipeline.spark_session import PYTHON_UNIX_SOCKETS

    assert spark.sparkContext.getConf().get(PYTHON_UNIX_SOCKETS) == "true"
    flags = run_tasks(spark, 2, lambda i: os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", ""))
    assert [f.lower() for f in flags] == ["true", "true"]


def test_each_task_runs_in_a_worker_that_keeps_freed_memory(spark) -> None:
    """``run_tasks`` has each task's Python worker keep the memory it frees
    (``worker_memory.keep_freed_memory``) before the task runs."""
    def tuned(i: int) -> str:
        from dbsp_pipeline import worker_memory

        return str(worker_memory._tuned_pid == os.getpid())

    assert run_tasks(spark, 2, tuned) == ["True", "True"]
