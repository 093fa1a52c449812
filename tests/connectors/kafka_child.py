"""A child process running a Kafka-fed pipeline at ROOT until it is killed or idle.

    python -m tests.connectors.kafka_child ROOT BOOTSTRAP ORDERS_TOPIC CUSTOMERS_TOPIC OUT_PREFIX

Prints ``open`` once the pipeline is open and the sink has re-sent what a crash left unsent,
then polls (a few records at a time, so there are many steps), steps and emits until no record
came for three seconds, and prints ``done``.
"""

from __future__ import annotations

import sys

from dbsp_pipeline import Pipeline
from dbsp_pipeline.connectors.kafka import KafkaInput, KafkaOutput, KafkaRunner
from tests.connectors.test_kafka import shop


def main(root: str, bootstrap: str, orders: str, customers: str, out: str) -> int:
    config = {"bootstrap.servers": bootstrap}
    with Pipeline(shop(), root, checkpoint_every=2) as p:
        runner = KafkaRunner(p, config, [KafkaInput("orders", orders),
                                         KafkaInput("customers", customers)],
                             [KafkaOutput("orders_copy", f"{out}-copy", partitions=2),
                              KafkaOutput("by_region", f"{out}-region")])
        print("open", flush=True)
        runner.run(idle_seconds=3, poll_records=7)
        runner.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
