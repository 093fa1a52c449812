"""Z-sets as Spark DataFrames.

A Z-set is a DataFrame of payload columns plus ``_weight`` (BIGINT): the multiplicity of the row,
negative for deletions. A *consolidated* Z-set holds each distinct payload at most once and never a
zero weight. Names starting with ``_`` are reserved for the engine.

The *shard* of a key is ``xxhash64(key columns)`` (Spark's built-in, seed 42, the same in every
Spark version and on every worker; never Python's ``hash``) reduced to its 10 most significant
bits: a number in ``0..SHARD_COUNT``. Fixed sharding uses it directly; dynamic sharding with
``S = 2**b`` shards uses its ``b`` most significant bits (``_shard >> (10 - b)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import DoubleType, FloatType, StructType

WEIGHT = "_weight"
SHARD = "_shard"
STEP = "_step"
SHARD_BITS = 10
SHARD_COUNT = 1 << SHARD_BITS
RESERVED_PREFIX = "_"

#: The largest weight a record may enter with (pushes, inbox files, Kafka records): 2**31 - 1,
#: so the product of two weights (a join) cannot overflow 64 bits. Sums that still overflow
#: (weights accumulated over many rows or joins) fail the step deterministically, and the
#: operator quarantines its input (``Pipeline.quarantine_step``).
MAX_WEIGHT = 2**31 - 1


def spark_to_arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Delta records for a Spark schema (timestamps in UTC microseconds): the
    one conversion every layer (storage, driver, runtime) uses."""
    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)


def payload_columns(df: DataFrame) -> list[str]:
    """The user-visible columns of a Z-set (everything not reserved)."""
    return [c for c in df.columns if not c.startswith(RESERVED_PREFIX)]


def shard_of(columns: Sequence[str]) -> Column:
    """The stable shard (0..SHARD_COUNT) of the key made of ``columns``."""
    if not columns:
        return F.lit(0).cast("int")
    hashed = F.xxhash64(*[F.col(quote(c)) for c in columns])
    return F.shiftrightunsigned(hashed, 64 - SHARD_BITS).cast("int")


def consolidate(df: DataFrame, columns: Sequence[str] | None = None) -> DataFrame:
    """Sum the weights of equal payloads and drop zero weights.

    ``columns`` defaults to the payload columns; reserved columns other than ``_weight`` are
    dropped unless named.
    """
    cols = list(columns) if columns is not None else payload_columns(df)
    grouped = df.groupBy(*[F.col(quote(c)) for c in cols]).agg(F.sum(WEIGHT).alias(WEIGHT))
    return grouped.where(F.col(WEIGHT) != 0)


def negate(df: DataFrame) -> DataFrame:
    """The Z-set with every weight negated."""
    return df.withColumn(WEIGHT, -F.col(WEIGHT))


def null_safe_equal(left: DataFrame, right: DataFrame, columns: Sequence[str]) -> Column:
    """Join condition: ``left.c <=> right.c`` for every column (NULL equals NULL)."""
    cond = None
    for c in columns:
        term = left[quote(c)].eqNullSafe(right[quote(c)])
        cond = term if cond is None else cond & term
    return cond if cond is not None else F.lit(True)


def canonical_floats(df: DataFrame) -> DataFrame:
    """``df`` with every floating-point value in one bit pattern per value: -0.0 as 0.0 and
    every NaN (whatever its sign and payload) as the one NaN Java, numpy and Python write
    (``0x7ff8000000000000``; ``0x7fc00000`` in a FLOAT). The values of each pair are equal, so
    grouping and distinct keep one of them, and which one must not depend on the order an engine
    met them in, nor on which engine computed them (x86 arithmetic makes a NaN with the sign
    bit set): the engine stores and computes only these (inputs and ``select`` results)."""
    floats = {f.name for f in df.schema.fields if isinstance(f.dataType, (DoubleType, FloatType))}
    if not floats:
        return df

    def canonical(c: str) -> Column:
        kind = df.schema[c].dataType
        value = F.col(quote(c))
        return (F.when(F.isnan(value), F.lit(float("nan")).cast(kind))
                .when(value == 0, F.lit(0).cast(kind)).otherwise(value).alias(c))

    return df.select(*[canonical(c) if c in floats else F.col(quote(c)) for c in df.columns])


def canonical_floats_arrow(table: pa.Table) -> pa.Table:
    """``canonical_floats`` of an Arrow table (NULLs stay NULL)."""
    for i, f in enumerate(table.schema):
        if pa.types.is_floating(f.type):
            col = table.column(i)
            col = pc.if_else(pc.equal(col, 0), pa.scalar(0, f.type), col)
            nan = pc.is_nan(col)
            if pc.any(nan).as_py():
                col = pc.if_else(nan, pa.scalar(float("nan"), f.type), col)
            table = table.set_column(i, f, col)
    return table


def quote(name: str) -> str:
    """``name`` as a Spark SQL identifier: in backticks, a backtick inside doubled. Every column
    name the engine hands to Spark as text (``F.col``, ``groupBy``, ``select`` by string) goes
    through here, so a name may hold any character (dots, spaces, backticks, newlines). The
    DuckDB counterpart is ``dbsp_pipeline.driver.sql.ident``."""
    return "`" + name.replace("`", "``") + "`"
