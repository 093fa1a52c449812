"""The inbox: a folder per input where files dropped by anyone become pushes.

Layout: ``<inbox>/<input>/<file>`` with ``<file>`` one of ``.jsonl`` (one JSON object per line),
``.csv`` (with a header) or ``.parquet``. Columns are the input's; an optional ``_weight``
column (a nonzero integer per record; missing or null means 1) makes the file a Z-set, so
``-1`` deletes a record.
Writers must create a file under a name starting with ``.`` or ending with ``.tmp`` and rename
it when complete: those names are never read.

``ingest(p, folder)`` pushes every complete file, oldest first, then moves it to ``done/``. A
file is pushed with the producer name ``inbox/<input>/<file>`` and sequence number 0, so if the
process dies after the push and before the move, the next ingest pushes it again as a no-op:
each file's records enter the input exactly once. A file that cannot be read or does not match
the input is moved to ``rejected/`` beside a ``<file>.error.txt`` naming the problem; files
already pushed are not affected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from dbsp_pipeline.errors import InputError
from dbsp_pipeline.zset import WEIGHT

SUFFIXES = (".jsonl", ".csv", ".parquet")
DONE = "done"
REJECTED = "rejected"


@dataclass
class IngestResult:
    """Per input, the files pushed (file name → rows) and rejected (file name → problem)."""

    pushed: dict[str, dict[str, int]] = field(default_factory=dict)
    rejected: dict[str, dict[str, str]] = field(default_factory=dict)
    #: when the oldest pushed file arrived (its modification time; None if none was pushed)
    oldest_arrival: float | None = None

    @property
    def rows(self) -> int:
        return sum(n for files in self.pushed.values() for n in files.values())


def pending_files(folder: str, inputs: list[str]) -> dict[str, list[str]]:
    """Per input, the complete files waiting in the inbox, oldest first (by mtime, then name)."""
    out = {}
    for name in inputs:
        d = os.path.join(folder, name)
        if not os.path.isdir(d):
            continue
        files = [f for f in os.listdir(d) if f.endswith(SUFFIXES) and not f.startswith(".")
                 and os.path.isfile(os.path.join(d, f))]
        if files:
            out[name] = sorted(files, key=lambda f: (os.path.getmtime(os.path.join(d, f)), f))
    return out


def ingest(pipeline, folder: str) -> IngestResult:
    """Push every complete file of the inbox ``folder`` into ``pipeline``; see the module
    docstring for the exactly-once and rejection rules."""
    result = IngestResult()
    for name, files in pending_files(folder, list(pipeline.circuit.inputs)).items():
        for file in files:
            path = os.path.join(folder, name, file)
            arrived = os.path.getmtime(path)
            try:
                table = read_file(name, path)
                producer = f"inbox/{name}/{file}"
                if WEIGHT in table.column_names:
                    i = table.schema.get_field_index(WEIGHT)
                    weights = table.column(i)
                    if pa.types.is_integer(weights.type):
                        table = table.set_column(i, WEIGHT, weights.fill_null(1))
                    rows = pipeline.push_zset(name, table, producer=producer, seq=0)
                else:
                    rows = pipeline.push(name, table, producer=producer, seq=0)
            except InputError as e:
                problem = f"file {file}: {e}"
                _move(path, REJECTED)
                with open(os.path.join(folder, name, REJECTED, file + ".error.txt"), "w") as fh:
                    fh.write(problem + "\n")
                result.rejected.setdefault(name, {})[file] = problem
                continue
            _move(path, DONE)
            result.pushed.setdefault(name, {})[file] = rows
            if result.oldest_arrival is None or arrived < result.oldest_arrival:
                result.oldest_arrival = arrived
    return result


def read_file(input_name: str, path: str) -> pa.Table:
    """The records of one inbox file as Arrow (types are fixed by the push that follows)."""
    try:
        if path.endswith(".jsonl"):
            return pa_json.read_json(path)
        if path.endswith(".csv"):
            return pa_csv.read_csv(path)
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise InputError(input_name, f"file {os.path.basename(path)} cannot be read: {e}") \
            from None


def _move(path: str, sub: str) -> None:
    target = os.path.join(os.path.dirname(path), sub)
    os.makedirs(target, exist_ok=True)
    os.replace(path, os.path.join(target, os.path.basename(path)))


__all__ = ["IngestResult", "ingest", "pending_files", "read_file"]
