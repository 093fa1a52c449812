"""Dead letters: the records the errors table holds, and re-injecting corrected ones.

Every record a source rejected (a Kafka record that could not be decoded or did not fit its
input; an inbox file rejected for its content, ``connectors/inbox.py``) or a quarantined step
moved out of an input log (``step_protocol.quarantine``) is a row of the errors table
(``connectors/errors_sink.py``). Each such row has an **error id**,
``<input>@<source>/<partition>/<offset>`` (``-`` for no partition): a Kafka record's topic,
partition and offset; an inbox file's ``inbox/<file>@<sha256 prefix>`` and the index of its
offending record (the id stands for the whole file, whose corrected rows are re-injected); or a
quarantined record's step (source ``step N``) and its place in that step's input (offset
``0..n-1``, in the order written). Rows written before quarantined records got offsets have
none, and no id.

Re-injecting (``reinject``): the corrected rows of an error id are pushed into its input as the
producer ``reinject/<id>`` with sequence number 0, so the push is exactly once whatever happens:
a second re-injection of the id (the same or other rows, a retry after a crash, a second
operator) appends nothing. That record in the input log is also what marks the error resolved
(``errors``: ``resolved``): the push and the mark are one commit, so no crash leaves a record
re-injected but unmarked, or marked but not re-injected. The rows enter the next step like any
push, so the views change by exactly their effect. The errors table itself is never rewritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dbsp_pipeline.connectors.errors_sink import ErrorsSink
from dbsp_pipeline.errors import InputError, UsageError
from dbsp_pipeline.runtime import inputs, records
from dbsp_pipeline.zset import WEIGHT

if TYPE_CHECKING:
    from dbsp_pipeline.runtime.engine_state import EngineState

#: the input-log producer of a re-injection, followed by the error id
REINJECT_PRODUCER = "reinject/"


def error_id(input_name: str, source: str, partition: int | None, offset: int | None
             ) -> str | None:
    """The id of the errors-table row of ``input_name`` from ``source``, ``partition`` and
    ``offset`` (None when it has no offset: written before quarantined records got one)."""
    if offset is None:
        return None
    return f"{input_name}@{source}/{'-' if partition is None else partition}/{offset}"


def errors(state: EngineState) -> pa.Table:
    """The errors table's rows (``errors_sink.SCHEMA``) with two more columns: ``id`` (the
    error id, null for a row without one) and ``resolved`` (whether the id was re-injected)."""
    table = ErrorsSink(state.spark, state.root).read()
    rows = table.to_pylist()
    ids = [error_id(r["input"], r["source"], r["partition"], r["offset"]) for r in rows]
    wanted: dict[str, list[str]] = {}
    for i, r in zip(ids, rows):
        if i is not None and r["input"] in state.inputs:
            wanted.setdefault(r["input"], []).append(REINJECT_PRODUCER + i)
    done = {p for name, producers in wanted.items()
            for p, seq in state.inputs[name].pushed_all(producers).items() if seq is not None}
    resolved = [i is not None and REINJECT_PRODUCER + i in done for i in ids]
    return (table.append_column(pa.field("id", pa.string()), pa.array(ids, pa.string()))
            .append_column(pa.field("resolved", pa.bool_()), pa.array(resolved, pa.bool_())))


def reinject(state: EngineState, fixes: Mapping[str, Any]) -> dict[str, int]:
    """Push the corrected rows of each error id in ``fixes`` (id → a row, or a list of rows:
    dicts of the input's columns, or tuples in their order; a dict may carry ``_weight``, a
    non-zero integer, default 1) into the error's input, exactly once per id. Returns, per id,
    the rows appended (0: the id was re-injected before). Every id must name a row of the errors
    table (``UsageError`` otherwise, before anything is pushed); a row that does not fit the
    input is an ``InputError`` naming the input and the row, and that id's rows are not pushed
    (ids before it in ``fixes`` are)."""
    if not isinstance(fixes, Mapping) or not fixes:
        raise UsageError("reinject takes a mapping of error ids to corrected rows")
    table = ErrorsSink(state.spark, state.root).read().to_pylist()
    known = {error_id(r["input"], r["source"], r["partition"], r["offset"]): r["input"]
             for r in table}
    unknown = [i for i in fixes if i not in known]
    if unknown:
        raise UsageError(f"no rejected record has the id {unknown[0]!r} (the errors table of "
                         f"pipeline '{state.circuit.name}' lists the ids, "
                         "Pipeline.errors())")
    out = {}
    for error, rows in fixes.items():
        name = known[error]
        if name not in state.inputs:
            raise UsageError(f"error {error!r} is a record of input '{name}', which circuit "
                             f"'{state.circuit.name}' no longer has")
        log = state.inputs[name]
        zset = _zset(name, error, rows, log.schema, log.arrow_schema)
        out[error] = inputs.push_zset(log, zset, REINJECT_PRODUCER + error, 0, 0)
    return out


def _zset(input_name: str, error: str, rows: Any, schema: Any, arrow_schema: pa.Schema
          ) -> pa.Table:
    """The rows of one fix as a Z-set of the input (grouped by their ``_weight``)."""
    listed = rows if isinstance(rows, list) else [rows]
    if not listed:
        raise InputError(input_name, f"re-injecting {error!r}: no corrected row given")
    by_weight: dict[int, list[Any]] = {}
    for row in listed:
        weight: object = 1
        if isinstance(row, dict) and WEIGHT in row:
            weight = row[WEIGHT]
            row = {k: v for k, v in row.items() if k != WEIGHT}
        by_weight.setdefault(records.check_weight(input_name, weight), []).append(row)
    parts = [records.to_arrow(input_name, group, schema, arrow_schema, w)
             for w, group in by_weight.items()]
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]
