"""Linear operators on the driver: a select or filter the driver evaluates exactly runs without a
Spark job, and a change whose rows the driver's translation raises on (where it would differ
from Spark) is computed by Spark for that step, with Spark's values."""

from __future__ import annotations

import datetime as dt

import pytest

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.operators import linear

UTC = dt.UTC
EXPRS = ["upper(region) AS r", "date_trunc('MONTH', ts) AS m", "year(ts) * 100 + month(ts) AS ym",
         "concat(region, '/', cast(id AS STRING)) AS tag", "id % 3 AS bucket",
         "floor(amount) AS whole", "to_date(ts) AS day", "if(amount > 5, 'big', 'small') AS size",
         "round(amount * 1.1, 1) AS rounded"]


def _circuit() -> Circuit:
    c = Circuit("fns")
    t = c.input("t", "id BIGINT, region STRING, amount DOUBLE, ts TIMESTAMP")
    picked = t.select(*EXPRS).filter("startswith(r, 'N') OR bucket = 0")
    c.output("picked", picked)
    c.output("monthly", picked.group_by("m", "r").agg(n="count(*)"))
    return c


def _expected(spark, rows: list[tuple]) -> tuple[list, list]:
    df = spark.createDataFrame(rows, "id BIGINT, region STRING, amount DOUBLE, ts TIMESTAMP")
    picked = df.selectExpr(*EXPRS).where("startswith(r, 'N') OR bucket = 0")
    monthly = picked.groupBy("m", "r").count().withColumnRenamed("count", "n")
    return (sorted(tuple(r.values()) for r in picked.toArrow().to_pylist()),
            sorted(tuple(r.values()) for r in monthly.toArrow().to_pylist()))


def _views(p: Pipeline) -> tuple[list, list]:
    out = []
    for name in ("picked", "monthly"):
        table = p.view_arrow(name)
        rows = [tuple(r[c] for c in table.column_names if c != "_weight")
                for r in table.to_pylist() for _ in range(r["_weight"])]
        out.append(sorted(rows))
    return out[0], out[1]


def test_date_and_string_functions_run_on_the_driver_and_spark_decides_beyond_ascii(
        spark, tmp_path, monkeypatch):
    rows = [(1, "north", 7.5, dt.datetime(2026, 1, 31, 23, 59, tzinfo=UTC)),
            (2, "south", 2.25, dt.datetime(2026, 2, 1, 0, 0, tzinfo=UTC)),
            (3, "North-East", -1.5, dt.datetime(2025, 12, 31, 12, tzinfo=UTC)),
            (6, "west", 99.0, dt.datetime(2024, 2, 29, 6, tzinfo=UTC))]
    spark_calls = []
    real = linear.Select._spark

    def counted(self, d):
        spark_calls.append(self.exprs)
        return real(self, d)

    monkeypatch.setattr(linear.Select, "_spark", counted)
    with Pipeline(_circuit(), str(tmp_path), spark, driver_step_rows=10**9) as p:
        p.push("t", rows[:2])
        assert p.step().on_driver
        p.push("t", rows[2:])
        p.push("t", rows[:1], weight=-1)
        p.step()
        assert spark_calls == []  # every select ran in DuckDB or Arrow
        live = rows[1:]
        assert _views(p) == _expected(spark, live)
        assert p.spark_operators() == []
        beyond = (9, "straße", 3.0, dt.datetime(2026, 3, 1, tzinfo=UTC))  # Java: STRASSE
        p.push("t", [beyond])
        result = p.step()
        assert len(spark_calls) == 1  # that step's change, in Spark
        assert result.on_driver and result.spark_jobs == ["n1_select"]
        assert _views(p) == _expected(spark, live + [beyond])
        assert ("STRASSE", ) == next(r[:1] for r in _views(p)[0] if r[0].startswith("STRA"))
        p.push("t", [(12, "nord", 1.0, dt.datetime(2026, 4, 1, tzinfo=UTC))])
        assert p.step().spark_jobs == []
        assert len(spark_calls) == 1  # back on the driver


@pytest.mark.parametrize("expr", ["upper(region)", "date_trunc('DAY', ts)"])
def test_a_select_the_driver_translates_starts_no_spark_job(spark, tmp_path, monkeypatch, expr):
    monkeypatch.setattr(linear.Select, "_spark", lambda self, d: pytest.fail("a Spark job"))
    c = Circuit("one")
    c.output("v", c.input("t", "region STRING, ts TIMESTAMP").select(f"{expr} AS x"))
    with Pipeline(c, str(tmp_path), spark, driver_step_rows=10**9) as p:
        p.push("t", [("east", dt.datetime(2026, 5, 5, 5, tzinfo=UTC))])
        assert p.step().on_driver
        assert p.view_arrow("v").num_rows == 1


def test_an_expression_only_spark_evaluates_is_named_at_open_and_in_each_step(spark, tmp_path,
                                                                              caplog):
    """A select outside the driver's translation runs a Spark job at every driver step: the
    pipeline says so when it opens (a warning naming the operator, its view and the
    expression; ``spark_operators``), and each step's ``spark_jobs`` names it."""
    c = Circuit("slow")
    t = c.input("t", "id BIGINT, region STRING")
    c.output("tagged", t.select("id", "regexp_replace(region, '[aeiou]', '') AS consonants",
                                "upper(region) AS r"))
    with caplog.at_level("WARNING", logger="dbsp_pipeline.runtime.pipeline"), \
            Pipeline(c, str(tmp_path), spark, driver_step_rows=10**9) as p:
        (slow,) = p.spark_operators()
        assert (slow.label, slow.views, slow.expressions) == (
            "n1_select", ["tagged"], ["regexp_replace(region, '[aeiou]', '') AS consonants"])
        assert "1 operator(s) run a Spark job at every driver step" in caplog.text
        assert "n1_select (view tagged): regexp_replace(region" in caplog.text
        p.push("t", [(1, "north")])
        result = p.step()
        assert result.on_driver and result.spark_jobs == ["n1_select"]
        assert p.view_arrow("tagged").column("consonants").to_pylist() == ["nrth"]
