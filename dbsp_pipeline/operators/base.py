"""The contract every operator implementation fulfils.

An operator is evaluated once per step. It receives the *change* of each of its inputs for that
step (a Z-set, or ``None`` when that input did not change) and returns the change of its output
(or ``None`` for no change). Every operator has two implementations of the same algorithm:

* ``step``: the change is a Spark DataFrame and the work runs as Spark jobs (large changes);
* ``step_local``: the change is an Arrow table and the work runs on the driver with DuckDB
  (small changes, where a Spark job's fixed cost would dominate).

A step runs wholly one way or the other (``StepContext.on_driver``); both read and write the same
trace tables, so consecutive steps may alternate freely. Linear operators compute their output
change from the input change alone. Stateful operators keep traces
(``dbsp_pipeline.storage.trace``) and must read only what the change touches.

A stateful operator commits its trace appends to Delta as it runs; they become durable state only
when the pipeline commits the state database (``dbsp_pipeline.storage.state_db``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.storage.small_files import remove_folder
from dbsp_pipeline.storage.trace import Trace

if TYPE_CHECKING:
    from dbsp_pipeline.runtime.layout import Layout
    from dbsp_pipeline.runtime.output_log import ViewFiles

#: one operator's change on the Spark path (None: no change)
Delta: TypeAlias = DataFrame | None
#: one operator's change on the driver path: payload + ``_weight`` (None: no change)
LocalDelta: TypeAlias = "pa.Table | None"


@dataclass
class StepContext:
    """What an operator may use during one step."""

    #: the Spark session; None in a Spark task running one owner's part of an operator
    #: (``runtime/owner_exec.py``), where only ``step_local`` runs
    spark: SparkSession | None
    step: int
    #: the driver-side engine; set when the step runs on the driver (``step_local``), and in a
    #: Spark task (the task's own DuckDB)
    sql: LocalSQL | None = None
    #: a change smaller than this many rows is broadcast to the trace it is joined with
    broadcast_rows: int = 2_000_000
    #: the state's layout (who owns which key); what an owner stage groups the change by
    layout: Layout | None = None
    #: whether a Spark step runs each operator that can (``Plan.owner_capable``) as one task
    #: per owner (``runtime/owner_exec.py``) instead of as DataFrame jobs
    per_owner: bool = False
    #: on a per-owner step, whether a chain of owner stages, each the one reader of the one
    #: before, may run as one Spark job (``owner_exec.gang_stages``)
    gang_stages: bool = False
    #: in a Spark task, the owner whose keys it runs (None on the driver)
    owner: int | None = None
    #: the nodes whose change an owner stage read on the driver as an Arrow table that is
    #: consolidated already (``Operator.owner_outputs_consolidated``)
    consolidated_changes: set[int] = field(default_factory=set)
    #: on a per-owner Spark step, the views' logs their owner stages' tasks may write the
    #: step's change to themselves, by node (``OutputLog.files_for_tasks``)
    view_files: dict[int, ViewFiles] = field(default_factory=dict)
    #: the seconds each operator's evaluation took this step, by its label
    #: (``Plan.operator_label``; ``StepResult.operator_seconds``)
    operator_seconds: dict[str, float] = field(default_factory=dict)
    #: the label of the operator running now (set by ``Plan.evaluate``)
    running: str = ""
    #: on a driver step, the labels of the operators that ran a Spark job over their change
    #: (``StepResult.spark_jobs``)
    spark_jobs: list[str] = field(default_factory=list)
    _cached: list[DataFrame] = field(default_factory=list)
    _scratch: list[str] = field(default_factory=list)

    def scratch_folder(self, folder: str) -> str:
        """``folder``, a folder of this step's scratch files (``runtime/exchange.py``),
        removed with everything in it when the step ends (``release``)."""
        self._scratch.append(folder)
        return folder

    def materialize(self, df: DataFrame) -> tuple[DataFrame, int]:
        """Compute ``df`` once for several uses within this step; returns it and its row count.

        The cache is released when the step ends (``release``).
        """
        cached = df.cache()
        self._cached.append(cached)
        return cached, cached.count()

    @property
    def session(self) -> SparkSession:
        """The Spark session, for a step (or a driver step's fallback) that runs Spark jobs:
        a Spark task has none, so asking for it there is a bug in the engine."""
        if self.spark is None:
            raise AssertionError(f"step {self.step} runs in a Spark task (owner {self.owner}): "
                                 "no Spark session")
        return self.spark

    @property
    def on_driver(self) -> bool:
        return self.sql is not None

    @property
    def local(self) -> LocalSQL:
        """The driver-side engine, for ``step_local``: only a step that runs on the driver
        calls it, so its absence is a bug in the engine, not in the circuit."""
        if self.sql is None:
            raise AssertionError(f"step {self.step} runs on Spark: no driver-side engine")
        return self.sql

    def release(self) -> None:
        for df in self._cached:
            df.unpersist()
        self._cached.clear()
        for folder in self._scratch:
            remove_folder(folder)
        self._scratch.clear()


class Operator:
    """One primitive operator of a compiled circuit."""

    #: the output's payload schema (no reserved columns)
    schema: StructType
    #: whether every ``step_local`` output is consolidated over the output's columns and
    #: holds the ``owner_keys`` columns of the operator's input: then the outputs of an owner
    #: stage's tasks (owners hold disjoint keys) are together consolidated too
    #: (``runtime/owner_exec.py`` reads a view's change so without consolidating it again)
    owner_outputs_consolidated: bool = False

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        raise NotImplementedError

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        """``step`` on the driver: the same result, as an Arrow table in the Spark schema's types
        (payload + ``_weight``)."""
        raise NotImplementedError

    def owner_keys(self) -> list[list[str]] | None:
        """Per input, the columns whose owner (``Layout.owner_column``) decides which task of
        an owner stage gets a row of its change (``runtime/owner_exec.py``); None when the
        operator does not run per owner (it keeps ``step``)."""
        return None

    def columns_read(self) -> list[str] | None:
        """The columns of its (one) input's change that the operator's result depends on, when
        that is fewer than all and it takes the change as a multiset of rows it need not
        consolidate (rows equal on these columns may come apart): an owner stage then hands it
        only these columns (``runtime/exchange.py``; the others arrive NULL). None: all."""
        return None

    def traces(self) -> list[Trace]:
        """The traces that integrate over time and so grow (and are compacted); a one-step
        memory (``delay``) is not among them."""
        return []

    def state_traces(self) -> list[Trace]:
        """Every trace of the operator's state (what a layout change reorganizes)."""
        return self.traces()


SchemaOf = Callable[[int], StructType]
