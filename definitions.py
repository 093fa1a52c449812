"""The Dagster code location of dbsp-pipeline: the shop demo pipeline.

Resources are chosen per deployment through environment variables, defaulting to the embedded
ones (local Spark, Delta tables under ``var/dagster``):

* ``DBSP_ROOT``: where the pipeline's tables live (default ``var/dagster/shop``); its inbox is
  ``DBSP_INBOX`` (default: ``inbox`` beside the root). ``DBSP_DRIVER_STEP_ROWS``: steps
  changing more input rows than this run on Spark (default 200000; 0: every step).
* ``DBSP_SPARK_MODE``: ``local`` (default), ``connect`` (``DBSP_SPARK_CONNECT_URL``, default
  ``sc://127.0.0.1:15002``) or ``standalone`` (``DBSP_SPARK_MASTER``).
* ``DBSP_KAFKA_BOOTSTRAP``: when set, the demo is fed by Kafka too: topics ``shop.orders`` and
  ``shop.customers`` (JSON) feed the inputs, and the views go to ``shop.<view>`` (with
  ``shop.<view>.steps``). For a secured broker, ``DBSP_KAFKA_USER`` / ``DBSP_KAFKA_PASSWORD``
  (read through ``dg.EnvVar``, never stored in configuration).
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


def _kafka() -> KafkaResource:
    if os.environ.get("DBSP_KAFKA_USER"):
        return KafkaResource(bootstrap_servers=dg.EnvVar("DBSP_KAFKA_BOOTSTRAP"),
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                             sasl_username=dg.EnvVar("DBSP_KAFKA_USER"),
                             sasl_password=dg.EnvVar("DBSP_KAFKA_PASSWORD"))
    return KafkaResource(bootstrap_servers=os.environ.get("DBSP_KAFKA_BOOTSTRAP",
                                                          "127.0.0.1:9092"))


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
        master=os.environ.get("DBSP_SPARK_MASTER", "spark://127.0.0.1:7077")),
    resources={"kafka": _kafka()},
)
