"""The shop demo's deployments, by name: ``<spark>`` or ``<spark>+<kafka>``.

``<spark>`` is ``local`` (embedded defaults), ``connect`` (a Spark Connect server: URL and token
in ``DBSP_SPARK_CONNECT_URL`` / ``DBSP_SPARK_CONNECT_TOKEN``) or ``standalone`` (a standalone
master: ``DBSP_SPARK_MASTER``); see ``dbsp_pipeline.dagster.Deployment``. ``+kafka`` feeds the
shop from the broker in ``DBSP_KAFKA_BOOTSTRAP`` too (plaintext, like the local broker of
``infra/kafka_broker.sh``); ``+kafka-sasl`` also authenticates with ``DBSP_KAFKA_USER`` /
``DBSP_KAFKA_PASSWORD``, over TLS (``SASL_SSL``). Every variable is read by Dagster in the
process that uses it (``dg.EnvVar``), never when the code location loads.
"""

from __future__ import annotations

import dagster as dg

from dbsp_pipeline import UsageError
from dbsp_pipeline.dagster import Deployment, KafkaResource

#: the Kafka parts of a deployment name, and the broker each gives
KAFKA = {
    "kafka": lambda: KafkaResource(bootstrap_servers=dg.EnvVar("DBSP_KAFKA_BOOTSTRAP")),
    "kafka-sasl": lambda: KafkaResource(bootstrap_servers=dg.EnvVar("DBSP_KAFKA_BOOTSTRAP"),
                                        sasl_username=dg.EnvVar("DBSP_KAFKA_USER"),
                                        sasl_password=dg.EnvVar("DBSP_KAFKA_PASSWORD")),
}


def shop_deployment(name: str, data: str) -> Deployment:
    """The deployment called ``name`` (see the module docstring), its pipelines under ``data``."""
    spark, _, kafka = name.partition("+")
    if kafka and kafka not in KAFKA:
        raise UsageError(f"deployment {name!r}: no Kafka part {kafka!r}; expected one of "
                         f"{', '.join(KAFKA)}")
    return Deployment.named(spark, data, kafka=KAFKA[kafka]() if kafka else None)
