"""Kafka helpers for tests: the real local broker (``infra/kafka_broker.sh``), started once per
test session by the ``broker`` fixture of ``tests/conftest.py``; topics; producing; reading
everything committed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.console import REPO, free_port


def start_broker(tmp_path_factory):
    """``{"bootstrap.servers": ...}`` of a broker started for this test session (a generator:
    the broker stops when it is closed)."""
    var = str(tmp_path_factory.mktemp("kafka"))
    env = {**os.environ, "DBSP_VAR": var,
           "VENV": os.path.dirname(os.path.dirname(sys.executable))}
    port = free_port()
    subprocess.run(["bash", "infra/kafka_broker.sh", "start", str(port)], cwd=REPO, env=env,
                   check=True, timeout=120, stdout=subprocess.DEVNULL)
    try:
        yield {"bootstrap.servers": f"127.0.0.1:{port}"}
    finally:
        subprocess.run(["bash", "infra/kafka_broker.sh", "stop"], cwd=REPO, env=env,
                       check=True, timeout=120)


def new_topic(config: dict, partitions: int = 1, prefix: str = "t") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(config)  # kept alive until the topic exists
    fut = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    fut[name].result(30)
    return name


def produce(config: dict, topic: str, values: list, partition_of=None) -> None:
    """Produce ``values`` (dicts as JSON, bytes as they are), partition chosen by
    ``partition_of(i, value)`` (default: round robin over 1 partition)."""
    p = Producer(config)
    for i, v in enumerate(values):
        data = v if isinstance(v, bytes) else json.dumps(v).encode()
        p.produce(topic, data, partition=partition_of(i, v) if partition_of else 0)
    assert p.flush(30) == 0


def consume_all(config: dict, topic: str, timeout: float = 10.0) -> list:
    """Every committed record of ``topic`` (read_committed), as (partition, offset, headers,
    value) in partition and offset order."""
    c = Consumer({**config, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    meta = c.list_topics(topic, timeout=10).topics[topic]
    parts = sorted(meta.partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out, eof, deadline = [], set(), time.monotonic() + timeout
    while len(eof) < len(parts) and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                eof.add(m.partition())
            continue
        out.append((m.partition(), m.offset(), dict(m.headers() or []), m.value()))
    c.close()
    return sorted(out)
