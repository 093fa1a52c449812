"""The child process of the Kafka kill tests: it runs a Kafka-fed pipeline at a root until it is
killed or idle.

``main`` is the body of a child forked from a fork server that imported this module (and so the
package, pyarrow, DuckDB and the Kafka client) once: each child is its own process, killed with
SIGKILL or crashed at a crash point, and opens (recovers) the pipeline itself. It sends
``("open",)`` once the pipeline is open and the sink has re-sent what a crash left unsent, then
polls (a few records at a time, so there are many steps), steps and emits until no record came
for three seconds, and sends ``("done",)``; an error is sent as ``("error", traceback)`` before
the child exits with it.

    python -m tests.connectors.kafka_child ROOT BOOTSTRAP ORDERS_TOPIC CUSTOMERS_TOPIC OUT_PREFIX

runs the same as a process of its own, printing ``open`` and ``done`` (the fencing test starts
two such processes).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

from dbsp_pipeline import Pipeline
from dbsp_pipeline.connectors.kafka import KafkaInput, KafkaOutput, KafkaRunner
from tests.connectors.test_kafka import shop


def run(root: str, bootstrap: str, orders: str, customers: str, out: str,
        say: Callable[[tuple[str, ...]], None]) -> None:
    config = {"bootstrap.servers": bootstrap}
    with Pipeline(shop(), root, checkpoint_every=2) as p:
        runner = KafkaRunner(p, config, [KafkaInput("orders", orders),
                                         KafkaInput("customers", customers)],
                             [KafkaOutput("orders_copy", f"{out}-copy", partitions=2),
                              KafkaOutput("by_region", f"{out}-region")])
        say(("open",))
        runner.run(idle_seconds=3, poll_records=7)
        runner.close()
    say(("done",))


def main(report: Connection, crash_at: str | None, *args: str) -> None:
    """The forked child: ``crash_at`` (``name:n``) arms a crash point as ``DBSP_CRASH_AT`` does
    in a process's environment."""
    if crash_at:
        os.environ["DBSP_CRASH_AT"] = crash_at
    try:
        run(*args, say=report.send)
    except BaseException:
        report.send(("error", traceback.format_exc()))
        raise


if __name__ == "__main__":
    run(*sys.argv[1:6], say=lambda message: print(message[0], flush=True))
