"""End-to-end records per second through Kafka, next to the broker's own raw rate.

Starts the local broker (``infra/kafka_broker.sh``) and, in the same run:

* ``broker raw``: produce N JSON records (idempotent producer) and consume them back with
  ``read_committed``: the ceiling of anything built on this broker.
* ``pass-through``: N orders in an input topic, a view that selects them, the view written to
  an output topic: ingest (decode, exactly-once push), steps, transactional output.
* ``join+aggregate``: the same N orders joined with customers and grouped by region.

Each end-to-end figure is N input records divided by the seconds from the runner's start until
all output is committed. Prints JSON lines and a table.

    make bench-kafka                  # or: python benchmarks/kafka_bench.py --records 20000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from dbsp_pipeline import Circuit, Pipeline  # noqa: E402
from dbsp_pipeline.connectors.kafka import KafkaInput, KafkaOutput, KafkaRunner  # noqa: E402
from infra.console import REPO, free_port  # noqa: E402

PARTITIONS = 3


def topic(config: dict, prefix: str, partitions: int = PARTITIONS) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(config)
    admin.create_topics([NewTopic(name, num_partitions=partitions,
                                  replication_factor=1)])[name].result(30)
    return name


def produce(config: dict, name: str, values: list[bytes], partitions: int = PARTITIONS) -> None:
    p = Producer({**config, "enable.idempotence": True, "linger.ms": 10})
    for i, v in enumerate(values):
        while True:
            try:
                p.produce(name, v, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def consume_count(config: dict, name: str, expected: int, timeout: float = 300) -> int:
    c = Consumer({**config, "group.id": uuid.uuid4().hex, "isolation.level": "read_committed",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    parts = sorted(c.list_topics(name, timeout=10).topics[name].partitions)
    c.assign([TopicPartition(name, p, 0) for p in parts])
    n, deadline = 0, time.monotonic() + timeout
    while n < expected and time.monotonic() < deadline:
        for m in c.consume(10_000, 0.5):
            if not m.error():
                n += 1
            elif m.error().code() != KafkaError._PARTITION_EOF:
                raise RuntimeError(m.error())
    c.close()
    return n


def orders(n: int) -> list[bytes]:
    return [json.dumps({"order_id": i, "customer_id": i % 1000, "amount": float(i % 97)}).encode()
            for i in range(n)]


def circuit(kind: str) -> Circuit:
    c = Circuit("bench_" + "".join(ch if ch.isalnum() else "_" for ch in kind))
    o = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    cu = c.input("customers", "customer_id BIGINT, region STRING")
    if kind == "pass-through":
        c.output("out", o.select("order_id", "customer_id", "amount"))
    else:
        c.output("out", o.join(cu, on="customer_id").group_by("region")
                 .agg(n="count(*)", total="sum(amount)"))
    return c


def end_to_end(config: dict, kind: str, n: int) -> dict:
    orders_topic, customers_topic = topic(config, "orders"), topic(config, "customers", 1)
    out_topic = f"out-{orders_topic}"
    produce(config, customers_topic, [json.dumps({"customer_id": c, "region": f"r{c % 10}"})
                                      .encode() for c in range(1000)], partitions=1)
    produce(config, orders_topic, orders(n))
    with tempfile.TemporaryDirectory(prefix="dbsp-kbench-") as root:
        Pipeline(circuit(kind), root).close()  # compile (schema cache) outside the timing
        with Pipeline(circuit(kind), root) as p:
            started = time.monotonic()
            runner = KafkaRunner(p, config, [KafkaInput("orders", orders_topic),
                                             KafkaInput("customers", customers_topic)],
                                 [KafkaOutput("out", out_topic, partitions=PARTITIONS)])
            results = runner.run(idle_seconds=1.0)
            seconds = time.monotonic() - started - 1.0  # the idle wait at the end
            runner.close()
            out_rows = p.view_arrow("out").num_rows
    return {"figure": "kafka_records_per_second", "path": kind, "records": n,
            "steps": len(results), "seconds": round(seconds, 3),
            "records_per_second": round(n / seconds), "view_rows": out_rows}


def raw(config: dict, n: int) -> dict:
    name = topic(config, "raw")
    values = orders(n)
    started = time.monotonic()
    produce(config, name, values)
    produced = time.monotonic()
    got = consume_count(config, name, n)
    done = time.monotonic()
    assert got == n, (got, n)
    return {"figure": "kafka_records_per_second", "path": "broker raw", "records": n,
            "produce_seconds": round(produced - started, 3),
            "consume_seconds": round(done - produced, 3), "seconds": round(done - started, 3),
            "records_per_second": round(n / (done - started))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="dbsp-broker-") as var:
        env = {**os.environ, "DBSP_VAR": var,
               "VENV": os.path.dirname(os.path.dirname(sys.executable))}
        port = free_port()
        subprocess.run(["bash", "infra/kafka_broker.sh", "start", str(port)], cwd=REPO,
                       env=env, check=True, stdout=subprocess.DEVNULL)
        try:
            config = {"bootstrap.servers": f"127.0.0.1:{port}"}
            rows = [raw(config, args.records)]
            print(json.dumps(rows[-1]), flush=True)
            for kind in ("pass-through", "join+aggregate"):
                rows.append(end_to_end(config, kind, args.records))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            subprocess.run(["bash", "infra/kafka_broker.sh", "stop"], cwd=REPO, env=env,
                           check=True)
    print(f"\n{'path':>16} | {'records':>8} | {'seconds':>8} | {'records/s':>10} | steps")
    for r in rows:
        print(f"{r['path']:>16} | {r['records']:>8} | {r['seconds']:>8.2f} | "
              f"{r['records_per_second']:>10} | {r.get('steps', '-')}")


if __name__ == "__main__":
    main()
