"""Decoding source records (Kafka message values) into rows with weights, and encoding view
changes back into records.

JSON (the default format), one object per record:

* ``{"insert": {<row>}}`` adds the row, ``{"delete": {<row>}}`` retracts it; an optional
  ``"weight": n`` beside the envelope (1 to 2**31 - 1) makes it ``n`` copies;
* a plain row ``{<column>: <value>, ...}`` is an insert.

CSV, one line per record: the input's columns in declaration order; one extra last field, if
present, is the weight (``1`` insert, ``-1`` delete).

Values of the typed columns, in both formats (and back out in ``encode_change``):

* ``DECIMAL``: a JSON number (read exactly as written, never through a float) or a string of
  digits, ``"12.30"``; more digits after the point than the column's scale is an error, not a
  rounding. Written out as a string of its exact digits;
* ``DATE``: ``"YYYY-MM-DD"``;
* ``TIMESTAMP``: ISO 8601, ``"2024-01-31T10:00:00"`` (``T`` or a space, optional fraction and
  offset: ``Z``, ``+02:00``); without an offset it is UTC (the engine's session time zone).
  Written out as ISO 8601 with its offset, ``"2024-01-31T10:00:00+00:00"``.

``decode`` never raises for a bad record: it returns the record's problem instead, so a caller
can send it to the errors sink and go on. Values are not type-checked here; the push that
follows checks every row against the input's schema (``runtime/records.py``), and ``Batch``
finds which record a type error belongs to.
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
from pyspark.sql.types import (
    DataType,
    DateType,
    DecimalType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from dbsp_pipeline.errors import InputError
from dbsp_pipeline.runtime import records
from dbsp_pipeline.zset import MAX_WEIGHT, WEIGHT

FORMATS = ("json", "csv")
ENVELOPES = {"insert": 1, "delete": -1}
#: the optional field of an envelope saying how many copies of the row it inserts or deletes
COPIES = "weight"


#: the column types whose values ``typed_value`` reads from text (JSON strings, CSV fields)
TYPED = (DecimalType, DateType, TimestampType, TimestampNTZType)


class DecodeError(ValueError):
    """Why one record cannot be a row of the input."""


def decode(value: bytes | None, columns: Sequence[str],
           fmt: str = "json") -> tuple[dict[str, Any], int]:
    """One record → ``(row, weight)``; raises ``DecodeError`` naming the problem."""
    if value is None:
        raise DecodeError("empty record (no value)")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DecodeError(f"not UTF-8: {e}") from None
    return _decode_json(text, columns) if fmt == "json" else _decode_csv(text, columns)


def _decode_json(text: str, columns: Sequence[str]) -> tuple[dict[str, Any], int]:
    try:
        data = json.loads(text, parse_float=decimal.Decimal)  # numbers exactly as written
    except json.JSONDecodeError as e:
        raise DecodeError(f"undecodable JSON: {e}") from None
    if not isinstance(data, dict):
        raise DecodeError(f"a record must be a JSON object, got {type(data).__name__}")
    weight = 1
    envelope = [k for k in data if k != COPIES and k not in columns]
    if len(envelope) == 1 and len(data) == 1 + (COPIES in data and COPIES not in columns):
        key, row = envelope[0], data[envelope[0]]
        if key not in ENVELOPES:
            raise DecodeError(f"unknown envelope '{key}' (expected 'insert' or 'delete', or a "
                              f"plain row of ({', '.join(columns)}))")
        if not isinstance(row, dict):
            raise DecodeError(f"'{key}' must hold a JSON object, got {type(row).__name__}")
        copies = data.get(COPIES, 1)
        if isinstance(copies, bool) or not isinstance(copies, int) or not \
                0 < copies <= MAX_WEIGHT:
            raise DecodeError(f"'{COPIES}' must be an integer from 1 to {MAX_WEIGHT}, got "
                              f"{copies!r}")
        data, weight = row, ENVELOPES[key] * copies
    unknown = [k for k in data if k not in columns]
    missing = [c for c in columns if c not in data]
    if unknown or missing:
        parts = ([f"unknown field(s) {unknown}"] if unknown else []) + (
            [f"missing field(s) {missing}"] if missing else [])
        raise DecodeError("; ".join(parts) + f"; the input has ({', '.join(columns)})")
    return data, weight


def _decode_csv(text: str, columns: Sequence[str]) -> tuple[dict[str, Any], int]:
    try:
        (fields,) = list(csv.reader(io.StringIO(text.rstrip("\r\n"))))
    except (csv.Error, ValueError) as e:
        raise DecodeError(f"not one CSV line: {e}") from None
    weight = 1
    if len(fields) == len(columns) + 1:
        last = fields.pop()
        try:
            weight = int(last)
        except ValueError:
            raise DecodeError(f"the weight field must be an integer, got {last!r}") from None
        if weight == 0 or abs(weight) > MAX_WEIGHT:
            raise DecodeError(f"the weight field must be {records.WEIGHT_RULE}, got {last!r}")
    if len(fields) != len(columns):
        raise DecodeError(f"{len(fields)} fields, the input has {len(columns)} columns "
                          f"({', '.join(columns)}) and an optional weight")
    return {c: (None if f == "" else f) for c, f in zip(columns, fields)}, weight


@dataclass
class Batch:
    """Decoded records of one input: the valid ones as a Z-set, the rest with their problem.

    ``rows`` holds ``(position, row, weight)``; ``to_zset`` type-checks them against the input
    and moves a record whose values do not fit to ``bad``."""

    input_name: str
    columns: list[str]
    fmt: str = "json"
    rows: list[tuple[Any, dict[str, Any], int]] = field(default_factory=list)
    bad: list[tuple[Any, str]] = field(default_factory=list)

    def add(self, position: Any, value: bytes | None) -> None:
        try:
            row, weight = decode(value, self.columns, self.fmt)
        except DecodeError as e:
            self.bad.append((position, str(e)))
            return
        self.rows.append((position, row, weight))

    def to_zset(self, schema: StructType, arrow_schema: pa.Schema) -> pa.Table:
        """The valid rows as an Arrow Z-set of the input (payload + ``_weight``)."""
        try:
            return self._convert(self.rows, schema, arrow_schema)
        except InputError:
            pass
        good = []
        for item in self.rows:  # find the records at fault, one by one
            try:
                self._convert([item], schema, arrow_schema)
                good.append(item)
            except InputError as e:
                self.bad.append((item[0], e.problem if e.column is None
                                 else f"column '{e.column}': {e.problem}"))
        self.rows = good
        return self._convert(good, schema, arrow_schema)

    def _convert(self, items: list[tuple[Any, dict[str, Any], int]], schema: StructType,
                 arrow_schema: pa.Schema) -> pa.Table:
        rows: Any = [row for _, row, _ in items]
        if self.fmt == "csv":  # text fields: Arrow casts them to the column types
            columns = {}
            for f in schema.fields:
                values = [r[f.name] for r in rows]
                if isinstance(f.dataType, TYPED):  # read here, as in JSON
                    columns[f.name] = pa.array(
                        [self._typed(f.name, v, f.dataType) for v in values],
                        arrow_schema.field(f.name).type)
                else:
                    columns[f.name] = pa.array(values, pa.string())
            rows = pa.table(columns)
        else:
            rows = [{f.name: self._typed(f.name, row[f.name], f.dataType)
                     for f in schema.fields} for row in rows]
        table = records.to_arrow(self.input_name, rows, schema, arrow_schema, 1,
                                 text_converts=self.fmt == "csv")
        weights = pa.array([w for _, _, w in items], pa.int64())
        return table.set_column(table.schema.get_field_index(WEIGHT),
                                arrow_schema.field(WEIGHT), weights)


    def _typed(self, column: str, value: Any, t: DataType) -> Any:
        """A decoded value as the Python value of column type ``t`` (see the module docstring);
        a value that cannot be one is an ``InputError`` naming the column."""
        try:
            return typed_value(value, t)
        except ValueError as e:
            raise InputError(self.input_name, str(e), column=column) from None


def typed_value(value: Any, t: DataType) -> Any:
    """``value`` as read from a record (JSON numbers as ``Decimal``) → the Python value a column
    of type ``t`` takes; raises ``ValueError`` saying why it cannot be one. Values of other
    types pass through (the schema check names what is wrong with them)."""
    if isinstance(value, decimal.Decimal) and not isinstance(t, DecimalType):
        return float(value)  # exactly float(text): both round the written digits once
    if isinstance(t, DecimalType) and isinstance(value, (str, decimal.Decimal, int)) \
            and not isinstance(value, bool):
        return _decimal(value, t)
    if not isinstance(value, str):
        return value
    if isinstance(t, DateType):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"value {value!r} is not a date (YYYY-MM-DD)") from None
    if isinstance(t, (TimestampType, TimestampNTZType)):
        try:
            stamp = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"value {value!r} is not an ISO 8601 timestamp "
                             "(YYYY-MM-DDTHH:MM:SS[.ffffff][+HH:MM|Z])") from None
        if isinstance(t, TimestampNTZType):
            if stamp.tzinfo is not None:
                raise ValueError(f"value {value!r} has a time zone offset; the column is a "
                                 "TIMESTAMP_NTZ (no time zone)")
            return stamp
        if stamp.tzinfo is None:
            return stamp.replace(tzinfo=dt.UTC)
        try:
            return stamp.astimezone(dt.UTC)
        except OverflowError:
            raise ValueError(f"value {value!r} is out of the timestamp range in UTC "
                             "(years 1 to 9999)") from None
    return value


#: the CSV fields Arrow reads as NULL in a column that is not a string (its defaults)
CSV_NULLS = frozenset(pa_csv.ConvertOptions().null_values)


def typed_text_columns(input_name: str, table: pa.Table, schema: StructType,
                       csv_nulls: bool = False) -> pa.Table:
    """``table`` (records read from a file) with each string column that ``schema`` says is a
    DATE or TIMESTAMP read by ``typed_value`` (with ``csv_nulls``, the fields Arrow reads as
    NULL in CSV are NULL), and each DECIMAL column checked to fit its type (a reader checks
    digits, not the value padded to the scale); a value that is not one is an ``InputError``
    naming the record and the column."""
    for f in schema.fields:
        if isinstance(f.dataType, DecimalType) and f.name in table.column_names:
            for n, v in enumerate(table.column(f.name).to_pylist()):
                if v is None:
                    continue
                try:
                    _decimal(v, f.dataType)
                except ValueError as e:
                    raise InputError(input_name, str(e), record_index=n, column=f.name,
                                     record=table.slice(n, 1).to_pylist()[0]) from None
    for f in schema.fields:
        if not isinstance(f.dataType, (DateType, TimestampType, TimestampNTZType)) \
                or f.name not in table.column_names:
            continue
        i = table.schema.get_field_index(f.name)
        if not pa.types.is_string(table.schema.field(i).type):
            continue
        values = []
        for n, v in enumerate(table.column(i).to_pylist()):
            if csv_nulls and v in CSV_NULLS:
                v = None
            try:
                values.append(typed_value(v, f.dataType))
            except ValueError as e:
                raise InputError(input_name, str(e), record_index=n, column=f.name,
                                 record=table.slice(n, 1).to_pylist()[0]) from None
        arrow_type = (pa.date32() if isinstance(f.dataType, DateType) else
                      pa.timestamp("us", tz="UTC") if isinstance(f.dataType, TimestampType)
                      else pa.timestamp("us"))
        table = table.set_column(i, pa.field(f.name, arrow_type), pa.array(values, arrow_type))
    return table


def _decimal(value: str | decimal.Decimal | int, t: DecimalType) -> decimal.Decimal:
    with decimal.localcontext(decimal.Context(prec=200)):  # exact for any DECIMAL(38, s)
        try:
            number = decimal.Decimal(value.strip() if isinstance(value, str) else value)
        except decimal.InvalidOperation:
            raise ValueError(f"value {value!r} is not a decimal number") from None
        if not number.is_finite():
            raise ValueError(f"value {value!r} is not a finite decimal number")
        exponent = number.as_tuple().exponent
        assert isinstance(exponent, int)  # finite
        if abs(exponent) > 100:
            raise ValueError(f"value {value} does not fit {t.simpleString()}")
        places = max(0, -exponent)
        if places > t.scale and number != number.quantize(decimal.Decimal(1).scaleb(-t.scale)):
            raise ValueError(f"value {value} has {places} digits after the point; the column "
                             f"{t.simpleString()} holds {t.scale} (it is not rounded)")
        if number.copy_abs() >= decimal.Decimal(10) ** (t.precision - t.scale):
            raise ValueError(f"value {value} does not fit {t.simpleString()} (at most "
                             f"{t.precision - t.scale} digits before the point)")
        return number


def json_value(value: Any) -> Any:
    """How ``json.dumps`` writes a value it has no JSON type for: a decimal as the string of
    its exact digits, a date or timestamp in ISO 8601 (a timestamp with its offset)."""
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def encode_change(row: dict[str, Any], weight: int) -> bytes:
    """A view's change row as one record: ``{"insert": row}`` or ``{"delete": row}``, with
    ``"weight": |weight|`` when the row changed by more than one copy (a view's weights reach
    2**62, far too many copies to send one by one)."""
    record: dict[str, Any] = {"insert" if weight > 0 else "delete": row}
    if abs(weight) != 1:
        record["weight"] = abs(weight)
    return json.dumps(record, sort_keys=True, default=json_value).encode()
