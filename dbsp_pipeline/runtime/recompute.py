"""Recomputation from scratch: the oracle that checks a running pipeline's views.

``recompute(p)`` computes every view of ``p``'s circuit from nothing: a fresh pipeline in a
scratch folder gets each input's integrated value (``p.input_view_arrow``, the input through
the newest executed step) as one push and executes one step. That step starts from empty
traces, so it shares none of the incremental history of ``p`` (the deltas of earlier steps,
compaction, recovery, restore): a difference shows state that drifted. ``check_views(p)``
compares and also counts rows of non-positive multiplicity, which a view of a relational
query never has. Floating-point columns are compared bit for bit: aggregates sum exactly
(``dbsp_pipeline/exact_sum.py``), so an incremental sum and a sum from scratch are the same
double whatever the order of their additions.

A circuit with stream operators (``integrate``, ``differentiate``, ``delay``) depends on the
order in which its input arrived, not only on the integrated input; it cannot be recomputed
from a snapshot and ``recompute`` refuses it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.circuit import STREAM_OPS
from dbsp_pipeline.driver.sql import ident, negate
from dbsp_pipeline.errors import UsageError
from dbsp_pipeline.runtime.pipeline import Pipeline
from dbsp_pipeline.storage.small_files import read_text, write_atomically
from dbsp_pipeline.zset import WEIGHT


@dataclass(frozen=True)
class ViewCheck:
    """How view ``view`` after step ``step`` compares with its recomputation from scratch."""

    view: str
    step: int
    #: distinct rows of the view (recomputed)
    rows: int
    #: rows (counted with multiplicity) the recomputation has and the view lacks
    missing: int
    #: rows (counted with multiplicity) the view has and the recomputation lacks
    extra: int
    #: distinct rows of the view whose multiplicity is zero or negative
    nonpositive: int

    @property
    def equal(self) -> bool:
        return self.missing == 0 and self.extra == 0


def recompute(pipeline: Pipeline, views: Sequence[str] | None = None) -> dict[str, pa.Table]:
    """Every view in ``views`` (default: all) of ``pipeline``'s circuit computed from scratch
    over its integrated inputs: payload + ``_weight``, consolidated."""
    circuit = pipeline.circuit
    stream = sorted({n.op for n in circuit.nodes} & STREAM_OPS)
    if stream:
        raise UsageError(f"circuit '{circuit.name}' uses {', '.join(stream)}: its views depend "
                         "on the order input arrived in and cannot be recomputed from a snapshot")
    views = list(circuit.outputs) if views is None else list(views)
    spark = pipeline.spark if getattr(pipeline.spark, "started", True) else None
    with tempfile.TemporaryDirectory(prefix="dbsp-recompute-") as scratch:
        # the analysed schemas (from a local or an s3:// root): no JVM needed to compile
        cached = read_text(root_layout.plan_schemas(pipeline.root))
        if cached is not None:
            write_atomically(root_layout.plan_schemas(scratch), cached)
        with Pipeline(circuit, scratch, spark, driver_step_rows=pipeline.driver_step_rows,
                      driver_memory=pipeline.driver_memory) as fresh:
            for name in circuit.inputs:
                fresh.push_zset(name, pipeline.input_view_arrow(name))
            fresh.step()
            return {v: fresh.view_arrow(v) for v in views}


def check_views(pipeline: Pipeline, views: Sequence[str] | None = None) -> dict[str, ViewCheck]:
    """Compare each view in ``views`` (default: all) with its recomputation from scratch."""
    recomputed = recompute(pipeline, views)
    step = pipeline.next_step - 1
    out = {}
    sql = pipeline.engine.sql
    for name, expected in recomputed.items():
        actual = pipeline.view_arrow(name)
        payload = [c for c in expected.column_names if c != WEIGHT]
        both = pa.concat_tables([actual, negate(expected).cast(actual.schema)])
        diff = sql.consolidate(both, payload)
        counts = sql.query(
            f"SELECT coalesce(sum(CASE WHEN w < 0 THEN -w END), 0) AS missing, "
            f"coalesce(sum(CASE WHEN w > 0 THEN w END), 0) AS extra FROM "
            f"(SELECT {ident(WEIGHT)} AS w FROM d)", d=diff).to_pylist()[0]
        nonpositive = sql.query(
            f"SELECT count(*) AS n FROM a WHERE {ident(WEIGHT)} <= 0", a=actual
        ).to_pylist()[0]["n"]
        out[name] = ViewCheck(name, step, expected.num_rows, int(counts["missing"]),
                              int(counts["extra"]), int(nonpositive))
    return out
