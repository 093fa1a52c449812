"""Kafka client configuration as a Dagster resource.

Secrets never sit in plain configuration: give them as ``dg.EnvVar("NAME")`` (Dagster reads the
variable in the run process and masks it in the UI), e.g.::

    KafkaResource(bootstrap_servers=dg.EnvVar("DBSP_KAFKA_BOOTSTRAP"),
                  sasl_username=dg.EnvVar("DBSP_KAFKA_USER"),
                  sasl_password=dg.EnvVar("DBSP_KAFKA_PASSWORD"))

Credentials go over TLS (``SASL_SSL``) unless ``security_protocol="SASL_PLAINTEXT"`` chooses
plaintext by name; without credentials the protocol is ``PLAINTEXT`` (a local broker) or
``SSL``. A protocol that does not fit the credentials is refused when the resource is built.
"""

from __future__ import annotations

import dagster as dg
import pydantic

#: protocols with credentials (the first is the default) and without (likewise)
SASL_PROTOCOLS = ("SASL_SSL", "SASL_PLAINTEXT")
PLAIN_PROTOCOLS = ("PLAINTEXT", "SSL")


class KafkaResource(dg.ConfigurableResource):  # type: ignore[type-arg]  # its value is itself
    """Where the broker is and how to authenticate; ``client_config()`` is the librdkafka map."""

    bootstrap_servers: str = "127.0.0.1:9092"
    #: "" chooses by the credentials: ``SASL_SSL`` with ``sasl_username``, else ``PLAINTEXT``
    security_protocol: str = ""
    #: with credentials: the SASL mechanism ("" means ``PLAIN``)
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = ""
    #: further librdkafka settings (no secrets here: they would show in the UI)
    extra: dict[str, str] = {}

    @pydantic.model_validator(mode="after")
    def _protocol_fits_the_credentials(self) -> KafkaResource:
        chosen = self.security_protocol.strip().upper()
        if not chosen:
            return self
        if self.sasl_username and chosen not in SASL_PROTOCOLS:
            raise ValueError(f"KafkaResource security_protocol={chosen!r} with sasl_username "
                             f"set: credentials need one of {', '.join(SASL_PROTOCOLS)}")
        if not self.sasl_username and chosen not in PLAIN_PROTOCOLS:
            raise ValueError(f"KafkaResource security_protocol={chosen!r} without "
                             f"sasl_username: expected one of {', '.join(PLAIN_PROTOCOLS)} "
                             "(SASL needs credentials)")
        return self

    @property
    def protocol(self) -> str:
        """The security protocol the clients use (see the module docstring)."""
        chosen = self.security_protocol.strip().upper()
        if chosen:
            return chosen
        return SASL_PROTOCOLS[0] if self.sasl_username else PLAIN_PROTOCOLS[0]

    def client_config(self) -> dict[str, str]:
        """The librdkafka configuration of a client of this broker."""
        config = {"bootstrap.servers": self.bootstrap_servers,
                  "security.protocol": self.protocol, **self.extra}
        if self.sasl_username:
            config["sasl.mechanism"] = self.sasl_mechanism or "PLAIN"
            config["sasl.username"] = self.sasl_username
            config["sasl.password"] = self.sasl_password
        elif self.sasl_mechanism:
            config["sasl.mechanism"] = self.sasl_mechanism
        return config
