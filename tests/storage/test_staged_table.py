"""Staged state changes: a step commits nothing to the state tables; the checkpoint's manifest
entry records the staged actions, opening stages them again, a fold commits them to the Delta
log, and a crash between a fold and its checkpoint recovers to the same state."""

from __future__ import annotations

import os

import pytest
from deltalake import DeltaTable

from dbsp_pipeline import Circuit, CorruptStateError, Pipeline, verify
from dbsp_pipeline import root as root_layout
from dbsp_pipeline.storage import crash_points, state_db
from dbsp_pipeline.storage.crash_points import InjectedCrash

TRACE = "n1_aggregate_groups"


#: no background merges: they would swap staged adds for merged ones before FOLD_ACTIONS steps
NO_MERGES = {"compact_threshold": 10**6}


def circuit() -> Circuit:
    c = Circuit("staged")
    x = c.input("x", "k BIGINT, r STRING")
    c.output("n", x.group_by("r").agg(n="count(*)", top="max(k)"))
    return c


def trace_version(root: str) -> int:
    return DeltaTable(root_layout.state_table(root, TRACE)).version()


def view(p: Pipeline) -> list[dict]:
    return sorted(p.view_arrow("n").to_pylist(), key=lambda r: r["r"])


def run(p: Pipeline, steps: range) -> None:
    for i in steps:
        p.push("x", [(i, "a"), (100 + i, "b")])
        p.step()


def test_steps_stage_and_checkpoints_fold(spark, tmp_path):
    root = str(tmp_path)
    steps = state_db.FOLD_ACTIONS - 1
    with Pipeline(circuit(), root, spark, **NO_MERGES) as p:
        run(p, range(steps))
        assert trace_version(root) == 0  # nothing committed to the trace's Delta log
        entry = p.engine.db.checkpoints(1)[0]
        assert len(entry["staged"][TRACE]["adds"]) == steps
        expected = view(p)
    # opening stages the recorded actions again
    with Pipeline(circuit(), root, spark, **NO_MERGES) as p:
        assert view(p) == expected
        assert len(p.engine.db.recorded_staged(TRACE)["adds"]) == steps
        run(p, range(steps, steps + 1))  # the FOLD_ACTIONS-th action: the next commit folds
        assert trace_version(root) == 1
        assert TRACE not in p.engine.db.checkpoints(1)[0].get("staged", {})
        expected = view(p)
    with Pipeline(circuit(), root, spark, **NO_MERGES) as p:
        assert view(p) == expected
        assert verify(root).ok


def test_a_crash_between_a_fold_and_its_checkpoint_recovers(spark, tmp_path):
    reference, crashed = str(tmp_path / "reference"), str(tmp_path / "crashed")
    steps = state_db.FOLD_ACTIONS
    with Pipeline(circuit(), reference, spark, **NO_MERGES) as p:
        run(p, range(steps + 2))
        expected = view(p)
    crash_points.reset()
    p = Pipeline(circuit(), crashed, spark, **NO_MERGES)
    run(p, range(steps - 1))
    crash_points.arm("manifest.commit.before")  # the trace is folded; its checkpoint is not
    with pytest.raises(InjectedCrash):
        run(p, range(steps - 1, steps))
    crash_points.reset()
    assert trace_version(crashed) == 1  # the fold committed
    # rolled back to version 0 + staged, replayed
    with Pipeline(circuit(), crashed, spark, **NO_MERGES) as p:
        run(p, range(steps, steps + 2))
        assert view(p) == expected
    assert verify(crashed).ok


def test_garbage_collection_keeps_staged_files(spark, tmp_path):
    """Files no Delta version refers to but a retained checkpoint (or the steps since the last
    one) stages are not garbage, whatever the grace period."""
    root = str(tmp_path)
    with Pipeline(circuit(), root, spark, checkpoint_every=3) as p:
        run(p, range(4))  # a checkpoint after 3 steps, one step staged since
        assert p.collect_garbage(grace_seconds=0) >= 0
        run(p, range(4, 6))
        expected = view(p)
    with Pipeline(circuit(), root, spark) as p:
        assert view(p) == expected
    assert verify(root).ok


def test_a_missing_staged_file_is_named(spark, tmp_path):
    root = str(tmp_path)
    with Pipeline(circuit(), root, spark) as p:
        run(p, range(2))
        add = p.engine.db.checkpoints(1)[0]["staged"][TRACE]["adds"][-1]
    path = os.path.join(root_layout.state_table(root, TRACE), add["path"])
    os.remove(path)
    assert not verify(root).ok
    with pytest.raises(CorruptStateError) as e:
        Pipeline(circuit(), root, spark)
    assert e.value.file == path and "stages" in str(e.value)


def test_a_compaction_at_close_is_kept(spark, tmp_path):
    """``compact`` stages its swaps; closing commits them, so reopening finds the merged trace."""
    root = str(tmp_path)
    with Pipeline(circuit(), root, spark) as p:
        run(p, range(5))
        assert p.compact(threshold=0) >= 1
        (trace,) = [t for t in p.engine.plan.state_traces() if t.name == TRACE]
        merged = sorted(f.path for f in trace.files())
        expected = view(p)
    with Pipeline(circuit(), root, spark) as p:
        (trace,) = [t for t in p.engine.plan.state_traces() if t.name == TRACE]
        assert sorted(f.path for f in trace.files()) == merged
        assert view(p) == expected


def test_a_one_step_memory_folds_too(spark, tmp_path):
    """A delay replaces its trace at every step: about two staged actions for ever. It is still
    folded every FOLD_ACTIONS checkpoints, so its old files become garbage."""
    c = Circuit("memory")
    x = c.input("x", "k BIGINT")
    c.output("before", x.delay())
    root = str(tmp_path)
    with Pipeline(c, root, spark) as p:
        for i in range(2 * state_db.FOLD_ACTIONS + 2):
            p.push("x", [(i,)])
            p.step()
        memory = [t for t in p.engine.plan.state_traces() if "delay" in t.name]
        assert memory, [t.name for t in p.engine.plan.state_traces()]
        name = memory[0].name
        assert DeltaTable(root_layout.state_table(root, name)).version() >= 2
        assert len(p.engine.db.recorded_staged(name).get("adds", [])) <= 1
