"""The division log is compacted below the oldest retained checkpoint: opening a root and
reading its status read a bounded number of files after any number of steps, while restore to
a retained checkpoint, recovery after a crash, ``step_info`` of retained steps and quarantine
go on working, and a crash in the middle of a compaction loses nothing."""

from __future__ import annotations

import os

import pytest
from deltalake import DeltaTable

from dbsp_pipeline import Pipeline, StepFailedError, UsageError, read_status
from dbsp_pipeline import root as root_layout
from dbsp_pipeline.errors import DivisionRecordError
from dbsp_pipeline.runtime.division_log import DivisionLog
from dbsp_pipeline.runtime.upkeep import GC_MAX_COMMITS
from dbsp_pipeline.storage import crash_points
from dbsp_pipeline.storage.crash_points import InjectedCrash
from dbsp_pipeline.storage.verify import verify_root
from tests.runtime.test_failed_steps import (
    assert_oracle,
    poison_circuit,
    push_poison,
    views,
)

#: more steps than a Delta checkpoint interval (50 commits) and a collection's (tiny steps: every
#: GC_MAX_COMMITS commits)
STEPS = GC_MAX_COMMITS + 6
INPUTS = ["a", "b", "d"]
#: what compaction leaves at most: the compacted record, the steps since the last collection
#: (tiny steps: every GC_MAX_COMMITS commits) and the retained checkpoints' steps
MAX_DIVISION_FILES = GC_MAX_COMMITS + 3
#: right after a collection (``close`` runs one), the Delta log from its newest checkpoint on:
#: at most a checkpoint interval of commits, the checkpoint and ``_last_checkpoint``
MAX_LOG_ENTRIES = 50 + 2


def run_steps(p: Pipeline, first: int, count: int) -> None:
    """``count`` tiny steps from step ``first``: one row pushed, then a step."""
    for s in range(first, first + count):
        p.push("a", [(s, s)])
        p.step()


def read_at_open(root: str) -> tuple[int, int]:
    """What opening the division log and ``read_status`` read: its data files, and the entries
    delta-rs lists in its ``_delta_log``."""
    uri = root_layout.divisions(root)
    return len(DeltaTable(uri).file_uris()), len(os.listdir(os.path.join(uri, "_delta_log")))


def test_open_and_status_read_a_bounded_log_and_retained_steps_still_work(spark, tmp_path):
    root, c = str(tmp_path), poison_circuit()
    with Pipeline(c, root, spark, checkpoint_every=1) as p:
        run_steps(p, 0, GC_MAX_COMMITS - 1)
        before_collection = read_at_open(root)  # the most files between two collections
        run_steps(p, GC_MAX_COMMITS - 1, STEPS - GC_MAX_COMMITS + 1)
        last_info = p.step_info(STEPS - 1)
    files, entries = read_at_open(root)
    assert files <= 3 and entries <= MAX_LOG_ENTRIES, (files, entries)  # after close's collection
    assert before_collection[0] <= MAX_DIVISION_FILES  # between two collections
    # Every other table's Delta log is cleaned below what the retained checkpoints read too.
    for folder in (root_layout.MANIFEST, "inputs/a", "outputs/n", "outputs/abd",
                   *[f"state/{t}" for t in os.listdir(os.path.join(root, root_layout.STATE))]):
        entries = len(os.listdir(os.path.join(root, folder, "_delta_log")))
        assert entries <= MAX_LOG_ENTRIES, (folder, entries)

    status = read_status(root, INPUTS)
    assert status.divided_steps == STEPS and not status.has_pending_input
    assert status.divided["a"] == last_info.inputs["a"][1]

    with Pipeline(c, root, spark, checkpoint_every=1) as q:
        assert q.step_info(STEPS - 1) == last_info
        oldest = q.checkpoints()[-1]
        q.step_info(oldest.step)  # the first retained step is known, with where it starts
        with pytest.raises(UsageError, match=r"the division of step 0 of pipeline 'poison' "
                                             r"was compacted: divisions are kept from step "):
            q.step_info(0)
        before = views(q)
        # Restore to the oldest retained checkpoint: its steps execute again from the kept
        # divisions and give the same views.
        replayed = q.restore(oldest.version)
        assert [r.step for r in replayed] == list(range(oldest.step, STEPS))
        assert views(q) == before
        assert_oracle(q)
        # A step failing after compaction can still be quarantined.
        push_poison(q)
        with pytest.raises(StepFailedError):
            q.step()
        done = q.quarantine_step(STEPS)
        assert done.moved == {"a": 2, "b": 1, "d": 1} and q.failed_step is None
        run_steps(q, STEPS + 1, 2)
        assert_oracle(q)
    assert verify_root(root).ok


def test_recovery_after_a_crash_following_a_compaction(spark, tmp_path):
    root, c = str(tmp_path), poison_circuit()
    with Pipeline(c, root, spark, checkpoint_every=1) as p:
        run_steps(p, 0, 40)
    crash_points.reset()
    p = Pipeline(c, root, spark, checkpoint_every=2)
    assert p.step_info(39).step == 39
    p.push("a", [(40, 40)])
    crash_points.arm("division.commit.after")  # step 40's record is written, not checkpointed
    with pytest.raises(InjectedCrash):
        p.step()
    q = Pipeline(c, root, spark, checkpoint_every=1)
    assert [r.step for r in q.recovered_steps] == [40]
    assert q.step_info(40).inputs["a"][1] > q.step_info(39).inputs["a"][1]
    assert_oracle(q)
    q.close()


@pytest.mark.parametrize("point", ["division.rewrite.before", "division.rewrite.after"])
def test_a_crash_in_the_middle_of_a_compaction_loses_nothing(spark, tmp_path, point):
    root, c = str(tmp_path), poison_circuit()
    with Pipeline(c, root, spark, checkpoint_every=1) as p:
        run_steps(p, 0, 30)
    p = Pipeline(c, root, spark, checkpoint_every=1)
    run_steps(p, 30, 5)  # fewer than GC_EVERY_COMMITS: no collection yet
    infos = {s: p.step_info(s) for s in range(p.checkpoints()[-1].step, 35)}
    before = views(p)
    crash_points.reset()
    crash_points.arm(point)
    with pytest.raises(InjectedCrash):
        p.collect_garbage()
    crash_points.reset()
    with Pipeline(c, root, spark, checkpoint_every=1) as q:
        assert q.recovered_steps == [] and q.next_step == 35
        assert {s: q.step_info(s) for s in infos} == infos
        assert views(q) == before
        run_steps(q, 35, 2)
        assert_oracle(q)
        q.restore(q.checkpoints()[-1].version)
        assert_oracle(q)
    assert verify_root(root).ok


def test_a_division_is_recorded_once_and_only_a_divided_step_is_quarantined(spark, tmp_path):
    uri = str(tmp_path / "_divisions")
    divisions = DivisionLog(spark, uri)
    divisions.record(0, {"x": 1})
    with pytest.raises(DivisionRecordError, match="division of step 0 is already recorded"):
        divisions.record(0, {"x": 2})
    with pytest.raises(DivisionRecordError, match="step 1 is not divided") as raised:
        divisions.quarantine(1, "a reason")
    assert isinstance(raised.value, UsageError) and str(tmp_path) in str(raised.value)
    assert DivisionLog(spark, uri).get(0) == {"x": 1}  # the record stands


def test_a_live_reader_keeps_the_divisions_it_may_ask_for(spark, tmp_path):
    """A reader (a Kafka sink re-sending steps it has not sent asks their ``step_info``) holds
    the divisions from its ``since`` on, as it holds the output history: compaction stops
    there, whatever the retained checkpoints."""
    root, c = str(tmp_path), poison_circuit()
    with Pipeline(c, root, spark, checkpoint_every=1) as p:
        run_steps(p, 0, 5)
        view = next(iter(p.engine.outputs))
        reader = p.reader(view, since=3)
        run_steps(p, 5, 30)
        p.collect_garbage(grace_seconds=0)
        assert p.engine.divisions.compacted_below <= 3
        assert p.step_info(4).step == 4
        reader.close()
        p.collect_garbage(grace_seconds=0)
        assert p.engine.divisions.compacted_below > 4
