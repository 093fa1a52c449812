"""``build_definitions``: the Dagster definitions of a code location's pipelines.

    import dagster as dg
    from dbsp_pipeline.dagster import Deployment, PipelineSpec, build_definitions

    defs = build_definitions([PipelineSpec(my_circuit())], Deployment.local("/data/pipelines"))

gives, per pipeline ``<name>`` (the circuit's name):

* assets: one per input (``<name>/inputs/<input>``) and one per output view (``<name>/<view>``,
  with lineage from the inputs it reads), all materialized by the step job; asset checks on
  every view (equal to recomputation from scratch; no non-positive multiplicity; ``checks.py``);
* jobs: ``<name>_step``, ``<name>_checkpoint``, ``<name>_recover``, ``<name>_restore``,
  ``<name>_rescale``, ``<name>_quarantine``, ``<name>_upgrade``, ``<name>_verify``
  (``jobs.py``);
* sensors: ``<name>_input_arrival`` and ``<name>_recover_on_failure`` (``sensors.py``);
* a schedule: ``<name>_checkpoint_schedule`` (``schedules.py``);
* resources: ``<name>_pipeline`` (``PipelineStore``), and, shared by all pipelines, ``spark``
  (``SparkResource``) and ``kafka`` (``KafkaResource``, when the deployment has a broker), from
  the ``Deployment``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dagster as dg

from dbsp_pipeline import Circuit, UsageError
from dbsp_pipeline.connectors.inbox import SETTLE_SECONDS
from dbsp_pipeline.dagster.assets import input_assets, views_asset
from dbsp_pipeline.dagster.checks import view_checks
from dbsp_pipeline.dagster.deployment import Deployment
from dbsp_pipeline.dagster.jobs import operation_jobs, step_job
from dbsp_pipeline.dagster.ref import PipelineRef
from dbsp_pipeline.dagster.schedules import checkpoint_schedule
from dbsp_pipeline.dagster.sensors import input_arrival_sensor, recover_on_failure_sensor
from dbsp_pipeline.dagster.store import PipelineStore

if TYPE_CHECKING:
    from dagster._core.definitions.unresolved_asset_job_definition import (
        UnresolvedAssetJobDefinition as AssetJob,
    )

    # the Kafka connector needs confluent-kafka (the [kafka] extra)
    from dbsp_pipeline.connectors.kafka import KafkaInput, KafkaOutput


@dataclass(frozen=True)
class PipelineSpec:
    """One pipeline of a code location: its circuit and how it is fed, kept and watched.

    ``root``: its tables ("": ``<deployment.data>/<name>``); ``inbox``: its inbox, a local
    folder ("": beside a local root, none for an ``s3://`` root). ``kafka_inputs`` /
    ``kafka_outputs``: inputs fed by and views written to Kafka, through the deployment's
    ``kafka`` resource: the step job then polls the topics and sends output in transactions,
    and the input sensor watches the topics' lag.
    ``check_views``: run the view checks in every step run (they recompute the views from
    scratch, a cost that follows the data: turn off for large pipelines and run them from the
    asset page instead). The rest are ``PipelineStore`` options and the cadences of the
    checkpoint schedule and the input sensor."""

    circuit: Circuit
    root: str = ""
    inbox: str = ""
    kafka_inputs: Sequence[KafkaInput] = ()
    kafka_outputs: Sequence[KafkaOutput] = ()
    check_views: bool = True
    checkpoint_cron: str = "*/15 * * * *"
    sensor_interval_seconds: int = 5
    retain_checkpoints: int = 2
    checkpoint_every: int = 1
    inbox_settle_seconds: float = SETTLE_SECONDS

    @property
    def name(self) -> str:
        return self.circuit.name

    def store(self, deployment: Deployment) -> PipelineStore:
        """This pipeline's store resource in ``deployment``."""
        return PipelineStore(root=self.root or f"{deployment.data.rstrip('/')}/{self.name}",
                             inbox=self.inbox, inbox_settle_seconds=self.inbox_settle_seconds,
                             retain_checkpoints=self.retain_checkpoints,
                             checkpoint_every=self.checkpoint_every,
                             driver_step_rows=deployment.driver_step_rows)


def build_definitions(pipelines: Circuit | PipelineSpec | Sequence[Circuit | PipelineSpec],
                      deployment: Deployment, *,
                      resources: Mapping[str, Any] | None = None) -> dg.Definitions:
    """The definitions of ``pipelines`` (circuits or specs; a circuit is a spec with the
    defaults) in ``deployment`` (see the module docstring). ``resources`` are added, or
    override the ones built (e.g. a ``<name>_pipeline`` store with other options).

    Refused with ``UsageError``: two pipelines of one name, and a pipeline binding Kafka topics
    when neither the deployment nor ``resources`` has a ``kafka`` resource."""
    items = [pipelines] if isinstance(pipelines, (Circuit, PipelineSpec)) else list(pipelines)
    specs = [p if isinstance(p, PipelineSpec) else PipelineSpec(p) for p in items]
    extra = dict(resources or {})
    built: dict[str, Any] = {"spark": deployment.spark}
    if deployment.kafka is not None:
        built["kafka"] = deployment.kafka
    assets: list[dg.AssetsDefinition | dg.AssetSpec] = []
    checks: list[dg.AssetChecksDefinition] = []
    jobs: list[dg.JobDefinition | AssetJob] = []
    sensors: list[dg.SensorDefinition] = []
    schedules: list[dg.ScheduleDefinition] = []
    for spec in specs:
        ref = PipelineRef(spec.circuit, kafka_inputs=spec.kafka_inputs,
                          kafka_outputs=spec.kafka_outputs)
        if ref.store_key in built:
            raise UsageError(f"pipeline {spec.name!r}: two pipelines of that name in one code "
                             "location (their assets, jobs and store would collide)")
        if ref.uses_kafka and "kafka" not in built and "kafka" not in extra:
            raise UsageError(f"pipeline {spec.name!r} binds Kafka topics, but deployment "
                             f"{deployment.name!r} has no Kafka broker: give it one "
                             "(Deployment(..., kafka=KafkaResource(...)))")
        built[ref.store_key] = spec.store(deployment)
        views = views_asset(ref)
        view_check = view_checks(ref)
        step = step_job(ref, views, view_check if spec.check_views else None)
        operations = operation_jobs(ref)  # by kind: checkpoint, recover, restore, ...
        checkpoint, recover = operations["checkpoint"], operations["recover"]
        assets += [*input_assets(ref), views]
        checks.append(view_check)
        jobs += [step, *operations.values()]
        sensors += [input_arrival_sensor(ref, step, spec.sensor_interval_seconds),
                    recover_on_failure_sensor(ref, [step, checkpoint], recover)]
        schedules.append(checkpoint_schedule(ref, checkpoint, spec.checkpoint_cron))
    return dg.Definitions(assets=assets, asset_checks=checks, jobs=jobs, sensors=sensors,
                          schedules=schedules, resources={**built, **extra})
