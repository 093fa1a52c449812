"""Grouped aggregation, incrementally.

State, per group (the ``groups`` trace, keyed by the group columns): ``_n`` (the group's row
count), and for each aggregate its partials (``_c<i>`` non-NULL count, ``_s<i>`` sum) and its
current value. ``count``, ``sum`` and ``avg`` are linear: a step adds the change's partials to the
old ones. ``min``/``max`` are not invertible, so each keeps a second trace, the multiset of
(group, value) it has seen; a step takes ``least(old, smallest inserted)`` unless the change
deletes a value at or beyond the old extreme, and only for those groups it re-reads values from
the multiset trace: on the driver and in owner tasks, a few of the group's most extreme values
up to the old extreme a file (``Trace.lookup_extreme_rows``: the trace's keyed runs are sorted by
value within a group, for every value type Arrow ranks as DuckDB's ``min``/``max`` do; beyond the
old extreme every value was deleted before, but for the step's inserts, whose best is weighed
beside what the re-read finds), deeper only past values that later files deleted; else all the
group's values (the files of the touched shards only). Both the quick ``least``/``greatest`` and
that weighing take the step's best insert to be live, so a group's values never have a negative
net weight: a relation's row is not deleted more often than it was inserted. A group whose
count falls to zero or below is dropped with its state (a count of zero is an empty group), so
over inputs where a row's multiplicity falls below zero (a delete of a row never inserted,
which the linear operators follow exactly) the aggregate is not the Z-set's arithmetic: README.md
says so.

Sums over floating-point values (``sum``/``avg`` of DOUBLE, FLOAT, or integers averaged as
doubles) keep ``_s<i>`` exactly (:mod:`dbsp_pipeline.exact_sum`: the exact finite sum plus NaN and
±inf counts, as a canonical string) and round once on output, so every value is a function of the
group's multiset, bit for bit: the same on replay, after a restore or a rescale, on either engine
path. Both paths fold the step's values into the state with the same Python function (on Spark
inside ``mapInArrow``).

Two aggregates exist for eager aggregation (``dbsp_pipeline/eager_aggregation.py``), not for
users: ``sum_state(x)`` is ``sum(x)`` whose value is the group's exact sum as text (``_s<i>``,
NULL while the group has no value), and ``sum_of_states(s)`` sums such texts exactly (each
counts as the values it summed: ``exact_sum.fold_arrow``, ``merge``) and rounds once, as ``sum``.

A group exists while ``_n > 0``; the output change is ``-old row`` and ``+new row`` for every
group whose row changed. Work per step is proportional to the number of groups the change touches
(plus the multiset of a group whose extreme was deleted), never to the input's size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from functools import partial, reduce
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.functions import arrow_udf
from pyspark.sql.types import (
    DataType,
    DecimalType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from dbsp_pipeline.driver import spark_decimal
from dbsp_pipeline.driver import sql as local_sql
from dbsp_pipeline.driver.sql import (
    LocalSQL,
    arrow_groups_like_duckdb,
    arrow_orders_like_duckdb,
    conform,
    consolidate_arrow,
    ident,
    idents,
    match_distinct,
    null_safe_ids,
    null_safe_on,
    weights_fit,
)
from dbsp_pipeline.exact_sum import FoldSpec, fold_batches, fold_table
from dbsp_pipeline.operators.base import Delta, LocalDelta, Operator, StepContext
from dbsp_pipeline.operators.lookup import touched_shards
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace import Trace
from dbsp_pipeline.zset import SHARD, WEIGHT, quote, shard_of

_N = "_n"
_O = "_o_"  # prefix of the old state's columns


class Aggregate(Operator):
    #: a step's output is ``sql.consolidate``'s (over the output's columns, which hold the
    #: group columns, the owner keys)
    owner_outputs_consolidated = True

    def __init__(self, db: StateDatabase, name: str, keys: Sequence[str],
                 aggregates: Sequence[dict[str, Any]], input_schema: StructType,
                 schema: StructType) -> None:
        self.keys = list(keys)
        self.aggs = [dict(a) for a in aggregates]
        self.schema = schema
        self.input_schema = input_schema
        out_types = {f.name: f.dataType for f in schema.fields}
        state_fields = [input_schema[k] for k in self.keys] + [StructField(_N, LongType())]
        for i, a in enumerate(self.aggs):
            a["i"] = i
            a["type"] = out_types[a["name"]]
            if a["arg"] is not None:
                state_fields.append(StructField(f"_c{i}", LongType()))
            if a["fn"] in ("sum_state", "sum_of_states"):  # partial sums: exact by definition
                a["sum_type"], a["exact"] = DoubleType(), True
                state_fields.append(StructField(f"_s{i}", StringType()))
            elif a["fn"] in ("sum", "avg"):
                a["sum_type"] = _sum_type(input_schema[a["arg"]].dataType, a["type"])
                a["exact"] = isinstance(a["sum_type"], DoubleType)
                state_fields.append(StructField(f"_s{i}", StringType() if a["exact"]
                                                else a["sum_type"]))
        state_fields += [StructField(a["name"], a["type"]) for a in self.aggs]
        self.state_schema = StructType(state_fields)
        exact = any(a.get("exact") for a in self.aggs)  # state format 3 (runtime/upgrade.py)
        #: the groups trace an engine before state format 6 kept (``runtime/upgrade.py``):
        #: the same but for the sums of decimal averages, which it kept in the average's type
        self.narrow_groups_name = f"{name}_groups" + ("_exact" if exact else "")
        wide = any(a["fn"] == "avg" and isinstance(a.get("sum_type"), DecimalType)
                   for a in self.aggs)
        self.groups = Trace(db, self.narrow_groups_name + ("_wide" if wide else ""),
                            self.state_schema, self.keys, updated_in_place=True)
        self.exact = [FoldSpec(old=f"{_O}_s{a['i']}", pairs=f"_ds{a['i']}", count=f"_c{a['i']}",
                               state=f"_s{a['i']}", result=f"_fv{a['i']}", mean=a["fn"] == "avg",
                               merge=a["fn"] == "sum_of_states")
                      for a in self.aggs if a.get("exact")]
        self.values: dict[int, Trace] = {}
        for a in self.aggs:
            if a["fn"] in ("min", "max"):
                value_type = input_schema[a["arg"]].dataType
                vschema = StructType([input_schema[k] for k in self.keys]
                                     + [StructField("_v", value_type)])
                self.values[a["i"]] = Trace(
                    db, f"{name}_values{a['i']}", vschema, self.keys,
                    order_by="_v" if arrow_orders_like_duckdb(value_type) else None)

    def decimal_average_sums(self) -> dict[str, DecimalType]:
        """The state columns (``_s<i>``) holding the sums of decimal averages, with their type:
        Spark's ``AVG`` sum type since state format 6, the average's type before
        (``runtime/upgrade.py``)."""
        return {f"_s{a['i']}": a["sum_type"] for a in self.aggs
                if a["fn"] == "avg" and isinstance(a["sum_type"], DecimalType)}

    # ------------------------------------------------------------------------------------
    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        (d,) = changes
        if d is None:
            return None
        d, rows = ctx.materialize(d)
        if rows == 0:
            return None
        keys = [quote(k) for k in self.keys]

        # 1. The change's partials per group.
        partial_cols = [F.sum(WEIGHT).alias(_N)]
        for a in self.aggs:
            i, arg = a["i"], a["arg"]
            if arg is None:
                continue
            present = F.col(quote(arg)).isNotNull()
            partial_cols.append(F.sum(F.when(present, F.col(WEIGHT)).otherwise(0)).alias(f"_c{i}"))
            if a.get("exact"):  # the changed values themselves, summed exactly in phase 4
                value = F.col(quote(arg))
                pair = F.struct((value if a["fn"] == "sum_of_states" else value.cast("double"))
                                .alias("_v"),
                                F.col(WEIGHT).alias("_w"))
                partial_cols.append(F.collect_list(F.when(present, pair)).alias(f"_ds{i}"))
            elif a["fn"] in ("sum", "avg"):
                st = a["sum_type"]
                value = F.col(quote(arg)).cast(st)
                if _rounded_by_spark(st):  # the product in pyarrow, exactly, not Spark's `*`
                    value = _exact_products(st.scale)(value, F.col(WEIGHT))
                else:
                    value = value * F.col(WEIGHT).cast(
                        st if isinstance(st, DoubleType) else "long")
                partial_cols.append(F.sum(value).cast(st).alias(f"_ds{i}"))
        g = d.groupBy(*keys).agg(*partial_cols).withColumnRenamed(_N, "_dn")
        for a in self.aggs:
            if a["arg"] is not None:
                g = g.withColumnRenamed(f"_c{a['i']}", f"_dc{a['i']}")

        # 2. min/max: record the change's values; candidate and deleted extremes per group.
        for i, trace in self.values.items():
            a = self.aggs[i]
            vals = d.where(F.col(quote(a["arg"])).isNotNull()).select(
                *keys, F.col(quote(a["arg"])).alias("_v"), WEIGHT)
            new_files = trace.append(vals)
            if not new_files:
                continue
            dv = trace.read(new_files)
            best = F.min if a["fn"] == "min" else F.max
            ext = dv.groupBy(*keys).agg(
                best(F.when(F.col(WEIGHT) > 0, F.col("_v"))).alias(f"_cand{i}"),
                best(F.when(F.col(WEIGHT) < 0, F.col("_v"))).alias(f"_del{i}"))
            g = _join_keys(g, ext, self.keys, "left")

        # 3. The old state of the touched groups.
        touched = g.select(*keys).withColumn(SHARD, shard_of(self.keys))
        g, _ = ctx.materialize(g)
        old_files = self.groups.files()
        if old_files:
            touched, _ = ctx.materialize(touched)
            files = self.groups.files_for_shards(touched_shards(touched))
            old = _semi_join_keys(self.groups.read(files), touched, self.keys,
                                  broadcast=rows <= ctx.broadcast_rows)
            old = old.groupBy(*[quote(c) for c in self.state_schema.fieldNames()]).agg(
                F.sum(WEIGHT).alias("_ow")).where(F.col("_ow") != 0)
            old = old.select(*[F.col(quote(c)).alias(_O + c)
                               for c in self.state_schema.fieldNames()])
            g = g.join(old, _null_safe_prefixed(self.keys, _O), "left")
        else:
            for f in self.state_schema.fields:
                g = g.withColumn(_O + f.name, F.lit(None).cast(f.dataType))

        # 4. New state.
        n_new = F.coalesce(F.col(quote(_O + _N)), F.lit(0)) + F.col("_dn")
        exprs: dict[str, Column] = {}
        for a in self.aggs:
            i, fn = a["i"], a["fn"]
            if a["arg"] is not None:
                c_new = F.coalesce(F.col(f"{_O}_c{i}"), F.lit(0)) + F.col(f"_dc{i}")
                exprs[f"_c{i}"] = c_new
            if fn in ("sum", "avg") and not a.get("exact"):
                st = a["sum_type"]
                old_s = F.coalesce(F.col(f"{_O}_s{i}"), F.lit(0).cast(st))
                ds = F.coalesce(F.col(f"_ds{i}"), F.lit(0).cast(st))
                if _rounded_by_spark(st):  # the sum in pyarrow, exactly, not Spark's `+`
                    exprs[f"_s{i}"] = _exact_sums(st)(old_s, ds)
                else:
                    exprs[f"_s{i}"] = (old_s + ds).cast(st)
        for a in self.aggs:
            i, fn, name = a["i"], a["fn"], a["name"]
            if fn == "count":
                value = F.col(_N) if a["arg"] is None else F.col(f"_c{i}")
            elif fn == "sum_state":
                value = F.when(F.col(f"_c{i}") > 0, F.col(f"_s{i}"))
            elif a.get("exact"):
                value = F.col(f"_fv{i}")
            elif fn == "sum":
                value = F.when(F.col(f"_c{i}") > 0, F.col(f"_s{i}"))
            elif fn == "avg" and isinstance(a["type"], DecimalType):  # Spark's AVG, not `/`
                value = _decimal_averages(a["type"])(F.col(f"_s{i}"), F.col(f"_c{i}"))
            elif fn == "avg":
                value = F.when(F.col(f"_c{i}") > 0, F.col(f"_s{i}") / F.col(f"_c{i}"))
            else:
                value = F.col(f"_mm{i}")
            exprs[name] = value.cast(a["type"])
        g = g.withColumn(_N, n_new)
        for k, v in exprs.items():
            if k.startswith("_"):
                g = g.withColumn(k, v)
        for i in self.values:
            g = self._extreme(ctx, g, self.aggs[i])
        if self.exact:
            g = _fold_exact_spark(g, self.exact)
        for a in self.aggs:
            g = g.withColumn(a["name"], exprs[a["name"]])
        g, _ = ctx.materialize(g)

        # 5. Emit -old/+new for changed groups and record the new state.
        state_cols = self.state_schema.fieldNames()
        old_rows = g.where(F.col(quote(_O + _N)).isNotNull()).select(
            *[F.col(quote(_O + c)).alias(c) for c in state_cols],
            F.lit(-1).cast("long").alias(WEIGHT))
        new_rows = g.where(F.col(_N) != 0).select(
            *[quote(c) for c in state_cols], F.lit(1).cast("long").alias(WEIGHT))
        self.groups.append(old_rows.unionByName(new_rows))
        visible = [quote(f.name) for f in self.schema.fields]
        out_old = g.where(F.col(quote(_O + _N)) > 0).select(
            *[F.col(quote(_O + f.name)).alias(f.name) for f in self.schema.fields],
            F.lit(-1).cast("long").alias(WEIGHT))
        out_new = g.where(F.col(_N) > 0).select(*visible, F.lit(1).cast("long").alias(WEIGHT))
        out = out_old.unionByName(out_new)
        return out.groupBy(*visible).agg(F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) != 0)

    # ------------------------------------------------------------------------------------
    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        """``step`` on the driver, in the same five phases. Each phase runs in pyarrow on a small
        step (``arrow_partials``, ``arrow_extremes``, ``arrow_new_state``) or else as one DuckDB
        query; both give the same table, bit for bit (a phase whose checked arithmetic
        overflows in pyarrow runs as the query, which raises its own error or sums exactly)."""
        (d,) = changes
        if d is None or d.num_rows == 0:
            return None
        sql = ctx.local

        # 1. The change's partials per group.
        g = self._partials_arrow(d)
        if g is None:
            with self._sums_checked():
                g = self._partials_sql(sql, d)

        # 2. min/max: record the change's values; candidate and deleted extremes per group.
        extremes: dict[int, pa.Table | None] = {}
        for i, trace in self.values.items():
            arg = self.aggs[i]["arg"]
            present = local_sql.filtered(d, pc.is_valid(d.column(arg)))
            vals = pa.Table.from_arrays(
                [*(present.column(k) for k in self.keys), present.column(arg),
                 present.column(WEIGHT)], names=[*self.keys, "_v", WEIGHT])
            extremes[i] = trace.append_arrow(sql, vals) if vals.num_rows else None

        # 3. The old state of the touched groups (consolidated: the live state rows).
        state_cols = self.state_schema.fieldNames()
        old = self.groups.lookup_arrow(sql, g)
        old = sql.consolidate(old, state_cols).drop_columns([WEIGHT])

        # 4. New state: partials, then each min/max either from the old extreme and the
        #    candidates, or (``_redo``) re-read from the values of a group whose extreme went.
        state = self._new_state_arrow(sql, g, extremes, old)
        if state is None:
            with self._sums_checked():
                state = self._new_state_sql(sql, g, extremes, old)
        for i in self.values:
            state = self._redo_extreme_local(ctx, state, self.aggs[i])
        if self.exact:
            state = fold_table(state, self.exact)

        # 5. Emit -old/+new for changed groups and record the new state.
        return self._emit_local(sql, self._with_values(state))

    @contextlib.contextmanager
    def _sums_checked(self) -> Iterator[None]:
        """DuckDB's overflow of a phase's arithmetic as an ``OverflowError`` naming the sums
        and counts it can be and their types (a row's value times its multiplicity, or a
        group's total, beyond the type: Spark's ANSI ``sum`` fails there too, not wraps), with
        DuckDB's words after them."""
        try:
            yield
        except duckdb.OutOfRangeException as e:
            named = [f"{a['name']} = {a['fn']}({a['arg'] or '*'}) as "
                     f"{a.get('sum_type', LongType()).simpleString().upper()}"
                     for a in self.aggs if a["fn"] in ("sum", "avg", "count")
                     and not a.get("exact")]
            integer = any(isinstance(a.get("sum_type"), LongType) for a in self.aggs)
            detail = str(e).removeprefix("Out of Range Error: ")
            raise OverflowError(
                f"{', '.join(named) or 'count(*) as BIGINT'}: a row's value times its "
                "multiplicity, or a group's total, is beyond what the type holds (Spark's sum "
                "fails there too)"
                + ("; an integer column summed as CAST(... AS DECIMAL(38, 0)) holds more"
                   if integer else "") + f" ({detail})") from None

    def _emit_local(self, sql: LocalSQL, final: pa.Table) -> LocalDelta:
        """Phase 5 on the driver: append the state change of the touched groups ``final``
        (one row a group: the old state ``_O``-prefixed, NULL for a new group, and the new
        state; a new ``_n`` of 0 removes the group) to ``groups``, and return the view's
        change: -old and +new visible rows of live groups, consolidated.

        A group whose new state equals its old one (as a consolidation takes rows to be equal,
        ``equal_as_grouped``) changes nothing; a group whose visible row stays emits nothing.
        Since every row is one group, what is left is consolidated as it is, and is marked so
        (``LocalSQL.assume_consolidated``), not grouped again; with a state column of a type
        that comparison does not take, both are consolidated instead, with the same rows."""
        state_cols = self.state_schema.fieldNames()
        visible = self.schema.fieldNames()
        n = final.num_rows
        old = conform(pa.Table.from_arrays(
            [*(final.column(_O + c) for c in state_cols), pa.array(np.full(n, -1))],
            names=[*state_cols, WEIGHT]), self.state_schema)
        new = conform(final.select(state_cols).append_column(WEIGHT, pa.array(np.full(n, 1))),
                      self.state_schema)
        has_old = np.asarray(pc.is_valid(final.column(_O + _N)).to_numpy(
            zero_copy_only=False), dtype=bool)
        n_new = final.column(_N).to_numpy()
        # each state column compared once: the visible ones (a subset), then the others
        shown = set(visible)
        visible_same = local_sql.equal_as_grouped(old, new, visible)
        others_same = local_sql.equal_as_grouped(old, new,
                                                 [c for c in state_cols if c not in shown])
        if visible_same is None or others_same is None:
            state_change = pa.concat_tables([local_sql.filtered(old, has_old),
                                             local_sql.filtered(new, n_new != 0)])
            self.groups.append_arrow(sql, state_change)
            out = sql.consolidate(state_change.filter(pc.greater(state_change.column(_N), 0)),
                                  visible)
            return sql.conform(out, self.schema) if out.num_rows else None
        same = visible_same & others_same
        state_change = pa.concat_tables([local_sql.filtered(old, has_old & ~same),
                                         local_sql.filtered(new, (n_new != 0) & ~same)])
        sql.assume_consolidated(state_change, state_cols)
        self.groups.append_arrow(sql, state_change)
        # the view: -old where the group was live, +new where it is, but not both where its
        # visible row stays (a state equal as a whole has its visible row equal too)
        old_live = has_old & (pc.fill_null(old.column(_N), 0).to_numpy() > 0)
        new_live = n_new > 0
        stays = old_live & new_live & visible_same
        out = pa.concat_tables(
            [local_sql.filtered(old, old_live & ~stays).select([*visible, WEIGHT]),
             local_sql.filtered(new, new_live & ~stays).select([*visible, WEIGHT])])
        if out.num_rows == 0:
            return None
        sql.assume_consolidated(out, visible)
        return sql.conform(out, self.schema)

    # -- the phases of ``step_local``: pyarrow (small steps) and DuckDB ---------------------
    def _partials_sql(self, sql: LocalSQL, d: pa.Table) -> pa.Table:
        """Phase 1 as a query: per group of ``d``, ``_dn`` (weight sum), and per aggregate
        ``_dc<i>`` (weight sum of non-NULL values) and ``_ds<i>`` (the weighted sum, or the
        (value, weight) pairs of an exact sum)."""
        w = ident(WEIGHT)
        keys = idents(self.keys)
        keys_sel = keys + ", " if self.keys else ""
        group_by = f"GROUP BY {keys}" if self.keys else ""
        parts = [f"CAST(sum({w}) AS BIGINT) AS _dn"]
        for a in self.aggs:
            i, arg = a["i"], a["arg"]
            if arg is None:
                continue
            parts.append(f"CAST(sum(CASE WHEN {ident(arg)} IS NOT NULL THEN {w} ELSE 0 END) "
                         f"AS BIGINT) AS _dc{i}")
            if a.get("exact"):  # the changed values themselves, summed exactly in phase 4
                v = ident(arg) if a["fn"] == "sum_of_states" else f"CAST({ident(arg)} AS DOUBLE)"
                parts.append(f"list({{'_v': {v}, '_w': {w}}}) FILTER "
                             f"(WHERE {ident(arg)} IS NOT NULL) AS _ds{i}")
            elif a["fn"] in ("sum", "avg") and isinstance(a["sum_type"], DecimalType):
                # Spark's SUM: the sum of value * weight in its widest type, cast to the
                # state's (exact, as the Spark path's, ``_rounded_by_spark``; beyond the type
                # both raise)
                st = a["sum_type"]
                parts.append(f"CAST(sum(CAST({ident(arg)} AS DECIMAL(38, {st.scale})) * {w}) "
                             f"AS DECIMAL({st.precision}, {st.scale})) AS _ds{i}")
            elif a["fn"] in ("sum", "avg"):
                t = "DOUBLE" if isinstance(a["sum_type"], DoubleType) else "BIGINT"
                parts.append(f"CAST(sum(CAST({ident(arg)} AS {t}) * CAST({w} AS {t})) AS {t}) "
                             f"AS _ds{i}")
        return sql.query(f"SELECT {keys_sel}{', '.join(parts)} FROM d {group_by}", d=d)

    def _partials_arrow(self, d: pa.Table) -> pa.Table | None:
        """Phase 1 in pyarrow, or None where it might differ from ``_partials_sql``: a big
        change, keys pyarrow groups otherwise, a weight sum or a weighted value that could
        leave int64. An exact sum's pairs hold every row's value (NULL where the value is, which
        the exact fold skips), and are NULL for a group without a value, as the query's. A sum
        of decimals is summed as the integers their unscaled values are (``_unscaled_products``:
        where no sum can leave int64), then typed as the query's (a total past the type: None,
        and the query raises).

        With an exact sum a change of any size is grouped here (unless ``FAST_PATH_ROWS`` is 0:
        DuckDB always): DuckDB builds the lists of pairs several times slower than pyarrow's
        grouping and ``take`` do, at every size measured (1M rows on one core: 63 ms against
        30 ms in 10 groups, 529 ms against 77 ms in 100k groups)."""
        limit = local_sql.FAST_PATH_ROWS
        if self.exact and limit:
            limit = d.num_rows
        if (d.num_rows > limit or not self.keys
                or not arrow_groups_like_duckdb(d, self.keys) or not weights_fit(d[WEIGHT])):
            return None
        w = d.column(WEIGHT)
        cols: dict[str, Any] = {k: d.column(k) for k in self.keys}
        cols["_dn"] = w
        aggs: list[tuple[str, str]] = [("_dn", "sum")]
        lists: list[tuple[int, str]] = []
        decimals: dict[str, pa.Decimal128Type] = {}  # partial sums of decimals: unscaled
        for a in self.aggs:
            i, arg = a["i"], a["arg"]
            if arg is None:
                continue
            value = d.column(arg)
            present = pc.is_valid(value)
            cols[f"_dc{i}"] = pc.if_else(present, w, 0)
            aggs.append((f"_dc{i}", "sum"))
            if a.get("exact"):
                cols[f"_row{i}"] = pa.array(np.arange(d.num_rows, dtype=np.int64))
                cols[f"_has{i}"] = present
                aggs += [(f"_row{i}", "list"), (f"_has{i}", "any")]
                lists.append((i, arg))
            elif a["fn"] in ("sum", "avg"):
                if isinstance(a["sum_type"], DoubleType):
                    return None  # double sums are exact; no other double sum runs here
                if isinstance(a["sum_type"], DecimalType):
                    st = a["sum_type"]
                    products = _unscaled_products(value, w, st.scale)
                    if products is None:
                        return None
                    cols[f"_ds{i}"] = products
                    aggs.append((f"_ds{i}", "sum"))
                    decimals[f"_ds{i}"] = pa.decimal128(st.precision, st.scale)
                    continue
                try:
                    product = pc.multiply_checked(value.cast(pa.int64()), w)
                except pa.ArrowInvalid:
                    return None
                if not weights_fit(product):
                    return None
                cols[f"_ds{i}"] = product
                aggs.append((f"_ds{i}", "sum"))
        grouped = pa.table(cols).group_by(self.keys, use_threads=False).aggregate(aggs)
        out = {k: grouped.column(k) for k in self.keys}
        for name, fn in aggs:
            column = grouped.column(f"{name}_{fn}")
            if name.startswith("_row"):
                i = int(name[4:])
                arg = dict(lists)[i]
                rows = column.combine_chunks()
                flat = rows.flatten()
                taken = d.column(arg).take(flat)
                if self.aggs[i]["fn"] != "sum_of_states":
                    taken = taken.cast(pa.float64(), safe=False)
                pairs = pa.StructArray.from_arrays(
                    [taken.combine_chunks(),
                     w.take(flat).combine_chunks()], names=["_v", "_w"])
                listed = pa.ListArray.from_arrays(rows.offsets, pairs)
                has = grouped.column(f"_has{i}_any")
                out[f"_ds{i}"] = pc.if_else(has, listed, pa.nulls(len(listed), listed.type))
            elif name.startswith("_has"):
                continue
            elif name in decimals:
                sums = column.combine_chunks()
                total = spark_decimal.from_unscaled_int64(
                    np.asarray(sums.fill_null(0).to_numpy(zero_copy_only=False)),
                    np.asarray(sums.is_valid().to_numpy(zero_copy_only=False), dtype=bool),
                    decimals[name])
                if total is None:  # beyond the sum's type: the query raises its error
                    return None
                out[name] = total
            else:
                out[name] = column.cast(pa.int64())
        return pa.table(out)

    def _extremes_arrow(self, new: pa.Table, a: dict[str, Any]) -> pa.Table | None:
        """Per group of ``new`` (the consolidated values appended in this step), ``_cand<i>``
        (the best inserted value) and ``_del<i>`` (the best deleted one); None where pyarrow
        might differ from the query. Numbers, dates and times (any number of rows) go through
        ``_extremes_by_rows``; other values of a small step through pyarrow's ``group_by``."""
        i = a["i"]
        if not local_sql.FAST_PATH_ROWS \
                or not arrow_groups_like_duckdb(new, [*self.keys, "_v"]):
            return None
        by_rows = self._extremes_by_rows(new, a)
        if by_rows is not None or new.num_rows > local_sql.FAST_PATH_ROWS:
            return by_rows
        best = "min" if a["fn"] == "min" else "max"
        value, w = new.column("_v"), new.column(WEIGHT)
        nulls = pa.nulls(len(value), value.type)
        t = pa.table({**{k: new.column(k) for k in self.keys},
                      f"_cand{i}": pc.if_else(pc.greater(w, 0), value, nulls),
                      f"_del{i}": pc.if_else(pc.less(w, 0), value, nulls)})
        grouped = t.group_by(self.keys, use_threads=False).aggregate(
            [(f"_cand{i}", best), (f"_del{i}", best)])
        return grouped.rename_columns([*self.keys, f"_cand{i}", f"_del{i}"])

    def _extremes_by_rows(self, new: pa.Table, a: dict[str, Any]) -> pa.Table | None:
        """``_extremes_arrow``'s table, its groups numbered by row hashes
        (``row_groups.grouped``) and each group's best inserted and deleted row found in one
        compiled pass (``best_by_group``), for values that are numbers, dates or times (the
        caller checked: no NaN or -0.0, and keys pyarrow groups as DuckDB does); None for other
        values, or where the rows are not grouped so."""
        from dbsp_pipeline.driver import row_groups  # (compiled code: loaded at first use)
        from dbsp_pipeline.driver.row_groups_kernel import best_by_group

        values = row_groups.ordered_values(new.column("_v"))
        rows = row_groups.grouped(new, self.keys) if values is not None else None
        if values is None or rows is None:
            return None
        group, firsts = rows
        weights = np.asarray(new.column(WEIGHT).to_numpy(), dtype=np.int64)
        inserted, deleted = best_by_group(group, values, weights, len(firsts),
                                          a["fn"] == "min")
        value = new.column("_v")
        i = a["i"]
        return pa.Table.from_arrays(
            [*(new.column(k).take(firsts) for k in self.keys),
             value.take(pa.array(inserted, mask=inserted < 0)),
             value.take(pa.array(deleted, mask=deleted < 0))],
            names=[*self.keys, f"_cand{i}", f"_del{i}"])

    def _new_state_sql(self, sql: LocalSQL, g: pa.Table, extremes: dict[int, pa.Table | None],
                       old: pa.Table) -> pa.Table:
        """Phase 4 as a query: ``g`` joined with the old state (``_o_``-prefixed) and each
        min/max's candidates; the new ``_n``, counts and sums; per min/max ``_redo<i>`` (the
        old extreme was deleted: re-read the group's values) and ``_mm<i>``."""
        tables = {"g": g, "old": old}
        ctes, joins, picks = [], [], []
        for i, new in extremes.items():
            if new is None:
                picks.append(f"NULL AS _cand{i}, NULL AS _del{i}")
                continue
            tables[f"v{i}"] = new
            ctes.append(f"e{i} AS ({self._extremes_query(self.aggs[i], f'v{i}')})")
            joins.append(f"LEFT JOIN e{i} ON {null_safe_on('g', f'e{i}', self.keys)}")
            picks.append(f"e{i}._cand{i}, e{i}._del{i}")
        state_cols = self.state_schema.fieldNames()
        joins.append(f"LEFT JOIN old o ON {null_safe_on('g', 'o', self.keys)}")
        picks.append(", ".join(f"o.{ident(c)} AS {ident(_O + c)}" for c in state_cols))
        new_cols = [f"coalesce({ident(_O + _N)}, 0) + _dn AS {_N}"]
        for a in self.aggs:
            i = a["i"]
            if a["arg"] is not None:
                new_cols.append(f"coalesce({ident(f'{_O}_c{i}')}, 0) + _dc{i} AS _c{i}")
            if a["fn"] in ("sum", "avg") and not a.get("exact"):
                total = f"coalesce({ident(f'{_O}_s{i}')}, 0) + coalesce(_ds{i}, 0)"
                if isinstance(a["sum_type"], DecimalType):  # Spark casts it to the state's type
                    st = a["sum_type"]
                    total = f"CAST({total} AS DECIMAL({st.precision}, {st.scale}))"
                new_cols.append(f"{total} AS _s{i}")
        extreme_cols = []
        for i in self.values:
            is_min = self.aggs[i]["fn"] == "min"
            old_value = ident(_O + self.aggs[i]["name"])
            cmp, pick = ("<=", "least") if is_min else (">=", "greatest")
            extreme_cols.append(
                f"(_del{i} IS NOT NULL AND {old_value} IS NOT NULL AND _del{i} {cmp} "
                f"{old_value} AND _c{i} > 0) AS _redo{i}, CASE WHEN _c{i} > 0 THEN "
                f"{pick}({old_value}, _cand{i}) END AS _mm{i}")
        with_ctes = f"WITH {', '.join(ctes)}, " if ctes else "WITH "
        return sql.query(
            f"{with_ctes}j AS (SELECT g.*, {', '.join(picks)} FROM g "
            f"{' '.join(joins)}), n AS (SELECT *, {', '.join(new_cols)} FROM j) "
            f"SELECT *{''.join(', ' + e for e in extreme_cols)} FROM n", **tables)

    def _extremes_query(self, a: dict[str, Any], values: str) -> str:
        """The query of ``_cand<i>`` and ``_del<i>`` per group (see ``_extremes_arrow``) over
        the table named ``values``: phase 4's in ``_new_state_sql``, and alone for a big
        step's values in ``_new_state_arrow``."""
        w = ident(WEIGHT)
        keys = idents(self.keys)
        i, best = a["i"], "min" if a["fn"] == "min" else "max"
        return (f"SELECT {keys + ', ' if self.keys else ''}"
                f"{best}(CASE WHEN {w} > 0 THEN _v END) AS _cand{i}, "
                f"{best}(CASE WHEN {w} < 0 THEN _v END) AS _del{i} "
                f"FROM {values} {f'GROUP BY {keys}' if self.keys else ''}")

    def _new_state_arrow(self, sql: LocalSQL, g: pa.Table,
                         extremes: dict[int, pa.Table | None],
                         old: pa.Table) -> pa.Table | None:
        """Phase 4 in pyarrow (the columns of ``_new_state_sql``), or None where it might
        differ: many groups, keys or extremes pyarrow compares otherwise (a floating-point zero
        or NaN), or checked arithmetic that overflows. A big step's values in few groups have
        their extremes per group taken by ``_new_state_sql``'s own query (``_extremes_query``)
        and the rest of the phase runs here: the groups' exact-sum pairs (a list of every
        changed value) then never cross into DuckDB and back (the phase took 26-58 ms as one
        query in a task of a 1M-row Spark step, 5 groups; 14 ms so)."""
        limit = local_sql.FAST_PATH_ROWS
        if (g.num_rows > limit or old.num_rows > limit or not self.keys
                or not arrow_groups_like_duckdb(g, self.keys)
                or not arrow_groups_like_duckdb(old, self.keys)):
            return None
        sides: list[tuple[str, pa.Table]] = [(_O, old.rename_columns(
            [_O + c for c in old.column_names]))]
        for i, new in extremes.items():
            if new is None:
                continue
            a = self.aggs[i]
            e = self._extremes_arrow(new, a)
            if e is None:
                e = sql.query(self._extremes_query(a, "v"), v=new)
                if e.num_rows > limit or not arrow_groups_like_duckdb(
                        e, [*self.keys, f"_cand{i}", f"_del{i}"]):
                    return None
            sides.append((f"_e{i}_", e))
        joined = g
        for prefix, side in sides:
            side_keys = [prefix + k for k in self.keys] if prefix == _O else self.keys
            g_rows, side_rows = _left_join_rows(
                joined.select(self.keys), side.select(side_keys).rename_columns(self.keys),
                self.keys)
            # the old state keeps its (prefixed) key columns, as the query's ``o.*`` does
            taken = (side if prefix == _O else side.drop_columns(self.keys)).take(side_rows)
            if g_rows is not None:
                joined = joined.take(g_rows)
            for name in taken.column_names:
                joined = joined.append_column(name, taken.column(name))
        try:
            return self._compute_new_state(joined, extremes)
        except pa.ArrowInvalid:  # an overflow: the query raises its own error, or sums exactly
            return None

    def _compute_new_state(self, j: pa.Table,
                           extremes: dict[int, pa.Table | None]) -> pa.Table | None:
        """The new-state columns of phase 4 over the joined table ``j`` (checked arithmetic)."""
        def coalesce0(name: str) -> Any:
            column = j.column(name)
            return pc.coalesce(column, pa.scalar(0, column.type))

        out = j.append_column(_N, pc.add_checked(coalesce0(_O + _N), j.column("_dn")))
        for a in self.aggs:
            i = a["i"]
            if a["arg"] is not None:
                out = out.append_column(f"_c{i}", pc.add_checked(coalesce0(f"{_O}_c{i}"),
                                                                 j.column(f"_dc{i}")))
            if a["fn"] in ("sum", "avg") and isinstance(a["sum_type"], DecimalType):
                total = _unscaled_total(j.column(f"{_O}_s{i}"), j.column(f"_ds{i}"),
                                        a["sum_type"])
                if total is None:  # past 64 bits or the type: the query decides
                    return None
                out = out.append_column(f"_s{i}", total)
            elif a["fn"] in ("sum", "avg") and not a.get("exact"):
                out = out.append_column(f"_s{i}", pc.add_checked(
                    coalesce0(f"{_O}_s{i}"), pc.coalesce(j.column(f"_ds{i}"), 0)))
        for i in self.values:
            a = self.aggs[i]
            old_value = out.column(_O + a["name"])
            if f"_cand{i}" not in out.column_names:
                nulls = pa.nulls(out.num_rows, old_value.type)
                out = out.append_column(f"_cand{i}", nulls).append_column(f"_del{i}", nulls)
            cand, deleted = out.column(f"_cand{i}"), out.column(f"_del{i}")
            if cand.type != old_value.type or not arrow_groups_like_duckdb(
                    out, [_O + a["name"]]):
                return None
            live = pc.greater(out.column(f"_c{i}"), 0)
            is_min = a["fn"] == "min"
            hit = (pc.less_equal if is_min else pc.greater_equal)(deleted, old_value)
            redo = pc.and_kleene(pc.and_kleene(pc.is_valid(deleted), pc.is_valid(old_value)),
                                 pc.and_kleene(hit, live))
            pick = _better_of(cand, old_value, is_min)
            out = out.append_column(f"_redo{i}", pc.fill_null(redo, False)).append_column(
                f"_mm{i}", pc.if_else(live, pick, pa.nulls(out.num_rows, old_value.type)))
        return out

    def _with_values(self, state: pa.Table) -> pa.Table:
        """``state`` (phase 4's columns) with each aggregate's value under its name."""
        out = state
        for a in self.aggs:
            i, fn, name = a["i"], a["fn"], a["name"]
            if fn == "count":
                value = state.column(_N if a["arg"] is None else f"_c{i}")
            elif fn == "sum_state":
                value = state.column(f"_s{i}")
                value = pc.if_else(pc.greater(state.column(f"_c{i}"), 0), value,
                                   pa.nulls(len(value), value.type))
            elif a.get("exact"):
                value = state.column(f"_fv{i}")
            elif fn in ("sum", "avg"):
                count = state.column(f"_c{i}")
                total = state.column(f"_s{i}")
                if fn == "avg" and isinstance(a["type"], DecimalType):
                    out = out.append_column(name, spark_decimal.averages(
                        total, count, pa.decimal128(a["type"].precision, a["type"].scale)))
                    continue
                if fn == "avg":
                    total = pc.divide(total.cast(pa.float64()), count.cast(pa.float64()))
                value = pc.if_else(pc.greater(count, 0), total, pa.nulls(len(total), total.type))
            else:
                value = state.column(f"_mm{i}")
            out = out.append_column(name, value)
        return out

    def _redo_extreme_local(self, ctx: StepContext, g: pa.Table, a: dict[str, Any]) -> pa.Table:
        """Set ``_mm<i>`` of the groups flagged ``_redo<i>`` from their live values: the best
        of the step's best insert (``_cand<i>``) and the values re-read up to the old extreme.
        (Every value beyond the old extreme was dead before the step, so beyond it only the
        step's inserts are live: an ordered trace's re-read skips the rest, deleted earlier.)"""
        i = a["i"]
        redo = g.filter(g.column(f"_redo{i}"))  # (a NULL flag selects nothing)
        if redo.num_rows == 0:
            return g
        trace = self.values[i]
        best = "min" if a["fn"] == "min" else "max"
        # an ordered trace gives live rows (consolidated, positive weights) whose extreme per
        # group is the group's up to its old extreme; an unordered one every row of the
        # groups, consolidated here
        ordered = trace.runs.order_by is not None
        values = (trace.lookup_extreme_rows(ctx.local, redo, largest=best == "max",
                                            bound=_O + a["name"])
                  if ordered else trace.lookup_arrow(ctx.local, redo))
        limit = local_sql.FAST_PATH_ROWS
        if (values.num_rows <= limit and g.num_rows <= limit and self.keys
                and arrow_groups_like_duckdb(values, [*self.keys, "_v"])
                and arrow_groups_like_duckdb(g, [*self.keys, f"_cand{i}"])
                and (ordered or weights_fit(values[WEIGHT]))):
            live = values
            if not ordered:
                live = consolidate_arrow(values, [*self.keys, "_v"])
                live = local_sql.filtered(live, pc.greater(live.column(WEIGHT), 0))
            rec = live.group_by(self.keys, use_threads=False).aggregate([("_v", best)])
            g_rows, rec_rows = _left_join_rows(g, rec, self.keys)
            if g_rows is not None:
                g = g.take(g_rows)
            recomputed = rec.column(f"_v_{best}").take(rec_rows)
            mm, cand = g.column(f"_mm{i}"), g.column(f"_cand{i}")
            if recomputed.type != mm.type:
                recomputed = recomputed.cast(mm.type)
            if cand.type != mm.type:
                cand = cand.cast(mm.type)
            recomputed = _better_of(cand, recomputed, best == "min")
            return g.set_column(g.schema.get_field_index(f"_mm{i}"), f"_mm{i}",
                                pc.if_else(g.column(f"_redo{i}"), recomputed, mm))
        keys = idents(self.keys)
        live_sql = ("SELECT * FROM v" if ordered else
                    f"SELECT {keys}, _v FROM v GROUP BY {keys}, _v "
                    f"HAVING sum({ident(WEIGHT)}) > 0")
        return ctx.local.query(
            f"WITH live AS ({live_sql}), "
            f"rec AS (SELECT {keys}, {best}(_v) AS _rec FROM live GROUP BY {keys}) "
            f"SELECT g.* REPLACE (CASE WHEN g._redo{i} THEN "
            f"{'least' if best == 'min' else 'greatest'}(rec._rec, g._cand{i}) "
            f"ELSE g._mm{i} END AS _mm{i}) "
            f"FROM g LEFT JOIN rec ON {null_safe_on('g', 'rec', self.keys)}", g=g, v=values)

    def _extreme(self, ctx: StepContext, g: DataFrame, a: dict[str, Any]) -> DataFrame:
        """Add ``_mm<i>``: the new min/max of aggregate ``a`` for every touched group."""
        i, name = a["i"], a["name"]
        is_min = a["fn"] == "min"
        old = F.col(quote(_O + name))
        if f"_cand{i}" not in g.columns:  # no value changed in this step
            return g.withColumn(f"_mm{i}", F.when(F.col(f"_c{i}") > 0, old))
        cand, deleted = F.col(f"_cand{i}"), F.col(f"_del{i}")
        hit = (deleted.isNotNull() & old.isNotNull()
               & ((deleted <= old) if is_min else (deleted >= old)))
        g = g.withColumn(f"_redo{i}", hit & (F.col(f"_c{i}") > 0))
        redo = g.where(F.col(f"_redo{i}")).select(*[quote(k) for k in self.keys])
        redo = redo.withColumn(SHARD, shard_of(self.keys))
        redo, redo_rows = ctx.materialize(redo)
        pick = F.least if is_min else F.greatest
        quick = F.when(F.col(f"_c{i}") > 0, pick(old, cand))
        if redo_rows == 0:
            return g.withColumn(f"_mm{i}", quick)
        trace = self.values[i]
        files = trace.files_for_shards(touched_shards(redo))
        values = _semi_join_keys(trace.read(files), redo, self.keys, broadcast=True)
        best = F.min if is_min else F.max
        recomputed = (values.groupBy(*[quote(k) for k in self.keys], "_v")
                      .agg(F.sum(WEIGHT).alias("_vw")).where(F.col("_vw") > 0)
                      .groupBy(*[quote(k) for k in self.keys]).agg(best("_v").alias(f"_rec{i}")))
        g = _join_keys(g, recomputed, self.keys, "left")
        return g.withColumn(f"_mm{i}", F.when(F.col(f"_redo{i}"), F.col(f"_rec{i}"))
                            .otherwise(quick))

    def columns_read(self) -> list[str] | None:
        """The group columns and the aggregates' arguments: nothing else of a change reaches
        the state or the output, and every phase sums weights per group (``_partials_arrow``)
        or consolidates (``Trace.append_arrow``), so the change need not be consolidated."""
        return list(dict.fromkeys([*self.keys, *(a["arg"] for a in self.aggs
                                                 if a["arg"] is not None)]))

    def owner_keys(self) -> list[list[str]] | None:
        """The group columns."""
        return [self.keys]

    def traces(self) -> list[Trace]:
        return [self.groups, *self.values.values()]


def _unscaled_products(values: pa.ChunkedArray, weights: pa.ChunkedArray,
                       scale: int) -> pa.Array | None:
    """Per row, the unscaled ``value * weight`` of a decimal column of scale ``scale`` as int64
    (NULL where the value is), where no sum of them can leave 64 bits; else None. Exactly
    ``_partials_sql``'s ``CAST(value AS DECIMAL(38, scale)) * weight`` then, in integers."""
    if not pa.types.is_decimal128(values.type) or values.type.scale != scale:
        return None
    unscaled = spark_decimal.unscaled_int64(values)
    if unscaled is None:
        return None
    digits, valid = unscaled
    w = np.asarray(weights.to_numpy(), dtype=np.int64)
    if len(digits) and _magnitude(digits) * _magnitude(w) * len(digits) >= 2**63:
        return None
    return pa.array(digits * w, mask=~valid)


def _magnitude(values: np.ndarray) -> int:
    """The largest absolute value of a non-empty int64 array, as a Python int (``np.abs`` of
    the smallest int64 wraps around)."""
    return max(int(values.max()), -int(values.min()))


def _unscaled_total(old: pa.ChunkedArray, partial: pa.ChunkedArray,
                    sum_type: DecimalType) -> pa.Array | None:
    """``CAST(coalesce(old, 0) + coalesce(partial, 0) AS sum_type)`` of two decimal columns of
    ``sum_type``'s scale, in int64 on their unscaled values; None where either is not such a
    decimal, a value passes 62 bits, or a total passes the type's digits (where the query
    raises its overflow error, or sums a state wider than 64 bits)."""
    for column in (old, partial):
        if not pa.types.is_decimal128(column.type) or column.type.scale != sum_type.scale:
            return None
    parts = [spark_decimal.unscaled_int64(old), spark_decimal.unscaled_int64(partial)]
    if parts[0] is None or parts[1] is None:
        return None
    a, b = parts[0][0], parts[1][0]
    if len(a) and max(_magnitude(a), _magnitude(b)) >= 2**62:
        return None
    return spark_decimal.from_unscaled_int64(
        a + b, np.ones(len(a), dtype=bool),
        pa.decimal128(sum_type.precision, sum_type.scale))


def _better_of(a: Any, b: Any, is_min: bool) -> Any:
    """Per row, the smaller (``is_min``) or larger of ``a`` and ``b`` skipping NULLs, as
    DuckDB's ``least``/``greatest``; ``b`` where they tie. By comparison: pyarrow's
    ``min_element_wise`` takes no strings, no timestamps with a time zone; comparisons take
    every type that gets here (values ``arrow_groups_like_duckdb`` passed: no NaN, no -0.0)."""
    better = pc.fill_null((pc.less if is_min else pc.greater)(a, b), False)
    return pc.if_else(pc.or_(pc.is_null(b), better), a, b)


def _left_join_rows(left: pa.Table, right: pa.Table, keys: Sequence[str]
                    ) -> tuple[pa.Array | None, pa.Array]:
    """The row pairs of ``left LEFT JOIN right`` on ``keys`` (NULL-safe), in ``left``'s order:
    the rows of ``left`` to take (None: each once, in order) and the matching rows of
    ``right`` (NULL where none). The caller checked ``arrow_groups_like_duckdb`` on both."""
    matched = match_distinct(left, right, keys)
    if matched is not None:  # (each key once in ``right``: the common case, without a join)
        return None, matched
    # Join row numbers on the key ids (pyarrow joins no list columns), then order as ``left``.
    left_ids, right_ids = null_safe_ids(left, right, keys)
    ids = [f"_id{j}" for j in range(len(keys))]
    pairs = pa.table({**dict(zip(ids, left_ids)),
                      "_li": np.arange(left.num_rows, dtype=np.int64)}).join(
        pa.table({**dict(zip(ids, right_ids)),
                  "_ri": np.arange(right.num_rows, dtype=np.int64)}),
        keys=ids, join_type="left outer", use_threads=False).sort_by("_li")
    return pairs.column("_li"), pairs.column("_ri")


def _fold_exact_spark(g: DataFrame, specs: Sequence[FoldSpec]) -> DataFrame:
    """``exact_sum.fold_arrow`` on Spark: the same Python code as the driver path, per batch.

    PySpark's ``mapInArrow`` looks each column up by its unquoted name, which a name with a dot
    or a backtick breaks; so every column the fold does not read goes through under a
    positional name and gets its own name back afterwards."""
    names = g.columns
    read = {c for s in specs for c in (s.old, s.pairs, s.count)}
    inner = [c if c in read else f"_m{j}" for j, c in enumerate(names)]
    added = [f for s in specs for f in (StructField(s.state, StringType()),
                                        StructField(s.result, DoubleType()))]
    schema = StructType([StructField(n, f.dataType, f.nullable)
                         for n, f in zip(inner, g.schema.fields)] + added)
    folded = g.toDF(*inner).mapInArrow(partial(fold_batches, specs=list(specs)), schema)
    return folded.toDF(*names, *[f.name for f in added])


def _rounded_by_spark(sum_type: DataType) -> bool:
    """Whether Spark's own ``*`` and ``+`` would round a decimal sum of this type (a scale
    above 6 in a wide type: ``spark_decimal.keeps_scale``), so that the Spark path multiplies
    by the weight and adds to the state in pyarrow (``spark_decimal.exact_products``,
    ``exact_sums``), exactly as Spark's ``SUM`` from scratch and the driver's DuckDB do."""
    return (isinstance(sum_type, DecimalType)
            and not spark_decimal.keeps_scale(sum_type.precision, sum_type.scale))


def _exact_products(scale: int) -> Any:
    """The Arrow UDF of ``spark_decimal.exact_products`` (of values of scale ``scale``)."""
    return _arrow_udf(spark_decimal.exact_products, DecimalType(38, scale))


def _exact_sums(sum_type: DecimalType) -> Any:
    """The Arrow UDF of ``spark_decimal.exact_sums`` into ``sum_type``."""
    precision, scale = sum_type.precision, sum_type.scale

    def exact_sums(left: pa.Array, right: pa.Array) -> pa.Array:
        return spark_decimal.exact_sums(left, right, precision, scale)
    return _arrow_udf(exact_sums, sum_type)


def _decimal_averages(avg_type: DecimalType) -> Any:
    """The Arrow UDF of ``spark_decimal.averages`` (sum, count) into ``avg_type``."""
    out = pa.decimal128(avg_type.precision, avg_type.scale)

    def decimal_averages(totals: pa.Array, counts: pa.Array) -> pa.Array:
        return spark_decimal.averages(totals, counts, out)
    return _arrow_udf(decimal_averages, avg_type)


#: PySpark's ``arrow_udf``, its kind (arrays to an array) taken from the function's type
#: hints, a form its stubs do not declare
_arrow_udf: Any = arrow_udf


def _sum_type(input_type: DataType, output_type: DataType) -> DataType:
    """The type ``sum``/``avg`` keeps its sum in. Of decimals, Spark's (``Sum``'s result type,
    ``Average``'s ``sumDataType``): ``DECIMAL(min(38, p + 10), s)`` for a ``DECIMAL(p, s)``
    column, so a sum overflows here exactly where Spark's would."""
    if isinstance(input_type, DecimalType):
        return DecimalType(min(spark_decimal.MAX_PRECISION, input_type.precision + 10),
                           input_type.scale)
    if isinstance(output_type, LongType):
        return LongType()
    return DoubleType()


def _join_keys(left: DataFrame, right: DataFrame, keys: Sequence[str], how: str) -> DataFrame:
    """Join on ``keys`` NULL-safely, keeping the key columns once (from ``left``)."""
    renamed = right.select(*[F.col(quote(c)).alias("_r_" + c) if c in keys else F.col(quote(c))
                             for c in right.columns])
    cond = reduce(lambda x, y: x & y,
                  [F.col(quote(k)).eqNullSafe(F.col(quote("_r_" + k))) for k in keys])
    return left.join(renamed, cond, how).drop(*["_r_" + k for k in keys])


def _semi_join_keys(df: DataFrame, keys_df: DataFrame, keys: Sequence[str],
                    broadcast: bool) -> DataFrame:
    """The rows of ``df`` whose ``keys`` occur in ``keys_df`` (NULL equals NULL)."""
    right = keys_df.select(*[F.col(quote(k)).alias("_r_" + k) for k in keys])
    if broadcast:
        right = F.broadcast(right)
    return df.join(right, _null_safe_prefixed(keys, "_r_"), "left_semi")


def _null_safe_prefixed(keys: Sequence[str], prefix: str) -> Column:
    return reduce(lambda x, y: x & y,
                  [F.col(quote(k)).eqNullSafe(F.col(quote(prefix + k))) for k in keys])

