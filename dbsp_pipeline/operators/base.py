"""The contract every operator implementation fulfils.

An operator is evaluated once per step. It receives the *change* of each of its inputs for that
step (a Z-set DataFrame, or ``None`` when that input did not change) and returns the change of its
output (or ``None`` for no change). Linear operators compute their output change from the input
change alone. Stateful operators keep traces (``dbsp_pipeline.storage.trace``) and must read only
what the change touches.

A stateful operator commits its trace appends to Delta as it runs; they become durable state only
when the pipeline commits the state database (``dbsp_pipeline.storage.state_db``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

Delta = DataFrame | None


@dataclass
class StepContext:
    """What an operator may use during one step."""

    spark: SparkSession
    step: int
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

    def compact(self, threshold: int) -> int:
        """Compact those of this operator's traces that have more than ``threshold`` files;
        returns how many were compacted."""
        return 0


SchemaOf = Callable[[int], StructType]
