"""Record formats: a changed row is one record whatever its weight, and an envelope's
``weight`` is read back within the input weight range."""

from __future__ import annotations

import json

import pytest

from dbsp_pipeline.connectors.codec import DecodeError, decode, encode_change

COLUMNS = ["k", "v"]


@pytest.mark.parametrize("weight", [1, -1, 7, -(2**62)])
def test_a_changed_row_is_one_record_and_reads_back(weight):
    record = encode_change({"k": 1, "v": "x"}, weight)
    kind = "insert" if weight > 0 else "delete"
    assert json.loads(record) == ({kind: {"k": 1, "v": "x"}} if abs(weight) == 1 else
                                  {kind: {"k": 1, "v": "x"}, "weight": abs(weight)})
    if abs(weight) < 2**31:
        assert decode(record, COLUMNS) == ({"k": 1, "v": "x"}, weight)


@pytest.mark.parametrize("copies", [0, -2, 2**31, 1.5, True, "3"])
def test_an_envelope_weight_out_of_range_is_a_clear_problem(copies):
    value = json.dumps({"insert": {"k": 1, "v": "x"}, "weight": copies}).encode()
    with pytest.raises(DecodeError, match="'weight' must be an integer from 1 to 2147483647"):
        decode(value, COLUMNS)


def test_a_column_named_weight_is_a_plain_row():
    assert decode(b'{"k": 1, "weight": 5}', ["k", "weight"]) == ({"k": 1, "weight": 5}, 1)
    assert decode(b'{"insert": {"k": 1, "weight": 5}}', ["k", "weight"]) == (
        {"k": 1, "weight": 5}, 1)


@pytest.mark.parametrize("line, problem", [
    (b"1,x," + str(2**70).encode(), "weight field must be a non-zero integer of absolute value"),
    (b"1,x,0", "weight field must be a non-zero integer"),
])
def test_csv_weights_are_range_checked(line, problem):
    with pytest.raises(DecodeError, match=problem):
        decode(line, COLUMNS, "csv")
