"""Storage errors say whether the write definitely failed or may have happened, and producer
sequence numbers resolve the doubt exactly once."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from dbsp_pipeline import Circuit, Pipeline, StorageError, UsageError
from tests.conftest import view_counter


def circuit() -> Circuit:
    c = Circuit("s")
    x = c.input("x", "k BIGINT")
    c.output("n", x.group_by("k").agg(n="count(*)"))
    return c


def failing_commit(monkeypatch, error: Exception, commit_first: bool):
    original = DeltaTable.create_write_transaction

    def commit(self, *args, **kwargs):
        if commit_first:
            original(self, *args, **kwargs)  # the commit lands, but the caller sees an error
        raise error

    monkeypatch.setattr(DeltaTable, "create_write_transaction", commit)


def test_a_write_that_may_have_happened_and_did_is_resolved_from_the_log(
        spark, tmp_path, monkeypatch):
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        failing_commit(monkeypatch, DeltaError("connection reset"), commit_first=True)
        assert p.push("x", [(1,), (2,)], producer="loader", seq=0) == 2  # found on the log
        monkeypatch.undo()
        assert p.pushed("x", producer="loader") == 0
        assert p.push("x", [(1,), (2,)], producer="loader", seq=0) == 0  # the retry is a no-op
        p.step()
        assert view_counter(p.view("n")) == {(1, 1): 1, (2, 1): 1}


def test_a_write_that_may_have_happened_is_resolved_by_the_sequence_number(
        spark, tmp_path, monkeypatch):
    """The commit is not on the log when the error is seen (it might still land): the doubt
    reaches the caller, and the producer's sequence number resolves it."""
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        failing_commit(monkeypatch, DeltaError("connection reset"), commit_first=False)
        with pytest.raises(StorageError) as e:
            p.push("x", [(1,), (2,)], producer="loader", seq=0)
        assert not e.value.definitely_failed and "may have happened" in str(e.value)
        assert not isinstance(e.value, UsageError)
        monkeypatch.undo()
        assert p.pushed("x", producer="loader") is None  # it did not happen
        assert p.push("x", [(1,), (2,)], producer="loader", seq=0) == 2
        p.step()
        assert view_counter(p.view("n")) == {(1, 1): 1, (2, 1): 1}


def test_a_write_that_definitely_failed_says_so_and_records_nothing(spark, tmp_path, monkeypatch):
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        failing_commit(monkeypatch, CommitFailedError("conflict"), commit_first=False)
        with pytest.raises(StorageError) as e:
            p.push("x", [(1,)], producer="loader", seq=0)
        assert e.value.definitely_failed and "did not happen" in str(e.value)
        monkeypatch.undo()
        assert p.pushed("x", producer="loader") is None
        assert p.push("x", [(1,)], producer="loader", seq=0) == 1
        p.step()
        assert view_counter(p.view("n")) == {(1, 1): 1}


def test_a_single_writer_commit_that_may_have_happened_is_resolved_from_the_log(
        spark, tmp_path, monkeypatch):
    """The division log's fold (a single writer's compare-and-append) lands, but the caller
    sees an error that says it may have happened: the commit reads the log, finds its files
    there and goes on; the next fold is not mistaken for another writer's (a false fence)."""
    original = DeltaTable.create_write_transaction

    def commit(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if "_divisions" in self.table_uri:
            raise DeltaError("connection reset")

    with Pipeline(circuit(), str(tmp_path), spark) as p:
        for k in range(3):
            p.push("x", [(k,)])
            p.step()
        monkeypatch.setattr(DeltaTable, "create_write_transaction", commit)
        p.compact_history()  # folds the step records into the division log
        monkeypatch.undo()
        p.push("x", [(0,)])
        p.step()
        p.compact_history()  # folds again, at the version after the resolved one
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        assert view_counter(p.view("n")) == {(0, 2): 1, (1, 1): 1, (2, 1): 1}
        assert p.verify().ok
