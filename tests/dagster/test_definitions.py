"""The code location loads and ``build_definitions`` gives every job, sensor, schedule, asset
and check the console needs, with lineage from the inputs."""

from __future__ import annotations

import dagster as dg

from dbsp_pipeline.examples.shop import shop_circuit


def test_code_location_loads():
    from definitions import defs

    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == {f"shop/{v}" for v in shop_circuit().outputs} | {
        "shop/inputs/orders", "shop/inputs/customers"}
    assert {j.name for j in defs.resolve_all_job_defs()} >= {
        "shop_step", "shop_checkpoint", "shop_recover", "shop_restore", "shop_rescale",
        "shop_upgrade"}
    assert {s.name for s in defs.sensors} == {"shop_input_arrival", "shop_recover_on_failure"}
    assert {s.name for s in defs.schedules} == {"shop_checkpoint_schedule"}
    assert {"spark", "shop_pipeline", "kafka"} <= set(defs.resources)


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


def test_secrets_come_from_the_environment(monkeypatch):
    from resources.kafka import KafkaResource

    monkeypatch.setenv("SECRET_PW", "s3cret")
    res = KafkaResource(bootstrap_servers="127.0.0.1:1", sasl_mechanism="PLAIN",
                        sasl_username="u", sasl_password=dg.EnvVar("SECRET_PW"))
    # EnvVar is resolved when the resource is initialised for a run, not stored as text
    assert res.process_config_and_initialize().client_config()["sasl.password"] == "s3cret"
