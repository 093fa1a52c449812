"""Poison input never bricks a pipeline: weights are range-checked where they enter, and a step
that fails after its division was recorded is reported, retried and can be quarantined (its
records go to the errors table) while every other record keeps exactly-once."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from dbsp_pipeline import Circuit, InputError, Pipeline, StepFailedError, UsageError
from dbsp_pipeline.connectors.errors_sink import ErrorsSink
from dbsp_pipeline.runtime.recompute import check_views
from dbsp_pipeline.storage import crash_points
from dbsp_pipeline.storage.crash_points import InjectedCrash
from dbsp_pipeline.zset import MAX_WEIGHT

W = MAX_WEIGHT


def poison_circuit() -> Circuit:
    """A three-way join: three records of weight MAX_WEIGHT give a weight beyond 64 bits."""
    c = Circuit("poison")
    a = c.input("a", "k BIGINT, x BIGINT")
    b = c.input("b", "k BIGINT, y BIGINT")
    d = c.input("d", "k BIGINT, z BIGINT")
    c.output("abd", a.join(b, "k").join(d, "k"))
    c.output("n", a.group_by("k").agg(n="count(*)"))
    return c


def views(p: Pipeline) -> dict[str, list]:
    return {name: sorted(p.view_arrow(name).to_pylist(), key=repr) for name in ("abd", "n")}


def push_poison(p: Pipeline) -> None:
    """One step's input whose join overflows, and a good record beside it."""
    p.push("a", [(3, 30)], weight=W)
    p.push("b", [(3, 3)], weight=W)
    p.push("d", [(3, 7)], weight=W)
    p.push("a", [(4, 40)])


def assert_oracle(p: Pipeline) -> None:
    for check in check_views(p).values():
        assert check.equal and check.nonpositive == 0, check


@pytest.mark.parametrize("weight", [2**31, -(2**31), 2**62, 2**64])
def test_push_weights_are_range_checked(spark, tmp_path, weight):
    with Pipeline(poison_circuit(), str(tmp_path), spark) as p:
        with pytest.raises(InputError, match=r"input 'a': weight must be a non-zero integer of "
                                             r"absolute value at most 2147483647"):
            p.push("a", [(1, 1)], weight=weight)
        weights = (pa.array([1, weight], pa.int64()) if abs(weight) < 2**63
                   else pa.array([1, 2**64 - 1], pa.uint64()))
        zset = pa.table({"k": [1, 2], "x": [1, 2], "_weight": weights})
        with pytest.raises(InputError, match=r"input 'a', record 1 .*column '_weight': weight "
                                             r"must be a non-zero integer of absolute value"):
            p.push_zset("a", zset)
        assert p.push("a", [(1, 1)], weight=W) == 1  # the largest weight is accepted
        p.step()
        assert views(p)["n"] == [{"k": 1, "n": W, "_weight": 1}]


def test_a_failed_step_is_reported_retried_and_its_input_quarantined(spark, tmp_path):
    root, c = str(tmp_path), poison_circuit()
    p = Pipeline(c, root, spark, checkpoint_every=2)
    p.push("a", [(1, 10), (2, 20)])
    p.push("b", [(1, 1), (2, 2)])
    p.push("d", [(1, 5), (2, 6)])
    p.step()  # step 0, not committed yet: the roll-back executes it again
    before = views(p)
    push_poison(p)
    with pytest.raises(StepFailedError, match=r"step 1 of pipeline 'poison' failed: "
                       r"ComputationError: operator #\d+ .*\(in views? '.*: .*(?i:overflow)"
                       ) as e:
        p.step()
    assert e.value.step == 1 and p.failed_step is not None and p.failed_step.step == 1
    assert p.next_step == 1 and views(p) == before  # nothing of step 1 is committed
    assert [p.output_last(v) for v in ("abd", "n")] == [1, 1]
    with pytest.raises(StepFailedError):  # stepping again tries again: deterministic, fails
        p.step()
    p.close()

    # The root opens, and says which step failed and why.
    q = Pipeline(c, root, spark, checkpoint_every=2)
    assert q.failed_step is not None and q.failed_step.step == 1
    assert "overflow" in q.failed_step.error.lower() and views(q) == before
    with pytest.raises(UsageError, match="step 0 .* has not failed"):
        q.quarantine_step(0)
    q.push("a", [(5, 50)])  # input after the failed step waits for the step after it
    done = q.quarantine_step(1)
    assert done.moved == {"a": 2, "b": 1, "d": 1} and done.result.quarantined == done.reason
    assert done.reason.startswith("step 1 failed: ") and q.failed_step is None
    errors = ErrorsSink(spark, root).read().to_pylist()
    records = sorted((r["input"], json.loads(r["record"])["_weight"]) for r in errors)
    assert records == [("a", 1), ("a", W), ("b", W), ("d", W)]
    assert {r["reason"] for r in errors} == {done.reason}
    assert {r["source"] for r in errors} == {"step 1"}
    q.step()
    assert [r["k"] for r in views(q)["n"]] == [1, 2, 5]
    assert_oracle(q)  # the integrated input holds no quarantined record
    q.close()
    r = Pipeline(c, root, spark)
    assert r.failed_step is None and r.recovered_steps == []
    assert [x["k"] for x in views(r)["n"]] == [1, 2, 5]
    r.close()


def test_a_failed_step_on_the_spark_path(spark, tmp_path):
    with Pipeline(poison_circuit(), str(tmp_path), spark, driver_step_rows=0) as p:
        p.push("a", [(1, 10)])
        p.push("b", [(1, 1)])
        p.push("d", [(1, 5)])
        p.step()
        push_poison(p)
        with pytest.raises(StepFailedError, match=r"step 1 .* failed: ComputationError: "
                           r"(?i:.*overflow)") as e:
            p.step()
        assert "StorageError" not in str(e.value)  # the rows, not the storage, failed
        done = p.quarantine_step(1)
        assert done.moved == {"a": 2, "b": 1, "d": 1} and not done.result.on_driver
        p.push("a", [(1, 11)])
        p.step()
        assert sorted(x["k"] for x in views(p)["abd"]) == [1, 1]
        assert_oracle(p)


QUARANTINE_POINTS = ["errors.commit.before", "errors.commit.after", "division.commit.before",
                     "division.commit.after", "input.commit.before", "input.commit.after",
                     "manifest.commit.before", "manifest.commit.after"]


@pytest.mark.parametrize("point", QUARANTINE_POINTS)
def test_a_crash_during_a_quarantine_recovers_to_one_outcome(spark, tmp_path, point):
    root, c = str(tmp_path), poison_circuit()
    p = Pipeline(c, root, spark)
    p.push("a", [(1, 10)])
    p.step()
    push_poison(p)
    with pytest.raises(StepFailedError):
        p.step()
    crash_points.reset()
    crash_points.arm(point)
    with pytest.raises(InjectedCrash):
        p.quarantine_step(1)
    q = Pipeline(c, root, spark)  # the dead process's object is abandoned
    if q.failed_step is not None:  # the crash came before the quarantine's atomic point
        assert point == "division.commit.before"
        q.quarantine_step(1)
    else:
        assert q.next_step == 2
    q.push("a", [(5, 50)])
    q.step()
    errors = ErrorsSink(spark, root).read().to_pylist()
    assert sorted(r["input"] for r in errors) == ["a", "a", "b", "d"]  # once each
    assert [x["k"] for x in views(q)["n"]] == [1, 5]
    assert_oracle(q)
    q.close()


def test_poison_weights_through_the_inbox(spark, tmp_path):
    """Inbox files: a weight out of range rejects the file (the others go on); weights in range
    whose join overflows fail the step, which is quarantined; the pipeline keeps stepping."""
    from dbsp_pipeline.connectors.inbox import ingest

    inbox, root = tmp_path / "inbox", str(tmp_path / "root")
    for name in ("a", "b", "d"):
        (inbox / name).mkdir(parents=True)

    def drop(name: str, file: str, lines: list[str]) -> None:
        (inbox / name / file).write_text("\n".join(lines) + "\n")

    drop("a", "huge.csv", ["k,x,_weight", "1,1,1", f"2,2,{2**62}"])
    drop("a", "poison.csv", ["k,x,_weight", f"3,30,{W}"])
    drop("b", "poison.csv", ["k,y,_weight", f"3,3,{W}"])
    drop("d", "poison.csv", ["k,z,_weight", f"3,7,{W}"])
    with Pipeline(poison_circuit(), root, spark) as p:
        result = ingest(p, str(inbox), settle_seconds=0)
        assert "weight must be a non-zero integer of absolute value at most 2147483647" in \
            result.rejected["a"]["huge.csv"]
        with pytest.raises(StepFailedError, match="step 0"):
            p.step()
    with Pipeline(poison_circuit(), root, spark) as p:
        assert p.failed_step is not None and p.failed_step.step == 0
        assert p.quarantine_step(0).moved == {"a": 1, "b": 1, "d": 1}
        drop("a", "good.csv", ["k,x", "1,1"])
        ingest(p, str(inbox), settle_seconds=0)
        p.step()
        assert views(p)["n"] == [{"k": 1, "n": 1, "_weight": 1}]
        errors = ErrorsSink(spark, root).read().to_pylist()
        assert sorted(r["source"].split("@")[0] for r in errors) == [
            "inbox/huge.csv", "step 0", "step 0", "step 0"]  # the rejected file, quarantined
        assert_oracle(p)


def _counting_circuit() -> Circuit:
    c = Circuit("flaky")
    a = c.input("a", "k BIGINT, x BIGINT")
    c.output("n", a.group_by("k").agg(n="count(*)"))
    return c


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_failed_record_commit_rolls_the_step_back_and_a_retry_applies_it_once(
        spark, tmp_path, monkeypatch, checkpoint):
    """An error after the traces took the step (the I/O error of the step's record commit, to
    the division log or with the checkpoint) is not the computation's fault: the error is
    raised as it is, but the state is rolled back, so the retry (or a close and reopen) does
    not apply the step twice."""
    from dbsp_pipeline import StorageError
    from dbsp_pipeline.runtime.division_log import DivisionLog
    from dbsp_pipeline.storage.state_db import StateDatabase

    cls, name = (StateDatabase, "commit") if checkpoint else (DivisionLog, "_commit_row")
    for reopen in (False, True):
        root = str(tmp_path / f"r{reopen}")
        p = Pipeline(_counting_circuit(), root, spark, checkpoint_every=1 if checkpoint else 3)
        p.push("a", [(1, 10)])
        p.step()
        p.push("a", [(2, 20)])
        original, failures = getattr(cls, name), [1]

        def flaky(self, *args, failures=failures, original=original, **kwargs):
            if failures.pop() if failures else 0:
                raise StorageError("I/O error (transient)", definitely_failed=True)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, flaky)
        with pytest.raises(StorageError):
            p.step()
        assert p.failed_step is None and p.next_step == 1
        if reopen:  # nothing of step 1 is recorded: it is stepped again, its input the same
            p.close()
            p = Pipeline(_counting_circuit(), root, spark)
            assert p.next_step == 1 and not p.recovered_steps
        p.step()
        assert sorted(r["n"] for r in p.view_arrow("n").to_pylist()) == [1, 1]
        assert_oracle(p)
        p.close()
        monkeypatch.undo()


def test_a_step_whose_output_was_written_is_retried_not_quarantined(spark, tmp_path,
                                                                   monkeypatch):
    """Step 1 wrote its output, then the process died; its replay at reopen fails once (a
    transient cause). Quarantining it would contradict the written output: refused."""
    from dbsp_pipeline.runtime.plan import Plan

    root, c = str(tmp_path), _counting_circuit()
    p = Pipeline(c, root, spark, checkpoint_every=3)  # steps 0 and 1 record, no checkpoint
    p.push("a", [(1, 10)])
    p.step()
    p.push("a", [(2, 20)])
    crash_points.reset()
    crash_points.arm("division.commit.after")  # step 1's record, with its output
    with pytest.raises(InjectedCrash):
        p.step()
    evaluate, failures = Plan.evaluate, [1, 0]  # the replay of step 0 passes, of step 1 fails

    def flaky(self, ctx, changes):
        if failures.pop() if failures else 0:
            raise RuntimeError("executor lost (transient)")
        return evaluate(self, ctx, changes)

    monkeypatch.setattr(Plan, "evaluate", flaky)
    q = Pipeline(c, root, spark)
    assert q.failed_step is not None and q.failed_step.step == 1
    with pytest.raises(UsageError, match=r"succeeded once .*step again to retry"):
        q.quarantine_step(1)
    assert len(ErrorsSink(spark, root).read()) == 0
    q.step()
    assert q.failed_step is None and sorted(r["k"] for r in q.view_arrow("n").to_pylist()) == [1, 2]
    q.close()
