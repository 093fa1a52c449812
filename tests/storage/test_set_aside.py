"""Setting aside a table's commits after a version: the table then ends at that version, Delta
checkpoints after it included, and commits on from there; nothing is deleted."""

from __future__ import annotations

import os

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql.types import LongType, StructField, StructType

from dbsp_pipeline.spark_session import LazySession
from dbsp_pipeline.storage.delta_table import SparkDeltaTable
from dbsp_pipeline.storage.set_aside import set_aside_after

SCHEMA = StructType([StructField("a", LongType(), False)])


def test_the_table_goes_on_from_the_version_kept(tmp_path):
    uri = str(tmp_path / "t")
    table = SparkDeltaTable(LazySession(), uri, SCHEMA)  # no JVM: Arrow writes only
    for i in range(55):  # version 49 writes a Delta checkpoint
        table.commit(table.write_arrow(pa.table({"a": [i]})))
    log = os.path.join(uri, "_delta_log")
    assert "00000000000000000049.checkpoint.parquet" in os.listdir(log)

    folder = set_aside_after(uri, 45, "a damaged commit after version 45")
    moved = set(os.listdir(folder))
    assert {f"{v:020d}.json" for v in range(46, 56)} <= moved
    assert {"00000000000000000049.checkpoint.parquet", "_last_checkpoint"} <= moved
    assert "a damaged commit after version 45" in open(os.path.join(folder, "REASON.txt")).read()
    assert max(os.listdir(log)) == f"{45:020d}.json"
    assert DeltaTable(uri).version() == 45
    assert sorted(DeltaTable(uri).to_pyarrow_table().column("a").to_pylist()) == list(range(45))

    again = SparkDeltaTable(LazySession(), uri, SCHEMA)
    assert again.commit(again.write_arrow(pa.table({"a": [100]}))) == 46
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 46
