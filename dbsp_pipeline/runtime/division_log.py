"""The division of input into steps (the seed's ``input-step`` record).

For each executed step, the division log records the input-log version every input was read up
to. It is written, durably, before any output of that step exists, so recovery that replays the
step reads exactly the same input (``distributed-dbsp-design.md``, "Input/output
synchronization"). A step's recorded division is never changed.

With the versions it records the source offsets they correspond to: for each input, the newest
sequence number of every tracked producer (a Kafka partition's producer ``kafka/<topic>/<p>``
records the partition offset), so the offsets each step consumed are known from the division
alone (the seed's ``input-step`` record).
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
        self._offsets: dict[int, dict[str, dict[str, int | None]]] = {}
        for f in self.table.files():
            for row in pq.read_table(f.path).to_pylist():
                self._uppers[row["step"]], self._offsets[row["step"]] = parse(row["uppers"])

    def get(self, step: int) -> dict[str, int] | None:
        """The recorded upper log version of each input for ``step`` (None if not recorded)."""
        return self._uppers.get(step)

    def lower(self, step: int, inputs: list[str]) -> dict[str, int]:
        """Where ``step``'s input starts: the uppers of the step before (version 0 for step 0)."""
        prev = self._uppers.get(step - 1, {}) if step > 0 else {}
        return {name: prev.get(name, 0) for name in inputs}

    def offsets(self, step: int) -> dict[str, dict[str, int | None]]:
        """Per input, the newest sequence number of each tracked producer as of ``step``'s
        division (empty if none was tracked or the step is not divided)."""
        return self._offsets.get(step, {})

    def record(self, step: int, uppers: dict[str, int],
               offsets: dict[str, dict[str, int | None]] | None = None) -> dict[str, int]:
        """Durably record ``step``'s division (and the source offsets it reaches); returns it."""
        if step in self._uppers:
            raise RuntimeError(f"the division of step {step} is already recorded")
        text = json.dumps({"uppers": uppers, "offsets": offsets or {}}, sort_keys=True)
        data = pa.table({"step": [step], "uppers": [text]}, schema=self.table.arrow_schema)
        self.table.commit(self.table.write_arrow(data))
        self._uppers[step] = dict(uppers)
        self._offsets[step] = dict(offsets or {})
        return dict(uppers)


def parse(text: str) -> tuple[dict[str, int], dict[str, dict[str, int | None]]]:
    """A stored division: (uppers, offsets). Divisions written before offsets were recorded
    hold the uppers alone."""
    data = json.loads(text)
    if "uppers" in data and isinstance(data["uppers"], dict):
        return data["uppers"], data.get("offsets", {})
    return data, {}
