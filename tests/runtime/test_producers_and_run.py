"""Idempotent producer pushes, mapping steps to their input, and running while input arrives."""

from __future__ import annotations

import threading
import time

import pytest

from dbsp_pipeline import Circuit, Pipeline, UsageError
from tests.conftest import view_counter


def circuit() -> Circuit:
    c = Circuit("p")
    x = c.input("x", "k BIGINT, v BIGINT")
    c.output("sums", x.group_by("k").agg(s="sum(v)", n="count(*)"))
    return c


def test_a_repeated_sequence_number_is_a_no_op(spark, tmp_path):
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        assert p.pushed("x", producer="loader-1") is None
        assert p.push("x", [(1, 10), (2, 20)], producer="loader-1", seq=0) == 2
        assert p.push("x", [(1, 10), (2, 20)], producer="loader-1", seq=0) == 0  # retried
        assert p.push("x", [(1, 5)], producer="loader-1", seq=1) == 1
        assert p.push("x", [(1, 5)], producer="loader-2", seq=1) == 1  # another producer
        assert p.push("x", [(9, 9)], producer="loader-1", seq=0) == 0   # older: recorded
        assert p.pushed("x", producer="loader-1") == 1
        assert p.pushed("x", producer="loader-2") == 1
        p.step()
        assert view_counter(p.view("sums")) == {(1, 20, 3): 1, (2, 20, 1): 1}


def test_two_processes_pushing_one_batch_at_once_record_it_once(spark, tmp_path):
    """The window between reading a producer's number and committing: another process pushes
    the same batch in it (a restarted Kafka source beside the old one). Delta lets two blind
    appends with one app id through, so the push must be a compare-and-append."""
    from pyspark.sql.types import LongType, StructField, StructType

    from dbsp_pipeline.runtime.input_log import InputLog
    from dbsp_pipeline.runtime.inputs import push_rows

    schema = StructType([StructField("k", LongType()), StructField("v", LongType())])
    first = InputLog(spark, str(tmp_path), "x", schema)
    second = InputLog(spark, str(tmp_path), "x", schema)
    batch = [(1, 10), (2, 20)]
    commit = first.table.commit
    raced: list[int] = []

    def commit_after_the_other_process(*args, **kwargs):
        if not raced:  # the other process pushes the same batch between check and commit
            raced.append(push_rows(second, batch, 1, "loader", 0))
        return commit(*args, **kwargs)

    first.table.commit = commit_after_the_other_process  # type: ignore[method-assign]
    assert push_rows(first, batch, 1, "loader", 0) == 0
    assert raced == [2]
    rows = first.table.read_arrow(first.table.files())
    assert sorted(rows.column("k").to_pylist()) == [1, 2]
    assert first.pushed("loader") == 0
    # a later batch of the producer still goes through after losing a race to another push
    raced.clear()
    first.table.commit = lambda *a, **kw: (raced.append(push_rows(second, [(5, 5)], 1, "other", 0))
                                           if not raced else None) or commit(*a, **kw)
    assert push_rows(first, [(3, 30)], 1, "loader", 1) == 1
    rows = first.table.read_arrow(first.table.files())
    assert sorted(rows.column("k").to_pylist()) == [1, 2, 3, 5]


def test_the_producer_position_survives_reopening(spark, tmp_path):
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        p.push("x", [(1, 1)], producer="loader", seq=17)
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        assert p.pushed("x", producer="loader") == 17
        assert p.push("x", [(1, 1)], producer="loader", seq=17) == 0
        assert p.push("x", [(1, 1)], producer="loader", seq=18) == 1


@pytest.mark.parametrize("kwargs, problem", [
    ({"producer": "a"}, "both producer and seq"),
    ({"seq": 3}, "both producer and seq"),
    ({"producer": "", "seq": 1}, "non-empty string"),
    ({"producer": "a", "seq": -1}, "integer >= 0"),
    ({"producer": "a", "seq": "7"}, "integer >= 0"),
])
def test_bad_producer_arguments_are_rejected(spark, tmp_path, kwargs, problem):
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        with pytest.raises(UsageError, match=problem):
            p.push("x", [(1, 1)], **kwargs)
        assert p.step().inputs == {"x": 0}


def test_step_info_maps_each_step_to_its_input_versions(spark, tmp_path):
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        p.push("x", [(1, 1)])
        p.push("x", [(2, 2)])
        p.step()
        p.step()  # no input
        p.push("x", [(3, 3)])
        p.step()
        assert p.step_info(0).inputs == {"x": (0, 2)}
        assert p.step_info(1).inputs == {"x": (2, 2)}
        assert p.step_info(2).inputs == {"x": (2, 3)}
        with pytest.raises(UsageError, match="has not been executed"):
            p.step_info(3)


def test_run_executes_steps_while_input_is_available(spark, tmp_path):
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        assert p.run() == []
        p.push("x", [(1, 1)])
        p.push("x", [(1, 2)])
        results = p.run(checkpoint_every=5)
        assert [r.step for r in results] == [0]
        assert results[-1].committed_version == p.state_version
        assert not p.input_pending()
        for i in range(3):
            p.push("x", [(2, i)])
            p.step() if i == 0 else None
        assert [r.step for r in p.run(max_steps=1)] == [2]
        assert p.run(max_steps=0) == []
        assert view_counter(p.view("sums")) == {(1, 3, 2): 1, (2, 3, 3): 1}


def test_pause_stops_a_running_coordinator_between_steps(spark, tmp_path):
    p = Pipeline(circuit(), str(tmp_path), spark)
    results = []
    runner = threading.Thread(target=lambda: results.extend(p.run(idle_seconds=60)))
    runner.start()
    for i in range(8):  # a producer thread pushes while run() steps
        p.push("x", [(i, i)])
        time.sleep(0.1)
    stopped = p.pause()
    runner.join(30)
    assert not runner.is_alive()
    assert results and stopped == p.next_step == results[-1].step + 1
    assert results[-1].committed_version == p.state_version  # stopped steps are committed
    p.push("x", [(100, 1)])
    assert p.run() == []  # paused
    p.resume()
    assert [r.step for r in p.run()] == [stopped]
    assert sum(r["n"] for r in p.view("sums").collect()) == 9
    p.close()


def test_stop_at_a_step(spark, tmp_path):
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        p.stop(2)
        for i in range(4):
            p.push("x", [(i, i)])
            p.run()
        assert p.next_step == 2 and p.input_pending()
        p.resume()
        assert [r.step for r in p.run()] == [2]
