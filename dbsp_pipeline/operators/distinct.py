"""Distinct, incrementally: a row's output weight is 1 while its integrated weight is positive.

The trace integrates the input (keyed by the whole row). For the rows a change touches, the step
reads their old integrated weight from the trace (only the files whose shard range holds a touched
row), adds the change and emits +1 for rows that became positive and -1 for rows that stopped
being positive. Rows compare NULL-safely (NULL equals NULL, as in SQL DISTINCT).

On the driver the flips are computed in pyarrow for a small step (``_flips_arrow``: a DuckDB
query's fixed cost, 2 ms and more with its joins and groupings, was most of a distinct's step
in TPC-H's q21 and q22), or as one DuckDB query; both give the same rows, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dbsp_pipeline.driver import sql as local_sql
from dbsp_pipeline.driver.sql import (
    arrow_groups_like_duckdb,
    conform,
    consolidate_arrow,
    ident,
    idents,
    match_distinct,
    null_safe_on,
    weights_fit,
)
from dbsp_pipeline.operators.base import Delta, LocalDelta, Operator, StepContext
from dbsp_pipeline.operators.lookup import touched_shards, weights_of_keys
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace import Trace
from dbsp_pipeline.zset import WEIGHT, quote


class Distinct(Operator):
    #: a step's output is a row of the consolidated change (its columns are the owner keys)
    #: whose membership flipped, once, with weight +1 or -1
    owner_outputs_consolidated = True

    def __init__(self, db: StateDatabase, name: str, schema: StructType) -> None:
        self.schema = schema
        self.columns = schema.fieldNames()
        self.trace = Trace(db, name, schema, self.columns)

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        if d is None:
            return None
        old_files = self.trace.files()
        new_files = self.trace.append(d)
        if not new_files:
            return None
        change = self.trace.read(new_files)
        lookup_files = (self.trace.files_for_shards(touched_shards(change))
                        if old_files else [])
        lookup_files = [f for f in lookup_files if f in set(old_files)]
        old = weights_of_keys(ctx, self.trace.read(lookup_files), change, self.columns,
                              small_rows=sum(f.rows for f in new_files))
        before = F.coalesce(F.col("_old"), F.lit(0))
        after = before + F.col(WEIGHT)
        sign = (F.when((before <= 0) & (after > 0), F.lit(1))
                .when((before > 0) & (after <= 0), F.lit(-1)).otherwise(F.lit(0)))
        out = old.select(*[quote(c) for c in self.columns], sign.cast("long").alias(WEIGHT))
        return out.where(F.col(WEIGHT) != 0)

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        (d,) = changes
        if d is None:
            return None
        old_files = self.trace.files()
        new = self.trace.append_arrow(ctx.local, d)
        if new is None:
            return None
        old = self.trace.lookup_arrow(ctx.local, new, old_files)
        out = self._flips_arrow(new, old)
        if out is not None:
            return conform(out, self.schema)
        cols, w = idents(self.columns), ident(WEIGHT)
        out = ctx.local.query(f"""
            WITH o AS (SELECT {cols}, sum({w}) AS _old FROM old GROUP BY ALL),
                 b AS (SELECT {idents(self.columns, 'n.')}, coalesce(o._old, 0) AS _before,
                              coalesce(o._old, 0) + n.{w} AS _after
                       FROM n LEFT JOIN o ON {null_safe_on('n', 'o', self.columns)})
            SELECT {cols}, CASE WHEN _before <= 0 AND _after > 0 THEN 1
                                WHEN _before > 0 AND _after <= 0 THEN -1 ELSE 0 END AS {w}
            FROM b WHERE (_before > 0) <> (_after > 0)""", n=new, old=old)
        return conform(out, self.schema)

    def _flips_arrow(self, new: pa.Table, old: pa.Table) -> pa.Table | None:
        """``step_local``'s query in pyarrow: the rows of ``new`` (the consolidated change, as
        appended) whose integrated weight crosses zero, +1 where it becomes positive, -1 where
        it stops being so, given ``old`` (the trace's rows of those rows before the change).
        None where pyarrow might differ from the query: a change or a lookup of more than
        ``FAST_PATH_ROWS`` rows, rows pyarrow compares otherwise than DuckDB
        (``arrow_groups_like_duckdb``), weights whose sums could leave int64 (the query's
        sums do not wrap), rows too wide for ``match_distinct`` to number (many columns of
        many distinct values)."""
        limit = local_sql.FAST_PATH_ROWS
        if (new.num_rows > limit or old.num_rows > limit or not self.columns
                or not arrow_groups_like_duckdb(new, self.columns)
                or not arrow_groups_like_duckdb(old, self.columns)
                or not weights_fit(pa.chunked_array(
                    [*new.column(WEIGHT).chunks, *old.column(WEIGHT).chunks], pa.int64()))):
            return None
        before_rows = consolidate_arrow(old, self.columns)  # (one row per row value)
        matched = match_distinct(new, before_rows, self.columns)
        if matched is None:  # (a key too wide to number)
            return None
        before = pc.fill_null(before_rows.column(WEIGHT).take(matched), 0)
        after = pc.add(before, new.column(WEIGHT))
        now_in = pc.greater(after, 0)
        flipped = pc.not_equal(pc.greater(before, 0), now_in)
        rows = new.select(self.columns).filter(flipped)
        sign = pc.if_else(now_in.filter(flipped), 1, -1)
        return rows.append_column(WEIGHT, sign.cast(pa.int64()))

    def owner_keys(self) -> list[list[str]] | None:
        return [self.columns]

    def traces(self) -> list[Trace]:
        return [self.trace]
