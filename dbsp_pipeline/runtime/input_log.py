"""The durable log of one circuit input.

Every ``push`` is one committed Delta version of the log table ``inputs/<name>`` (payload +
``_weight``); once ``append`` returns, the records are durable and will be part of the next step
whose division covers that version. A push may carry a producer name and sequence number, which
the same commit records (a Delta app transaction), so a producer that crashed mid-push can ask
which of its batches were recorded (``pushed``) and a repeated batch is recognised. A step's input is "the log versions ``(lower, upper]``", where
the division log (``division_log.py``) fixes ``upper`` for each step before the step's output.
"""

from __future__ import annotations

import os

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StructField, StructType

from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.storage.delta_table import DataFile, SparkDeltaTable
from dbsp_pipeline.zset import WEIGHT, consolidate


#: Delta app-transaction id of a producer's sequence numbers: ``producer/<name>``.
PRODUCER_APP_PREFIX = "producer/"


class InputLog:
    def __init__(self, spark: SparkSession, root: str, name: str, schema: StructType) -> None:
        self.name = name
        self.schema = schema
        full = StructType([*schema.fields, StructField(WEIGHT, LongType(), False)])
        self.table = SparkDeltaTable(spark, os.path.join(root, "inputs", name), full,
                                     role="input")

    @property
    def arrow_schema(self) -> pa.Schema:
        return self.table.arrow_schema

    def append_arrow(self, table: pa.Table, producer: str | None = None,
                     seq: int | None = None) -> int:
        """Durably append (payload + ``_weight``) rows; returns how many.

        With ``producer``/``seq`` the commit also records ``seq`` as the producer's newest
        sequence number (a Delta app transaction), atomically with the rows: a batch is either
        recorded with its number or not at all.
        """
        adds = self.table.write_arrow(table)
        if adds or producer is not None:
            self._commit(adds, producer, seq)
        return table.num_rows

    def append_spark(self, df: DataFrame, producer: str | None = None,
                     seq: int | None = None) -> int:
        """Durably append a Spark DataFrame of (payload + ``_weight``); returns the rows appended."""
        adds = self.table.write_files(df)
        if adds or producer is not None:
            self._commit(adds, producer, seq)
        return sum(self.table.data_file(a).rows for a in adds)

    def truncate(self, upper: int) -> int:
        """Drop the records of log versions ``.. upper`` (input every retained state version
        has consumed: no replay can need it) from the log's current version; their files go at
        the next garbage collection. Returns how many files were dropped."""
        if upper <= 0:
            return 0
        consumed = {f.path for f in self.table.files(upper)}
        drop = [f.path for f in self.table.files() if f.path in consumed]
        if drop:
            self.table.commit([], drop)
        return len(drop)

    def pushed(self, producer: str) -> int | None:
        """The newest sequence number recorded for ``producer`` (None if none)."""
        return self.table.transaction_version(PRODUCER_APP_PREFIX + producer)

    def _commit(self, adds: list, producer: str | None, seq: int | None) -> None:
        if producer is None:
            self.table.commit(adds)
        else:
            self.table.commit(adds, app_id=PRODUCER_APP_PREFIX + producer, app_version=seq)

    def version(self) -> int:
        return self.table.version()

    def files_between(self, lower: int, upper: int) -> list[DataFile]:
        """The files appended by log versions ``lower+1 .. upper``."""
        return self.table.added_files(lower, upper)

    def change(self, files: list[DataFile]) -> DataFrame | None:
        """The consolidated change held by ``files`` (from ``files_between``), for Spark."""
        if not files:
            return None
        return consolidate(self.table.read(files), self.schema.fieldNames())

    def change_arrow(self, sql: LocalSQL, files: list[DataFile]) -> pa.Table | None:
        """The consolidated change held by ``files``, read on the driver."""
        if not files:
            return None
        change = sql.consolidate(self.table.read_arrow(files), self.schema.fieldNames())
        return change if change.num_rows else None
