"""A pipeline's inputs and output views as Dagster assets.

Each input is an asset of its own (its log, a Delta table under ``<root>/inputs``, written by
pushes, not by Dagster) and each output view is an asset (its change log under
``<root>/outputs``) whose lineage names the inputs it is computed from. One multi-asset, the
pipeline's step, materializes every view: it ingests the inbox (and polls the Kafka inputs),
executes steps while input is pending (bounded by ``max_steps`` and ``max_seconds``), commits,
and records per view the step, the rows of the view, the rows changed and the lag from the
oldest input's arrival. Everything it reports was committed before it is reported.

Every asset carries its columns and their Spark types (``dagster/column_schema``): an input's
from its declaration, a view's from the circuit's analysis, with each materialization.
"""

# no ``from __future__ import annotations``: Dagster reads the decorated functions' annotations
import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
from pyspark.sql.types import StructType

from dbsp_pipeline import Pipeline, StepResult
from dbsp_pipeline.connectors import inbox
from dbsp_pipeline.dagster.ref import PipelineRef
from dbsp_pipeline.runtime.results import operator_summary, phase_summary
from dbsp_pipeline.sql.catalog import ddl_column_types

#: the metadata key under which Dagster shows an asset's columns
COLUMN_SCHEMA = "dagster/column_schema"


def column_schema(columns: list[tuple[str, str, bool]]) -> dg.TableSchema:
    """Columns as (name, Spark type, nullable) → the table schema Dagster shows."""
    return dg.TableSchema(columns=[
        dg.TableColumn(name, type_, constraints=dg.TableColumnConstraints(nullable=nullable))
        for name, type_, nullable in columns])


def struct_columns(schema: StructType) -> list[tuple[str, str, bool]]:
    return [(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields]


class StepConfig(dg.Config):
    """Bounds of one step run: it stops when no input is pending, or at either bound."""

    max_steps: int = 100
    max_seconds: float = 120.0
    #: with Kafka inputs: stop once no record came for this long
    kafka_idle_seconds: float = 1.0


def input_assets(ref: PipelineRef) -> list[dg.AssetSpec]:
    """The inputs, as assets written outside Dagster (pushes, the inbox, Kafka); each step run
    observes what its steps read of them (``views_asset``)."""
    schemas = ref.circuit.input_schemas
    return [dg.AssetSpec(ref.input_key(name), group_name=ref.name, kinds={"delta"},
                         description=f"input '{name}' of pipeline '{ref.name}' ({schemas[name]}): "
                                     "its durable log, written by pushes (the inbox, "
                                     "Kafka, the API); each step run observes the rows its "
                                     "steps read and the log version they read up to",
                         metadata={COLUMN_SCHEMA: column_schema(
                             ddl_column_types(schemas[name]))})
            for name in ref.circuit.inputs]


def _view_description(ref: PipelineRef, view: str) -> str:
    """What the asset page says of ``view``: whose output it is, and its SQL when it was
    declared in SQL (Markdown)."""
    text = f"output view '{view}' of pipeline '{ref.name}'"
    sql = ref.circuit.sql_texts.get(view)
    if sql is not None:
        text += f", maintained incrementally from:\n\n```sql\n{sql}\n```"
    return text


def views_asset(ref: PipelineRef) -> dg.AssetsDefinition:
    """The multi-asset whose materialization is a step run of the pipeline."""
    circuit = ref.circuit
    specs = [dg.AssetSpec(ref.view_key(view), group_name=ref.name, kinds={"spark", "delta"},
                          deps=[ref.input_key(i) for i in circuit.inputs_of(view)],
                          skippable=True, description=_view_description(ref, view))
             for view in circuit.outputs]

    @dg.multi_asset(name=ref.job_name("views"), specs=specs, can_subset=False,
                    required_resource_keys=ref.resource_keys, op_tags=ref.tags)
    def step_views(context: dg.AssetExecutionContext,
                   config: StepConfig) -> Iterator[dg.MaterializeResult[Any]]:
        """Ingest the inbox (and Kafka), execute the pending steps, commit, send the output to
        Kafka; one materialization per view."""
        store = ref.store(context)
        arrived = store.status(circuit).oldest_pending
        with store.open(circuit, context.resources.spark) as pipeline:
            if pipeline.recovered_steps:
                context.log.warning(f"recovered steps {[r.step for r in pipeline.recovered_steps]}"
                                    " left uncommitted by an earlier run")
            folder = store.inbox_folder
            ingested = inbox.IngestResult() if folder is None else inbox.ingest(
                pipeline, folder, store.inbox_settle_seconds,
                report_unknown_folders=bool(store.inbox))  # (the default one is shared)
            for name, files in ingested.pushed.items():
                context.log.info(f"inbox: pushed {files} to input '{name}'")
            for path, why in ingested.ignored.items():
                context.log.warning(f"inbox: {path} {why}")
            if ingested.oldest_arrival is not None:
                arrived = min(arrived or ingested.oldest_arrival, ingested.oldest_arrival)
            if ref.uses_kafka:
                results, kafka_arrival = _run_with_kafka(ref, pipeline, context, config)
                if kafka_arrival is not None:
                    arrived = min(arrived or kafka_arrival, kafka_arrival)
            else:
                results = pipeline.run(max_steps=config.max_steps,
                                       max_seconds=config.max_seconds)
            done = time.time()
            context.log.info(f"executed steps {[r.step for r in results]}")
            if results:
                common: dict[str, int | float | str] = {
                    "steps_executed": len(results),
                    "first_step": results[0].step,
                    "input_rows": sum(n for r in results for n in r.inputs.values()),
                    "seconds_per_step": round(sum(r.seconds for r in results) / len(results), 4),
                    # where the steps' time went, phase by phase (StepResult.phase_seconds)
                    "step_phases": phase_summary(results),
                    "slowest_operators": operator_summary(results),
                    "steps_on_driver": sum(1 for r in results if r.on_driver),
                    # operators that ran a Spark job on a driver step (StepResult.spark_jobs)
                    "spark_jobs_on_driver": ", ".join(sorted({
                        label for r in results for label in r.spark_jobs})) or "none",
                    # where the newest step ran and why (runtime/path_choice.py)
                    "last_step_path": results[-1].path_reason,
                    "state_version": pipeline.state_version,
                    "rejected_records": sum(n for r in results for n in r.rejected.values()),
                }
                consumed = pipeline.step_info(results[-1].step).inputs
                for name in circuit.inputs:  # what the steps read of each input, observed
                    context.log_event(dg.AssetObservation(
                        asset_key=ref.input_key(name), metadata={
                            "step": results[-1].step,
                            "rows_read": sum(r.inputs.get(name, 0) for r in results),
                            "log_version": consumed.get(name, (0, 0))[1]}))
                for view in circuit.outputs:
                    changed = sum(r.outputs.get(view) or 0 for r in results)
                    yield dg.MaterializeResult(asset_key=ref.view_key(view), metadata={
                        "step": results[-1].step, **common,
                        "rows": pipeline.view_rows(view),
                        "rows_changed": changed,
                        "lag_seconds": round(done - arrived, 3) if arrived else 0.0,
                        COLUMN_SCHEMA: column_schema(struct_columns(pipeline.view_schema(view))),
                    })
        if ingested.rejected:
            raise dg.Failure(
                description="inbox files were rejected (moved to rejected/ with the error): "
                            + "; ".join(p for files in ingested.rejected.values()
                                        for p in files.values()),
                metadata={"rejected": {n: list(f) for n, f in ingested.rejected.items()}})

    return step_views


def _run_with_kafka(ref: PipelineRef, pipeline: Pipeline, context: dg.AssetExecutionContext,
                    config: StepConfig) -> tuple[list[StepResult], float | None]:
    """Poll the Kafka inputs, execute the steps, send the views in transactions; the results
    and the arrival time of the oldest record read."""
    from dbsp_pipeline.connectors.kafka import KafkaRunner

    runner = KafkaRunner(pipeline, context.resources.kafka.client_config(),
                         ref.kafka_inputs, ref.kafka_outputs)
    try:
        results = runner.run(max_steps=config.max_steps, max_seconds=config.max_seconds,
                             idle_seconds=config.kafka_idle_seconds)
    finally:
        runner.close()
    return results, runner.oldest_arrival
