"""Grouped aggregation, incrementally.

State, per group (the ``groups`` trace, keyed by the group columns): ``_n`` (the group's row
count), and for each aggregate its partials (``_c<i>`` non-NULL count, ``_s<i>`` sum) and its
current value. ``count``, ``sum`` and ``avg`` are linear: a step adds the change's partials to the
old ones. ``min``/``max`` are not invertible, so each keeps a second trace, the multiset of
(group, value) it has seen; a step takes ``least(old, smallest inserted)`` unless the change
deletes a value at or beyond the old extreme, and only for those groups it re-reads the group's
values from the multiset trace (the files of the touched shards only).

Sums over floating-point values (``sum``/``avg`` of DOUBLE, FLOAT, or integers averaged as
doubles) keep ``_s<i>`` exactly (:mod:`dbsp_pipeline.exact_sum`: the exact finite sum plus NaN and
±inf counts, as a canonical string) and round once on output, so every value is a function of the
group's multiset, bit for bit: the same on replay, after a restore or a rescale, on either engine
path. Both paths fold the step's values into the state with the same Python function (on Spark
inside ``mapInArrow``).

A group exists while ``_n > 0``; the output change is ``-old row`` and ``+new row`` for every
group whose row changed. Work per step is proportional to the number of groups the change touches
(plus the multiset of a group whose extreme was deleted), never to the input's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial, reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DataType,
    DecimalType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from dbsp_pipeline.driver.sql import conform, ident, idents, null_safe_on
from dbsp_pipeline.exact_sum import FoldSpec, fold_batches, fold_table
from dbsp_pipeline.operators.base import Delta, LocalDelta, Operator, StepContext
from dbsp_pipeline.operators.lookup import touched_shards
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace import Trace
from dbsp_pipeline.zset import SHARD, WEIGHT, quote, shard_of

_N = "_n"
_O = "_o_"  # prefix of the old state's columns


class Aggregate(Operator):
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
            if a["fn"] in ("count", "sum", "avg", "min", "max") and a["arg"] is not None:
                state_fields.append(StructField(f"_c{i}", LongType()))
            if a["fn"] in ("sum", "avg"):
                a["sum_type"] = _sum_type(input_schema[a["arg"]].dataType, a["type"])
                a["exact"] = isinstance(a["sum_type"], DoubleType)
                state_fields.append(StructField(f"_s{i}", StringType() if a["exact"]
                                                else a["sum_type"]))
        state_fields += [StructField(a["name"], a["type"]) for a in self.aggs]
        self.state_schema = StructType(state_fields)
        exact = any(a.get("exact") for a in self.aggs)  # state format 3 (runtime/upgrade.py)
        self.groups = Trace(db, f"{name}_groups" + ("_exact" if exact else ""),
                            self.state_schema, self.keys)
        self.exact = [FoldSpec(old=f"{_O}_s{a['i']}", pairs=f"_ds{a['i']}", count=f"_c{a['i']}",
                               state=f"_s{a['i']}", result=f"_fv{a['i']}", mean=a["fn"] == "avg")
                      for a in self.aggs if a.get("exact")]
        self.values: dict[int, Trace] = {}
        for a in self.aggs:
            if a["fn"] in ("min", "max"):
                vschema = StructType([input_schema[k] for k in self.keys]
                                     + [StructField("_v", input_schema[a["arg"]].dataType)])
                self.values[a["i"]] = Trace(db, f"{name}_values{a['i']}", vschema, self.keys)

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
                pair = F.struct(F.col(quote(arg)).cast("double").alias("_v"),
                                F.col(WEIGHT).alias("_w"))
                partial_cols.append(F.collect_list(F.when(present, pair)).alias(f"_ds{i}"))
            elif a["fn"] in ("sum", "avg"):
                value = F.col(quote(arg)).cast(a["sum_type"]) * F.col(WEIGHT).cast(
                    a["sum_type"] if isinstance(a["sum_type"], DoubleType) else "long")
                partial_cols.append(F.sum(value).cast(a["sum_type"]).alias(f"_ds{i}"))
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
                s_new = (F.coalesce(F.col(f"{_O}_s{i}"), F.lit(0).cast(a["sum_type"]))
                         + F.coalesce(F.col(f"_ds{i}"), F.lit(0).cast(a["sum_type"])))
                exprs[f"_s{i}"] = s_new.cast(a["sum_type"])
        for a in self.aggs:
            i, fn, name = a["i"], a["fn"], a["name"]
            if fn == "count":
                value = F.col(_N) if a["arg"] is None else F.col(f"_c{i}")
            elif a.get("exact"):
                value = F.col(f"_fv{i}")
            elif fn == "sum":
                value = F.when(F.col(f"_c{i}") > 0, F.col(f"_s{i}"))
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
    @property
    def runs_on_driver(self) -> bool:
        """Whether ``step_local`` computes exactly what ``step`` does (no decimal sums: Spark's
        decimal arithmetic rules are not DuckDB's)."""
        return not any("sum_type" in a and isinstance(a["sum_type"], DecimalType)
                       for a in self.aggs)

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        """``step`` on the driver, in the same five phases, as few DuckDB queries as it takes."""
        (d,) = changes
        if d is None or d.num_rows == 0:
            return None
        sql, w = ctx.local, ident(WEIGHT)
        keys = idents(self.keys)
        keys_sel = keys + ", " if self.keys else ""
        group_by = f"GROUP BY {keys}" if self.keys else ""

        # 1. The change's partials per group.
        parts = [f"CAST(sum({w}) AS BIGINT) AS _dn"]
        for a in self.aggs:
            i, arg = a["i"], a["arg"]
            if arg is None:
                continue
            parts.append(f"CAST(sum(CASE WHEN {ident(arg)} IS NOT NULL THEN {w} ELSE 0 END) "
                         f"AS BIGINT) AS _dc{i}")
            if a.get("exact"):  # the changed values themselves, summed exactly in phase 4
                parts.append(f"list({{'_v': CAST({ident(arg)} AS DOUBLE), '_w': {w}}}) FILTER "
                             f"(WHERE {ident(arg)} IS NOT NULL) AS _ds{i}")
            elif a["fn"] in ("sum", "avg"):
                t = "DOUBLE" if isinstance(a["sum_type"], DoubleType) else "BIGINT"
                parts.append(f"CAST(sum(CAST({ident(arg)} AS {t}) * CAST({w} AS {t})) AS {t}) "
                             f"AS _ds{i}")
        tables = {"g": sql.query(f"SELECT {keys_sel}{', '.join(parts)} FROM d {group_by}", d=d)}

        # 2. min/max: record the change's values; candidate and deleted extremes per group.
        ctes, joins, picks = [], [], []
        for i, trace in self.values.items():
            a = self.aggs[i]
            best = "min" if a["fn"] == "min" else "max"
            vals = sql.query(f"SELECT {keys_sel}{ident(a['arg'])} AS _v, {w} FROM d "
                             f"WHERE {ident(a['arg'])} IS NOT NULL", d=d)
            new = trace.append_arrow(sql, vals) if vals.num_rows else None
            if new is None:
                picks.append(f"NULL AS _cand{i}, NULL AS _del{i}")
                continue
            tables[f"v{i}"] = new
            ctes.append(f"e{i} AS (SELECT {keys_sel}{best}(CASE WHEN {w} > 0 THEN _v END) AS "
                        f"_cand{i}, {best}(CASE WHEN {w} < 0 THEN _v END) AS _del{i} "
                        f"FROM v{i} {group_by})")
            joins.append(f"LEFT JOIN e{i} ON {null_safe_on('g', f'e{i}', self.keys)}")
            picks.append(f"e{i}._cand{i}, e{i}._del{i}")

        # 3. The old state of the touched groups.
        state_cols = self.state_schema.fieldNames()
        tables["old"] = self.groups.lookup_arrow(sql, tables["g"])
        ctes.append(f"o AS (SELECT {idents(state_cols)} FROM old GROUP BY ALL "
                    f"HAVING sum({w}) <> 0)")
        joins.append(f"LEFT JOIN o ON {null_safe_on('g', 'o', self.keys)}")
        picks.append(", ".join(f"o.{ident(c)} AS {ident(_O + c)}" for c in state_cols))

        # 4. New state: partials, then each min/max either from the old extreme and the
        #    candidates, or (``_redo``) re-read from the values of a group whose extreme went.
        new_cols = [f"coalesce({ident(_O + _N)}, 0) + _dn AS {_N}"]
        for a in self.aggs:
            i = a["i"]
            if a["arg"] is not None:
                new_cols.append(f"coalesce({ident(f'{_O}_c{i}')}, 0) + _dc{i} AS _c{i}")
            if a["fn"] in ("sum", "avg") and not a.get("exact"):
                new_cols.append(f"coalesce({ident(f'{_O}_s{i}')}, 0) + coalesce(_ds{i}, 0) "
                                f"AS _s{i}")
        extremes = []
        for i in self.values:
            is_min = self.aggs[i]["fn"] == "min"
            old = ident(_O + self.aggs[i]["name"])
            cmp, pick = ("<=", "least") if is_min else (">=", "greatest")
            extremes.append(f"(_del{i} IS NOT NULL AND {old} IS NOT NULL AND _del{i} {cmp} {old} "
                            f"AND _c{i} > 0) AS _redo{i}, CASE WHEN _c{i} > 0 THEN "
                            f"{pick}({old}, _cand{i}) END AS _mm{i}")
        g = sql.query(
            f"WITH {', '.join(ctes)}, j AS (SELECT g.*, {', '.join(picks)} FROM g "
            f"{' '.join(joins)}), n AS (SELECT *, {', '.join(new_cols)} FROM j) "
            f"SELECT *{''.join(', ' + e for e in extremes)} FROM n", **tables)
        for i in self.values:
            g = self._redo_extreme_local(ctx, g, self.aggs[i])
        if self.exact:
            g = fold_table(g, self.exact)
        values = []
        for a in self.aggs:
            i, fn, name = a["i"], a["fn"], a["name"]
            if fn == "count":
                value = _N if a["arg"] is None else f"_c{i}"
            elif a.get("exact"):
                value = f"_fv{i}"
            elif fn == "sum":
                value = f"CASE WHEN _c{i} > 0 THEN _s{i} END"
            elif fn == "avg":
                value = f"CASE WHEN _c{i} > 0 THEN CAST(_s{i} AS DOUBLE) / _c{i} END"
            else:
                value = f"_mm{i}"
            values.append(f"{value} AS {ident(name)}")

        # 5. Emit -old/+new for changed groups and record the new state.
        old_state = ", ".join(f"{ident(_O + c)} AS {ident(c)}" for c in state_cols)
        state_change = sql.query(
            f"WITH s AS (SELECT *, {', '.join(values)} FROM g) "
            f"SELECT {old_state}, -1 AS {w} FROM s WHERE {ident(_O + _N)} IS NOT NULL "
            f"UNION ALL SELECT {idents(state_cols)}, 1 AS {w} FROM s WHERE {_N} <> 0", g=g)
        self.groups.append_arrow(sql, conform(state_change, self.state_schema))
        visible = idents(self.schema.fieldNames())
        out = sql.query(
            f"SELECT {visible}, CAST(sum({w}) AS BIGINT) AS {w} FROM c GROUP BY ALL "
            f"HAVING sum({w}) <> 0", c=state_change.filter(pc.field(_N) > 0))
        return conform(out, self.schema) if out.num_rows else None

    def _redo_extreme_local(self, ctx: StepContext, g: pa.Table, a: dict[str, Any]) -> pa.Table:
        """Set ``_mm<i>`` of the groups flagged ``_redo<i>`` from their live values."""
        i = a["i"]
        redo = g.filter(pc.field(f"_redo{i}"))
        if redo.num_rows == 0:
            return g
        values = self.values[i].lookup_arrow(ctx.local, redo)
        best = "min" if a["fn"] == "min" else "max"
        keys = idents(self.keys)
        return ctx.local.query(
            f"WITH live AS (SELECT {keys}, _v FROM v GROUP BY {keys}, _v "
            f"HAVING sum({ident(WEIGHT)}) > 0), "
            f"rec AS (SELECT {keys}, {best}(_v) AS _rec FROM live GROUP BY {keys}) "
            f"SELECT g.* REPLACE (CASE WHEN g._redo{i} THEN rec._rec ELSE g._mm{i} END AS _mm{i}) "
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

    def owner_keys(self) -> list[list[str]] | None:
        """The group columns; None for a sum of decimals (no driver path, so no task path)."""
        return [self.keys] if self.runs_on_driver else None

    def traces(self) -> list[Trace]:
        return [self.groups, *self.values.values()]


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


def _sum_type(input_type: DataType, output_type: DataType) -> DataType:
    if isinstance(input_type, DecimalType):
        return (output_type if isinstance(output_type, DecimalType)
                else DecimalType(38, input_type.scale))
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
