"""``KafkaResource``: secrets through ``dg.EnvVar``, credentials over TLS unless plaintext is
chosen by name, and a protocol that does not fit the credentials refused when built. A real
librdkafka client shows what goes on the wire."""

from __future__ import annotations

import socket

import dagster as dg
import pytest

from dbsp_pipeline.dagster import KafkaResource


def test_secrets_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("SECRET_PW", "s3cret")
    res = KafkaResource(bootstrap_servers="127.0.0.1:1", sasl_username="u",
                        sasl_password=dg.EnvVar("SECRET_PW"))
    assert res.sasl_password == "SECRET_PW"  # the variable's name until a run resolves it
    config = res.process_config_and_initialize().client_config()
    assert config["sasl.password"] == "s3cret" and config["sasl.mechanism"] == "PLAIN"


def first_bytes_a_client_sends(resource: KafkaResource) -> bytes:
    """What a Kafka client configured by ``resource`` (its bootstrap server replaced by a
    listening socket) sends first to its broker."""
    from confluent_kafka import Producer

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(20)
        config = resource.process_config_and_initialize().client_config()
        producer = Producer({**config,  # connects to the bootstrap server at once
                             "bootstrap.servers": f"127.0.0.1:{server.getsockname()[1]}"})
        conn, _ = server.accept()
        with conn:
            conn.settimeout(20)
            data = conn.recv(4096)
        del producer
    return data


def credentials(monkeypatch, **options: str) -> KafkaResource:
    monkeypatch.setenv("DBSP_KAFKA_USER", "dbsp")
    monkeypatch.setenv("DBSP_KAFKA_PASSWORD", "pw-in-the-clear?")
    return KafkaResource(sasl_username=dg.EnvVar("DBSP_KAFKA_USER"),
                         sasl_password=dg.EnvVar("DBSP_KAFKA_PASSWORD"), **options)


def test_credentials_go_over_tls_by_default(monkeypatch):
    sent = first_bytes_a_client_sends(credentials(monkeypatch))
    assert sent[:1] == b"\x16"  # a TLS handshake record (the ClientHello)
    assert b"pw-in-the-clear?" not in sent and b"dbsp" not in sent


def test_plaintext_credentials_only_when_chosen(monkeypatch):
    sent = first_bytes_a_client_sends(credentials(monkeypatch,
                                                  security_protocol="SASL_PLAINTEXT"))
    assert sent[:1] != b"\x16" and b"rdkafka" in sent  # a Kafka request in the clear


@pytest.mark.parametrize("options, match", [
    ({"sasl_username": "dbsp", "security_protocol": "PLAINTEXT"},
     r"security_protocol='PLAINTEXT' with sasl_username set: credentials need one of "
     r"SASL_SSL, SASL_PLAINTEXT"),
    ({"security_protocol": "SASL_SSL"}, r"security_protocol='SASL_SSL' without sasl_username"
                                        r".*SASL needs credentials"),
])
def test_a_protocol_must_fit_the_credentials(options, match):
    with pytest.raises(Exception, match=match):
        KafkaResource(bootstrap_servers="127.0.0.1:1", **options)
