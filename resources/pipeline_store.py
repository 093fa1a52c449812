"""Where pipelines live, as a Dagster resource: opens the pipeline of a circuit at its root, and
names the inbox folder whose files the ``step`` job ingests."""

from __future__ import annotations

import os
from collections.abc import Sequence

import dagster as dg

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.connectors.inbox import SETTLE_SECONDS
from dbsp_pipeline.connectors.kafka import KafkaInput, KafkaOutput
from dbsp_pipeline.runtime.pipeline import DRIVER_STEP_ROWS
from dbsp_pipeline.runtime.status import PipelineStatus, read_status
from resources.spark import SparkResource


class PipelineStore(dg.ConfigurableResource):
    """The root folder of a pipeline's tables (created on first use) and its inbox.

    ``inbox`` (default ``<root>/../inbox``, i.e. beside the root) holds one folder per input;
    files dropped there (``.jsonl``, ``.csv``, ``.parquet``; a ``_weight`` column for deletes)
    are pushed by the next ``step`` run once unchanged for ``inbox_settle_seconds`` (the input
    sensor waits as long before it launches a run for them)."""

    root: str = "var/dagster/shop"
    inbox: str = ""
    #: an inbox file is read once unchanged for this long (0: every writer renames)
    inbox_settle_seconds: float = SETTLE_SECONDS
    retain_checkpoints: int = 2
    checkpoint_every: int = 1
    #: steps changing at most this many input rows run on the driver, bigger ones on Spark
    driver_step_rows: int = DRIVER_STEP_ROWS

    def open(self, circuit: Circuit, spark: SparkResource,
             checkpoint: int | None = None) -> Pipeline:
        """Open (or create, or recover) the pipeline of ``circuit`` at ``root``; with
        ``checkpoint``, at that retained checkpoint instead of the newest (a restore)."""
        return Pipeline(circuit, root=self.root, spark=spark.session(),
                        checkpoint_every=self.checkpoint_every,
                        retain_checkpoints=self.retain_checkpoints,
                        driver_step_rows=self.driver_step_rows, checkpoint=checkpoint)

    def status(self, circuit: Circuit) -> PipelineStatus:
        """What the pipeline has pending, read without opening it (no Spark, no writes)."""
        return read_status(self.root, list(circuit.inputs))

    @property
    def inbox_folder(self) -> str:
        return self.inbox or os.path.join(os.path.dirname(os.path.abspath(self.root)), "inbox")


class PipelineRef:
    """How the Dagster layer reaches one pipeline: its circuit, the key of its ``PipelineStore``
    resource, and the names it gives that pipeline's assets, jobs and run tag."""

    #: the run tag every run that opens a pipeline carries (value: the pipeline's name); the
    #: instance's run queue allows one run per value at a time (``infra/dagster.yaml``)
    TAG = "dbsp/pipeline"

    def __init__(self, circuit: Circuit, store_key: str | None = None,
                 kafka_inputs: Sequence[KafkaInput] = (),
                 kafka_outputs: Sequence[KafkaOutput] = ()) -> None:
        self.circuit = circuit
        self.name = circuit.name
        self.store_key = store_key or f"{circuit.name}_pipeline"
        #: inputs fed by, and views written to, Kafka (through the ``kafka`` resource)
        self.kafka_inputs = list(kafka_inputs)
        self.kafka_outputs = list(kafka_outputs)

    @property
    def uses_kafka(self) -> bool:
        return bool(self.kafka_inputs or self.kafka_outputs)

    @property
    def resource_keys(self) -> set[str]:
        """The resources a run of this pipeline needs."""
        return {self.store_key, "spark", *(["kafka"] if self.uses_kafka else [])}

    def store(self, context) -> PipelineStore:
        return getattr(context.resources, self.store_key)

    def view_key(self, view: str) -> dg.AssetKey:
        return dg.AssetKey([self.name, view])

    def input_key(self, name: str) -> dg.AssetKey:
        return dg.AssetKey([self.name, "inputs", name])

    def job_name(self, what: str) -> str:
        return f"{self.name}_{what}"

    @property
    def tags(self) -> dict[str, str]:
        return {self.TAG: self.name}
