"""Top-k per partition, incrementally: ``ORDER BY ... LIMIT k`` (one partition) and
``ROW_NUMBER() OVER (PARTITION BY p ORDER BY ...) <= k``, optionally with each row's place
(its ``ROW_NUMBER``) as a column.

The trace integrates the input, keyed (and sharded) by the partition columns. For the partitions
a change touches, a step reads their rows from the trace (only the files whose shard range
holds a touched partition), ranks them before and after the change and emits the new top k minus
the old one. A row of multiplicity m takes m places; a row straddling place k keeps the places
left. Rows that tie on the order keys are ranked by all their columns (ascending, NULLs first),
so the result is a function of the input whatever the path, the file layout or the replay.
With a rank column, a row of multiplicity m is m rows of multiplicity 1, numbered 1, 2, ... in
that order; a change in a partition renumbers the rows after it, up to place k.

``numbering="rank"`` and ``"dense_rank"`` number as SQL's ``RANK()`` and ``DENSE_RANK()``:
rows that tie on the order keys share a place (the places of the rows before them, plus one;
for ``dense_rank`` the number of distinct order keys before them, plus one), and the top k keeps
every row whose place is at most k, with all its copies: ties at place k are all kept.

Work per step follows the change and k, not the input. When the first order key's type sorts in
Arrow as in Spark (``driver.sql.arrow_orders_like_duckdb``; ROW_NUMBER and RANK numberings, k
up to ``LEADING_MAX_K``), the
trace's keyed runs are sorted by that key within a partition, its NULLs placed as the ranking
places them, and a step reads from each big file only about k leading rows of each touched
partition (``Trace.lookup_leading_rows``), deeper only where the rows read do not settle both
the old and the new top k (``_unsettled``): a top-k over the whole input (one partition, as
``ORDER BY ... LIMIT k``) costs about k rows a file, not the input. Otherwise a step reads
every row of the touched partitions.

A driver step ranks with one DuckDB query (``_change_in_duckdb``), or, for a top-k over one
partition numbered by ROW_NUMBER whose columns Arrow sorts as DuckDB and Spark order them
(``ranks_in_arrow``), with Arrow's top-k selection (``_change_in_arrow``: the same rows, with
no query's fixed cost); a Spark step with Spark's window functions (``step``), or per owner
with the driver's code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

from dbsp_pipeline.driver.sql import (
    arrow_orders_like_duckdb,
    conform,
    ident,
    idents,
    negate,
    null_safe_on,
)
from dbsp_pipeline.operators.base import Delta, LocalDelta, Operator, StepContext
from dbsp_pipeline.operators.lookup import touched_shards
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace import EXTREME_ROWS, Trace
from dbsp_pipeline.zset import WEIGHT, quote

#: a change to a top-k over one partition with more rows than this is cut to the rows that can
#: alter it before it is ranked (``TopK._candidates``: 0.78 -> 0.10 s for 1M changed rows; at
#: 10k the query it adds costs about what it saves)
CANDIDATES_FROM = 32_768


@dataclass(frozen=True)
class OrderKey:
    """One ORDER BY key: a column, its direction and where its NULLs go."""

    column: str
    descending: bool = False
    nulls_first: bool | None = None  # None: Spark's default (first ascending, last descending)

    @property
    def nulls_go_first(self) -> bool:
        return (not self.descending) if self.nulls_first is None else self.nulls_first

    def describe(self) -> dict[str, Any]:
        return {"column": self.column, "descending": self.descending,
                "nulls_first": self.nulls_first}

    @classmethod
    def of(cls, d: dict[str, Any]) -> OrderKey:
        return cls(d["column"], bool(d["descending"]), d["nulls_first"])


#: A top-k of at most this many places reads the leading rows of its partitions
#: (``Trace.lookup_leading_rows``); one of more (SQL's numbering of every row of a partition,
#: ``sql/catalog.py``'s ``EVERY_PLACE``) reads them whole, as does a DENSE_RANK
LEADING_MAX_K = 65_536

#: how rows are numbered: SQL's ROW_NUMBER(), RANK() and DENSE_RANK()
NUMBERINGS = ("row_number", "rank", "dense_rank")


def ranked_schema(schema: StructType, rank: str | None) -> StructType:
    """The schema of a top-k of rows of ``schema``: with a ``rank`` column last (an INT, as
    Spark's ``ROW_NUMBER``) if one is asked for."""
    if rank is None:
        return schema
    return StructType([*schema.fields, StructField(rank, IntegerType(), False)])


class TopK(Operator):
    """``schema`` is the input's; the output adds the ``rank`` column if one is named;
    ``numbering`` is one of ``NUMBERINGS``."""

    #: a step's output is consolidated and holds the partition columns (``owner_keys``)
    owner_outputs_consolidated = True

    def __init__(self, db: StateDatabase, name: str, partition: Sequence[str],
                 order: Sequence[OrderKey], k: int, schema: StructType,
                 rank: str | None = None, numbering: str = "row_number") -> None:
        assert numbering in NUMBERINGS, numbering
        self.numbering = numbering
        self.schema = ranked_schema(schema, rank)
        self.columns = schema.fieldNames()
        self.out_columns = self.schema.fieldNames()
        self.partition = list(partition)
        self.order = list(order)
        self.k = k
        self.rank = rank
        first = self.order[0]
        #: whether the trace's runs are sorted by the first order key (``lookup_leading_rows``),
        #: its NULLs where the ranking puts them: first in an ascending run when the ranking
        #: puts them first ascending, or last descending (a descending ranking reads the run
        #: from its end)
        self.ordered = (numbering != "dense_rank" and k <= LEADING_MAX_K
                        and first.column in self.columns
                        and arrow_orders_like_duckdb(schema[first.column].dataType))
        self.trace = Trace(db, name, schema, self.partition,
                           order_by=first.column if self.ordered else None,
                           nulls_first=first.nulls_go_first != first.descending)
        #: whether a driver step ranks in Arrow (``_change_in_arrow``): a top-k over one
        #: partition numbered by ROW_NUMBER, whose columns (the order keys and the ties'
        #: order, every column) Arrow sorts as DuckDB and Spark order them
        self.ranks_in_arrow = (not self.partition and numbering == "row_number"
                               and all(arrow_orders_like_duckdb(f.dataType)
                                       for f in schema.fields))

    # -- the ranking, in DuckDB and in Spark -----------------------------------------------
    def _order_sql(self, ties: bool = True) -> str:
        """The ORDER BY of the ranking; with ``ties``, then by all the columns (a total
        order)."""
        keys = [f"{ident(o.column)} {'DESC' if o.descending else 'ASC'} NULLS "
                f"{'FIRST' if o.nulls_go_first else 'LAST'}" for o in self.order]
        if ties:
            keys += [f"{ident(c)} ASC NULLS FIRST" for c in self.columns]
        return ", ".join(keys)

    def _order_spark(self, ties: bool = True) -> list[Column]:
        keys = []
        for o in self.order:
            c = F.col(quote(o.column))
            if o.descending:
                keys.append(c.desc_nulls_first() if o.nulls_go_first else c.desc_nulls_last())
            else:
                keys.append(c.asc_nulls_first() if o.nulls_go_first else c.asc_nulls_last())
        if ties:
            keys += [F.col(quote(c)).asc_nulls_first() for c in self.columns]
        return keys

    def _top_sql(self, rows: str) -> str:
        """The top k of each partition of ``rows`` (a consolidated relation), as SQL."""
        w = ident(WEIGHT)
        part = f"PARTITION BY {idents(self.partition)}" if self.partition else ""
        if self.numbering != "row_number":
            return self._tied_top_sql(rows, part)
        places = f"least({w}, {self.k} - _before)"
        if self.rank is None:
            out = f"{places} AS {w}"
        else:  # one row per place, numbered
            out = (f"CAST(CAST(_before AS BIGINT) + unnest(range(1, CAST({places} AS BIGINT) + 1))"
                   f" AS INTEGER) AS {ident(self.rank)}, CAST(1 AS BIGINT) AS {w}")
        return f"""SELECT {idents(self.columns)}, {out} FROM (
                       SELECT *, coalesce(sum({w}) OVER ({part} ORDER BY {self._order_sql()}
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS _before
                       FROM {rows}) WHERE _before < {self.k}"""

    def _tied_top_sql(self, rows: str, part: str) -> str:
        """RANK / DENSE_RANK: each row's place (shared by the rows that tie with it on the
        order keys), the rows placed at most k with their whole weight. A rank is the least
        count of places before any row of its tie group (the rows ordered totally)."""
        w = ident(WEIGHT)
        if self.numbering == "dense_rank":
            place = f"dense_rank() OVER ({part} ORDER BY {self._order_sql(ties=False)})"
        else:
            peers = idents(self.partition + [o.column for o in self.order])
            place = f"""1 + min(_before) OVER (PARTITION BY {peers})"""
        out = (f"CAST(_place AS INTEGER) AS {ident(self.rank)}, " if self.rank is not None
               else "")
        return f"""SELECT {idents(self.columns)}, {out}{w} FROM (
                       SELECT *, {place} AS _place FROM (
                           SELECT *, coalesce(sum({w}) OVER ({part} ORDER BY {self._order_sql()}
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS _before
                           FROM {rows}))
                   WHERE _place <= {self.k}"""

    def _tied_top_spark(self, rows: DataFrame) -> DataFrame:
        part = [quote(p) for p in self.partition]
        if self.numbering == "dense_rank":
            placed = rows.withColumn("_place", F.dense_rank().over(
                Window.partitionBy(*part).orderBy(*self._order_spark(ties=False))))
        else:
            before = (Window.partitionBy(*part).orderBy(*self._order_spark())
                      .rowsBetween(Window.unboundedPreceding, -1))
            peers = Window.partitionBy(*part, *[quote(o.column) for o in self.order])
            placed = rows.withColumn(
                "_before", F.coalesce(F.sum(WEIGHT).over(before), F.lit(0))).withColumn(
                "_place", F.min("_before").over(peers) + 1)
        top = placed.where(F.col("_place") <= self.k)
        cols = [quote(c) for c in self.columns]
        rank = [F.col("_place").cast("int").alias(self.rank)] if self.rank is not None else []
        return top.select(*cols, *rank, F.col(WEIGHT).cast("long").alias(WEIGHT))

    def _top_spark(self, rows: DataFrame) -> DataFrame:
        if self.numbering != "row_number":
            return self._tied_top_spark(rows)
        window = (Window.partitionBy(*[quote(p) for p in self.partition])
                  .orderBy(*self._order_spark())
                  .rowsBetween(Window.unboundedPreceding, -1))
        ranked = rows.withColumn("_before", F.coalesce(F.sum(WEIGHT).over(window), F.lit(0)))
        top = ranked.where(F.col("_before") < self.k)
        places = F.least(F.col(WEIGHT), F.lit(self.k) - F.col("_before")).cast("long")
        cols = [quote(c) for c in self.columns]
        if self.rank is None:
            return top.select(*cols, places.alias(WEIGHT))
        before = F.col("_before").cast("int")
        return top.select(*cols, F.explode(F.sequence(before + 1, before + places.cast("int")))
                          .alias(self.rank), F.lit(1).cast("long").alias(WEIGHT))

    # -- steps -----------------------------------------------------------------------------
    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        (d,) = changes
        if d is None:
            return None
        old_files = self.trace.files()
        new = self.trace.append_arrow(ctx.local, d)
        if new is None:
            return None
        if self.ordered:  # the touched partitions' leading rows
            old = self.trace.lookup_leading_rows(
                ctx.local, new, self.order[0].descending,
                lambda rows, cut_keys: self._unsettled(ctx, new, rows, cut_keys),
                count=self._rows_a_file(new), files=old_files)
        else:
            old = (self.trace.lookup_arrow(ctx.local, new, old_files) if self.partition
                   else self.trace.read_arrow(old_files))  # one partition: every row
        if (not self.partition and self.numbering == "row_number"
                and new.num_rows > CANDIDATES_FROM):
            new = self._candidates(ctx, new, old)
        if self.ranks_in_arrow:
            return self._change_in_arrow(ctx, old, new)
        return self._change_in_duckdb(ctx, old, new)

    def _change_in_duckdb(self, ctx: StepContext, old: pa.Table, new: pa.Table) -> pa.Table:
        """The step's output, the new top k of ``old`` (the trace's rows that decide the old
        and the new top k) plus ``new`` (the change, or its candidates) minus the old top k
        of ``old``, consolidated: one DuckDB query."""
        cols, w = idents(self.columns), ident(WEIGHT)
        out_cols = idents(self.out_columns)
        out = ctx.local.query(f"""
            WITH o AS (SELECT {cols}, sum({w}) AS {w} FROM old GROUP BY ALL
                       HAVING sum({w}) > 0),
                 a AS (SELECT {cols}, sum({w}) AS {w} FROM (
                           SELECT {cols}, {w} FROM old UNION ALL SELECT {cols}, {w} FROM n)
                       GROUP BY ALL HAVING sum({w}) > 0),
                 t AS ({self._top_sql('a')}
                       UNION ALL SELECT {out_cols}, -{w} FROM ({self._top_sql('o')}))
            SELECT {out_cols}, sum({w}) AS {w} FROM t GROUP BY ALL HAVING sum({w}) <> 0""",
            n=new, old=old)
        return conform(out, self.schema)

    def _change_in_arrow(self, ctx: StepContext, old: pa.Table, change: pa.Table) -> pa.Table:
        """``_change_in_duckdb`` ranked in Arrow, for ``ranks_in_arrow`` only: the same
        rows (``tests/operators/test_top_k.py`` compares them), from a few consolidations of
        the rows in hand and two top-k selections (the query cost 8 to 10 ms here)."""
        rows = ctx.local.consolidate(old.select([*self.columns, WEIGHT]), self.columns)
        both = pa.concat_tables([rows, change.select(rows.column_names).cast(rows.schema)])
        # (in the types of ``rows``: a consolidation in DuckDB names a time zone its own way)
        after = ctx.local.consolidate(both, self.columns).cast(rows.schema)
        placed_before = self._top_arrow(rows.filter(pc.greater(rows.column(WEIGHT), 0)))
        placed_after = self._top_arrow(after.filter(pc.greater(after.column(WEIGHT), 0)))
        out = ctx.local.consolidate(pa.concat_tables([placed_after, negate(placed_before)]),
                                    self.out_columns)
        return conform(out, self.schema)

    def _top_arrow(self, rows: pa.Table) -> pa.Table:
        """``_top_sql`` of ``rows`` (live rows: consolidated, every weight above zero) for
        ``ranks_in_arrow``: the first rows in the ranking's total order (each order key, its
        NULLs first or last as it says, then every column ascending, NULLs first) whose
        weights before them sum below k, each with the places left (its weight, at most k
        minus the weight before it); with a rank column, one row of weight 1 per place,
        numbered. Every live row takes a place at least, so the k first rows hold the top k:
        Arrow's top-k selection (``select_k_unstable``: unstable only among rows equal on
        every column, which a consolidated table has none of) of a key per order key and
        column, each led by a key of its NULLs (so NULLs go where the ranking puts them, as
        Arrow takes one NULL placement for all keys) and, for a floating-point column, one of
        its NaNs (above every number in DuckDB and Spark; Arrow places them after the numbers,
        before the NULLs, in either direction)."""
        keyed, sort_keys = {}, []
        ranking = [(o.column, o.descending, o.nulls_go_first) for o in self.order]
        ranking += [(c, False, True) for c in self.columns]
        for i, (column, descending, nulls_first) in enumerate(ranking):
            values = rows.column(column)
            if values.null_count:
                keyed[f"n{i}"] = pc.is_null(values)  # (True after False: first, descending)
                sort_keys.append((f"n{i}", "descending" if nulls_first else "ascending"))
            if pa.types.is_floating(values.type):  # NaN above every number (Arrow puts it
                nan = pc.is_nan(values).fill_null(False)  # where it puts the NULLs)
                if pc.any(nan).as_py():
                    keyed[f"f{i}"] = nan
                    sort_keys.append((f"f{i}", "descending" if descending else "ascending"))
            keyed[f"v{i}"] = values
            sort_keys.append((f"v{i}", "descending" if descending else "ascending"))
        taken = min(self.k, rows.num_rows)
        if taken == 0:
            top = rows
        else:
            top = rows.take(pc.select_k_unstable(pa.table(keyed), k=taken, sort_keys=sort_keys))
        # (a weight beyond k takes the places left, as k would: no int64 sum can wrap)
        weights = np.minimum(top.column(WEIGHT).to_numpy(), self.k)
        before = np.cumsum(weights) - weights
        kept = before < self.k
        places = np.minimum(weights, self.k - before)[kept]
        top, before = top.filter(pa.array(kept)), before[kept]
        if self.rank is None:
            return top.set_column(top.schema.get_field_index(WEIGHT), WEIGHT,
                                  pa.array(places, pa.int64()))
        one_per_place = np.repeat(np.arange(top.num_rows), places)
        first = np.repeat(np.cumsum(places) - places, places)
        rank = np.repeat(before, places) + (np.arange(len(one_per_place)) - first) + 1
        return top.take(pa.array(one_per_place)).drop_columns([WEIGHT]).append_column(
            self.rank, pa.array(rank, pa.int32())).append_column(
            WEIGHT, pa.array(np.ones(len(rank), dtype=np.int64)))

    def _candidates(self, ctx: StepContext, change: pa.Table, old: pa.Table) -> pa.Table:
        """The rows of a big consolidated ``change`` to a top-k over one partition numbered
        by ROW_NUMBER that can alter it, given ``old``, the rows of the trace that decide the
        old and new top k (every row ranked strictly before some value B, or all): every
        changed row among ``old``'s, whatever its weight, and the first k of the others with
        a weight above zero, in the ranking's total order (DuckDB's top-N: no sort of the
        change).

        Exact: a row of the second kind left out has k rows of the second kind before it.
        If they all rank with or before V, the last live row of ``old`` (``_unsettled``), the
        trace holds none of them (it holds every row before B in ``old``, and V is before
        B), so each is live after the step with its change's weight, and places 1 to k go to
        rows before the one left out, whose weights are all kept. Otherwise it ranks after
        V, where the settled rows leave no place. (The rows of ``old`` are kept whole: the
        trace may hold a row with a weight below zero, a delete that came before its insert,
        and an insert of it is not live then.)"""
        cols, w = idents(self.columns), ident(WEIGHT)
        held = f"EXISTS (SELECT 1 FROM old WHERE {null_safe_on('n', 'old', self.columns)})"
        return ctx.local.query(f"""
            (SELECT {cols}, {w} FROM n WHERE {w} > 0 AND NOT {held}
             ORDER BY {self._order_sql()} LIMIT {self.k})
            UNION ALL
            (SELECT {cols}, {w} FROM n WHERE {held})""",
            n=change, old=old.select(self.columns))

    def _rows_a_file(self, change: pa.Table) -> int:
        """How many leading rows of each touched partition a step reads from each file at
        first: k and a few, and as many again where the change deletes rows (those may be
        leaders, and the rows after them then count). Deeper where that does not settle."""
        deletes = pc.sum(pc.less(change.column(WEIGHT), 0).cast(pa.int64())).as_py() or 0
        return self.k + EXTREME_ROWS + min(self.k, deletes)

    def _unsettled(self, ctx: StepContext, change: pa.Table, rows: pa.Table,
                   cut_keys: pa.Table) -> pa.Table:
        """The partitions of ``cut_keys`` whose leading rows ``rows`` (of the trace before the
        step, consolidated: every row whose first order key is strictly beyond some value B,
        or at or beyond it where the lookup took B's ties, and none other) do not decide both
        the old and the new top k.

        Old: the rows given lead every other row, so they decide the old top k when their
        live weights (those above zero) sum to k or more (a row of multiplicity m takes m
        places; RANK places a row after all the weight before it). New (the old rows plus
        ``change``): every row, old or changed, whose first order key ranks with or before the
        last live old row given (V, at or beyond B) is in hand, and those rows lead every other; so
        they decide the new top k when their new live weights sum to k or more."""
        if not self.partition:  # one partition: settled or not
            return cut_keys.slice(0, 0) if self._settled(change, rows) else cut_keys
        first = self.order[0]
        part = f"PARTITION BY {idents(self.partition)}"
        by = (f"{ident(first.column)} {'DESC' if first.descending else 'ASC'} NULLS "
              f"{'FIRST' if first.nulls_go_first else 'LAST'}")
        cols, w = idents(self.columns), ident(WEIGHT)
        ranked = f"""
            WITH u AS (SELECT {cols}, {w} AS _w, {w} AS _wo FROM old
                       UNION ALL SELECT {cols}, {w}, 0 FROM n),
                 c AS (SELECT {cols}, sum(_w) AS _w, sum(_wo) AS _wo FROM u GROUP BY ALL),
                 r AS (SELECT *, rank() OVER ({part} ORDER BY {by}) AS _pos FROM c),
                 b AS (SELECT *, max(CASE WHEN _wo > 0 THEN _pos END) OVER ({part}) AS _v
                       FROM r)"""
        settled = (f"sum(greatest(_wo, 0)) >= {self.k} AND "
                   f"sum(CASE WHEN _pos <= _v THEN greatest(_w, 0) ELSE 0 END) >= {self.k}")
        keys = idents(self.partition)
        out = ctx.local.query(
            f"""{ranked}, s AS (SELECT {keys} FROM b GROUP BY {keys} HAVING {settled})
                SELECT k.* FROM k ANTI JOIN s ON {null_safe_on('k', 's', self.partition)}""",
            old=rows, n=change, k=cut_keys)
        return out.cast(cut_keys.schema)

    def _settled(self, change: pa.Table, rows: pa.Table) -> bool:
        """``_unsettled`` of a top-k over one partition, without ranking the change: the old
        rows decide the new top k when the sum of their weights (some may be below zero) and
        of the weights of the changed rows whose first order key ranks with or before V is k
        or more (at most the live weights of the new rows with or before V). In Arrow (a
        DuckDB query costs 8 ms here, twice a step): the first order key's type sorts in Arrow
        as in DuckDB (``self.ordered``), NaN aside, which ranks above every number and equal
        to itself in DuckDB and Spark and is taken apart here."""
        weights = rows.column(WEIGHT)
        live = pc.greater(weights, 0)
        if (pc.sum(pc.if_else(live, weights, 0)).as_py() or 0) < self.k:
            return False
        column = self.order[0].column
        before = self._at_or_before(change.column(column),
                                    self._last_placed(rows.column(column).filter(live)))
        at_or_before = pc.sum(change.column(WEIGHT).filter(before)).as_py() or 0
        return (pc.sum(weights).as_py() or 0) + at_or_before >= self.k

    def _last_placed(self, keys: pa.ChunkedArray) -> pa.Scalar | None:
        """The first order key of the row the ranking places last among ``keys`` (some):
        None for NULL."""
        first = self.order[0]
        if keys.null_count and not first.nulls_go_first:
            return None  # NULLs are placed last
        present = keys.drop_null()
        if len(present) == 0:
            return None
        if pa.types.is_floating(present.type):
            nan = pc.is_nan(present)
            if not first.descending and pc.any(nan).as_py():
                return pa.scalar(math.nan, present.type)  # the largest, placed last ascending
            present = present.filter(pc.invert(nan))
            if len(present) == 0:  # every one NaN
                return pa.scalar(math.nan, keys.type)
        return pc.min_max(present)["min" if first.descending else "max"]

    def _at_or_before(self, x: pa.ChunkedArray, v: pa.Scalar | None) -> pa.ChunkedArray:
        """Per value of ``x`` (a first order key), whether the ranking places it with or
        before ``v`` (None: NULL), with NaN above every number and equal to itself."""
        first = self.order[0]
        null = pc.is_null(x)
        if v is None:  # every value ranks before a NULL placed last, none before one first
            return null if first.nulls_go_first else pc.invert(null)
        compared = (pc.greater_equal if first.descending else pc.less_equal)(x, v)
        if pa.types.is_floating(x.type):
            nan, v_nan = pc.is_nan(x), math.isnan(v.as_py())
            if first.descending:  # NaN first: only NaN ranks with a NaN, and NaN before all
                compared = nan if v_nan else pc.or_(nan, compared)
            elif v_nan:  # ascending: every value ranks with or before NaN
                compared = pc.invert(null)
        compared = compared.fill_null(False)
        return pc.or_(null, compared) if first.nulls_go_first else compared

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        if d is None:
            return None
        old_files = self.trace.files()
        new_files = self.trace.append(d)
        if not new_files:
            return None
        change = self.trace.read(new_files)
        lookup = [f for f in self.trace.files_for_shards(touched_shards(change))
                  if f in set(old_files)] if old_files else []
        touched = change.select(*[quote(p) for p in self.partition]).distinct()
        old = self.trace.read(lookup)
        if self.partition:
            renamed = [f"_p{i}" for i in range(len(self.partition))]
            keys = F.broadcast(touched.select(*[F.col(quote(p)).alias(r)
                                                for p, r in zip(self.partition, renamed)]))
            cond = None
            for p, r in zip(self.partition, renamed):
                term = F.col(quote(p)).eqNullSafe(F.col(r))
                cond = term if cond is None else cond & term
            old = old.join(keys, cond, "left_semi")
        cols = [quote(c) for c in self.columns]
        old_rows = old.select(*cols, WEIGHT)
        before = old_rows.groupBy(*cols).agg(F.sum(WEIGHT).alias(WEIGHT)).where(
            F.col(WEIGHT) > 0)
        after = old_rows.unionByName(change.select(*cols, WEIGHT)).groupBy(*cols).agg(
            F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) > 0)
        old_top = self._top_spark(before)
        new_top = self._top_spark(after)
        out_cols = [quote(c) for c in self.out_columns]
        out = new_top.unionByName(old_top.select(*out_cols, (-F.col(WEIGHT)).alias(WEIGHT)))
        return out.groupBy(*out_cols).agg(F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) != 0)

    def owner_keys(self) -> list[list[str]] | None:
        """The partition columns: on a per-owner Spark step each task ranks its owner's
        partitions with ``step_local`` (a top-k over one partition is one task's)."""
        return [self.partition]

    def traces(self) -> list[Trace]:
        return [self.trace]


