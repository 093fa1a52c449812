"""Two real processes run the same pipeline root: exactly one wins the compare-and-append of
the next step's division, the other stops with a clear error, and the state stays consistent."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dbsp_pipeline import Pipeline, PipelineFencedError
from tests.runtime.pipeline_process import circuit


def test_two_processes_race_for_the_same_pipeline(spark, tmp_path):
    root, barrier = str(tmp_path / "root"), tmp_path / "barrier"
    barrier.mkdir()
    with Pipeline(circuit(), root, spark):
        pass  # an existing, empty pipeline
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "SPARK_LOCAL_IP": "127.0.0.1"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.runtime.pipeline_process", root,
                               str(barrier), name, "4"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env=env)
             for name in ("a", "b")]
    outcomes = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        outcomes.append((proc.returncode, out.strip().splitlines()[-1] if out.strip() else ""))
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 3], outcomes
    fenced = next(msg for code, msg in outcomes if code == 3)
    assert "is being run by another process" in fenced and root in fenced

    # The winner's steps are all there, once each; the loser's one push, if it opened and
    # pushed before its step was fenced, was recorded like any input and goes into a step too.
    winner = "a" if outcomes[0][0] == 0 else "b"
    loser = "b" if winner == "a" else "a"
    with Pipeline(circuit(), root, spark) as p:
        assert p.next_step >= 4
        p.run()
        steps = sorted({r["_step"] for r in p.changes("counts").collect()})
        assert steps == list(range(len(steps))) and steps[-1] >= 3
        view = {r["who"]: r["n"] for r in p.view("counts").collect()}
        assert view[winner] == 4 and view.get(loser, 0) <= 1


def test_a_pipeline_fenced_in_process_is_closed(spark, tmp_path):
    root = str(tmp_path)
    first = Pipeline(circuit(), root, spark)
    second = Pipeline(circuit(), root, spark)
    second.push("x", [(1, "b")])
    second.step()
    first.push("x", [(2, "a")])
    try:
        first.step()
        raise AssertionError("the second pipeline's step should fence the first")
    except PipelineFencedError as e:
        assert "being run by another process" in str(e)
    second.close()
    with Pipeline(circuit(), root, spark) as p:
        p.run()
        assert {r["who"]: r["n"] for r in p.view("counts").collect()} == {"a": 1, "b": 1}


def test_garbage_collection_that_loses_the_race_is_fenced_too(spark, tmp_path):
    """Garbage collection rewrites the division log (its compaction): losing that race to
    another process is the fencing error, as for a step, and closes the pipeline object."""
    root = str(tmp_path)
    with Pipeline(circuit(), root, spark, checkpoint_every=1) as p:
        for i in range(4):
            p.push("x", [(i, "a")])
            p.step()
    first = Pipeline(circuit(), root, spark, checkpoint_every=1)
    for i in range(4, 6):  # newer checkpoints: its next GC has divisions to compact
        first.push("x", [(i, "a")])
        first.step()
    with Pipeline(circuit(), root, spark, checkpoint_every=1) as second:
        second.push("x", [(9, "b")])
        second.step()
    try:
        first.collect_garbage(grace_seconds=0)
        raise AssertionError("the second pipeline's commits should fence the first's GC")
    except PipelineFencedError as e:
        assert "being run by another process" in str(e)
    first.close()  # closed by the fence: nothing to do
    with Pipeline(circuit(), root, spark) as p:
        assert p.next_step == 7


def test_the_later_opener_fences_the_earlier_whichever_table_their_steps_record_in(spark,
                                                                                  tmp_path):
    """A step's record goes to the manifest (a checkpoint step) or the division log (any
    other): two processes that record the same step in different tables would both succeed,
    so opening fences both tables. The earlier process is fenced at its next record, and the
    root holds the later one's steps only."""
    import pytest

    for first_every, second_every in ((1, 4), (4, 1)):
        root = str(tmp_path / f"r{first_every}")
        first = Pipeline(circuit(), root, spark, checkpoint_every=first_every)
        second = Pipeline(circuit(), root, spark, checkpoint_every=second_every)
        second.push("x", [(1, "b")])
        second.step()
        first.push("x", [(2, "a")])
        with pytest.raises(PipelineFencedError, match="being run by another process"):
            first.step()
        second.push("x", [(3, "b")])
        second.step()
        second.close()
        with Pipeline(circuit(), root, spark) as p:
            assert p.next_step == 2  # the fenced process's step is not one of them
            assert p.verify().ok
            counts = {r["who"]: (r["n"], r["_weight"]) for r in p.view_arrow("counts").to_pylist()}
            assert counts == {"a": (1, 1), "b": (2, 1)}  # every push counted once
            assert sorted(r["_step"] for r in p.changes("counts").collect()) == [0, 1, 1, 1]


def test_a_fenced_pipeline_does_not_fold_steps_the_later_opener_folded(spark, tmp_path):
    """Steps between checkpoints are recorded, their output pending; a later opener takes the
    root and folds them; the first object, not knowing it lost the root, folds (explicit
    history compaction, or ``run`` idling): it finds them folded and commits none of them twice
    (the fold is a compare-and-append on the output table, not fenced)."""
    root = str(tmp_path)
    first = Pipeline(circuit(), root, spark, checkpoint_every=8)
    for who in ("a", "b"):
        first.push("x", [(1, who)])
        first.step()
    with Pipeline(circuit(), root, spark) as second:
        second.compact_history()  # folds the two steps the first one recorded
    first.compact_history()
    with Pipeline(circuit(), root, spark) as p:
        # each step's change once: a step folded twice would count its row twice
        assert sorted((r["who"], r["n"], r["_weight"]) for r in p.changes("counts").collect()) \
            == [("a", 1, 1), ("b", 1, 1)]
        assert {r["who"]: r["n"] for r in p.view("counts").collect()} == {"a": 1, "b": 1}


def test_openers_whose_fences_interleave_leave_exactly_one_owner(spark, tmp_path, monkeypatch):
    """X fences the manifest; Y reads both tables and fences the manifest after X; X fences
    the division log before Y does. Y's division fence fails, but Y has fenced X out of the
    manifest already: Y reads both tables again and fences both again, so Y owns the root and
    X is fenced at its next step (before: Y stopped at open and X was fenced too, no owner)."""
    import threading

    from dbsp_pipeline.runtime.division_log import DivisionLog

    root = str(tmp_path)
    with Pipeline(circuit(), root, spark):
        pass  # an existing, empty pipeline
    real_fence = DivisionLog.fence
    y_at_fence, x_fenced = threading.Event(), threading.Event()
    opened: dict[str, object] = {}

    def open_y() -> None:
        try:
            opened["y"] = Pipeline(circuit(), root, spark)
        except Exception as e:  # noqa: BLE001 - the outcome is what the test checks
            opened["y"] = e

    y = threading.Thread(target=open_y, name="opener-y")

    def fence(self) -> None:
        me = threading.current_thread()
        if me is threading.main_thread() and not y.is_alive() and "y" not in opened:
            y.start()  # X has fenced the manifest: Y opens now, up to its division fence
            assert y_at_fence.wait(120)
            real_fence(self)  # X's division fence lands first
            x_fenced.set()
            return
        if me is y and not y_at_fence.is_set():
            y_at_fence.set()
            assert x_fenced.wait(120)
        real_fence(self)

    monkeypatch.setattr(DivisionLog, "fence", fence)
    x = Pipeline(circuit(), root, spark)
    y.join(120)
    monkeypatch.undo()
    assert isinstance(opened["y"], Pipeline), opened["y"]
    owner = opened["y"]
    owner.push("x", [(1, "y")])
    owner.step()
    x.push("x", [(2, "x")])
    with pytest.raises(PipelineFencedError):
        x.step()
    owner.close()
    with Pipeline(circuit(), root, spark) as p:
        p.run()
        assert {r["who"]: r["n"] for r in p.view("counts").collect()} == {"y": 1, "x": 1}
