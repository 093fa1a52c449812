"""Linear operators: each output change is computed from the input change alone.

``select`` and ``filter`` apply Spark SQL to the change's rows (the weight rides along);
``union`` adds Z-sets; ``negate`` flips weights; ``repeat`` multiplies each row's weight by a
count column of its own (dropped); ``conform`` reshapes a collection to another's columns (missing
ones become typed NULLs), used by the composite joins.

On the driver, ``select`` and ``filter`` run the user's Spark SQL in pyarrow when
``driver.arrow_expressions`` can evaluate it exactly (a projection of columns, literals and
double arithmetic, a simple predicate: no DuckDB query's fixed cost), else in DuckDB when
``driver.expressions`` can translate it exactly; otherwise (or when DuckDB raises where Spark
might not, e.g. an overflow in a branch Spark short-circuits) that one operator runs its Spark
expression over the (small) change as a Spark job, so the result is always Spark's.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

import duckdb
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from dbsp_pipeline.driver.arrow_expressions import (
    ArrowPredicate,
    arrow_predicate,
    arrow_projection,
)
from dbsp_pipeline.driver.expressions import translate_predicate, translate_projection
from dbsp_pipeline.driver.sql import conform, ident, negate, zset_arrow_schema
from dbsp_pipeline.operators.base import Delta, LocalDelta, Operator, StepContext
from dbsp_pipeline.zset import WEIGHT, canonical_floats, canonical_floats_arrow, quote


class UserSQL(Operator):
    """An operator that applies the user's Spark SQL to the change's rows (the weight rides
    along): subclasses set ``local_sql``, the same as one DuckDB query over the change ``d``
    (None when only Spark evaluates it exactly), may override ``_arrow`` (the same in pyarrow,
    or None), and implement ``_spark``."""

    input_schema: StructType
    local_sql: str | None
    #: whether the output rows are some of the input rows as they are (a filter)
    keeps_rows = False

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        return None if d is None else self._spark(d)

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        (d,) = changes
        if d is None:
            return None
        try:
            arrow = self._arrow(d)
        except pa.ArrowException:  # unforeseen (the evaluation never raises where Spark would
            arrow = None           # not): the DuckDB query, or Spark, decides
        if arrow is not None:
            out = canonical_floats_arrow(conform(arrow, self.schema))
            if self.keeps_rows and ctx.sql is not None:
                # a subset of a consolidated change is consolidated (+0.0 for -0.0 merges no
                # two rows: consolidation took them as equal); the next trace append need not
                ctx.sql.consolidated_subset(out, d)
            return out
        if self.local_sql is not None:
            try:
                return canonical_floats_arrow(conform(ctx.local.query(self.local_sql, d=d),
                                                    self.schema))
            except duckdb.Error:
                pass  # e.g. an overflow in a branch Spark would not evaluate: Spark decides
        # One Spark job over the small change.
        ctx.spark_jobs.append(ctx.running)
        frame = ctx.session.createDataFrame(d.cast(zset_arrow_schema(self.input_schema)))
        return conform(self._spark(frame).toArrow(), self.schema)

    def _arrow(self, d: pa.Table) -> pa.Table | None:
        return None

    def _spark(self, d: DataFrame) -> DataFrame:
        raise NotImplementedError

    def untranslated(self) -> list[str]:
        """The user's expressions the driver evaluates only as a Spark job (outside
        ``driver.expressions``' translation): empty where every driver step runs them in
        DuckDB or pyarrow."""
        return []


class Select(UserSQL):
    def __init__(self, exprs: Sequence[str], input_schema: StructType, schema: StructType) -> None:
        self.exprs = list(exprs)
        self.input_schema = input_schema
        self.schema = schema
        projection = translate_projection(self.exprs, input_schema, schema.fieldNames())
        self.local_sql = (None if projection is None
                          else f"SELECT {projection}, {ident(WEIGHT)} FROM d")
        #: each output column as pyarrow computes it, when pyarrow computes them all as Spark
        self.arrow_columns = arrow_projection(self.exprs, input_schema, schema.fieldNames())

    def _arrow(self, d: pa.Table) -> pa.Table | None:
        if self.arrow_columns is None:
            return None
        values = [column(d) for column in self.arrow_columns]
        return pa.Table.from_arrays(
            [*(pa.repeat(v, d.num_rows) if isinstance(v, pa.Scalar) else v for v in values),
             d.column(WEIGHT)], names=[*self.schema.fieldNames(), WEIGHT])

    def _spark(self, d: DataFrame) -> DataFrame:
        return canonical_floats(d.select(*[F.expr(e) for e in self.exprs], F.col(WEIGHT)))

    def untranslated(self) -> list[str]:
        if self.local_sql is not None or self.arrow_columns is not None:
            return []
        names = self.schema.fieldNames()
        return [e for e, name in zip(self.exprs, names)
                if translate_projection([e], self.input_schema, [name]) is None] or self.exprs


class Filter(UserSQL):
    keeps_rows = True

    def __init__(self, predicate: str, schema: StructType) -> None:
        self.predicate = predicate
        self.input_schema = self.schema = schema
        condition = translate_predicate(predicate, schema)
        self.local_sql = (None if condition is None
                          else f"SELECT * FROM d WHERE coalesce(({condition}), FALSE)")
        self.arrow_condition: ArrowPredicate | None = arrow_predicate(predicate, schema)

    def _arrow(self, d: pa.Table) -> pa.Table | None:
        # a NULL condition drops the row, as WHERE does
        return None if self.arrow_condition is None else d.filter(self.arrow_condition(d))

    def _spark(self, d: DataFrame) -> DataFrame:
        # NULL is not true: coalesce so a NULL predicate drops the row, as SQL WHERE does.
        return d.where(F.coalesce(F.expr(self.predicate), F.lit(False)))

    def untranslated(self) -> list[str]:
        return [self.predicate] if self.local_sql is None and self.arrow_condition is None \
            else []


class Union(Operator):
    """The Z-set sum. Inputs with a column of different types are cast to the type the
    circuit's analysis widened it to (``schema``), as Spark's UNION does."""

    def __init__(self, schema: StructType) -> None:
        self.schema = schema

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        present = [d for d in changes if d is not None]
        if not present:
            return None

        def columns(d: DataFrame) -> list[Column]:  # cast where the union widens a type
            return [F.col(quote(f.name)) if d.schema[f.name].dataType == f.dataType
                    else F.col(quote(f.name)).cast(f.dataType).alias(f.name)
                    for f in self.schema.fields] + [F.col(WEIGHT)]

        return reduce(lambda a, b: a.unionByName(b), [d.select(*columns(d)) for d in present])

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        present = [conform(d, self.schema) for d in changes if d is not None]
        return pa.concat_tables(present) if present else None


class Negate(Operator):
    def __init__(self, schema: StructType) -> None:
        self.schema = schema

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        return None if d is None else d.withColumn(WEIGHT, -F.col(WEIGHT))

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        (d,) = changes
        if d is None:
            return None
        return negate(d)


class Repeat(Operator):
    """Each row ``count`` times: its weight multiplied by its integer column ``count``, which
    the output drops. A row whose count is NULL or not positive is dropped (zero times)."""

    def __init__(self, count: str, schema: StructType) -> None:
        self.count = count
        self.schema = schema

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        if d is None:
            return None
        n = F.col(quote(self.count)).cast("long")
        return d.where(n > 0).select(*[quote(f.name) for f in self.schema.fields],
                                     (F.col(WEIGHT) * n).alias(WEIGHT))

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        (d,) = changes
        if d is None:
            return None
        n = ident(self.count)
        cols = ", ".join(ident(f.name) for f in self.schema.fields)
        return conform(ctx.local.query(
            f"SELECT {cols}, {ident(WEIGHT)} * CAST({n} AS BIGINT) AS {ident(WEIGHT)} FROM d "
            f"WHERE {n} > 0", d=d), self.schema)


class Conform(Operator):
    """Select the columns of ``schema`` in its order and types; columns the input lacks become
    NULL. A column of another type is cast (a semijoin's widened join key, back to its side's
    type: every value came from that side, so the cast is exact)."""

    def __init__(self, input_schema: StructType, schema: StructType) -> None:
        self.present = {f.name: f.dataType for f in input_schema.fields}
        self.schema = schema

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        if d is None:
            return None
        cols = [(F.col(quote(f.name)) if self.present[f.name] == f.dataType
                 else F.col(quote(f.name)).cast(f.dataType).alias(f.name))
                if f.name in self.present
                else F.lit(None).cast(f.dataType).alias(f.name) for f in self.schema.fields]
        return d.select(*cols, F.col(WEIGHT))

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        (d,) = changes
        if d is None:
            return None
        target = zset_arrow_schema(self.schema)
        columns = [d.column(f.name).cast(f.type) if f.name in d.column_names
                   else pa.nulls(d.num_rows, f.type) for f in target]
        return pa.Table.from_arrays(columns, schema=target)
