"""The division of input into steps (the seed's ``input-step`` record).

For each executed step, the division log records the input-log version every input was read up
to. It is written, durably, before any output of that step exists, so recovery that replays the
step reads exactly the same input (``distributed-dbsp-design.md``, "Input/output
synchronization"). A step's recorded division is never changed.

With the versions it records the source offsets they correspond to: for each input, the newest
sequence number of every tracked producer (a Kafka partition's producer ``kafka/<topic>/<p>``
records the partition offset), so the offsets each step consumed are known from the division
alone (the seed's ``input-step`` record).

A step whose execution failed deterministically (``Pipeline.quarantine_step``) is *quarantined*:
a second record of the step, with the same versions and offsets and the reason, says that the
step executes with no input (its records were moved to the errors table). That record is the
atomic point of a quarantine; it never changes where the step's input ends, so the steps after
it read exactly what they read before.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from dbsp_pipeline.errors import DivisionRecordError
from dbsp_pipeline.storage.delta_table import SparkDeltaTable

_SCHEMA = StructType([StructField("step", LongType(), False),
                      StructField("uppers", StringType(), False)])


class DivisionLog:
    def __init__(self, spark: SparkSession, root: str) -> None:
        self.table = SparkDeltaTable(spark, os.path.join(root, "_divisions"), _SCHEMA,
                                     role="division", single_writer=True)
        self._uppers: dict[int, dict[str, int]] = {}
        self._offsets: dict[int, dict[str, dict[str, int | None]]] = {}
        self._quarantined: dict[int, str] = {}
        for f in self.table.files():
            for row in pq.read_table(f.path).to_pylist():
                step, text = row["step"], row["uppers"]
                reason = quarantine_reason(text)
                if reason is not None:
                    self._quarantined[step] = reason
                else:
                    self._uppers[step], self._offsets[step] = parse(text)

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
            raise DivisionRecordError(f"{self.table.uri}: the division of step {step} is "
                                      "already recorded")
        text = json.dumps({"uppers": uppers, "offsets": offsets or {}}, sort_keys=True)
        data = pa.table({"step": [step], "uppers": [text]}, schema=self.table.arrow_schema)
        self.table.commit(self.table.write_arrow(data))
        self._uppers[step] = dict(uppers)
        self._offsets[step] = dict(offsets or {})
        return dict(uppers)


    def quarantined(self, step: int) -> str | None:
        """Why ``step``'s input was quarantined (None: it was not): the step reads no input."""
        return self._quarantined.get(step)

    def quarantined_steps(self) -> dict[int, str]:
        """Every quarantined step and its reason."""
        return dict(self._quarantined)

    def quarantine(self, step: int, reason: str) -> None:
        """Durably mark ``step`` (divided) as executing with no input, for ``reason``; a step
        already quarantined stays as it is."""
        if step not in self._uppers:
            raise DivisionRecordError(f"{self.table.uri}: step {step} is not divided; only a "
                                      "divided step is quarantined")
        if step in self._quarantined:
            return
        text = json.dumps({"uppers": self._uppers[step], "offsets": self._offsets[step],
                           "quarantined": reason}, sort_keys=True)
        data = pa.table({"step": [step], "uppers": [text]}, schema=self.table.arrow_schema)
        self.table.commit(self.table.write_arrow(data))
        self._quarantined[step] = reason


def quarantine_reason(text: str) -> str | None:
    """The reason a stored division record quarantines its step (None: a plain division)."""
    data = json.loads(text)
    reason = data.get("quarantined") if isinstance(data, dict) else None
    return reason if isinstance(reason, str) else None


def parse(text: str) -> tuple[dict[str, int], dict[str, dict[str, int | None]]]:
    """A stored division: (uppers, offsets). Divisions written before offsets were recorded
    hold the uppers alone."""
    data = json.loads(text)
    if "uppers" in data and isinstance(data["uppers"], dict):
        return data["uppers"], data.get("offsets", {})
    return data, {}
