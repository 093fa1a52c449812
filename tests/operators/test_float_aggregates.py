"""Aggregates over floating-point values are a function of the multiset they aggregate, bit for
bit: ``sum``/``avg`` retract exactly (equal to ``math.fsum`` of the rows present, with SQL's NaN
and infinity rules), whatever the order of the additions, the batching of the input, the engine
path or a restore. Floats are compared with ``==`` throughout, never rounded."""

from __future__ import annotations

import math
import random
import shutil
import struct
from collections import Counter

import pytest

from dbsp_pipeline import Circuit, Pipeline
from tests.conftest import sql_sum

ENGINES = pytest.mark.parametrize("driver_step_rows", [0, 10**9], ids=["spark", "driver"])


def _circuit() -> Circuit:
    c = Circuit("floats")
    o = c.input("orders", "order_id BIGINT, region STRING, amount DOUBLE")
    c.output("by_region", o.group_by("region").agg(
        n="count(*)", s="sum(amount)", a="avg(amount)", hi="max(amount)"))
    c.output("amounts", o.select("amount").distinct())
    return c


def _same(a: float | None, b: float | None) -> bool:
    """Bit-for-bit equality, NaN equal to NaN."""
    if a is None or b is None:
        return a is b
    return ((math.isnan(a) and math.isnan(b))
            or (a == b and math.copysign(1, a) == math.copysign(1, b)))


def _check(p: Pipeline, live: Counter) -> None:
    by_region: dict[str, list[float]] = {}
    for (_, region, amount), m in live.items():
        by_region.setdefault(region, []).extend([amount] * m)
    got = {r["region"]: r for r in p.view_arrow("by_region").to_pylist()}
    assert set(got) == set(by_region)
    for region, values in by_region.items():
        row = got[region]
        assert row["_weight"] == 1 and row["n"] == len(values)
        s = sql_sum(values)
        assert _same(row["s"], s), (region, values, row["s"], s)
        assert _same(row["a"], s / len(values)), (region, values, row["a"])


@ENGINES
def test_nan_infinities_and_huge_values_retract_exactly(spark, tmp_path, driver_step_rows):
    """Insert NaN, ±inf and 1e17 beside amounts with cents, then delete them: the aggregates
    return to exactly the fsum of what is present (on main: NaN for ever, or 13.0 became 16.0)."""
    ordinary = [("r", 1.1), ("r", 2.2), ("r", 3.3), ("r", 6.4), ("q", 0.1), ("q", 0.2)]
    odd = [("r", math.nan), ("r", math.inf), ("q", -math.inf), ("q", math.inf), ("r", 1e17),
           ("q", -1e17), ("r", 1e-300), ("q", 5e-324)]
    live: Counter = Counter()
    with Pipeline(_circuit(), str(tmp_path / "root"), spark,
                  driver_step_rows=driver_step_rows) as p:
        rows = [(i, r, v) for i, (r, v) in enumerate(ordinary)]
        p.push("orders", rows)
        live.update(rows)
        p.step()
        _check(p, live)
        for j, (r, v) in enumerate(odd):  # one odd value more in each step
            row = (100 + j, r, v)
            p.push("orders", [row])
            live[row] += 1
            p.step()
            _check(p, live)
        for j in range(len(odd)):  # and out again, in another order
            row = (100 + len(odd) - 1 - j, *odd[len(odd) - 1 - j])
            p.push("orders", [row], weight=-1)
            live[row] -= 1
            live = +live
            p.step()
            _check(p, live)
        assert [r["s"] for r in p.view_arrow("by_region").sort_by("region").to_pylist()] == [
            math.fsum([0.1, 0.2]), math.fsum([1.1, 2.2, 3.3, 6.4])]


def _cents_workload(seed: int, steps: int) -> list[list[tuple]]:
    """Per step, (row, weight) pushes of amounts with cents, with deletes of live rows."""
    rng = random.Random(seed)
    live: list[tuple] = []
    out, next_id = [], 0
    for _ in range(steps):
        batch = []
        for _ in range(rng.randint(1, 25)):
            if live and rng.random() < 0.35:
                batch.append((live.pop(rng.randrange(len(live))), -1))
            else:
                row = (next_id, rng.choice("abc"), rng.randint(1, 99_999) / 100)
                next_id += 1
                live.append(row)
                batch.append((row, 1))
        out.append(batch)
    return out


def _push(p: Pipeline, batch: list[tuple], reverse: bool = False) -> None:
    """One step's pushes: its inserts and its deletes, each one push, rows in batch order or
    reversed (another order of the rows in the files, so another order of additions)."""
    batch = list(reversed(batch)) if reverse else batch
    for weight in ((-1, 1) if reverse else (1, -1)):
        rows = [row for row, w in batch if w == weight]
        if rows:
            p.push("orders", rows, weight=weight)


def _play(p: Pipeline, workload: list[list[tuple]], reverse: bool = False) -> None:
    for batch in workload:
        _push(p, batch, reverse)
        p.step()


def test_both_engine_paths_and_any_push_order_give_the_same_bits(spark, tmp_path):
    """The same input through the Spark path and the driver path, pushed row by row in two
    orders: every view is identical bit for bit, and equals fsum of the rows present."""
    workload = _cents_workload(7, 8)
    views = []
    for k, (rows, reverse) in enumerate([(0, False), (10**9, False), (10**9, True), (0, True)]):
        with Pipeline(_circuit(), str(tmp_path / f"r{k}"), spark, driver_step_rows=rows) as p:
            _play(p, workload, reverse)
            views.append({v: sorted(p.view_arrow(v).to_pylist(), key=repr)
                          for v in p.circuit.outputs})
            live = Counter()
            for batch in workload:
                for row, weight in batch:
                    live[row] += weight
            _check(p, +live)
    assert all(v == views[0] for v in views[1:])


def _assert_log_integrates_to_view(p: Pipeline) -> None:
    """The integral of each view's change log has no negative weight and equals the view."""
    for view in p.circuit.outputs:
        integral: Counter = Counter()
        for r in p.changes(view).collect():
            d = r.asDict()
            weight, _ = d.pop("_weight"), d.pop("_step")
            integral[tuple(sorted(d.items()))] += weight
        integral = Counter({k: w for k, w in integral.items() if w != 0})
        assert all(w > 0 for w in integral.values()), (
            view, [k for k, w in integral.items() if w < 0])
        current: Counter = Counter()
        for r in p.view(view).collect():
            d = r.asDict()
            current[tuple(sorted((k, v) for k, v in d.items() if k != "_weight"))] += d["_weight"]
        assert current == integral, view


def _views(p: Pipeline) -> dict:
    return {v: sorted(p.view_arrow(v).to_pylist(), key=repr) for v in p.circuit.outputs}


def test_restore_to_each_retained_checkpoint_keeps_the_change_log_exact(spark, tmp_path):
    """Restore goes back to a checkpoint and re-runs the newer steps from their divisions: with
    amounts in cents the re-run must give the same bits, so the change log still integrates to
    the view with no negative weight, and deleting every row leaves nothing (on main: a +1/-1
    pair of one group whose totals differ in the last bits stays for ever)."""
    workload = _cents_workload(11, 9)
    live: Counter = Counter()
    for batch in workload:
        for row, weight in batch:
            live[row] += weight
    root = tmp_path / "root"
    with Pipeline(_circuit(), str(root), spark, retain_checkpoints=3) as p:
        for k, batch in enumerate(workload):
            _push(p, batch, reverse=True)
            p.step()
            if k % 3 == 2:
                p.commit()
        reference = _views(p)
        checkpoints = [c.version for c in p.checkpoints()]
    assert len(checkpoints) >= 2
    for version in checkpoints:
        copy = tmp_path / f"restored-{version}"
        shutil.copytree(root, copy)
        # the re-run goes the other engine path (Spark jobs, not the driver): still the same bits
        with Pipeline(_circuit(), str(copy), spark, retain_checkpoints=3,
                      driver_step_rows=0) as p:
            p.restore(version)
            assert _views(p) == reference
            _assert_log_integrates_to_view(p)
            for row, m in (+live).items():
                p.push("orders", [row], weight=-m)
            p.step()
            assert p.view_arrow("by_region").num_rows == 0
            _assert_log_integrates_to_view(p)


def _bits(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


#: a NaN with the sign bit and a payload (x86 arithmetic makes the first; any input may hold both)
ODD_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_0000_0001))[0]
CANONICAL_NAN = 0x7FF8_0000_0000_0000


@ENGINES
def test_negative_zero_and_nan_are_stored_and_computed_in_one_form(spark, tmp_path,
                                                                    driver_step_rows):
    """-0.0 equals 0.0 and a NaN equals every NaN, so which of each pair a distinct keeps must
    not depend on the order the engine met them in (DuckDB keeps the first), nor on the engine:
    inputs and select results hold only 0.0 and the one NaN 0x7ff8000000000000."""
    c = Circuit("zeros")
    o = c.input("orders", "order_id BIGINT, region STRING, amount DOUBLE")
    c.output("amounts", o.select("amount").distinct())
    c.output("negated", o.select("-amount AS neg").distinct())
    with Pipeline(c, str(tmp_path / "root"), spark, driver_step_rows=driver_step_rows) as p:
        p.push("orders", [(1, "r", -0.0), (2, "r", 0.0), (3, "r", ODD_NAN),
                          (4, "r", math.nan), (5, "r", None)])
        p.step()
        for view, column in (("amounts", "amount"), ("negated", "neg")):
            values = p.view_arrow(view).column(column).to_pylist()
            assert sorted(_bits(v) for v in values if v is not None) == [0, CANONICAL_NAN], (
                view, values)
            assert values.count(None) == 1
        stored = p.input_view_arrow("orders").sort_by("order_id").column("amount").to_pylist()
        assert [None if v is None else _bits(v) for v in stored] == [
            0, 0, CANONICAL_NAN, CANONICAL_NAN, None]
