"""Changes that owner stages hand each other as files, partitioned by the next stage's owners.

On a per-owner Spark step (``runtime/owner_exec.py``), an operator whose change only owner
stages read (``Plan.exchange_keys``) does not return its change to Spark: each of its tasks
splits its output rows by the owner of the *reader's* key (the same owner ``Layout.owner_column``
gives in Spark, so the row lands where the reader's trace keeps that key) and writes one Parquet
file per owner into the step's exchange folder, ``_exchange/<step>-<id>/`` under the root
(``root.exchange``): the root's own store, which every executor reaches as it reaches the
traces. The tasks report the files in their action records; the driver gathers them into an
``OwnedChange``, and the reader's stage runs one task per owner that got rows, each reading
its own files. No row crosses the JVM: no Arrow-to-row conversion, no Spark shuffle, no cached
frame between the two stages; the driver moves only file names.

Where a reader needs a DataFrame after all (an owner stage whose other input is a frame),
``OwnedChange.to_frame`` reads the files with Spark.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.driver import hashing
from dbsp_pipeline.driver.sql import zset_arrow_schema
from dbsp_pipeline.storage.data_files import DataFiles
from dbsp_pipeline.storage.delta_table import spark_path
from dbsp_pipeline.storage.small_files import remove_folder
from dbsp_pipeline.storage.trace import OwnerLayout
from dbsp_pipeline.zset import WEIGHT


def positional(i: int) -> str:
    """The name column ``i`` of a change crosses to a task under (Spark's Arrow UDFs look
    columns up by unquoted name, and names may hold dots or backticks)."""
    return f"_c{i}"


def file_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema of an exchange file of a change of payload ``schema``: the payload's
    columns under positional names, then ``_weight``."""
    arrow = zset_arrow_schema(schema)
    n = len(schema.fields)
    return pa.schema([f.with_name(positional(i)) if i < n else f for i, f in enumerate(arrow)])


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
    shard = hashing.shard_arrow(table, keys).to_numpy(zero_copy_only=False)
    hashes = hashing.xxhash64_arrow(table, keys).astype(np.uint64) if layout.keyed else None
    owners: np.ndarray = layout.owners(shard, hashes)
    return owners


def write_by_owner(change: pa.Table, schema: StructType, keys: Sequence[str],
                   layout: OwnerLayout, folder: str) -> dict[int, list[str]]:
    """Write ``change`` (payload of ``schema`` and ``_weight``) into ``folder`` as one file per
    owner of its rows by ``keys``; per owner, the files' absolute paths (no entry for an owner
    with no rows). Fresh file names, so a retried task never overwrites a file another attempt
    wrote."""
    if change.num_rows == 0:
        return {}
    target = file_schema(schema)
    data = DataFiles.for_uri(folder, target)
    renamed = pa.Table.from_arrays(list(change.columns), schema=target)
    owners = owners_of(layout, change, keys) if layout.workers > 1 else np.zeros(
        change.num_rows, dtype=np.int64)
    out: dict[int, list[str]] = {}
    for w in np.unique(owners):
        part = renamed.filter(pa.array(owners == w)) if len(np.unique(owners)) > 1 else renamed
        out[int(w)] = [data.path(a.path) for a in data.write_arrow(part)]
    return out


def read_files(paths: Sequence[str], schema: StructType, folder: str) -> pa.Table:
    """The rows of exchange files ``paths`` (of ``folder``), under ``schema``'s names."""
    table = DataFiles.for_uri(folder, file_schema(schema)).read_arrow(list(paths))
    return pa.Table.from_arrays(list(table.columns), schema=zset_arrow_schema(schema))


@dataclass(frozen=True)
class OwnedChange:
    """One operator's change for this step, held as exchange files per owner of ``keys`` (the
    columns its reader groups by) under the layout of version ``layout_version``."""

    #: the change's payload schema
    schema: StructType
    #: the columns whose owner split the rows
    keys: tuple[str, ...]
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

    def to_frame(self, spark: SparkSession) -> DataFrame:
        """The change as a DataFrame over its files (for a reader that needs Spark's)."""
        names = self.schema.fieldNames()
        paths = [spark_path(p) for w in self.owners() for p in self.files[w]]
        frame_schema = StructType(
            [StructField(positional(i), f.dataType, True) for i, f in enumerate(self.schema)]
            + [StructField(WEIGHT, LongType(), True)])
        frame = spark.read.schema(frame_schema).parquet(*paths)
        return frame.select(*[F.col(positional(i)).alias(n) for i, n in enumerate(names)],
                            F.col(WEIGHT))
