"""How the Dagster layer names one pipeline: its circuit, the key of its ``PipelineStore``
resource, its Kafka bindings, and the names of its assets, jobs and run tag. Every builder
(``assets.py``, ``checks.py``, ``jobs.py``, ``sensors.py``, ``schedules.py``) takes one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import dagster as dg

from dbsp_pipeline import Circuit
from dbsp_pipeline.dagster.store import PipelineStore

if TYPE_CHECKING:  # the Kafka connector needs confluent-kafka (the [kafka] extra)
    from dbsp_pipeline.connectors.kafka import KafkaInput, KafkaOutput

#: the run tag every run that opens a pipeline carries (value: the pipeline's name); the
#: instance's run queue allows one run per value at a time (``infra/dagster.yaml``)
RUN_TAG = "dbsp/pipeline"


class PipelineRef:
    """One pipeline as the Dagster layer sees it. Names: assets ``<name>/<view>`` and
    ``<name>/inputs/<input>``, jobs and sensors ``<name>_<what>``, the store resource
    ``<name>_pipeline`` (unless ``store_key`` names another)."""

    TAG = RUN_TAG

    def __init__(self, circuit: Circuit, store_key: str | None = None,
                 kafka_inputs: Sequence[KafkaInput] = (),
                 kafka_outputs: Sequence[KafkaOutput] = ()) -> None:
        self.circuit = circuit
        self.name: str = circuit.name
        self.store_key: str = store_key or f"{circuit.name}_pipeline"
        #: inputs fed by, and views written to, Kafka (through the ``kafka`` resource)
        self.kafka_inputs: list[KafkaInput] = list(kafka_inputs)
        self.kafka_outputs: list[KafkaOutput] = list(kafka_outputs)

    @property
    def uses_kafka(self) -> bool:
        return bool(self.kafka_inputs or self.kafka_outputs)

    @property
    def resource_keys(self) -> set[str]:
        """The resources a run of this pipeline needs."""
        return {self.store_key, "spark", *(["kafka"] if self.uses_kafka else [])}

    def store(self, context: Any) -> PipelineStore:
        """This pipeline's store, from a run's or a sensor's ``context``."""
        store: PipelineStore = getattr(context.resources, self.store_key)
        return store

    def view_key(self, view: str) -> dg.AssetKey:
        return dg.AssetKey([self.name, view])

    def input_key(self, name: str) -> dg.AssetKey:
        return dg.AssetKey([self.name, "inputs", name])

    def job_name(self, what: str) -> str:
        return f"{self.name}_{what}"

    @property
    def tags(self) -> dict[str, str]:
        return {RUN_TAG: self.name}
