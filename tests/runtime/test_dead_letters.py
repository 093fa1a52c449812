"""Repairable dead letters: a rejected Kafka record, a rejected inbox file and a quarantined
step's records are fixed and re-injected by their error id, exactly once however often it is
tried, and the views change by exactly their effect (``runtime/dead_letters.py``)."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from dbsp_pipeline import Circuit, InputError, Pipeline, StepFailedError, UsageError
from dbsp_pipeline.connectors.inbox import ingest
from dbsp_pipeline.connectors.kafka import KafkaInput, KafkaSource
from dbsp_pipeline.runtime.dead_letters import error_id
from tests.kafka_helpers import new_topic, produce
from tests.runtime.test_failed_steps import W, assert_oracle, poison_circuit, push_poison


def orders_circuit() -> Circuit:
    c = Circuit("dead_letters")
    orders = c.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE")
    c.output("per_customer", orders.group_by("customer_id").agg(n="count(*)",
                                                                 total="sum(amount)"))
    return c


def view(p: Pipeline, name: str) -> list[dict]:
    return sorted(p.view_arrow(name).to_pylist(), key=repr)


def test_a_rejected_kafka_record_fixed_and_reinjected_twice_lands_once(spark, tmp_path, broker):
    topic = new_topic(broker, prefix="dead")
    produce(broker, topic, [
        {"order_id": 1, "customer_id": 1, "amount": 1.5},
        {"order_id": "two", "customer_id": 2, "amount": 2.5},  # rejected: offset 1
        {"order_id": 3, "customer_id": 1, "amount": 3.0},
    ])
    root = str(tmp_path)
    with Pipeline(orders_circuit(), root, spark) as p:
        source = KafkaSource(p, broker, [KafkaInput("orders", topic)])
        deadline, seen = time.monotonic() + 30, 0
        while seen < 3 and time.monotonic() < deadline:
            seen += source.poll(timeout=1).records
        source.close()
        assert p.step().rejected == {"orders": 1}
        errors = p.errors().to_pylist()
        bad = error_id("orders", topic, 0, 1)
        assert [(e["id"], e["resolved"]) for e in errors] == [(bad, False)]
        assert '"two"' in errors[0]["record"] and "'two'" in errors[0]["reason"]

        with pytest.raises(UsageError, match="no rejected record has the id 'orders@nope/0/9'"):
            p.reinject({"orders@nope/0/9": {"order_id": 2, "customer_id": 2, "amount": 2.5}})
        with pytest.raises(InputError, match="input 'orders'.*order_id"):
            p.reinject({bad: {"order_id": "still two", "customer_id": 2, "amount": 2.5}})
        assert not p.input_pending() and p.errors().column("resolved").to_pylist() == [False]

        fixed = {"order_id": 2, "customer_id": 2, "amount": 2.5}
        assert p.reinject({bad: fixed}) == {bad: 1}
        assert p.reinject({bad: fixed}) == {bad: 0}  # a second re-injection: nothing
        before = view(p, "per_customer")
        r = p.step()
        assert r.inputs == {"orders": 1}
        assert view(p, "per_customer") == sorted(
            before + [{"customer_id": 2, "n": 1, "total": 2.5, "_weight": 1}], key=repr)
        assert p.errors().column("resolved").to_pylist() == [True]
    with Pipeline(orders_circuit(), root, spark) as p:  # after reopening: still once
        assert p.reinject({bad: [fixed, fixed]}) == {bad: 0}
        assert not p.input_pending()
        assert p.errors().column("resolved").to_pylist() == [True]
        assert_oracle(p)


def test_a_quarantined_record_is_reinjected_by_its_place_in_the_step(spark, tmp_path):
    """The quarantined step's records are numbered within each input; one of them, fixed (a
    weight that no longer overflows the join), is re-injected, and the others stay out."""
    with Pipeline(poison_circuit(), str(tmp_path), spark) as p:
        p.push("a", [(1, 10)])
        p.push("b", [(1, 1), (3, 3)])
        p.push("d", [(1, 5), (3, 7)])
        p.step()
        push_poison(p)
        with pytest.raises(StepFailedError):
            p.step()
        p.quarantine_step(1)
        errors = p.errors().to_pylist()
        ids = {(e["input"], e["record"]): e["id"] for e in errors}
        assert sorted(ids.values()) == ["a@step 1/-/0", "a@step 1/-/1", "b@step 1/-/0",
                                        "d@step 1/-/0"]
        poisoned = next(i for (name, record), i in ids.items()
                        if name == "a" and f'"_weight": {W}' in record)
        fix = {"k": 3, "x": 30, "_weight": 2}
        assert p.reinject({poisoned: fix}) == {poisoned: 1}
        assert p.reinject({poisoned: fix}) == {poisoned: 0}
        p.step()
        assert [r["n"] for r in view(p, "n") if r["k"] == 3] == [2]
        assert [(r["k"], r["_weight"]) for r in view(p, "abd")] == [(1, 1), (3, 2)]
        resolved = {e["id"]: e["resolved"] for e in p.errors().to_pylist()}
        assert resolved == {i: i == poisoned for i in ids.values()}
        assert_oracle(p)


def test_a_rejected_inbox_file_fixed_and_reinjected_twice_lands_once(spark, tmp_path):
    """A file with one bad record is rejected whole (moved to ``rejected/``) and recorded in
    the errors table once, however often it is dropped again; its error id re-injects the
    file's corrected rows, exactly once."""
    box = str(tmp_path / "inbox")
    bad = ('{"order_id": 1, "customer_id": 1, "amount": 1.5}\n'
           '{"order_id": 2, "customer_id": 2, "amount": 2.5, "_weight": 0}\n')
    with Pipeline(orders_circuit(), str(tmp_path / "root"), spark) as p:
        for _ in range(2):  # the same content dropped twice: one error row
            os.makedirs(os.path.join(box, "orders"), exist_ok=True)
            path = os.path.join(box, "orders", "batch.jsonl")
            with open(path, "w") as f:
                f.write(bad)
            os.utime(path, (time.time() - 60, time.time() - 60))
            result = ingest(p, box)
            assert "record 1" in result.rejected["orders"]["batch.jsonl"]
        errors = p.errors().to_pylist()
        digest = hashlib.sha256(bad.encode()).hexdigest()
        assert [(e["id"], e["record"], e["resolved"]) for e in errors] == [
            (f"orders@inbox/batch.jsonl@{digest[:12]}/-/1", bad, False)]
        fixed = [{"order_id": 1, "customer_id": 1, "amount": 1.5},
                 {"order_id": 2, "customer_id": 2, "amount": 2.5}]
        assert p.reinject({errors[0]["id"]: fixed}) == {errors[0]["id"]: 2}
        assert p.reinject({errors[0]["id"]: fixed}) == {errors[0]["id"]: 0}
        p.step()
        assert view(p, "per_customer") == [
            {"customer_id": 1, "n": 1, "total": 1.5, "_weight": 1},
            {"customer_id": 2, "n": 1, "total": 2.5, "_weight": 1}]
        assert p.errors().column("resolved").to_pylist() == [True]
