"""The Dagster code location loads, and materializing the views runs a real pipeline step."""

from __future__ import annotations

import dagster as dg

from dbsp_pipeline import Pipeline
from dbsp_pipeline.examples.shop import shop_circuit


def test_code_location_loads():
    from definitions import defs

    dg.Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == set(shop_circuit().outputs)


def test_materializing_the_views_runs_a_step(spark, tmp_path):
    from assets.views import shop_views
    from resources.pipeline_store import PipelineStore
    from resources.spark import SparkResource

    root = str(tmp_path / "shop")
    with Pipeline(shop_circuit(), root, spark) as p:
        p.push("customers", [(1, "north"), (2, "south")])
        p.push("orders", [(10, 1, 25.0), (11, 2, 5.0)])
    result = dg.materialize([shop_views], resources={
        "spark": SparkResource(), "pipeline_store": PipelineStore(root=root)})
    assert result.success
    mats = {e.asset_key.to_user_string(): e.step_materialization_data.materialization.metadata
            for e in result.get_asset_materialization_events()}
    assert mats["revenue_by_region"]["step"].value == 0
    assert mats["revenue_by_region"]["changed_rows"].value == 1
    with Pipeline(shop_circuit(), root, spark) as p:
        assert p.next_step == 1
        assert sorted(tuple(r) for r in p.view("regions").collect()) == [("north", 1), ("south", 1)]
