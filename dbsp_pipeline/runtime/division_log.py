"""The division of input into steps (``docs/recovery.md``, section 4).

For each executed step, the division log records the input-log version every input was read up
to. It is written, durably, before any output of that step exists, so recovery that replays the
step reads exactly the same input (``docs/recovery.md``, section 4, "The division
log"). A step's recorded division is never changed.

With the versions it records the source offsets they correspond to: for each input, the newest
sequence number of every tracked producer (a Kafka partition's producer ``kafka/<topic>/<p>``
records the partition offset), so the offsets each step consumed are known from the division
alone (``Pipeline.step_info``).

A step whose execution failed deterministically (``Pipeline.quarantine_step``) is *quarantined*:
a second record of the step, with the same versions and offsets and the reason, says that the
step executes with no input (its records were moved to the errors table). That record is the
atomic point of a quarantine; it never changes where the step's input ends, so the steps after
it read exactly what they read before.

Every executed step's record also holds its output (``outputs``): per view, the data files of
the step's change, their row count and content digest (``runtime/output_log.py``). So a step is
made durable by ONE commit, the record of its division and output together: a step that is not
a checkpoint commits its record to this log (``record``); a checkpoint step does not commit here
at all, but *stages* its record (``stage``) for the manifest entry of the checkpoint to carry
(``pending_records``; the state database's commit is then the step's one commit). Staged
records are *folded* into this log now and then (``fold``, one commit for all of them), and
always before a restore discards the entries that carry them. Opening loads the records the
newest entry carries (``load_pending``) beside the log's own. A step whose execution failed
records its division alone first, and its output when it succeeds (a second record of the
step, with the same division).

Compaction (``compact_below``) keeps the log's size bounded by the retained history, not by the
number of steps ever run: the records of steps below the oldest retained checkpoint's step are
collapsed into one record, the division of the step just below it, which is all that the
retained steps need (where the first of them starts, and the offsets it starts after). What a
step below that consumed is no longer known (``compacted_below``); its input was consolidated
and its records, if quarantined, are in the errors table. A status reader (``read_last``) reads
the same bounded set of files.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from dbsp_pipeline.errors import DivisionRecordError
from dbsp_pipeline.storage.data_files import CHECKSUMS_READ
from dbsp_pipeline.storage.delta_table import SparkDeltaTable, newest_rows

_SCHEMA = StructType([StructField("step", LongType(), False),
                      StructField("uppers", StringType(), False)])
#: the key of a compacted record: the steps below this one were collapsed into the record
COMPACTED_KEY = "compacted_below"
#: the state metadata key under which a manifest entry carries staged step records
#: (``pending_records``)
CARRIED_RECORDS_KEY = "step_records"

Offsets = dict[str, dict[str, int | None]]


class DivisionLog:
    """The division log table at ``uri`` (``root.divisions(root)``), read whole at open: after
    compaction, one file for the steps below the oldest retained checkpoint and one per step
    (and quarantine) since."""

    def __init__(self, spark: SparkSession, uri: str) -> None:
        self.table = SparkDeltaTable(spark, uri, _SCHEMA, role="division", single_writer=True)
        self._uppers: dict[int, dict[str, int]] = {}
        self._offsets: dict[int, Offsets] = {}
        self._quarantined: dict[int, str] = {}
        #: per step, its output as recorded (``runtime/output_log.py`` ``StepOutput`` records)
        self._outputs: dict[int, dict[str, Any]] = {}
        #: records staged for the state database's next entry, not (yet) in this log: step ->
        #: record text
        self._pending: dict[int, str] = {}
        #: per data file of the newest version, the oldest and the newest step it holds
        self._file_steps: dict[str, tuple[int, int]] = {}
        self._compacted_below = 0
        for f in self.table.files():
            steps: list[int] = []
            for row in pq.read_table(f.path, **CHECKSUMS_READ).to_pylist():
                step, text = int(row["step"]), str(row["uppers"])
                steps.append(step)
                self._load(step, text)
            if steps:
                self._file_steps[f.path] = (min(steps), max(steps))

    def _load(self, step: int, text: str) -> None:
        reason = quarantine_reason(text)
        if reason is not None:
            self._quarantined[step] = reason
            return
        self._uppers[step], self._offsets[step] = parse(text)
        outputs = recorded_outputs(text)
        if outputs is not None:
            self._outputs[step] = outputs
        below = compacted_below(text)
        if below is not None:
            self._compacted_below = max(self._compacted_below, below)

    @property
    def compacted_below(self) -> int:
        """The steps below this one were compacted: their divisions are no longer known (0: no
        step was)."""
        return self._compacted_below

    def get(self, step: int) -> dict[str, int] | None:
        """The recorded upper log version of each input for ``step`` (None if not recorded)."""
        return self._uppers.get(step)

    def lower(self, step: int, inputs: list[str]) -> dict[str, int]:
        """Where ``step``'s input starts: the uppers of the step before (version 0 for step 0)."""
        prev = self._uppers.get(step - 1, {}) if step > 0 else {}
        return {name: prev.get(name, 0) for name in inputs}

    def offsets(self, step: int) -> Offsets:
        """Per input, the newest sequence number of each tracked producer as of ``step``'s
        division (empty if none was tracked or the step is not divided)."""
        return self._offsets.get(step, {})

    def record(self, step: int, uppers: dict[str, int], offsets: Offsets | None = None,
               outputs: dict[str, Any] | None = None) -> dict[str, int]:
        """Durably record ``step``'s division (and the source offsets it reaches), with its
        output when given (one commit); returns the division. A step divided before (a failed
        step that now succeeded) may be recorded again with its output, and the same division.
        """
        text = self._record_text(step, uppers, offsets, outputs)
        self._commit_row(step, text)
        self._load(step, text)
        return dict(uppers)

    def stage(self, step: int, uppers: dict[str, int], offsets: Offsets | None,
              outputs: dict[str, Any]) -> None:
        """Keep ``step``'s record (division and output) for the state database's next entry to
        carry (``pending_records``): durable once that entry is committed, not before."""
        text = self._record_text(step, uppers, offsets, outputs)
        self._pending[step] = text
        self._load(step, text)

    def _record_text(self, step: int, uppers: dict[str, int], offsets: Offsets | None,
                     outputs: dict[str, Any] | None) -> str:
        if step in self._uppers and (outputs is None or step in self._outputs
                                     or self._uppers[step] != uppers):
            raise DivisionRecordError(f"{self.table.uri}: the division of step {step} is "
                                      "already recorded")
        record: dict[str, Any] = {"uppers": uppers, "offsets": offsets or {}}
        if outputs is not None:
            record["outputs"] = outputs
        return json.dumps(record, sort_keys=True)

    def unstage(self, step: int) -> None:
        """Forget the record ``stage`` kept for ``step`` (the commit meant to carry it failed);
        a division the log itself holds for the step stays."""
        if self._pending.pop(step, None) is None:
            return
        self._outputs.pop(step, None)
        if (step, step) not in self._file_steps.values():
            self._uppers.pop(step, None)
            self._offsets.pop(step, None)

    def pending_records(self) -> list[list[Any]]:
        """The staged records, as the state database's entry carries them: ``[step, text]``,
        oldest first."""
        return [[step, text] for step, text in sorted(self._pending.items())]

    def load_pending(self, records: object) -> None:
        """Take the records an opened state entry carries (``pending_records`` of its commit):
        those this log does not hold already are staged again (the entry is their durable
        home until they are folded)."""
        if not isinstance(records, list):
            return
        for item in records:
            step, text = int(item[0]), str(item[1])
            if step < self._compacted_below:
                continue  # folded and compacted since (an older entry, opened again)
            if step in self._outputs or (step in self._uppers and recorded_outputs(text) is None):
                continue  # this log holds it (folded, or recorded by a step after a failure)
            self._pending[step] = text
            self._load(step, text)

    def fold(self) -> int:
        """Commit the staged records to this log (one commit; crash points
        ``division.commit.*``) and stage nothing; returns how many were folded. A crash
        before the commit leaves them in the entry that carries them; after it, a record is in
        both, which opening reads as one."""
        if not self._pending:
            return 0
        steps = sorted(self._pending)
        data = pa.table({"step": steps, "uppers": [self._pending[s] for s in steps]},
                        schema=self.table.arrow_schema)
        adds = self.table.write_arrow(data)
        self.table.commit(adds)
        for add in adds:
            self._file_steps[self.table.data_file(add).path] = (steps[0], steps[-1])
        self._pending = {}
        return len(steps)

    def fence(self) -> None:
        """Commit nothing, at the version after the one this handle loaded
        (compare-and-append): from here on a commit by a process that opened the log before
        fails. Opening a pipeline fences its two step-record tables this way."""
        self.table.commit([])

    def outputs(self, step: int) -> dict[str, Any] | None:
        """The output recorded with ``step`` (per view; None: the step has not executed under
        a record of its output: not executed, failed, or executed before outputs were
        recorded here)."""
        return self._outputs.get(step)

    def steps_with_outputs(self, since: int) -> list[int]:
        """The steps from ``since`` on whose output is recorded, in order."""
        return sorted(s for s in self._outputs if s >= since)

    def quarantined(self, step: int) -> str | None:
        """Why ``step``'s input was quarantined (None: it was not): the step reads no input."""
        return self._quarantined.get(step)

    def quarantined_steps(self) -> dict[int, str]:
        """Every quarantined step at or above ``compacted_below`` and its reason."""
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
        self._commit_row(step, text)
        self._quarantined[step] = reason

    def compact_below(self, step: int) -> int:
        """Collapse the records of the steps below ``step`` (the oldest retained checkpoint's
        next step) into one: the division of ``step - 1``, marked as the compacted record.
        Returns how many files left the log (0: nothing to collapse).

        What stays is what the steps from ``step`` on need: ``lower(step)`` (where the first
        retained step starts, for a restore to any retained checkpoint and for recovery),
        ``get(step - 1)`` (the input every retained state version consumed, for garbage
        collection), ``offsets(step - 1)`` (what the first retained step's offsets start
        after) and every record of the steps from ``step`` on, quarantines included. A step
        below ``step`` is never executed again: no retained checkpoint precedes it.

        Crash-safe: the compacted record is written to a new file, then one Delta commit (a
        rewrite, crash points ``division.rewrite.before/after``) adds it and removes the files
        it replaces. Before that commit returns the log is as it was (the new file is an orphan
        garbage collection deletes); after it, the log holds the same divisions for every step
        from ``step - 1`` on. Afterwards the Delta log's commits below its newest Delta
        checkpoint are deleted (no reader needs an older version of this log); a crash
        there leaves some of them, which the next compaction deletes.
        """
        base = step - 1
        if base not in self._uppers or min(self._uppers) >= base:
            return 0
        if any(s <= base for s in self._pending):
            self.fold()  # the records to collapse must be in the log
        replaced = [path for path, (first, _) in self._file_steps.items() if first <= base]
        # a file of folded records may hold steps on both sides: those above stay, rewritten
        kept = [row for path in replaced if self._file_steps[path][1] > base
                for row in pq.read_table(path, **CHECKSUMS_READ).to_pylist()
                if int(row["step"]) > base]
        text = json.dumps({"uppers": self._uppers[base], "offsets": self._offsets[base],
                           COMPACTED_KEY: step}, sort_keys=True)
        rows = [{"step": base, "uppers": text}, *sorted(kept, key=lambda r: int(r["step"]))]
        data = pa.Table.from_pylist(rows, schema=self.table.arrow_schema)
        adds = self.table.write_arrow(data)
        self.table.commit(adds, replaced, data_change=False)
        for path in replaced:
            del self._file_steps[path]
        for add in adds:
            self._file_steps[self.table.data_file(add).path] = (base, int(rows[-1]["step"]))
        for old in [s for s in self._uppers if s < base]:
            del self._uppers[old], self._offsets[old]
            self._outputs.pop(old, None)
        self._outputs.pop(base, None)  # the compacted record holds no output
        for old in [s for s in self._quarantined if s < step]:
            del self._quarantined[old]
        self._compacted_below = step
        self.table.clean_log_below(self.table.loaded_version())
        return len(replaced)

    def files(self) -> int:
        """How many data files the log's newest version holds (what opening reads)."""
        return len(self._file_steps)

    def _commit_row(self, step: int, text: str) -> None:
        data = pa.table({"step": [step], "uppers": [text]}, schema=self.table.arrow_schema)
        adds = self.table.write_arrow(data)
        self.table.commit(adds)
        for add in adds:
            self._file_steps[self.table.data_file(add).path] = (step, step)


def read_last(uri: str, carried: object = None) -> tuple[int, dict[str, int]] | None:
    """The newest divided step of the division log at ``uri`` and its uppers (None: no step is
    divided, or no log yet), counting the step records ``carried`` by the newest state entry
    (``pending_records``, not folded into the log yet). Read-only, without Spark, on any store
    (a local path or an ``s3://`` URI, ``storage/small_files.py``): reads the files of the
    log's newest version, which compaction keeps few."""
    last: tuple[int, dict[str, int]] | None = None
    if isinstance(carried, list):
        for item in carried:
            step = int(item[0])
            if last is None or step > last[0]:
                last = step, parse(str(item[1]))[0]
    for row in newest_rows(uri) or []:
        step = int(row["step"])
        if last is None or step > last[0]:
            last = step, parse(row["uppers"])[0]
    return last


def quarantine_reason(text: str) -> str | None:
    """The reason a stored division record quarantines its step (None: a plain division)."""
    data = json.loads(text)
    reason = data.get("quarantined") if isinstance(data, dict) else None
    return reason if isinstance(reason, str) else None


def recorded_outputs(text: str) -> dict[str, Any] | None:
    """Per view, the output a stored record holds (None: a division alone, a quarantine mark
    or the compacted record)."""
    data = json.loads(text)
    outputs = data.get("outputs") if isinstance(data, dict) else None
    return outputs if isinstance(outputs, dict) else None


def compacted_below(text: str) -> int | None:
    """For the compacted record (``DivisionLog.compact_below``): the step below which records
    were collapsed; None for any other record."""
    data = json.loads(text)
    below = data.get(COMPACTED_KEY) if isinstance(data, dict) else None
    return below if isinstance(below, int) else None


def parse(text: str) -> tuple[dict[str, int], Offsets]:
    """A stored division: (uppers, offsets). Divisions written before offsets were recorded
    hold the uppers alone."""
    data = json.loads(text)
    if "uppers" in data and isinstance(data["uppers"], dict):
        return data["uppers"], data.get("offsets", {})
    return data, {}
