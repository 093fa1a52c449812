"""The data files of a Delta table: written, described and read as plain Parquet, with no Delta
log and no commit.

A ``DeltaTableStore`` (``storage/delta_store.py``) delegates its data files here and keeps the
log. The split lets a process that must never touch the log, such as a Spark task running one
owner's part of a step (``runtime/owner_exec.py``), write and read a table's files:
``DataFiles.for_uri`` builds the filesystem from the URI alone (a local path, or ``s3://`` with
the *current process's* ``AWS_*`` environment, ``storage/s3_store.py::s3_options``), never opens
or creates the Delta table, and carries no credentials of its own.

Integrity: every file written here carries a CRC-32 of each of its Parquet pages, and the
engine's reads of its tables' files (here, ``CHECKSUMS_READ`` where it reads them with pyarrow
itself, and Spark's, ``spark_session.py``) check the pages that carry one: bytes changed on disk
since a file was written fail the read (an ``OSError`` naming the page) instead of being read
as other values. Spark's writes carry them as well; files written before carry none and read
as before.

Durability: none. ``write_arrow`` writes one new file under a fresh name
``data/<uuid4>.parquet`` (so a retried writer never overwrites a file) and returns its add
action. The files of one *sorted run* (the pieces of one merge, an owner stage's appends) are
named ``data/<run>-<uuid4>.parquet``, and Spark writes a run into a folder ``data/<uuid4>/``:
``sorted_run_of`` tells a file's run from its path, which is how compaction counts the runs a
lookup reads, not the files (``Trace.compaction_candidates``). A written file is invisible to
every Delta reader until a commit, or a manifest entry staging its action, records it. Files
nobody records are orphans that garbage collection deletes (``storage/garbage.py``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from dbsp_pipeline.errors import StorageError
from dbsp_pipeline.storage.table_store import DATA_DIR

_STATS_STRING_LIMIT = 32
#: how the engine reads a Parquet file (``pq.read_table(..., **CHECKSUMS_READ)``,
#: ``pq.ParquetFile``): the pages that carry a CRC-32 (every page the engine writes) are checked
CHECKSUMS_READ = {"page_checksum_verification": True}
#: the file format of the engine's dataset reads, checking the pages' CRC-32 as ``CHECKSUMS_READ``
PARQUET_CHECKED = ds.ParquetFileFormat(
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(**CHECKSUMS_READ))
#: the codec of the Parquet files written here by default (the state's: traces, input logs):
#: LZ4 (Parquet's ``LZ4_RAW``, which Spark 3.4 and later, DuckDB and delta-rs read) reads back
#: 2.5x faster than snappy for the same size and write time (1M rows of keys, amounts and
#: weights: 8 ms against 22 to read, 13 MB against 14)
COMPRESSION = "lz4"
#: the codec of files every Parquet reader must read (a view's log: ``output_log.py``)
PORTABLE_COMPRESSION = "snappy"


class DataFiles:
    """The data files of the table at ``uri`` (absolute local path or ``s3://bucket/prefix``, as
    the table's store spells it), rows of Arrow ``schema``, reached through ``filesystem``."""

    def __init__(self, uri: str, schema: pa.Schema, filesystem: pafs.FileSystem) -> None:
        self.uri = uri
        self.schema = schema
        self.filesystem = filesystem
        #: the columns written dictionary-encoded: the text and binary ones (few distinct values
        #: in the rows that repeat them); numbers are written plain, which for keys, weights and
        #: measures is 40% faster to write and read and no bigger (the codec compresses both)
        self._dictionary_columns = [
            f.name for f in schema
            if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            or pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]

    @classmethod
    def for_uri(cls, uri: str, schema: pa.Schema) -> DataFiles:
        """The data files of the table at ``uri``: a local path (or ``file://``), or ``s3://``
        reached with this process's ``AWS_*`` environment. Reads no log and creates nothing, so
        it is safe on a Spark executor. A ``StorageError`` naming the URI for another scheme."""
        scheme, sep, _ = uri.partition("://")
        if not sep or scheme == "file":
            from dbsp_pipeline.storage.local_store import local_path

            return cls(local_path(uri), schema, pafs.LocalFileSystem())
        if scheme in ("s3", "s3a"):
            from dbsp_pipeline.storage.s3_store import s3_filesystem, s3_options, split_s3_uri

            bucket, key = split_s3_uri(uri)
            normalized = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
            return cls(normalized, schema, s3_filesystem(s3_options(normalized)))
        raise StorageError(f"table URI {uri!r}: unsupported scheme '{scheme}://' (a local path, "
                           "file:// or s3://bucket/prefix)", definitely_failed=True)

    # -- paths -------------------------------------------------------------------------------
    def path(self, relative: str) -> str:
        """The absolute path (or object URI) of ``relative`` inside the table."""
        return f"{self.uri}/{relative}"

    def fs_path(self, path: str) -> str:
        """The filesystem path of ``path`` (an absolute path or object URI of this table)."""
        return path.split("://", 1)[1] if "://" in path else path

    def make_folder(self, fs_path: str) -> None:
        """Make the folder ``fs_path`` exist before files are written into it (a local disk
        needs it; an object store has no folders)."""
        if isinstance(self.filesystem, pafs.LocalFileSystem):
            os.makedirs(fs_path, exist_ok=True)

    # -- files -------------------------------------------------------------------------------
    def write_arrow(self, table: pa.Table, run: str | None = None, *,
                    relative: str | None = None,
                    compression: str | None = None) -> list[AddAction]:
        """Write ``table`` (cast to the schema) as one new file ``data/<uuid4>.parquet``, or
        ``data/<run>-<uuid4>.parquet`` as a piece of the sorted run ``run`` (``new_sorted_run``;
        a fresh name either way, so a retried writer never overwrites a file), or at
        ``relative`` (a fresh name ``new_file_path`` chose before); its add action (none for no
        rows). ``compression``: the Parquet codec (default ``COMPRESSION``). Nothing is committed.
        A ``StorageError`` (definitely failed) naming the file when the write fails."""
        if table.num_rows == 0:
            return []
        relative = relative or new_file_path(run)
        target = self.fs_path(self.path(relative))
        footer: list[pq.FileMetaData] = []
        try:
            try:
                self._write(table, target, footer, compression or COMPRESSION)
            except FileNotFoundError:  # a local table's data folder does not exist yet
                self.make_folder(self.fs_path(self.path(DATA_DIR)))
                footer.clear()
                self._write(table, target, footer, compression or COMPRESSION)
            info = self.filesystem.get_file_info(target)
        except OSError as e:
            raise StorageError(f"writing a data file to {self.path(relative)} failed: {e}",
                               definitely_failed=True) from e
        # the footer just written (its statistics are those a reader of the file finds), so
        # the file is not listed and read back
        return [add_action(relative, info, footer[0])]

    def _write(self, table: pa.Table, target: str, footer: list[pq.FileMetaData],
               compression: str) -> None:
        pq.write_table(table.cast(self.schema), target, filesystem=self.filesystem,
                       metadata_collector=footer, use_dictionary=self._dictionary_columns,
                       compression=compression, write_page_checksum=True)

    def describe_folder(self, relative: str) -> list[AddAction]:
        """The add actions of the Parquet files in the folder ``relative`` (with Delta
        statistics from their footers), in name order; empty files are deleted, not described."""
        adds = []
        infos = self.filesystem.get_file_info(
            pafs.FileSelector(self.fs_path(self.path(relative))))
        for info in sorted(infos, key=lambda i: i.base_name):
            if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet"):
                continue
            meta = pq.read_metadata(info.path, filesystem=self.filesystem)
            if meta.num_rows == 0:
                self.filesystem.delete_file(info.path)
                continue
            adds.append(add_action(f"{relative}/{info.base_name}", info, meta))
        return adds

    def read_arrow(self, paths: Sequence[str], where: pc.Expression | None = None,
                   columns: Sequence[str] | None = None) -> pa.Table:
        """The rows of the files at ``paths`` (absolute) that satisfy ``where`` (only
        ``columns``, if given); row groups whose statistics exclude ``where`` are skipped."""
        if not paths:
            empty = self.schema.empty_table()
            return empty.select(list(columns)) if columns is not None else empty
        dataset = ds.dataset([self.fs_path(p) for p in paths], schema=self.schema,
                             format=PARQUET_CHECKED, filesystem=self.filesystem)
        return dataset.to_table(filter=where, columns=list(columns) if columns else None)


def new_file_path(run: str | None = None) -> str:
    """A fresh data file path inside a table: ``data/<uuid4>.parquet``, or
    ``data/<run>-<uuid4>.parquet`` for a piece of the sorted run ``run``."""
    name = uuid.uuid4().hex if run is None else f"{run}-{uuid.uuid4().hex}"
    return f"{DATA_DIR}/{name}.parquet"


def new_sorted_run() -> str:
    """A fresh sorted-run name, for the files one write produces in pieces (``write_arrow``)."""
    return uuid.uuid4().hex


def sorted_run_of(path: str) -> str:
    """The sorted run the data file at ``path`` belongs to: the run named in
    ``data/<run>-<uuid4>.parquet``; the folder of a file in a folder of ``data/`` (Spark's
    write); else the file alone (``data/<uuid4>.parquet``, and any other name)."""
    folder, _, name = path.rpartition("/")
    head, _, parent = folder.rpartition("/")
    if parent == DATA_DIR:
        stem, dash, _ = name.partition("-")
        return f"{folder}/{stem}" if dash and len(stem) == 32 else path
    if head.rpartition("/")[2] == DATA_DIR:
        return folder
    return path


def add_action(relative: str, info: pafs.FileInfo, meta: pq.FileMetaData) -> AddAction:
    """The Delta add action of the data file at ``relative`` (inside the table), from its
    file information and its footer (Delta statistics)."""
    return AddAction(path=relative, size=info.size, partition_values={},
                     modification_time=millis(info), data_change=True,
                     stats=json.dumps(file_stats(meta)))


def millis(info: pafs.FileInfo) -> int:
    """A file's modification time in milliseconds since the epoch (0 if the store gives none)."""
    ns = info.mtime_ns
    return int(ns // 1_000_000) if ns is not None else 0


def file_stats(meta: pq.FileMetaData) -> dict[str, Any]:
    """Delta per-file statistics (numRecords, minValues, maxValues, nullCount) from a footer."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    schema = meta.schema.to_arrow_schema()
    for ci, field in enumerate(schema):
        lo = hi = None
        null_count = 0
        ok = True
        bounded = True  # the min/max of every row group could be read
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(ci).statistics
            if st is None:
                ok = False
                break
            null_count += st.null_count or 0
            if bounded and st.has_min_max:
                try:
                    rg_lo, rg_hi = st.min, st.max
                except pa.ArrowNotImplementedError:
                    # pyarrow cannot read some writers' bounds (Spark's DECIMAL stored as an
                    # integer): the file gets no min/max for the column, so nothing is pruned
                    bounded = False
                    continue
                lo = rg_lo if lo is None else min(lo, rg_lo)
                hi = rg_hi if hi is None else max(hi, rg_hi)
        if not ok:
            continue
        nulls[field.name] = null_count
        lo, hi = (_json_stat(lo), _json_stat(hi)) if bounded else (None, None)
        if lo is not None and hi is not None:
            mins[field.name] = lo
            maxs[field.name] = hi
    return {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def _json_stat(v: object) -> object:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if isinstance(v, str):
        return v if len(v) <= _STATS_STRING_LIMIT else None
    if isinstance(v, _dt.datetime):
        return v.isoformat()
    if isinstance(v, _dt.date):
        return v.isoformat()
    return None
