"""Looking up the keys a change touches in a trace, without scanning the whole trace.

``touched_shards`` collects the shards of a (small, materialized) change; ``Trace.files_for_shards``
turns them into the files that can hold those keys; ``weights_of_keys`` joins the change with those
files NULL-safely and returns each changed row with the trace's summed weight for its key.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from dbsp_pipeline.operators.base import StepContext
from dbsp_pipeline.zset import SHARD, SHARD_COUNT, WEIGHT, quote

#: Past this many distinct shards, collecting them costs more than reading every file.
_MAX_COLLECTED_SHARDS = SHARD_COUNT // 2


def touched_shards(change: DataFrame) -> list[int]:
    """The distinct ``_shard`` values of a trace-format change (all shards if too many)."""
    rows = change.select(SHARD).distinct().limit(_MAX_COLLECTED_SHARDS + 1).collect()
    if len(rows) > _MAX_COLLECTED_SHARDS:
        return list(range(SHARD_COUNT))
    return [r[0] for r in rows]


def weights_of_keys(ctx: StepContext, trace: DataFrame, change: DataFrame, key: Sequence[str],
                    small_rows: int) -> DataFrame:
    """Each row of ``change`` (trace format) with ``_old``: the trace's summed weight of its key.

    Rows of ``change`` whose key is not in the trace get ``_old`` NULL. Keys compare NULL-safely.
    """
    renamed = [f"_k{i}" for i in range(len(key))]
    old = (trace.select(*[F.col(quote(k)).alias(r) for k, r in zip(key, renamed)],
                        F.col(SHARD).alias("_oshard"), F.col(WEIGHT).alias("_ow")))
    keys = change.select(*[quote(k) for k in key], SHARD)
    if small_rows <= ctx.broadcast_rows:
        keys = F.broadcast(keys)
    cond = F.col("_oshard") == F.col(SHARD)
    for k, r in zip(key, renamed):
        cond = cond & F.col(quote(k)).eqNullSafe(F.col(r))
    matched = keys.join(old, cond, "inner").groupBy(*[quote(k) for k in key]).agg(
        F.sum("_ow").alias("_old"))
    cond2 = None
    m = matched.select(*[F.col(quote(k)).alias(r) for k, r in zip(key, renamed)], "_old")
    for k, r in zip(key, renamed):
        term = F.col(quote(k)).eqNullSafe(F.col(r))
        cond2 = term if cond2 is None else cond2 & term
    return change.join(m, cond2, "left").drop(*renamed)
