"""The repository's code location (``workspace.yaml``: ``definitions.py``, ``assets/``,
``resources/``): the shop demo built on ``dbsp_pipeline.dagster``, in a deployment chosen by
name."""

from __future__ import annotations

import dagster as dg
import pytest

from dbsp_pipeline import UsageError
from dbsp_pipeline.examples.shop import shop_circuit


def test_the_shop_code_location_loads(monkeypatch):
    monkeypatch.delenv("DBSP_DEPLOYMENT", raising=False)
    from definitions import defs

    dg.Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {f"shop/{v}" for v in shop_circuit().outputs} | {
        "shop/inputs/orders", "shop/inputs/customers"}
    assert {j.name for j in defs.resolve_all_job_defs()} >= {
        "shop_step", "shop_checkpoint", "shop_recover", "shop_restore", "shop_rescale",
        "shop_quarantine", "shop_upgrade", "shop_verify"}
    assert {s.name for s in defs.sensors} == {"shop_input_arrival", "shop_recover_on_failure"}
    assert {s.name for s in defs.schedules} == {"shop_checkpoint_schedule"}
    assert set(defs.resources) == {"spark", "shop_pipeline"}


def test_a_kafka_deployment_feeds_the_shop_from_its_topics(tmp_path, monkeypatch):
    from definitions import shop_definitions
    from resources.deployments import shop_deployment

    deployment = shop_deployment("connect+kafka-sasl", str(tmp_path))
    assert deployment.spark.mode == "connect"
    defs = shop_definitions(deployment)
    dg.Definitions.validate_loadable(defs)
    assert defs.resources["kafka"] is deployment.kafka
    sensor = next(s for s in defs.sensors if s.name == "shop_input_arrival")
    assert "kafka" in sensor.required_resource_keys

    for name, value in {"DBSP_KAFKA_BOOTSTRAP": "127.0.0.1:1", "DBSP_KAFKA_USER": "u",
                        "DBSP_KAFKA_PASSWORD": "p"}.items():
        monkeypatch.setenv(name, value)
    config = deployment.kafka.process_config_and_initialize().client_config()
    assert (config["bootstrap.servers"], config["security.protocol"]) == (
        "127.0.0.1:1", "SASL_SSL")
    plain = shop_deployment("local+kafka", str(tmp_path)).kafka
    assert plain.process_config_and_initialize().client_config()["security.protocol"] == \
        "PLAINTEXT"


@pytest.mark.parametrize("name, match", [
    ("cluster", r"deployment 'cluster': no such deployment; expected one of local, connect"),
    ("local+mq", r"deployment 'local\+mq': no Kafka part 'mq'; expected one of kafka, "
                 r"kafka-sasl"),
])
def test_unknown_deployment_names_are_refused(tmp_path, name, match):
    from resources.deployments import shop_deployment

    with pytest.raises(UsageError, match=match):
        shop_deployment(name, str(tmp_path))
