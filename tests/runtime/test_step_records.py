"""One durable commit per step: the step's record (division and output together) is carried by
the checkpoint's manifest entry or committed to the division log, the output logs hold the
change pending and fold it into their Delta tables every ``FOLD_STEPS`` steps, and every reader
of a ``Pipeline`` sees each step exactly once whatever was folded when, across crashes and
restores."""

from __future__ import annotations

from collections import Counter

import pytest
from deltalake import DeltaTable

from dbsp_pipeline import Circuit, Pipeline, read_status
from dbsp_pipeline import root as root_layout
from dbsp_pipeline.runtime import output_log
from dbsp_pipeline.storage import crash_points
from dbsp_pipeline.storage.crash_points import InjectedCrash
from dbsp_pipeline.storage.verify import verify_root

FOLD = 4


@pytest.fixture(autouse=True)
def fold_every_few_steps(monkeypatch):
    monkeypatch.setattr(output_log, "FOLD_STEPS", FOLD)
    from dbsp_pipeline.runtime import upkeep
    monkeypatch.setattr(upkeep, "FOLD_STEPS", FOLD)


def circuit() -> Circuit:
    c = Circuit("records")
    x = c.input("x", "k BIGINT, v BIGINT")
    c.output("sums", x.group_by("k").agg(s="sum(v)", n="count(*)"))
    c.output("rows", x.filter("v >= 0"))
    return c


def versions(root: str) -> dict[str, int]:
    """The Delta version of the tables a step could commit to."""
    return {name: DeltaTable(uri).version() for name, uri in {
        "divisions": root_layout.divisions(root), "manifest": root_layout.manifest(root),
        "sums": root_layout.output_log(root, "sums"),
        "rows": root_layout.output_log(root, "rows")}.items()}


def delta_steps(root: str, view: str) -> list[int]:
    """The steps a reader of the output's Delta table (not through ``Pipeline``) sees."""
    table = DeltaTable(root_layout.output_log(root, view)).to_pyarrow_table()
    return sorted(set(table.column("_step").to_pylist()))


def changes(p: Pipeline, view: str) -> Counter:
    return Counter(tuple(sorted(r.asDict().items())) for r in p.changes(view).collect())


def test_a_checkpoint_step_is_one_commit_and_readers_see_it_before_it_is_folded(spark,
                                                                                tmp_path):
    root = str(tmp_path)
    with Pipeline(circuit(), root, spark) as p:
        p.push("x", [(1, 10)])
        p.step()
        before = versions(root)
        for s in range(1, FOLD - 1):
            p.push("x", [(s, s)])
            p.step()
            after = versions(root)
            # the manifest commit is the step's one commit: no division, no output commit
            assert {n: after[n] - before[n] for n in after} == {
                "divisions": 0, "manifest": 1, "sums": 0, "rows": 0}
            before = after
        assert delta_steps(root, "sums") == []  # nothing folded yet
        assert p.output_last("sums") == FOLD - 1
        assert p.step_changes_arrow("sums", 1).num_rows == 2  # group 1: out 10, in 11
        assert sorted(r["k"] for r in p.view_arrow("rows").to_pylist()) == [1, 1, 2]
        assert sorted(r["_step"] for r in p.changes("rows").collect()) == [0, 1, 2]
        assert read_status(root, ["x"]).divided_steps == FOLD - 1  # from the entry
        p.push("x", [(9, 9)])
        p.step()  # the FOLD-th pending step: everything folds
        assert delta_steps(root, "sums") == list(range(FOLD))
        assert delta_steps(root, "rows") == list(range(FOLD))
        assert verify_root(root).ok


def test_steps_between_checkpoints_commit_their_record_to_the_division_log(spark, tmp_path):
    root = str(tmp_path)
    with Pipeline(circuit(), root, spark, checkpoint_every=3) as p:
        before = versions(root)
        p.push("x", [(1, 10)])
        p.step()
        after = versions(root)
        assert {n: after[n] - before[n] for n in after} == {
            "divisions": 1, "manifest": 0, "sums": 0, "rows": 0}
        assert p.step_info(0).inputs == {"x": (0, 1)}
        assert p.step_changes_arrow("sums", 0).num_rows == 1


@pytest.mark.parametrize("point, passes", [
    ("manifest.commit.before", 2), ("manifest.commit.after", 2),  # a checkpoint step's record
    ("division.commit.after", 2),  # a record between checkpoints
    ("output.commit.after", 1),  # the first fold: one view folded, the other not
])
def test_a_crash_before_the_fold_loses_no_step_and_duplicates_none(spark, tmp_path, point,
                                                                   passes):
    root = str(tmp_path)
    reference = str(tmp_path / "reference")
    with Pipeline(circuit(), reference, spark, checkpoint_every=2) as r:
        for s in range(FOLD + 2):
            r.push("x", [(s % 3, s), (s, -s)])
            r.step()
        expected = {v: changes(r, v) for v in ("sums", "rows")}
    crash_points.reset()
    crash_points.arm(point, passes)
    p = Pipeline(circuit(), root, spark, checkpoint_every=2)
    pushed = 0
    try:
        while pushed < FOLD + 2:
            p.push("x", [(pushed % 3, pushed), (pushed, -pushed)])
            pushed += 1
            p.step()
    except InjectedCrash:
        pass  # the dead process: abandoned, no close
    else:
        pytest.fail(f"no crash at {point}")
    finally:
        crash_points.reset()
    with Pipeline(circuit(), root, spark, checkpoint_every=2) as q:
        while q.next_step < pushed:  # a step whose record was not committed: again
            q.step()
        for t in range(pushed, FOLD + 2):
            q.push("x", [(t % 3, t), (t, -t)])
            q.step()
        assert {v: changes(q, v) for v in ("sums", "rows")} == expected
    with Pipeline(circuit(), root, spark) as q:  # closed: everything folded
        assert delta_steps(root, "sums") == list(range(FOLD + 2))
        assert {v: changes(q, v) for v in ("sums", "rows")} == expected
    assert verify_root(root).ok


def test_restoring_an_older_checkpoint_keeps_the_steps_its_newer_entries_carried(spark,
                                                                                 tmp_path):
    root = str(tmp_path)
    with Pipeline(circuit(), root, spark, retain_checkpoints=4) as p:
        for s in range(3):
            p.push("x", [(s, s)])
            p.step()
        expected = changes(p, "sums")
        assert delta_steps(root, "sums") == []  # the three steps live in entries only
        oldest = p.checkpoints()[-1]
        replayed = p.restore(oldest.version)
        assert [r.step for r in replayed] == list(range(oldest.step, 3))  # verified
        assert oldest.step < 3
        assert changes(p, "sums") == expected
    with Pipeline(circuit(), root, spark) as q:
        assert changes(q, "sums") == expected
        assert delta_steps(root, "sums") == [0, 1, 2]
    assert verify_root(root).ok


def test_a_crash_after_input_log_cleanup_reopens_from_the_carried_record(spark, tmp_path):
    """Garbage collection cleans an input log's commits below the consumed version; after a
    crash whose newest step is carried by the entry only (not folded), opening must take the
    step's division from the entry, not read the input log from version 0 (where the cleaned
    commits are missing)."""
    root = str(tmp_path)
    with Pipeline(circuit(), root, spark) as p:
        for s in range(55):  # past the input log's Delta checkpoint (50 commits)
            p.push("x", [(s, s)])
            p.step()
    p = Pipeline(circuit(), root, spark)
    p.push("x", [(99, 99)])
    crash_points.reset()
    crash_points.arm("manifest.commit.after")
    with pytest.raises(InjectedCrash):
        p.step()  # recorded (carried by the entry), then the process dies
    crash_points.reset()
    assert verify_root(root).ok
    with Pipeline(circuit(), root, spark) as q:
        assert q.next_step == 56 and not q.recovered_steps
        assert q.step_changes_arrow("rows", 55).column("k").to_pylist() == [99]


def test_a_lost_file_of_a_step_not_folded_yet_is_named_by_verify(spark, tmp_path):
    """An output write that only a step record holds (not folded into the log's Delta table)
    is part of the view: its file going missing is damage, named, not a silently shorter
    view."""
    import os

    from dbsp_pipeline.errors import CorruptStateError

    root = str(tmp_path)
    with Pipeline(circuit(), root, spark) as p:
        p.push("x", [(1, 10)])
        p.step()
        p.push("x", [(2, 20)])
        p.step()
        write = p.engine.outputs["rows"]._pending[1]  # step 1 of view rows, not folded
        lost = p.engine.outputs["rows"].table.store.path(write.adds[0].path)
        p.engine.abandon()  # the process dies: no close, no fold
    os.remove(lost)
    report = verify_root(root)
    assert not report.ok
    assert any(d.file == lost and "step 1" in d.problem for d in report.damage), \
        report.describe()
    with pytest.raises(CorruptStateError):
        Pipeline(circuit(), root, spark)


def test_run_brings_the_output_tables_up_to_date_when_input_runs_out(spark, tmp_path):
    root = str(tmp_path)
    with Pipeline(circuit(), root, spark) as p:
        for s in range(3):
            p.push("x", [(s, s)])
        p.step()
        assert delta_steps(root, "sums") == []  # pending
        p.push("x", [(7, 7)])
        assert [r.step for r in p.run()] == [1]
        assert delta_steps(root, "sums") == [0, 1]  # folded while idle
