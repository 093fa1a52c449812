"""The operator's jobs of one pipeline. Every job runs in one process (the in-process
executor: a multiprocess executor would start a JVM per op) and carries the pipeline's run tag,
so the instance's run queue never runs two of them on one pipeline at once.

* ``<name>_step``: materializes the views (``assets.py``): ingest, steps, commit; with
  ``check_views`` also the view checks (``checks.py``).
* ``<name>_checkpoint``: commit, compact every trace due, collect garbage (and collapse view
  history beyond ``retain_steps``, if the store sets it).
* ``<name>_recover``: reopen after a failure: replays the steps divided after the newest
  checkpoint (their output is verified, not written twice), sends to Kafka the steps written
  but not yet sent, and reports both.
* ``<name>_restore``: go back to a retained checkpoint (``version``); refuses unless ``confirm``.
  It opens the pipeline at that checkpoint, so it also works when the newest state is damaged
  (``CorruptStateError``): damaged commits after the checkpoint are set aside.
* ``<name>_verify``: check the pipeline root's storage, every table and retained checkpoint
  (``dbsp_pipeline.verify``), without opening it; fails, with the report, when anything is
  damaged. Metadata per table, per checkpoint (intact or not) and the newest intact one.
* ``<name>_rescale``: a layout change to ``workers`` workers (``Pipeline.rescale``): cold
  (between steps) or, with ``hot``, while the op keeps executing the steps of the input already
  in the logs (the run queue holds the step job meanwhile).
* ``<name>_quarantine``: a step whose execution failed (``failed_step``: an overflow, an
  expression error) and fails again however often it is tried: move the records of its input
  to the errors table and execute it with no input (``Pipeline.quarantine_step``); refuses
  unless ``confirm`` and ``step`` names the failed step.
* ``<name>_reinject``: re-inject corrected dead letters (``Pipeline.reinject``) from a JSON
  lines file (``file``), one ``{"id": <error id>, "row": {...}}`` (or ``"rows": [...]``) per
  line, the ids as ``Pipeline.errors()`` lists them; each id's rows enter exactly once, however
  often the job runs. Reports the rows appended per id and the ids re-injected before.
* ``<name>_upgrade``: run after deploying a new engine (and rolling the Spark workers,
  ``infra/spark_cluster.sh roll``) or a changed circuit: opens the pipeline, which migrates an
  older state format and refuses a changed circuit (``CircuitChangedError``) unless
  ``allow_circuit_change`` (``runtime/circuit_upgrade.py``: the views change without starting
  over), and reports what it did.
"""

# no ``from __future__ import annotations``: Dagster reads the decorated functions' annotations
import json
import threading
import time
from typing import TYPE_CHECKING, Any

import dagster as dg

from dbsp_pipeline import InputError, Pipeline, UsageError, VerifyReport
from dbsp_pipeline import verify as verify_root
from dbsp_pipeline.dagster.ref import PipelineRef

if TYPE_CHECKING:  # what define_asset_job returns (Dagster does not export its name)
    from dagster._core.definitions.unresolved_asset_job_definition import (
        UnresolvedAssetJobDefinition as AssetJob,
    )


def _rescale_while_stepping(p: Pipeline, workers: int, sharding: str | None) -> Any:
    """A hot rescale in a thread while this one executes the pending steps."""
    out: dict[str, Any] = {}

    def rescale() -> None:
        try:
            out["result"] = p.rescale(workers, sharding, hot=True)
        except BaseException as e:  # noqa: BLE001 (re-raised in the op's thread)
            out["error"] = e

    thread = threading.Thread(target=rescale, name="dbsp-hot-rescale")
    thread.start()
    try:
        while thread.is_alive():
            p.run(max_seconds=1.0, idle_seconds=0.2)
            thread.join(0.05)
    finally:
        thread.join()  # a failed step abandons the change: the thread ends (and fails) soon
    if "error" in out:
        raise out["error"]
    return out["result"]


def _failed_step(p: Pipeline) -> dict[str, Any] | None:
    failed = p.failed_step
    return None if failed is None else {"step": failed.step, "error": failed.error}


class RescaleConfig(dg.Config):
    """``workers``: the new number of workers; ``sharding``: keep the current function
    (empty) or change to ``modulo``, ``fixed`` or ``dynamic``; ``hot``: copy the state while
    steps keep running, pausing them only for the hand-over (``runtime/migration.py``)."""

    workers: int
    sharding: str = ""
    hot: bool = False


class RestoreConfig(dg.Config):
    """``version``: a retained checkpoint (the ``checkpoints`` metadata of the checkpoint job
    lists them); ``confirm`` must be true: restoring re-executes every step since then."""

    version: int
    confirm: bool = False


class QuarantineConfig(dg.Config):
    """``step``: the failed step (the recover job's ``failed_step`` metadata, or the step job's
    error, names it); ``confirm`` must be true: its records leave the views for the errors
    table."""

    step: int
    confirm: bool = False


class UpgradeConfig(dg.Config):
    """``allow_circuit_change``: when the deployed circuit differs from the one the root
    records, change the pipeline's views to it (``Pipeline(..., upgrade=True)``: kept
    operators keep their state, new ones are computed from the input logs, and the upgrade
    step's output takes each changed view to its new contents) instead of failing."""

    allow_circuit_change: bool = False


class ReinjectConfig(dg.Config):
    """``file``: a JSON lines file of corrected records, ``{"id": <error id>, "row": {...}}``
    or ``{"id": ..., "rows": [{...}, ...]}`` per line (a row may carry ``_weight``)."""

    file: str


def read_fixes(path: str) -> dict[str, Any]:
    """The corrected records of a reinject file (``ReinjectConfig``): error id → rows;
    ``dg.Failure`` naming the file and line for a line that is not such an object."""
    fixes: dict[str, Any] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                    if not isinstance(item, dict) or not isinstance(item.get("id"), str) \
                            or ("row" in item) == ("rows" in item):
                        raise ValueError('expected {"id": "...", "row": {...}} or '
                                         '{"id": "...", "rows": [...]}')
                except ValueError as e:
                    raise dg.Failure(description=f"{path}, line {n}: {e}") from e
                rows = item["rows"] if "rows" in item else [item["row"]]
                fixes.setdefault(item["id"], []).extend(rows)
    except OSError as e:
        raise dg.Failure(description=f"cannot read the reinject file {path}: {e}") from e
    if not fixes:
        raise dg.Failure(description=f"the reinject file {path} holds no corrected record")
    return fixes


def step_job(ref: PipelineRef, views: dg.AssetsDefinition,
             checks: dg.AssetChecksDefinition | None = None) -> "AssetJob":
    """``<name>_step``: materializes ``views`` (and runs ``checks`` with them, if given)."""
    selection: dg.AssetSelection = dg.AssetSelection.assets(views)
    selection = selection if checks is not None else selection.without_checks()
    return dg.define_asset_job(ref.job_name("step"), selection=selection, tags=ref.tags,
                               executor_def=dg.in_process_executor,
                               description=f"execute the pending steps of pipeline '{ref.name}'")


def operation_jobs(ref: PipelineRef) -> dict[str, dg.JobDefinition]:
    """The operator's jobs of pipeline ``ref`` by kind (``checkpoint``, ``recover``, ...)."""
    circuit = ref.circuit
    keys = ref.resource_keys

    @dg.op(name=ref.job_name("checkpoint_op"), required_resource_keys=keys)
    def checkpoint(context: dg.OpExecutionContext) -> None:
        store = ref.store(context)
        started = time.monotonic()
        with store.open(circuit, context.resources.spark) as p:
            version = p.commit(compact=False) if p.uncommitted_steps else p.state_version
            compacted = p.compact()
            history = p.compact_history() if p.retain_steps is not None else {}
            deleted = p.collect_garbage()
            context.add_output_metadata({
                "state_version": version, "next_step": p.next_step,
                "traces_compacted": compacted, "files_deleted": deleted,
                "history_compacted_through": history,
                "checkpoints": [{"version": c.version, "step": c.step} for c in p.checkpoints()],
                "seconds": round(time.monotonic() - started, 3)})

    @dg.op(name=ref.job_name("recover_op"), required_resource_keys=keys)
    def recover(context: dg.OpExecutionContext) -> None:
        store = ref.store(context)
        started = time.monotonic()
        with store.open(circuit, context.resources.spark) as p:
            replayed = p.recovered_steps
            context.log.info(f"replayed steps {[r.step for r in replayed]}")
            sent = []
            if ref.kafka_outputs:  # steps whose output was written but not yet sent
                from dbsp_pipeline.connectors.kafka import KafkaSink

                sink = KafkaSink(p, context.resources.kafka.client_config(), ref.kafka_outputs)
                sent = sink.emit()
                sink.close()
            context.add_output_metadata({
                "replayed_steps": [r.step for r in replayed],
                "steps_sent_to_kafka": sent,
                "replayed_input_rows": sum(n for r in replayed for n in r.inputs.values()),
                "failed_step": _failed_step(p),
                "state_version": p.state_version, "next_step": p.next_step,
                "seconds": round(time.monotonic() - started, 3)})

    @dg.op(name=ref.job_name("quarantine_op"), required_resource_keys=keys)
    def quarantine(context: dg.OpExecutionContext, config: QuarantineConfig) -> None:
        if not config.confirm:
            raise dg.Failure(description=f"quarantining step {config.step} of pipeline "
                             f"'{ref.name}' moves its input records to the errors table: run "
                             "again with confirm: true")
        store = ref.store(context)
        with store.open(circuit, context.resources.spark) as p:
            failed = p.failed_step
            if failed is None or failed.step != config.step:
                raise dg.Failure(description=f"step {config.step} of pipeline '{ref.name}' has "
                                 f"not failed; failed step: {_failed_step(p) or 'none'}")
            done = p.quarantine_step(config.step)
            context.log.warning(f"quarantined step {done.step}: {done.reason}")
            context.add_output_metadata({
                "quarantined_step": done.step, "reason": done.reason,
                "records_moved_to_errors": done.moved, "state_version": p.state_version,
                "next_step": p.next_step})

    @dg.op(name=ref.job_name("reinject_op"), required_resource_keys=keys)
    def reinject(context: dg.OpExecutionContext, config: ReinjectConfig) -> None:
        fixes = read_fixes(config.file)
        store = ref.store(context)
        with store.open(circuit, context.resources.spark) as p:
            try:
                appended = p.reinject(fixes)
            except (UsageError, InputError) as e:
                raise dg.Failure(description=f"{config.file}: {e}") from e
            context.add_output_metadata({
                "rows_appended": {i: n for i, n in appended.items() if n},
                "reinjected_before": sorted(i for i, n in appended.items() if not n),
                "input_pending": p.input_pending(), "next_step": p.next_step})

    @dg.op(name=ref.job_name("restore_op"), required_resource_keys=keys)
    def restore(context: dg.OpExecutionContext, config: RestoreConfig) -> None:
        if not config.confirm:
            raise dg.Failure(description=f"restoring pipeline '{ref.name}' to checkpoint "
                             f"{config.version} re-executes every step since then: run again "
                             "with confirm: true")
        store = ref.store(context)
        try:  # opened at the checkpoint: the newest state is never read (it may be damaged)
            p = store.open(circuit, context.resources.spark, checkpoint=config.version)
        except UsageError as e:
            raise dg.Failure(description=f"checkpoint {config.version} cannot be restored: "
                             f"{e}") from e
        with p:
            context.add_output_metadata({
                "restored_version": config.version,
                "replayed_steps": [r.step for r in p.recovered_steps],
                "state_version": p.state_version, "next_step": p.next_step})

    @dg.op(name=ref.job_name("verify_op"), required_resource_keys={ref.store_key})
    def verify(context: dg.OpExecutionContext) -> None:
        store = ref.store(context)
        started = time.monotonic()
        report = verify_root(store.root, store.retain_checkpoints)
        metadata = _verify_metadata(report, time.monotonic() - started)
        if not report.ok:
            raise dg.Failure(description=f"pipeline '{ref.name}' at {store.root} is damaged: "
                             f"{report.damage[0]} ({len(report.damage)} problems)",
                             metadata=metadata)
        context.add_output_metadata(metadata)

    @dg.op(name=ref.job_name("rescale_op"), required_resource_keys=keys)
    def rescale(context: dg.OpExecutionContext, config: RescaleConfig) -> None:
        store = ref.store(context)
        with store.open(circuit, context.resources.spark) as p:
            if config.hot:
                r = _rescale_while_stepping(p, config.workers, config.sharding or None)
            else:
                r = p.rescale(config.workers, config.sharding or None)
            context.add_output_metadata({
                "hot": r.hot, "copy_seconds": round(r.copy_seconds, 3),
                "pause_seconds": round(r.pause_seconds, 3),
                "steps_during_copy": r.steps_during_copy, "caught_up_rows": r.caught_up_rows,
                "old_layout": r.old.to_json(), "new_layout": r.new.to_json(),
                "stopped_at_step": r.step, "state_rows": r.rows, "moved_rows": r.moved_rows,
                "rewritten_rows": r.rewritten_rows, "seconds": round(r.seconds, 3),
                "state_version": r.state_version})

    @dg.op(name=ref.job_name("upgrade_op"), required_resource_keys=keys)
    def upgrade(context: dg.OpExecutionContext, config: UpgradeConfig) -> None:
        store = ref.store(context)
        with store.open(circuit, context.resources.spark,
                        upgrade=config.allow_circuit_change) as p:
            info = p.upgrade_info
            context.log.info(f"state written by engine {info.from_engine} in format "
                             f"{info.from_format}; migrations {info.migrations}")
            change = p.circuit_change
            if change is not None:
                context.log.info(
                    f"circuit changed at step {change.step}: views changed "
                    f"{change.views_changed}, added {change.views_added}, removed "
                    f"{change.views_removed}; operators backfilled {change.backfilled}, "
                    f"kept {len(change.kept)}, retired {change.retired}")
            context.add_output_metadata({
                "circuit_change": change.describe() if change is not None else None,
                "circuit_change_seconds": round(change.seconds, 3) if change else 0.0,
                "from_engine": info.from_engine or "", "to_engine": info.to_engine,
                "from_format": info.from_format, "to_format": info.to_format,
                "migrations": [f"{a}->{b}" for a, b in info.migrations],
                "table_properties_set": info.table_properties,
                "traces_widened": info.widened,
                "views_made_nullable": info.relaxed,
                "replayed_steps": [r.step for r in p.recovered_steps],
                "state_version": p.state_version, "next_step": p.next_step})

    def job(name: str, op: dg.OpDefinition, description: str) -> dg.JobDefinition:
        @dg.job(name=ref.job_name(name), tags=ref.tags, executor_def=dg.in_process_executor,
                description=description)
        def _job() -> None:
            op()
        return _job

    jobs = [
        job("checkpoint", checkpoint, f"commit, compact and collect garbage of '{ref.name}'"),
        job("recover", recover, f"reopen '{ref.name}' after a failure and replay what it must"),
        job("restore", restore, f"restore '{ref.name}' to a retained checkpoint"),
        job("rescale", rescale, f"change the layout of '{ref.name}' (cold: between steps)"),
        job("quarantine", quarantine, f"move the input of a failed step of '{ref.name}' to "
            "the errors table and go on"),
        job("reinject", reinject, f"re-inject corrected rejected records of '{ref.name}' "
            "from a file, exactly once"),
        job("upgrade", upgrade, f"open '{ref.name}' with this engine: migrate its state "
            "format; change its views to the deployed circuit if allow_circuit_change"),
        job("verify", verify, f"check the storage of '{ref.name}': every table and retained "
            "checkpoint"),
    ]
    return {j.name.removeprefix(ref.job_name("")): j for j in jobs}


def _verify_metadata(report: VerifyReport, seconds: float) -> dict[str, Any]:
    """A verification report as run metadata: per table ``ok`` or its first problem, per
    checkpoint whether it is intact, the newest intact one, and every problem."""
    metadata: dict[str, Any] = {
        "ok": report.ok,
        "tables": {t.table: "ok" if t.ok else str(t.damage[0].problem) for t in report.tables},
        "checkpoints": [{"version": c.version, "step": c.step, "intact": c.intact}
                        for c in report.checkpoints],
        "damage": [str(d) for d in report.damage],
        "report": dg.MetadataValue.text(report.describe()),
        "seconds": round(seconds, 3)}
    if report.newest_intact is not None:
        metadata["newest_intact_checkpoint"] = report.newest_intact
    return metadata
