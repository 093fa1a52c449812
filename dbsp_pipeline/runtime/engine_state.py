"""``EngineState``: the engine's open handles on one pipeline root and the mutable state its
collaborators share.

``Pipeline`` opens a root and builds one ``EngineState``; the step protocol
(``step_protocol.py``), layout changes (``rescaling.py``), the upkeep after commits
(``upkeep.py``) and restores (``checkpoints.py``) receive it and work on it. None of them keeps
a handle of its own or reaches into another's: what they share is here, named.

Concurrency: only the holder of the pipeline's lock (``Pipeline``) changes an ``EngineState``
or calls a collaborator with it. The background compactor and a hot layout change's copy run
outside the lock, on the traces only; their results are applied under the lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from dbsp_pipeline import root as root_layout
from dbsp_pipeline.circuit import Circuit
from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.errors import UnknownNameError, UsageError
from dbsp_pipeline.runtime.circuit_diff import STATE_NAMES_KEY, names_from_json
from dbsp_pipeline.runtime.compactor import BackgroundCompactor
from dbsp_pipeline.runtime.division_log import DivisionLog
from dbsp_pipeline.runtime.input_log import InputLog
from dbsp_pipeline.runtime.layout import LAYOUT_KEY, Layout
from dbsp_pipeline.runtime.migration import ShardMigration
from dbsp_pipeline.runtime.output_log import OutputLog
from dbsp_pipeline.runtime.path_choice import (
    PathChoice,
    choose_for_step,
    choose_spark_execution,
    task_budget,
)
from dbsp_pipeline.runtime.plan import Plan
from dbsp_pipeline.runtime.readers import LeaseRegistry
from dbsp_pipeline.runtime.results import FailedStep
from dbsp_pipeline.storage.delta_table import delta_log
from dbsp_pipeline.storage.state_db import StateDatabase
from dbsp_pipeline.storage.table_store import DataFile


def read_layout(db: StateDatabase) -> Layout:
    """The layout recorded with the opened state version, recorded again so that the next
    checkpoint carries it (a root opened for the first time gets the initial layout)."""
    layout = Layout.from_json(db.get(LAYOUT_KEY))
    db.put(LAYOUT_KEY, layout.to_json())
    return layout


def compile_plan(circuit: Circuit, spark: SparkSession, db: StateDatabase) -> Plan:
    """The executable plan of ``circuit`` over the traces of the opened state version, each
    operator's tables named as the version records (``circuit_diff.STATE_NAMES_KEY``)."""
    names = names_from_json(db.get(STATE_NAMES_KEY), circuit.describe())
    return Plan(circuit, spark, db, schema_cache=root_layout.plan_schemas(db.root),
                state_names=names,
                strict=db.recorded_fingerprint != circuit.fingerprint())


@dataclass
class EngineState:
    """The open handles on a pipeline root and the state the engine's parts share. See the
    module docstring for who may change it."""

    circuit: Circuit
    root: str
    spark: SparkSession
    #: the driver's DuckDB engine (small steps, reads as Arrow, consolidations)
    sql: LocalSQL
    #: the state database: the traces' versions, the step, the layout, per checkpoint
    db: StateDatabase
    #: the assignment of shards to workers, recorded with every checkpoint
    layout: Layout
    #: the circuit's operators over the traces of the opened state version
    plan: Plan
    inputs: dict[str, InputLog]
    outputs: dict[str, OutputLog]
    divisions: DivisionLog
    leases: LeaseRegistry
    compactor: BackgroundCompactor
    #: commit the state database after this many steps
    checkpoint_every: int
    #: a step whose input changed by at most this many rows runs on the driver (0: none);
    #: None: each step runs where its estimated work fits (``runtime/path_choice.py``)
    driver_step_rows: int | None
    #: the steps of exact history every output log keeps (None: all)
    retain_steps: int | None
    #: how many state versions stay readable
    retain_checkpoints: int
    #: the most memory (bytes) a step on the driver may take (None: the machine's budget)
    driver_memory: int | None = None
    #: a Spark step runs each operator that can as one task per owner of its change
    #: (``runtime/owner_exec.py``) instead of as DataFrame jobs, when a task's share fits its
    #: budget (``path_choice.choose_spark_execution``)
    spark_per_owner: bool = True
    #: a per-owner Spark step runs a chain of owner stages, each the one reader of the one
    #: before, as one Spark job whose tasks meet between stages (``owner_exec.gang_stages``)
    #: where it can
    spark_gang_stages: bool = True
    #: steps executed since the last commit (a crash now would replay them)
    uncommitted_steps: int = 0
    #: commits since opening
    commits: int = 0
    #: commits since garbage was last collected, and the steps executed since and their input
    #: rows (``upkeep.collection_due``)
    commits_since_collection: int = 0
    steps_since_collection: int = 0
    rows_since_collection: int = 0
    #: the next step, if its execution failed; None when it did not
    failed_step: FailedStep | None = None
    #: a hot layout change in progress
    migration: ShardMigration | None = None
    #: no merge starts (a hot layout change is about to begin)
    holding_merges: bool = False
    #: a failed step's roll-back is executing steps again
    rolling_back: bool = False
    #: the state may hold half a step: nothing more may run on it (reopen the root)
    abandoned: bool = False
    #: input -> producers whose newest sequence numbers every division records
    tracked: dict[str, set[str]] = field(default_factory=dict)

    def input(self, name: str) -> InputLog:
        """The log of input ``name``; ``UnknownNameError`` if the circuit has no such input."""
        if name not in self.inputs:
            raise UnknownNameError(f"unknown input '{name}'; circuit '{self.circuit.name}' has "
                                   f"inputs {sorted(self.inputs)}")
        return self.inputs[name]

    def output(self, name: str) -> OutputLog:
        """The log of output ``name``; ``UnknownNameError`` if the circuit has no such output."""
        if name not in self.outputs:
            log = root_layout.output_log(self.root, name)
            removed = (f" (a view '{name}' an upgrade removed keeps its log, readable as the "
                       f"Delta table {log})") if delta_log(log) is not None else ""
            raise UnknownNameError(f"unknown output '{name}'; circuit '{self.circuit.name}' has "
                                   f"outputs {sorted(self.outputs)}{removed}")
        return self.outputs[name]

    def load_opened(self) -> None:
        """After ``db`` opened a state version: take its layout and compile the plan over its
        traces; no executed step is uncommitted. The plan before (if any) lets its traces'
        in-memory replicas go now, not when its reference cycles are collected."""
        old = getattr(self, "plan", None)
        for trace in old.traces() if old is not None else ():
            trace.drop_replica()
        self.layout = read_layout(self.db)
        self.plan = compile_plan(self.circuit, self.spark, self.db)
        self.uncommitted_steps = 0

    def choose_path(self, files: Mapping[str, Sequence[DataFile]]) -> PathChoice:
        """Where the step whose input change is ``files`` (per input, its log files) runs, and
        why (``runtime/path_choice.py``)."""
        choice = choose_for_step(self.plan, files, self.driver_step_rows, self.driver_memory)
        return choose_spark_execution(
            choice, self.plan, files, per_owner=self.spark_per_owner,
            workers=self.layout.workers,
            task_budget=lambda: task_budget(self.spark, self.layout.workers, self.driver_memory))

    def require_no_migration(self, what: str) -> None:
        """``UsageError`` if a hot layout change is in progress (``what``: the refused action)."""
        if self.migration is not None:
            raise UsageError(f"cannot {what} pipeline '{self.circuit.name}' while a hot layout "
                             f"change is in progress")

    def abandon(self) -> None:
        """Give the state up without committing (it may hold half a step), as a dead process
        would: nothing more runs on it, and reopening the root recovers from the newest
        checkpoint."""
        self.abandoned = True
        self.compactor.close()
