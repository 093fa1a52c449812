"""The public API on the issue's example: push, step, view, changes, reopen."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from dbsp_pipeline import Circuit, CircuitChangedError, Pipeline, UsageError, read_status
from dbsp_pipeline.examples.shop import shop_circuit
from tests.conftest import view_counter


def test_the_readme_example(spark, tmp_path):
    with Pipeline(shop_circuit(), root=str(tmp_path), spark=spark) as p:
        p.push("customers", [{"customer_id": 7, "region": "eu"}, (8, "us")])
        p.push("orders", [{"order_id": 1, "customer_id": 7, "amount": 12.5}, (2, 8, 30.0),
                          (3, 8, 40.0), (4, 8, 5.0)])
        r = p.step()
        assert r.step == 0 and r.inputs == {"orders": 4, "customers": 2}
        assert view_counter(p.view("revenue_by_region")) == {
            ("eu", 12.5, 1, 12.5): 1, ("us", 70.0, 2, 40.0): 1}
        assert view_counter(p.view("regions")) == {("eu",): 1, ("us",): 1}

        # Deleting the current maximum: max falls back to the next value.
        p.push("orders", [{"order_id": 3, "customer_id": 8, "amount": 40.0}], weight=-1)
        r = p.step()
        assert r.step == 1 and r.outputs["revenue_by_region"] == 2 and r.outputs["regions"] == 0
        assert view_counter(p.view("revenue_by_region")) == {
            ("eu", 12.5, 1, 12.5): 1, ("us", 30.0, 1, 30.0): 1}
        changes = view_counter(p.changes("revenue_by_region", since=1).drop("_step"))
        assert changes == {("us", 70.0, 2, 40.0): -1, ("us", 30.0, 1, 30.0): 1}
        assert set(p.changes("revenue_by_region").columns) == {
            "region", "total", "n", "top", "_step", "_weight"}
        # A group whose rows are all deleted disappears.
        p.push("orders", [(1, 7, 12.5)], weight=-1)
        p.step()
        assert view_counter(p.view("revenue_by_region")) == {("us", 30.0, 1, 30.0): 1}
        assert view_counter(p.view("revenue_by_region", as_of=0)) == {
            ("eu", 12.5, 1, 12.5): 1, ("us", 70.0, 2, 40.0): 1}


def test_pandas_and_spark_inputs(spark, tmp_path):
    with Pipeline(shop_circuit(), root=str(tmp_path), spark=spark) as p:
        p.push("customers", pd.DataFrame({"customer_id": [1, 2], "region": ["a", "b"]}))
        n = p.push("orders", spark.createDataFrame([(10, 1, 11.0), (11, 2, 20.0)],
                                                   "order_id INT, customer_id INT, amount DOUBLE"))
        assert n == 2
        p.step()
        assert view_counter(p.view("revenue_by_region")) == {
            ("a", 11.0, 1, 11.0): 1, ("b", 20.0, 1, 20.0): 1}


def test_reopen_continues_from_the_committed_state(spark, tmp_path):
    root = str(tmp_path)
    with Pipeline(shop_circuit(), root=root, spark=spark) as p:
        p.push("customers", [(1, "a")])
        p.push("orders", [(1, 1, 50.0)])
        p.step()
        p.push("orders", [(2, 1, 60.0)])  # pushed, not yet stepped: must survive the reopen
    with Pipeline(shop_circuit(), root=root, spark=spark) as p:
        assert p.next_step == 1
        r = p.step()
        assert r.step == 1 and r.inputs["orders"] == 1
        assert view_counter(p.view("revenue_by_region")) == {("a", 110.0, 2, 60.0): 1}


def test_reopening_with_a_different_circuit_is_refused(spark, tmp_path):
    root = str(tmp_path)
    with Pipeline(shop_circuit(), root=root, spark=spark) as p:
        p.step()
    other = Circuit("shop")
    other.output("x", other.input("orders", "order_id BIGINT").distinct())
    with pytest.raises(CircuitChangedError, match="different circuit"):
        Pipeline(other, root=root, spark=spark)


def test_compaction_keeps_the_views(spark, tmp_path):
    c = Circuit("k")
    x = c.input("x", "k BIGINT, v BIGINT")
    c.output("d", x.select("k").distinct())
    c.output("g", x.group_by("k").agg(lo="min(v)", s="sum(v)"))
    with Pipeline(c, root=str(tmp_path), spark=spark) as p:
        for i in range(5):
            p.push("x", [(i % 2, i), (2, i)])
            if i:
                p.push("x", [(2, i - 1)], weight=-1)
            p.step()
        before = {n: view_counter(p.view(n)) for n in ("d", "g")}
        assert p.compact(threshold=1) >= 3
        p.push("x", [(0, 100)])
        p.step()
        after = {n: view_counter(p.view(n)) for n in ("d", "g")}
        assert before["d"] == after["d"]
        assert after["g"] == {**{k: v for k, v in before["g"].items() if k[0] != 0},
                              (0, 0, 106): 1}


def test_traces_are_compacted_in_the_background(spark, tmp_path):
    """With a low threshold, commits start background merges that later steps apply: the
    trace files stay few, and every view stays what the same steps give without compaction."""
    def run(root: str, threshold: int):
        c = Circuit("bg")
        x = c.input("x", "k BIGINT, v BIGINT")
        c.output("d", x.select("k").distinct())
        c.output("g", x.group_by("k").agg(hi="max(v)", n="count(*)"))
        with Pipeline(c, root=root, spark=spark, compact_threshold=threshold) as p:
            for i in range(12):
                p.push("x", [(i % 3, i), (7, i)])
                if i > 1:
                    p.push("x", [(7, i - 2)], weight=-1)
                p.step()
                p.engine.compactor.apply_finished(wait=True)  # deterministic: the merge is done
            files = max(len(t.files()) for t in p.engine.plan.traces())
            return files, {n: view_counter(p.view(n)) for n in ("d", "g")}

    files, views = run(str(tmp_path / "compacted"), threshold=4)
    plain_files, plain_views = run(str(tmp_path / "plain"), threshold=10**6)
    assert views == plain_views
    assert files <= 4 < plain_files


def test_pipeline_id_is_the_id_of_the_roots_state(spark, tmp_path):
    """``pipeline_id`` is what ``read_status`` reports; reopening keeps it; a root deleted and
    created again is another pipeline, with another id."""
    root = str(tmp_path / "root")
    with Pipeline(shop_circuit(), root=root, spark=spark) as p:
        first = p.pipeline_id
        assert first and first == read_status(root, []).pipeline_id
        p.push("customers", [(1, "a")])
        p.step()
    with Pipeline(shop_circuit(), root=root, spark=spark) as p:
        assert p.pipeline_id == first
    shutil.rmtree(root)
    with Pipeline(shop_circuit(), root=root, spark=spark) as p:
        assert p.pipeline_id == read_status(root, []).pipeline_id
        assert p.pipeline_id != first


@pytest.mark.parametrize("setting, value", [
    ("checkpoint_every", 0), ("driver_step_rows", -1), ("driver_memory", 0), ("retain_steps", -1),
    ("retain_checkpoints", 1), ("retain_checkpoints", "3"),
])
def test_a_setting_changed_on_an_open_pipeline_is_checked(spark, tmp_path, setting, value):
    """Assigning a setting checks it as the constructor does: a value the engine cannot run
    with (e.g. one retained checkpoint, which garbage collection would fail on) is refused."""
    with Pipeline(shop_circuit(), root=str(tmp_path), spark=spark) as p:
        before = getattr(p, setting)
        with pytest.raises(UsageError, match=f"{setting} must be an integer of at least"):
            setattr(p, setting, value)
        assert getattr(p, setting) == before
        p.retain_steps = None  # no limit stays allowed


def test_a_step_reports_the_rows_it_read_from_state(spark, tmp_path):
    orders = pd.DataFrame({"order_id": range(50_000), "customer_id": [i % 5_000 for i in
                                                                     range(50_000)],
                           "amount": [20.0] * 50_000})
    with Pipeline(shop_circuit(extra_views=False), root=str(tmp_path), spark=spark) as p:
        p.push("customers", [(c, "eu") for c in range(5_000)])
        p.push("orders", orders)
        p.driver_step_rows = 10**6
        p.step()
        # Moving 2 customers looks up their 20 orders in a 50k-row orders trace.
        p.push("customers", [(1, "eu"), (2, "eu")], weight=-1)
        p.push("customers", [(1, "us"), (2, "us")])
        r = p.step()
        assert r.on_driver and 0 < r.state_rows_read < 2_000
        assert view_counter(p.view("revenue_by_region")) == {
            ("eu", 20.0 * 49_980, 49_980, 20.0): 1, ("us", 400.0, 20, 20.0): 1}


def test_views_logs_are_snappy_and_the_state_lz4(spark, tmp_path):
    """A view's log (read by a user's Delta reader) is written in snappy, which every Parquet
    reader reads; the state's tables (input logs, traces) in LZ4 (``data_files.COMPRESSION``)."""
    import glob

    import pyarrow.parquet as pq

    from dbsp_pipeline import root as root_layout

    def codecs(folder: str) -> set[str]:
        files = glob.glob(f"{folder}/**/*.parquet", recursive=True)
        assert files, folder
        return {pq.ParquetFile(f).metadata.row_group(0).column(0).compression for f in files}

    root = str(tmp_path)
    with Pipeline(shop_circuit(extra_views=False), root=root, spark=spark) as p:
        p.push("customers", [(7, "eu"), (8, "us")])
        p.push("orders", [(1, 7, 12.5), (2, 8, 30.0)])
        p.step()
        p.commit()
    assert codecs(root_layout.output_log(root, "revenue_by_region")) == {"SNAPPY"}
    assert codecs(root_layout.input_log(root, "orders")) == {"LZ4"}
    assert codecs(root_layout.state_tables(root)) == {"LZ4"}
