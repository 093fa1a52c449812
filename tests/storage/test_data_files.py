"""``DataFiles``: a table's data files written and read without its Delta log, from the URI alone
(what a Spark task does), on a local disk and on a real S3-compatible store."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dbsp_pipeline.errors import StorageError
from dbsp_pipeline.storage.data_files import DataFiles, new_sorted_run, sorted_run_of
from dbsp_pipeline.storage.table_store import open_table_store
from tests.object_store_helpers import new_bucket

SCHEMA = pa.schema([("key", pa.string()), ("_shard", pa.int32())])


def _round_trip(uri: str) -> None:
    files = DataFiles.for_uri(uri, SCHEMA)
    assert not Path(uri.removeprefix("file://"), "_delta_log").exists()  # nothing created
    (add,) = files.write_arrow(pa.table({"key": ["b", "a"], "_shard": [7, 3]}))
    assert re.fullmatch(r"data/[0-9a-f]{32}\.parquet", add.path), add.path
    assert '"minValues": {"key": "a", "_shard": 3}' in add.stats
    (again,) = files.write_arrow(pa.table({"key": ["c"], "_shard": [9]}))
    assert again.path != add.path  # a fresh name each
    # the pieces of one sorted run: fresh names that tell their run
    run = new_sorted_run()
    pieces = [a for rows in (["d"], ["e"]) for a in files.write_arrow(
        pa.table({"key": rows, "_shard": [1]}), run)]
    assert len({a.path for a in pieces}) == 2
    assert {sorted_run_of(files.path(a.path)) for a in pieces} == {files.path(f"data/{run}")}
    assert sorted_run_of(files.path(add.path)) == files.path(add.path)  # a run of its own
    assert files.write_arrow(SCHEMA.empty_table()) == []
    rows = files.read_arrow([files.path(add.path)], pc.field("_shard") > 4, ["key"])
    assert rows.to_pylist() == [{"key": "b"}]
    # The table's store sees the same file once an add records it.
    store = open_table_store(uri, SCHEMA)
    store.commit([add])
    assert [f.path for f in store.files()] == [files.path(add.path)]
    assert store.read_arrow([files.path(add.path)]).num_rows == 2


def test_local_files_round_trip_without_the_log(tmp_path: Path) -> None:
    _round_trip(str(tmp_path / "t"))
    _round_trip("file://" + str(tmp_path / "u"))


def test_s3_files_use_the_processes_environment(object_store: dict[str, str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in object_store.items():
        monkeypatch.setenv(key, value)
    bucket = new_bucket(object_store, "datafiles")
    _round_trip(f"s3://{bucket}/{uuid.uuid4().hex[:8]}/t")


def test_an_unknown_scheme_names_the_uri() -> None:
    with pytest.raises(StorageError, match=r"'gs://b/t': unsupported scheme 'gs://'"):
        DataFiles.for_uri("gs://b/t", SCHEMA)


def test_a_spark_written_decimal_column_gets_no_bounds_and_the_rest_keeps_theirs(
        spark, tmp_path: Path) -> None:
    """Spark stores a DECIMAL(15,2) as an integer whose bounds pyarrow cannot read: the file is
    described all the same, with no min/max for that column (nothing pruned by it) and the
    other columns' bounds and every null count kept (a Spark-path step over a trace with a
    DECIMAL column failed here)."""
    import json
    from decimal import Decimal

    schema = pa.schema([("k", pa.int64()), ("amount", pa.decimal128(15, 2))])
    files = DataFiles.for_uri(str(tmp_path / "t"), schema)
    folder = "data/spark"
    spark.createDataFrame([(1, Decimal("1.50")), (4, None)], "k BIGINT, amount DECIMAL(15,2)") \
        .coalesce(1).write.parquet(files.path(folder))
    (add,) = files.describe_folder(folder)
    stats = json.loads(add.stats)
    assert stats["numRecords"] == 2 and stats["nullCount"] == {"k": 0, "amount": 1}
    assert stats["minValues"] == {"k": 1} and stats["maxValues"] == {"k": 4}


def test_the_sorted_run_of_a_file_is_told_by_its_path() -> None:
    run, other = uuid.uuid4().hex, uuid.uuid4().hex
    table = "s3://bucket/root/state/t"
    # a piece of a run; a file of its own; Spark's write: a run in a folder
    assert sorted_run_of(f"{table}/data/{run}-{other}.parquet") == f"{table}/data/{run}"
    assert sorted_run_of(f"{table}/data/{other}.parquet") == f"{table}/data/{other}.parquet"
    assert sorted_run_of(f"{table}/data/{run}/part-00001-{other}-c000.snappy.parquet") == (
        f"{table}/data/{run}")
    # any other name is a run of its own: a dash alone does not make a run
    for path in (f"{table}/data/part-00000-{other}.parquet", "f1", "/t/x/y.parquet"):
        assert sorted_run_of(path) == path


def test_files_are_written_with_lz4_and_spark_reads_them(tmp_path: Path, spark) -> None:
    """Data files are LZ4-compressed (Parquet's ``LZ4_RAW``: ``COMPRESSION``), which Spark
    reads back as written."""
    import pyarrow.parquet as pq

    files = DataFiles.for_uri(str(tmp_path), SCHEMA)
    rows = pa.table({"key": [f"k{i % 13}" for i in range(500)], "_shard": list(range(500))})
    (add,) = files.write_arrow(rows)
    path = files.fs_path(files.path(add.path))
    meta = pq.ParquetFile(path).metadata
    assert {meta.row_group(0).column(c).compression for c in range(meta.num_columns)} == {"LZ4"}
    back = spark.read.parquet(path).orderBy("_shard").collect()
    assert [(r["key"], r["_shard"]) for r in back] == list(zip(rows.column("key").to_pylist(),
                                                               rows.column("_shard").to_pylist()))


def test_changed_bytes_of_a_data_file_fail_its_reads(tmp_path: Path, spark) -> None:
    """Every page of a data file carries its CRC-32, and the engine's reads (pyarrow's and
    Spark's) check it: a file one byte of whose values changed on disk fails the read, where a
    read that does not check returns other values."""
    import pyarrow.parquet as pq

    schema = pa.schema([("x", pa.int64()), ("_shard", pa.int32())])
    files = DataFiles.for_uri(str(tmp_path), schema)
    rows = pa.table({"x": pa.array(range(1000), pa.int64()), "_shard": pa.array([1] * 1000,
                                                                                  pa.int32())})
    (add,) = files.write_arrow(rows)
    path = files.fs_path(files.path(add.path))
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    data = bytearray(open(path, "rb").read())
    # the last byte of the column's (one) page: LZ4 ends a block with literal bytes, copied as
    # they are, so the change reaches a value rather than the decompression
    data[column.data_page_offset + column.total_compressed_size - 1] ^= 0x01
    open(path, "wb").write(bytes(data))
    assert pq.read_table(path).column("x").to_pylist() != rows.column("x").to_pylist()
    with pytest.raises(OSError, match="CRC"):
        files.read_arrow([files.path(add.path)])
    with pytest.raises(OSError, match="CRC"):
        pq.read_table(path, page_checksum_verification=True)
    with pytest.raises(Exception, match="(?i)checksum|crc"):
        spark.read.parquet(path).collect()
