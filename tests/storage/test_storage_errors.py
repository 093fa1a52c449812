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


def test_a_write_that_may_have_happened_is_resolved_by_the_sequence_number(
        spark, tmp_path, monkeypatch):
    with Pipeline(circuit(), str(tmp_path), spark) as p:
        failing_commit(monkeypatch, DeltaError("connection reset"), commit_first=True)
        with pytest.raises(StorageError) as e:
            p.push("x", [(1,), (2,)], producer="loader", seq=0)
        assert not e.value.definitely_failed and "may have happened" in str(e.value)
        assert not isinstance(e.value, UsageError)
        monkeypatch.undo()
        assert p.pushed("x", producer="loader") == 0  # it did happen
        assert p.push("x", [(1,), (2,)], producer="loader", seq=0) == 0  # the retry is a no-op
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
