"""Linear operators: each output change is computed from the input change alone.

``select`` and ``filter`` apply Spark SQL to the change's rows (the weight rides along);
``union`` adds Z-sets; ``negate`` flips weights; ``conform`` reshapes a collection to another's
columns (missing ones become typed NULLs), used by the composite joins.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dbsp_pipeline.operators.base import Delta, Operator, StepContext
from dbsp_pipeline.zset import WEIGHT, quote


class Select(Operator):
    def __init__(self, exprs: Sequence[str], schema: StructType) -> None:
        self.exprs = list(exprs)
        self.schema = schema

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        if d is None:
            return None
        return d.select(*[F.expr(e) for e in self.exprs], F.col(WEIGHT))


class Filter(Operator):
    def __init__(self, predicate: str, schema: StructType) -> None:
        self.predicate = predicate
        self.schema = schema

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        if d is None:
            return None
        # NULL is not true: coalesce so a NULL predicate drops the row, as SQL WHERE does.
        return d.where(F.coalesce(F.expr(self.predicate), F.lit(False)))


class Union(Operator):
    def __init__(self, schema: StructType) -> None:
        self.schema = schema

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        present = [d for d in changes if d is not None]
        if not present:
            return None
        cols = [quote(f.name) for f in self.schema.fields] + [WEIGHT]
        return reduce(lambda a, b: a.unionByName(b), [d.select(*cols) for d in present])


class Negate(Operator):
    def __init__(self, schema: StructType) -> None:
        self.schema = schema

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        return None if d is None else d.withColumn(WEIGHT, -F.col(WEIGHT))


class Conform(Operator):
    """Select the columns of ``schema`` in its order; columns the input lacks become NULL."""

    def __init__(self, input_schema: StructType, schema: StructType) -> None:
        self.present = set(input_schema.fieldNames())
        self.schema = schema

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        if d is None:
            return None
        cols = [F.col(quote(f.name)) if f.name in self.present
                else F.lit(None).cast(f.dataType).alias(f.name) for f in self.schema.fields]
        return d.select(*cols, F.col(WEIGHT))
