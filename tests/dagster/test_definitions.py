"""The code location loads and ``build_definitions`` gives every job, sensor, schedule, asset
and check the console needs, with lineage from the inputs."""

from __future__ import annotations

import socket

import dagster as dg
import pytest

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


def first_bytes_a_client_sends(monkeypatch, env: dict[str, str]) -> bytes:
    """What a Kafka client built from the deployment's ``kafka`` resource (``env`` set) sends
    first to its broker: a real librdkafka client connecting to a listening socket."""
    from confluent_kafka import Producer

    from definitions import kafka_resource

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(20)
        for name, value in {**env, "DBSP_KAFKA_BOOTSTRAP":
                            f"127.0.0.1:{server.getsockname()[1]}"}.items():
            monkeypatch.setenv(name, value)
        config = kafka_resource().process_config_and_initialize().client_config()
        producer = Producer(config)  # connects to the bootstrap server at once
        conn, _ = server.accept()
        with conn:
            conn.settimeout(20)
            data = conn.recv(4096)
        del producer
    return data


CREDENTIALS = {"DBSP_KAFKA_USER": "dbsp", "DBSP_KAFKA_PASSWORD": "pw-in-the-clear?"}


def test_kafka_credentials_go_over_tls_by_default(monkeypatch):
    monkeypatch.delenv("DBSP_KAFKA_SECURITY_PROTOCOL", raising=False)
    sent = first_bytes_a_client_sends(monkeypatch, CREDENTIALS)
    assert sent[:1] == b"\x16"  # a TLS handshake record (the ClientHello)
    assert b"pw-in-the-clear?" not in sent and b"dbsp" not in sent


def test_kafka_plaintext_credentials_only_when_chosen(monkeypatch):
    sent = first_bytes_a_client_sends(
        monkeypatch, {**CREDENTIALS, "DBSP_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})
    assert sent[:1] != b"\x16" and b"rdkafka" in sent  # a Kafka request in the clear


@pytest.mark.parametrize("env, match", [
    ({**CREDENTIALS, "DBSP_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"},
     r"DBSP_KAFKA_SECURITY_PROTOCOL='PLAINTEXT' with DBSP_KAFKA_USER set: credentials need one "
     r"of SASL_SSL, SASL_PLAINTEXT"),
    ({"DBSP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, r"without DBSP_KAFKA_USER.*SASL needs"),
])
def test_kafka_security_protocol_must_fit_the_credentials(monkeypatch, env, match):
    from definitions import kafka_resource

    monkeypatch.delenv("DBSP_KAFKA_USER", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        kafka_resource()
