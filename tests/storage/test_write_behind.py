"""Trace files written behind a driver step's computation: a staged file is usable at once (its
``DataFile`` is the written file's), read, recorded and folded only once written; a write that
fails fails the step, which commits nothing and succeeds when stepped again."""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from dbsp_pipeline import Circuit, Pipeline, StepFailedError
from dbsp_pipeline.errors import StorageError
from dbsp_pipeline.spark_session import LazySession
from dbsp_pipeline.storage import data_files
from dbsp_pipeline.storage.delta_table import SparkDeltaTable
from dbsp_pipeline.storage.staged_table import StagedTable
from dbsp_pipeline.storage.table_store import DataFile

SCHEMA = StructType([StructField("k", LongType(), False),
                     StructField("_weight", LongType(), False),
                     StructField("_shard", IntegerType(), False)])


def rows(keys: range) -> pa.Table:
    return pa.table({"k": pa.array(list(keys), pa.int64()),
                     "_weight": pa.array([1] * len(keys), pa.int64()),
                     "_shard": pa.array([k % 7 + 3 for k in keys], pa.int32())})


def staged(tmp_path, writes_behind: bool = True) -> StagedTable:
    table = SparkDeltaTable(LazySession(), str(tmp_path / "t"), SCHEMA, single_writer=True)
    return StagedTable(table, writes_behind=writes_behind)


class _HeldWrites:
    """Holds the background writer until released, so a test sees its files pending."""

    def __init__(self, monkeypatch) -> None:
        self.release = threading.Event()
        write = data_files.DataFiles._write

        def held(files, table, target, footer, *codec):
            if threading.current_thread().name.startswith("dbsp-write-behind"):
                assert self.release.wait(30)
            write(files, table, target, footer, *codec)
        monkeypatch.setattr(data_files.DataFiles, "_write", held)


def test_a_pending_file_is_the_written_file(tmp_path, monkeypatch):
    table = staged(tmp_path)
    held = _HeldWrites(monkeypatch)
    [pending] = table.stage_new_file(rows(range(10, 30)))
    [listed] = table.files()
    assert listed == pending and pending.rows == 20
    assert (pending.shard_min, pending.shard_max) == (3, 9)
    held.release.set()
    # a read waits for the file; the record, once written, names it with the file's statistics
    assert sorted(table.read_arrow([pending]).column("k").to_pylist()) == list(range(10, 30))
    [add] = table.record()["adds"]
    assert DataFile.from_stats(pending.path, add["stats"]) == pending
    assert pq.read_table(pending.path).num_rows == 20
    assert table.files() == [pending]


def test_from_rows_matches_the_footer_statistics(tmp_path):
    table = staged(tmp_path, writes_behind=False)
    for keys in (range(1), range(5, 9), range(100)):
        [written] = table.stage_new_file(rows(keys))
        assert DataFile.from_rows(written.path, rows(keys)) == written
    steps = pa.table({"_step": pa.array([4, 2, 9], pa.int64()), "v": [1, 2, 3]})
    assert DataFile.from_rows("p", steps) == DataFile("p", 3, None, None, 2, 9)
    assert table.stage_new_file(rows(range(0))) == []


def test_record_and_fold_wait_for_the_writes(tmp_path):
    table = staged(tmp_path)
    files = [f for i in range(5) for f in table.stage_new_file(rows(range(i * 10, i * 10 + 10)))]
    assert table.fold() == 1  # one commit of the five files, all written
    assert {f.path for f in table.delta.files()} == {f.path for f in files}
    assert table.record() == {}


def test_a_failed_write_raises_from_the_wait_and_a_rollback_forgets_it(tmp_path, monkeypatch):
    table = staged(tmp_path)
    [good] = table.stage_new_file(rows(range(3)))
    table.wait_for_writes()
    write = data_files.DataFiles._write

    def failing(files, t, target, footer, *codec):
        if threading.current_thread().name.startswith("dbsp-write-behind"):
            raise OSError("disk full")
        write(files, t, target, footer, *codec)
    monkeypatch.setattr(data_files.DataFiles, "_write", failing)
    table.stage_new_file(rows(range(3, 6)))
    with pytest.raises(StorageError, match="disk full") as e:
        table.wait_for_writes()
    assert e.value.definitely_failed
    with pytest.raises(StorageError):
        table.record()
    table.load({})  # the rollback of a failed step: nothing staged, nothing waits
    assert table.files() == [] and table.record() == {}


def view(p: Pipeline) -> list[dict]:
    return sorted(p.view_arrow("n").drop_columns(["_weight"]).to_pylist(), key=lambda r: r["r"])


def test_a_step_whose_trace_write_fails_commits_nothing_and_steps_again(spark, tmp_path,
                                                                         monkeypatch):
    c = Circuit("behind")
    x = c.input("x", "k BIGINT, r STRING")
    c.output("n", x.group_by("r").agg(n="count(*)", top="max(k)"))
    with Pipeline(c, str(tmp_path), spark) as p:
        p.push("x", [(1, "a"), (2, "b")])
        p.step()
        write = data_files.DataFiles._write
        failures = []

        def failing(files, t, target, footer, *codec):
            if threading.current_thread().name.startswith("dbsp-write-behind"):
                failures.append(target)
                raise OSError("disk full")
            write(files, t, target, footer, *codec)
        monkeypatch.setattr(data_files.DataFiles, "_write", failing)
        p.push("x", [(3, "a"), (4, "c")])
        with pytest.raises(StepFailedError, match="disk full"):
            p.step()
        assert failures
        assert p.engine.db.get_step() == 1
        monkeypatch.setattr(data_files.DataFiles, "_write", write)
        p.step()
        expected = [{"r": "a", "n": 2, "top": 3}, {"r": "b", "n": 1, "top": 2},
                    {"r": "c", "n": 1, "top": 4}]
        assert view(p) == expected
    with Pipeline(c, str(tmp_path), spark) as p:  # and the root opens to the same view
        assert view(p) == expected
