"""Traces: the integrated state of a stateful operator, kept as a Z-set in a Delta table.

A trace table holds the operator's payload columns, ``_weight`` and ``_shard`` (the stable shard of
the operator's key, see ``dbsp_pipeline.zset``). The trace's value is the sum of all its rows;
it is not necessarily consolidated (each step appends its consolidated change as new files, like
a batch in a spine), and ``compact`` merges files in the background of the step path.

Files are sorted by ``(_shard, key)`` and carry min/max statistics, so a reader that only needs
some keys can skip files (``files_for_shards``), and a layout change (which moves whole shards
between workers) rewrites only the files whose shard range crosses an owner boundary.

Durability: ``append`` commits a Delta version of the trace table at once; it becomes part of the
pipeline's state only when the state database commits a manifest entry naming that version
(``state_db.py``). Until then a crash rolls the trace back.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from dbsp_pipeline.storage.delta_table import DataFile
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.zset import SHARD, WEIGHT, consolidate, shard_of

#: Compact a trace once it has more files than this (size-tiered merge of the smallest).
COMPACT_FILE_THRESHOLD = 16


class Trace:
    """The trace ``name`` of one operator: payload ``schema`` keyed (sharded) by ``key``."""

    def __init__(self, db: StateDatabase, name: str, schema: StructType, key: Sequence[str]) -> None:
        self.name = name
        self.key = list(key)
        self.payload = [f.name for f in schema.fields]
        full = StructType([*schema.fields, StructField(WEIGHT, LongType(), False),
                           StructField(SHARD, IntegerType(), False)])
        self.table = db.table(name, full)
        self.spark: SparkSession = db.spark
        self._files: list[DataFile] | None = None

    def files(self) -> list[DataFile]:
        """The trace's files as of now (the open version plus this run's appends)."""
        if self._files is None:
            self._files = self.table.files()
        return list(self._files)

    def rows(self) -> int:
        return sum(f.rows for f in self.files())

    def read(self, files: Sequence[DataFile] | None = None) -> DataFrame:
        """The trace (payload, ``_weight``, ``_shard``) over ``files`` (default: all of them)."""
        return self.table.read(self.files() if files is None else files)

    def files_for_shards(self, shards: Sequence[int]) -> list[DataFile]:
        """The files that may hold rows of the given shards (by their min/max ``_shard`` stats)."""
        wanted = sorted(set(shards))
        if not wanted:
            return []
        import bisect

        out = []
        for f in self.files():
            if f.shard_min is None or f.shard_max is None:
                out.append(f)
                continue
            i = bisect.bisect_left(wanted, f.shard_min)
            if i < len(wanted) and wanted[i] <= f.shard_max:
                out.append(f)
        return out

    def replace(self, delta: DataFrame | None) -> list[DataFile]:
        """Make the trace's value exactly ``delta`` (used for one-step memories); returns the new files."""
        old = self.files()
        adds = [] if delta is None else self.table.write_files(
            consolidate(delta, self.payload).withColumn(SHARD, shard_of(self.key)),
            sort_by=[SHARD, *self.key])
        if adds or old:
            self.table.commit(adds, [f.path for f in old])
        new = [DataFile.from_stats(f"{self.table.uri}/{a.path}", a.stats) for a in adds]
        self._files = new
        return new

    def append(self, delta: DataFrame) -> list[DataFile]:
        """Append a change (payload + ``_weight``) and commit it; returns the new files.

        The change is consolidated first; the returned files hold exactly the appended rows
        (and can be read back as the materialized change).
        """
        before = self.files()
        change = consolidate(delta, self.payload).withColumn(SHARD, shard_of(self.key))
        adds = self.table.write_files(change, sort_by=[SHARD, *self.key])
        if not adds:
            return []
        self.table.commit(adds)
        new = [DataFile.from_stats(f"{self.table.uri}/{a.path}", a.stats) for a in adds]
        self._files = before + new
        return new

    def compact(self, threshold: int = COMPACT_FILE_THRESHOLD) -> bool:
        """Merge the trace's files into consolidated, shard-sorted files once there are more than
        ``threshold``. Returns whether it compacted. The content (the Z-set) is unchanged."""
        files = self.files()
        if len(files) <= threshold:
            return False
        merged = consolidate(self.read(files), [*self.payload, SHARD])
        rows = sum(f.rows for f in files)
        parts = max(1, min(64, rows // 2_000_000 + 1))
        merged = merged.repartitionByRange(parts, F.col(SHARD)) if parts > 1 else merged.coalesce(1)
        adds = self.table.write_files(merged, sort_by=[SHARD, *self.key])
        self.table.commit(adds, [f.path for f in files], data_change=False)
        self._files = None
        return True

    def reset_cache(self) -> None:
        """Forget the cached file list (after the state database rolled the table back)."""
        self._files = None

