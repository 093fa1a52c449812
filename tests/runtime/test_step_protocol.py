"""Steps that carry their input (``Pipeline.step(changes)``, ``step_protocol.execute_step``):
the pushes are committed while the step computes, at the log versions its division names.

A step carrying its pushes must be exactly ``push_zset`` of each, then ``step()``: the same
output and state, step by step (randomized, with deletes, on the driver and on Spark with
two owners), and the oracle after every step. Bad input is refused before anything is
written; a producer's batch is recorded once; a push that loses its version to another writer
undoes the step, which executes again over both pushes; a step divided before leaves its
carried pushes to the next one. Crashes at every durable action of carried steps are in
``test_crash_recovery.py``.
"""

from __future__ import annotations

import glob
import random
import time
from typing import Any

import pyarrow as pa
import pytest

from dbsp_pipeline import InputError, Pipeline, StepFailedError
from dbsp_pipeline.runtime import input_log
from dbsp_pipeline.runtime.input_log import InputLog
from dbsp_pipeline.runtime.recompute import check_views
from tests.runtime.test_failed_steps import poison_circuit
from tests.runtime.workload import circuit

ORDERS = pa.schema([("order_id", pa.int64()), ("customer_id", pa.int64()),
                    ("amount", pa.float64()), ("_weight", pa.int64())])
CUSTOMERS = pa.schema([("customer_id", pa.int64()), ("region", pa.string()),
                       ("_weight", pa.int64())])


def zset(schema: pa.Schema, rows: list[tuple]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, r)) for r in rows], schema=schema)


def random_steps(seed: int, steps: int) -> list[dict[str, pa.Table]]:
    """Per step, a Z-set per input: new orders, deletes of live ones, customers that move
    (a delete and an insert); some steps change one input only."""
    rng = random.Random(seed)
    live: list[tuple] = []
    regions = {c: f"region-{c % 3}" for c in range(6)}
    out: list[dict[str, pa.Table]] = [{"customers": zset(
        CUSTOMERS, [(c, r, 1) for c, r in regions.items()])}]
    next_id = 0
    for _ in range(steps):
        changes = {}
        if rng.random() < 0.8:
            rows = []
            for _ in range(rng.randint(1, 12)):
                order = (next_id, rng.randrange(8), rng.randint(100, 99_999) / 100)
                next_id += 1
                live.append(order)
                rows.append((*order, 1))
            for _ in range(min(len(live) - 1, rng.randint(0, 4))):
                rows.append((*live.pop(rng.randrange(len(live))), -1))
            changes["orders"] = zset(ORDERS, rows)
        if rng.random() < 0.4:
            c = rng.randrange(6)
            old, regions[c] = regions[c], f"region-{rng.randrange(4)}"
            changes["customers"] = zset(CUSTOMERS, [(c, old, -1), (c, regions[c], 1)])
        out.append(changes)
    return out


def views(p: Pipeline) -> dict[str, list]:
    return {v: sorted(p.view_arrow(v).to_pylist(), key=repr) for v in p.circuit.outputs}


def assert_oracle(p: Pipeline) -> None:
    for check in check_views(p).values():
        assert check.equal and check.nonpositive == 0, check


@pytest.mark.parametrize("on_spark", [False, True], ids=["driver", "spark-W2"])
def test_a_step_carrying_its_pushes_is_push_then_step(spark, tmp_path, on_spark):
    """Step by step the same result, views, state and input-log versions as ``push_zset`` of
    each change then ``step()``; the oracle holds after every step."""
    rows = 0 if on_spark else 10**9
    steps = random_steps(seed=11, steps=4 if on_spark else 14)
    pushed = Pipeline(circuit(), str(tmp_path / "pushed"), spark, driver_step_rows=rows)
    carried = Pipeline(circuit(), str(tmp_path / "carried"), spark, driver_step_rows=rows)
    if on_spark:
        pushed.rescale(2)
        carried.rescale(2)
    for changes in steps:
        for name, table in changes.items():
            pushed.push_zset(name, table)
        a = pushed.step()
        b = carried.step(changes)
        assert (b.step, b.inputs, b.outputs, b.on_driver) == (a.step, a.inputs, a.outputs,
                                                               a.on_driver)
        assert views(carried) == views(pushed)
        assert carried.step_info(b.step) == pushed.step_info(a.step)
        assert_oracle(carried)
    assert not on_spark or "per owner (W=2)" in b.path_reason
    state = {}
    for p in (pushed, carried):
        state[p.root] = {t.name: sorted(p.engine.sql.consolidate(t.read_arrow(), t.payload)
                                        .to_pylist(), key=repr)
                         for t in p.engine.plan.traces()}
    assert state[pushed.root] == state[carried.root]
    pushed.close()
    carried.close()
    # reopened, the carried root holds every push as a push would have left it
    with Pipeline(circuit(), str(tmp_path / "carried"), spark) as p:
        assert p.recovered_steps == [] and views(p) == views(Pipeline(
            circuit(), str(tmp_path / "pushed"), spark))
        assert_oracle(p)


def test_bad_input_in_a_carried_push_is_refused_before_anything_is_written(spark, tmp_path):
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        p.step(random_steps(seed=3, steps=0)[0])
        before = (p.engine.input("orders").version(), p.engine.input("customers").version())
        files = sorted(glob.glob(f"{tmp_path}/inputs/**/*.parquet", recursive=True))
        assert files
        bad = pa.table({"order_id": [1, 2], "customer_id": [1, 1], "amount": [1.0, 2.0],
                        "_weight": pa.array([1, 0], pa.int64())})
        with pytest.raises(InputError, match=r"input 'orders', record 1 .*'_weight'"):
            p.step({"customers": zset(CUSTOMERS, [(9, "x", 1)]), "orders": bad})
        assert (p.engine.input("orders").version(),
                p.engine.input("customers").version()) == before
        assert sorted(glob.glob(f"{tmp_path}/inputs/**/*.parquet", recursive=True)) == files
        assert p.next_step == 1 and p.failed_step is None
        good = zset(ORDERS, [(1, 1, 1.0, 1)])
        assert p.step({"orders": good}).inputs == {"orders": 1, "customers": 0}
        assert_oracle(p)


def test_a_carried_push_is_recorded_once_per_producer(spark, tmp_path):
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        first = random_steps(seed=5, steps=1)
        p.step(first[0], producer="loader", seq=0)
        before = views(p)
        assert p.step(first[0], producer="loader", seq=0).inputs == {"orders": 0,
                                                                     "customers": 0}
        assert views(p) == before and p.pushed("customers", "loader") == 0
        assert p.step(first[1], producer="loader", seq=1).step == 2
        assert p.pushed("orders", "loader") == 1
        assert_oracle(p)


def test_a_carried_push_that_loses_its_version_redoes_the_step(spark, tmp_path, monkeypatch):
    """Another writer's push takes the version the carried push was to land at: the step is
    undone and executes again over both pushes (the division covers both), and the oracle
    holds."""
    root = str(tmp_path)
    with Pipeline(circuit(), root, spark) as p:
        p.step(random_steps(seed=3, steps=0)[0])
        other = InputLog(spark, root, "orders", p.input_schema("orders"))
        land = input_log.InputLog.land_in_background
        raced = []

        def race(self, push, version):
            if not raced:  # the other writer commits first, at the version wanted
                raced.append(other.append_arrow(zset(ORDERS, [(100, 1, 5.0, 1)])))
            return land(self, push, version)

        monkeypatch.setattr(input_log.InputLog, "land_in_background", race)
        lower = p.step_info(0).inputs["orders"][1]
        result = p.step({"orders": zset(ORDERS, [(1, 1, 1.0, 1), (2, 2, 2.0, 1)])})
        assert raced == [1] and result.step == 1 and result.inputs["orders"] == 3
        assert p.step_info(1).inputs["orders"] == (lower, lower + 2)
        assert_oracle(p)
        assert p.step().inputs == {"orders": 0, "customers": 0}


def test_a_step_divided_before_leaves_its_carried_pushes_to_the_next_step(spark, tmp_path):
    """A failed step keeps its division: carried pushes are pushed as they are, for the step
    after it (here after the failed step's input is quarantined)."""
    with Pipeline(poison_circuit(), str(tmp_path), spark) as p:
        w = 2**31 - 1
        p.push("b", [(3, 3)], weight=w)
        p.push("d", [(3, 7)], weight=w)
        a = pa.schema([("k", pa.int64()), ("x", pa.int64()), ("_weight", pa.int64())])
        with pytest.raises(StepFailedError, match="overflow|Overflow"):
            p.step({"a": zset(a, [(3, 30, w)])})
        with pytest.raises(StepFailedError):  # the same division again, with a push beside
            p.step({"a": zset(a, [(5, 50, 1)])})
        assert p.failed_step is not None and p.failed_step.step == 0
        done = p.quarantine_step(0)
        assert done.moved == {"a": 1, "b": 1, "d": 1}
        assert p.step().inputs == {"a": 1, "b": 0, "d": 0}
        assert p.view_arrow("n").to_pylist() == [{"k": 5, "n": 1, "_weight": 1}]
        assert_oracle(p)


def test_a_step_carries_several_pushes_to_one_input_in_order(spark, tmp_path):
    """Two producers' written pushes to one input (a runner's two partition batches) land at
    the next two versions, in the order given, each with its producer's number; a step
    carrying a push whose number is recorded already carries nothing of it."""
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        p.step(random_steps(seed=3, steps=0)[0])
        lower = p.step_info(0).inputs["orders"][1]
        pushes = [("orders", p.write_push("orders", zset(ORDERS, [(i, i % 6, i / 2, 1)]),
                                          producer=f"part-{i}", seq=10 + i))
                  for i in range(2)]
        result = p.step_carrying(pushes)
        assert result.inputs["orders"] == 2
        assert p.step_info(1).inputs["orders"] == (lower, lower + 2)
        assert [p.pushed("orders", f"part-{i}") for i in range(2)] == [10, 11]
        assert p.write_push("orders", zset(ORDERS, [(9, 1, 1.0, 1)]),
                            producer="part-0", seq=10) is None
        assert_oracle(p)


@pytest.mark.parametrize("on_spark", [False, True], ids=["driver", "spark-W2"])
def test_a_steps_seconds_are_told_by_phase(spark, tmp_path, monkeypatch, on_spark):
    """``StepResult.phase_seconds``: every phase of ``STEP_PHASES`` a step goes through, in
    order (``push`` only for a step given changes), summing to ``seconds`` but for the few
    statements between phases; each phase holds the work done in it: a pause added to the
    work of one phase (the push's file, the division, the path's choice, the operators, a
    view's write, the checkpoint's commit, the upkeep after it) shows in that phase, and on
    the driver in no other."""
    from dbsp_pipeline.runtime import output_log, plan, upkeep
    from dbsp_pipeline.runtime.results import STEP_PHASES

    p = Pipeline(circuit(), str(tmp_path / "root"), spark,
                 driver_step_rows=0 if on_spark else 10**9)
    if on_spark:
        p.rescale(2)
    steps = random_steps(seed=3, steps=6)
    plain = p.step()  # nothing carried: no push
    assert list(plain.phase_seconds) == [s for s in STEP_PHASES if s != "push"]
    pause = 0.5
    engine = p.engine
    for phase, owner, name in (("push", InputLog, "write_push"),
                               ("divide", type(engine.db), "get_step"),
                               ("read", type(engine), "choose_path"),
                               ("operators", plan.Plan, "evaluate"),
                               ("outputs", output_log.OutputLog, "prepare"),
                               ("commit", type(engine.db), "commit"),
                               ("upkeep", upkeep, "after_commit")):
        changes = steps.pop(0)
        changes.setdefault("orders", zset(ORDERS, [(1000 + len(steps), 1, 5.0, 1)]))
        with monkeypatch.context() as m:
            m.setattr(owner, name, _paused(getattr(owner, name), pause))
            r = p.step(changes)
        assert list(r.phase_seconds) == list(STEP_PHASES), r.phase_seconds
        assert r.phase_seconds[phase] >= pause, (phase, r.phase_seconds)
        if not on_spark:  # (a Spark job may take longer than the pause)
            others = {k: v for k, v in r.phase_seconds.items() if k != phase}
            assert all(0 <= v < pause for v in others.values()), (phase, r.phase_seconds)
        total = sum(r.phase_seconds.values())
        assert total <= r.seconds + 1e-6 and r.seconds - total < 0.05 + 0.05 * r.seconds
        assert r.on_driver is not on_spark
    assert not on_spark or "per owner (W=2)" in r.path_reason
    p.close()


@pytest.mark.parametrize("on_spark", [False, True], ids=["driver", "spark-W2"])
def test_a_steps_operators_phase_is_told_by_operator(spark, tmp_path, monkeypatch, on_spark):
    """``StepResult.operator_seconds``: the ``operators`` phase by operator, named as its state
    tables are (``n<id>_<op>``), together at most the phase; on the driver every operator has
    its own (a pause added to the join's shows in the join's alone); on Spark the names are
    the operators' (or an input's whose files the tasks split, ``input:<name>``; a gang job's
    stages, where one runs, joined by ``+``)."""
    from dbsp_pipeline.operators.join import Join

    p = Pipeline(circuit(), str(tmp_path / "root"), spark,
                 driver_step_rows=0 if on_spark else 10**9)
    plan = p.engine.plan
    names = {plan.operator_label(n) for n in p.circuit.nodes if n.op != "input"}
    join = next(plan.operator_label(n) for n in p.circuit.nodes if n.op == "join")
    assert join.endswith("_join") and join in set(plan.state_names.values())
    if on_spark:
        p.rescale(2)
    pause = 0.5
    for changes in random_steps(seed=5, steps=2):
        with monkeypatch.context() as m:
            if not on_spark:
                m.setattr(Join, "step_local", _paused(Join.step_local, pause))
            r = p.step(changes)
        spent = r.operator_seconds
        assert spent and all(v >= 0 for v in spent.values())
        assert sum(spent.values()) <= r.phase_seconds["operators"] + 1e-6
        labels = {part for label in spent for part in label.split("+")}
        assert labels <= names | {f"input:{n}" for n in p.circuit.inputs}, spent
        if not on_spark:
            assert set(spent) == names and spent[join] >= pause, spent
            assert all(v < pause for label, v in spent.items() if label != join), spent
    p.close()


def _paused(f: Any, seconds: float) -> Any:
    """``f`` after a pause of ``seconds``."""
    def paused(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return f(*args, **kwargs)
    return paused
