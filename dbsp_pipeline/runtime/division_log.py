"""The division of input into steps (the seed's ``input-step`` record).

For each executed step, the division log records the input-log version every input was read up
to. It is written, durably, before any output of that step exists, so recovery that replays the
step reads exactly the same input (``distributed-dbsp-design.md``, "Input/output
synchronization"). A step's recorded division is never changed.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from dbsp_pipeline.storage.delta_table import SparkDeltaTable

_SCHEMA = StructType([StructField("step", LongType(), False),
                      StructField("uppers", StringType(), False)])


class DivisionLog:
    def __init__(self, spark: SparkSession, root: str) -> None:
        self.table = SparkDeltaTable(spark, os.path.join(root, "_divisions"), _SCHEMA,
                                     role="division", single_writer=True)
        self._uppers: dict[int, dict[str, int]] = {}
        for f in self.table.files():
            for row in pq.read_table(f.path).to_pylist():
                self._uppers[row["step"]] = json.loads(row["uppers"])

    def get(self, step: int) -> dict[str, int] | None:
        """The recorded upper log version of each input for ``step`` (None if not recorded)."""
        return self._uppers.get(step)

    def lower(self, step: int, inputs: list[str]) -> dict[str, int]:
        """Where ``step``'s input starts: the uppers of the step before (version 0 for step 0)."""
        prev = self._uppers.get(step - 1, {}) if step > 0 else {}
        return {name: prev.get(name, 0) for name in inputs}

    def record(self, step: int, uppers: dict[str, int]) -> dict[str, int]:
        """Durably record ``step``'s division; returns it."""
        if step in self._uppers:
            raise RuntimeError(f"the division of step {step} is already recorded")
        data = pa.table({"step": [step], "uppers": [json.dumps(uppers, sort_keys=True)]},
                        schema=self.table.arrow_schema)
        self.table.commit(self.table.write_arrow(data))
        self._uppers[step] = dict(uppers)
        return dict(uppers)
