"""Sensors that keep a pipeline moving.

* ``<name>_input_arrival``: launches the step job when input waits: pushes not yet divided into
  a step (read from the logs without opening the pipeline, ``dbsp_pipeline.read_status``),
  complete files in the inbox (unchanged for the store's ``inbox_settle_seconds``), or records
  in the bound Kafka topics beyond the offsets the input logs recorded (lag). Never while a run
  of the pipeline is queued or in progress; the run key names the step range (next step and
  input versions, plus inbox files and topic offsets), so the same work is never launched
  twice. The cursor remembers the last key launched.
* ``<name>_recover_on_failure``: when a run of the pipeline fails, launches the recover job
  (run key: the failed run's id).
"""

# no ``from __future__ import annotations``: Dagster reads the decorated functions' annotations
import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import dagster as dg

from dbsp_pipeline.connectors import inbox
from dbsp_pipeline.dagster.ref import PipelineRef

if TYPE_CHECKING:  # what define_asset_job returns (Dagster does not export its name)
    from dagster._core.definitions.unresolved_asset_job_definition import (
        UnresolvedAssetJobDefinition as AssetJob,
    )

#: Run statuses during which a pipeline is busy.
ACTIVE = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
          dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
          dg.DagsterRunStatus.CANCELING]


def active_runs(instance: dg.DagsterInstance, ref: PipelineRef) -> Sequence[dg.DagsterRun]:
    """Up to five runs of ``ref``'s pipeline that are queued or in progress."""
    return instance.get_runs(filters=dg.RunsFilter(tags=ref.tags, statuses=ACTIVE), limit=5)


def input_arrival_sensor(ref: PipelineRef, step_job: "AssetJob",
                         interval: int = 5) -> dg.SensorDefinition:
    """``<name>_input_arrival`` (see the module docstring), evaluated every ``interval`` s."""
    keys = {ref.store_key, *(["kafka"] if ref.kafka_inputs else [])}

    @dg.sensor(name=ref.job_name("input_arrival"), job=step_job,
               minimum_interval_seconds=interval, required_resource_keys=keys,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description=f"start a step of '{ref.name}' when input arrives")
    def sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason | dg.RunRequest:
        store = ref.store(context)
        status = store.status(ref.circuit)
        folder = store.inbox_folder
        files = {} if folder is None else inbox.pending_files(
            folder, list(ref.circuit.inputs), store.inbox_settle_seconds)
        lag = _kafka_lag(ref, context, store.root)
        if not status.has_pending_input and not files and not any(lag.values()):
            return dg.SkipReason("no input waits")
        busy = active_runs(context.instance, ref)
        if busy:
            return dg.SkipReason(f"run {busy[0].run_id} of pipeline '{ref.name}' is active")
        key = status.run_key(ref.name)
        if files:  # named by the files and when they arrived (a name may come again)
            arrivals = {n: [(f.name, f.mtime) for f in fs] for n, fs in files.items()}
            key += ":inbox-" + _digest(arrivals)
        if any(lag.values()):  # named by how far the topics reach
            key += ":kafka-" + _digest(lag)
        if context.cursor == key:
            return dg.SkipReason(f"already launched {key}")
        context.update_cursor(key)
        return dg.RunRequest(run_key=key, tags={
            **ref.tags, "dbsp/from_step": str(status.divided_steps),
            "dbsp/pending_pushes": str(sum(status.pending.values())),
            "dbsp/inbox_files": str(sum(len(f) for f in files.values())),
            "dbsp/kafka_lag": str(sum(lag.values()))})

    return sensor


def recover_on_failure_sensor(ref: PipelineRef,
                              monitored: "Sequence[dg.JobDefinition | AssetJob]",
                              recover_job: dg.JobDefinition) -> dg.SensorDefinition:
    """``<name>_recover_on_failure``: a failed run of a ``monitored`` job launches
    ``recover_job``, once per failed run."""
    @dg.run_failure_sensor(name=ref.job_name("recover_on_failure"), monitored_jobs=monitored,
                           request_job=recover_job,
                           default_status=dg.DefaultSensorStatus.RUNNING,
                           description=f"recover '{ref.name}' after a failed run")
    def sensor(context: dg.RunFailureSensorContext) -> Iterator[dg.RunRequest]:
        failed = context.dagster_run
        yield dg.RunRequest(run_key=f"recover-after-{failed.run_id}",
                            tags={**ref.tags, "dbsp/failed_run": failed.run_id})

    return sensor


def _kafka_lag(ref: PipelineRef, context: dg.SensorEvaluationContext,
               root: str) -> dict[str, int]:
    """Per bound topic partition, the records beyond the offsets the input logs recorded."""
    if not ref.kafka_inputs:
        return {}
    from dbsp_pipeline.connectors.kafka import topic_lag

    return topic_lag(context.resources.kafka.client_config(), root, ref.kafka_inputs)


def _digest(value: object) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]
