"""Readers and leases: history compaction never collapses what a live reader's since needs;
an expired lease stops holding it back."""

from __future__ import annotations

import time

import pytest

from dbsp_pipeline import Circuit, Pipeline, UsageError
from dbsp_pipeline.errors import LeaseExpiredError
from tests.conftest import view_counter


def circuit() -> Circuit:
    c = Circuit("r")
    x = c.input("x", "k BIGINT, v BIGINT")
    c.output("sums", x.group_by("k").agg(s="sum(v)"))
    return c


def run_steps(p: Pipeline, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        p.push("x", [(i % 2, i)])
        p.step()


def test_retention_collapses_old_history_and_keeps_the_view(spark, tmp_path):
    with Pipeline(circuit(), str(tmp_path), spark, retain_steps=2) as p:
        run_steps(p, 6)
        assert p.compact_history() == {"sums": 3}
        assert view_counter(p.view("sums")) == {(0, 0 + 2 + 4, ): 1, (1, 1 + 3 + 5): 1}
        assert view_counter(p.view("sums", as_of=3)) == {(0, 2): 1, (1, 4): 1}
        assert {r["_step"] for r in p.changes("sums", since=4).collect()} == {4, 5}
        with pytest.raises(UsageError, match="no longer retained"):
            p.view("sums", as_of=1)
        with pytest.raises(UsageError, match="no longer retained"):
            p.changes("sums", since=2)
        with pytest.raises(UsageError, match="the change of step 3 is no longer retained"):
            p.step_changes_arrow("sums", 3)
        assert p.step_changes_arrow("sums", 4).num_rows == 2  # the first exact change
        with pytest.raises(UsageError, match=r"the change of step 6: no such step is written "
                                             r"\(steps 0 to 5 are\)"):
            p.step_changes_arrow("sums", 6)


def test_a_live_reader_holds_history_back(spark, tmp_path):
    with Pipeline(circuit(), str(tmp_path), spark, retain_steps=0) as p:
        run_steps(p, 2)
        reader = p.reader("sums", since=1)
        run_steps(p, 4, start=2)
        assert p.compact_history()["sums"] == 1  # held at the reader's since
        assert view_counter(reader.snapshot(as_of=1)) == {(0, 0): 1, (1, 1): 1}
        steps = [step for step, _ in reader.listen(after=1)]
        assert steps == [2, 3, 4, 5]
        step2 = dict(reader.listen(after=1))[2]
        assert view_counter(step2.drop("_step")) == {(0, 0): -1, (0, 2): 1}
        reader.downgrade_since(4)
        assert p.compact_history()["sums"] == 4
        with pytest.raises(UsageError, match="since can only advance"):
            reader.downgrade_since(3)
        reader.close()
        run_steps(p, 1, start=6)
        assert p.compact_history()["sums"] == 6  # no reader: retain_steps=0 collapses all


def test_an_expired_lease_stops_holding_history(spark, tmp_path):
    with Pipeline(circuit(), str(tmp_path), spark, retain_steps=0) as p:
        run_steps(p, 2)
        p.compact_history()  # retain_steps=0: history through step 1 is collapsed
        with pytest.raises(UsageError, match="cannot start"):
            p.reader("sums", since=0)
        reader = p.reader("sums", since=1, lease_seconds=0.5)
        run_steps(p, 2, start=2)
        assert p.compact_history()["sums"] == 1
        time.sleep(0.6)
        assert p.compact_history()["sums"] == 3
        with pytest.raises(LeaseExpiredError):
            reader.snapshot()
        with pytest.raises(UsageError, match="cannot start"):
            p.reader("sums", since=2)
