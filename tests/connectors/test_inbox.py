"""The inbox never loses a file silently: identity by content, files still being written wait,
links and other non-regular entries are rejected unopened, done/ and rejected/ never overwrite,
error files are private and bounded. Real pipeline (driver-path steps, Delta logs on disk)."""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import time
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.connectors import inbox
from dbsp_pipeline.examples.shop import shop_circuit

AGE = 60.0  # how long ago a settled file was written (well past the default interval)


@pytest.fixture
def box(tmp_path):
    return str(tmp_path / "inbox")


@pytest.fixture
def pipeline(spark, tmp_path):
    with Pipeline(shop_circuit(), str(tmp_path / "shop"), spark) as p:
        yield p


def drop(box: str, input_name: str, file: str, text: str, age: float = AGE) -> str:
    """Write ``file`` as a producer must (hidden name, then renamed), written ``age`` s ago."""
    folder = os.path.join(box, input_name)
    os.makedirs(folder, exist_ok=True)
    tmp, path = os.path.join(folder, "." + file), os.path.join(folder, file)
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    backdate(path, age)
    return path


def backdate(path: str, age: float) -> None:
    t = time.time() - age
    os.utime(path, (t, t))


def jsonl(*records: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def regions(p) -> dict:
    table = p.view_arrow("regions")
    return dict(zip(table.column("region").to_pylist(), table.column("_weight").to_pylist()))


def listing(box: str, input_name: str, sub: str) -> list[str]:
    return sorted(os.listdir(os.path.join(box, input_name, sub)))


def read(box: str, input_name: str, sub: str, name: str) -> str:
    with open(os.path.join(box, input_name, sub, name)) as fh:
        return fh.read()


# -- identity: name and content ----------------------------------------------------------------
def test_a_reused_name_with_new_content_is_pushed_and_both_files_stay_in_done(pipeline, box):
    first = jsonl({"customer_id": 1, "region": "north"})
    drop(box, "customers", "c.jsonl", first)
    assert inbox.ingest(pipeline, box).pushed == {"customers": {"c.jsonl": 1}}
    second = jsonl({"customer_id": 2, "region": "south"}, {"customer_id": 3, "region": "east"})
    drop(box, "customers", "c.jsonl", second)
    assert inbox.ingest(pipeline, box).pushed == {"customers": {"c.jsonl": 2}}
    pipeline.step()
    assert regions(pipeline) == {"north": 1, "south": 1, "east": 1}
    (other,) = set(listing(box, "customers", "done")) - {"c.jsonl"}
    assert other.startswith("c.") and other.endswith(".jsonl")  # c.<12 hex>.jsonl
    assert read(box, "customers", "done", "c.jsonl") == first
    assert read(box, "customers", "done", other) == second


def test_the_same_content_under_the_same_name_is_pushed_once(pipeline, box):
    # As after a crash between the push and the move: the pushed file is in the inbox again.
    text = jsonl({"customer_id": 1, "region": "north"})
    drop(box, "customers", "c.jsonl", text)
    assert inbox.ingest(pipeline, box).pushed == {"customers": {"c.jsonl": 1}}
    drop(box, "customers", "c.jsonl", text)
    assert inbox.ingest(pipeline, box).pushed == {"customers": {"c.jsonl": 0}}
    drop(box, "customers", "c.jsonl", text)  # a third time: a third distinct name in done/
    assert inbox.ingest(pipeline, box).pushed == {"customers": {"c.jsonl": 0}}
    assert pipeline.step().inputs["customers"] == 1
    assert regions(pipeline) == {"north": 1}
    done = listing(box, "customers", "done")
    assert len(done) == 3 and all(read(box, "customers", "done", n) == text for n in done)
    # the same content under another name is another file
    drop(box, "customers", "c2.jsonl", text)
    assert inbox.ingest(pipeline, box).pushed == {"customers": {"c2.jsonl": 1}}


def test_a_file_is_read_once_and_its_bytes_are_what_is_hashed(box):
    path = drop(box, "customers", "c.jsonl", jsonl({"customer_id": 1, "region": "north"}))
    (entry,) = inbox.pending_files(box, ["customers"])["customers"]
    with open(path, "rb") as fh:
        assert inbox.read_settled(entry) == fh.read()
    with open(path, "a") as fh:  # changed after it was listed: not read this time
        fh.write(jsonl({"customer_id": 2, "region": "south"}))
    assert inbox.read_settled(entry) is None


def test_a_file_replaced_after_it_was_read_is_left_for_the_next_ingest(box):
    drop(box, "customers", "c.jsonl", jsonl({"customer_id": 1, "region": "north"}))
    (entry,) = inbox.pending_files(box, ["customers"])["customers"]
    new = jsonl({"customer_id": 2, "region": "south"})
    drop(box, "customers", "c.jsonl", new)  # a new file under the name, renamed over it
    assert inbox.move_unique(entry, inbox.DONE, "0" * 64) is None
    assert inbox.move_unique(entry, inbox.REJECTED, None, error="bad") is None
    assert listing(box, "customers", inbox.DONE) == listing(box, "customers", inbox.REJECTED) == []
    with open(os.path.join(box, "customers", "c.jsonl")) as fh:
        assert fh.read() == new


# -- files still being written -----------------------------------------------------------------
def test_a_file_written_in_place_waits_until_it_settles(pipeline, box):
    folder = os.path.join(box, "customers")
    os.makedirs(folder)
    path = os.path.join(folder, "c.jsonl")
    with open(path, "w") as fh:  # not renamed: the writer is still at it
        fh.write(jsonl({"customer_id": 1, "region": "north"}))
        fh.flush()
        assert inbox.pending_files(box, ["customers"], settle_seconds=5) == {}
        assert inbox.ingest(pipeline, box, settle_seconds=5).pushed == {}
        fh.write(jsonl({"customer_id": 2, "region": "south"}))
    assert os.listdir(folder) == ["c.jsonl"]
    backdate(path, 6)  # unchanged for longer than the interval
    assert inbox.ingest(pipeline, box, settle_seconds=5).pushed == {"customers": {"c.jsonl": 2}}
    pipeline.step()
    assert regions(pipeline) == {"north": 1, "south": 1}


def test_the_default_interval_applies_and_zero_trusts_the_writer(pipeline, box):
    drop(box, "customers", "c.jsonl", jsonl({"customer_id": 1, "region": "north"}), age=0)
    assert inbox.ingest(pipeline, box).pushed == {}
    assert inbox.ingest(pipeline, box, settle_seconds=0).pushed == {"customers": {"c.jsonl": 1}}


# -- links and other non-regular entries -------------------------------------------------------
def test_a_symlink_is_rejected_without_reading_its_target(pipeline, box, tmp_path):
    secret = tmp_path / "credentials"
    secret.write_text("[default]\naws_secret_access_key = SECRET-hunter2, x\n")
    secret.chmod(0o600)
    folder = os.path.join(box, "customers")
    os.makedirs(folder)
    os.symlink(secret, os.path.join(folder, "creds.csv"))
    os.symlink(tmp_path / "nowhere", os.path.join(folder, "dangling.jsonl"))
    result = inbox.ingest(pipeline, box)
    assert "SECRET" not in str(result.rejected)
    assert result.pushed == {} and set(result.rejected["customers"]) == {"creds.csv",
                                                                           "dangling.jsonl"}
    rejected = os.path.join(folder, "rejected")
    assert os.readlink(os.path.join(rejected, "creds.csv")) == str(secret)  # the link moved
    assert os.readlink(os.path.join(rejected, "dangling.jsonl")) == str(tmp_path / "nowhere")
    error = read(box, "customers", "rejected", "creds.csv.error.txt")
    assert "file creds.csv: input 'customers': is a symbolic link" in error
    assert "SECRET" not in error and "SECRET" not in result.rejected["customers"]["creds.csv"]
    assert secret.read_text().startswith("[default]")  # the target is untouched
    assert sorted(os.listdir(folder)) == ["rejected"]


def test_a_fifo_and_a_directory_with_an_inbox_suffix_are_rejected(pipeline, box):
    folder = os.path.join(box, "orders")
    os.makedirs(os.path.join(folder, "batch.csv"))
    os.mkfifo(os.path.join(folder, "pipe.jsonl"))  # opening it to read would block
    assert {e.name for e in inbox.pending_files(box, ["orders"])["orders"]} == {
        "batch.csv", "pipe.jsonl"}
    result = inbox.ingest(pipeline, box)
    assert "is a directory, not a regular file" in result.rejected["orders"]["batch.csv"]
    assert "is a FIFO, not a regular file" in result.rejected["orders"]["pipe.jsonl"]
    assert listing(box, "orders", "rejected") == [
        "batch.csv", "batch.csv.error.txt", "pipe.jsonl", "pipe.jsonl.error.txt"]
    assert stat.S_ISFIFO(os.lstat(os.path.join(folder, "rejected", "pipe.jsonl")).st_mode)


# -- error files -------------------------------------------------------------------------------
def test_error_files_are_private_bounded_and_never_overwritten(pipeline, box):
    huge = "x" * 20_000
    drop(box, "orders", "bad.csv", f"order_id,customer_id,amount\n1,1,2.0\n{huge},1,3.0\n")
    result = inbox.ingest(pipeline, box)
    mode = os.stat(os.path.join(box, "orders", "rejected", "bad.csv.error.txt")).st_mode
    assert stat.S_IMODE(mode) == 0o600
    problem = result.rejected["orders"]["bad.csv"]
    error = read(box, "orders", "rejected", "bad.csv.error.txt")
    assert error == problem + "\n"
    assert "file bad.csv, line 3: input 'orders'" in error and "order_id" in error
    assert len(error) < 600 and "more characters not shown" in error
    # a parser error that quotes the line is bounded too
    drop(box, "orders", "bad.csv", f"order_id,customer_id,amount\n1,1,2.0,{huge}\n")
    second = inbox.ingest(pipeline, box).rejected["orders"]["bad.csv"]
    assert "cannot be parsed as csv" in second and len(second) < 600
    # the second bad.csv landed beside the first, each with its own error file
    names = set(listing(box, "orders", "rejected"))
    (other,) = {n for n in names if not n.endswith(".error.txt")} - {"bad.csv"}
    assert names == {"bad.csv", "bad.csv.error.txt", other, other + ".error.txt"}
    assert read(box, "orders", "rejected", other).endswith(f"2.0,{huge}\n")
    assert read(box, "orders", "rejected", "bad.csv").endswith(f"{huge},1,3.0\n")
    assert pipeline.step().inputs == {"orders": 0, "customers": 0}  # nothing of them pushed


def test_a_parquet_file_whose_bytes_changed_is_rejected_as_damaged(pipeline, box):
    """A Parquet file written with page checksums (pyarrow's ``write_page_checksum``, Spark's
    ``parquet.page.write-checksum.enabled``) whose bytes changed on the way is rejected as
    damaged, not read as other values."""
    table = pa.table({"order_id": pa.array(range(1000), pa.int64()),
                      "customer_id": pa.array([1] * 1000, pa.int64()),
                      "amount": pa.array([float(i) for i in range(1000)])})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="none", write_page_checksum=True)
    data = bytearray(sink.getvalue().to_pybytes())
    data[300] ^= 0xFF  # a byte of the first column's values
    folder = os.path.join(box, "orders")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "damaged.parquet")
    with open(path, "wb") as fh:
        fh.write(bytes(data))
    backdate(path, AGE)
    problem = inbox.ingest(pipeline, box).rejected["orders"]["damaged.parquet"]
    assert "input 'orders'" in problem and "is damaged" in problem and "CRC" in problem
    assert listing(box, "orders", "rejected") == ["damaged.parquet", "damaged.parquet.error.txt"]
    assert pipeline.step().inputs == {"orders": 0, "customers": 0}


# -- what a user gets wrong ---------------------------------------------------------------------
def test_a_bad_record_is_named_by_its_line_record_and_column(pipeline, box):
    """A file Arrow cannot read (a JSON value of another type than the column's, a line that is
    not JSON) or whose record the push refuses names the line of the file, the record (counted
    from 0) and the column, in the input's terms; a cut-off Parquet file says it is cut off."""
    drop(box, "customers", "types.jsonl",
         '{"customer_id": 1, "region": "a"}\n\n{"customer_id": "x", "region": "b"}\n')
    drop(box, "customers", "broken.jsonl", '{"customer_id": 1, "region": "a"}\n{"customer_id"\n')
    drop(box, "customers", "types.csv", "customer_id,region\n1,north\n\nx,south\n")
    whole = pa.BufferOutputStream()
    pq.write_table(pa.table({"customer_id": [1], "region": ["a"]}), whole)
    folder = os.path.join(box, "customers")
    with open(os.path.join(folder, "cut.parquet"), "wb") as fh:
        fh.write(whole.getvalue().to_pybytes()[:-20])
    backdate(os.path.join(folder, "cut.parquet"), AGE)
    rejected = inbox.ingest(pipeline, box).rejected["customers"]
    assert rejected["types.jsonl"].startswith(
        "file types.jsonl, line 3: input 'customers', record 1 {'customer_id': 'x', "
        "'region': 'b'}, column 'customer_id': value 'x' is str"), rejected["types.jsonl"]
    assert rejected["broken.jsonl"].startswith(
        "file broken.jsonl, line 2: input 'customers', record 1 '{\"customer_id\"': is not "
        "valid JSON"), rejected["broken.jsonl"]
    assert rejected["types.csv"].startswith(
        "file types.csv, line 4: input 'customers', record 1, column 'customer_id': value 'x'"), \
        rejected["types.csv"]
    assert "is not a whole Parquet file" in rejected["cut.parquet"], rejected["cut.parquet"]
    assert pipeline.step().inputs == {"orders": 0, "customers": 0}


def test_a_number_too_large_for_its_column_is_refused_not_read_as_infinity(pipeline, box):
    drop(box, "orders", "big.csv", "order_id,customer_id,amount\n1,1,5\n2,1,1e400\n")
    drop(box, "orders", "big.jsonl", jsonl({"order_id": 3, "customer_id": 1, "amount": 5},
                                           {"order_id": 4, "customer_id": 1, "amount": 2})
         .replace('"amount": 2}', '"amount": -1e999}'))
    drop(box, "orders", "inf.csv", "order_id,customer_id,amount\n5,1,inf\n6,1,-Infinity\n")
    result = inbox.ingest(pipeline, box)
    assert result.rejected["orders"]["big.csv"].startswith(
        "file big.csv, line 3: input 'orders', record 1, column 'amount': value 1e400 is too "
        "large for double"), result.rejected["orders"]["big.csv"]
    assert "record 1, column 'amount': a number is too large for double" in \
        result.rejected["orders"]["big.jsonl"], result.rejected["orders"]["big.jsonl"]
    assert result.pushed == {"orders": {"inf.csv": 2}}  # infinities written as such


def test_no_records_and_any_case_are_read_and_what_is_never_read_is_reported(pipeline, box):
    """An empty JSON lines file and a CSV file of its header hold no records (both are done);
    a suffix in capitals is read; a file of another suffix, and a folder naming no input, are
    reported as ignored and left where they are."""
    drop(box, "customers", "empty.jsonl", "")
    drop(box, "customers", "header.csv", "customer_id,region\n")
    drop(box, "customers", "LOUD.CSV", "customer_id,region\n5,east\n")
    drop(box, "customers", "data.json", '{"customer_id": 6, "region": "west"}')
    drop(box, "custmers", "typo.csv", "customer_id,region\n7,north\n")
    drop(box, "customers", "part.csv.tmp", "customer_id,region\n")  # being written: quiet
    result = inbox.ingest(pipeline, box)
    assert result.pushed == {"customers": {"empty.jsonl": 0, "header.csv": 0, "LOUD.CSV": 1}}
    assert result.rejected == {}
    assert result.ignored == {
        "custmers": "names no input of the pipeline (its inputs: orders, customers); nothing "
                    "in it is read",
        "customers/data.json": "is not read: the inbox reads .jsonl, .csv and .parquet files "
                               "(rename it to one of them)"}
    assert listing(box, "customers", "done") == ["LOUD.CSV", "empty.jsonl", "header.csv"]
    assert os.path.exists(os.path.join(box, "customers", "data.json"))
    pipeline.step()
    assert regions(pipeline) == {"east": 1}


# -- typed values ------------------------------------------------------------------------------
def test_decimal_date_and_timestamp_columns_are_read_exactly_from_jsonl_and_csv(spark, tmp_path,
                                                                               box):
    c = Circuit("pay")
    pay = c.input("payments", "id BIGINT, amount DECIMAL(10,2), day DATE, at TIMESTAMP")
    c.output("by_day", pay.group_by("day").agg(total="sum(amount)", last="max(at)"))
    with Pipeline(c, str(tmp_path / "pay"), spark) as p:
        drop(box, "payments", "a.jsonl", jsonl(
            {"id": 1, "amount": 0.1, "day": "2024-01-31", "at": "2024-01-31T10:00:00"},
            {"id": 2, "amount": "0.20", "day": "2024-01-31", "at": "2024-01-31 12:00:00+02:00"},
            {"id": 3, "amount": 12345678.99, "day": None, "at": None}))
        drop(box, "payments", "b.csv", "id,amount,day,at\n4,0.7,2024-02-01,2024-02-01 09:30:00\n")
        drop(box, "payments", "c.jsonl", jsonl(
            {"id": 5, "amount": 1.005, "day": "2024-02-01", "at": None}))
        drop(box, "payments", "d.csv", "id,amount,day,at\n6,123456789,,\n")  # 11 digits
        drop(box, "payments", "e.jsonl", jsonl({"id": 7, "day": None, "at": None}))
        drop(box, "payments", "f.csv", "id,amount,day,at\n8,1,,NULL\n")  # NULL date, time
        drop(box, "payments", "g.jsonl", jsonl(  # the bad one is the second, not a typed one
            {"id": 9, "amount": 1.5, "day": "2024-01-31", "at": None},
            {"id": "ten", "amount": 2.5, "day": "2024-01-31", "at": None}))
        result = inbox.ingest(p, box)
        assert result.pushed == {"payments": {"a.jsonl": 3, "b.csv": 1, "f.csv": 1}}
        assert result.rejected["payments"]["g.jsonl"].startswith(
            "file g.jsonl, line 2: input 'payments', record 1"), result.rejected["payments"]
        assert "column 'id': value 'ten' is str" in result.rejected["payments"]["g.jsonl"]
        problem = result.rejected["payments"]["c.jsonl"]
        assert "c.jsonl" in problem and "1.005 requires scale 3" in problem  # not rounded
        assert "123456789.00 does not fit decimal(10,2)" in result.rejected["payments"]["d.csv"]
        assert "missing column(s) ['amount']" in result.rejected["payments"]["e.jsonl"]
        p.step()
        rows = {r["day"]: (r["total"], r["last"]) for r in p.view_arrow("by_day").to_pylist()}
        utc = dt.UTC
        assert rows == {
            dt.date(2024, 1, 31): (Decimal("0.30"), dt.datetime(2024, 1, 31, 10, tzinfo=utc)),
            dt.date(2024, 2, 1): (Decimal("0.70"), dt.datetime(2024, 2, 1, 9, 30, tzinfo=utc)),
            None: (Decimal("12345679.99"), None)}
