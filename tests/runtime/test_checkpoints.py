"""Checkpoints: each records state, step, layout and circuit fingerprint; ``restore`` goes back
to a retained one and rebuilds the newer state from the recorded input divisions, which the
consumer does not notice."""

from __future__ import annotations

import pytest

from dbsp_pipeline import Pipeline, UsageError
from dbsp_pipeline.runtime.layout import Layout
from tests.runtime import workload


def play(p: Pipeline, rounds) -> None:
    for r, pushes in enumerate(rounds):
        workload.play_round(p, r, pushes)


def test_checkpoints_record_step_layout_and_fingerprint(spark, tmp_path):
    rounds = workload.rounds(4)
    with Pipeline(workload.circuit(), str(tmp_path), spark, retain_checkpoints=3) as p:
        play(p, rounds)
        cps = p.checkpoints()
        assert [c.version for c in cps] == [4, 3, 2]
        assert [c.step for c in cps] == [4, 3, 2]
        assert all(c.layout == Layout() and c.layout == p.layout for c in cps)
        assert {c.fingerprint for c in cps} == {p.circuit.fingerprint()}
        assert all(c.engine_version and c.state_format for c in cps)


def test_restore_rebuilds_the_newer_state_from_the_recorded_divisions(spark, tmp_path):
    rounds = workload.rounds(6)
    reference_root = str(tmp_path / "reference")
    with workload.open_pipeline(reference_root, spark) as p:
        play(p, rounds)
    reference = workload.consumer_view(spark, reference_root)

    root = str(tmp_path / "restored")
    with Pipeline(workload.circuit(), root, spark, retain_checkpoints=4) as p:
        play(p, rounds)
        assert [c.version for c in p.checkpoints()] == [6, 5, 4, 3]
        replayed = p.restore(3)
        # Steps 3, 4 and 5 ran again from their divisions; their output was verified and
        # discarded (None), and each replayed step committed again.
        assert [r.step for r in replayed] == [3, 4, 5]
        assert all(out is None for r in replayed for out in r.outputs.values())
        assert p.next_step == 6 and p.state_version == 6  # 3, then a commit per step
        with pytest.raises(UsageError, match="cannot be opened"):
            p.restore(1)  # never retained
    assert workload.consumer_view(spark, root) == reference


def test_raising_retention_does_not_bring_back_checkpoints_whose_divisions_were_compacted(
        spark, tmp_path):
    """Garbage collection compacts the division log below the oldest retained checkpoint's
    step. Raising ``retain_checkpoints`` afterwards must not offer the older checkpoints whose
    manifest entries are still on disk: restoring one would need the compacted divisions. The
    retained chain ends at the division log's ``compacted_below``."""
    rounds = workload.rounds(10)
    root = str(tmp_path / "root")
    with Pipeline(workload.circuit(), root, spark, checkpoint_every=2,
                  retain_checkpoints=2) as p:
        play(p, rounds)
        assert [c.step for c in p.checkpoints()] == [10, 8]
        p.collect_garbage()  # compacts the divisions below step 8
        assert p.engine.divisions.compacted_below == 8
        p.retain_checkpoints = 5
        assert [(c.version, c.step) for c in p.checkpoints()] == [(5, 10), (4, 8)]
        with pytest.raises(UsageError, match=r"checkpoint 3 \(after step 5\).*compacted.*step 8"):
            p.restore(3)
        report = p.verify()
        assert report.ok, report.describe()
        assert [c.version for c in report.checkpoints] == [5, 4]
        assert [r.step for r in p.restore(4)] == [8, 9]
    with Pipeline(workload.circuit(), root, spark, checkpoint_every=2,
                  retain_checkpoints=5) as p:
        assert p.recovered_steps == []
        assert [c.step for c in p.checkpoints()][-1] == 8
        assert p.verify().ok
        with pytest.raises(UsageError, match=r"checkpoint 3 \(after step 5\).*compacted"):
            p.restore(3)
    with pytest.raises(UsageError, match=r"checkpoint 3 \(after step 5\).*compacted"):
        Pipeline(workload.circuit(), root, spark, retain_checkpoints=5, checkpoint=3)
    with Pipeline(workload.circuit(), root, spark, retain_checkpoints=5) as p:
        p.collect_garbage(grace_seconds=0)  # the compacted checkpoints are garbage, as before
        chain = [entry["version"] for _, entry in p.engine.db.retained_entries(5)]
        assert chain == [c.version for c in p.checkpoints()]


def test_the_oldest_checkpoint_listed_is_restored_with_steps_not_yet_committed(spark,
                                                                             tmp_path):
    """``restore`` commits the executed steps first: the checkpoint that adds must not push
    out the oldest one ``checkpoints()`` offered."""
    rounds = workload.rounds(8)
    with Pipeline(workload.circuit(), str(tmp_path), spark, checkpoint_every=3,
                  retain_checkpoints=2) as p:
        play(p, rounds)  # 8 steps: checkpoints after steps 3 and 6, steps 7 and 8 uncommitted
        oldest = p.checkpoints()[-1]
        assert oldest.step < p.next_step - 2
        replayed = p.restore(oldest.version)
        assert [r.step for r in replayed] == list(range(oldest.step, 8))
        assert p.next_step == 8


def test_a_commit_with_nothing_to_record_writes_no_checkpoint(spark, tmp_path):
    """An idle pipeline committed on a schedule keeps its steps' checkpoints: a commit with no
    step executed since the last one returns the current version; a push alone changes no
    state; a step does."""
    with Pipeline(workload.circuit(), str(tmp_path), spark, retain_checkpoints=3) as p:
        play(p, workload.rounds(3))
        before = [(c.version, c.step) for c in p.checkpoints()]
        version = p.state_version
        for _ in range(5):
            assert p.commit() == version
        for name, rows, weight in workload.rounds(4)[3]:
            p.push(name, rows, weight=weight)
        assert p.commit() == version and p.uncommitted_steps == 0
        assert [(c.version, c.step) for c in p.checkpoints()] == before
        p.step()
        assert p.commit() == version + 1
        assert p.checkpoints()[0].step == p.next_step
