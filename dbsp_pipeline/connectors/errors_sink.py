"""The errors sink: records a source could not turn into rows, kept with where they came from.

One Delta table per pipeline, ``<root>/_errors``: ``input``, ``source`` (e.g. the Kafka topic),
``partition``, ``offset``, ``reason``, ``record`` (the raw value, as text, cut at 4 KiB) and
``rejected_at``. Writes are idempotent per source partition: each write records, as a Delta app
transaction ``errors/<producer>``, the offset it covers up to, and records at or below the
recorded offset are not written again (a source that re-reads after a crash).

The records of a quarantined step (``Pipeline.quarantine_step``) land here too, whole (not cut):
``source`` ``step <N>``, no partition, as offset the record's place in the step's input of that
input (0, 1, ...), the record as a JSON object of the input's columns and ``_weight``, written
once per input and step (producer ``quarantine/<input>``). Every row with an offset has an
error id, by which ``Pipeline.reinject`` re-injects a corrected record
(``runtime/dead_letters.py``).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.storage.data_files import PORTABLE_COMPRESSION
from dbsp_pipeline.storage.delta_table import SparkDeltaTable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ERRORS_DIR = root_layout.ERRORS
RECORD_LIMIT = 4096
SCHEMA = StructType([
    StructField("input", StringType(), False),
    StructField("source", StringType(), False),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("reason", StringType(), False),
    StructField("record", StringType(), True),
    StructField("rejected_at", TimestampType(), False),
])


class ErrorsSink:
    def __init__(self, spark: SparkSession, root: str) -> None:
        self.table = SparkDeltaTable(spark, root_layout.errors(root), SCHEMA, role="errors",
                                     compression=PORTABLE_COMPRESSION)
        #: one write at a time (the sources of a ``KafkaRunner``'s workers share one sink)
        self._lock = threading.Lock()

    def recorded_upto(self, producer: str) -> int | None:
        """The offset through which ``producer``'s rejected records are recorded (None: none)."""
        return self.table.transaction_version("errors/" + producer)

    def record(self, producer: str, upto: int, rejected: list[dict[str, Any]]) -> int:
        """Durably record ``rejected`` (dicts of the schema's columns but ``rejected_at``), the
        rejects of ``producer``'s records through offset ``upto``; those at or below an offset
        already recorded are skipped. Returns how many were written."""
        with self._lock:
            return self._record(producer, upto, rejected)

    def _record(self, producer: str, upto: int, rejected: list[dict[str, Any]]) -> int:
        done = self.recorded_upto(producer)
        fresh = [r for r in rejected if done is None or r["offset"] is None or r["offset"] > done]
        if not fresh or (done is not None and upto <= done):
            return 0
        now = dt.datetime.now(dt.UTC)
        rows = [{**r, "record": None if r.get("record") is None else r["record"][:RECORD_LIMIT],
                 "rejected_at": now} for r in fresh]
        table = pa.Table.from_pylist(rows, schema=self.table.arrow_schema)
        self.table.commit(self.table.write_arrow(table), app_id="errors/" + producer,
                          app_version=upto)
        return len(rows)

    def rows(self, input_name: str, source: str, reason: str, records: list[str],
             first_offset: int) -> pa.Table:
        """Rejects of ``input_name`` with one ``source`` and ``reason``, no partition, and the
        offsets ``first_offset``, ``first_offset + 1``, ... (their places in the source), as a
        table for ``record_tables``; records are kept whole."""
        n = len(records)
        now = dt.datetime.now(dt.UTC)
        return pa.Table.from_pydict({
            "input": [input_name] * n, "source": [source] * n, "partition": [None] * n,
            "offset": list(range(first_offset, first_offset + n)), "reason": [reason] * n,
            "record": records, "rejected_at": [now] * n}, schema=self.table.arrow_schema)

    def record_tables(self, producer: str, upto: int, tables: Iterable[pa.Table]) -> int:
        """Durably record every row of ``tables`` (built by ``rows``, written one by one as
        they come, so a large batch never sits in memory whole) in one commit, as ``producer``'s
        rejects through ``upto``; nothing if that is recorded already. Returns the rows."""
        with self._lock:
            return self._record_tables(producer, upto, tables)

    def _record_tables(self, producer: str, upto: int, tables: Iterable[pa.Table]) -> int:
        done = self.recorded_upto(producer)
        if done is not None and upto <= done:
            return 0
        adds = [a for t in tables if t.num_rows for a in self.table.write_arrow(t)]
        if not adds:
            return 0
        self.table.commit(adds, app_id="errors/" + producer, app_version=upto)
        return sum(self.table.data_file(a).rows for a in adds)

    def read(self) -> pa.Table:
        """Every recorded reject."""
        files = self.table.files()
        return (self.table.read_arrow(files) if files
                else self.table.arrow_schema.empty_table())
