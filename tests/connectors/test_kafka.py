"""Kafka in and out against the real local broker: envelopes and formats, offsets in the
divisions, exactly-once output read with read_committed, bad records to the errors sink."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from decimal import Decimal

import pytest

from dbsp_pipeline import Circuit, Pipeline, UsageError
from dbsp_pipeline.circuit import node_collection
from dbsp_pipeline.connectors.codec import Batch
from dbsp_pipeline.connectors.errors_sink import ErrorsSink
from dbsp_pipeline.connectors.kafka import (
    STEPS_SUFFIX,
    KafkaInput,
    KafkaOutput,
    KafkaRunner,
    KafkaSink,
    KafkaSource,
    topic_lag,
)
from dbsp_pipeline.driver.sql import zset_arrow_schema
from dbsp_pipeline.runtime.recompute import check_views
from tests.kafka_helpers import consume_all, new_topic, produce
from tests.object_store_helpers import new_bucket


def shop() -> Circuit:
    c = Circuit("kshop")
    orders = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    customers = c.input("customers", "customer_id BIGINT, region STRING")
    c.output("orders_copy", orders.select("order_id", "customer_id", "amount"))
    c.output("by_region", orders.join(customers, on="customer_id").group_by("region")
             .agg(n="count(*)", total="sum(amount)"))
    return c


def kafka_changes(config, topic) -> Counter:
    """The consolidated changes a read_committed consumer sees on ``topic``."""
    out: Counter = Counter()
    for _, _, _, value in consume_all(config, topic):
        record = json.loads(value)
        copies = record.pop("weight", 1)
        (kind, row), = record.items()
        out[tuple(sorted(row.items()))] += copies if kind == "insert" else -copies
    return Counter({k: v for k, v in out.items() if v})


def view_rows(p, view) -> Counter:
    return Counter({tuple(sorted((k, v) for k, v in r.items() if k != "_weight")): r["_weight"]
                    for r in p.view_arrow(view).to_pylist()})


def test_json_and_csv_inputs_flow_to_exactly_once_output(spark, tmp_path, broker):
    orders_topic = new_topic(broker, partitions=3, prefix="orders")
    customers_topic = new_topic(broker, prefix="customers")
    out_copy, out_region = f"copy-{orders_topic}", f"region-{orders_topic}"
    produce(broker, customers_topic, [b"1,north", b"2,south", b"3,east,1"])
    orders = [{"order_id": i, "customer_id": 1 + i % 3, "amount": float(i)} for i in range(12)]
    produce(broker, orders_topic, orders, partition_of=lambda i, v: i % 3)
    produce(broker, orders_topic, [{"delete": orders[4]}, {"insert": {"order_id": 99,
             "customer_id": 2, "amount": 5.5}}], partition_of=lambda i, v: 1)

    with Pipeline(shop(), str(tmp_path), spark) as p:
        runner = KafkaRunner(p, broker,
                             [KafkaInput("orders", orders_topic),
                              KafkaInput("customers", customers_topic, format="csv")],
                             [KafkaOutput("orders_copy", out_copy, partitions=2),
                              KafkaOutput("by_region", out_region)])
        results = runner.run(idle_seconds=2)
        assert results and sum(sum(r.inputs.values()) for r in results) == 12 + 2 + 3
        info = p.step_info(results[0].step)
        assert set(info.offsets) == {"orders", "customers"}
        total = {}
        for r in results:
            for producer, (_after, upto) in p.step_info(r.step).offsets["orders"].items():
                total[producer] = upto
        assert total == {f"kafka/{orders_topic}/0": 3, f"kafka/{orders_topic}/1": 5,
                         f"kafka/{orders_topic}/2": 3}
        # what a read_committed consumer sees is the view, exactly
        assert kafka_changes(broker, out_copy) == view_rows(p, "orders_copy")
        assert kafka_changes(broker, out_region) == view_rows(p, "by_region")
        assert len(view_rows(p, "orders_copy")) == 12
        side = [json.loads(v) for *_, v in consume_all(broker, out_copy + STEPS_SUFFIX)]
        assert [s["step"] for s in side] == [r.step for r in results]
        assert side[0]["offsets"]["orders"]  # the input offsets each step consumed
        runner.close()

        # A new sink starts after the last step it finds on the side topic: nothing twice.
        again = KafkaSink(p, broker, [KafkaOutput("orders_copy", out_copy)])
        assert again.last["orders_copy"] == results[-1].step + 1 and again.emit() == []
        again.close()


def test_a_sink_applying_changes_ends_at_a_changed_views_new_contents(spark, tmp_path,
                                                                      broker):
    """An upgrade changes ``by_region`` (a filter before its join) and adds ``big``: the
    upgrade step's change goes to Kafka like any step's, so a consumer that applied every
    change holds each view's new contents, without the topic being cleared; the sources
    resume where the old circuit stopped."""
    orders_topic, customers_topic = new_topic(broker, prefix="uorders"), new_topic(broker)
    out_region, out_big = f"region-{orders_topic}", f"big-{orders_topic}"
    produce(broker, customers_topic, [b"1,north", b"2,south", b"3,east"])
    produce(broker, orders_topic, [{"order_id": i, "customer_id": 1 + i % 3,
                                    "amount": float(i)} for i in range(12)])
    inputs = [KafkaInput("orders", orders_topic),
              KafkaInput("customers", customers_topic, format="csv")]
    with Pipeline(shop(), str(tmp_path), spark) as p:
        runner = KafkaRunner(p, broker, inputs, [KafkaOutput("by_region", out_region)])
        runner.run(idle_seconds=2)
        runner.close()
    changed = shop()
    orders_node = node_collection(changed, changed.inputs["orders"])
    customers_node = node_collection(changed, changed.inputs["customers"])
    changed.outputs.pop("by_region")
    big = orders_node.filter("amount > 4")
    changed.output("by_region", big.join(customers_node, on="customer_id").group_by("region")
                   .agg(n="count(*)", total="sum(amount)"))
    changed.output("big", big)
    with Pipeline(changed, str(tmp_path), spark, upgrade=True) as p:
        assert p.circuit_change is not None
        assert p.circuit_change.views_changed == ["by_region"]
        produce(broker, orders_topic, [{"delete": {"order_id": 7, "customer_id": 2,
                                                   "amount": 7.0}},
                                       {"order_id": 20, "customer_id": 3, "amount": 20.0}])
        runner = KafkaRunner(p, broker, inputs, [KafkaOutput("by_region", out_region),
                                                 KafkaOutput("big", out_big)])
        results = runner.run(idle_seconds=2)
        runner.close()
        assert sum(sum(r.inputs.values()) for r in results) == 2  # nothing read twice
        assert kafka_changes(broker, out_region) == view_rows(p, "by_region")
        assert kafka_changes(broker, out_big) == view_rows(p, "big")
        assert len(view_rows(p, "big")) == 12 - 5 - 1 + 1
        checks = check_views(p)
        assert all(c.equal for c in checks.values()), checks


def test_decimal_date_and_timestamp_values_cross_kafka_exactly(spark, tmp_path, broker):
    c = Circuit("ktyped")
    pay = c.input("payments", "id BIGINT, amount DECIMAL(12,2), day DATE, at TIMESTAMP")
    c.output("by_day", pay.group_by("day").agg(total="sum(amount)", first="min(at)", n="count(*)"))
    source, sink = new_topic(broker, prefix="typed"), new_topic(broker, prefix="typed-out")
    produce(broker, source, [
        b'{"id": 1, "amount": 0.10, "day": "2024-01-31", "at": "2024-01-31T10:00:00.5"}',
        b'{"id": 2, "amount": "0.20", "day": "2024-01-31", "at": "2024-01-31T12:00:00+01:00"}',
        b'{"id": 3, "amount": 9999999999.99, "day": null, "at": null}',
        b'{"id": 4, "amount": 0.001, "day": "2024-02-01", "at": null}',  # refused: not rounded
        b'{"delete": {"id": 3, "amount": 9999999999.99, "day": null, "at": null}}',
        b'{"id": 5, "amount": 7, "day": "2024-02-01", "at": "2024-02-01 00:00:00Z"}'])
    with Pipeline(c, str(tmp_path), spark) as p:
        runner = KafkaRunner(p, broker, [KafkaInput("payments", source)],
                             [KafkaOutput("by_day", sink)])
        results = runner.run(idle_seconds=2)
        runner.close()
        assert sum(n for r in results for n in r.rejected.values()) == 1
        view = {r["day"]: (r["total"], r["first"], r["n"])
                for r in p.view_arrow("by_day").to_pylist()}
        utc = dt.UTC
        assert view == {
            dt.date(2024, 1, 31): (Decimal("0.30"), dt.datetime(2024, 1, 31, 10, 0, 0, 500000,
                                                                tzinfo=utc), 2),
            dt.date(2024, 2, 1): (Decimal("7.00"), dt.datetime(2024, 2, 1, tzinfo=utc), 1)}
        # the output records carry the same values exactly, and read back as the same rows
        out = p.view_schema("by_day")
        batch = Batch("by_day", out.fieldNames())
        for i, (*_, value) in enumerate(consume_all(broker, sink)):
            batch.add(i, value)
        assert batch.bad == []
        read_back: Counter = Counter()
        for r in batch.to_zset(out, zset_arrow_schema(out)).to_pylist():
            read_back[(r["day"], r["total"], r["first"], r["n"])] += r["_weight"]
        assert +read_back == Counter({(d, *v): 1 for d, v in view.items()})
        first = json.loads(consume_all(broker, sink)[0][3])["insert"]
        assert first["total"] == "0.30" and first["first"] == "2024-01-31T10:00:00.500000+00:00"


def test_bad_records_go_to_the_errors_sink_and_the_rest_goes_on(spark, tmp_path, broker):
    topic = new_topic(broker, prefix="bad")
    produce(broker, topic, [
        {"order_id": 1, "customer_id": 1, "amount": 1.0},
        b"{not json",
        {"order_id": "two", "customer_id": 1, "amount": 2.0},
        {"order_id": 3, "amount": 3.0},
        {"upsert": {"order_id": 4, "customer_id": 1, "amount": 4.0}},
        [1, 2, 3],
        {"delete": {"order_id": 1, "customer_id": 1, "amount": 1.0}},
        {"order_id": 5, "customer_id": 1, "amount": 5.0},
    ])
    with Pipeline(shop(), str(tmp_path), spark) as p:
        source = KafkaSource(p, broker, [KafkaInput("orders", topic)])
        pushed = rejected = 0
        deadline = time.monotonic() + 30
        while pushed + rejected < 8 and time.monotonic() < deadline:
            polled = source.poll(timeout=1)
            pushed += polled.pushed.get("orders", 0)
            rejected += polled.rejected.get("orders", 0)
        assert (pushed, rejected) == (3, 5)
        r = p.step()
        assert r.rejected == {"orders": 5}
        assert view_rows(p, "orders_copy") == {
            (("amount", 5.0), ("customer_id", 1), ("order_id", 5)): 1}
        errors = ErrorsSink(p.spark, p.root).read().to_pylist()
        assert [(e["source"], e["partition"], e["offset"]) for e in errors] == [
            (topic, 0, o) for o in (1, 2, 3, 4, 5)]
        reasons = [e["reason"] for e in errors]
        assert "undecodable JSON" in reasons[0]
        assert "column 'order_id'" in reasons[1] and "'two'" in reasons[1]
        assert "missing field(s) ['customer_id']" in reasons[2]
        assert "unknown envelope 'upsert'" in reasons[3]
        assert "must be a JSON object" in reasons[4]
        assert errors[0]["record"] == "{not json"
        source.close()


def test_poison_weights_go_to_the_errors_sink_and_restarts_go_on(spark, tmp_path, broker):
    """CSV weights beyond 2**31 - 1 (one beyond 64 bits, which used to raise OverflowError on
    every restart) are rejected per record; the partition's good records enter once."""
    topic = new_topic(broker, prefix="poison")
    produce(broker, topic, [b"1,north", b"2,south," + str(2**70).encode(), b"3,east,2",
                            b"4,west," + str(2**62).encode(), b"5,up," + str(2**31).encode(),
                            b"6,down,2147483647"])
    c = Circuit("kpoison")
    customers = c.input("customers", "customer_id BIGINT, region STRING")
    c.output("regions", customers.group_by("region").agg(n="count(*)"))
    for attempt in range(2):  # a restart reads nothing twice and fails on nothing
        with Pipeline(c, str(tmp_path), spark) as p:
            source = KafkaSource(p, broker, [KafkaInput("customers", topic, format="csv")])
            deadline = time.monotonic() + 30
            while attempt == 0 and time.monotonic() < deadline:
                polled = source.poll(timeout=1)
                if sum(polled.pushed.values()) + sum(polled.rejected.values()):
                    break
            source.poll(timeout=1)
            p.run()
            assert view_rows(p, "regions") == {(("n", 1), ("region", "north")): 1,
                                               (("n", 2), ("region", "east")): 1,
                                               (("n", 2147483647), ("region", "down")): 1}
            errors = ErrorsSink(p.spark, p.root).read().to_pylist()
            assert [e["offset"] for e in errors] == [1, 3, 4]
            assert all("weight field must be a non-zero integer of absolute value at most "
                       "2147483647" in e["reason"] for e in errors)
            source.close()


def copied_orders(p: Pipeline) -> Counter:
    """The ``orders_copy`` view's rows, each as many times as its weight."""
    return Counter(tuple(r[k] for k in ("order_id", "customer_id", "amount"))
                   for r in p.view_arrow("orders_copy").to_pylist() for _ in range(r["_weight"]))


def test_each_worker_reads_its_partitions_and_a_rescale_moves_them_exactly_once(
        spark, tmp_path, broker, monkeypatch):
    """At W=2 the runner has a source per worker, worker w reading the partitions p with
    p mod 2 == w with its own consumer; after a rescale to 3 each partition is read by its new
    owner from its recorded offset, and after a scale-in to 1 by the one worker left: every
    record enters exactly once, and each step's offsets per partition follow on. Each step
    carries the partition batches it polled (no plain push: they land while it computes)."""
    def no_plain_push(*args, **kwargs):
        raise AssertionError("the runner pushed a batch instead of carrying it")

    monkeypatch.setattr(Pipeline, "push_zset", no_plain_push)
    topic = new_topic(broker, partitions=4, prefix="workers")
    c = Circuit("kworkers")
    orders = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    c.output("orders_copy", orders.select("order_id", "customer_id", "amount"))
    sent: list[dict] = []

    def send(n: int) -> None:
        batch = [{"order_id": len(sent) + i, "customer_id": i % 5, "amount": i / 4}
                 for i in range(n)]
        produce(broker, topic, batch, partition_of=lambda i, v: v["order_id"] % 4)
        sent.extend(batch)

    def assigned(runner) -> list[list[int]]:
        return [[p for _, p in s.assigned] for s in runner.sources]

    with Pipeline(c, str(tmp_path), spark) as p:
        p.rescale(2)
        runner = KafkaRunner(p, broker, [KafkaInput("orders", topic)])
        try:
            send(40)
            steps = runner.run(idle_seconds=1.5)
            assert [s.worker for s in runner.sources] == [0, 1]
            assert assigned(runner) == [[0, 2], [1, 3]]
            p.rescale(3)
            send(30)
            steps += runner.run(idle_seconds=1.5)
            assert assigned(runner) == [[0, 3], [1], [2]]
            p.rescale(1)
            send(20)
            steps += runner.run(idle_seconds=1.5)
            assert assigned(runner) == [[0, 1, 2, 3]]
        finally:
            runner.close()
        assert copied_orders(p) == Counter(
            (o["order_id"], o["customer_id"], o["amount"]) for o in sent)
        reached = {}
        for r in steps:
            for producer, (after, upto) in p.step_info(r.step).offsets["orders"].items():
                assert after == reached.get(producer) or after == upto, (producer, after, upto)
                reached[producer] = upto
        assert reached == {f"kafka/{topic}/{q}": 89 // 4 - (q > 89 % 4) for q in range(4)}


def test_a_failed_poll_of_one_worker_loses_no_batch_another_wrote(spark, tmp_path, broker):
    """At W=2, worker 0's source writes its batches for the next step to carry, and worker 1's
    poll fails: no step carries what worker 0 wrote, so its source reads it again (from the
    recorded offsets), and the next run takes every record exactly once."""
    topic = new_topic(broker, partitions=4, prefix="pollfail")
    c = Circuit("kpollfail")
    orders = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    c.output("orders_copy", orders.select("order_id", "customer_id", "amount"))
    sent = [{"order_id": i, "customer_id": i % 5, "amount": i / 4} for i in range(40)]
    produce(broker, topic, sent, partition_of=lambda i, v: v["order_id"] % 4)
    with Pipeline(c, str(tmp_path), spark) as p:
        p.rescale(2)
        runner = KafkaRunner(p, broker, [KafkaInput("orders", topic)])
        try:
            first, second = runner.sources  # one per worker, made with the runner
            real = first.poll
            wrote: list[int] = []

            def poll_first(max_records, timeout, **kwargs):
                result = real(max_records, 10, **kwargs)  # (waits for its records)
                wrote.append(result.records)
                return result

            def poll_second(*args, **kwargs):
                time.sleep(1)
                raise RuntimeError("worker 1 cannot read")

            first.poll, second.poll = poll_first, poll_second
            carried: list = []
            with pytest.raises(RuntimeError, match="worker 1 cannot read"):
                runner.poll(carry=carried)
            assert wrote and wrote[0] > 0 and carried == []
            del first.poll, second.poll
            runner.run(idle_seconds=1.5)
        finally:
            runner.close()
        assert copied_orders(p) == Counter(
            (o["order_id"], o["customer_id"], o["amount"]) for o in sent)


def test_a_topic_feeds_one_input(spark, tmp_path, broker):
    with Pipeline(shop(), str(tmp_path), spark) as p:
        with pytest.raises(UsageError, match="one input only"):
            KafkaSource(p, broker, [KafkaInput("orders", "x"), KafkaInput("customers", "x")])
        with pytest.raises(Exception, match="unknown input 'nope'"):
            KafkaSource(p, broker, [KafkaInput("nope", "y")])


def test_topic_lag_reads_the_offsets_recorded_at_an_s3_root(spark, broker, object_store,
                                                             monkeypatch):
    """The sensor's Kafka lag reads the input logs through the root's store: an object-store
    root's recorded offsets count, not an empty local folder's."""
    for name, value in object_store.items():
        monkeypatch.setenv(name, value)
    root = f"s3://{new_bucket(object_store, 'lag')}/shop"
    topic = new_topic(broker, 1, "lag")
    bindings = [KafkaInput("x", topic)]
    c = Circuit("lag")
    c.output("n", c.input("x", "k BIGINT").group_by("k").agg(n="count(*)"))
    produce(broker, topic, [{"k": 1}, {"k": 2}, {"k": 2}])
    assert topic_lag(broker, root, bindings) == {"x": 3}  # no root yet
    with Pipeline(c, root, spark) as p:
        runner = KafkaRunner(p, broker, bindings)
        try:
            assert len(runner.run(max_steps=1, idle_seconds=0.5)) == 1
        finally:
            runner.close()
    assert topic_lag(broker, root, bindings) == {"x": 0}
    produce(broker, topic, [{"k": 3}])
    assert topic_lag(broker, root, bindings) == {"x": 1}


def test_a_sink_fenced_by_a_newer_one_says_so(spark, tmp_path, broker):
    """Another sink with the pipeline's transactional id fences this one: its next write is
    ``PipelineFencedError``, however librdkafka reports it (a fenced commit, or a fatal
    error at produce time whose cause is the fence), never a storage error."""
    from dbsp_pipeline import PipelineFencedError

    out = f"fenced-{new_topic(broker, prefix='fenced')}"
    with Pipeline(shop(), str(tmp_path), spark) as p:
        old = KafkaSink(p, broker, [KafkaOutput("orders_copy", out)])
        newer = KafkaSink(p, broker, [KafkaOutput("orders_copy", out)])  # fences ``old``
        p.push("orders", [(i, 1, float(i)) for i in range(50)])
        p.step()
        with pytest.raises(PipelineFencedError, match="another process"):
            old.emit()
        assert newer.emit() == [0]
        newer.close()
    assert len(kafka_changes(broker, out)) == 50


def test_a_fatal_error_caused_by_a_fence_is_the_fencing_error(spark, tmp_path, broker):
    """librdkafka may report a fence only as a fatal error of ``produce`` (code _FATAL); its
    cause, served by the next poll, decides: a fence is ``PipelineFencedError``, any other
    fatal error a storage error."""
    from confluent_kafka import KafkaError, KafkaException

    from dbsp_pipeline import PipelineFencedError, StorageError

    class FatalProducer:  # the one call _guard makes on a fatal error: poll, raising the cause
        def __init__(self, cause: int) -> None:
            self.cause = cause

        def poll(self, timeout: float) -> int:
            raise KafkaException(KafkaError(self.cause, "the cause", fatal=True))

    def fatal() -> None:
        raise KafkaException(KafkaError(KafkaError._FATAL, "Unable to produce message"))

    out = f"fatal-{new_topic(broker, prefix='fatal')}"
    with Pipeline(shop(), str(tmp_path), spark) as p:
        sink = KafkaSink(p, broker, [KafkaOutput("orders_copy", out)])
        real, sink._producer = sink._producer, FatalProducer(KafkaError._FENCED)
        with pytest.raises(PipelineFencedError, match="another process"):
            sink._guard(fatal)
        sink._fatal, sink._producer = None, FatalProducer(KafkaError._MSG_TIMED_OUT)
        with pytest.raises(StorageError, match="Kafka producer failed"):
            sink._guard(fatal)
        sink._producer = real
        sink.close()
