"""Distinct, incrementally: a row's output weight is 1 while its integrated weight is positive.

The trace integrates the input (keyed by the whole row). For the rows a change touches, the step
reads their old integrated weight from the trace (only the files whose shard range holds a touched
row), adds the change and emits +1 for rows that became positive and -1 for rows that stopped
being positive. Rows compare NULL-safely (NULL equals NULL, as in SQL DISTINCT).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dbsp_pipeline.driver.sql import conform, ident, idents, null_safe_on
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

    def owner_keys(self) -> list[list[str]] | None:
        return [self.columns]

    def traces(self) -> list[Trace]:
        return [self.trace]
