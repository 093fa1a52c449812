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
from typing import TypeAlias

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from dbsp_pipeline.driver.sql import LocalSQL
from dbsp_pipeline.storage.trace import Trace

#: one operator's change on the Spark path (None: no change)
Delta: TypeAlias = DataFrame | None
#: one operator's change on the driver path: payload + ``_weight`` (None: no change)
LocalDelta: TypeAlias = "pa.Table | None"


@dataclass
class StepContext:
    """What an operator may use during one step."""

    spark: SparkSession
    step: int
    #: the driver-side engine; set when the step runs on the driver (``step_local``)
    sql: LocalSQL | None = None
    #: a change smaller than this many rows is broadcast to the trace it is joined with
    broadcast_rows: int = 2_000_000
    _cached: list[DataFrame] = field(default_factory=list)

    def materialize(self, df: DataFrame) -> tuple[DataFrame, int]:
        """Compute ``df`` once for several uses within this step; returns it and its row count.

        The cache is released when the step ends (``release``).
        """
        cached = df.cache()
        self._cached.append(cached)
        return cached, cached.count()

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


class Operator:
    """One primitive operator of a compiled circuit."""

    #: the output's payload schema (no reserved columns)
    schema: StructType

    def step(self, ctx: StepContext, changes: Sequence[Delta]) -> Delta:
        raise NotImplementedError

    def step_local(self, ctx: StepContext, changes: Sequence[LocalDelta]) -> LocalDelta:
        """``step`` on the driver: the same result, as an Arrow table in the Spark schema's types
        (payload + ``_weight``)."""
        raise NotImplementedError

    def traces(self) -> list[Trace]:
        """The traces that integrate over time and so grow (and are compacted); a one-step
        memory (``delay``) is not among them."""
        return []

    def state_traces(self) -> list[Trace]:
        """Every trace of the operator's state (what a layout change reorganizes)."""
        return self.traces()


SchemaOf = Callable[[int], StructType]
