"""The two-version state database: versions/open/commit/get/put/get_step/set_step, and a crash
between the trace commits and the manifest commit."""

from __future__ import annotations

import pytest
from pyspark.sql.types import LongType, StructField, StructType

from dbsp_pipeline import Pipeline
from dbsp_pipeline.examples.shop import shop_circuit
from dbsp_pipeline.runtime import step_protocol
from dbsp_pipeline.storage import state_db
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace import Trace
from tests.conftest import view_counter

SCHEMA = StructType([StructField("k", LongType())])


def test_the_seed_interface(spark, tmp_path):
    db = StateDatabase(spark, str(tmp_path), "fp")
    assert list(db.versions()) == [0]
    assert db.open() == 0 and db.get_step() == 0 and db.get("x") is None
    t = Trace(db, "t", SCHEMA, ["k"])
    t.append(spark.createDataFrame([(1, 1)], "k BIGINT, _weight BIGINT"))
    db.put("x", {"a": 1})
    db.set_step(5)
    assert db.commit() == 1
    assert list(db.versions()) == [0, 1]

    t.append(spark.createDataFrame([(2, 1)], "k BIGINT, _weight BIGINT"))
    db.set_step(9)
    assert db.commit() == 2
    assert list(db.versions()) == [1, 2]

    # Reopen at the older version: the newer one is discarded, the trace rolls back.
    db2 = StateDatabase(spark, str(tmp_path), "fp")
    assert db2.open(1) == 1
    assert db2.get_step() == 5 and db2.get("x") == {"a": 1}
    t2 = Trace(db2, "t", SCHEMA, ["k"])
    assert sorted(r.k for r in t2.read().collect()) == [1]
    assert list(db2.versions()) == [0, 1]
    with pytest.raises(Exception, match="cannot be opened"):
        db2.open(2)


def test_uncommitted_trace_writes_are_discarded_on_open(spark, tmp_path):
    db = StateDatabase(spark, str(tmp_path), "fp")
    db.open()
    t = Trace(db, "t", SCHEMA, ["k"])
    t.append(spark.createDataFrame([(1, 1)], "k BIGINT, _weight BIGINT"))
    db.commit()
    t.append(spark.createDataFrame([(2, 1)], "k BIGINT, _weight BIGINT"))  # then "crash"
    db2 = StateDatabase(spark, str(tmp_path), "fp")
    assert db2.open() == 1
    assert sorted(r.k for r in Trace(db2, "t", SCHEMA, ["k"]).read().collect()) == [1]


def test_crash_between_trace_commits_and_manifest_commit(spark, tmp_path, monkeypatch):
    root = str(tmp_path)
    with Pipeline(shop_circuit(), root=root, spark=spark) as p:
        p.push("customers", [(1, "north"), (2, "south")])
        p.push("orders", [(1, 1, 50.0), (2, 2, 20.0)])
        p.step()
        committed = {n: view_counter(p.view(n)) for n in p.circuit.outputs}
        version = p.state_version

    # Step 1 writes its traces and outputs and folds its traces (one commit each), then the
    # process dies inside the manifest commit: the step's one commit, its record, never lands.
    monkeypatch.setattr(state_db, "FOLD_ACTIONS", 1)
    p = Pipeline(shop_circuit(), root=root, spark=spark)
    p.push("orders", [(3, 1, 70.0)])
    p.push("orders", [(1, 1, 50.0)], weight=-1)
    traces = {n: t.delta.version() for n, t in p.engine.db._tables.items()}

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("simulated crash in the manifest commit")

    monkeypatch.setattr(StateDatabase, "_write_entry", crash)
    with pytest.raises(KeyboardInterrupt):
        p.step()
    monkeypatch.undo()
    assert any(t.delta.version() > traces[n] for n, t in p.engine.db._tables.items())

    # Reopen: the trace commits are rolled back to the checkpoint's versions, nothing of step
    # 1 is there (no consumer saw it), and its input is still pending: the next step takes it.
    with Pipeline(shop_circuit(), root=root, spark=spark) as q:
        assert q.recovered_steps == [] and q.next_step == 1 and q.state_version == version
        assert {n: view_counter(q.view(n)) for n in q.circuit.outputs} == committed
        q.step()
        assert view_counter(q.view("revenue_by_region")) == {
            ("north", 70.0, 1, 70.0): 1, ("south", 20.0, 1, 20.0): 1}
        q.push("orders", [(4, 2, 30.0)])
        q.step()
        assert view_counter(q.view("revenue_by_region")) == {
            ("north", 70.0, 1, 70.0): 1, ("south", 50.0, 2, 30.0): 1}


def test_retention_keeps_the_checkpoints_of_the_newest_steps():
    """A checkpoint with no step since the one below it (a close, a merge's commit) does not
    push the previous step's out; the same step counts at most SAME_STEP_EXTRA more."""
    def kept(steps: list[int], count: int) -> list[int]:
        out: list[int] = []
        for step in steps:
            if not state_db.retains(out, step, count):
                break
            out.append(step)
        return out

    assert kept([9, 8, 7], 2) == [9, 8]
    assert kept([9, 9, 8, 8, 7], 2) == [9, 9, 8, 8]
    assert kept([9] * 11 + [8], 2) == [9] * 10  # bounded: count * (1 + EXTRA)
    assert kept([9] * 9 + [8, 8, 7], 2) == [9] * 9 + [8]
    assert state_db.SAME_STEP_EXTRA == 4


def test_a_commit_without_a_step_keeps_the_previous_steps_checkpoint(spark, tmp_path):
    with Pipeline(shop_circuit(), str(tmp_path), spark, checkpoint_every=1) as p:
        p.push("customers", [(1, "north")])
        p.step()
        p.push("orders", [(1, 1, 30.0)])
        p.step()
        for _ in range(2):  # two checkpoints more, at the same step (as merges' commits make;
            step_protocol.commit(p._engine, compact=False)  # Pipeline.commit writes none)
        steps = [c.step for c in p.checkpoints()]
        assert steps[:3] == [2, 2, 2] and 1 in steps, steps
        before = next(c for c in p.checkpoints() if c.step == 1)
        p.restore(before.version)  # back one step: its order executed again
        assert view_counter(p.view("revenue_by_region")) == {("north", 30.0, 1, 30.0): 1}
