"""Asset checks of the output views.

* ``matches_recomputation``: the view equals the same circuit computed from scratch over the
  integrated inputs (``dbsp_pipeline.check_views``). A circuit whose views depend on the order
  of input (stream operators) has no such check.
* ``positive_multiplicities``: no row of the view has a multiplicity of zero or less (a
  relational view is a set or a bag: a negative count means an update was lost or doubled).
"""

# no ``from __future__ import annotations``: Dagster reads the decorated functions' annotations
from collections.abc import Iterator

import dagster as dg

from dbsp_pipeline import STREAM_OPS, check_views
from dbsp_pipeline.dagster.ref import PipelineRef

MATCHES = "matches_recomputation"
POSITIVE = "positive_multiplicities"


def view_checks(ref: PipelineRef) -> dg.AssetChecksDefinition:
    """The checks of every view of ``ref``'s pipeline, run by one op that opens it once."""
    circuit = ref.circuit
    recomputable = not ({n.op for n in circuit.nodes} & STREAM_OPS)
    specs = []
    for view in circuit.outputs:
        specs.append(dg.AssetCheckSpec(POSITIVE, asset=ref.view_key(view),
                                       description="no row with multiplicity <= 0"))
        if recomputable:
            specs.append(dg.AssetCheckSpec(
                MATCHES, asset=ref.view_key(view),
                description="the view equals its recomputation from scratch"))

    @dg.multi_asset_check(name=ref.job_name("view_checks"), specs=specs, can_subset=True,
                          required_resource_keys={ref.store_key, "spark"}, op_tags=ref.tags)
    def check(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        store = ref.store(context)
        with store.open(circuit, context.resources.spark) as pipeline:
            checks = check_views(pipeline) if recomputable else {}
            for view in circuit.outputs:
                key = ref.view_key(view)
                if checks:
                    c = checks[view]
                    yield dg.AssetCheckResult(
                        asset_key=key, check_name=MATCHES, passed=c.equal,
                        metadata={"step": c.step, "rows": c.rows, "missing_rows": c.missing,
                                  "extra_rows": c.extra})
                    nonpositive = c.nonpositive
                else:
                    nonpositive = sum(1 for w in pipeline.view_arrow(view).column("_weight")
                                      .to_pylist() if w <= 0)
                yield dg.AssetCheckResult(asset_key=key, check_name=POSITIVE,
                                          passed=nonpositive == 0,
                                          metadata={"nonpositive_rows": nonpositive})

    return check
