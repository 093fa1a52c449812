"""``Pipeline(new_circuit, root, upgrade=True)``: a running pipeline's views change without
starting over (``runtime/circuit_upgrade.py``).

Views are added, changed (a filter, an aggregate, a join key) and removed mid-run, with inserts
and deletes before and after. After the upgrade step and every step after it, each view (its
output log's integral, which is what a consumer applying the changes holds) equals its query
recomputed from scratch over all input; unchanged operators' tables are exactly as they were
(the same Delta versions and staged actions); a crash at every durable action of the upgrade
leaves the old circuit or the new one, and upgrading again ends where the no-crash run does.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections import Counter

import pytest
from pyspark.sql.types import StructType

from dbsp_pipeline import (
    Circuit,
    CircuitChangedError,
    Pipeline,
    StepResult,
    UnknownNameError,
    UsageError,
)
from dbsp_pipeline import root as root_layout
from dbsp_pipeline.circuit import node_collection
from dbsp_pipeline.runtime.circuit_diff import table_belongs
from dbsp_pipeline.runtime.circuit_upgrade import RETIRED_VIEWS_KEY
from dbsp_pipeline.runtime.output_log import OutputLog
from dbsp_pipeline.runtime.recompute import check_views
from dbsp_pipeline.storage import crash_points
from dbsp_pipeline.storage.crash_points import InjectedCrash
from dbsp_pipeline.storage.small_files import count_files, list_folders
from dbsp_pipeline.storage.staged_table import STAGED_KEY
from dbsp_pipeline.storage.state_db import RETIRED_TABLES_KEY
from tests.conftest import table_counter, view_rows
from tests.object_store_helpers import new_bucket

CUSTOMERS = "customer_id BIGINT, region STRING"
ORDERS = "order_id BIGINT, customer_id BIGINT, amount DOUBLE"


def shop(*, big: str = "amount > 10", agg: str = "sum(amount)", key: str = "customer_id",
         per_customer: bool = False, totals: bool = True) -> Circuit:
    """Four views over orders and customers: ``big`` (a filter), ``totals`` (an aggregate over
    a join of ``big``), ``matched`` (a join whose left key is ``key``), ``with_region`` (a left
    join); ``per_customer`` (an aggregate) when asked for."""
    c = Circuit("shop")
    cu = c.input("customers", CUSTOMERS)
    o = c.input("orders", ORDERS)
    b = o.filter(big)
    c.output("big", b)
    if totals:
        c.output("totals", b.join(cu, on="customer_id").group_by("region").agg(s=agg, n="count(*)"))
    left = o if key == "customer_id" else o.select("order_id", f"{key} AS customer_id", "amount")
    c.output("matched", left.join(cu, on="customer_id"))
    c.output("with_region", o.left_join(cu, on="customer_id"))
    if per_customer:
        c.output("per_customer", o.group_by("customer_id").agg(n="count(*)", top="max(amount)"))
    return c


V2 = {"big": "amount > 20", "agg": "max(amount)", "key": "order_id % 7", "per_customer": True}
#: V2 without ``totals``: views changed, added and removed at once
V3 = {**V2, "totals": False}


def play(p: Pipeline, rng: random.Random, steps: int, live: dict[int, tuple]) -> StepResult:
    """``steps`` steps of order inserts and deletes (and a customer moved now and then); returns
    the last one's result."""
    regions = live.setdefault(-1, {})  # type: ignore[arg-type]  # customer -> region
    for _ in range(steps):
        new = [(oid, rng.randrange(12), float(rng.randrange(1, 60)))
               for oid in rng.sample(range(10_000), 12) if oid not in live]
        orders = sorted(k for k in live if k >= 0)
        gone = [live.pop(k) for k in rng.sample(orders, min(4, len(orders)))]
        for row in new:
            live[row[0]] = row
        p.push("orders", new)
        if gone:
            p.push("orders", gone, weight=-1)
        if rng.random() < 0.5:  # a customer moves to the next region
            cid = rng.randrange(10)
            region = regions.get(cid, cid % 3)
            regions[cid] = (region + 1) % 3
            p.push("customers", [(cid, f"r{region}")], weight=-1)
            p.push("customers", [(cid, f"r{regions[cid]}")])
        result = p.step()
        assert_views_recompute(p)
    return result


def assert_views_recompute(p: Pipeline) -> None:
    checks = check_views(p)
    assert all(c.equal and not c.nonpositive for c in checks.values()), checks


def seeded_root(spark, root: str, seed: int = 7) -> tuple[random.Random, dict[int, tuple]]:
    rng, live = random.Random(seed), {}
    with Pipeline(shop(), root, spark) as p:
        p.push("customers", [(i, f"r{i % 3}") for i in range(10)])
        play(p, rng, 3, live)
    return rng, live


def recorded_tables(p: Pipeline) -> dict[str, tuple]:
    """Every state table the open checkpoint records: its Delta version and staged actions."""
    entry = p.engine.db._require_open()
    return {t: (v, entry.get(STAGED_KEY, {}).get(t)) for t, v in entry["traces"].items()}


def tables_of(tables: dict[str, tuple], names: list[str]) -> dict[str, tuple]:
    """The entries of ``tables`` that belong to the state names ``names``."""
    return {t: v for t, v in tables.items() if any(table_belongs(n, t) for n in names)}


def assert_kept_untouched(before: dict[str, tuple], p: Pipeline) -> None:
    """The kept operators' tables are recorded at the very versions and staged actions they
    had before the upgrade, and their files are the same."""
    change = p.circuit_change
    assert change is not None and change.kept
    kept = tables_of(before, change.kept)
    assert kept and tables_of(recorded_tables(p), change.kept) == kept
    for name in kept:
        table = p.engine.db.table(name, None)  # opened by the plan already
        assert table.delta.loaded_version() == kept[name][0]


def consumer(p: Pipeline, view: str) -> Counter:
    """What a consumer that applied every step's change of ``view`` holds."""
    held: Counter = Counter()
    for step in range(p.output_last(view)):
        held.update(table_counter(p.step_changes_arrow(view, step)))
    return +held


def test_views_added_changed_and_removed_mid_run_equal_their_queries(spark, tmp_path):
    root = str(tmp_path / "shop")
    rng, live = seeded_root(spark, root)
    with Pipeline(shop(), root, spark) as p:
        before_views = {v: view_rows(p, v) for v in p.circuit.outputs}
        tables_before = recorded_tables(p)
    with pytest.raises(CircuitChangedError, match="upgrade=True"):
        Pipeline(shop(**V2), root, spark)

    with Pipeline(shop(**V2), root, spark, upgrade=True) as p:
        change = p.circuit_change
        assert change is not None and change.step == 3
        assert change.views_changed == ["big", "totals", "matched"]
        assert change.views_added == ["per_customer"]
        assert change.views_unchanged == ["with_region"] and not change.views_removed
        assert change.outputs["with_region"] == 0 and change.outputs["per_customer"] > 0
        # the unchanged view's operators kept their tables as they were
        assert change.kept and change.backfilled and change.retired
        assert_kept_untouched(tables_before, p)
        assert p.verify().ok, p.verify().damage
        assert_views_recompute(p)
        assert view_rows(p, "with_region") == before_views["with_region"]
        for view in p.circuit.outputs:  # applying the changes ends at the new contents
            assert consumer(p, view) == view_rows(p, view), view
        listed = p.checkpoints()[0].circuit_change
        assert listed is not None and listed["to"] == change.new_fingerprint
        assert listed["views"]["added"] == ["per_customer"]
        play(p, rng, 3, live)
        for view in p.circuit.outputs:
            assert consumer(p, view) == view_rows(p, view), view

    # remove a view: its log stays readable, marked retired; the rest goes on
    with Pipeline(shop(**V3), root, spark, upgrade=True) as p:
        change = p.circuit_change
        assert change is not None and change.views_removed == ["totals"]
        assert not change.backfilled and change.retired
        assert "totals" not in p.engine.outputs
        play(p, rng, 2, live)
        retired = p.engine.db.get(RETIRED_VIEWS_KEY)["totals"]
        assert retired["step"] == change.step
        totals = OutputLog(p.engine.spark, root, "totals",
                           StructType.fromJson(json.loads(retired["columns"])))
        assert totals.retired_at() == change.step
        assert totals.view_arrow(p.engine.sql).num_rows > 0
        with pytest.raises(UnknownNameError, match=r"unknown output 'totals'.*an upgrade "
                           r"removed keeps its log, readable as the Delta table .*outputs/totals"):
            p.view_arrow("totals")

    # and back to the first circuit: every view of it equals its query again
    with Pipeline(shop(), root, spark, upgrade=True) as p:
        change = p.circuit_change
        assert change is not None and change.views_added == ["totals"]
        assert change.views_removed == ["per_customer"]
        assert p.engine.outputs["totals"].retired_at() is None  # in use again
        assert set(p.engine.db.get(RETIRED_VIEWS_KEY)) == {"per_customer"}
        assert_views_recompute(p)
        play(p, rng, 2, live)
        for view in p.circuit.outputs:
            assert consumer(p, view) == view_rows(p, view), view
        # retired operators' tables go once no retained checkpoint reads them
        p.collect_garbage(grace_seconds=0)
        on_disk = set(list_folders(root_layout.state_tables(root)))
        retained = {t for _, e in p.engine.db.retained_entries(2) for t in e["traces"]}
        assert on_disk == set(p.engine.db.open_tables()) | retained
        assert p.verify().ok, p.verify().damage


def test_a_changed_aggregate_over_a_kept_join_leaves_the_join_untouched(spark, tmp_path):
    """Only ``totals``' aggregate changes: the join it reads is kept, so the backfill runs it
    over throwaway state, and its own tables stay as they were. (On Spark:
    ``tests/operators/test_oracle.py``'s upgrade, where ``q_join_agg``'s join is kept and the
    steps after it run as one task per owner.)"""
    root = str(tmp_path / "shop")
    rng, live = seeded_root(spark, root, seed=11)
    with Pipeline(shop(), root, spark) as p:
        before = recorded_tables(p)
    with Pipeline(shop(agg="max(amount)"), root, spark, upgrade=True) as p:
        change = p.circuit_change
        assert change is not None and change.on_driver
        assert change.views_changed == ["totals"] and len(change.backfilled) == 1
        assert_kept_untouched(before, p)
        assert not list_folders(root_layout.upgrade_scratch(root))  # the scratch state went
        assert_views_recompute(p)
        play(p, rng, 1, live)


def test_retired_tables_are_collected_and_a_collection_cut_short_is_not_damage(spark,
                                                                                tmp_path):
    root = str(tmp_path / "shop")
    rng, live = seeded_root(spark, root)
    with Pipeline(shop(**V3), root, spark, upgrade=True) as p:
        retired = p.engine.db._require_open()[RETIRED_TABLES_KEY]
        assert retired and p.circuit_change is not None
        assert all(any(table_belongs(n, t) for n in p.circuit_change.retired) for t in retired)
        play(p, rng, 2, live)  # the checkpoint from before the upgrade ages out
    # closing collected the garbage: the retired tables are gone
    assert not any(count_files(root_layout.state_table(root, t)) for t in retired)
    # a collection a crash cut short: a table left without the first commits of its log
    leftover = os.path.join(root_layout.state_table(root, retired[0]), "_delta_log")
    os.makedirs(leftover)
    with open(os.path.join(leftover, f"{7:020d}.json"), "w") as f:
        f.write('{"commitInfo": {}}\n')
    with Pipeline(shop(**V3), root, spark) as p:  # opening checks no retired table
        assert p.verify().ok, p.verify().damage
        p.collect_garbage(grace_seconds=0)
        assert not count_files(root_layout.state_table(root, retired[0]))
        play(p, rng, 1, live)
    with Pipeline(shop(**V3), root, spark) as p:  # and the entries no longer list them
        assert RETIRED_TABLES_KEY not in p.engine.db._require_open()


def test_a_root_upgraded_before_its_first_step_takes_the_new_circuit_as_it_is(spark,
                                                                               tmp_path):
    """No step executed: there is no upgrade step (step 0, where constants emit their rows,
    is the new circuit's first)."""
    def circuit(extra: bool) -> Circuit:
        c = Circuit("constants")
        x = c.input("x", "k BIGINT")
        fixed = c.constant("k BIGINT", [[1], [2]])
        c.output("both", x.union(fixed))
        if extra:
            c.output("big", x.union(fixed).filter("k > 1"))
        return c

    root = str(tmp_path / "c")
    with Pipeline(circuit(False), root, spark) as p:
        p.push("x", [(5,)])  # pushed, not stepped
        p.commit()  # a checkpoint of the old circuit at step 0
    with Pipeline(circuit(True), root, spark, upgrade=True) as p:
        change = p.circuit_change
        assert change is not None and change.step == 0 and not change.outputs
        assert p.next_step == 0
        p.step()
        assert view_rows(p, "both") == Counter({(1,): 1, (2,): 1, (5,): 1})
        assert view_rows(p, "big") == Counter({(2,): 1, (5,): 1})
        assert_views_recompute(p)


def test_what_an_upgrade_cannot_do_is_refused_and_the_root_stays_the_old_circuit(
        spark, tmp_path):
    root = str(tmp_path / "shop")
    seeded_root(spark, root)
    changed_input = Circuit("shop")
    o = changed_input.input("orders", "order_id BIGINT, customer_id BIGINT, amount DOUBLE, "
                                      "note STRING")
    changed_input.output("big", o.filter("amount > 10"))
    with pytest.raises(CircuitChangedError, match="input 'orders' changes its schema"):
        Pipeline(changed_input, root, spark, upgrade=True)
    other_columns = shop()
    other_columns.outputs.pop("big")
    orders = other_columns.inputs["orders"]
    other_columns.output("big", node_collection(other_columns, orders).select("order_id"))
    with pytest.raises(CircuitChangedError, match=r"view 'big' changes its columns from "
                       r"\(order_id BIGINT, customer_id BIGINT, amount DOUBLE\) to "
                       r"\(order_id BIGINT\)"):
        Pipeline(other_columns, root, spark, upgrade=True)
    streamed = shop()
    streamed.output("previous", node_collection(streamed, streamed.inputs["orders"]).delay())
    with pytest.raises(CircuitChangedError, match=r"delay \(node \d+\).*order input arrived"):
        Pipeline(streamed, root, spark, upgrade=True)
    with pytest.raises(UsageError, match="cannot be given together"):
        Pipeline(shop(**V2), root, spark, upgrade=True, checkpoint=1)
    with Pipeline(shop(), root, spark) as p:  # the old circuit, as it was
        assert p.circuit_change is None
        assert_views_recompute(p)


def test_a_checkpoint_from_before_an_upgrade_is_not_restored_with_either_circuit(
        spark, tmp_path):
    root = str(tmp_path / "shop")
    seeded_root(spark, root)
    with Pipeline(shop(**V2), root, spark, upgrade=True) as p:
        old = [c for c in p.checkpoints() if c.circuit_change is None]
        assert old
        with pytest.raises(CircuitChangedError, match=r"different circuit .*; a checkpoint "
                           r"from before an upgrade is not restored .*restore one taken since"):
            p.restore(old[0].version)
        newest, views = p.state_version, {v: view_rows(p, v) for v in p.circuit.outputs}
    # nor with the old circuit, whose replay of the upgrade's step would differ from what the
    # views' logs hold: refused before anything is rolled back, so both still open as before
    with pytest.raises(CircuitChangedError, match=r"is from before the upgrade its version "
                       r"\d+ recorded .*not taken back past an upgrade, with either circuit"):
        Pipeline(shop(), root, spark, checkpoint=old[0].version)
    with Pipeline(shop(**V2), root, spark) as p:
        assert p.state_version == newest
        assert {v: view_rows(p, v) for v in p.circuit.outputs} == views
        assert_views_recompute(p)


def test_a_crash_at_every_durable_action_of_an_upgrade_leaves_one_circuit(spark, tmp_path):
    seed_root = str(tmp_path / "seed")
    rng, live = seeded_root(spark, seed_root)
    # the no-crash upgrade, and the crash points it passes
    reference = str(tmp_path / "reference")
    shutil.copytree(seed_root, reference)
    crash_points.reset()
    p = Pipeline(shop(**V3), reference, spark, upgrade=True)
    passes = crash_points.passes()  # of the upgrade alone (closing passes more)
    with p:
        expected = {v: view_rows(p, v) for v in p.circuit.outputs}
        expected_steps = p.next_step
    # the opens' fences, the upgrade's one commit, the removed view's retired mark
    for required in ("manifest.commit.before", "manifest.commit.after",
                     "output.properties.before", "output.properties.after"):
        assert required in passes, (required, passes)
    cases = [(point, k) for point, n in sorted(passes.items()) for k in sorted({1, n})]
    assert len(cases) >= 6
    seen = Counter()
    for i, (point, k) in enumerate(cases):
        root = str(tmp_path / f"case{i}")
        shutil.copytree(seed_root, root)
        crash_points.reset()
        crash_points.arm(point, k)
        with pytest.raises(InjectedCrash):
            Pipeline(shop(**V3), root, spark, upgrade=True)
            pytest.fail(f"no crash at {point} pass {k}")
        crash_points.reset()
        try:  # the old circuit, whole...
            with Pipeline(shop(), root, spark) as old:
                assert old.circuit_change is None
                assert_views_recompute(old)
                seen["old"] += 1
        except CircuitChangedError:  # ...or the new one
            with Pipeline(shop(**V3), root, spark) as new:
                assert_views_recompute(new)
                seen["new"] += 1
        with Pipeline(shop(**V3), root, spark, upgrade=True) as p:
            assert p.next_step == expected_steps, (point, k)
            got = {v: view_rows(p, v) for v in p.circuit.outputs}
            assert got == expected, (point, k)
            for view in p.circuit.outputs:
                assert consumer(p, view) == got[view], (point, k, view)
    assert seen["old"] and seen["new"], seen


def test_an_upgrade_of_an_s3_root_keeps_everything_in_the_object_store(
        spark, object_store, tmp_path, monkeypatch):
    """The circuit descriptions, the scratch state, the retired view's mark and the retired
    tables' removal all go through the object store, as on local disk."""
    for name, value in object_store.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # nothing of an s3:// root may land on the local disk
    root = f"s3://{new_bucket(object_store, 'upgrade')}/shop"
    rng, live = seeded_root(spark, root, seed=5)
    with Pipeline(shop(agg="max(amount)", totals=True, per_customer=True), root, spark,
                  upgrade=True) as p:
        assert p.circuit_change is not None and p.circuit_change.views_added == ["per_customer"]
        assert_views_recompute(p)
        play(p, rng, 1, live)
    with Pipeline(shop(per_customer=True, totals=False), root, spark, upgrade=True) as p:
        change = p.circuit_change
        assert change is not None and change.views_removed == ["totals"]
        retired = p.engine.db.get(RETIRED_VIEWS_KEY)["totals"]
        totals = OutputLog(p.engine.spark, root, "totals",
                           StructType.fromJson(json.loads(retired["columns"])))
        assert totals.retired_at() == change.step
        play(p, rng, 2, live)
        p.collect_garbage(grace_seconds=0)
        # (an object store may go on listing a folder it holds nothing in)
        on_disk = {t for t in list_folders(root_layout.state_tables(root))
                   if count_files(root_layout.state_table(root, t))}
        retained = {t for _, e in p.engine.db.retained_entries(2) for t in e["traces"]}
        assert on_disk == set(p.engine.db.open_tables()) | retained
    assert not os.listdir(tmp_path)
