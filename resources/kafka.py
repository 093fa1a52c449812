"""Kafka client configuration as a Dagster resource.

Secrets never sit in plain configuration: give them as ``dg.EnvVar("NAME")`` (Dagster reads the
variable in the run process and masks it in the UI), e.g.::

    KafkaResource(bootstrap_servers=dg.EnvVar("DBSP_KAFKA_BOOTSTRAP"),
                  security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                  sasl_username=dg.EnvVar("DBSP_KAFKA_USER"),
                  sasl_password=dg.EnvVar("DBSP_KAFKA_PASSWORD"))
"""

from __future__ import annotations

import dagster as dg


class KafkaResource(dg.ConfigurableResource):
    """Where the broker is and how to authenticate; ``client_config()`` is the librdkafka map."""

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = ""
    #: further librdkafka settings (no secrets here: they would show in the UI)
    extra: dict[str, str] = {}

    def client_config(self) -> dict[str, str]:
        config = {"bootstrap.servers": self.bootstrap_servers,
                  "security.protocol": self.security_protocol, **self.extra}
        if self.sasl_mechanism:
            config["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            config["sasl.username"] = self.sasl_username
            config["sasl.password"] = self.sasl_password
        return config
