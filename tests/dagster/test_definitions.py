"""``build_definitions`` gives every job, sensor, schedule, asset and check the console needs,
with lineage from the inputs, for one pipeline or several, and refuses what would collide."""

from __future__ import annotations

import dagster as dg
import pytest

from dbsp_pipeline import Circuit, UsageError
from dbsp_pipeline.dagster import (
    Deployment,
    KafkaResource,
    PipelineSpec,
    PipelineStore,
    build_definitions,
)
from dbsp_pipeline.examples.shop import CUSTOMERS, shop_circuit

SHOP_JOBS = {"shop_step", "shop_checkpoint", "shop_recover", "shop_restore", "shop_rescale",
             "shop_quarantine", "shop_reinject", "shop_upgrade", "shop_verify"}


def regions_circuit() -> Circuit:
    """A second pipeline, ``regions``, reading an input of the same name as the shop's."""
    c = Circuit("regions")
    c.output("known", c.input("customers", CUSTOMERS).select("region").distinct())
    return c


def test_one_pipeline_gives_every_job_sensor_schedule_and_resource(tmp_path):
    defs = build_definitions(shop_circuit(), Deployment.local(str(tmp_path)))
    dg.Definitions.validate_loadable(defs)
    assert {j.name for j in defs.resolve_all_job_defs()} - {"__ASSET_JOB"} == SHOP_JOBS
    assert {s.name for s in defs.sensors} == {"shop_input_arrival", "shop_recover_on_failure"}
    assert {s.name for s in defs.schedules} == {"shop_checkpoint_schedule"}
    assert set(defs.resources) == {"spark", "shop_pipeline"}  # no broker: no kafka resource
    store = defs.resources["shop_pipeline"]
    assert store.root == f"{tmp_path}/shop" and store.inbox_folder == str(tmp_path / "inbox")


def test_views_name_the_inputs_they_read_and_carry_checks(defs):
    graph = defs.resolve_asset_graph()
    deps = {k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
            for k in graph.get_all_asset_keys() if "inputs" not in k.path}
    assert deps == {"shop/revenue_by_region": {"shop/inputs/orders", "shop/inputs/customers"},
                    "shop/regions": {"shop/inputs/customers"},
                    "shop/idle_customers": {"shop/inputs/orders", "shop/inputs/customers"}}
    checks = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys}
    assert ("shop/regions", "matches_recomputation") in checks
    assert ("shop/regions", "positive_multiplicities") in checks
    assert len(checks) == 6


def test_several_pipelines_share_spark_and_keep_their_own_stores(tmp_path):
    deployment = Deployment.local(str(tmp_path), driver_step_rows=7)
    defs = build_definitions([shop_circuit(), PipelineSpec(regions_circuit(),
                                                           inbox=str(tmp_path / "rin"))],
                             deployment)
    dg.Definitions.validate_loadable(defs)
    assert {j.name for j in defs.resolve_all_job_defs()} - {"__ASSET_JOB"} == SHOP_JOBS | {
        j.replace("shop_", "regions_") for j in SHOP_JOBS}
    assert set(defs.resources) == {"spark", "shop_pipeline", "regions_pipeline"}
    shop, regions = defs.resources["shop_pipeline"], defs.resources["regions_pipeline"]
    assert (shop.root, regions.root) == (f"{tmp_path}/shop", f"{tmp_path}/regions")
    assert regions.inbox_folder == str(tmp_path / "rin")
    assert shop.driver_step_rows == regions.driver_step_rows == 7
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"regions/known", "regions/inputs/customers", "shop/inputs/customers"} <= keys


def test_resources_given_override_the_built_ones(tmp_path):
    other = PipelineStore(root=str(tmp_path / "elsewhere"), retain_checkpoints=5)
    defs = build_definitions(shop_circuit(), Deployment.local(str(tmp_path)),
                             resources={"shop_pipeline": other})
    assert defs.resources["shop_pipeline"] is other


def test_two_pipelines_of_one_name_are_refused(tmp_path):
    with pytest.raises(UsageError, match=r"pipeline 'shop': two pipelines of that name"):
        build_definitions([shop_circuit(), shop_circuit(extra_views=False)],
                          Deployment.local(str(tmp_path)))


def test_kafka_bindings_need_a_broker(tmp_path):
    from dbsp_pipeline.connectors.kafka import KafkaInput

    spec = PipelineSpec(shop_circuit(), kafka_inputs=[KafkaInput("orders", "shop.orders")])
    with pytest.raises(UsageError, match=r"pipeline 'shop' binds Kafka topics, but deployment "
                                         r"'local' has no Kafka broker"):
        build_definitions(spec, Deployment.local(str(tmp_path)))
    broker = KafkaResource(bootstrap_servers="127.0.0.1:1")
    defs = build_definitions(spec, Deployment.local(str(tmp_path), kafka=broker))
    assert defs.resources["kafka"] is broker


def test_a_pipeline_from_a_sql_file_shows_each_views_sql_and_lineage(tmp_path):
    script = tmp_path / "sales.sql"
    script.write_text("""
        CREATE TABLE orders (order_id BIGINT NOT NULL, customer_id BIGINT,
                             amount DECIMAL(12, 2), day DATE, placed_at TIMESTAMP);
        CREATE TABLE customers (id BIGINT NOT NULL, region STRING);
        CREATE VIEW by_region AS
          SELECT c.region, count(*) AS n, sum(o.amount) AS total
          FROM orders o JOIN customers c ON o.customer_id = c.id GROUP BY c.region;
        CREATE MATERIALIZED VIEW totals AS SELECT count(*) AS n FROM orders;
        CREATE VIEW big_regions AS SELECT region FROM by_region WHERE total > 100;
    """)
    circuit = Circuit.from_sql_file(str(script))
    assert circuit.name == "sales"
    defs = build_definitions(circuit, Deployment.local(str(tmp_path / "data")))
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    deps = {k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
            for k in graph.get_all_asset_keys() if "inputs" not in k.path}
    assert deps == {"sales/by_region": {"sales/inputs/orders", "sales/inputs/customers"},
                    "sales/totals": {"sales/inputs/orders"},
                    "sales/big_regions": {"sales/inputs/orders", "sales/inputs/customers"}}
    description = graph.get(dg.AssetKey(["sales", "big_regions"])).description or ""
    assert "```sql" in description and "total > 100" in description
    assert "by_region" in description
    orders = graph.get(dg.AssetKey(["sales", "inputs", "orders"]))
    assert "```sql" not in (orders.description or "")
    columns = orders.metadata["dagster/column_schema"].columns
    assert [(c.name, c.type, c.constraints.nullable) for c in columns] == [
        ("order_id", "bigint", False), ("customer_id", "bigint", True),
        ("amount", "decimal(12,2)", True), ("day", "date", True),
        ("placed_at", "timestamp", True)]
