"""A constant collection (``Circuit.constant``): the same rows at every step.

As a change stream a constant is its rows at step 0 and nothing after, so it keeps no state: a
replay of step 0 (recovery, ``restore``, a recomputation from scratch, which is one step 0)
emits the rows again, and no other step emits anything. Both paths build the rows from the
circuit's JSON values with the analysed schema, so they are the same values bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.types import StructType

from dbsp_pipeline.driver.sql import zset_arrow_schema
from dbsp_pipeline.operators.base import Delta, LocalDelta, Operator, StepContext

#: the step at which a constant emits its rows
FIRST_STEP = 0


def constant_table(schema: StructType, rows: Sequence[Sequence[Any]]) -> pa.Table:
    """``rows`` (JSON values in ``schema``'s column order) as a Z-set of weight 1 per row;
    ``ValueError``/``TypeError``/``ArrowInvalid`` (from Arrow) when a value does not fit its
    column or a row has the wrong number of values."""
    names = schema.fieldNames()
    for row in rows:
        if len(row) != len(names):
            raise ValueError(f"row {list(row)!r} has {len(row)} values for {len(names)} "
                             f"columns ({', '.join(names)})")
    columns = [[row[i] for row in rows] for i in range(len(names))] + [[1] * len(rows)]
    target = zset_arrow_schema(schema)
    return pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, target)],
                                schema=target)


class Constant(Operator):
    def __init__(self, schema: StructType, rows: Sequence[Sequence[Any]]) -> None:
        self.schema = schema
        self.table = constant_table(schema, rows)

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        if ctx.step != FIRST_STEP or self.table.num_rows == 0:
            return None
        return ctx.session.createDataFrame(self.table)

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        if ctx.step != FIRST_STEP or self.table.num_rows == 0:
            return None
        return self.table
