"""Grouped aggregation, incrementally.

State, per group (the ``groups`` trace, keyed by the group columns): ``_n`` (the group's row
count), and for each aggregate its partials (``_c<i>`` non-NULL count, ``_s<i>`` sum) and its
current value. ``count``, ``sum`` and ``avg`` are linear: a step adds the change's partials to the
old ones. ``min``/``max`` are not invertible, so each keeps a second trace, the multiset of
(group, value) it has seen; a step takes ``least(old, smallest inserted)`` unless the change
deletes a value at or beyond the old extreme, and only for those groups it re-reads the group's
values from the multiset trace (the files of the touched shards only).

A group exists while ``_n > 0``; the output change is ``-old row`` and ``+new row`` for every
group whose row changed. Work per step is proportional to the number of groups the change touches
(plus the multiset of a group whose extreme was deleted), never to the input's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, DoubleType, LongType, StructField, StructType

from dbsp_pipeline.operators.base import Delta, Operator, StepContext
from dbsp_pipeline.operators.lookup import touched_shards
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.trace import Trace
from dbsp_pipeline.zset import SHARD, WEIGHT, quote, shard_of

_N = "_n"
_O = "_o_"  # prefix of the old state's columns


class Aggregate(Operator):
    def __init__(self, db: StateDatabase, name: str, keys: Sequence[str],
                 aggregates: Sequence[dict], input_schema: StructType, schema: StructType) -> None:
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
                state_fields.append(StructField(f"_s{i}", a["sum_type"]))
        state_fields += [StructField(a["name"], a["type"]) for a in self.aggs]
        self.state_schema = StructType(state_fields)
        self.groups = Trace(db, f"{name}_groups", self.state_schema, self.keys)
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
            if a["fn"] in ("sum", "avg"):
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
        n_new = F.coalesce(F.col(_O + _N), F.lit(0)) + F.col("_dn")
        exprs: dict[str, Column] = {}
        for a in self.aggs:
            i, fn = a["i"], a["fn"]
            if a["arg"] is not None:
                c_new = F.coalesce(F.col(f"{_O}_c{i}"), F.lit(0)) + F.col(f"_dc{i}")
                exprs[f"_c{i}"] = c_new
            if fn in ("sum", "avg"):
                s_new = (F.coalesce(F.col(f"{_O}_s{i}"), F.lit(0).cast(a["sum_type"]))
                         + F.coalesce(F.col(f"_ds{i}"), F.lit(0).cast(a["sum_type"])))
                exprs[f"_s{i}"] = s_new.cast(a["sum_type"])
        for a in self.aggs:
            i, fn, name = a["i"], a["fn"], a["name"]
            if fn == "count":
                value = F.col(_N) if a["arg"] is None else F.col(f"_c{i}")
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
        for a in self.aggs:
            g = g.withColumn(a["name"], exprs[a["name"]])
        g, _ = ctx.materialize(g)

        # 5. Emit -old/+new for changed groups and record the new state.
        state_cols = self.state_schema.fieldNames()
        old_rows = g.where(F.col(_O + _N).isNotNull()).select(
            *[F.col(_O + c).alias(c) for c in state_cols], F.lit(-1).cast("long").alias(WEIGHT))
        new_rows = g.where(F.col(_N) != 0).select(
            *[quote(c) for c in state_cols], F.lit(1).cast("long").alias(WEIGHT))
        self.groups.append(old_rows.unionByName(new_rows))
        visible = [quote(f.name) for f in self.schema.fields]
        out_old = g.where(F.col(_O + _N) > 0).select(
            *[F.col(_O + f.name).alias(f.name) for f in self.schema.fields],
            F.lit(-1).cast("long").alias(WEIGHT))
        out_new = g.where(F.col(_N) > 0).select(*visible, F.lit(1).cast("long").alias(WEIGHT))
        out = out_old.unionByName(out_new)
        return out.groupBy(*visible).agg(F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) != 0)

    def _extreme(self, ctx: StepContext, g: DataFrame, a: dict) -> DataFrame:
        """Add ``_mm<i>``: the new min/max of aggregate ``a`` for every touched group."""
        i, name = a["i"], a["name"]
        is_min = a["fn"] == "min"
        old = F.col(_O + name)
        if f"_cand{i}" not in g.columns:  # no value changed in this step
            return g.withColumn(f"_mm{i}", F.when(F.col(f"_c{i}") > 0, old))
        cand, deleted = F.col(f"_cand{i}"), F.col(f"_del{i}")
        hit = deleted.isNotNull() & old.isNotNull() & ((deleted <= old) if is_min else (deleted >= old))
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

    def compact(self, threshold: int) -> int:
        return int(self.groups.compact(threshold)) + sum(
            int(t.compact(threshold)) for t in self.values.values())


def _sum_type(input_type, output_type):
    if isinstance(input_type, DecimalType):
        return output_type if isinstance(output_type, DecimalType) else DecimalType(38, input_type.scale)
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
