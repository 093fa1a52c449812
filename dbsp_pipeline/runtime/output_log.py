"""The output log of one view: its change of every step, in the Delta table ``outputs/<name>``.

Rows are the view's payload, ``_step`` and ``_weight``. ``write(step, change)`` follows the seed's
rules (``distributed-dbsp-design.md``, "Output"), with ``last`` the next step the log expects:

* ``step < last``: the step was written before (recovery replayed it): discard.
* ``step == last``: append, in one Delta commit whose app transaction (``dbsp-output``, step)
  records the step, so a re-write after a crash is recognised; ``last`` becomes ``step + 1``.
* ``step > last``: an error (a step would be missing).

Every step is committed, even with no change, so ``last`` always follows the executed steps.
"""

from __future__ import annotations

import os

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.errors import UsageError
from dbsp_pipeline.storage.delta_table import DataFile, SparkDeltaTable
from dbsp_pipeline.zset import STEP, WEIGHT, consolidate, quote

APP_ID = "dbsp-output"


class OutputLog:
    def __init__(self, spark: SparkSession, root: str, name: str, schema: StructType) -> None:
        self.name = name
        self.schema = schema
        full = StructType([*schema.fields, StructField(STEP, LongType(), False),
                           StructField(WEIGHT, LongType(), False)])
        self.table = SparkDeltaTable(spark, os.path.join(root, "outputs", name), full,
                                     role="output")
        self.spark = spark

    def last(self) -> int:
        """The next step this log expects."""
        written = self.table.transaction_version(APP_ID)
        return 0 if written is None else written + 1

    def write(self, step: int, change: DataFrame | pa.Table | None,
              sql: LocalSQL | None = None) -> int | None:
        """Apply the write rules; returns the rows appended, or None when the step was discarded.

        ``change`` is a Spark DataFrame, or an Arrow table consolidated with ``sql`` on the driver.
        """
        if not self._may_write(step):
            return None
        adds = []
        if isinstance(change, pa.Table):
            rows = sql.consolidate(change, self.schema.fieldNames())
            if rows.num_rows:
                rows = rows.append_column(STEP, pa.array([step] * rows.num_rows, pa.int64()))
                adds = self.table.write_arrow(rows.select(self.table.arrow_schema.names))
        elif change is not None:
            cols = self.schema.fieldNames()
            rows = consolidate(change, cols).withColumn(STEP, F.lit(step).cast("long"))
            adds = self.table.write_files(rows)
        self.table.commit(adds, app_id=APP_ID, app_version=step)
        return sum(DataFile.from_stats(a.path, a.stats).rows for a in adds)

    def _may_write(self, step: int) -> bool:
        last = self.last()
        if step > last:
            raise UsageError(f"output '{self.name}': step {step} written before step {last}")
        return step == last

    def changes(self, since: int = 0, until: int | None = None) -> DataFrame:
        """Every change of steps ``since..until`` (inclusive): payload, ``_step``, ``_weight``."""
        df = self.table.read_version()
        df = df.where(F.col(STEP) >= since)
        if until is not None:
            df = df.where(F.col(STEP) <= until)
        return df

    def view(self, as_of: int | None = None) -> DataFrame:
        """The view's value after step ``as_of`` (default: the newest): payload + ``_weight``."""
        df = self.table.read_version()
        if as_of is not None:
            df = df.where(F.col(STEP) <= as_of)
        return consolidate(df, self.schema.fieldNames()).select(
            *[quote(c) for c in self.schema.fieldNames()], WEIGHT)

