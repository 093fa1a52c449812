"""Distinct on the driver gives the same views whether a step's flips are computed in pyarrow
(``Distinct._flips_arrow``, small steps) or by the DuckDB query, bit for bit, and both equal
SQL's DISTINCT over the integrated input: random inserts, repeated rows and deletes over small
domains (NULLs, string, decimal, timestamp and double columns), two pipelines in lockstep."""

from __future__ import annotations

import collections
import datetime
import decimal
import math
import random

import pyarrow as pa
import pytest

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.driver import sql as local_sql
from dbsp_pipeline.operators.distinct import Distinct
from dbsp_pipeline.zset import WEIGHT
from tests.operators.test_aggregate import _bits, _view

FACTS = "k STRING, d DECIMAL(10,2), t TIMESTAMP, f DOUBLE, i BIGINT"


def _circuit() -> Circuit:
    c = Circuit("distincts")
    facts = c.input("facts", FACTS)
    c.output("rows", facts.select("k", "d", "t", "f").distinct())
    c.output("keys", facts.select("k").distinct())
    return c


def _fact(rng: random.Random) -> tuple:
    def maybe(values: list) -> object:
        return None if rng.random() < 0.2 else rng.choice(values)
    return (maybe(["a", "b", ""]), maybe([decimal.Decimal("1.10"), decimal.Decimal("-2.00")]),
            maybe([datetime.datetime(2026, 1, 1), datetime.datetime(2026, 1, 2, 3)]),
            maybe([0.5, 0.0, 2.0]), rng.randint(0, 3))


def test_pyarrow_and_duckdb_flips_give_identical_views(spark, tmp_path, monkeypatch):
    rng = random.Random(2026)
    computed = []  # the steps whose flips pyarrow computed (not None)
    flips = Distinct._flips_arrow

    def counted(self: Distinct, new: pa.Table, old: pa.Table) -> pa.Table | None:
        out = flips(self, new, old)
        computed.append(out is not None)
        return out

    monkeypatch.setattr(Distinct, "_flips_arrow", counted)
    fast = Pipeline(_circuit(), str(tmp_path / "fast"), spark, driver_step_rows=10**9)
    slow = Pipeline(_circuit(), str(tmp_path / "slow"), spark, driver_step_rows=10**9)
    live: collections.Counter[tuple] = collections.Counter()
    with fast, slow:
        for step in range(16):
            inserts = [_fact(rng) for _ in range(rng.randint(1, 20))]
            inserts += rng.sample(inserts, min(3, len(inserts)))  # rows twice: weight 2
            if live and step % 3 == 2:  # rows already live, again
                inserts += rng.sample(sorted(live, key=repr), min(4, len(live)))
            deletes = rng.sample(sorted(live.elements(), key=repr),
                                 min(sum(live.values()), rng.randint(0, 15)))
            if step == 11:  # a NaN: that step's flips come from DuckDB
                inserts += [("a", None, None, -0.0, 1), ("b", None, None, math.nan, 1)]
            for p in (fast, slow):
                p.push("facts", inserts)
                if deletes:
                    p.push("facts", deletes, weight=-1)
            live.update(inserts)
            live.subtract(deletes)
            live = +live
            monkeypatch.setattr(local_sql, "FAST_PATH_ROWS", 65_536)
            fast.step()
            monkeypatch.setattr(local_sql, "FAST_PATH_ROWS", 0)  # DuckDB
            slow.step()
            for name in ("rows", "keys"):
                assert _view(fast, name) == _view(slow, name), (step, name)
            rows = fast.view_arrow("rows").to_pylist()
            assert {r.pop(WEIGHT) for r in rows} <= {1}, step
            got = sorted(repr((r["k"], r["d"], r["t"] and r["t"].replace(tzinfo=None),
                               _bits(r["f"]))) for r in rows)
            # (a push stores -0.0 as 0.0)
            assert got == sorted(repr((k, d, t, _bits(f if f is None else f + 0.0)))
                                 for k, d, t, f in {r[:4] for r in live}), step
        assert len(_view(fast, "rows")) > 10
    assert sum(computed) >= 20 and not all(computed)  # (the slow pipeline's are None)


def _distinct() -> Distinct:
    d = Distinct.__new__(Distinct)  # (no trace: only the flips are computed here)
    d.columns = ["k", "x"]
    return d


def _zset(rows: list[tuple], weights: list[int]) -> pa.Table:
    return pa.table({"k": pa.array([r[0] for r in rows], pa.string()),
                     "x": pa.array([r[1] for r in rows], pa.float64()),
                     WEIGHT: pa.array(weights, pa.int64())})


def test_flips_are_the_rows_whose_integrated_weight_crosses_zero():
    new = _zset([("a", 1.0), ("b", None), (None, 2.0), ("c", 3.0)], [1, -2, 1, 5])
    # "a" was live (1 + 2 - 1); "b" was live once; NULL-keyed row was at -1; "c" is new
    old = _zset([("a", 1.0), ("a", 1.0), ("a", 1.0), ("b", None), (None, 2.0)], [1, 2, -1, 1, -1])
    out = _distinct()._flips_arrow(new, old)
    assert out is not None
    assert sorted(out.to_pylist(), key=repr) == sorted([
        {"k": "b", "x": None, WEIGHT: -1},  # 1 - 2: out
        {"k": "c", "x": 3.0, WEIGHT: 1},  # 0 + 5: in
    ], key=repr)  # "a" stays in (2 + 1), the NULL row stays out (-1 + 1)


@pytest.mark.parametrize("case", ["nan", "negative_zero", "wide_weights", "big"])
def test_flips_go_to_duckdb_where_pyarrow_might_differ(case, monkeypatch):
    new = _zset([("a", 1.0)], [1])
    old = _zset([("a", 1.0)], [1])
    if case == "nan":
        new = _zset([("a", math.nan)], [1])
    elif case == "negative_zero":
        old = _zset([("a", -0.0)], [1])
    elif case == "wide_weights":
        old = _zset([("a", 1.0), ("a", 1.0)], [2**62, 2**62])
    else:
        monkeypatch.setattr(local_sql, "FAST_PATH_ROWS", 0)
    assert _distinct()._flips_arrow(new, old) is None
