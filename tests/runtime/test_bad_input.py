"""Bad input gets a clear error naming the input, the record and the problem; nothing already
pushed is lost."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.logger import PySparkLogger

from dbsp_pipeline import (
    Circuit,
    CircuitError,
    InputError,
    Pipeline,
    PipelineClosedError,
    StepFailedError,
    UnknownNameError,
)
from dbsp_pipeline.examples.shop import shop_circuit
from tests.conftest import view_counter


@pytest.fixture(scope="module")
def pipeline(spark, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("bad_input"))
    p = Pipeline(shop_circuit(), root=root, spark=spark)
    p.push("customers", [(1, "north")])
    p.push("orders", [(1, 1, 50.0)])  # accepted before every bad push below
    yield p
    p.close()


@pytest.mark.parametrize("rows, weight, match", [
    ([{"order_id": 2, "customer": 1, "amount": 5.0}], 1,
     r"input 'orders', record 0 .*unknown column\(s\) \['customer'\]"),
    ([{"order_id": 2, "amount": 5.0}], 1, r"record 0 .*missing column\(s\) \['customer_id'\]"),
    ([(2, 1, 5.0), (3, "one", 5.0)], 1,
     r"input 'orders', record 1 .*column 'customer_id': value 'one' is str, expected a whole"),
    ([(2, 1, 5.0), (3, 1.5, 5.0)], 1, r"record 1 .*column 'customer_id': value 1.5 is float"),
    ([(2, 1, "5.0")], 1, r"record 0 .*column 'amount': value '5.0' is str, expected a number"),
    ([(2, 1)], 1, r"record 0 .*has 2 values, the input has 3 columns"),
    ([(2, True, 1.0)], 1, r"column 'customer_id': value True is bool"),
    (["not a record"], 1, r"record 0 .*must be a dict or a tuple"),
    ([(2, 1, 5.0)], 0, r"weight must be a non-zero integer"),
    ([(2, 1, 5.0)], 1.5, r"weight must be a non-zero integer"),
    ("orders.csv", 1, r"rows must be a list of dicts or tuples"),
    (pd.DataFrame({"order_id": [1], "customer_id": [1]}), 1, r"missing column\(s\) \['amount'\]"),
    (pd.DataFrame({"order_id": [1], "customer_id": ["x"], "amount": [1.0]}), 1,
     r"input 'orders', record 0 .*column 'customer_id'"),
])
def test_bad_records_are_rejected_and_nothing_is_lost(pipeline, rows, weight, match):
    with pytest.raises(InputError, match=match) as e:
        pipeline.push("orders", rows, weight=weight)
    assert e.value.input_name == "orders"


def test_spark_frames_with_wrong_types_are_rejected(pipeline, spark):
    df = spark.createDataFrame([(1, "x", 1.0)],
                               "order_id BIGINT, customer_id STRING, amount DOUBLE")
    with pytest.raises(InputError,
                       match=r"column 'customer_id': column is string, expected bigint"):
        pipeline.push("orders", df)
    rounding = spark.createDataFrame([(1, 2.5, 1.0)],
                                     "order_id BIGINT, customer_id DOUBLE, amount DOUBLE")
    with pytest.raises(InputError, match=r"column 'customer_id': column is double, expected "
                                         r"bigint \(a cast would round its values"):
        pipeline.push("orders", rounding)  # (Spark's cast would make 2.5 a 2)
    widened = spark.createDataFrame([(1, 7, 1)], "order_id INT, customer_id INT, amount INT")
    assert pipeline.push("orders", widened) == 1


@pytest.mark.parametrize("table, match", [
    (pa.table({"order_id": [2], "customer_id": [1], "amount": [5.0]}), r"'_weight' column"),
    (pa.table({"order_id": [2, 3], "customer_id": [1, 1], "amount": [5.0, 6.0],
               "_weight": [2, 0]}), r"record 1 .*weight must be a non-zero integer .*, got 0"),
    (pa.table({"order_id": [2], "customer_id": [1], "amount": [5.0],
               "_weight": pa.array([None], pa.int64())}), r"record 0 .*got None"),
    (pa.table({"order_id": [2, 3, 4], "customer_id": [1, 1, 1], "amount": [5.0, 6.0, 7.0],
               "_weight": [-1, 0, 1]}), r"record 1 .*weight must be a non-zero integer .*got 0"),
    (pa.table({"order_id": [2, 3], "customer_id": [1, 1], "amount": [5.0, 6.0],
               "_weight": [1, 2**31]}), r"record 1 .*got 2147483648"),
    (pa.table({"order_id": [2, 3], "customer_id": [1, 1], "amount": [5.0, 6.0],
               "_weight": [-(2**31), -1]}), r"record 0 .*got -2147483648"),
    (pa.table({"order_id": [2], "customer_id": [1], "amount": [5.0],
               "_weight": pa.array([2**63], pa.uint64())}), r"record 0 .*got 9223372036854775808"),
    (pa.table({"order_id": [2], "customer_id": [1], "amount": [5.0], "_weight": [1.0]}),
     r"column '_weight'.*expected an integer type"),
    (pa.table({"order_id": [2], "customer_id": ["x"], "amount": [5.0], "_weight": [1]}),
     r"record 0, column 'customer_id': value 'x' \(string\) does not convert to int64"),
])
def test_bad_zsets_are_rejected(pipeline, table, match):
    with pytest.raises(InputError, match=match) as e:
        pipeline.push_zset("orders", table)
    assert e.value.input_name == "orders"


def test_unknown_input_names_the_inputs(pipeline):
    with pytest.raises(UnknownNameError, match=r"unknown input 'order'.*\['customers', 'orders'\]"):
        pipeline.push("order", [(1, 1, 1.0)])
    with pytest.raises(UnknownNameError, match=r"unknown output 'revenue'"):
        pipeline.view("revenue")


def test_after_all_rejections_the_accepted_input_is_intact(pipeline):
    # Runs after the rejections above (same module-scoped pipeline): only the good rows count.
    pipeline.step()
    assert view_counter(pipeline.view("revenue_by_region")) == {("north", 50.0, 1, 50.0): 1}


def test_push_to_a_closed_pipeline_is_refused_and_reopening_keeps_the_input(spark, tmp_path):
    root = str(tmp_path)
    p = Pipeline(shop_circuit(), root=root, spark=spark)
    p.push("customers", [(1, "north")])
    p.close()
    with pytest.raises(PipelineClosedError, match="is closed"):
        p.push("orders", [(1, 1, 50.0)])
    with pytest.raises(PipelineClosedError):
        p.step()
    with Pipeline(shop_circuit(), root=root, spark=spark) as again:
        again.step()
        assert view_counter(again.view("regions")) == {("north",): 1}


@pytest.mark.parametrize("build, match", [
    (lambda c: c.input("x", "a INT, _b INT"), r"column '_b' is reserved"),
    (lambda c: c.input("x", "a INT").select("a AS _a"), r"column '_a' is reserved"),
    (lambda c: c.input("x", "a INT").select("nope + 1 AS b"), r"operator #1 select.*nope"),
    (lambda c: c.input("x", "a INT").filter("a + 1"), r"is int, not boolean"),
    (lambda c: c.input("x", "a INT").join(c.input("y", "b INT"), on="a"),
     r"key column\(s\) \['a'\] not in the right side"),
    (lambda c: c.input("x", "a INT, v INT").join(c.input("y", "a INT, v INT"), on="a"),
     r"both sides have column\(s\) \['v'\]"),
    (lambda c: c.input("x", "a INT").join(c.input("y", "a STRING"), on="a"),
     r"key 'a' is int on the left and string on the right"),
    (lambda c: c.input("x", "a INT, s STRING").group_by("a").agg(t="sum(s)"), r"needs a numeric"),
    (lambda c: c.input("x", "a INT").group_by("b").agg(n="count(*)"), r"group_by column"),
    (lambda c: c.input("x", "a INT").union(c.input("y", "a STRING")), r"schemas differ"),
    (lambda c: c.input("x", "a INTT"), r"not valid Spark DDL"),
])
def test_bad_circuits_fail_when_the_pipeline_opens(spark, tmp_path, build, match):
    c = Circuit("bad")
    c.output("o", build(c))
    with pytest.raises(CircuitError, match=match):
        Pipeline(c, root=str(tmp_path), spark=spark)


@contextlib.contextmanager
def _pyspark_query_logs() -> Iterator[list[logging.LogRecord]]:
    """The records PySpark logs of query errors (with their Java frames) while inside."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    loggers = [PySparkLogger.getLogger(n)
               for n in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def test_a_bad_circuit_is_reported_once_and_spark_logs_nothing_of_it(spark, tmp_path):
    """PySpark logs an analysis error (its message and Java frames, several KB on stderr) when
    it is raised, whoever catches it: a circuit analysed at open reports its error as the
    ``CircuitError`` alone, and PySpark's loggers work as before afterwards."""
    with _pyspark_query_logs() as records:
        c = Circuit("bad")
        c.output("o", c.input("x", "a INT, b INT").filter("aa > 1"))
        with pytest.raises(CircuitError,
                           match=r"operator #1 filter 'aa > 1' \(in view 'o'\): .*`aa`"):
            Pipeline(c, root=str(tmp_path), spark=spark)
        assert records == []
        with pytest.raises(PySparkException):  # the user's own query: logged as before
            spark.sql("SELECT nope FROM VALUES (1) AS t(a)")
        assert records


@pytest.mark.parametrize("rows_on_driver", [10**9, 0], ids=["driver", "spark"])
def test_a_failed_step_is_reported_once_and_spark_logs_nothing_of_it(spark, tmp_path,
                                                                     rows_on_driver):
    """A step whose Spark job raises (a division by zero in ANSI mode) reports it as the
    ``StepFailedError`` alone, naming the operator, its view and Spark's error: PySpark's own
    log of the error (tens of KB of JSON and Java frames) is dropped while the step runs."""
    with _pyspark_query_logs() as records:
        c = Circuit("zero")
        c.output("o", c.input("x", "a DOUBLE, b DOUBLE").select(
            "regexp_replace(cast(a / b as string), '0', '') AS q"))
        with Pipeline(c, root=str(tmp_path), spark=spark,
                      driver_step_rows=rows_on_driver) as p:
            p.push("x", [(1.0, 0.0)])
            # (on Spark the view's operators run as the one job that writes its change)
            with pytest.raises(StepFailedError, match=r"step 0 .*(operator #1 select .*\(in "
                               r"view 'o'\)|view 'o': computing the rows).*DIVIDE_BY_ZERO"):
                p.step()
        assert records == []


@pytest.mark.parametrize("build, message", [
    (lambda x: x.select("a", "rand() AS r"), r"operator #1 select \['a', 'rand\(\) AS r'\] "
     r"\(in view 'o'\): rand\(\) gives another value each time it is evaluated"),
    (lambda x: x.filter("uuid() < 'm'"), r"uuid\(\) gives another value"),
    (lambda x: x.filter("b > unix_timestamp()"),
     r"current_timestamp\(\) is the time a step computes it"),
    (lambda x: x.select("a", "date_add(current_date(), a) AS d"),
     r"current_date\(\) is the time a step computes it"),
], ids=["rand", "uuid", "unix_timestamp", "current_date"])
def test_a_function_whose_value_is_not_the_rows_is_refused(spark, tmp_path, build, message):
    """A view maintained step by step computes a row's value when the row is inserted and
    again when it is deleted: a random or time-of-query value would leave a phantom row."""
    c = Circuit("changing")
    c.output("o", build(c.input("x", "a INT, b BIGINT")))
    with pytest.raises(CircuitError, match=message):
        Pipeline(c, root=str(tmp_path), spark=spark)
    sql = Circuit.from_sql("CREATE TABLE t (a INT);\n"
                           "CREATE VIEW o AS SELECT a, rand() AS r FROM t;")
    with pytest.raises(CircuitError, match=r"\(in view 'o'\): rand\(\) gives another value"):
        Pipeline(sql, root=str(tmp_path / "sql"), spark=spark)


def test_a_root_computed_by_such_a_circuit_opens_with_a_warning_and_upgrades_away(
        spark, tmp_path, monkeypatch, caplog):
    """A root an older engine let compute ``rand()`` still opens (its state is what it is), with
    a warning naming the operator, and an upgrade to a circuit without it is not refused."""
    from dbsp_pipeline.runtime import plan

    def random_view() -> Circuit:
        c = Circuit("changing")
        x = c.input("x", "a INT, b BIGINT")
        c.output("o", x.select("a", "rand() AS r"))
        c.output("kept", x.filter("a > 1"))
        return c

    root = str(tmp_path / "old")
    with monkeypatch.context() as m:  # the older engine: no such check, another cache key
        m.setattr(plan, "_changing_function", lambda df: None)
        m.setattr(plan, "SCHEMA_RULES", 1)
        with Pipeline(random_view(), root=root, spark=spark) as p:
            p.push("x", [(1, 10), (2, 20)])
            p.step()
    with caplog.at_level("WARNING", logger="dbsp_pipeline.runtime.plan"):
        with Pipeline(random_view(), root=root, spark=spark) as p:
            p.push("x", [(3, 30)])
            p.step()
    assert any("rand() gives another value" in r.getMessage() and "upgrade to a circuit "
               "without it" in r.getMessage() for r in caplog.records), caplog.records
    fixed = Circuit("changing")
    fixed.output("kept", fixed.input("x", "a INT, b BIGINT").filter("a > 1"))
    with Pipeline(fixed, root=root, spark=spark, upgrade=True) as p:
        assert p.circuit_change is not None and p.circuit_change.views_removed == ["o"]
        assert sorted(r["a"] for r in p.view_arrow("kept").to_pylist()) == [2, 3]


def test_a_constant_that_cannot_be_cast_is_refused_when_the_circuit_is_analysed(spark,
                                                                               tmp_path):
    """``id > 'abc'`` casts the text to the column's type, which fails whatever the rows: the
    circuit is refused at open, naming the operator, not every step."""
    c = Circuit("cast")
    c.output("o", c.input("x", "a BIGINT, b STRING").filter("a > 'abc'"))
    with pytest.raises(CircuitError, match=r"operator #1 filter 'a > 'abc'' \(in view 'o'\): "
                                           r".*CAST_INVALID_INPUT.*'abc'"):
        Pipeline(c, root=str(tmp_path), spark=spark)
    fine = Circuit("cast")
    fine.output("o", fine.input("x", "a BIGINT, b STRING").filter("a > '12'"))
    with Pipeline(fine, root=str(tmp_path / "fine"), spark=spark) as p:
        p.push("x", [(13, "y"), (11, "n")])
        p.step()
        assert [r["a"] for r in p.view_arrow("o").to_pylist()] == [13]


def test_a_bad_operator_is_named_with_the_views_it_feeds(spark, tmp_path):
    c = Circuit("bad")
    x = c.input("x", "a INT, b INT")
    shared = x.group_by("nope").agg(n="count(*)")
    c.output("first", shared)
    c.output("second", shared.filter("n > 1"))
    c.output("other", x)
    with pytest.raises(CircuitError, match=r"operator #1 aggregate by \['nope'\] "
                                           r"\(in views 'first', 'second'\): group_by column"):
        Pipeline(c, root=str(tmp_path / "two"), spark=spark)
    many = Circuit("bad")
    shared = many.input("x", "a INT").filter("nope > 1")
    for name in "abcde":
        many.output(name, shared)
    with pytest.raises(CircuitError, match=r"operator #1 filter 'nope > 1' "
                                           r"\(in views 'a', 'b', 'c' and 2 more\): "):
        Pipeline(many, root=str(tmp_path / "five"), spark=spark)
