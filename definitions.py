"""The Dagster code location of dbsp-pipeline: the shop demo pipeline.

Resources are chosen per deployment through environment variables, defaulting to the embedded
ones (local Spark, Delta tables under ``var/dagster``):

* ``DBSP_ROOT``: where the pipeline's tables live (default ``var/dagster/shop``); its inbox is
  ``DBSP_INBOX`` (default: ``inbox`` beside the root). ``DBSP_DRIVER_STEP_ROWS``: steps
  changing more input rows than this run on Spark (default 200000; 0: every step).
* ``DBSP_SPARK_MODE``: ``local`` (default), ``connect`` (``DBSP_SPARK_CONNECT_URL``, default
  ``sc://127.0.0.1:15002``, and ``DBSP_SPARK_CONNECT_TOKEN``, the server's token: the content of
  the ``spark-connect.token`` file ``infra/spark_connect.sh`` writes) or ``standalone``
  (``DBSP_SPARK_MASTER``).
* ``DBSP_KAFKA_BOOTSTRAP``: when set, the demo is fed by Kafka too: topics ``shop.orders`` and
  ``shop.customers`` (JSON) feed the inputs, and the views go to ``shop.<view>`` (with
  ``shop.<view>.steps``). For a secured broker, ``DBSP_KAFKA_USER`` / ``DBSP_KAFKA_PASSWORD``
  (read through ``dg.EnvVar``, never stored in configuration), sent over ``SASL_SSL`` unless
  ``DBSP_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT`` chooses plaintext. Without credentials the
  protocol is ``PLAINTEXT`` (the local broker) or ``SSL``.
"""

from __future__ import annotations

import os

import dagster as dg

from dbsp_pipeline.connectors.kafka import KafkaInput, KafkaOutput
from dbsp_pipeline.examples.shop import shop_circuit
from dbsp_pipeline.runtime.pipeline import DRIVER_STEP_ROWS
from pipeline_definitions import build_definitions
from resources.kafka import KafkaResource
from resources.pipeline_store import PipelineStore
from resources.spark import SparkResource


#: ``DBSP_KAFKA_SECURITY_PROTOCOL`` values, with credentials (the first is the default) and without
SASL_PROTOCOLS = ("SASL_SSL", "SASL_PLAINTEXT")
PLAIN_PROTOCOLS = ("PLAINTEXT", "SSL")


def kafka_resource() -> KafkaResource:
    """The ``kafka`` resource of this deployment, from the environment (see the module
    docstring). Credentials go over TLS unless plaintext is chosen by name."""
    chosen = os.environ.get("DBSP_KAFKA_SECURITY_PROTOCOL", "").strip().upper()
    if os.environ.get("DBSP_KAFKA_USER"):
        protocol = chosen or SASL_PROTOCOLS[0]
        if protocol not in SASL_PROTOCOLS:
            raise ValueError(f"DBSP_KAFKA_SECURITY_PROTOCOL={chosen!r} with DBSP_KAFKA_USER set: "
                             f"credentials need one of {', '.join(SASL_PROTOCOLS)}")
        return KafkaResource(bootstrap_servers=dg.EnvVar("DBSP_KAFKA_BOOTSTRAP"),
                             security_protocol=protocol, sasl_mechanism="PLAIN",
                             sasl_username=dg.EnvVar("DBSP_KAFKA_USER"),
                             sasl_password=dg.EnvVar("DBSP_KAFKA_PASSWORD"))
    protocol = chosen or PLAIN_PROTOCOLS[0]
    if protocol not in PLAIN_PROTOCOLS:
        raise ValueError(f"DBSP_KAFKA_SECURITY_PROTOCOL={chosen!r} without DBSP_KAFKA_USER: "
                         f"expected one of {', '.join(PLAIN_PROTOCOLS)} (SASL needs credentials)")
    return KafkaResource(bootstrap_servers=os.environ.get("DBSP_KAFKA_BOOTSTRAP",
                                                          "127.0.0.1:9092"),
                         security_protocol=protocol)


ROOT = os.environ.get("DBSP_ROOT", "var/dagster/shop")
CIRCUIT = shop_circuit()
KAFKA = bool(os.environ.get("DBSP_KAFKA_BOOTSTRAP"))

defs = build_definitions(
    CIRCUIT,
    root=ROOT,
    kafka_inputs=[KafkaInput(name, f"shop.{name}") for name in CIRCUIT.inputs] if KAFKA else [],
    kafka_outputs=[KafkaOutput(view, f"shop.{view}") for view in CIRCUIT.outputs] if KAFKA
    else [],
    store=PipelineStore(root=ROOT, inbox=os.environ.get("DBSP_INBOX", ""),
                        driver_step_rows=int(os.environ.get("DBSP_DRIVER_STEP_ROWS",
                                                            DRIVER_STEP_ROWS))),
    spark=SparkResource(
        mode=os.environ.get("DBSP_SPARK_MODE", "local"),
        connect_url=os.environ.get("DBSP_SPARK_CONNECT_URL", "sc://127.0.0.1:15002"),
        connect_token=(dg.EnvVar("DBSP_SPARK_CONNECT_TOKEN")
                       if os.environ.get("DBSP_SPARK_CONNECT_TOKEN") else ""),
        master=os.environ.get("DBSP_SPARK_MASTER", "spark://127.0.0.1:7077")),
    resources={"kafka": kafka_resource()},
)
