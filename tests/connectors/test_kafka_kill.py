"""``kill -9`` of a real process running a Kafka-fed pipeline, at random moments and in the
middle of output transactions (crash points), many times: a read_committed consumer of the
output topics sees every step's change exactly once (equal to the pipeline's own output log,
step by step), the side topic has each step once, and the views equal their recomputation over
exactly the records produced (none lost, none counted twice).

The children never start a JVM: the root is created here first (caching the circuit's schemas)
and every step is small enough for the driver. They are forked from a fork server that imported
the package once (``tests/forked_children.py``), so the test's time goes to the workload, not to
imports."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter, defaultdict

from dbsp_pipeline import Pipeline
from dbsp_pipeline.connectors.kafka import STEPS_SUFFIX
from dbsp_pipeline.runtime.recompute import check_views
from tests import forked_children
from tests.connectors import kafka_child
from tests.connectors.test_kafka import shop
from tests.kafka_helpers import consume_all, new_topic, produce

KILLS = 15


def produce_workload(config, orders_topic, customers_topic) -> Counter:
    """Orders in three partitions with deletes, and customers; returns the integrated orders."""
    produce(config, customers_topic, [{"customer_id": c, "region": f"r{c % 3}"}
                                      for c in range(5)])
    live: Counter = Counter()
    records = []
    for i in range(120):
        row = {"order_id": i, "customer_id": i % 5, "amount": float(i % 17)}
        records.append(row)
        live[(i, i % 5, float(i % 17))] += 1
        if i % 6 == 5:  # delete an earlier order, in the partition its insert went to
            gone = records[i - 4] if isinstance(records[i - 4], dict) and "delete" not in \
                records[i - 4] else None
            if gone is not None:
                records.append({"delete": gone})
                live[(gone["order_id"], gone["customer_id"], gone["amount"])] -= 1
    produce(config, orders_topic, records, partition_of=lambda i, v: (
        v["delete"]["order_id"] if "delete" in v else v["order_id"]) % 3)
    return +live


def steps_seen(config, topic) -> dict[int, Counter]:
    """Per step header, the consolidated change a read_committed consumer sees."""
    out: dict[int, Counter] = defaultdict(Counter)
    for _, _, headers, value in consume_all(config, topic):
        record = json.loads(value)
        copies = record.pop("weight", 1)
        (kind, row), = record.items()
        out[int(headers["dbsp.step"])][tuple(sorted(row.items()))] += copies \
            if kind == "insert" else -copies
    return {s: +c for s, c in out.items() if +c}


def log_steps(p, view) -> dict[int, Counter]:
    out = {}
    for s in range(p.output_last(view)):
        rows = p.step_changes_arrow(view, s).to_pylist()
        c = Counter({tuple(sorted((k, v) for k, v in r.items() if k != "_weight")): r["_weight"]
                     for r in rows})
        if +c:
            out[s] = +c
    return out


def run_child(root, broker, topics, crash_at=None, kill_after=None):
    """One child on ``root``: run to its end (exit code, what it sent, its error if any), or
    SIGKILL it ``kill_after`` seconds after it opened (``"killed"`` if it was still running)."""
    child, reports = forked_children.start(kafka_child.main, crash_at, root,
                                           broker["bootstrap.servers"], *topics)
    said, ended = [], False
    try:
        if kill_after is not None and reports.poll(300):
            said.append(reports.recv())
            time.sleep(kill_after)
            if child.is_alive():
                forked_children.kill(child)
                return "killed", said, ""
        while True:  # until the child closes its end: it has ended
            if not reports.poll(300):
                raise TimeoutError(f"the child sent nothing for 300 s: {said}")
            said.append(reports.recv())
    except EOFError:
        ended = True
    finally:
        reports.close()
        if not ended:  # (a failure here: leave no child on the root)
            forked_children.kill(child)
    child.join(60)
    errors = [message[1] for message in said if message[0] == "error"]
    return child.exitcode, said, "".join(errors)


def test_kill_9_and_crashes_mid_transaction_keep_output_exactly_once(spark, tmp_path, broker):
    orders, customers = new_topic(broker, 3, "korders"), new_topic(broker, 1, "kcust")
    out = f"kout-{orders}"
    expected_orders = produce_workload(broker, orders, customers)
    root = str(tmp_path / "pipeline")
    Pipeline(shop(), root, spark).close()  # created here: the schema cache spares the JVM
    topics = (orders, customers, out)

    # Crashes inside output transactions (before and after their commit), at chosen points.
    for point in ("kafka.transaction.before_commit:2", "kafka.transaction.after_commit:3"):
        rc, _, _ = run_child(root, broker, topics, crash_at=point)
        assert rc == 77, f"the child did not crash at {point}"
    # Then SIGKILL at random moments.
    rng = random.Random(99)
    kills = 0
    for _ in range(KILLS):
        rc, said, _ = run_child(root, broker, topics, kill_after=rng.uniform(0.2, 2.5))
        assert said[:1] == [("open",)], said
        kills += rc == "killed"
    rc, said, err = run_child(root, broker, topics)
    assert rc == 0 and said == [("open",), ("done",)], err[-2000:]
    assert kills >= KILLS // 2

    with Pipeline(shop(), root, spark) as p:
        for view, topic in (("orders_copy", f"{out}-copy"), ("by_region", f"{out}-region")):
            assert steps_seen(broker, topic) == log_steps(p, view), view
            side = [json.loads(v)["step"] for *_, v in consume_all(broker, topic + STEPS_SUFFIX)]
            assert side == list(range(p.output_last(view))), "each step once on the side topic"
        integrated = Counter({(r["order_id"], r["customer_id"], r["amount"]): r["_weight"]
                              for r in p.input_view_arrow("orders").to_pylist()})
        assert integrated == expected_orders
        assert all(c.equal for c in check_views(p).values())
        assert p.next_step > 10  # many steps, so the kills hit many of them
        print(f"{kills} kills over {p.next_step} steps")


def test_a_second_process_on_the_same_pipeline_is_fenced(spark, tmp_path, broker):
    orders, customers = new_topic(broker, 3, "forders"), new_topic(broker, 1, "fcust")
    out = f"fout-{orders}"
    expected_orders = produce_workload(broker, orders, customers)
    root = str(tmp_path / "pipeline")
    Pipeline(shop(), root, spark).close()
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "SPARK_LOCAL_IP": "127.0.0.1"}
    args = [sys.executable, "-m", "tests.connectors.kafka_child", root,
            broker["bootstrap.servers"], orders, customers, out]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    assert first.stdout.readline().startswith("open")
    time.sleep(0.5)  # the first is stepping
    second = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)
    results = [(p.wait(timeout=300), p.stderr.read()) for p in (first, second)]
    fenced = [err for rc, err in results if rc != 0]
    assert fenced, "one of the two processes must be fenced"
    for err in fenced:
        assert "PipelineFencedError" in err and "another process" in err, err[-3000:]
    # (Both may stop: the second fences the first's Kafka producer while the first has
    # divided a step the second's view of the state predates. Never neither.)
    # Whatever each did before the fence, the output is exactly once.
    rc, _, err = run_child(root, broker, (orders, customers, out))
    assert rc == 0, err[-2000:]
    with Pipeline(shop(), root, spark) as p:
        for view, topic in (("orders_copy", f"{out}-copy"), ("by_region", f"{out}-region")):
            assert steps_seen(broker, topic) == log_steps(p, view), view
        integrated = Counter({(r["order_id"], r["customer_id"], r["amount"]): r["_weight"]
                              for r in p.input_view_arrow("orders").to_pylist()})
        assert integrated == expected_orders
