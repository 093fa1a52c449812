"""Hot layout changes (ICADD, ``runtime/migration.py``): steps complete while the state is copied;
afterwards the outputs and the state equal the never-rescaled run exactly and every state file
belongs to one worker; a crash at any point of a hot rescale recovers to the old or the new
layout, never a mix."""

from __future__ import annotations

import threading

import pytest

from dbsp_pipeline.errors import UsageError
from dbsp_pipeline.runtime.migration import ShardMigration
from dbsp_pipeline.storage import crash_points
from dbsp_pipeline.storage.crash_points import InjectedCrash
from tests.runtime import workload
from tests.runtime.conftest import RESCALE_ROUNDS as ROUNDS
from tests.runtime.test_rescale import owner_pure


class CopyGate:
    """Holds the hot copy at its first trace until the test has run steps meanwhile."""

    def __init__(self, monkeypatch) -> None:
        self.copying = threading.Event()
        self.steps_done = threading.Event()
        original = ShardMigration._copy
        gate = self

        def copy_trace(migration, tm):
            if not gate.copying.is_set():
                gate.copying.set()
                assert gate.steps_done.wait(120), "the test never ran its steps"
            return original(migration, tm)

        monkeypatch.setattr(ShardMigration, "_copy", copy_trace)


def hot_rescale_with_steps(p, target: int, rounds: list[tuple[int, list]], monkeypatch):
    """Rescale ``p`` hot to ``target`` workers in a thread; while its copy is held half-way,
    play ``rounds`` (their steps run under the old layout). Returns the rescale's result."""
    gate = CopyGate(monkeypatch)
    out: dict = {}

    def rescale():
        try:
            out["result"] = p.rescale(target, hot=True)
        except BaseException as e:  # noqa: BLE001 (handed to the test thread)
            out["error"] = e

    thread = threading.Thread(target=rescale)
    thread.start()
    assert gate.copying.wait(120)
    with pytest.raises(UsageError, match="hot layout change is in progress"):
        p.rescale(target)
    for r, pushes in rounds:
        workload.play_round(p, r, pushes)
    gate.steps_done.set()
    thread.join(300)
    monkeypatch.undo()
    if "error" in out:
        raise out["error"]
    return out["result"]


@pytest.mark.parametrize("sharding, plan", [
    ("fixed", [4, 5]),     # W -> W+1
    ("fixed", [4, 3]),     # W -> W-1
    ("fixed", [3, 6]),     # W -> 2W
    ("fixed", [1, 4, 1]),  # 1 -> 4 and back
    ("dynamic", [4, 5, 2]),
    ("modulo", [4, 5]),
])
def test_steps_run_during_hot_rescales_and_outputs_equal_the_never_rescaled_run(
        spark, tmp_path, never_rescaled, monkeypatch, sharding, plan):
    root = str(tmp_path)
    first, *rest = plan
    with workload.open_pipeline(root, spark) as p:
        p.rescale(first, sharding=sharding)
        r = 0
        while r < len(ROUNDS):
            workload.play_round(p, r, ROUNDS[r])
            r += 1
            if r in (2, 4) and rest and r < len(ROUNDS):
                target = rest.pop(0)
                old = p.layout
                result = hot_rescale_with_steps(p, target, [(r, ROUNDS[r])], monkeypatch)
                r += 1
                assert result.hot and result.new == old.rescaled(target)
                assert result.steps_during_copy == 1  # a step completed while the copy ran
                assert result.step == r and p.layout == result.new
                assert result.rows > 0 and result.pause_seconds <= result.seconds
                assert owner_pure(p)
        final = p.layout
    with workload.open_pipeline(root, spark) as p:
        assert p.layout == final and p.checkpoints()[0].layout == final
    assert workload.consumer_view(spark, root) == never_rescaled


def test_the_hand_over_splits_what_steps_changed_during_the_copy(spark, tmp_path, monkeypatch):
    with workload.open_pipeline(str(tmp_path), spark) as p:
        p.rescale(2)
        for r in range(2):
            workload.play_round(p, r, ROUNDS[r])
        result = hot_rescale_with_steps(p, 4, [(2, ROUNDS[2]), (3, ROUNDS[3])], monkeypatch)
        assert result.steps_during_copy == 2
        assert result.caught_up_rows > 0  # the steps' appends hold rows of several new owners
        assert owner_pure(p)


@pytest.mark.parametrize("point", ["rescale.hot.copied", "trace.commit.before",
                                   "trace.commit.after", "rescale.before_commit",
                                   "manifest.commit.before", "manifest.commit.after"])
def test_a_crash_during_a_hot_rescale_recovers_to_one_layout(spark, tmp_path, never_rescaled,
                                                            monkeypatch, point):
    root = str(tmp_path)
    p = workload.open_pipeline(root, spark)
    p.rescale(2)
    for r in range(3):
        workload.play_round(p, r, ROUNDS[r])
    old = p.layout
    original = ShardMigration._copy
    stepped = []

    def copy_trace(migration, tm):
        if not stepped:  # a step while the copy runs, then the crash is armed
            stepped.append(True)
            workload.play_round(p, 3, ROUNDS[3])
            p.commit()
            crash_points.reset()
            crash_points.arm(point)
        return original(migration, tm)

    monkeypatch.setattr(ShardMigration, "_copy", copy_trace)
    with pytest.raises(InjectedCrash):
        p.rescale(3, hot=True)
    monkeypatch.undo()
    crash_points.reset()
    del p  # abandoned, as by a crash: no close, no commit
    with workload.open_pipeline(root, spark) as p:
        assert p.layout == (old.rescaled(3) if point == "manifest.commit.after" else old)
        assert p.next_step == 4  # the step run during the copy is kept either way
        if p.layout.workers == 3:
            assert owner_pure(p)
        for r, pushes in enumerate(ROUNDS):
            workload.play_round(p, r, pushes)
    assert workload.consumer_view(spark, root) == never_rescaled
