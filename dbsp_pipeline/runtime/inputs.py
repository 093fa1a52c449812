"""Pushes: checking a batch and appending it to an input's log, idempotently per producer.

A batch is checked whole first (``records.py``: bad input is ``InputError`` naming the input,
the record and the problem) and appended in one commit of the input log (``input_log.py``), or
not at all: when a push returns, the batch is durable and belongs to the next step. A batch
pushed with ``producer`` and ``seq`` is recorded with that number in the same commit; a number
not above the producer's newest recorded one is a batch already recorded, and nothing is
appended. The caller holds the pipeline's lock.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from dbsp_pipeline.errors import UsageError
from dbsp_pipeline.runtime import records
from dbsp_pipeline.runtime.input_log import InputLog


def push_rows(log: InputLog, rows: Any, weight: int, producer: str | None,
              seq: int | None) -> int:
    """Append ``rows`` (a list of dicts or tuples, a pandas or Spark DataFrame, an Arrow table)
    with ``weight`` to ``log``; returns how many rows were appended (0: already recorded)."""
    weight = records.check_weight(log.name, weight)
    if already_pushed(log, producer, seq):
        return 0
    if isinstance(rows, DataFrame):
        df = records.check_spark(log.name, rows, log.schema, weight)
        return log.append_spark(df, producer, seq)
    table = records.to_arrow(log.name, rows, log.schema, log.arrow_schema, weight)
    if table.num_rows or producer is not None:
        return log.append_arrow(table, producer, seq)
    return 0


def push_zset(log: InputLog, table: pa.Table, producer: str | None, seq: int | None,
              rejected: int) -> int:
    """Append a Z-set (the input's columns plus a nonzero integer ``_weight``) to ``log``,
    recording ``rejected`` (invalid records of the source batch left out) with the push;
    returns how many rows were appended (0: already recorded)."""
    zset = checked_zset(log, table, producer, seq)
    return 0 if zset is None else log.append_arrow(zset, producer, seq, rejected)


def checked_zset(log: InputLog, table: pa.Table, producer: str | None,
                 seq: int | None) -> pa.Table | None:
    """The checks of ``push_zset``, also of a push a step carries (``Pipeline.step(changes)``,
    ``Pipeline.write_push``): the Z-set to write, or None when there is nothing to commit (the
    producer's batch was recorded already, or no rows and no producer)."""
    if already_pushed(log, producer, seq):
        return None
    zset = records.zset_to_arrow(log.name, table, log.schema, log.arrow_schema)
    return None if zset.num_rows == 0 and producer is None else zset


def already_pushed(log: InputLog, producer: str | None, seq: int | None) -> bool:
    """Check a push's producer and sequence number (``UsageError`` naming the input); whether
    that batch was recorded already."""
    name = log.name
    if (producer is None) != (seq is None):
        raise UsageError(f"input '{name}': give both producer and seq, or neither")
    if producer is None:
        return False
    if not isinstance(producer, str) or not producer:
        raise UsageError(f"input '{name}': producer must be a non-empty string, "
                         f"got {producer!r}")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise UsageError(f"input '{name}': seq must be an integer >= 0, got {seq!r}")
    last = log.pushed(producer)
    return last is not None and seq <= last
