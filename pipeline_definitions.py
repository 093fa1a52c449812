"""``build_definitions``: the Dagster definitions of one pipeline, for any circuit.

    from pipeline_definitions import build_definitions
    defs = build_definitions(my_circuit(), root="/data/my_pipeline")

returns a ``dg.Definitions`` with:

* assets: one per input (``<name>/inputs/<input>``) and one per output view (``<name>/<view>``,
  with lineage from the inputs it reads), all materialized by the step job; asset checks on
  every view (equal to recomputation from scratch; no non-positive multiplicity);
* jobs: ``<name>_step``, ``<name>_checkpoint``, ``<name>_recover``, ``<name>_restore``,
  ``<name>_rescale``, ``<name>_quarantine``, ``<name>_upgrade``, ``<name>_verify`` (``jobs/pipeline_jobs.py``);
* sensors: ``<name>_input_arrival`` and ``<name>_recover_on_failure`` (``sensors/``);
* a schedule: ``<name>_checkpoint_schedule`` (``schedules/``);
* resources: ``spark`` (``SparkResource``) and ``<name>_pipeline`` (``PipelineStore``).

Several pipelines in one code location: ``dg.Definitions.merge`` of one call per circuit (each
has its own store resource; give them the same ``spark``).
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from assets.checks import view_checks
from assets.views import input_assets, views_asset
from dbsp_pipeline import Circuit
from dbsp_pipeline.connectors.kafka import KafkaInput, KafkaOutput
from jobs.pipeline_jobs import operation_jobs, step_job
from resources.pipeline_store import PipelineRef, PipelineStore
from resources.spark import SparkResource
from schedules.pipeline_schedules import checkpoint_schedule
from sensors.pipeline_sensors import input_arrival_sensor, recover_on_failure_sensor


def build_definitions(circuit: Circuit, root: str, *, spark: SparkResource | None = None,
                      inbox: str = "", store: PipelineStore | None = None,
                      kafka_inputs: Sequence[KafkaInput] = (),
                      kafka_outputs: Sequence[KafkaOutput] = (),
                      check_views: bool = True,
                      checkpoint_cron: str = "*/15 * * * *",
                      sensor_interval_seconds: int = 5,
                      resources: dict | None = None) -> dg.Definitions:
    """The definitions of the pipeline of ``circuit`` stored at ``root``.

    ``kafka_inputs``/``kafka_outputs``: inputs fed by and views written to Kafka, through the
    ``kafka`` resource (``KafkaResource``, given in ``resources``): the step job then polls the
    topics and sends output in transactions, and the input sensor watches the topics' lag.
    ``store``: the pipeline store with options (retention, ``driver_step_rows``); by default
    one at ``root`` with ``inbox``. ``check_views``: run the view checks in every step run (they recompute the views from
    scratch, a cost that follows the data: turn off for large pipelines and run them from the
    asset page or a schedule instead). ``resources`` are added or override the defaults.
    """
    ref = PipelineRef(circuit, kafka_inputs=kafka_inputs, kafka_outputs=kafka_outputs)
    views = views_asset(ref)
    checks = view_checks(ref)
    step = step_job(ref, views, checks if check_views else None)
    operations = operation_jobs(ref)  # by kind: checkpoint, recover, restore, ...
    checkpoint, recover = operations["checkpoint"], operations["recover"]
    return dg.Definitions(
        assets=[*input_assets(ref), views],
        asset_checks=[checks],
        jobs=[step, *operations.values()],
        sensors=[input_arrival_sensor(ref, step, sensor_interval_seconds),
                 recover_on_failure_sensor(ref, [step, checkpoint], recover)],
        schedules=[checkpoint_schedule(ref, checkpoint, checkpoint_cron)],
        resources={"spark": spark or SparkResource(),
                   ref.store_key: store or PipelineStore(root=root, inbox=inbox),
                   **(resources or {})},
    )
