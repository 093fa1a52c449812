"""``SparkDeltaTable``: the Spark handle over a table store."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql.types import LongType, StringType, StructField, StructType

from dbsp_pipeline.errors import ConcurrentWriterError, StorageError
from dbsp_pipeline.storage.delta_table import SparkDeltaTable
from tests.object_store_helpers import new_bucket

SCHEMA = StructType([StructField("key", StringType()), StructField("_step", LongType())])


def test_spark_on_an_s3_table_without_hadoop_aws_names_the_jars(spark, object_store) -> None:
    """This machine's Spark has no S3A filesystem: writing or reading an s3:// table's files on
    Spark is a StorageError naming the jars, not a JVM stack trace. The driver still can."""
    uri = f"s3://{new_bucket(object_store, 'spark')}/root/t"
    table = SparkDeltaTable(spark, uri, SCHEMA, storage_options=object_store)
    df = spark.createDataFrame([("a", 1)], SCHEMA)
    with pytest.raises(StorageError, match=f"Spark cannot reach {uri}/data/.*hadoop-aws") as e:
        table.write_files(df)
    assert "\tat " not in str(e.value) and e.value.definitely_failed
    adds = table.write_arrow(pa.table({"key": ["a"], "_step": [1]}, schema=table.arrow_schema))
    table.commit(adds)
    with pytest.raises(StorageError, match=f"Spark cannot reach {uri}: .*hadoop-aws"):
        table.read_version().collect()
    assert table.read_arrow(table.files()).to_pylist() == [{"key": "a", "_step": 1}]


def _rows(table: SparkDeltaTable, key: str) -> list:
    return table.write_arrow(pa.table({"key": [key], "_step": [1]}, schema=table.arrow_schema))


@pytest.mark.parametrize("what_lands", ["another writer's", "ours, then another writer's"])
def test_a_commit_of_unknown_outcome_is_a_lost_race_when_the_log_says_so(
        spark, tmp_path, monkeypatch, what_lands) -> None:
    """A single writer's commit fails with an unknown outcome; the log holds another writer's
    commit at that version, or ours followed by another writer's: either way this writer is
    fenced (``ConcurrentWriterError``), never told its commit is in doubt or done."""
    table = SparkDeltaTable(spark, str(tmp_path / "t"), SCHEMA, single_writer=True)
    table.commit(_rows(table, "a"))
    other = SparkDeltaTable(spark, str(tmp_path / "t"), SCHEMA)
    original = DeltaTable.create_write_transaction

    def commit(self, actions, **kwargs):
        monkeypatch.undo()
        if what_lands != "another writer's":
            original(self, actions, **kwargs)
        other.commit(_rows(other, "b"))
        raise DeltaError("connection reset")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", commit)
    with pytest.raises(ConcurrentWriterError):
        table.commit(_rows(table, "c"))


def test_newest_rows_reads_again_when_the_table_moved_on_and_names_a_lost_file(
        tmp_path, monkeypatch):
    """``newest_rows`` (a status read in another process): a file that vanished because the
    writer replaced it (and collected it) is read from the new version; a file missing from the
    version that is still the newest is a ``StorageError`` naming it."""
    import os

    from dbsp_pipeline.spark_session import LazySession
    from dbsp_pipeline.storage import delta_table

    schema = StructType([StructField("k", LongType())])
    table = SparkDeltaTable(LazySession(), str(tmp_path / "t"), schema)  # never starts Spark
    [first] = table.write_arrow(pa.table({"k": [1]}))
    table.commit([first])
    real_read = delta_table.read_bytes
    moves = []

    def read_while_the_writer_moves_on(path: str) -> bytes | None:
        if not moves:  # the writer replaces the file and deletes it, between load and read
            [second] = table.write_arrow(pa.table({"k": [2]}))
            moves.append(table.commit([second], [table.store.path(first.path)]))
            os.remove(table.store.path(first.path))
        return real_read(path)

    with monkeypatch.context() as m:
        m.setattr(delta_table, "read_bytes", read_while_the_writer_moves_on)
        assert delta_table.newest_rows(table.uri) == [{"k": 2}] and moves == [2]
    [lost] = table.files()
    os.remove(lost.path)
    with pytest.raises(StorageError, match=f"data file .*{os.path.basename(lost.path)}"):
        delta_table.newest_rows(table.uri)
    assert delta_table.newest_rows(str(tmp_path / "none")) is None
