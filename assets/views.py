"""The shop pipeline's output views as Dagster assets.

Materializing them executes one step of the pipeline over the input pushed since the last step
(pushed by ``python -m dbsp_pipeline demo`` or a connector) and records, per view, the step and
how many rows of the view changed.
"""

import dagster as dg

from dbsp_pipeline.examples.shop import shop_circuit
from resources.pipeline_store import PipelineStore
from resources.spark import SparkResource

CIRCUIT = shop_circuit()


@dg.multi_asset(
    specs=[dg.AssetSpec(name, group_name="shop", kinds={"spark", "delta"},
                        description=f"output view '{name}' of the shop circuit")
           for name in CIRCUIT.outputs],
    can_subset=False,
)
def shop_views(context: dg.AssetExecutionContext, spark: SparkResource,
               pipeline_store: PipelineStore):
    """One step of the shop pipeline; each view's change is appended to its output log."""
    with pipeline_store.open(CIRCUIT, spark.session()) as pipeline:
        result = pipeline.step()
        context.log.info(f"step {result.step}: inputs {result.inputs}, outputs {result.outputs}")
        for name in CIRCUIT.outputs:
            yield dg.MaterializeResult(
                asset_key=name,
                metadata={"step": result.step, "changed_rows": result.outputs.get(name) or 0,
                          "state_version": pipeline.state_version,
                          "seconds": round(result.seconds, 3)})
