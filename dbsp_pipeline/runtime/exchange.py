"""Changes that Spark steps' stages hand each other as files, split by the next stage's owners.

On a per-owner Spark step (``runtime/owner_exec.py``) every owner stage's task writes its output
change as files into the stage's exchange folder, ``_exchange/<step>-<id>/`` under the root
(``root.exchange``): the root's own store, which every executor reaches as it reaches the
traces. When only owner stages read the change, all grouping it by the same columns
(``Plan.exchange_keys``), the task splits its rows by the owner of those columns (the owner
``Layout.owner_column`` gives in Spark, so a row lands where the reader's trace keeps its key)
and writes one file per owner; a scatter stage does the same for an input's pushed rows
(``runtime/scatter.py``). The tasks report their files in their records; the driver gathers
them into an ``OwnedChange``, and the reading stage runs one task per owner that got rows, each
reading its own files. No row crosses the JVM: no Arrow-to-row conversion, no Spark shuffle,
no cached frame between two stages; the driver moves only file names. A change that is not
split goes to the driver (a view's small change, ``OwnedChange.read_all``) or to Spark
(``OwnedChange.to_frame``).

The files are Arrow IPC (a step's scratch is read once, soon after it is written: cheap to
write and read matters, size does not), under positional column names (``file_schema``). When
every reader reads fewer than all of the change's columns (an aggregate reads its group
columns and arguments: ``Plan.exchange_columns``), the files hold only those, and a reader gets
the others as NULL: a join's output aggregated by region by the amounts it sums crosses as
two of its four columns. Rows equal on those columns then stay apart, which such readers
take as it comes (``Operator.columns_read``).

Determinism: the files hold exactly the rows of the producing stage's output, split by owner
(each row in one file); the reader's task sees its owner's rows, as it would after a shuffle.
Row order inside a task does not reach any output (operators consolidate and sort by key).

Durability: none, and none is needed. The files are a step's scratch: they are written before
the step's record or checkpoint, never referred to by a Delta version or the manifest, and
removed when the step ends (``StepContext.release``), or, after a crash, when the root is opened
again (``remove_all``). A step replayed after a crash writes a new folder.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.driver import hashing
from dbsp_pipeline.driver.sql import zset_arrow_schema
from dbsp_pipeline.errors import StorageError
from dbsp_pipeline.storage.data_files import DataFiles
from dbsp_pipeline.storage.small_files import remove_folder
from dbsp_pipeline.storage.trace import OwnerLayout
from dbsp_pipeline.zset import SHARD_BITS, WEIGHT


class NeedsSpark(Exception):
    """A task could not compute a change's rows without Spark (DuckDB raised where the driver
    path would ask Spark, which a task cannot): its stage runs again the Spark way."""


def positional(i: int) -> str:
    """The name column ``i`` of a change crosses to a task under (Spark's Arrow UDFs look
    columns up by unquoted name, and names may hold dots or backticks)."""
    return f"_c{i}"


def file_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema of an exchange file of a change of payload ``schema``: the payload's
    columns under positional names, then ``_weight``."""
    return file_schema_of(zset_arrow_schema(schema))


def new_folder(root: str, step: int) -> str:
    """A fresh exchange folder for one stage of step ``step`` under ``root``."""
    return root_layout.exchange(root, f"{step}-{uuid.uuid4().hex}")


def remove_all(root: str) -> None:
    """Remove every exchange folder of ``root`` (what steps that crashed left). Only when no
    step of this root runs: the root's owner calls it as it opens the root."""
    remove_folder(root_layout.exchange(root))


def owners_of(layout: OwnerLayout, table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """The worker owning each row of ``table`` by its columns ``keys`` under ``layout``: the
    owner ``Layout.owner_column(keys)`` computes in Spark (shard, or full hash under
    ``modulo`` sharding)."""
    hashes = hashing.xxhash64_arrow(table, keys).view(np.uint64)  # hashed once: the shard
    shard = (hashes >> np.uint64(64 - SHARD_BITS)).astype(np.int32)  # is its top bits
    owners: np.ndarray = layout.owners(shard, hashes if layout.keyed else None)
    return owners


def write_by_owner(change: pa.Table, schema: StructType, keys: Sequence[str] | None,
                   layout: OwnerLayout, folder: str, owner: int = 0,
                   columns: Sequence[str] | None = None) -> dict[int, list[str]]:
    """Write ``change`` (payload of ``schema`` and ``_weight``) into ``folder`` as one file per
    owner of its rows by ``keys`` (with no ``keys``, one file, under ``owner``); per owner, the
    files' absolute paths (no entry for an owner with no rows). Fresh file names, so a retried
    task never overwrites a file another attempt wrote. ``columns``: the only payload columns
    the files hold (all its readers read; ``Plan.exchange_columns``), each under its
    positional name; a reader gets the others as NULL (``read_files``)."""
    if change.num_rows == 0:
        return {}
    renamed = pa.Table.from_arrays(list(change.columns), schema=file_schema(schema))
    if columns is not None:
        names = schema.fieldNames()
        renamed = renamed.select([*(names.index(c) for c in columns), len(names)])
    reached = _filesystem(folder)
    if keys is None or layout.workers == 1:
        return {owner if keys is None else 0: [write_file(renamed, folder, reached)]}
    owners = owners_of(layout, change, keys)
    return {int(w): [write_file(renamed.filter(pa.array(owners == w)), folder, reached)]
            for w in np.unique(owners)}


def write_file(table: pa.Table, folder: str,
               reached: tuple[pafs.FileSystem, str] | None = None) -> str:
    """Write ``table`` as a new Arrow IPC file in ``folder`` (uncompressed on a local disk,
    LZ4 on an object store: a step's scratch is read once, soon, so it is kept cheap to write
    and read rather than small); its absolute path. ``reached``: the folder's filesystem and
    path, as ``_filesystem`` gives them (else resolved here). A ``StorageError`` naming it on
    failure."""
    filesystem, base = reached or _filesystem(folder)
    name = f"{uuid.uuid4().hex}.arrow"
    local = isinstance(filesystem, pafs.LocalFileSystem)
    options = pa.ipc.IpcWriteOptions(compression=None if local else "lz4")
    try:
        if local:
            filesystem.create_dir(base, recursive=True)
        with filesystem.open_output_stream(f"{base}/{name}") as sink, \
                pa.ipc.new_file(sink, table.schema, options=options) as writer:
            writer.write_table(table)
    except OSError as e:
        raise StorageError(f"writing exchange file {folder}/{name} failed: {e}",
                           definitely_failed=True) from e
    return f"{folder}/{name}"


def read_files(paths: Sequence[str], schema: StructType, folder: str) -> pa.Table:
    """The rows of exchange files ``paths`` (of ``folder``), under ``schema``'s names (a
    column a file does not hold, NULL)."""
    target = zset_arrow_schema(schema)
    tables = [pa.Table.from_arrays(_completed(t, target).columns, schema=target)
              for t in _read_ipc(paths, folder)]
    return pa.concat_tables(tables) if tables else target.empty_table()


def _completed(table: pa.Table, target: pa.Schema) -> pa.Table:
    """``table`` (an exchange file's rows) with every column of ``file_schema`` (``target``:
    the same columns and types), a column it does not hold as NULLs."""
    files = file_schema_of(target)
    if table.num_columns == len(files):
        return table
    held = set(table.column_names)
    return pa.Table.from_arrays(
        [table.column(f.name) if f.name in held else pa.nulls(table.num_rows, f.type)
         for f in files], schema=files)


def file_schema_of(target: pa.Schema) -> pa.Schema:
    """``file_schema`` of the change whose Arrow schema (payload and ``_weight``) is
    ``target``."""
    n = len(target) - 1
    return pa.schema([f.with_name(positional(i)) if i < n else f for i, f in enumerate(target)])


def _read_ipc(paths: Sequence[str], folder: str) -> list[pa.Table]:
    filesystem, base = _filesystem(folder)
    tables = []
    for path in paths:
        if not path.startswith(folder + "/"):
            raise StorageError(f"exchange file {path} is not in {folder}", definitely_failed=True)
        with filesystem.open_input_file(f"{base}/{path[len(folder) + 1:]}") as f:
            tables.append(pa.ipc.open_file(f).read_all())
    return tables


def _filesystem(folder: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of ``folder`` (a local path or ``s3://``, as ``DataFiles.for_uri``
    reaches a table) and the folder's path in it."""
    data = DataFiles.for_uri(folder, pa.schema([]))
    return data.filesystem, data.fs_path(data.uri)


def _read_task(paths: Sequence[str], folder: str, target: pa.Schema,
               batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The task of ``OwnedChange.to_frame``: each row of ``batches`` is an index into
    ``paths``; yields that file's rows."""
    for batch in batches:
        for index in batch.column(0).to_pylist():
            for table in _read_ipc([paths[int(index)]], folder):
                yield from _completed(table, target).to_batches()


@dataclass(frozen=True)
class OwnedChange:
    """One operator's change for this step, held as exchange files per owner of ``keys`` (the
    columns its reader groups by) under the layout of version ``layout_version``; with no
    ``keys``, per owner of the task that wrote them (for a view or a Spark operator: the
    driver reads them, or Spark does, ``read_all`` and ``to_frame``)."""

    #: the change's payload schema
    schema: StructType
    #: the columns whose owner split the rows (None: not split)
    keys: tuple[str, ...] | None
    layout_version: int
    #: the exchange folder of the producing stage
    folder: str
    #: per owner, the absolute paths of its files
    files: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    rows: int = 0
    #: False: rows as pushed (``runtime/scatter.py``); the reading task consolidates its own
    consolidated: bool = True

    def owners(self) -> list[int]:
        """The owners that got rows, ascending."""
        return sorted(w for w, paths in self.files.items() if paths)

    def read(self, owner: int) -> pa.Table:
        """Owner ``owner``'s rows (payload under the schema's names, and ``_weight``)."""
        return read_files(self.files.get(owner, ()), self.schema, self.folder)

    def read_all(self) -> pa.Table:
        """Every row of the change, read on the driver (payload under the schema's names, and
        ``_weight``)."""
        return read_files([p for w in self.owners() for p in self.files[w]], self.schema,
                          self.folder)

    def to_frame(self, spark: SparkSession) -> DataFrame:
        """The change as a DataFrame over its files (for a reader that needs Spark's): a task
        per file reads it (Spark has no reader of Arrow IPC files). Computed when used, so used
        before the step ends (``StepContext.release`` removes the files)."""
        names = self.schema.fieldNames()
        paths = [p for w in self.owners() for p in self.files[w]]
        frame_schema = StructType(
            [StructField(positional(i), f.dataType, True) for i, f in enumerate(self.schema)]
            + [StructField(WEIGHT, LongType(), True)])
        if not paths:
            frame = spark.createDataFrame([], frame_schema)
        else:
            folder, target = self.folder, zset_arrow_schema(self.schema)
            frame = spark.range(0, len(paths), 1, len(paths)).mapInArrow(
                lambda batches: _read_task(paths, folder, target, batches), frame_schema)
        return frame.select(*[F.col(positional(i)).alias(n) for i, n in enumerate(names)],
                            F.col(WEIGHT))
