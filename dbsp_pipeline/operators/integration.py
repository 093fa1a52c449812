"""DBSP's stream operators on collections: ``integrate``, ``differentiate``, ``delay``.

Every edge of a compiled circuit carries a collection's *change* per step. For a collection R:

* ``integrate(R)`` has value ``R_0 + ... + R_t`` at step t, so its change is ``R_t``, the whole
  current value of R: the trace integrates R's changes and the step emits all of it.
* ``delay(R)`` has value ``R_{t-1}``, so its change is R's change of the previous step, which a
  one-step memory (a trace replaced every step) keeps.
* ``differentiate(R)`` has value ``R_t - R_{t-1}``, so its change is ``dR_t - dR_{t-1}``.

These are the building blocks for users who build their own incremental operators; their cost is
what their semantics imply (``integrate`` emits its whole value every step).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dbsp_pipeline.driver.sql import conform, negate
from dbsp_pipeline.operators.base import Delta, LocalDelta, Operator, StepContext
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace import Trace
from dbsp_pipeline.zset import WEIGHT, consolidate, quote


class Integrate(Operator):
    def __init__(self, db: StateDatabase, name: str, schema: StructType) -> None:
        self.schema = schema
        self.trace = Trace(db, name, schema, schema.fieldNames())

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        if d is not None:
            self.trace.append(d)
        if not self.trace.files():
            return None
        return consolidate(self.trace.read(), self.schema.fieldNames())

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        (d,) = changes
        if d is not None:
            self.trace.append_arrow(ctx.local, d)
        if not self.trace.files():
            return None
        value = ctx.local.consolidate(self.trace.read_arrow(), self.schema.fieldNames())
        return conform(value, self.schema) if value.num_rows else None

    def traces(self) -> list[Trace]:
        return [self.trace]


class Delay(Operator):
    def __init__(self, db: StateDatabase, name: str, schema: StructType) -> None:
        self.schema = schema
        self.previous = Trace(db, name, schema, schema.fieldNames())

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        before = self.previous.files()
        if d is not None or before:
            self.previous.replace(d)
        if not before:
            return None
        cols = [quote(c) for c in self.schema.fieldNames()]
        return self.previous.read(before).select(*cols, WEIGHT)

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        (d,) = changes
        before = self.previous.files()
        if d is not None or before:
            current = ctx.local.consolidate(d, self.schema.fieldNames()) if d is not None else None
            self.previous.replace_arrow(current)
        if not before:
            return None
        return conform(self.previous.read_arrow(before), self.schema)

    def state_traces(self) -> list[Trace]:
        return [self.previous]


class Differentiate(Delay):
    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        delayed = super().step(ctx, changes)
        if delayed is None:
            return d
        negated = delayed.withColumn(WEIGHT, -F.col(WEIGHT))
        if d is None:
            return negated
        cols = [quote(c) for c in self.schema.fieldNames()]
        return d.select(*cols, WEIGHT).unionByName(negated)

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        (d,) = changes
        delayed = super().step_local(ctx, changes)
        if delayed is None:
            return d
        negated = negate(delayed)
        if d is None:
            return negated
        return pa.concat_tables([conform(d, self.schema), negated])
